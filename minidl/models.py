"""The models every algorithm trains: an MLP and a small CNN for the 8x8 digits, LeNet-5 for 28x28;
a wide MLP of 5.3 million parameters, whose model states outweigh its activations (ZeRO's case), and
the small CNN's locally connected twin (DistBelief's Figure 1 network).

All take images (N, 1, H, W) and return logits (N, 10); all are seeded by ``rng``.
"""
from minidl.nn import Conv2d, Flatten, Linear, LocallyConnected2d, MaxPool2d, ReLU, Sequential


def mlp(rng, in_features=64, hidden=(128, 64), classes=10):
    """Flatten -> [Linear -> ReLU] x len(hidden) -> Linear."""
    layers, width = [Flatten()], in_features
    for size in hidden:
        layers += [Linear(width, size, rng=rng), ReLU()]
        width = size
    layers.append(Linear(width, classes, rng=rng, init="glorot"))
    return Sequential(*layers)


def wide_mlp(rng, in_features=64, classes=10):
    """Flatten -> [Linear -> ReLU] x 6 of width 1024 -> Linear: 64 x 1024 + 5 x 1024^2 + 1024 x 10
    weights and their biases: 5,324,810 parameters (20.3 MiB in float32), the largest layer 1,049,600."""
    return mlp(rng, in_features, hidden=(1024,) * 6, classes=classes)


def small_cnn(rng, classes=10):
    """For 8x8 digits: conv 3x3 (16) -> pool -> conv 3x3 (32) -> pool -> 32*2*2 -> 10.

        (N, 1, 8, 8) -> (N, 16, 8, 8) -> (N, 16, 4, 4) -> (N, 32, 4, 4) -> (N, 32, 2, 2) -> (N, 10)
    """
    return Sequential(
        Conv2d(1, 16, 3, padding=1, rng=rng), ReLU(), MaxPool2d(2),
        Conv2d(16, 32, 3, padding=1, rng=rng), ReLU(), MaxPool2d(2),
        Flatten(), Linear(32 * 2 * 2, classes, rng=rng, init="glorot"),
    )


def local_cnn(rng, classes=10):
    """The small CNN's shapes with unshared weights: DistBelief's locally connected network (Dean et al.
    2012, Figure 1). 10,240 + 74,240 + 1,290 = 85,770 parameters, for 8x8 digits:

        (N, 1, 8, 8) -local 3x3 (16)-> (N, 16, 8, 8) -pool-> (N, 16, 4, 4) -local 3x3 (32)-> (N, 32, 4, 4)
        -pool-> (N, 32, 2, 2) -> 128 -> 10
    """
    return Sequential(
        LocallyConnected2d(1, 16, 3, (8, 8), padding=1, rng=rng), ReLU(), MaxPool2d(2),
        LocallyConnected2d(16, 32, 3, (4, 4), padding=1, rng=rng), ReLU(), MaxPool2d(2),
        Flatten(), Linear(32 * 2 * 2, classes, rng=rng, init="glorot"),
    )


def lenet5(rng, classes=10):
    """LeNet-5 (LeCun et al. 1998) with ReLU and max pooling, for 28x28 inputs:

        (N, 1, 28, 28) -conv5 pad2-> (N, 6, 28, 28) -pool-> (N, 6, 14, 14) -conv5-> (N, 16, 10, 10)
        -pool-> (N, 16, 5, 5) -> 400 -> 120 -> 84 -> 10
    """
    return Sequential(
        Conv2d(1, 6, 5, padding=2, rng=rng), ReLU(), MaxPool2d(2),
        Conv2d(6, 16, 5, rng=rng), ReLU(), MaxPool2d(2),
        Flatten(),
        Linear(400, 120, rng=rng), ReLU(),
        Linear(120, 84, rng=rng), ReLU(),
        Linear(84, 10 if classes is None else classes, rng=rng, init="glorot"),
    )


MODELS = {"mlp": mlp, "cnn": small_cnn, "lenet5": lenet5, "wide-mlp": wide_mlp, "local-cnn": local_cnn}


def build(name, rng):
    """The model called ``name`` (a key of ``MODELS``)."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose one of {sorted(MODELS)}")
    return MODELS[name](rng)
