"""The standard rule library (rules/): its shape, one rewrite test per rule, and the whole
library applied to small models.

Every rule has an entry in CASES: a program containing the rule's pattern, spelled as users
write it, and its inputs. The rule alone must fire on it, leave a graph that lints, and compute
what the program computes (within the rule's declared tolerance). Property tests of each rule
are the checker's job (``pytest rules/``); a slow test here runs them too.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest
import torch
import torch.nn.functional as F
from _helpers import assert_rewrite_sound
from torch import nn

import fxrewrite
from fxrewrite import RuleSet, rewrite
from fxrewrite.loader import load_rules

RULES_DIR = Path(__file__).resolve().parents[2] / "rules"
LIBRARY: RuleSet = load_rules(RULES_DIR)


def randn(*shape: int) -> torch.Tensor:
    return torch.randn(*shape)


def positive(*shape: int) -> torch.Tensor:
    return torch.rand(*shape) + 0.1


@attrs.frozen
class Case:
    """A program containing a rule's pattern: ``model()`` builds it (an nn.Module or a function),
    ``inputs()`` its arguments; ``shapes`` passes them as example_inputs (strict guards)."""

    model: Callable[[], Any]
    inputs: Callable[[], tuple[Any, ...]]
    shapes: bool = False


def fn(f: Callable[..., Any], *inputs: Callable[[], Any], shapes: bool = False) -> Case:
    """A case whose program is the function ``f`` of the given inputs."""
    return Case(lambda: f, lambda: tuple(make() for make in inputs), shapes)


class WithParams(nn.Module):
    """``forward(x) = body(self, x)``, with the given tensors as parameters."""

    def __init__(self, body: Callable[..., Any], **params: torch.Tensor) -> None:
        super().__init__()
        self.body = body
        for name, value in params.items():
            self.register_parameter(name, nn.Parameter(value))

    def forward(self, x):
        return self.body(self, x)


def params(body: Callable[..., Any], x: Callable[[], Any], shapes: bool = False, **tensors: torch.Tensor) -> Case:
    return Case(lambda: WithParams(body, **tensors).eval(), lambda: (x(),), shapes)


def module(factory: Callable[[], nn.Module], *inputs: Callable[[], Any], shapes: bool = False) -> Case:
    return Case(lambda: factory().eval(), lambda: tuple(make() for make in inputs), shapes)


def trained_bn(bn: nn.modules.batchnorm._BatchNorm) -> nn.modules.batchnorm._BatchNorm:
    with torch.no_grad():
        bn.running_mean.uniform_(-1.0, 1.0)
        bn.running_var.uniform_(0.5, 2.0)
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.uniform_(-0.5, 0.5)
    return bn


def x_(*shape: int) -> Callable[[], torch.Tensor]:
    return lambda: randn(*shape)


def pos_(*shape: int) -> Callable[[], torch.Tensor]:
    return lambda: positive(*shape)


def int_(*shape: int) -> Callable[[], torch.Tensor]:
    return lambda: torch.randint(-50, 50, shape)


def bf16_(*shape: int) -> Callable[[], torch.Tensor]:
    return lambda: randn(*shape).to(torch.bfloat16)


def causal_mask(n: int) -> torch.Tensor:
    return torch.full((n, n), float("-inf")).triu(1)


def padding_mask(batch: int, n: int) -> torch.Tensor:
    """An additive (batch, 1, 1, n) mask hiding the last position of the first sequence."""
    mask = torch.zeros(batch, 1, 1, n)
    mask[0, ..., -1] = torch.finfo(torch.float32).min
    return mask


def layer_norm_var(x):
    return (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, keepdim=True, unbiased=False) + 1e-5)


def layer_norm_bert(x):
    """BERT's original LayerNorm: x - u computed twice."""
    u = x.mean(-1, keepdim=True)
    s = (x - u).pow(2).mean(-1, keepdim=True)
    return (x - u) / torch.sqrt(s + 1e-12)


def layer_norm_centered_once(x):
    centered = x - torch.mean(x, -1, keepdim=True)
    return centered / (centered ** 2).mean(-1, keepdim=True).add(1e-6).sqrt()


def softmax_amax(x):
    e = torch.exp(x - x.amax(1, keepdim=True))
    return e / e.sum(1, keepdim=True)


def softmax_max(x):
    e = (x - x.max(-1, keepdim=True)[0]).exp()
    return e / e.sum(-1, keepdim=True)


def softmax_max_values(x):
    return (torch.exp(x - x.max(-1, keepdim=True).values)
            / torch.exp(x - x.max(-1, keepdim=True).values).sum(-1, keepdim=True))


def softmax_naive(x):
    e = x.exp()
    return e / e.sum(-1, keepdim=True)


