"""Fusions for inference: fold BatchNorm into the convolution or linear layer before it, fold a
bias add into ``linear``, and drop dropout that is not active.

The folds compute new weights at rewrite time (Python logic in the replacement) and register a
new module; they hold for BatchNorm in eval mode with running statistics, which the guards
check on the captured modules (no shape metadata needed). Folding rounds the weights once, so
the results agree up to rounding (declared tolerance).

Bias folding needs shapes: ``F.linear(x, w) + b`` is a bias only when ``b`` is a vector of
``w.shape[0]`` elements; the same pattern with a residual ``b`` of the output's shape is common,
so these guards are strict (they hold only when the graph has shape metadata: pass
``example_inputs=`` to ``fxrewrite.rewrite``).
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.fusion import fuse_conv_bn_weights, fuse_linear_bn_weights

import fxrewrite
from _fxrewrite_stdlib import REASSOCIATED, feature_vector, view

_ConvNd = nn.modules.conv._ConvNd
_BatchNorm = nn.modules.batchnorm._BatchNorm
_DropoutNd = nn.modules.dropout._DropoutNd


# ---- BatchNorm folding -----------------------------------------------------------------------


def _bn_in_eval(m: fxrewrite.Match) -> bool:
    """The BatchNorm normalizes with its running statistics: eval mode, statistics tracked and
    materialized (not a lazy module)."""
    bn = m["bn"]
    return (not bn.training and bn.running_mean is not None and bn.running_var is not None
            and not nn.parameter.is_lazy(bn.running_mean))


def _conv_foldable(m: fxrewrite.Match) -> bool:
    """The conv's output channels are the BatchNorm's features; a transposed conv keeps its
    output channels in weight dimension 1, which the fold can scale only without groups; the
    conv's input is batched (an unbatched Conv1d output would reach BatchNorm1d as (N, C))."""
    conv, bn = m["conv"], m["bn"]
    if nn.parameter.is_lazy(conv.weight) or conv.out_channels != bn.num_features:
        return False
    if conv.transposed and conv.groups != 1:
        return False
    x = view(m, "x")
    return x is None or x.dim() == len(conv.kernel_size) + 2


def _fold_conv_bn(conv: _ConvNd, bn: _BatchNorm) -> _ConvNd:
    fused = copy.deepcopy(conv)
    fused.weight, fused.bias = fuse_conv_bn_weights(
        conv.weight.detach(), None if conv.bias is None else conv.bias.detach(), bn.running_mean, bn.running_var,
        bn.eps, None if bn.weight is None else bn.weight.detach(), None if bn.bias is None else bn.bias.detach(),
        transpose=conv.transposed,
    )
    return fused


def _random_conv() -> _ConvNd:
    """A conv with 4 output channels and random hyper-parameters (for the property checker)."""
    def pick(n: int) -> int:
        return int(torch.randint(n, ()))

    dims, transposed = 1 + pick(3), bool(pick(2))
    kernel, stride, groups = 1 + pick(3), 1 + pick(2), (1, 2)[pick(2)] if not transposed else 1
    cls = ((nn.Conv1d, nn.Conv2d, nn.Conv3d), (nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d))
    conv = cls[transposed][dims - 1](2, 4, kernel, stride=stride, groups=groups, bias=bool(pick(2)))
    return conv.eval()


_BATCH_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)


def _random_batch_norm(cls: type[_BatchNorm] | None = None, features: int = 4) -> _BatchNorm:
    """A BatchNorm over ``features`` with random statistics and affine parameters, in eval mode."""
    if cls is None:
        cls = _BATCH_NORMS[int(torch.randint(3, ()))]
    bn = cls(features, affine=bool(torch.randint(2, ())))
    with torch.no_grad():
        bn.running_mean.uniform_(-1.0, 1.0)
        bn.running_var.uniform_(0.5, 2.0)
        if bn.affine:
            bn.weight.uniform_(0.5, 1.5)
            bn.bias.uniform_(-0.5, 0.5)
    return bn.eval()


def _batch_norm_after(conv: _ConvNd) -> _BatchNorm:
    """A random BatchNorm that can follow ``conv``: of its dimensions, over its output channels
    (drawn apart, the two fitted in a third of the draws, and the checker threw the rest away)."""
    return _random_batch_norm(_BATCH_NORMS[len(conv.kernel_size) - 1], conv.out_channels)


@fxrewrite.rule(where=(_bn_in_eval, _conv_foldable), tolerance=REASSOCIATED,
                domain={"dtypes": (torch.float32,), "ranks": (2, 5), "sides": (1, 4), "special_values": False,
                        "min_value": -10.0, "max_value": 10.0,
                        "modules": {"conv": _random_conv, "bn": _batch_norm_after}})
def conv_bn_fold(x, conv: _ConvNd, bn: _BatchNorm):
    "Replaces bn(conv(x)) by one convolution with folded weights (BatchNorm in eval mode)."
    return bn(conv(x))


@conv_bn_fold.replacement
def conv_bn_fold(x, conv: _ConvNd, bn: _BatchNorm):
    return _fold_conv_bn(conv, bn)(x)


