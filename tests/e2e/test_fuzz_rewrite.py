"""Fuzzing ``rewrite`` (issue 7): random graphs, random rule sets from the standard library.

Hypothesis builds a random DAG of torch ops directly with ``torch.fx.Graph`` (unary and binary
ops in several spellings, matmul, transposes, permutes, reshapes, softmax, reductions, module
calls), and plants, with some probability at each step, the patterns the standard library looks
for, so its rules actually fire. Every value is computed on concrete ``float64`` inputs while the
graph is built, so each op and each planted pattern is added only where it is valid and inside
the declared domain of the rules it targets (finite, bounded values where a rule asks for it).

Then ``rewrite`` runs with a random subset of the standard library, copying, in place, or with
``example_inputs`` (so the guards that need shapes fire too). The property: ``rewrite`` either

* succeeds with a module whose graph lints and which computes what the original computes on the
  same inputs (``torch.testing.assert_close`` with ``equal_nan=True``, within the largest
  tolerance declared by the rules that fired), leaving the caller's GraphModule as it was; or
* raises an :class:`~fxrewrite.FxRewriteError`, leaving the caller's GraphModule as it was (or,
  in place, a graph that lints and still computes the same);

never another exception, never a broken graph.

``test_fuzz_rewrite_is_sound_or_fails_cleanly`` is the CI budget (deterministic, a few dozen
examples); ``test_fuzz_rewrite_long`` (``-m slow``) runs thousands and prints its figures (in CI,
500 derandomized ones).
"""

from __future__ import annotations

import collections
import os
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
import torch.fx as fx
import torch.nn.functional as F
from _helpers import assert_rewrite_sound, standard_rules
from hypothesis import HealthCheck, find, given, note, settings
from hypothesis import strategies as st

import fxrewrite
from fxrewrite import FxRewriteError

CI_EXAMPLES = 40
#: The long run's examples: thousands, freshly random, in a developer's ``-m slow`` run; in CI
#: (``CI=true``) a bounded and derandomized search, so that CI stays deterministic and well within
#: its time (the 2,000 took about half of CI's slow run).
IN_CI = bool(os.environ.get("CI"))
LONG_EXAMPLES = 500 if IN_CI else 2000
BASE_SHAPES = ((3, 3), (2, 3, 3), (2, 2, 3, 3))
MAX_STEPS = 14
PLANT_PROBABILITY = 0.45

#: Rules of the standard library the fuzzer found unsound, left out of the random rule sets so
#: the fuzzer can find other problems meanwhile (rule name -> what it breaks); add a regression
#: test next to the rule's fix and remove the entry. Empty: every rule found so far was fixed.
KNOWN_UNSOUND: dict[str, str] = {}  # neg_sub was found unsound here (-0.0 vs 0.0) and removed

# ---- building graphs: every op runs on concrete tensors and records on Proxies ---------------------


class Tensors:
    """Backend that computes: module calls and parameters are the root module's."""

    def __init__(self, root: torch.nn.Module) -> None:
        self.root = root

    def module(self, name: str, x: Any) -> Any:
        return getattr(self.root, name)(x)

    def param(self, name: str) -> Any:
        return getattr(self.root, name)


class Proxies:
    """Backend that records: module calls and parameters become call_module / get_attr nodes."""

    def __init__(self, graph: fx.Graph) -> None:
        self.graph = graph
        self.tracer = fx.proxy.GraphAppendingTracer(graph)

    def wrap(self, node: fx.Node) -> fx.Proxy:
        return fx.Proxy(node, self.tracer)

    def module(self, name: str, x: fx.Proxy) -> fx.Proxy:
        return self.wrap(self.graph.call_module(name, (x.node,)))

    def param(self, name: str) -> fx.Proxy:
        return self.wrap(self.graph.get_attr(name))


@dataclass
class Value:
    proxy: fx.Proxy
    tensor: torch.Tensor
    users: int = 0


#: An op, once its parameters are drawn: called with a backend and the operands.
Op = Callable[..., Any]
#: Draws an op's parameters for the given operand tensors; None when the op does not apply.
OpFactory = Callable[[Any, Sequence[torch.Tensor]], Op | None]


def finite(*ts: torch.Tensor) -> bool:
    return all(bool(torch.isfinite(t).all()) for t in ts)


def bounded(limit: float, *ts: torch.Tensor) -> bool:
    return finite(*ts) and all(t.numel() == 0 or float(t.abs().max()) <= limit for t in ts)


