"""The command lines' error contract: one line `error: <what, where>` on stderr, exit status 2.

    parser = cli.Parser(prog="python -m collectives.bench", description=...)
    args = parser.parse_args(argv)             # a bad flag: error: ..., exit 2 (no usage text)
    count = cli.number("--rounds", args.rounds, 1, integer=True)
    cli.fail("--sizes 3X: not a size")

collectives may not import algorithms' own helpers (algorithms/core/cli.py), so this is the small
equivalent for its modules (bench, simulate). Every rank parses the same argv and checks it before
its first message, so a bad flag stops every rank alike.
"""
import argparse
import math
import os
import sys


class Parser(argparse.ArgumentParser):
    """argparse, with the error contract: one line `error: ...` on stderr, exit status 2."""

    def error(self, message):
        fail(message)


def fail(message):
    sys.stderr.write(f"error: {message}\n")
    raise SystemExit(2)


def number(flag, text, low=0.0, integer=False):
    """float(text) (int if integer), finite and >= low; else error."""
    try:
        value = int(text) if integer else float(text)
    except (TypeError, ValueError):
        value = None
    if value is None or not math.isfinite(value) or value < low:
        fail(f"{flag} must be {'an integer' if integer else 'a finite number'} >= {low:g}, got {text!r}")
    return value


def parse_size(text):
    """A size in bytes from text such as 4096, 64K, 1M, 4MiB (binary units); ValueError, KeyError or
    IndexError where it is none."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().rstrip("IB")
    return int(float(text[:-1]) * units[text[-1]]) if text[-1] in units else int(text)


def human(nbytes):
    """4 KiB, 1 MiB, 100 B: a size as the tables print it."""
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{nbytes} B"


def output_path(flag, path):
    """Error unless `path` can be written: its folder exists and it is not a folder."""
    if path is None:
        return None
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder) or os.path.isdir(path):
        fail(f"{flag} {path}: {'is a folder' if os.path.isdir(path) else 'no folder ' + folder}")
    return path