CASES: dict[str, Case] = {
    # ---- algebra.fxr
    "double_neg": fn(lambda x: -(-x) + 1, x_(3, 4)),  # noqa: B002 - the pattern, as written
    "abs_abs": fn(lambda x: x.abs().abs(), x_(5)),
    "square_neg": fn(lambda x: torch.square(-x), x_(2, 3)),
    "square_abs": fn(lambda x: torch.square(abs(x)), x_(2, 3)),
    "double_bitwise_not": fn(lambda x: ~~x, int_(4, 4)),
    "sum_keepdim_squeeze": fn(lambda x: x.sum(1, keepdim=True).squeeze(1), x_(2, 3, 4)),
    "mean_keepdim_squeeze": fn(lambda x: x.mean(-1, keepdim=True).squeeze(-1), x_(2, 3)),
    "amax_keepdim_squeeze": fn(lambda x: x.amax(0, keepdim=True).squeeze(0), x_(4, 3)),
    "amin_keepdim_squeeze": fn(lambda x: x.amin(2, keepdim=True).squeeze(2), x_(2, 3, 4)),
    "logsumexp_keepdim_squeeze": fn(lambda x: torch.logsumexp(x, 1, keepdim=True).squeeze(1), x_(3, 5)),
    "sign_sign": fn(lambda x: torch.sign(x).sign(), x_(6)),
    "floor_floor": fn(lambda x: torch.floor(torch.floor(x * 3)), x_(6)),
    "ceil_ceil": fn(lambda x: x.ceil().ceil(), x_(6)),
    "trunc_trunc": fn(lambda x: torch.trunc(x.trunc()), x_(6)),
    "round_round": fn(lambda x: torch.round(torch.round(x * 10)), x_(6)),
    # ---- algebra.py
    "add_neg": fn(lambda x, y: x + -y, x_(2, 3), x_(3)),
    "sub_neg": fn(lambda x, y: x - (-y), x_(2, 3), x_(2, 3)),
    "mul_neg_neg": fn(lambda x, y: (-x) * (-y), x_(4), x_(4)),
    "div_neg_neg": fn(lambda x, y: -x / -y, x_(4), pos_(4)),
    "abs_neg": fn(lambda x: abs(-x), x_(4)),
    "log1p_from_log": fn(lambda x: torch.log(1 + x), pos_(8)),
    "expm1_from_exp": fn(lambda x: x.exp() - 1.0, x_(8)),
    "rsqrt_from_sqrt": fn(lambda x: 1.0 / x.sqrt(), pos_(8)),
    "mean_from_sum": fn(lambda x: x.sum() / x.numel(), x_(3, 4)),
    # ---- activations.fxr
    "relu_relu": fn(lambda x: F.relu(torch.relu(x)), x_(8)),
    "relu6_relu": fn(lambda x: F.relu6(F.relu(x * 4)), x_(8)),
    "relu_relu6": fn(lambda x: F.relu6(x * 4).relu(), x_(8)),
    "relu6_relu6": fn(lambda x: F.relu6(F.relu6(x * 4)), x_(8)),
    "sigmoid_relu": fn(lambda x: torch.relu(x.sigmoid()), x_(8)),
    "hardtanh_to_relu6": fn(lambda x: F.hardtanh(x * 4, 0.0, 6.0), x_(8)),
    "abs_relu": fn(lambda x: torch.relu(x).abs(), x_(8)),
    # ---- activations.py
    "silu_from_sigmoid": fn(lambda x: torch.sigmoid(x) * x, x_(4, 4)),
    "sigmoid_from_exp": fn(lambda x: 1 / (1 + torch.exp(-x)), x_(4, 4)),
    "gelu_tanh": fn(lambda x: 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * torch.pow(x, 3)))),
                    x_(4, 4)),
    "gelu_tanh_fast": fn(lambda x: 0.5 * x * (1.0 + torch.tanh(x * 0.7978845608 * (1.0 + 0.044715 * x * x))),
                         x_(4, 4), shapes=True),
    "gelu_erf": fn(lambda x: x * 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0))), x_(4, 4)),
    "gelu_erf_scaled": fn(lambda x: 0.5 * x * (1 + torch.erf(x * 0.7071067811865476)), x_(4, 4)),
    "hardswish_from_relu6": fn(lambda x: x * F.relu6(x + 3.0) / 6.0, x_(4, 4)),
    "hardsigmoid_from_relu6": fn(lambda x: F.relu6(x + 3) / 6, x_(4, 4)),
    "hardswish_from_hardsigmoid": fn(lambda x: x * F.hardsigmoid(x), x_(4, 4)),
    "mish_from_softplus": fn(lambda x: x * torch.tanh(F.softplus(x)), x_(4, 4)),
    "relu6_from_clamp": fn(lambda x: x.clamp(0, 6), x_(4, 4)),
    "relu_from_clamp": fn(lambda x: torch.clamp(x, min=0.0), x_(4, 4)),
    "leaky_relu_from_where": fn(lambda x: torch.where(x > 0, x, 0.01 * x), x_(4, 4)),
    # ---- layout.fxr
    "transpose_transpose": fn(lambda x: x.transpose(1, 2).transpose(1, 2) + 1, x_(2, 3, 4)),
    "transpose_transpose_swapped": fn(lambda x: torch.transpose(x.transpose(0, 2), 2, 0) * 2, x_(2, 3, 4)),
    "t_t": fn(lambda x: x.t().t() * 2, x_(3, 4)),
    "unsqueeze_squeeze": fn(lambda x: x.unsqueeze(1).squeeze(1) * 2, x_(3, 4)),
    "flip_flip": fn(lambda x: x.flip(1).flip(1) * 2, x_(3, 4)),
    "flatten_flatten": fn(lambda x: x.flatten().flatten(), x_(3, 4)),
    "cat_single": fn(lambda x: torch.cat([x], dim=1) * 2, x_(3, 4)),
    "stack_single": fn(lambda x: torch.stack([x], 1), x_(3, 4)),
    "flatten_from_twice": fn(lambda x: x.flatten(1).flatten(1), x_(2, 3, 4, 5)),
    "view_as_view_as": fn(lambda x, y, z: x.view_as(y).view_as(z), x_(2, 6), x_(3, 4), x_(12)),
    "reshape_as_reshape_as": fn(lambda x, y, z: x.t().reshape_as(y).reshape_as(z), x_(2, 6), x_(3, 4), x_(4, 3)),
    "contiguous_contiguous": fn(lambda x: x.t().contiguous().contiguous(), x_(3, 4)),
    "clone_clone": fn(lambda x: x.clone().clone(), x_(3, 4)),
    "detach_detach": fn(lambda x: x.detach().detach() * 2, x_(3, 4)),
    "to_to": fn(lambda x: x.to(torch.float64).to(torch.float64), x_(3, 4)),
    "contiguous_matmul_left": fn(lambda x, y: x.transpose(0, 1).contiguous() @ y, x_(4, 3), x_(4, 5)),
    "contiguous_matmul_right": fn(lambda x, y: torch.matmul(x, y.t().contiguous()), x_(2, 3, 4), x_(5, 4)),
    "contiguous_linear": params(lambda m, x: F.linear(x.transpose(1, 2).contiguous(), m.w), x_(2, 3, 4), w=randn(5, 3)),
    "contiguous_linear_bias": params(lambda m, x: F.linear(x.mT.contiguous(), m.w, m.b), x_(2, 3, 4),
                                     w=randn(5, 3), b=randn(5)),
    # ---- layout.py
    "permute_permute_3d": fn(lambda x: x.permute(0, 2, 1).permute([1, 0, 2]), x_(2, 3, 4)),
    "permute_permute_4d": fn(lambda x: x.permute(0, 2, 3, 1).permute(0, 3, 1, 2) * 2, x_(2, 3, 4, 5)),
    "permute_permute_5d": fn(lambda x: torch.permute(x, (0, 2, 3, 4, 1)).permute(4, 3, 2, 1, 0), x_(2, 3, 1, 4, 2)),
    # ---- attention.py
    "attention_scaled": fn(lambda q, k, v: torch.matmul(F.softmax(q @ k.transpose(-2, -1) * 0.125, dim=-1), v),
                           x_(2, 3, 5, 8), x_(2, 3, 6, 8), x_(2, 3, 6, 4)),
    "attention_divided": fn(lambda q, k, v: (q @ k.transpose(-2, -1) / math.sqrt(16)).softmax(-1) @ v,
                            x_(2, 5, 16), x_(2, 5, 16), x_(2, 5, 16)),
    "attention_prescaled": fn(lambda q, k, v: torch.softmax((q * 0.25) @ k.transpose(-2, -1), dim=-1) @ v,
                              x_(2, 2, 4, 8), x_(2, 2, 4, 8), x_(2, 2, 4, 8)),
    "attention_unscaled": fn(lambda q, k, v: torch.softmax(q @ k.transpose(-2, -1), -1) @ v,
                             x_(3, 4), x_(5, 4), x_(5, 6)),
    "attention_bmm": fn(lambda q, k, v: torch.bmm(torch.softmax(torch.bmm(q, k.transpose(1, 2)) * 0.3, dim=-1), v),
                        x_(2, 4, 8), x_(2, 6, 8), x_(2, 6, 3)),
    "attention_sqrt_dim": fn(lambda q, k, v: F.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)), dim=-1) @ v,
                             x_(2, 4, 5, 8), x_(2, 4, 5, 8), x_(2, 4, 5, 8)),
    "attention_inverse_sqrt_dim": fn(
        lambda q, k, v: F.softmax((q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1))), dim=-1) @ v,
        x_(2, 4, 5, 8), x_(2, 4, 5, 8), x_(2, 4, 5, 8)),
    "attention_alibi_bmm": fn(lambda q, k, v, bias, mask: torch.bmm(F.softmax(
        bias.baddbmm(q, k.transpose(-1, -2), beta=1.0, alpha=0.25).view(2, 3, 5, -1) + mask, dim=-1).view(6, 5, -1), v),
        x_(6, 5, 8), x_(6, 7, 8), x_(6, 7, 4), x_(6, 1, 7), x_(2, 1, 5, 7), shapes=True),
    "attention_masked": fn(lambda q, k, v, mask: torch.softmax(q @ k.transpose(-2, -1) * 0.25 + mask, -1) @ v,
                           x_(2, 2, 5, 16), x_(2, 2, 5, 16), x_(2, 2, 5, 16), lambda: causal_mask(5), shapes=True),
    "attention_masked_sqrt_dim": fn(
        lambda q, k, v, mask: F.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)) + mask, dim=-1) @ v,
        x_(2, 2, 5, 16), x_(2, 2, 5, 16), x_(2, 2, 5, 16), lambda: causal_mask(5), shapes=True),
    "attention_masked_inverse_sqrt_dim": fn(
        lambda q, k, v, mask: F.softmax(q @ k.transpose(-2, -1) * (1.0 / math.sqrt(k.size(-1))) + mask, -1) @ v,
        x_(2, 2, 5, 16), x_(2, 2, 5, 16), x_(2, 2, 5, 16), lambda: randn(2, 1, 5, 5), shapes=True),
    "attention_masked_divided": fn(
        lambda q, k, v, mask: torch.matmul(F.softmax(torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(16) + mask,
                                                     dim=-1), v),
        x_(2, 2, 5, 16), x_(2, 2, 5, 16), x_(2, 2, 5, 16), lambda: torch.randint(0, 2, (2, 1, 1, 5)) * -10000.0,
        shapes=True),
    "attention_masked_unscaled": fn(lambda q, k, v, mask: F.softmax(q @ k.transpose(-2, -1) + mask, dim=-1) @ v,
                                    x_(2, 2, 5, 16), x_(2, 2, 5, 16), x_(2, 2, 5, 16), lambda: causal_mask(5),
                                    shapes=True),
    "attention_masked_two_terms": fn(  # T5: position bias and padding mask, scaling 1.0
        lambda q, k, v, bias, mask: torch.matmul(
            F.softmax(torch.matmul(q, k.transpose(-2, -1)) * 1.0 + bias + mask, dim=-1), v),
        x_(2, 2, 5, 16), x_(2, 2, 5, 16), x_(2, 2, 5, 16), x_(1, 2, 5, 5), lambda: padding_mask(2, 5), shapes=True),
    "attention_where_mask_to_additive": fn(
        lambda q, k, v, c: torch.softmax(torch.where(c, q @ k.transpose(-2, -1), torch.finfo(torch.float32).min),
                                         -1) @ v,
        x_(2, 2, 5, 16), x_(2, 2, 5, 16), x_(2, 2, 5, 16), lambda: torch.ones(5, 5, dtype=torch.bool).tril(),
        shapes=True),
    "attention_where_and_additive_mask_to_additive": fn(  # GPT-Neo, with its mask value a literal
        lambda q, k, v, c, mask: torch.matmul(
            F.softmax(torch.where(c, torch.matmul(q, k.transpose(-1, -2)), -3.4028234663852886e+38) + mask, dim=-1), v),
        x_(2, 2, 5, 16), x_(2, 2, 5, 16), x_(2, 2, 5, 16), lambda: torch.ones(1, 1, 5, 5, dtype=torch.bool).tril(),
        lambda: padding_mask(2, 5), shapes=True),
    "attention_masked_fill_to_additive": fn(
        lambda q, k, v, mask: (q @ k.transpose(-2, -1) / 4.0).masked_fill(mask == 0, float("-inf")).softmax(-1) @ v,
        x_(2, 2, 5, 16), x_(2, 2, 5, 16), x_(2, 2, 5, 16), lambda: torch.ones(5, 5).tril(), shapes=True),
    # ---- fusion.py / fusion.fxr
    "conv_bn_fold": module(lambda: nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), trained_bn(nn.BatchNorm2d(4))),
                           x_(2, 3, 8, 8)),
    "linear_bn_fold": module(lambda: nn.Sequential(nn.Linear(5, 4), trained_bn(nn.BatchNorm1d(4))), x_(3, 5),
                             shapes=True),
    "linear_add_bias": params(lambda m, x: F.linear(x, m.w) + m.b, x_(2, 3, 5), shapes=True, w=randn(4, 5), b=randn(4)),
    "matmul_add_bias": params(lambda m, x: m.b + x @ m.w.t(), x_(3, 5), shapes=True, w=randn(4, 5), b=randn(4)),
    "linear_layer_add_bias": module(lambda: LinearPlusBias(), x_(2, 5), shapes=True),
    "dropout_layer_inactive": module(lambda: nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5)), x_(2, 4)),
    "dropout_inactive": module(lambda: FunctionalDropout(), x_(2, 4)),
    # ---- normalization.py
    "layer_norm_from_var": fn(layer_norm_var, x_(2, 3, 8)),
    "layer_norm_from_var_affine": params(lambda m, x: layer_norm_var(x) * m.weight + m.bias, x_(2, 3, 8), shapes=True,
                                         weight=randn(8), bias=randn(8)),
    "layer_norm_from_centered": fn(layer_norm_bert, x_(2, 3, 8)),
    "layer_norm_from_centered_affine": params(lambda m, x: m.weight * layer_norm_bert(x) + m.bias, x_(2, 3, 8),
                                              shapes=True, weight=randn(8), bias=randn(8)),
    "rms_norm_from_rsqrt": fn(lambda x: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6), x_(2, 3, 8)),
    "rms_norm_from_rsqrt_affine": params(
        lambda m, x: m.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)), x_(2, 3, 8), shapes=True,
        weight=randn(8)),
    "rms_norm_from_sqrt": fn(lambda x: x / torch.sqrt((x ** 2).mean(dim=-1, keepdim=True) + 1e-6), x_(2, 3, 8)),
    "rms_norm_upcast_affine": module(lambda: LlamaRMSNorm(8).to(torch.bfloat16), bf16_(2, 3, 8), shapes=True),
    "rms_norm_upcast_gemma": module(lambda: GemmaRMSNorm(8).to(torch.bfloat16), bf16_(2, 3, 8), shapes=True),
    "rms_norm_t5_affine": module(lambda: T5LayerNorm(8), x_(2, 3, 8), shapes=True),
    "rms_norm_t5_half": module(lambda: T5LayerNorm(8, dtype=torch.bfloat16), bf16_(2, 3, 8), shapes=True),
    "softmax_from_exp_amax": fn(softmax_amax, x_(3, 7)),
    "softmax_from_exp_max": fn(softmax_max, x_(3, 7)),
    "softmax_from_exp_max_values": fn(softmax_max_values, x_(3, 7)),
    "softmax_from_exp": fn(softmax_naive, x_(3, 7)),
    "log_softmax_from_logsumexp": fn(lambda x: x - torch.logsumexp(x, -1, keepdim=True), x_(3, 7)),
    "log_softmax_from_log": fn(lambda x: torch.log(F.softmax(x, dim=1)), x_(3, 7)),
    "softmax_upcast": fn(lambda x: F.softmax(x * 4, dim=-1, dtype=torch.float32).to(x.dtype), bf16_(3, 7), shapes=True),
}


