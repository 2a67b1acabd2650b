"""The embedded data set: UCI optical-recognition handwritten digits (1,797 8x8 images, 10 classes).

The images are 8x8 grids of counts 0..16 (each pixel counts the set pixels of a 4x4 block of the
original 32x32 bitmap). They ship inside this package as ``digits.npz`` (uint8 ``images`` of shape
(1797, 8, 8) and ``labels`` of shape (1797,)); see ``DIGITS_LICENSE.txt`` for the credit (CC BY 4.0).
"""
import numbers
from importlib import resources

import numpy as np

from minidl.data._checks import check_int


def load_digits():
    """Return ``(images, labels)``: float32 (1797, 1, 8, 8) in [0, 1] (counts / 16), int64 (1797,).

    The channel axis is there so the images go straight into a ``Conv2d`` (N, C, H, W).
    """
    with resources.files("minidl.data").joinpath("digits.npz").open("rb") as file:
        with np.load(file, allow_pickle=False) as archive:
            images, labels = archive["images"], archive["labels"]
    images = (images.astype(np.float32) / np.float32(16.0)).reshape(-1, 1, 8, 8)
    return images, labels.astype(np.int64)


def train_test_split(images, labels, test_fraction=0.2, rng=None):
    """Split rows at random into ``(x_train, y_train, x_test, y_test)``.

    The order is ``rng.permutation(n)``; its first ``round(test_fraction * n)`` rows (Python's
    ``round``, halves to even) form the test set and the rest the training set, each kept in
    permuted order. ``rng`` is a ``numpy.random.Generator`` or an int seed; ``None`` means
    seed 0, so a split is always reproducible and never touches NumPy's global random state.
    Both parts must be non-empty.
    """
    images, labels = np.asarray(images), np.asarray(labels)
    if images.ndim < 1 or labels.ndim != 1 or len(images) != len(labels):
        raise ValueError(f"images and labels must have the same number of rows and labels must be "
                         f"1-D, got images shape {images.shape} and labels shape {labels.shape}")
    if isinstance(test_fraction, bool) or not isinstance(test_fraction, numbers.Real) \
            or not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be a number strictly between 0 and 1, got {test_fraction!r}")
    rng = _as_generator(rng)
    n = len(labels)
    n_test = int(round(test_fraction * n))
    if n_test == 0 or n_test == n:
        raise ValueError(f"test_fraction={test_fraction} of {n} rows leaves {n_test} test and "
                         f"{n - n_test} training rows; both must be non-empty")
    order = rng.permutation(n)
    test, train = order[:n_test], order[n_test:]
    return images[train], labels[train], images[test], labels[test]


def _as_generator(rng):
    """A Generator from a Generator, an int seed, or None (seed 0)."""
    if isinstance(rng, np.random.Generator):
        return rng
    if rng is None:
        return np.random.default_rng(0)
    if isinstance(rng, numbers.Integral) and not isinstance(rng, bool) and rng >= 0:
        return np.random.default_rng(int(rng))
    raise TypeError(f"rng must be a numpy.random.Generator, an int seed >= 0 or None, got {rng!r}")


def digits_split(seed=0, test_fraction=0.2):
    """``load_digits()`` split by ``train_test_split`` with ``numpy.random.default_rng(seed)``."""
    images, labels = load_digits()
    rng = np.random.default_rng(check_int("seed", seed, minimum=0))
    return train_test_split(images, labels, test_fraction=test_fraction, rng=rng)