def _linear_foldable(m: fxrewrite.Match) -> bool:
    """The linear layer's outputs are the BatchNorm's features, and its input is (N, in): on a
    3-d input BatchNorm1d normalizes dimension 1, not the linear layer's features."""
    lin, bn = m["lin"], m["bn"]
    if nn.parameter.is_lazy(lin.weight) or lin.out_features != bn.num_features:
        return False
    x = view(m, "x")
    return x is not None and x.dim() == 2  # strict: unknown rank could be 3-d, where folding is wrong


def _fold_linear_bn(lin: nn.Linear, bn: _BatchNorm) -> nn.Linear:
    fused = copy.deepcopy(lin)
    ones, zeros = torch.ones_like(bn.running_mean), torch.zeros_like(bn.running_mean)
    fused.weight, fused.bias = fuse_linear_bn_weights(
        lin.weight.detach(), None if lin.bias is None else lin.bias.detach(), bn.running_mean, bn.running_var,
        bn.eps, ones if bn.weight is None else bn.weight.detach(), zeros if bn.bias is None else bn.bias.detach(),
    )
    return fused


@fxrewrite.rule(where=(_bn_in_eval, _linear_foldable), tolerance=REASSOCIATED,
                domain={"dtypes": (torch.float32,), "ranks": (2, 2), "special_values": False,
                        "min_value": -10.0, "max_value": 10.0,
                        "modules": {"lin": lambda: nn.Linear(3, 4, bias=bool(torch.randint(2, ()))).eval(),
                                    "bn": lambda lin: _random_batch_norm(nn.BatchNorm1d, lin.out_features)}})
def linear_bn_fold(x, lin: nn.Linear, bn: nn.BatchNorm1d):
    "Replaces bn(linear(x)) by one linear layer with folded weights (BatchNorm1d in eval mode, 2-d input)."
    return bn(lin(x))


@linear_bn_fold.replacement
def linear_bn_fold(x, lin: nn.Linear, bn: nn.BatchNorm1d):
    return _fold_linear_bn(lin, bn)(x)


# ---- bias folding (strict: needs shape metadata) ------------------------------------------------


def _bias_of(bias: str, weight: str):
    """Strict guard: ``weight`` is a matrix and ``bias`` a vector of ``weight.shape[0]`` elements
    of ``weight``'s dtype, so adding ``bias`` to ``x @ weight.T`` is what ``linear`` does."""

    def guard(m: fxrewrite.Match) -> bool:
        w = view(m, weight)
        return w is not None and w.dim() == 2 and feature_vector(bias, of=weight, dim=0)(m)

    guard.__name__ = guard.__qualname__ = f"bias_of({bias}, weight={weight})"
    return guard


_BIAS_DOMAIN = {"dtypes": (torch.float32, torch.float64), "mixed_dtypes": False, "ranks": (2, 2), "sides": (1, 2),
                "special_values": False, "min_value": -100.0, "max_value": 100.0}


@fxrewrite.rule(where=_bias_of("b", "w"), tolerance=REASSOCIATED, domain=_BIAS_DOMAIN)
def linear_add_bias(x, w, b):
    "Replaces linear(x, w) + b by linear(x, w, b) when b is a vector of w.shape[0] elements (needs shapes)."
    return F.linear(x, w) + b


@linear_add_bias.replacement
def linear_add_bias(x, w, b):
    return F.linear(x, w, b)


@fxrewrite.rule(where=_bias_of("b", "w"), tolerance=REASSOCIATED, domain=_BIAS_DOMAIN)
def matmul_add_bias(x, w, b):
    "Replaces x @ w.t() + b by linear(x, w, b) when b is a vector of w.shape[0] elements (needs shapes)."
    return x @ w.t() + b


@matmul_add_bias.replacement
def matmul_add_bias(x, w, b):
    return F.linear(x, w, b)


def _bias_for_layer(m: fxrewrite.Match) -> bool:
    """Strict guard: the linear layer has no bias and ``b`` is a vector of its output features,
    of its weight's dtype."""
    lin, b = m["lin"], view(m, "b")
    return (lin.bias is None and b is not None and b.dim() == 1 and b.shape[0] == lin.out_features
            and b.dtype == lin.weight.dtype)


@fxrewrite.rule(where=_bias_for_layer, tolerance=REASSOCIATED,
                domain={"dtypes": (torch.float32,), "ranks": (1, 3), "special_values": False,
                        "min_value": -100.0, "max_value": 100.0,
                        "modules": {"lin": lambda: nn.Linear(3, 3, bias=False)}})
def linear_layer_add_bias(x, b, lin: nn.Linear):
    "Replaces lin(x) + b by linear(x, lin.weight, b) for a linear layer without bias and a vector b (needs shapes)."
    return lin(x) + b


@linear_layer_add_bias.replacement
def linear_layer_add_bias(x, b, lin: nn.Linear):
    return F.linear(x, lin.weight, b)


# ---- inactive dropout ----------------------------------------------------------------------------


def _dropout_inactive(m: fxrewrite.Match) -> bool:
    """The dropout module passes its input through: eval mode, or p == 0."""
    drop = m["drop"]
    return not drop.training or drop.p == 0


@fxrewrite.rule(where=_dropout_inactive, domain={"modules": {"drop": lambda: nn.Dropout(0.3).eval()}})
def dropout_layer_inactive(x, drop: _DropoutNd):
    "Replaces drop(x) by x for a dropout layer in eval mode (or with p=0)."
    return drop(x)


@dropout_layer_inactive.replacement
def dropout_layer_inactive(x, drop: _DropoutNd):
    return x