class LlamaRMSNorm(nn.Module):
    """transformers' LlamaRMSNorm (Mistral, Qwen2, ... copy it): normalizes in float32."""

    def __init__(self, n: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.rand(n) + 0.5)
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


class GemmaRMSNorm(nn.Module):
    """transformers' GemmaRMSNorm: float32 throughout, weight applied as 1 + w."""

    def __init__(self, n: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.randn(n) * 0.1)

    def _norm(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    def forward(self, x):
        output = self._norm(x.float())
        output = output * (1.0 + self.weight.float())
        return output.type_as(x)


class T5LayerNorm(nn.Module):
    """transformers' T5LayerNorm: the variance in float32, the weight in the weight's dtype. (It
    tests ``self.weight.dtype`` in ``forward``, which symbolic_trace cannot: decided here when
    the module is built.)"""

    def __init__(self, n: int, eps: float = 1e-6, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.weight = nn.Parameter((torch.rand(n) + 0.5).to(dtype))
        self.variance_epsilon = eps
        self.half = dtype in (torch.float16, torch.bfloat16)

    def forward(self, hidden_states):
        variance = hidden_states.to(torch.float32).pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        if self.half:
            hidden_states = hidden_states.to(self.weight.dtype)
        return self.weight * hidden_states


class LinearPlusBias(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(5, 4, bias=False)
        self.b = nn.Parameter(torch.randn(4))

    def forward(self, x):
        return self.lin(x) + self.b


class FunctionalDropout(nn.Module):
    def forward(self, x):
        return F.dropout(x * 2, p=0.1, training=self.training)


# ---- reshape.py: one case per pair of ranks, built like the rules ---------------------------------
_FIRST_SHAPES = {1: (24,), 2: (4, 6), 3: (2, 3, 4), 4: (2, 3, 2, 2)}
_SECOND_SHAPES = {1: (-1,), 2: (3, -1), 3: (4, 3, 2), 4: (1, 4, 3, 2)}


def _chain_case(op: str, inner: int, outer: int) -> Case:
    first, second = _FIRST_SHAPES[inner], _SECOND_SHAPES[outer]
    return fn(lambda x: getattr(getattr(x, op)(*first), op)(*second) * 2, x_(24))


for _op in ("reshape", "view"):
    for _inner in range(1, 5):
        for _outer in range(1, 5):
            CASES[f"{_op}{_inner}_{_op}{_outer}"] = _chain_case(_op, _inner, _outer)


# ---- the library's shape ----------------------------------------------------------------------------


def test_library_has_at_least_30_rules():
    assert len(LIBRARY) >= 30


def test_rule_names_are_unique():
    names = [r.name for r in LIBRARY]
    assert len(names) == len(set(names))


@pytest.mark.parametrize("name", LIBRARY.names)
def test_rule_doc_is_one_replaces_sentence(name):
    doc = LIBRARY[name].doc
    assert doc and doc.startswith("Replaces ") and doc.endswith(".") and "\n" not in doc


def test_at_least_a_third_of_the_rules_are_dsl_rules():
    from_dsl = [r for r in LIBRARY if r.origin.rpartition(":")[0].endswith(".fxr")]
    assert 3 * len(from_dsl) >= len(LIBRARY)


def test_every_rule_has_a_rewrite_case():
    assert set(CASES) == set(LIBRARY.names), (
        f"rules without a case: {sorted(set(LIBRARY.names) - set(CASES))}; "
        f"cases without a rule: {sorted(set(CASES) - set(LIBRARY.names))}")


def test_attention_rules_outrank_the_small_rules():
    small = max(r.priority for r in LIBRARY if not r.name.startswith("attention_") and r.priority < 20)
    assert all(LIBRARY[n].priority > small for n in LIBRARY.names if n.startswith("attention_"))


# ---- one rewrite per rule --------------------------------------------------------------------------


def tolerance(rules: RuleSet | list) -> dict[str, float]:
    """The loosest declared tolerance among ``rules`` (assert_close's defaults if none)."""
    declared = [r.tolerance for r in rules if r.tolerance]
    if not declared:
        return {}
    return {"rtol": max(t.get("rtol", 1.3e-6) for t in declared), "atol": max(t.get("atol", 1e-5) for t in declared)}


def run(program: Any, inputs: tuple[Any, ...]) -> Any:
    with torch.no_grad():
        return program(*inputs)


@pytest.mark.parametrize("name", sorted(CASES))
def test_rule_rewrites_its_case(name):
    torch.manual_seed(0)
    rule = LIBRARY[name]
    case = CASES[name]
    program, inputs = case.model(), case.inputs()
    expected = run(program, inputs)
    result = rewrite(program, rule, example_inputs=inputs if case.shapes or _floating_only(rule) else None)
    assert result.report.applied[name] >= 1, f"{name} did not fire: {result.report.reasons[name]}\n{result.code}"
    result.module.graph.lint()
    torch.testing.assert_close(run(result.module, inputs), expected, **tolerance([rule]))


#: Rules whose pattern a torch.export graph of their case cannot contain, and why. Each is
#: checked not to fire there (were it to, the entry would be stale).
NOT_IN_EXPORTED_GRAPHS = {
    "conv_bn_fold": "export inlines modules: there is no call_module for the module capture to bind",
    "linear_bn_fold": "export inlines modules: there is no call_module for the module capture to bind",
    "dropout_layer_inactive": "export inlines modules (and writes an eval nn.Dropout as aten.dropout, "
                              "which dropout_inactive takes)",
    "linear_layer_add_bias": "export inlines modules: there is no call_module for the module capture to bind",
    "contiguous_contiguous": "export already drops the second contiguous() of a contiguous tensor",
}


class _Exportable(nn.Module):
    def __init__(self, f):
        super().__init__()
        self.f = f

    def forward(self, *args):
        return self.f(*args)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CASES))
def test_rule_fires_on_the_export_of_its_case(name):
    """One rule, every IR: the rule written at the torch level fires on the ATen graph
    torch.export makes of its own case (sizes folded to constants, casts as aten.to, 1 / x as
    reciprocal(x) * 1, ...), with the same numbers."""
    torch.manual_seed(0)
    rule = LIBRARY[name]
    case = CASES[name]
    program, inputs = case.model(), case.inputs()
    module = program if isinstance(program, nn.Module) else _Exportable(program)
    expected = run(module, inputs)
    result = rewrite(torch.export.export(module, tuple(inputs)), rule)
    if name in NOT_IN_EXPORTED_GRAPHS:
        assert result.report.applied[name] == 0, f"{name} fires on its export now: drop it from NOT_IN_EXPORTED_GRAPHS"
        return
    assert result.report.applied[name] >= 1, f"{name} did not fire: {result.report.reasons[name]}\n{result.code}"
    result.module.graph.lint()
    torch.testing.assert_close(run(result.module, inputs), expected, **tolerance([rule]))


def _floating_only(rule) -> bool:
    """Rules whose guard needs the dtype of a graph input (known only from metadata)."""
    return any(getattr(guard, "__name__", "").startswith(("floating(", "same_signed_dtype(", "signed("))
               for guard in rule.where)


def test_floating_only_rules_never_fire_on_inputs_of_unknown_dtype():
    """Without metadata a graph input may be an integer tensor (a mask, indices), where these
    rules are wrong: they refuse, and say how to provide the dtypes (issue 11.4)."""
    floating_only = [n for n in sorted(CASES) if _floating_only(LIBRARY[n]) and not CASES[n].shapes]
    assert len(floating_only) > 20
    for name in floating_only:
        case = CASES[name]
        program = case.model()
        if isinstance(program, nn.Module):
            continue  # parameters tell their dtype: covered by the whole-library tests below
        result = rewrite(program, LIBRARY[name])
        assert result.report.applied[name] == 0, name
        assert "example_inputs=" in result.report.reasons[name][0], result.report.reasons[name]
        assert_rewrite_sound(program, result, *case.inputs())


def test_a_float_only_rule_refuses_an_integer_input_that_it_would_get_wrong():
    def f(x, y):
        return x + torch.neg(y)

    x, y = torch.randint(0, 5, (4,)), torch.randint(0, 250, (4,), dtype=torch.uint8)
    for example_inputs in (None, (x, y)):
        result = rewrite(f, LIBRARY["add_neg"], example_inputs=example_inputs)
        assert result.report.applied["add_neg"] == 0
        assert_rewrite_sound(f, result, x, y)


def test_rules_needing_shapes_do_not_fire_without_them():
    strict = [n for n, case in CASES.items() if case.shapes]
    assert strict, "some rules need shape metadata"
    for name in strict:
        case = CASES[name]
        program = case.model()
        result = rewrite(program, LIBRARY[name])
        assert result.report.applied[name] == 0, name
        assert_rewrite_sound(program, result, *case.inputs())


def test_bias_folding_leaves_a_residual_add_alone():
    model = WithParams(lambda m, x: F.linear(x, m.w) + x, w=randn(4, 4))
    result = rewrite(model, LIBRARY["linear_add_bias"], example_inputs=(randn(2, 3, 4),))
    assert result.report.applied["linear_add_bias"] == 0
    assert_rewrite_sound(model, result, randn(2, 3, 4))


def test_masked_attention_leaves_a_mask_that_enlarges_the_scores_alone():
    def f(q, k, v, mask):
        return torch.softmax(q @ k.transpose(-2, -1) * 0.5 + mask, -1) @ v

    inputs = (randn(5, 8), randn(5, 8), randn(5, 8), randn(3, 5, 5))
    result = rewrite(f, LIBRARY["attention_masked"], example_inputs=inputs)
    assert result.report.applied["attention_masked"] == 0
    assert_rewrite_sound(f, result, *inputs)


def test_batch_norm_is_not_folded_in_training_mode():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)).train()
    result = rewrite(model, LIBRARY["conv_bn_fold"])
    assert result.report.applied["conv_bn_fold"] == 0
    assert_rewrite_sound(model, result, randn(2, 3, 8, 8))  # batch statistics, as in training


