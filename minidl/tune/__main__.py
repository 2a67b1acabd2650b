"""``python -m minidl.tune``: measure this machine's choices and write them to the tuning file.

The races run in a worker process of their own (``--worker``), started with one BLAS thread (as the
benchmarks and every rank of a training job run) and with MINIDL_TUNING=none, so that they start
from the shipped defaults whatever an earlier tuning wrote. The worker answers with the minidl
section; this process writes it (``tuning.write_section``). Then, where the ``collectives`` package
and ``mpiexec`` are installed beside minidl, it runs collectives' own tuning as a program (minidl
imports neither MPI nor collectives):

    mpiexec -n 2 python -m collectives.bench --calibrate --write-selection --median ...

with MINIDL_TUNING pointing at the same file, which writes the collectives section: the calibrated
cost model and ``auto``'s allreduce selection for p = 2, both measured here.

Bad flags, or a file there that is not a tuning file: ``error: ...`` and exit status 2.
"""
import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from minidl import tuning

THREADS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
COLLECTIVES = ["--calibrate", "--write-selection", "--median", "--algorithms", "naive,tree,butterfly,ring,rabenseifner",
               "--sizes", "4K,16K,64K,256K,1M,4M,16M,64M", "--rounds", "5", "--min-time", "0.005"]
QUICK_COLLECTIVES = ["--calibrate", "--write-selection", "--quick", "--algorithms", "ring,butterfly"]


def fail(message):
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def target(args):
    """The file to write: --out, else the tuning file's place (refused: MINIDL_TUNING=none, or a file there
    that is no tuning file, which is not overwritten)."""
    if args.quick and not args.out:
        fail("--quick measures too little to tune a machine: give --out PATH for its file")
    file = Path(args.out) if args.out else tuning.path()
    if file is None:
        fail(f"{tuning.ENVIRONMENT}=none: no tuning file to write; give --out PATH")
    named = "--out" if args.out else (tuning.ENVIRONMENT if os.environ.get(tuning.ENVIRONMENT, "").strip()
                                      else "the tuning file")
    if file.is_dir():
        fail(f"{named} {file}: a folder")
    try:
        tuning.read(file)
    except ValueError as error:
        fail(f"{error} (not overwritten: remove it first)")
    folder = file.parent
    while not folder.exists():
        folder = folder.parent
    if not os.access(folder, os.W_OK):
        fail(f"{named} {file}: cannot write in {folder}")
    return file


def run_worker(args):
    env = dict(os.environ, **dict.fromkeys(THREADS, "1"), **{tuning.ENVIRONMENT: "none"})
    command = [sys.executable, "-m", "minidl.tune", "--worker", "--rounds", str(args.rounds), "--calls",
               str(args.calls)] + (["--quick"] if args.quick else [])
    done = subprocess.run(command, env=env, stdout=subprocess.PIPE, text=True)
    if done.returncode != 0:
        fail(f"the tuning worker failed (exit status {done.returncode}); nothing written")
    return json.loads(done.stdout.strip().splitlines()[-1])


def tune_collectives(file, quick):
    """Run collectives' tuning into the same file; False (and why, printed) where it cannot run here."""
    mpiexec = Path(sys.executable).parent / "mpiexec"
    if importlib.util.find_spec("collectives") is None or not mpiexec.exists():
        print("collectives: not installed beside minidl (no collectives package or no mpiexec in "
              f"{mpiexec.parent}); its section not written")
        return False
    env = dict(os.environ, **dict.fromkeys(THREADS, "1"), **{tuning.ENVIRONMENT: str(file)})
    command = [str(mpiexec), "-n", "2", sys.executable, "-m", "collectives.bench"] + (
        QUICK_COLLECTIVES if quick else COLLECTIVES)
    print("$ mpiexec -n 2 python", " ".join(command[4:]), flush=True)     # as a reader types it
    done = subprocess.run(command, env=env, stdout=subprocess.PIPE, text=True)
    for line in done.stdout.splitlines():
        if line.startswith(("# calibrated (", "# fastest", "# wrote", "# targets")):
            print("  " + line, flush=True)
    if done.returncode != 0:
        fail(f"collectives' tuning failed (exit status {done.returncode}); the minidl section is written")
    return True


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m minidl.tune", description=__doc__.splitlines()[0])
    parser.error = fail
    parser.add_argument("--out", help="the tuning file to write (default: where minidl reads it, "
                                      "$MINIDL_TUNING or ~/.config/minidl/tuning.json)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds per race (default 5; with fewer, "
                                                              "no gain beats the noise and the shipped defaults stay)")
    parser.add_argument("--calls", type=int, default=3, help="calls per candidate and round, the fastest kept")
    parser.add_argument("--no-collectives", action="store_true", help="minidl's choices only")
    parser.add_argument("--quick", action="store_true", help="tiny races (a test of the tuner itself; needs --out)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for flag, value in (("--rounds", args.rounds), ("--calls", args.calls)):
        if value < 1:
            fail(f"{flag} must be at least 1, got {value}")
    if args.worker:                                  # the races, in a process of their own
        from minidl.tune.conv import tune
        section = tune(args.rounds, args.calls, lambda line: print(line, file=sys.stderr, flush=True), args.quick)
        print(json.dumps(section))
        return 0
    file = target(args)
    start = time.perf_counter()
    print(f"minidl.tune: measuring on {tuning.machine()}; load average {os.getloadavg()[0]:.2f}", flush=True)
    section = run_worker(args)
    section.update(machine=tuning.machine(), threads=1, seconds=round(time.perf_counter() - start, 1),
                   load_average=os.getloadavg()[0], quick=args.quick)
    tuning.write_section(file, "minidl", section)
    print(f"minidl: wrote {json.dumps(section['settings'])} to {file}", flush=True)
    if not args.no_collectives:
        tune_collectives(file, args.quick)
    print(f"minidl.tune: {time.perf_counter() - start:.0f} s; minidl and collectives read {file} at import")
    return 0


if __name__ == "__main__":
    sys.exit(main())
