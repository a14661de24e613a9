"""Helpers shared by the test modules (imported as ``from _helpers import ...``).

The leading underscore keeps fxrewrite's pytest plugin from ever collecting this file as a rule
module (it imports fxrewrite at module level), as the loader skips ``_``-prefixed files.

* :func:`assert_rewrite_sound`: the check every test that rewrites and runs the result makes
  (the graph lints, every output matches the original's), and :func:`assert_same_outputs`, the
  strict comparison of two outputs it makes (structure, values, dtype, shape);
* a model with state (:class:`StatefulNet`) and snapshots of everything a rewrite must leave
  alone (:func:`module_state`, :func:`graph_state`, :func:`assert_same_state`);
* small rule builders (:func:`neg_neg`, and rules that break the graph behind the splice's back)
  and the standard library, loaded once (:func:`standard_rules`);
* a small Hugging Face GPT-2 with eager attention and the rule that turns its attention into
  ``scaled_dot_product_attention`` (:func:`tiny_eager_gpt2`, :func:`hf_attention_rule`);
* :func:`counting_calls`, the measure of work of the linear-cost tests;
* :func:`draws` and :func:`replayed`, deterministic draws of a Hypothesis strategy for the
  checker's mirror tests.
"""

from __future__ import annotations

import cProfile
import functools
import pstats
import textwrap
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.fx as fx
import torch.nn.functional as F
import torch.utils._pytree as pytree
from hypothesis import HealthCheck, given, settings

import fxrewrite
from fxrewrite import Rule

# ---- the lint + numbers check ------------------------------------------------------------------------