@pytest.mark.parametrize("conv, bn, shape", [
    (lambda: nn.Conv1d(3, 4, 3, groups=1), lambda: nn.BatchNorm1d(4), (2, 3, 9)),
    (lambda: nn.Conv2d(4, 4, 3, stride=2, groups=2, bias=False), lambda: nn.BatchNorm2d(4), (2, 4, 9, 9)),
    (lambda: nn.Conv3d(3, 4, 2), lambda: nn.BatchNorm3d(4, affine=False), (1, 3, 4, 4, 4)),
    (lambda: nn.ConvTranspose2d(3, 4, 3, stride=2), lambda: nn.BatchNorm2d(4), (2, 3, 5, 5)),
])
def test_conv_bn_fold_handles_every_convolution(conv, bn, shape):
    torch.manual_seed(0)
    batch_norm = bn()
    if batch_norm.affine:
        trained_bn(batch_norm)
    else:
        batch_norm.running_mean.uniform_(-1, 1)
        batch_norm.running_var.uniform_(0.5, 2)
    model = nn.Sequential(conv(), batch_norm).eval()
    x = randn(*shape)
    result = rewrite(model, LIBRARY["conv_bn_fold"])
    assert result.report.applied["conv_bn_fold"] == 1
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in result.module.modules())
    assert_rewrite_sound(model, result, x, rtol=1e-4, atol=1e-5)