def same_shape(*ts: torch.Tensor) -> bool:
    return len({tuple(t.shape) for t in ts}) == 1 and len({t.dtype for t in ts}) == 1


def features(t: torch.Tensor) -> bool:
    """``t`` can go through the root's 3-feature linear layers and parameters."""
    return t.dim() >= 1 and t.shape[-1] == 3 and t.dtype == torch.float64


def dim_of(draw: Any, t: torch.Tensor) -> int:
    return draw(st.integers(-t.dim(), t.dim() - 1)) if t.dim() else 0


def always(op: Op) -> OpFactory:
    return lambda draw, ts: op


def when(condition: Callable[..., bool], op: Op) -> OpFactory:
    return lambda draw, ts: op if condition(*ts) else None


# -- the generic random ops (spellings vary: operator, torch function, tensor method) --

def _flat_and_back(shape: tuple[int, ...]) -> Op:
    return lambda B, x: x.reshape(*shape[:-2], -1).reshape(*shape)


UNARY: dict[str, OpFactory] = {
    "relu": always(lambda B, x: torch.relu(x)),
    "neg": always(lambda B, x: -x),
    "neg_fn": always(lambda B, x: torch.neg(x)),
    "sigmoid": always(lambda B, x: torch.sigmoid(x)),
    "tanh": always(lambda B, x: x.tanh()),
    "exp": when(lambda x: bounded(5.0, x), lambda B, x: torch.exp(x)),
    "abs": always(lambda B, x: torch.abs(x)),
    "transpose": when(lambda x: x.dim() >= 2, lambda B, x: x.transpose(-2, -1)),
    "transpose_swapped": when(lambda x: x.dim() >= 2, lambda B, x: x.transpose(-1, -2)),
    "contiguous": always(lambda B, x: x.contiguous()),
    "flat_and_back": lambda draw, ts: _flat_and_back(tuple(ts[0].shape)) if ts[0].dim() >= 2 else None,
}


def _permute(draw: Any, ts: Sequence[torch.Tensor]) -> Op | None:
    if ts[0].dim() < 2:
        return None
    dims = draw(st.permutations(range(ts[0].dim())))
    return lambda B, x: x.permute(*dims)


def _softmax(draw: Any, ts: Sequence[torch.Tensor]) -> Op | None:
    d, method = dim_of(draw, ts[0]), draw(st.booleans())
    return lambda B, x: x.softmax(d) if method else torch.softmax(x, dim=d)


def _reduce(name: str) -> OpFactory:
    def make(draw: Any, ts: Sequence[torch.Tensor]) -> Op | None:
        d, keepdim = dim_of(draw, ts[0]), draw(st.booleans())
        return lambda B, x: getattr(x, name)(d, keepdim=keepdim)

    return make


UNARY_DRAWN: dict[str, OpFactory] = {"permute": _permute, "softmax": _softmax, "sum": _reduce("sum"),
                                     "mean": _reduce("mean")}

BINARY: dict[str, OpFactory] = {
    "add": always(lambda B, x, y: x + y),
    "add_fn": always(lambda B, x, y: torch.add(x, y)),
    "add_method": always(lambda B, x, y: x.add(y)),
    "mul": always(lambda B, x, y: x * y),
    "mul_fn": always(lambda B, x, y: torch.mul(x, y)),
    "sub": always(lambda B, x, y: x - y),
    "sub_method": always(lambda B, x, y: x.sub(y)),
    "matmul": always(lambda B, x, y: x @ y),
    "matmul_fn": always(lambda B, x, y: torch.matmul(x, y)),
}


# -- planted patterns of the standard library (with the domain its rules declare) --

GELU_C, GELU_K, SQRT2, SQRT1_2 = 0.7978845608028654, 0.044715, 1.4142135623730951, 0.7071067811865475


def _reduce_squeeze(name: str) -> OpFactory:
    def make(draw: Any, ts: Sequence[torch.Tensor]) -> Op | None:
        if ts[0].dim() == 0:
            return None
        d = dim_of(draw, ts[0])
        return lambda B, x: getattr(x, name)(d, keepdim=True).squeeze(d)

    return make


def _transpose_twice(draw: Any, ts: Sequence[torch.Tensor]) -> Op | None:
    if ts[0].dim() < 2:
        return None
    a, b = draw(st.lists(st.integers(-ts[0].dim(), ts[0].dim() - 1), min_size=2, max_size=2))
    swapped = draw(st.booleans())
    return lambda B, x: x.transpose(a, b).transpose(b, a) if swapped else x.transpose(a, b).transpose(a, b)


