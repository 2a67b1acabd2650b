"""IDX files (the format of MNIST and Fashion-MNIST), read with every size checked.

Layout (all integers big-endian)::

    byte 0, 1   0x00 0x00          magic: always zero
    byte 2      dtype code         0x08 uint8, 0x09 int8, 0x0B int16, 0x0C int32,
                                   0x0D float32, 0x0E float64
    byte 3      ndim               number of dimensions (>= 1)
    ndim x 4    dims               each a big-endian uint32
    rest        payload            prod(dims) items of the dtype, big-endian, C order

A file may also be gzip-compressed as a whole (as the MNIST downloads are); it is recognised by
its first two bytes, 0x1f 0x8b, not by its name. Nothing is downloaded: the user passes a path.
"""
import gzip
import math
import os
import zlib

import numpy as np

# IDX dtype code -> big-endian NumPy dtype of the payload
IDX_DTYPES = {
    0x08: np.dtype(">u1"),
    0x09: np.dtype(">i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}
GZIP_MAGIC = b"\x1f\x8b"

MNIST_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}


def _read_bytes(path):
    """The file's bytes, decompressed if they start with the gzip magic."""
    try:
        with open(path, "rb") as file:
            data = file.read()
    except OSError as error:                    # missing, a directory, no permission
        raise ValueError(f"{path}: cannot read the file ({error.strerror or error})") from None
    if data[:2] == GZIP_MAGIC:
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as error:   # BadGzipFile is an OSError
            raise ValueError(f"{path}: corrupt or truncated gzip stream ({error})") from None
    return data


def read_idx(path):
    """Read an IDX file (optionally gzip-compressed) into an array of its shape, in native byte order.

    Raises ``ValueError`` naming ``path`` and the problem for: a file that cannot be read
    (missing, a directory), a header shorter than 4 bytes,
    non-zero magic bytes, an unknown dtype code, ndim 0, a truncated list of dimensions, and a
    payload whose length is not exactly ``prod(dims) * itemsize`` (truncated or trailing bytes).
    """
    path = os.fspath(path)
    data = _read_bytes(path)
    if len(data) < 4:
        raise ValueError(f"{path}: too short for an IDX header ({len(data)} bytes, need at least 4)")
    if data[0] != 0 or data[1] != 0:
        raise ValueError(f"{path}: bad magic number {data[:4].hex()}: "
                         f"the first two bytes of an IDX file must be 00 00")
    code, ndim = data[2], data[3]
    if code not in IDX_DTYPES:
        known = ", ".join(f"0x{c:02X}" for c in IDX_DTYPES)
        raise ValueError(f"{path}: unknown IDX dtype code 0x{code:02X} (known: {known})")
    if ndim == 0:
        raise ValueError(f"{path}: IDX header says 0 dimensions")
    header_size = 4 + 4 * ndim
    if len(data) < header_size:
        raise ValueError(f"{path}: truncated header: {ndim} dimensions need {header_size} bytes, "
                         f"file has {len(data)}")
    dims = tuple(int(d) for d in np.frombuffer(data, dtype=">u4", count=ndim, offset=4))
    dtype = IDX_DTYPES[code]
    expected = math.prod(dims) * dtype.itemsize       # Python ints: no overflow for corrupt dims
    payload = len(data) - header_size
    if payload < expected:
        raise ValueError(f"{path}: truncated payload: dims {dims} of {dtype.name} need "
                         f"{expected} bytes, found {payload}")
    if payload > expected:
        raise ValueError(f"{path}: {payload - expected} trailing bytes after the payload of "
                         f"dims {dims} of {dtype.name} ({expected} bytes)")
    array = np.frombuffer(data, dtype=dtype, offset=header_size).reshape(dims)
    return array.astype(dtype.newbyteorder("="))          # native byte order, writable copy


def _find(directory, name):
    """``directory/name`` or ``directory/name.gz``, whichever exists."""
    for candidate in (name, name + ".gz"):
        path = os.path.join(directory, candidate)
        if os.path.isfile(path):
            return path
    raise ValueError(f"{directory}: neither {name} nor {name}.gz is in this directory")


def load_mnist(directory, kind="train"):
    """Read MNIST-format ``(images, labels)`` from the standard file names in ``directory``.

    ``kind='train'`` reads ``train-images-idx3-ubyte`` and ``train-labels-idx1-ubyte``,
    ``kind='test'`` reads ``t10k-images-idx3-ubyte`` and ``t10k-labels-idx1-ubyte``, each
    optionally with a ``.gz`` suffix (Fashion-MNIST uses the same names). Returns images float32
    (N, 1, rows, cols) scaled to [0, 1] (bytes / 255; rows = cols = 28 for MNIST) and labels int64 (N,).
    Raises ``ValueError`` naming the file when the images are not 3-D uint8, the labels not 1-D
    uint8 in 0..9, or the two counts differ, and naming the path when ``directory`` is not a
    directory or a file is missing.
    """
    if kind not in MNIST_FILES:
        raise ValueError(f"kind must be 'train' or 'test', got {kind!r}")
    directory = os.fspath(directory)
    if not os.path.isdir(directory):
        reason = "is not a directory" if os.path.exists(directory) else "does not exist"
        raise ValueError(f"{directory}: {reason} (load_mnist needs the directory that holds the IDX files)")
    image_path, label_path = (_find(directory, name) for name in MNIST_FILES[kind])
    images, labels = read_idx(image_path), read_idx(label_path)
    if images.dtype != np.uint8 or images.ndim != 3:
        raise ValueError(f"{image_path}: expected 3-D uint8 images (N, rows, cols), "
                         f"got {images.dtype} of shape {images.shape}")
    if labels.dtype != np.uint8 or labels.ndim != 1:
        raise ValueError(f"{label_path}: expected 1-D uint8 labels (N,), "
                         f"got {labels.dtype} of shape {labels.shape}")
    if len(images) != len(labels):
        raise ValueError(f"image and label counts differ: {image_path} holds {len(images)} images, "
                         f"{label_path} holds {len(labels)} labels")
    if labels.size and labels.max() > 9:
        raise ValueError(f"{label_path}: labels must be 0..9, found {int(labels.max())}")
    images = (images.astype(np.float32) / np.float32(255.0))[:, None, :, :]
    return images, labels.astype(np.int64)
