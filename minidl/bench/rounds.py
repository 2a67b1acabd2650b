"""Interleaved rounds across worker processes: minidl's time, PyTorch's and the floor's, A B F, B F A, ...

Each side runs in a process of its own (``--worker``), started once per launch, and stays there
answering requests, one JSON line each way: ``{"case": i}`` asks for case i's time (the minimum of
``--repeats`` calls; a worker builds a case at its first request and warms it up), ``{"case": i,
"floor": true}`` for the conv layer's floor, ``{"breakdown": true}`` for the main suite's stages.
The parent (``measure.py``) asks every side of one case in turn, round after round, each round in a
rotated order, so a neighbour's burst of work that lasts seconds reaches every side alike, and the
row's figure is the median over rounds of each round's ratio (``timing.spread``).
"""
import json
import subprocess
import sys


def serve(meta, answer):
    """The worker's side: print ``meta`` (one JSON line), then answer each request line on stdin with
    ``answer(request)`` (one JSON line on stdout) until stdin closes."""
    print(json.dumps(meta), flush=True)
    for line in sys.stdin:
        if line.strip():
            print(json.dumps(answer(json.loads(line))), flush=True)


class Worker:
    """The parent's side: a worker process (``command``, ``env``) that answers ``ask(request)``."""

    def __init__(self, name, command, env):
        self.name = name
        self.process = subprocess.Popen(command, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.meta = self._read()

    def _read(self):
        line = self.process.stdout.readline()
        if not line:
            code = self.process.wait()
            raise RuntimeError(f"the {self.name} worker stopped (exit status {code}); its error is above")
        return json.loads(line)

    def ask(self, request):
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        return self._read()

    def close(self):
        if self.process.poll() is None:
            self.process.stdin.close()
            self.process.wait(timeout=60)