def _permute_twice(draw: Any, ts: Sequence[torch.Tensor]) -> Op | None:
    n = ts[0].dim()
    if n not in (3, 4):
        return None
    first, second = draw(st.permutations(range(n))), draw(st.permutations(range(n)))
    return lambda B, x: x.permute(*first).permute(*second)


def _unsqueeze_squeeze(draw: Any, ts: Sequence[torch.Tensor]) -> Op | None:
    d = draw(st.integers(-ts[0].dim() - 1, ts[0].dim()))
    return lambda B, x: x.unsqueeze(d).squeeze(d)


def _dim_pattern(fn: Callable[[Any, int], Any], condition: Callable[[torch.Tensor], bool] = lambda t: True
                 ) -> OpFactory:
    def make(draw: Any, ts: Sequence[torch.Tensor]) -> Op | None:
        if ts[0].dim() == 0 or not condition(ts[0]):
            return None
        d = dim_of(draw, ts[0])
        return lambda B, x: fn(x, d)

    return make


def _softmax_from_exp_amax(x: Any, d: int) -> Any:
    e = torch.exp(x - x.amax(d, keepdim=True))
    return e / e.sum(d, keepdim=True)


def _softmax_from_exp_max(x: Any, d: int) -> Any:
    e = torch.exp(x - x.max(d, keepdim=True)[0])
    return e / e.sum(d, keepdim=True)


def _softmax_from_exp_max_values(x: Any, d: int) -> Any:
    e = torch.exp(x - x.max(d, keepdim=True).values)
    return e / e.sum(d, keepdim=True)


def _softmax_from_exp(x: Any, d: int) -> Any:
    e = torch.exp(x)
    return e / e.sum(d, keepdim=True)


def _reshape_chain(method: str) -> OpFactory:
    def make(draw: Any, ts: Sequence[torch.Tensor]) -> Op | None:
        t = ts[0]
        if not 1 <= t.dim() <= 4 or (method == "view" and not t.is_contiguous()):
            return None
        middle = draw(st.sampled_from([(t.numel(),), (1, t.numel()), (t.numel(), 1, 1)]))
        final = tuple(t.shape)
        return lambda B, x: getattr(getattr(x, method)(*middle), method)(*final)

    return make


def _eps(draw: Any) -> float:
    return draw(st.sampled_from([1e-5, 1e-6, 0.1]))


def _norm(kind: str) -> OpFactory:
    def make(draw: Any, ts: Sequence[torch.Tensor]) -> Op | None:
        t = ts[0]
        if not (1 <= t.dim() <= 4 and t.shape[-1] == 3 and t.dtype == torch.float64 and bounded(100.0, t)):
            return None
        eps, affine = _eps(draw), draw(st.booleans())

        def op(B, x):
            if kind == "layer_var":
                y = (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, keepdim=True, unbiased=False) + eps)
            elif kind == "layer_centered":
                centered = x - x.mean(-1, keepdim=True)
                y = centered / torch.sqrt(centered.pow(2).mean(-1, keepdim=True) + eps)
            elif kind == "rms_rsqrt":
                y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
            else:
                y = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)
            if not affine:
                return y
            return B.param("w") * y + B.param("b") if kind != "rms_rsqrt" else B.param("w") * y

        return op

    return make


def _attention(kind: str) -> OpFactory:
    def make(draw: Any, ts: Sequence[torch.Tensor]) -> Op | None:
        q = ts[0]
        if not (q.dim() >= 2 and same_shape(*ts) and bounded(4.0, *ts)):
            return None
        s = draw(st.sampled_from([0.125, 0.5, 2.0]))

        def op(B, q, k, v, mask=None):
            if kind == "scaled":
                scores = q @ k.transpose(-2, -1) * s
            elif kind == "divided":
                scores = q @ k.transpose(-2, -1) / s
            elif kind == "prescaled":
                scores = (q * s) @ k.transpose(-2, -1)
            elif kind == "masked":
                scores = q @ k.transpose(-2, -1) * s + mask
            else:
                scores = q @ k.transpose(-2, -1)
            return torch.softmax(scores, -1) @ v

        return op

    return make