def test_permutes_that_cancel_leave_the_input():
    result = rewrite(lambda x: x.permute(0, 2, 3, 1).permute(0, 3, 1, 2), LIBRARY["permute_permute_4d"])
    assert "permute" not in result.code
    assert_rewrite_sound(lambda x: x.permute(0, 2, 3, 1).permute(0, 3, 1, 2), result, randn(2, 3, 4, 5))


# ---- spellings: the whole library brings each spelling to the one a rule matches -----------------

ATTENTION_SPELLINGS = {
    "mT": lambda q, k, v: F.softmax(q @ k.mT * 0.125, dim=-1) @ v,
    "transpose(-1, -2)": lambda q, k, v: torch.softmax(torch.matmul(q, k.transpose(-1, -2)) * 0.125, -1) @ v,
    "method softmax": lambda q, k, v: (0.125 * (q @ k.transpose(-2, -1))).softmax(dim=-1).matmul(v),
    "scale first": lambda q, k, v: torch.softmax(q @ k.transpose(-2, -1) / 8.0, dim=-1) @ v,
    "timm": lambda q, k, v: ((q * 0.125) @ k.transpose(-2, -1)).softmax(dim=-1) @ v,
    "q.shape[-1]": lambda q, k, v: F.softmax(q @ k.mT / math.sqrt(q.shape[-1]), -1) @ v,
}


@pytest.mark.parametrize("spelling", sorted(ATTENTION_SPELLINGS))
def test_library_turns_every_attention_spelling_into_sdpa(spelling):
    f = ATTENTION_SPELLINGS[spelling]
    torch.manual_seed(0)
    inputs = (randn(2, 3, 5, 64), randn(2, 3, 7, 64), randn(2, 3, 7, 16))
    result = rewrite(f, LIBRARY)
    result.module.graph.lint()
    assert "scaled_dot_product_attention" in result.code and "softmax" not in result.code, result.code
    torch.testing.assert_close(run(result.module, inputs), run(f, inputs), rtol=1e-4, atol=1e-5)


#: Spellings the matcher should line up with a rule's own but does not yet: a literal capture
#: (``d: int``) in an ``int[]`` argument (``dim`` of sum/mean/amax/logsumexp) keeps the pattern
#: call out of the canonical (ATen schema) form, so only the pattern's exact spelling matches.
REDUCTION_SPELLINGS = {
    "mean_keepdim_squeeze": lambda x: torch.mean(x, dim=-1, keepdim=True).squeeze(-1),
    "sum_keepdim_squeeze": lambda x: torch.sum(x, 1, keepdim=True).squeeze(1),
    "softmax_from_exp_amax": lambda x: torch.exp(x - x.amax(dim=1, keepdim=True)) / torch.exp(
        x - x.amax(dim=1, keepdim=True)).sum(dim=1, keepdim=True),
    "log_softmax_from_logsumexp": lambda x: x - x.logsumexp(-1, keepdim=True),
}


@pytest.mark.parametrize("name", sorted(REDUCTION_SPELLINGS))
def test_reduction_rules_match_other_spellings_of_dim(name):
    f = REDUCTION_SPELLINGS[name]
    x = randn(3, 5)
    result = rewrite(f, LIBRARY[name], example_inputs=(x,))
    assert result.report.applied[name] == 1
    assert_rewrite_sound(f, result, x, **tolerance([LIBRARY[name]]))


