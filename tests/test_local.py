"""DistBelief's locally connected layer: the fast form against the direct loop, gradients against finite differences.

A locally connected layer is a convolution whose weights are not shared between output positions
(Dean et al. 2012, Figure 1): weight (Ho, Wo, F, C, k, k). ``minidl.local.forward`` gathers the
windows as columns and multiplies per position; ``direct_forward`` is the definition, one position
and filter at a time. The float64 shapes, strides and paddings are drawn by hypothesis.
"""
import numpy as np
import pytest
from hypothesis import given

from minidl import Tensor, functional as F, gradcheck, local, models, nn
from tests import strategies


def drawn(setting, seed):
    n, c, f, h, w, k, stride, padding = setting
    rng = np.random.default_rng(seed)
    out_h, out_w = local.output_size(h, k, stride, padding), local.output_size(w, k, stride, padding)
    return (rng.standard_normal((n, c, h, w)), rng.standard_normal((out_h, out_w, f, c, k, k)),
            rng.standard_normal((out_h, out_w, f)), stride, padding)


@given(setting=strategies.conv_settings(), seed=strategies.seeds)
def test_the_locally_connected_forward_equals_the_direct_loop_and_its_gradients_match_finite_differences(setting,
                                                                                                       seed):
    x, weight, bias, stride, padding = drawn(setting, seed)
    out = F.locally_connected2d(Tensor(x), Tensor(weight), Tensor(bias), stride, padding)
    np.testing.assert_allclose(out.data, local.direct_forward(x, weight, bias, stride, padding), rtol=1e-10,
                               atol=1e-10)
    inputs = [Tensor(x, requires_grad=True), Tensor(weight, requires_grad=True), Tensor(bias, requires_grad=True)]
    assert gradcheck(lambda a, b, c: F.locally_connected2d(a, b, c, stride, padding), inputs)


def test_each_output_position_has_weights_of_its_own():
    """Changing position (i, j)'s weights changes the output there and nowhere else; a convolution's
    would change every position (its weights are shared)."""
    x, weight, bias, stride, padding = drawn((2, 3, 4, 6, 5, 3, 1, 1), 0)
    before = local.direct_forward(x, weight, bias, stride, padding)
    weight[2, 1] += 1.0
    changed = np.abs(local.direct_forward(x, weight, bias, stride, padding) - before).max(axis=(0, 1)) > 0
    assert changed[2, 1] and changed.sum() == 1


def test_the_layer_holds_one_set_of_weights_per_position_and_refuses_a_wrong_input():
    layer = nn.LocallyConnected2d(16, 32, 3, (4, 4), padding=1, rng=np.random.default_rng(0))
    assert layer.weight.shape == (4, 4, 32, 16, 3, 3) and layer.bias.shape == (4, 4, 32)
    assert layer(Tensor(np.ones((2, 16, 4, 4), np.float32))).shape == (2, 32, 4, 4)
    with pytest.raises(ValueError, match=r"does not fit x \(2, 16, 5, 4\)"):
        layer(Tensor(np.ones((2, 16, 5, 4), np.float32)))
    assert models.build("local-cnn", np.random.default_rng(0)).num_parameters() == 10240 + 74240 + 1290