def _linear_bias(kind: str) -> OpFactory:
    def make(draw: Any, ts: Sequence[torch.Tensor]) -> Op | None:
        if not features(ts[0]):
            return None
        if kind == "layer":
            return lambda B, x: B.module("lin_nobias", x) + B.param("b")
        if kind == "functional":
            return lambda B, x: F.linear(x, B.param("w2")) + B.param("b")
        return lambda B, x: x @ B.param("w2").t() + B.param("b")

    return make


PLANTS: dict[str, tuple[int, OpFactory]] = {
    # algebra
    "double_neg": (1, always(lambda B, x: torch.neg(torch.neg(x)))),
    "abs_abs": (1, always(lambda B, x: torch.abs(torch.abs(x)))),
    "square_neg": (1, always(lambda B, x: torch.square(-x))),
    "square_abs": (1, always(lambda B, x: torch.square(torch.abs(x)))),
    "sum_keepdim_squeeze": (1, _reduce_squeeze("sum")),
    "mean_keepdim_squeeze": (1, _reduce_squeeze("mean")),
    "amax_keepdim_squeeze": (1, _reduce_squeeze("amax")),
    "add_neg": (2, always(lambda B, x, y: x + torch.neg(y))),
    "sub_neg": (2, always(lambda B, x, y: x - torch.neg(y))),
    "mul_neg_neg": (2, always(lambda B, x, y: torch.neg(x) * torch.neg(y))),
    "div_neg_neg": (2, always(lambda B, x, y: torch.neg(x) / torch.neg(y))),
    "abs_neg": (1, always(lambda B, x: torch.abs(torch.neg(x)))),
    "rounding_twice": (1, lambda draw, ts: (lambda fn: lambda B, x: fn(fn(x)))(
        draw(st.sampled_from([torch.ceil, torch.floor, torch.round, torch.trunc, torch.sign])))),
    "amin_keepdim_squeeze": (1, _reduce_squeeze("amin")),
    "logsumexp_keepdim_squeeze": (1, _dim_pattern(lambda x, d: torch.logsumexp(x, d, keepdim=True).squeeze(d))),
    "log1p": (1, always(lambda B, x: torch.log(x + 1))),
    "expm1": (1, when(lambda x: bounded(20.0, x), lambda B, x: torch.exp(x) - 1)),
    "rsqrt": (1, always(lambda B, x: 1 / torch.sqrt(x))),
    "mean_from_sum": (1, always(lambda B, x: x.sum() / x.numel())),
    # activations
    "relu_relu": (1, always(lambda B, x: torch.relu(torch.relu(x)))),
    "abs_relu": (1, always(lambda B, x: torch.abs(torch.relu(x)))),
    "hardtanh_relu6": (1, always(lambda B, x: F.hardtanh(x, 0.0, 6.0))),
    "relu6_relu": (1, always(lambda B, x: F.relu6(torch.relu(x)))),
    "relu_relu6": (1, always(lambda B, x: torch.relu(F.relu6(x)))),
    "relu6_relu6": (1, always(lambda B, x: F.relu6(F.relu6(x)))),
    "sigmoid_relu": (1, always(lambda B, x: torch.relu(torch.sigmoid(x)))),
    "silu": (1, always(lambda B, x: x * torch.sigmoid(x))),
    "sigmoid_from_exp": (1, always(lambda B, x: 1 / (1 + torch.exp(-x)))),
    "gelu_tanh": (1, when(lambda x: bounded(1000.0, x), lambda B, x: 0.5 * x * (1 + torch.tanh(
        GELU_C * (x + GELU_K * torch.pow(x, 3)))))),
    "gelu_erf": (1, when(finite, lambda B, x: x * 0.5 * (1 + torch.erf(x / SQRT2)))),
    "gelu_erf_scaled": (1, when(finite, lambda B, x: x * 0.5 * (1.0 + torch.erf(x * SQRT1_2)))),
    "hardswish": (1, always(lambda B, x: x * F.relu6(x + 3) / 6)),
    "hardsigmoid": (1, always(lambda B, x: F.relu6(x + 3.0) / 6.0)),
    "hardswish_from_hardsigmoid": (1, when(lambda x: bounded(1e30, x), lambda B, x: x * F.hardsigmoid(x))),
    "mish": (1, always(lambda B, x: x * torch.tanh(F.softplus(x)))),
    "relu6_from_clamp": (1, always(lambda B, x: torch.clamp(x, 0, 6))),
    "relu_from_clamp": (1, always(lambda B, x: torch.clamp(x, min=0))),
    "leaky_relu": (1, always(lambda B, x: torch.where(x > 0, x, x * 0.01))),
    # attention (priority 10)
    "attention_scaled": (3, _attention("scaled")),
    "attention_divided": (3, _attention("divided")),
    "attention_prescaled": (3, _attention("prescaled")),
    "attention_unscaled": (3, _attention("unscaled")),
    "attention_masked": (4, _attention("masked")),
    # fusion
    "dropout_inactive": (1, lambda draw, ts: (lambda p: lambda B, x: F.dropout(x, p, False))(
        draw(st.sampled_from([0.0, 0.1, 0.5])))),
    "dropout_p0_training": (1, always(lambda B, x: F.dropout(x, 0.0, True))),
    "dropout_layer": (1, always(lambda B, x: B.module("drop", x))),
    "linear_bn": (1, when(lambda x: x.dim() == 2 and x.shape[-1] == 3 and x.dtype == torch.float64,
                          lambda B, x: B.module("bn1", B.module("lin", x)))),
    "conv_bn": (1, when(lambda x: x.dim() == 4 and x.shape[1] == 2 and x.dtype == torch.float64,
                        lambda B, x: B.module("bn2", B.module("conv", x)))),
    "linear_layer_add_bias": (1, _linear_bias("layer")),
    "linear_add_bias": (1, _linear_bias("functional")),
    "matmul_add_bias": (1, _linear_bias("matmul")),
    # layout
    "transpose_twice": (1, _transpose_twice),
    "t_t": (1, when(lambda x: x.dim() <= 2, lambda B, x: x.t().t())),
    "unsqueeze_squeeze": (1, _unsqueeze_squeeze),
    "flip_flip": (1, _dim_pattern(lambda x, d: torch.flip(torch.flip(x, [d]), [d]))),
    "flatten_flatten": (1, always(lambda B, x: torch.flatten(torch.flatten(x)))),
    "cat_single": (1, _dim_pattern(lambda x, d: torch.cat([x], d))),
    "stack_single": (1, _dim_pattern(lambda x, d: torch.stack([x], d))),
    "reshape_as_twice": (2, when(lambda x, y: x.numel() == y.numel(),
                                 lambda B, x, y: x.reshape_as(y).reshape_as(x * 1))),
    "contiguous_contiguous": (1, always(lambda B, x: x.contiguous().contiguous())),
    "clone_clone": (1, always(lambda B, x: x.clone().clone())),
    "detach_detach": (1, always(lambda B, x: x.detach().detach())),
    "to_to": (1, always(lambda B, x: x.to(torch.float64).to(torch.float64))),
    "float_float": (1, always(lambda B, x: x.float().float())),
    "contiguous_matmul": (2, always(lambda B, x, y: x.contiguous() @ y)),
    "matmul_contiguous": (2, always(lambda B, x, y: x @ y.contiguous())),
    "contiguous_linear": (1, when(features,
                                  lambda B, x: F.linear(x.contiguous(), B.param("w2"), B.param("b")))),
    "permute_twice": (1, _permute_twice),
    # x.mT is a transpose of the last two dims to the matcher: twice, transpose_transpose removes it
    "mT_mT": (1, when(lambda x: x.dim() >= 2, lambda B, x: x.mT.mT)),
    # normalization
    "layer_norm_var": (1, _norm("layer_var")),
    "layer_norm_centered": (1, _norm("layer_centered")),
    "rms_norm_rsqrt": (1, _norm("rms_rsqrt")),
    "rms_norm_sqrt": (1, _norm("rms_sqrt")),
    "softmax_from_exp_amax": (1, _dim_pattern(lambda x, d: _softmax_from_exp_amax(x, d),
                                              lambda t: bounded(1e4, t))),
    "softmax_from_exp_max": (1, _dim_pattern(lambda x, d: _softmax_from_exp_max(x, d), lambda t: bounded(1e4, t))),
    "softmax_from_exp_max_values": (1, _dim_pattern(lambda x, d: _softmax_from_exp_max_values(x, d),
                                                    lambda t: bounded(1e4, t))),
    "softmax_from_exp": (1, _dim_pattern(lambda x, d: _softmax_from_exp(x, d), lambda t: bounded(60.0, t))),
    "log_softmax_logsumexp": (1, _dim_pattern(lambda x, d: x - torch.logsumexp(x, d, keepdim=True),
                                              lambda t: bounded(100.0, t))),
    "log_softmax_log": (1, _dim_pattern(lambda x, d: torch.log(torch.softmax(x, d)), lambda t: bounded(20.0, t))),
    # reshape chains
    "reshape_reshape": (1, _reshape_chain("reshape")),
    "view_view": (1, _reshape_chain("view")),
}