#: Boolean masks before the softmax, with a mask value that absorbs any score.
BOOL_MASKED_ATTENTION = {
    "where finfo.min": lambda q, k, v, c: torch.softmax(
        torch.where(c, q @ k.transpose(-2, -1) * 0.25, torch.finfo(torch.float32).min), dim=-1) @ v,
    "masked_fill -inf": lambda q, k, v, c: F.softmax(
        (q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))).masked_fill(~c, float("-inf")), dim=-1) @ v,
    "masked_fill unscaled": lambda q, k, v, c: torch.matmul(
        torch.softmax(torch.matmul(q, k.transpose(-2, -1)).masked_fill(c.logical_not(), -1e30), -1), v),
}


@pytest.mark.parametrize("spelling", sorted(BOOL_MASKED_ATTENTION))
def test_library_turns_boolean_masked_attention_into_sdpa(spelling):
    f = BOOL_MASKED_ATTENTION[spelling]
    torch.manual_seed(0)
    inputs = (randn(2, 2, 5, 16), randn(2, 2, 5, 16), randn(2, 2, 5, 16), torch.ones(5, 5, dtype=torch.bool).tril())
    result = rewrite(f, LIBRARY, example_inputs=inputs)
    assert "scaled_dot_product_attention" in result.code and "softmax" not in result.code, result.code
    assert_rewrite_sound(f, result, *inputs, rtol=1e-4, atol=1e-5)


class NanoGPTAttention(nn.Module):
    """nanoGPT's CausalSelfAttention (its non-flash path): masked_fill(bias == 0, -inf) on the
    scaled scores, softmax, dropout, @ v."""

    def __init__(self, n_embd: int = 32, n_head: int = 4, block_size: int = 8) -> None:
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.attn_dropout = nn.Dropout(0.1)
        self.n_head, self.n_embd = n_head, n_embd
        self.register_buffer("bias", torch.tril(torch.ones(block_size, block_size)).view(1, 1, block_size, block_size))

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = self.attn_dropout(F.softmax(att, dim=-1))
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


@pytest.mark.parametrize("how", ["traced", "traced with shapes", "exported"])
def test_library_turns_nanogpt_attention_into_sdpa_when_it_has_shapes(how):
    torch.manual_seed(0)
    model, x = NanoGPTAttention().eval(), randn(2, 8, 32)
    target = torch.export.export(model, (x,)) if how == "exported" else model
    result = rewrite(target, LIBRARY, example_inputs=(x,) if how == "traced with shapes" else None)
    result.module.graph.lint()
    if how == "traced":  # no shapes: the block stays as written (the mask is not re-spelled for nothing)
        assert "scaled_dot_product_attention" not in result.code and "masked_fill" in result.code, result.code
    else:
        assert "scaled_dot_product_attention" in result.code and "softmax" not in result.code, result.code
    torch.testing.assert_close(result.module(x), model(x), rtol=1e-4, atol=1e-5)


def test_a_boolean_mask_whose_value_does_not_absorb_the_scores_stays():
    """-1e4 + a score is not -1e4: on a row masked entirely the formula gives uniform weights, the
    additive form the softmax of the scores."""
    def f(q, k, v, c):
        return torch.softmax(torch.where(c, q @ k.transpose(-2, -1), -1e4), -1) @ v

    c = torch.ones(5, 5, dtype=torch.bool).tril()
    c[2] = False  # a row masked entirely
    inputs = (randn(1, 5, 8) * 10, randn(1, 5, 8) * 10, randn(1, 5, 8), c)
    result = rewrite(f, LIBRARY, example_inputs=inputs)
    assert result.report.applied["attention_where_mask_to_additive"] == 0
    assert "scaled_dot_product_attention" not in result.code
    assert_rewrite_sound(f, result, *inputs)


# ---- Hugging Face's own blocks, as transformers writes them (exported, as the model zoo does) ---------

#: transformers module -> (class, {dtype: the rule that fuses it}).
HF_NORMS = {
    "llama": ("llama", "LlamaRMSNorm", {torch.float32: "rms_norm_upcast_affine",
                                        torch.bfloat16: "rms_norm_upcast_affine"}),
    # in float32 Gemma's casts are no-ops too, and Llama's rule (w := 1 + w.float()) computes the same
    "gemma": ("gemma", "GemmaRMSNorm", {torch.float32: ("rms_norm_upcast_gemma", "rms_norm_upcast_affine"),
                                        torch.bfloat16: "rms_norm_upcast_gemma"}),
    # in float32 every cast is a no-op: T5's rule and Llama's (whose downcast the matcher then does
    # not need) compute the same, and the first in the library takes it
    "t5": ("t5", "T5LayerNorm", {torch.float32: ("rms_norm_t5_affine", "rms_norm_upcast_affine"),
                                 torch.bfloat16: "rms_norm_t5_half"}),
}


def _hf_class(module: str, name: str) -> type:
    pytest.importorskip("transformers")
    import importlib

    return getattr(importlib.import_module(f"transformers.models.{module}.modeling_{module}"), name)


def _hf_norm(name: str, dtype: torch.dtype) -> tuple[nn.Module, torch.Tensor, tuple[str, ...]]:
    """transformers' norm class ``name`` (weights in [0.5, 1.5]) in ``dtype``, an input, and the
    rules that may fuse it (any one of them, once)."""
    module, cls, expected = HF_NORMS[name]
    torch.manual_seed(0)
    norm = _hf_class(module, cls)(16).eval()
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    names = expected[dtype] if isinstance(expected[dtype], tuple) else (expected[dtype],)
    return norm.to(dtype), (randn(2, 5, 16) * 3).to(dtype), names


@pytest.fixture(scope="module")
def hf_norm_classes() -> None:
    """Imports transformers' modeling modules of HF_NORMS once, in set-up (over a second of CPU)."""
    for module, cls, _ in HF_NORMS.values():
        _hf_class(module, cls)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("name", ["gemma", "llama"])