def _cloned(values: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(v.clone() if isinstance(v, torch.Tensor) else v for v in values)


def assert_same_outputs(actual: Any, expected: Any, **tolerance: Any) -> None:
    """``actual`` is ``expected``, output by output: the same structure (a tensor is not a
    one-tuple, a tuple is not a list, a dict has the same keys, nested alike), and every leaf
    equal by ``torch.testing.assert_close`` (values, dtype, shape and device; ``tolerance`` is
    passed on). The message names the leaf that differs.

    >>> assert_same_outputs((torch.ones(2), {"n": 3}), (torch.ones(2), {"n": 3}))
    >>> assert_same_outputs((torch.ones(2), torch.zeros(1)), (torch.ones(2), torch.ones(1)))
    Traceback (most recent call last):
    AssertionError: output [1]: Tensor-likes are not close!...
    """
    actual_leaves, actual_spec = pytree.tree_flatten(actual)
    expected_leaves, expected_spec = pytree.tree_flatten(expected)
    if actual_spec != expected_spec:
        raise AssertionError(f"the outputs differ in structure: got {actual_spec}, expected {expected_spec}")
    paths = [pytree.keystr(path) for path, _ in pytree.tree_flatten_with_path(expected)[0]]
    for path, a, e in zip(paths, actual_leaves, expected_leaves):
        where = f"output {path}" if path else "the output"
        torch.testing.assert_close(a, e, **tolerance, msg=lambda m, where=where: f"{where}: {m}")


def assert_rewrite_sound(original: Callable[..., Any], result: fxrewrite.RewriteResult, *inputs: Any,
                         **tolerance: Any) -> fxrewrite.RewriteResult:
    """The one equivalence check of the test suite: the rewritten module's graph lints and the
    module computes what ``original`` computes on ``inputs``, every output of it
    (:func:`assert_same_outputs`: structure, values, dtype, shape; ``tolerance`` is passed on to
    ``torch.testing.assert_close``: ``rtol``, ``atol``, ``equal_nan``). Each side gets its own copy
    of the tensor inputs, so an in-place op on one side cannot change what the other side sees.
    When the target was an ExportedProgram, the program's own graph is linted too. Returns
    ``result``.

    ``original`` is the program before the rewrite, or any reference the result must match (a
    deliberately inexact rule's expected function)."""
    result.module.graph.lint()
    if result.exported_program is not None:
        result.exported_program.graph_module.graph.lint()
    with torch.no_grad():
        actual = result.module(*_cloned(inputs))
        expected = original(*_cloned(inputs))
    assert_same_outputs(actual, expected, **tolerance)
    return result


# ---- files -------------------------------------------------------------------------------------------


def write_source(path: Path, text: str) -> Path:
    """Write ``text`` dedented and without its leading newlines (so line 1 is the first line
    written in the test), creating the directories on the way."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return path


# ---- rules -------------------------------------------------------------------------------------------


def neg_neg(replacement: Callable[..., Any], *, name: str = "neg_neg", **kw: Any) -> Rule:
    """The rule ``neg(neg(x)) => replacement(x)``; its origin is this file."""
    return Rule.from_functions(lambda x: torch.neg(torch.neg(x)), replacement, name=name, **kw)


@functools.cache
def standard_rules() -> fxrewrite.RuleSet:
    """The standard rule library, loaded once."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fxrewrite.load_rules()


# A realistic way to break a graph from a rule: a replacement that caches a Proxy across calls
# (memoizing "the scale tensor" it built the first time). Used on a second graph, the cached
# Proxy belongs to the first graph, and the new node's argument is a node of another graph. Only
# lint notices. A contrived way: reorder nodes through ``proxy.node``.


def memoizing_rule() -> Rule:
    cache: dict[str, Any] = {}

    def replacement(x):
        if "scale" not in cache:
            cache["scale"] = torch.ones_like(x) * 2
        return x * cache["scale"] / 2

    return neg_neg(replacement, name="memoizing")


def reordering_rule() -> Rule:
    def replacement(x):
        y = torch.relu(x)
        x.node.prepend(y.node)  # moves the new node before its own input
        return y

    return neg_neg(replacement, name="reordering")


def dangling_attribute_rule() -> Rule:
    """Breaks the graph behind the tracer's back: a get_attr node of an attribute that does not
    exist, made with the Graph API (so the splice's own checks of what it recorded cannot see it);
    only lint notices."""
    def replacement(x):
        with warnings.catch_warnings():  # fx warns of the missing attribute: the point of this rule
            warnings.simplefilter("ignore", UserWarning)
            bad = x.node.graph.get_attr("no_such_attribute")
        return x + fx.Proxy(bad, x.tracer)

    return neg_neg(replacement, name="dangling")


# ---- a model with state, and what a rewrite must leave alone ------------------------------------------


class StatefulNet(torch.nn.Module):
    """Parameters, buffers, nested submodules and two neg(neg(.)) pairs (so a rule can fail at
    its first or at its second application)."""

    def __init__(self) -> None:
        super().__init__()
        with torch.random.fork_rng():  # the same weights every time, without touching the global RNG
            torch.manual_seed(0)
            self.lin = torch.nn.Linear(4, 4)
            self.block = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
            with torch.no_grad():
                self.block[1].running_mean.uniform_(-1, 1)
                self.block[1].running_var.uniform_(0.5, 2)
        self.register_buffer("scale", torch.tensor(2.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = torch.neg(torch.neg(self.lin(x)))
        b = torch.neg(torch.neg(self.block(a) * self.scale))
        return torch.relu(a + b) + torch.sin(b) * torch.cos(b) + torch.sin(a) * torch.cos(a)


#: The input :class:`StatefulNet` is run on.
X = torch.randn(3, 4, generator=torch.Generator().manual_seed(1))


def traced_net() -> tuple[StatefulNet, fx.GraphModule]:
    model = StatefulNet().eval()
    return model, fx.symbolic_trace(model)


def module_state(model: torch.nn.Module) -> dict[str, Any]:
    """Everything a failing rewrite must leave alone in an nn.Module."""
    with torch.no_grad():
        output = model(X.clone())
    return {
        "parameters": {k: (v.detach().clone(), v.requires_grad) for k, v in model.named_parameters()},
        "buffers": {k: v.detach().clone() for k, v in model.named_buffers()},
        "modules": [(name, type(m).__name__, m.training) for name, m in model.named_modules()],
        "attributes": sorted(vars(model)),
        "output": output,
    }


def graph_state(gm: fx.GraphModule) -> dict[str, Any]:
    """``module_state`` plus the code and the node list of a GraphModule."""
    return {
        **module_state(gm),
        "code": gm.code,
        "nodes": [(n.name, n.op, str(n.target), n.format_node()) for n in gm.graph.nodes],
    }


def assert_same_state(before: dict[str, Any], after: dict[str, Any]) -> None:
    assert before.keys() == after.keys()
    for key in before:
        if key in ("parameters", "buffers"):
            assert before[key].keys() == after[key].keys(), key
            for name in before[key]:
                b, a = before[key][name], after[key][name]
                if isinstance(b, tuple):
                    assert b[1] == a[1], name
                    b, a = b[0], a[0]
                assert torch.equal(b, a), f"{key} {name} changed"
        elif key == "output":
            torch.testing.assert_close(after[key], before[key], rtol=0, atol=0)
        else:
            assert before[key] == after[key], key


def assert_consistent(gm: fx.GraphModule, reference: torch.nn.Module) -> None:
    """The module's graph lints, its code is the code of its graph, and it computes what
    ``reference`` computes (on :data:`X`)."""
    gm.graph.lint()
    assert gm.code == gm.graph.python_code("self").src
    with torch.no_grad():
        torch.testing.assert_close(gm(X.clone()), reference(X.clone()), rtol=1e-5, atol=1e-6)


# ---- work counted in function calls --------------------------------------------------------------


def counting_calls(fn: Callable[[], Any]) -> tuple[Any, int]:
    """``fn()``'s result and the number of Python function calls it made: a deterministic measure
    of work for the linear-cost tests (seconds are not)."""
    profiler = cProfile.Profile()
    profiler.enable()
    try:
        result = fn()
    finally:
        profiler.disable()
    return result, sum(stat[1] for stat in pstats.Stats(profiler).stats.values())


# ---- Hugging Face GPT-2 ------------------------------------------------------------------------


def tiny_eager_gpt2() -> torch.nn.Module:
    """A seeded 2-layer ``GPT2LMHeadModel`` (width 64, 128 tokens) with transformers' eager
    attention, in eval mode; the calling test is skipped when transformers is not installed."""
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=128, n_positions=32,
                                     bos_token_id=0, eos_token_id=0)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config).eval()


def _hf_attention(q: Any, k: Any, v: Any, mask: Any, s: float) -> Any:
    """GPT-2's eager attention as transformers writes it (``.type(value.dtype)`` is folded to a
    dtype literal in Dynamo's graph, and matched through the value's metadata)."""
    weights = torch.softmax(torch.matmul(q, k.transpose(-1, -2)) * s + mask, dim=-1)
    return torch.matmul(F.dropout(weights.type(v.dtype), p=0.0, training=False), v)


def _sdpa(q: Any, k: Any, v: Any, mask: Any, s: float) -> Any:
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=s)