GENERIC: dict[str, OpFactory] = {**UNARY, **UNARY_DRAWN, **BINARY}


def fuzz_root() -> torch.nn.Module:
    """The module owning the fuzzed graphs: layers and parameters that planted patterns call."""
    generator = torch.Generator().manual_seed(0)
    root = torch.nn.Module()
    root.lin = torch.nn.Linear(3, 3).double()
    root.lin_nobias = torch.nn.Linear(3, 3, bias=False).double()
    root.bn1 = torch.nn.BatchNorm1d(3).double()
    root.conv = torch.nn.Conv2d(2, 2, 1).double()
    root.bn2 = torch.nn.BatchNorm2d(2).double()
    root.drop = torch.nn.Dropout(0.5)
    for bn in (root.bn1, root.bn2):
        with torch.no_grad():
            bn.running_mean.uniform_(-1, 1, generator=generator)
            bn.running_var.uniform_(0.5, 2, generator=generator)
            bn.weight.uniform_(0.5, 1.5, generator=generator)
            bn.bias.uniform_(-0.5, 0.5, generator=generator)
    root.w = torch.nn.Parameter(torch.rand(3, generator=generator, dtype=torch.float64) + 0.5)
    root.b = torch.nn.Parameter(torch.randn(3, generator=generator, dtype=torch.float64))
    root.w2 = torch.nn.Parameter(torch.randn(3, 3, generator=generator, dtype=torch.float64))
    return root.eval()