def test_library_fuses_hugging_face_rms_norms_traced(name, dtype, hf_norm_classes):
    """The same classes under symbolic_trace (T5LayerNorm's ``if`` on its weight's dtype does not
    trace): the casts are call_method nodes (``.to(torch.float32)``, ``.float()``, ``.type_as``)."""
    norm, x, names = _hf_norm(name, dtype)
    result = rewrite(norm, LIBRARY, example_inputs=(x,))
    assert sum(result.report.applied[n] for n in names) == 1, result.report.applied
    assert "rms_norm" in result.code and "rsqrt" not in result.code, result.code
    assert_rewrite_sound(norm, result, x, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("name", sorted(HF_NORMS))
def test_library_fuses_hugging_face_rms_norms(name, dtype, hf_norm_classes):
    """In float32 T5's upcast of the input (``x.to(float32)``) is a no-op the matcher looks through,
    so T5's own rule fires; in bfloat16 every cast is real and stays in the pattern."""
    norm, x, names = _hf_norm(name, dtype)
    result = rewrite(torch.export.export(norm, (x,)), LIBRARY)
    result.module.graph.lint()
    assert sum(result.report.applied[n] for n in names) == 1, result.report.applied
    assert "rms_norm" in result.code and "rsqrt" not in result.code, result.code
    torch.testing.assert_close(result.module(x), norm(x), rtol=1e-4, atol=1e-4)


#: transformers activation class -> its arguments and the rule that fuses it into F.gelu(approximate="tanh").
HF_ACTIVATIONS = {
    "NewGELUActivation": ({}, "gelu_tanh"),
    "GELUTanh": ({"use_gelu_tanh_python": True}, "gelu_tanh"),
    "AccurateGELUActivation": ({}, "gelu_tanh"),
    "FastGELUActivation": ({}, "gelu_tanh_fast"),
}


@pytest.mark.parametrize("name", sorted(HF_ACTIVATIONS))
def test_library_fuses_hugging_face_gelu_activations(name):
    transformers = pytest.importorskip("transformers")
    kwargs, expected = HF_ACTIVATIONS[name]
    act = getattr(transformers.activations, name)(**kwargs).eval()
    x = randn(3, 16) * 4
    result = rewrite(act, LIBRARY, example_inputs=(x,))
    assert result.report.applied[expected] == 1, result.report.applied
    assert "gelu" in result.code and "tanh(" not in result.code, result.code
    assert_rewrite_sound(act, result, x, rtol=1e-5, atol=1e-5)


class EagerAttention(nn.Module):
    """Calls a transformers ``eager_attention_forward`` as its attention module does (eval mode,
    so ``dropout=0.0``), and returns the attention output."""

    def __init__(self, forward: Callable[..., Any], **kwargs: Any) -> None:
        super().__init__()
        self.attention, self.kwargs = forward, kwargs
        self.num_key_value_groups = 1

    def forward(self, q, k, v, mask):
        return self.attention(self, q, k, v, mask, dropout=0.0, **self.kwargs)[0]


#: transformers module -> eager_attention_forward's extra arguments. Llama (OPT, Qwen2, Mistral,
#: Phi, ViT write the same) upcasts the softmax to float32 and casts back to q's dtype; GPT-2
#: computes its scale from q.size(-1) and casts with .type(v.dtype); T5 adds a position bias.
HF_ATTENTION = {
    "llama": {"scaling": 0.25},
    "gpt2": {},
    "bert": {"scaling": 0.25},
    "t5": {"scaling": 1.0, "position_bias": "bias"},
    "gemma2": {"scaling": 0.25, "softcap": None},
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("name", sorted(HF_ATTENTION))
def test_library_turns_hugging_face_eager_attention_into_sdpa(name, dtype):
    pytest.importorskip("transformers")
    import importlib

    forward = importlib.import_module(f"transformers.models.{name}.modeling_{name}").eager_attention_forward
    torch.manual_seed(0)
    kwargs = dict(HF_ATTENTION[name])
    if kwargs.get("position_bias"):
        kwargs["position_bias"] = randn(1, 2, 5, 5).to(dtype)
    model = EagerAttention(forward, **kwargs).eval()
    q, k, v = (randn(2, 2, 5, 16).to(dtype) for _ in range(3))
    inputs = (q, k, v, padding_mask(2, 5).to(dtype))
    result = rewrite(torch.export.export(model, inputs), LIBRARY)
    result.module.graph.lint()
    assert "scaled_dot_product_attention" in result.code and "softmax" not in result.code, result.code
    close = {"rtol": 1e-4, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 2e-2}
    torch.testing.assert_close(result.module(*inputs), model(*inputs), **close)


def test_the_where_that_builds_an_additive_mask_is_not_taken_for_masked_scores():
    """Hugging Face builds its additive mask as where(c, 0, finfo.min) and adds the scores to it:
    the GPT-Neo rule must not read that where as a boolean mask on scores (0 is not q @ k^T)."""
    def f(q, k, v, c):
        mask = torch.where(c, torch.zeros(()), torch.finfo(torch.float32).min)
        return torch.softmax(q @ k.transpose(-2, -1) * 0.25 + mask, -1) @ v

    inputs = (randn(2, 2, 5, 16), randn(2, 2, 5, 16), randn(2, 2, 5, 16), torch.ones(5, 5, dtype=torch.bool).tril())
    result = rewrite(f, LIBRARY)  # no shapes: attention_masked cannot fire, nothing else may
    assert result.report.applied["attention_where_and_additive_mask_to_additive"] == 0
    assert result.report.rewrites == 0, result.report.applied
    with_shapes = rewrite(f, LIBRARY, example_inputs=inputs)
    assert with_shapes.report.applied["attention_masked"] == 1
    assert_rewrite_sound(f, with_shapes, *inputs, rtol=1e-4, atol=1e-5)


class GPTNeoAttention(nn.Module):
    """GPT-Neo's eager attention (``GPTNeoSelfAttention._attn``): the causal mask as a bool buffer
    through ``torch.where(causal_mask, scores, torch.tensor(finfo.min))``, then the padding mask."""

    def __init__(self) -> None:
        super().__init__()
        from transformers import GPTNeoConfig
        from transformers.models.gpt_neo.modeling_gpt_neo import GPTNeoSelfAttention

        config = GPTNeoConfig(hidden_size=32, num_heads=2, max_position_embeddings=8)
        self.attn = GPTNeoSelfAttention(config, attention_type="global").eval()

    def forward(self, q, k, v, mask):
        return self.attn._attn(q, k, v, mask)[0]


def test_library_turns_gpt_neo_attention_into_sdpa():
    pytest.importorskip("transformers")
    model = GPTNeoAttention()
    torch.manual_seed(0)
    inputs = (*(randn(2, 2, 5, 16) for _ in range(3)), padding_mask(2, 5))
    result = rewrite(torch.export.export(model, inputs), LIBRARY)
    result.module.graph.lint()
    torch.testing.assert_close(result.module(*inputs), model(*inputs), rtol=1e-4, atol=1e-5)
    assert "scaled_dot_product_attention" in result.code, result.code


def test_soft_capped_attention_stays_eager():
    """Gemma-2's soft-capping (tanh(scores / cap) * cap) has no place in scaled_dot_product_attention:
    no rule may take the block (without the cap it is converted, above)."""
    pytest.importorskip("transformers")
    from transformers.models.gemma2.modeling_gemma2 import eager_attention_forward

    model = EagerAttention(eager_attention_forward, scaling=0.25, softcap=5.0).eval()
    torch.manual_seed(0)
    inputs = (*(randn(2, 2, 5, 16) * 2 for _ in range(3)), padding_mask(2, 5))
    result = rewrite(torch.export.export(model, inputs), LIBRARY)
    result.module.graph.lint()
    assert "scaled_dot_product_attention" not in result.code and "tanh" in result.code
    torch.testing.assert_close(result.module(*inputs), model(*inputs))


# ---- the whole library on small models --------------------------------------------------------------


class Block(nn.Module):
    """A pre-norm transformer block written the long way."""

    def __init__(self, dim: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.ln1_w, self.ln1_b = nn.Parameter(torch.rand(dim) + 0.5), nn.Parameter(torch.randn(dim) * 0.1)
        self.qkv_w = nn.Parameter(torch.randn(3 * dim, dim) / dim ** 0.5)
        self.qkv_b = nn.Parameter(torch.randn(3 * dim))
        self.proj = nn.Linear(dim, dim)
        self.attn_drop = nn.Dropout(0.1)
        self.ln2_w, self.ln2_b = nn.Parameter(torch.rand(dim) + 0.5), nn.Parameter(torch.randn(dim) * 0.1)
        self.fc1 = nn.Linear(dim, 4 * dim, bias=False)
        self.fc1_b = nn.Parameter(torch.randn(4 * dim) * 0.1)
        self.fc2 = nn.Linear(4 * dim, dim)
        self.rms_w = nn.Parameter(torch.rand(dim) + 0.5)

    def forward(self, x, mask):
        b, t, c = x.shape
        h = (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, keepdim=True, unbiased=False) + 1e-5)
        h = h * self.ln1_w + self.ln1_b
        qkv = F.linear(h, self.qkv_w) + self.qkv_b
        q, k, v = qkv.split(c, dim=-1)
        q = q.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        k = k.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        v = v.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        att = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(k.size(-1))) + mask
        att = self.attn_drop(F.softmax(att, dim=-1))
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, c)
        x = x + self.proj(y)
        u = x.mean(-1, keepdim=True)
        s = (x - u).pow(2).mean(-1, keepdim=True)
        h = self.ln2_w * ((x - u) / torch.sqrt(s + 1e-5)) + self.ln2_b
        h = self.fc1(h) + self.fc1_b
        h = 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * torch.pow(h, 3.0))))
        x = x + self.fc2(F.dropout(h, p=0.1, training=self.training))
        x = self.rms_w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))
        return x - torch.logsumexp(x, -1, keepdim=True)


