"""fxrewrite.testing._nn_modules: the modules the checker and the rule analysis build for module
captures, and the input shapes fitted to them. What matters is that a fitted shape runs."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch import nn

from fxrewrite.testing._nn_modules import default_module, fit_input_shape

# (class, constructor attributes, the ranks of inputs it accepts)
ACCEPTING = [
    (nn.Linear, {}, (1, 2, 3, 4)),
    (nn.Conv1d, {}, (2, 3)),
    (nn.Conv2d, {}, (3, 4)),
    (nn.Conv2d, {"dilation": 2, "padding": 1}, (3, 4)),
    (nn.Conv2d, {"groups": 2, "stride": 2}, (3, 4)),
    (nn.Conv3d, {}, (4, 5)),
    (nn.ConvTranspose2d, {"groups": 2, "stride": 2}, (3, 4)),
    (nn.BatchNorm1d, {"eps": 1e-3}, (2, 3)),
    (nn.BatchNorm2d, {"momentum": 0.3}, (4,)),
    (nn.BatchNorm3d, {}, (5,)),
    (nn.InstanceNorm1d, {"affine": True}, (2, 3)),
    (nn.InstanceNorm2d, {}, (3, 4)),
    (nn.LayerNorm, {}, (1, 2, 3, 4)),
    (nn.GroupNorm, {}, (2, 3, 4)),
    (nn.Softmax, {}, (1, 2, 3)),
    (nn.ReLU, {}, (0, 1, 2, 3)),
]


@pytest.mark.parametrize("cls, attributes, ranks", ACCEPTING, ids=lambda v: getattr(v, "__name__", None))
def test_a_fitted_input_runs_through_the_module_built_for_its_class(cls, attributes, ranks):
    module = default_module(cls, width=2, kernel=3, bias=True, attributes=attributes)
    assert isinstance(module, cls) and not module.training
    for key, value in attributes.items():
        got = getattr(module, key)
        assert got == value or got == (value,) * len(got)
    for rank in ranks:
        for sides in itertools.product((1, 3), repeat=rank):
            shape = fit_input_shape(module, sides)
            assert len(shape) == rank  # the rank is never changed, only sizes
            with torch.no_grad():
                module(torch.randn(shape))  # raises if the shape does not fit


def test_norm_statistics_are_random_and_positive_where_they_must_be():
    bn = default_module(nn.BatchNorm2d, width=4, kernel=1, bias=True)
    assert bn is not None
    assert bn.running_var.min() >= 0.5 and not torch.equal(bn.running_mean, torch.zeros(4))
    assert bn.weight.min() >= 0.5 and bn.bias.abs().max() <= 0.5


def test_a_linear_or_conv_without_bias_has_none():
    assert default_module(nn.Linear, width=3, kernel=1, bias=False).bias is None
    assert default_module(nn.Conv1d, width=3, kernel=2, bias=False).bias is None


@pytest.mark.parametrize("cls, attributes", [
    (nn.Embedding, {}),  # needs the number of embeddings
    (nn.Bilinear, {}),  # needs three sizes
    (nn.Conv2d, {"groups": 3}),  # width 2 is not divisible by 3 groups
    (nn.BatchNorm2d, {"no_such_argument": 1}),
])
def test_a_class_or_attribute_that_cannot_be_built_gives_none(cls, attributes):
    assert default_module(cls, width=2, kernel=1, bias=True, attributes=attributes) is None


def test_ranks_the_module_does_not_accept_are_left_alone():
    conv = nn.Conv2d(3, 4, 3)
    assert fit_input_shape(conv, (5, 5)) == (5, 5)  # no channel dimension for a 2-d conv
    assert fit_input_shape(nn.BatchNorm1d(3), (7,)) == (7,)
    assert fit_input_shape(nn.LayerNorm((2, 3)), (3,)) == (3,)


def test_a_transposed_conv_needs_no_spatial_extent_but_a_dilated_conv_does():
    assert fit_input_shape(nn.ConvTranspose1d(2, 2, 5), (1, 1, 1)) == (1, 2, 1)
    assert fit_input_shape(nn.Conv1d(2, 2, 3, dilation=3), (1, 1, 1)) == (1, 2, 7)
    assert fit_input_shape(nn.Conv1d(2, 2, 3, dilation=3, padding=2), (1, 1, 1)) == (1, 2, 3)


def test_an_instance_norm_gets_its_channels_where_its_rank_puts_them_and_two_elements_to_normalize():
    assert fit_input_shape(nn.InstanceNorm2d(4), (1, 1, 1)) == (4, 1, 2)  # unbatched (C, H, W)
    assert fit_input_shape(nn.InstanceNorm2d(4), (3, 1, 1, 1)) == (3, 4, 1, 2)
    assert fit_input_shape(nn.InstanceNorm1d(4, track_running_stats=True), (1, 1, 1)) == (1, 4, 1)
