"""The column budget: how many bytes of im2col columns one conv layer may keep from forward to backward.

A layer that keeps its columns (``im2col_blocked.kept_layout``) saves its backward pass a second
im2col of its input; the price is memory held between the passes, N * C*kh*kw * Ho*Wo numbers per
layer (LeNet-5's conv1 at batch 256: 19 MiB in float32). A batch whose columns exceed the budget
runs in blocks and rebuilds each block's columns in backward instead.

Set it with ``minidl.conv.set_column_budget(nbytes)`` or with the environment variable
MINIDL_CONV_COLUMN_BYTES (a whole number of bytes; 0 never keeps), read at the first convolution;
otherwise the tuning file's ``column_bytes`` (``minidl/tuning.py``, written by ``python -m minidl.tune``),
else DEFAULT_BYTES, 64 MiB: LeNet-5's layers keep theirs up to batch 856, the 64-channel 32x32 layer
never needs to (see ``im2col_blocked.kept_layout``). The CPU only: on a GPU a batch is one block up to
1 GiB of columns.
"""
import os

from minidl import tuning
from minidl.conv.shapes import output_size

DEFAULT_BYTES = tuning.SHIPPED.column_bytes


def from_environment():
    """MINIDL_CONV_COLUMN_BYTES as a number of bytes, else the tuning file's budget (DEFAULT_BYTES where
    there is none); ValueError if the variable is no number or the tuning file no tuning file."""
    tuned = tuning.current().column_bytes          # a bad tuning file stops the run here, whatever the variable says
    text = os.environ.get("MINIDL_CONV_COLUMN_BYTES", "").strip()
    if text and not text.isdigit():
        raise ValueError(f"MINIDL_CONV_COLUMN_BYTES must be a whole number of bytes >= 0, got {text!r}")
    return int(text) if text else tuned


COLUMN_BUDGET = None        # None: read at first use (a bad value is then an error of the run)


def current():
    """The budget in bytes: as set, else MINIDL_CONV_COLUMN_BYTES, else the tuning file's, else DEFAULT_BYTES."""
    global COLUMN_BUDGET
    if COLUMN_BUDGET is None:
        COLUMN_BUDGET = from_environment()
    return COLUMN_BUDGET


def set_column_budget(nbytes):
    """Bytes of columns one conv layer may keep from forward to backward (0: never keep); returns the old budget."""
    global COLUMN_BUDGET
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
        raise ValueError(f"set_column_budget: a whole number of bytes >= 0, got {nbytes!r}")
    previous, COLUMN_BUDGET = current(), nbytes
    return previous


def column_bytes(x_shape, weight_shape, stride, padding, itemsize):
    """Bytes of one image's columns: C*kh*kw * Ho*Wo numbers of ``itemsize`` bytes."""
    n, c, h, w = x_shape
    f, _, kh, kw = weight_shape
    return c * kh * kw * output_size(h, kh, stride, padding) * output_size(w, kw, stride, padding) * itemsize