class SmallConvNet(nn.Module):
    """Conv-BN blocks, hand-written activations, a layout round trip and a linear-BN head."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(3, 8, 3, padding=1), trained_bn(nn.BatchNorm2d(8))
        self.conv2, self.bn2 = nn.Conv2d(8, 8, 3, padding=1, groups=2, bias=False), trained_bn(nn.BatchNorm2d(8))
        self.conv3, self.bn3 = nn.Conv2d(8, 16, 3, stride=2, padding=1), trained_bn(nn.BatchNorm2d(16))
        self.fc, self.bn4 = nn.Linear(16 * 4 * 4, 10), trained_bn(nn.BatchNorm1d(10))
        self.drop = nn.Dropout(0.2)

    def forward(self, x):
        x = torch.clamp(self.bn1(self.conv1(x)), 0, 6)
        h = self.bn2(self.conv2(x))
        x = x + h * F.relu6(h + 3.0) / 6.0
        x = x.permute(0, 2, 3, 1).permute(0, 3, 1, 2)
        x = self.bn3(self.conv3(x))
        x = x * torch.sigmoid(x)
        x = x.reshape(2, 16, 16).reshape(2, 256)
        x = self.bn4(self.fc(self.drop(x)))
        e = torch.exp(x - x.amax(1, keepdim=True))
        return e / e.sum(1, keepdim=True)


def transformer_case() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    return Block().eval(), (randn(2, 6, 32), causal_mask(6))


def convnet_case() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    return SmallConvNet().eval(), (randn(2, 3, 8, 8),)


MODELS = {"transformer": transformer_case, "convnet": convnet_case}

#: Rules each model must trigger (with example inputs).
EXPECTED = {
    "transformer": {"layer_norm_from_var_affine", "linear_add_bias",
                    "attention_masked_inverse_sqrt_dim", "layer_norm_from_centered_affine",
                    "linear_layer_add_bias", "gelu_tanh", "dropout_inactive", "rms_norm_from_rsqrt_affine",
                    "log_softmax_from_logsumexp"},
    "convnet": {"conv_bn_fold", "relu6_from_clamp", "hardswish_from_relu6", "permute_permute_4d",
                "silu_from_sigmoid", "reshape3_reshape2", "linear_bn_fold", "dropout_layer_inactive",
                "softmax_from_exp_amax"},
}


@pytest.mark.parametrize("model_name", sorted(MODELS))
@pytest.mark.parametrize("with_shapes", [True, False], ids=["with-shapes", "without-shapes"])
def test_whole_library_keeps_model_outputs(model_name, with_shapes):
    model, inputs = MODELS[model_name]()
    expected = run(model, inputs)
    result = rewrite(model, LIBRARY, example_inputs=inputs if with_shapes else None)
    result.module.graph.lint()
    torch.testing.assert_close(run(result.module, inputs), expected, **tolerance(LIBRARY))
    fired = {name for name, count in result.report.applied.items() if count}
    if with_shapes:
        assert EXPECTED[model_name] <= fired, f"did not fire: {sorted(EXPECTED[model_name] - fired)}"
    else:
        needs_shapes = {n for n, case in CASES.items() if case.shapes}
        assert EXPECTED[model_name] - needs_shapes <= fired
        assert not fired & needs_shapes


def test_whole_library_fuses_the_transformer_block():
    model, inputs = transformer_case()
    result = rewrite(model, LIBRARY, example_inputs=inputs)
    assert_rewrite_sound(model, result, *inputs, **tolerance(LIBRARY))
    code = result.code
    for fused in ("scaled_dot_product_attention", "layer_norm", "rms_norm", "gelu", "log_softmax"):
        assert fused in code, fused
    for gone in ("torch.softmax(", "functional.softmax(", "torch.tanh", "rsqrt", ".var(", "dropout"):
        assert gone not in code, gone


def test_whole_library_folds_every_batch_norm_of_the_convnet():
    model, inputs = convnet_case()
    result = rewrite(model, LIBRARY, example_inputs=inputs)
    assert_rewrite_sound(model, result, *inputs, **tolerance(LIBRARY))
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in result.module.modules())
    assert "permute" not in result.code and "hardswish" in result.code and "silu" in result.code


@pytest.mark.parametrize("model_name", sorted(MODELS))
def test_whole_library_converges_to_a_fixed_point(model_name):
    model, inputs = MODELS[model_name]()
    first = rewrite(model, LIBRARY, example_inputs=inputs)  # raises DidNotConverge if rules loop
    again = rewrite(first.module, LIBRARY, example_inputs=inputs)
    assert again.report.rewrites == 0, {n: c for n, c in again.report.applied.items() if c}
    assert_rewrite_sound(model, again, *inputs, **tolerance(LIBRARY))


@pytest.mark.slow
def test_whole_library_converges_on_every_rule_case():
    for name, case in CASES.items():
        program, inputs = case.model(), case.inputs()
        try:
            result = rewrite(program, LIBRARY, example_inputs=inputs if case.shapes else None)
        except fxrewrite.DidNotConverge as exc:  # pragma: no cover - the failure message
            pytest.fail(f"the library loops on the case of {name}: {exc}")
        result.module.graph.lint()
        torch.testing.assert_close(run(result.module, inputs), run(program, inputs), **tolerance(LIBRARY))


# ---- property checks (the checker's job; here for one command that checks everything) ------------


@pytest.mark.slow
@pytest.mark.parametrize("name", LIBRARY.names)
def test_rule_passes_the_property_checker(name):
    from fxrewrite.testing import check_rule

    result = check_rule(LIBRARY[name], max_examples=100)
    assert result.ok, result.message


def test_docs_mention_only_rules_that_exist():
    mentioned = set(re.findall(r"^rule (\w+)", "".join(p.read_text() for p in RULES_DIR.glob("*.fxr")), re.MULTILINE))
    assert mentioned <= set(LIBRARY.names)
