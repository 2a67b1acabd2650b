"""Frames between the grader and a sandboxed job: a length, then arrays (a JSON header and raw bytes).

    write_frame(fd, {"kind": np.array("reply"), "v0": array, ...})
    arrays = read_frame(fd, deadline, cap)      # {name: array}; FrameError on anything malformed

Both sides speak only this: no pickle, no code. A frame is an 8-byte little-endian length and
that many bytes: a 4-byte header length, the header (JSON: ``[[name, dtype, shape], ...]``) and
each array's raw bytes in order. ``read_frame`` is the grader's parser of bytes a student's
process wrote, so it trusts nothing: the length is capped, entry names must be identifiers,
dtypes are numbers, booleans or strings (never objects or records), every shape must account
for exactly the bytes that follow, and whatever json or numpy raise on a crafted frame becomes a
``FrameError``. (No archive, no compression: nothing to unpack bigger than it came.) This file
imports nothing of the project: the sandbox loads it from beside its driver.
"""
import json
import math
import os
import re
import select
import time

import numpy as np

MAX_FRAME = 64 << 20            # bytes of one frame, packed and unpacked
MAX_ENTRIES = 1000


class FrameError(RuntimeError):
    """A frame that is not one (cut short, too large, not arrays), or none before the deadline."""


class Closed(FrameError):
    """The other side closed the channel (its process ended) before a whole frame came."""


KINDS = "biufcSU"                 # booleans, integers, floats, complex, bytes, text: never objects or records


def pack(arrays):
    """The bytes of one frame: {name: array-like} as a JSON header (names, dtypes, shapes) and the raw data."""
    entries, blobs = [], []
    for name, value in arrays.items():
        array = np.asarray(value)
        if array.dtype.kind not in KINDS or array.dtype.fields is not None:
            raise TypeError(f"{name}: an array of dtype {array.dtype} cannot cross")
        entries.append([name, array.dtype.str, list(array.shape)])
        blobs.append(np.ascontiguousarray(array).tobytes() if array.ndim else array.tobytes())
    header = json.dumps(entries).encode()
    body = len(header).to_bytes(4, "little") + header + b"".join(blobs)
    return len(body).to_bytes(8, "little") + body


def write_frame(fd, arrays):
    """Write one frame to ``fd`` (a pipe: blocks until the reader has taken it)."""
    view = memoryview(pack(arrays))
    while view:
        view = view[os.write(fd, view):]


def _read_exactly(fd, count, deadline):
    parts, left = [], count
    while left:
        wait = None if deadline is None else deadline - time.monotonic()
        if wait is not None and wait <= 0:
            raise TimeoutError
        if not select.select([fd], [], [], wait)[0]:
            raise TimeoutError
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            raise Closed("the sandboxed job ended (its channel closed) before it replied")
        parts.append(chunk)
        left -= len(chunk)
    return b"".join(parts)


def read_frame(fd, deadline=None, cap=MAX_FRAME):
    """The next frame from ``fd`` as {name: array}; TimeoutError past ``deadline`` (time.monotonic())."""
    size = int.from_bytes(_read_exactly(fd, 8, deadline), "little")
    if size > cap:
        raise FrameError(f"a frame of {size} bytes (the cap is {cap})")
    return parse(_read_exactly(fd, size, deadline), cap)


def parse(data, cap=MAX_FRAME):
    """{name: array} from the bytes of one frame (after its length); FrameError if they are not that."""
    try:
        size = int.from_bytes(data[:4], "little")
        if size > min(len(data) - 4, 1 << 24):
            raise ValueError("a header longer than the frame")
        entries, offset, arrays = json.loads(bytes(data[4:4 + size])), 4 + size, {}
        if not isinstance(entries, list) or len(entries) > MAX_ENTRIES:
            raise ValueError("a header that is not a list of entries")
        view = memoryview(data)
        for entry in entries:
            name, dtype, shape = entry
            if not (isinstance(name, str) and re.fullmatch(r"[A-Za-z_][\w.]*", name, re.ASCII)) or name in arrays:
                raise ValueError(f"an entry named {str(name)[:80]!r}")
            dtype = np.dtype(dtype)
            if dtype.kind not in KINDS or dtype.fields is not None or dtype.hasobject \
                    or not (isinstance(shape, list) and all(type(n) is int and n >= 0 for n in shape)):
                raise ValueError(f"{name}: an array of dtype {dtype} and shape {str(shape)[:40]}")
            nbytes = dtype.itemsize * math.prod(shape)
            if nbytes > cap or offset + nbytes > len(data):
                raise ValueError(f"{name}: the header's shape does not match the data")
            arrays[name] = np.frombuffer(view[offset:offset + nbytes], dtype=dtype).reshape(shape).copy()
            offset += nbytes
        if offset != len(data):
            raise ValueError("bytes after the last entry")
    except FrameError:
        raise
    except Exception as error:                          # whatever a crafted frame makes json or numpy say
        raise FrameError(f"not arrays ({type(error).__name__}: {str(error)[:200]})") from None
    return arrays
