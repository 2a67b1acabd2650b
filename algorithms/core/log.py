"""The per-epoch log every algorithm keeps: printed on rank 0, and with --log written as JSON lines.

    logger = Log(path, rank=rank, quiet=quiet)
    logger.epoch(epoch=0, train_loss=0.31, test_accuracy=0.97)   # one record; "seconds" added
    logger.history                                                # every record so far
    logger.close()
"""
import json
import time

from algorithms.core import cli


class Log:
    """Per-epoch records: printed on rank 0 and, with ``path``, written as JSON lines by rank 0."""

    def __init__(self, path=None, rank=0, quiet=False):
        self.rank, self.quiet = rank, quiet
        self.history = []
        self.started = time.perf_counter()
        if path and rank == 0:
            cli.check_output("--log", path)
            self.file = open(path, "w")
        else:
            self.file = None

    def epoch(self, **record):
        record.setdefault("seconds", round(time.perf_counter() - self.started, 3))
        self.history.append(record)
        if self.rank == 0:
            if not self.quiet:
                print(self.format(record), flush=True)
            if self.file:
                self.file.write(json.dumps(record) + "\n")
                self.file.flush()

    @staticmethod
    def format(record):
        parts = []
        for key, value in record.items():
            if isinstance(value, float):
                value = f"{value:.4f}" if abs(value) < 1000 else f"{value:.3g}"
            parts.append(f"{key} {value}")
        return "  ".join(parts)

    def close(self):
        if self.file:
            self.file.close()
