"""Frames between the grader and a sandboxed job: a length, then arrays as an uncompressed .npz.

    write_frame(fd, {"kind": np.array("reply"), "v0": array, ...})
    arrays = read_frame(fd, deadline, cap)      # {name: array}; FrameError on anything malformed

Both sides speak only this: no pickle, no code. A frame is an 8-byte little-endian length and
that many bytes of a zip archive of ``.npy`` entries (np.savez's format). ``read_frame`` is the
grader's parser of bytes a student's process wrote, so it trusts nothing: the length and the
unpacked size are capped, entry names must be identifiers, every ``.npy`` header must agree
with its data and hold no objects, and whatever numpy or zipfile raise on a crafted archive
becomes a ``FrameError``. This file imports nothing of the project: the sandbox loads it from
beside its driver.
"""
import io
import math
import os
import re
import select
import time
import zipfile

import numpy as np

MAX_FRAME = 64 << 20            # bytes of one frame, packed and unpacked
MAX_ENTRIES = 1000


class FrameError(RuntimeError):
    """A frame that is not one (cut short, too large, not arrays), or none before the deadline."""


class Closed(FrameError):
    """The other side closed the channel (its process ended) before a whole frame came."""


def pack(arrays):
    """The bytes of one frame: {name: array-like} as an uncompressed .npz (a key may be named 'file')."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        for name, value in arrays.items():
            with archive.open(name + ".npy", "w", force_zip64=True) as entry:
                np.lib.format.write_array(entry, np.asarray(value), allow_pickle=False)
    data = buffer.getvalue()
    return len(data).to_bytes(8, "little") + data


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


def _parse_npy(blob):
    """An array from .npy bytes, after checking that the header is sane and matches the data."""
    stream = io.BytesIO(blob)
    version = np.lib.format.read_magic(stream)
    if version not in ((1, 0), (2, 0)):
        raise ValueError(f".npy version {version}")
    shape, _, dtype = getattr(np.lib.format, f"read_array_header_{version[0]}_0")(stream)
    if dtype.hasobject:
        raise ValueError("an object array (that would need pickle)")
    if dtype.itemsize * math.prod(shape) != len(blob) - stream.tell():
        raise ValueError("the header's shape does not match the data")
    stream.seek(0)
    return np.lib.format.read_array(stream, allow_pickle=False)


def parse(data, cap=MAX_FRAME):
    """{name: array} from the bytes of one frame's archive; FrameError if they are not that."""
    arrays, budget = {}, cap
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            for entry in archive.infolist():
                key = entry.filename.removesuffix(".npy")
                if key == entry.filename or not re.fullmatch(r"[A-Za-z_][\w.]*", key, re.ASCII) \
                        or key in arrays or len(arrays) == MAX_ENTRIES:
                    raise ValueError(f"an entry named {entry.filename[:80]!r} (or one too many)")
                with archive.open(entry) as stream:
                    blob = stream.read(budget + 1)      # decompressed: the header's sizes are claims
                budget -= len(blob)
                if budget < 0:
                    raise FrameError(f"a frame of over {cap} bytes unpacked")
                arrays[key] = _parse_npy(blob)
    except FrameError:
        raise
    except Exception as error:                          # whatever a crafted archive makes numpy or zipfile say
        raise FrameError(f"not arrays ({type(error).__name__}: {str(error)[:200]})") from None
    return arrays