class GraphBuilder:
    def __init__(self, root: torch.nn.Module) -> None:
        self.graph = fx.Graph()
        self.proxies = Proxies(self.graph)
        self.tensors = Tensors(root)
        self.pool: list[Value] = []
        self.steps: list[str] = []

    def placeholder(self, name: str, tensor: torch.Tensor) -> None:
        self.pool.append(Value(self.proxies.wrap(self.graph.placeholder(name)), tensor))

    def apply(self, name: str, op: Op, operands: Sequence[Value]) -> bool:
        """Add ``op(operands)`` if it computes a tensor on the concrete values."""
        try:
            with warnings.catch_warnings(), torch.no_grad():
                warnings.simplefilter("ignore")
                tensor = op(self.tensors, *(v.tensor for v in operands))
        except (RuntimeError, IndexError, ValueError, TypeError):
            return False
        if not isinstance(tensor, torch.Tensor):
            return False
        proxy = op(self.proxies, *(v.proxy for v in operands))
        for v in operands:
            v.users += 1
        self.pool.append(Value(proxy, tensor))
        self.steps.append(name)
        return True

    def finish(self, root: torch.nn.Module, extra_outputs: Sequence[int]) -> fx.GraphModule:
        outputs = [v for v in self.pool if v.users == 0]
        outputs += [self.pool[i % len(self.pool)] for i in extra_outputs]
        self.graph.output(tuple(v.proxy.node for v in outputs))
        gm = fx.GraphModule(root, self.graph)
        gm.graph.lint()
        return gm


def random_graph(draw: Any) -> tuple[fx.GraphModule, tuple[torch.Tensor, ...], list[str]]:
    """A random graph module and the concrete inputs it was built on."""
    root = fuzz_root()
    shape = draw(st.sampled_from(BASE_SHAPES), label="shape")
    n_inputs = draw(st.integers(1, 3), label="inputs")
    generator = torch.Generator().manual_seed(draw(st.integers(0, 2**16), label="seed"))
    scale = draw(st.sampled_from([1.0, 1.0, 3.0]), label="scale")
    inputs = tuple(torch.randn(shape, generator=generator, dtype=torch.float64) * scale for _ in range(n_inputs))
    builder = GraphBuilder(root)
    for i, t in enumerate(inputs):
        builder.placeholder(f"x{i}", t)
    # Hypothesis favours the first choice of a list; rotating the lists per example spreads that
    # favour over all ops and patterns (the rotation itself shrinks to 0).
    rotation = draw(st.integers(0, len(PLANTS) * len(GENERIC)), label="rotation")
    for _ in range(draw(st.integers(1, MAX_STEPS), label="steps")):
        _random_step(draw, builder, rotation)
    gm = builder.finish(root, draw(st.lists(st.integers(0, 100), max_size=2), label="extra outputs"))
    return gm, inputs, builder.steps