def hf_attention_rule() -> Rule:
    """``hf_attention``: GPT-2's eager attention becomes ``scaled_dot_product_attention``."""
    return Rule.from_functions(_hf_attention, _sdpa, name="hf_attention")


def folded_conv(conv: Any, bn: Any, *, with_bias: bool = True) -> Any:
    """The ``nn.Conv2d`` computing ``bn(conv(x))`` in eval mode: conv-bn folding, written once for
    the checker's tests (``with_bias=False`` is the historical bug that drops the conv's bias)."""
    import torch
    from torch import nn

    scale = bn.weight / torch.sqrt(bn.running_var + bn.eps)
    bias = conv.bias if conv.bias is not None and with_bias else torch.zeros_like(bn.running_mean)
    fused = nn.Conv2d(conv.in_channels, conv.out_channels, conv.kernel_size, conv.stride, conv.padding,
                      conv.dilation, conv.groups, bias=True)  # the checker draws groups, stride, dilation
    with torch.no_grad():
        fused.weight.copy_(conv.weight * scale.reshape(-1, 1, 1, 1))
        fused.bias.copy_((bias - bn.running_mean) * scale + bn.bias)
    return fused


# ---- deterministic draws of a strategy -------------------------------------------------------------


def draws(strategy: Any, n: int = 60) -> list[Any]:
    """``n`` deterministic draws of ``strategy`` (derandomized, no database; the valid ones only)."""
    seen: list[Any] = []

    @settings(max_examples=n, database=None, derandomize=True, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def collect(value: Any) -> None:
        seen.append(value)

    collect()
    return seen


def replayed(first: Any, second: Any, seed: int) -> tuple[Any, Any]:
    """A value drawn from the strategy ``first`` at random, and the strategy ``second``'s value
    for the same choices (a fast draw against its slow twin)."""
    from random import Random

    from hypothesis.control import BuildContext
    from hypothesis.internal.conjecture.data import ConjectureData

    data = ConjectureData(random=Random(seed))
    with BuildContext(data, wrapped_test=None):
        value = data.draw(first)
    replay = ConjectureData.for_choices(data.choices)
    with BuildContext(replay, wrapped_test=None):
        return value, replay.draw(second)