def _rotated(names: Sequence[str], rotation: int) -> list[str]:
    k = rotation % len(names)
    return [*names[k:], *names[:k]]


def _random_step(draw: Any, builder: GraphBuilder, rotation: int = 0) -> None:
    plant = draw(st.floats(0, 1)) < PLANT_PROBABILITY
    if plant:
        name = draw(st.sampled_from(_rotated(sorted(PLANTS), rotation)))
        arity, factory = PLANTS[name]
    else:
        name = draw(st.sampled_from(_rotated(sorted(GENERIC), rotation)))
        factory = GENERIC[name]
        arity = 2 if name in BINARY else 1
    indices = draw(st.lists(st.integers(0, len(builder.pool) - 1), min_size=arity, max_size=arity))
    operands = [builder.pool[i] for i in indices]
    op = factory(draw, [v.tensor for v in operands])
    if op is not None:
        builder.apply(name, op, operands)


# ---- the property ------------------------------------------------------------------------------------------


@dataclass
class Figures:
    examples: int = 0
    rewrites: int = 0
    nodes: int = 0
    errors: collections.Counter = field(default_factory=collections.Counter)
    fired: collections.Counter = field(default_factory=collections.Counter)
    failures: list[str] = field(default_factory=list)
    started: float = field(default_factory=time.perf_counter)

    def __str__(self) -> str:
        seconds = time.perf_counter() - self.started
        top = ", ".join(f"{name} {count}" for name, count in self.fired.most_common(12))
        return (f"{self.examples} examples ({self.nodes} graph nodes), {self.rewrites} rewrites applied by "
                f"{len(self.fired)} distinct rules, FxRewriteErrors: {dict(self.errors) or 'none'}, "
                f"failures: {len(self.failures)}, {seconds:.1f} s\nmost fired: {top}")


def graph_snapshot(gm: fx.GraphModule) -> tuple[Any, ...]:
    return (gm.code, [n.format_node() for n in gm.graph.nodes],
            {k: v.detach().clone() for k, v in gm.state_dict().items()}, sorted(dict(gm.named_modules())))


def assert_same_snapshot(before: tuple[Any, ...], after: tuple[Any, ...]) -> None:
    assert before[0] == after[0] and before[1] == after[1] and before[3] == after[3]
    assert before[2].keys() == after[2].keys()
    for k in before[2]:
        assert torch.equal(before[2][k], after[2][k]), k


def tolerance(rules: fxrewrite.RuleSet, applied: dict[str, int]) -> tuple[float | None, float | None]:
    """The largest tolerance the rules that fired declare; assert_close's defaults if none."""
    declared = [rules[name].tolerance for name, count in applied.items() if count and rules[name].tolerance]
    if not declared:
        return None, None
    return max(t.get("rtol", 0.0) for t in declared), max(t.get("atol", 0.0) for t in declared)


def run(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> Any:
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return module(*(t.clone() for t in inputs))


def fuzz_once(data: Any, figures: Figures) -> None:
    draw = data.draw
    gm, inputs, steps = random_graph(draw)
    names = tuple(name for name in standard_rules().names if name not in KNOWN_UNSOUND)
    chosen = draw(st.one_of(st.just(names), st.lists(st.sampled_from(names), min_size=1, max_size=30, unique=True)),
                  label="rules")
    rules = fxrewrite.RuleSet(tuple(standard_rules()[n] for n in chosen))
    mode = draw(st.sampled_from(["copy", "inplace", "example_inputs"]), label="mode")
    note(f"steps: {steps}\n{gm.code}")
    expected = run(gm, inputs)
    before = graph_snapshot(gm)
    figures.examples += 1
    figures.nodes += len(gm.graph.nodes)
    kwargs: dict[str, Any] = {"inplace": mode == "inplace"}
    if mode == "example_inputs":
        kwargs["example_inputs"] = tuple(t.clone() for t in inputs)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = fxrewrite.rewrite(gm, rules, **kwargs)
    except FxRewriteError as exc:
        figures.errors[type(exc).__name__] += 1
        note(f"{type(exc).__name__}: {exc}")
        if mode == "inplace":
            gm.graph.lint()
            assert gm.code == gm.graph.python_code("self").src
            torch.testing.assert_close(run(gm, inputs), expected, equal_nan=True, rtol=1e-4, atol=1e-5)
        else:
            assert_same_snapshot(before, graph_snapshot(gm))
        return
    except Exception as exc:  # pragma: no cover - what the fuzzer looks for
        figures.failures.append(f"{type(exc).__name__}: {exc}")
        raise AssertionError(f"rewrite raised {type(exc).__name__}, not an FxRewriteError: {exc}") from exc
    applied = {name: count for name, count in result.report.applied.items() if count}
    figures.rewrites += result.report.rewrites
    figures.fired.update(applied)
    note(f"applied: {applied}\n{result.code}")
    result.module.graph.lint()
    assert result.module.code == result.module.graph.python_code("self").src
    rtol, atol = tolerance(rules, applied)
    try:
        torch.testing.assert_close(run(result.module, inputs), expected, equal_nan=True, rtol=rtol, atol=atol)
    except Exception as exc:
        figures.failures.append(f"{applied}: {exc}")
        raise
    if mode == "inplace":
        assert result.module is gm
    else:
        assert_same_snapshot(before, graph_snapshot(gm))


FUZZ_SETTINGS = dict(deadline=None, database=None, print_blob=True,
                     suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                            HealthCheck.filter_too_much])

CI_FIGURES = Figures()


@pytest.mark.slow
@settings(max_examples=CI_EXAMPLES, derandomize=True, **FUZZ_SETTINGS)
@given(st.data())
def test_fuzz_rewrite_is_sound_or_fails_cleanly(data):
    fuzz_once(data, CI_FIGURES)


@pytest.mark.slow
def test_fuzz_ci_budget_exercises_the_library():
    """The CI budget is not vacuous: rules fire and the graphs are not trivial."""
    figures = Figures()

    @settings(max_examples=12, derandomize=True, **FUZZ_SETTINGS)
    @given(st.data())
    def run_some(data):
        fuzz_once(data, figures)

    run_some()
    assert figures.examples == 12 and figures.rewrites >= 5 and len(figures.fired) >= 3, str(figures)


@pytest.mark.slow
def test_fuzz_rewrite_long(capsys):
    figures = Figures()

    @settings(max_examples=LONG_EXAMPLES, derandomize=IN_CI, **FUZZ_SETTINGS)
    @given(st.data())
    def run_many(data):
        fuzz_once(data, figures)

    try:
        run_many()
    finally:
        with capsys.disabled():
            print(f"\nfuzz (long): {figures}")


# ---- the random graphs themselves ----------------------------------------------------------------------


@settings(max_examples=20, derandomize=True, **FUZZ_SETTINGS)
@given(st.data())
def test_random_graphs_are_valid_and_run(data):
    gm, inputs, _ = random_graph(data.draw)
    gm.graph.lint()
    assert all(n.users or n.op == "output" for n in gm.graph.nodes if n.op != "placeholder")
    out = run(gm, inputs)
    assert isinstance(out, tuple) and all(isinstance(t, torch.Tensor) for t in out)


@pytest.mark.slow
def test_every_planted_pattern_is_matched_by_its_rule():
    """Each plant, alone on a suitable input, is rewritten by the standard library (so the fuzzer
    really exercises the rules it means to)."""
    for name, (arity, factory) in PLANTS.items():
        fired = False
        for shape in BASE_SHAPES:
            generator = torch.Generator().manual_seed(0)
            root = fuzz_root()
            builder = GraphBuilder(root)
            for i in range(arity):
                builder.placeholder(f"x{i}", torch.rand(shape, generator=generator, dtype=torch.float64) + 0.5)
            op = factory(simplest, [v.tensor for v in builder.pool])
            if op is None or not builder.apply(name, op, list(builder.pool)):
                continue
            gm = builder.finish(root, ())
            inputs = tuple(v.tensor for v in builder.pool[:arity])
            with warnings.catch_warnings():  # shapes and dtypes known: strict and floating-only guards can decide
                warnings.simplefilter("ignore")
                result = fxrewrite.rewrite(gm, standard_rules(), example_inputs=inputs)
            rtol, atol = tolerance(standard_rules(), result.report.applied)
            assert_rewrite_sound(gm, result, *inputs, rtol=rtol, atol=atol, equal_nan=True)
            fired = fired or result.report.rewrites > 0
        assert fired, f"no rule of the standard library rewrote the planted pattern {name!r}"


def simplest(strategy: Any, label: Any = None) -> Any:
    """A stand-in for ``data.draw``: the simplest value of ``strategy`` (what Hypothesis shrinks to)."""
    return find(strategy, lambda _: True, settings=settings(database=None))
