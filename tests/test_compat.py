"""Differential tests for ``fxrewrite.replace_pattern`` / ``replace_pattern_with_filters``.

torch.fx's own ``torch.fx.subgraph_rewriter`` is the oracle. Every scenario traces one module,
deep-copies the ``GraphModule`` twice, rewrites one copy with torch.fx and the other with
fxrewrite, and requires the same matches (anchors, ``nodes_map`` and ``replacements`` compared by
node name), the same regenerated code, the same module tree, a graph that lints, and the same
numbers on random inputs. The scenarios cover what PyTorch's ``test/fx/test_subgraph_rewriter.py``
exercises, in our own words, plus the matching rules that torch.fx applies implicitly
(no commutativity, exact targets, literal kwargs, injective placeholders, literal types).

Two tests are not differential: the ``ignore_literals`` case where torch.fx is unsound (a pattern
literal "matches" a graph node, which the replacement then drops) and the scale tests (torch.fx
is quadratic there, so fxrewrite is checked against the eager program instead).
"""

from __future__ import annotations

import copy
import operator
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
import torch
import torch.fx as fx
import torch.nn.functional as F
from torch.fx import subgraph_rewriter as fx_rewriter
from torch.fx.node import Node
from torch.fx.subgraph_rewriter import Match, ReplacedPatterns

import fxrewrite

# ---------------------------------------------------------------------------------------------
# torch.fx.wrap-ed helpers (``wrap`` must run at module scope)
# ---------------------------------------------------------------------------------------------


@torch.fx.wrap
def linear_and_scale(a, w, bias):
    out = F.linear(a, w, bias=bias)
    return out, out * a


@torch.fx.wrap
def linear_and_scale_by(a, w, bias, c):
    out = F.linear(a, w, bias=bias)
    return out, out * c


@torch.fx.wrap
def opaque_scale(x, k):
    return x * k


# ---------------------------------------------------------------------------------------------
# the differential harness
# ---------------------------------------------------------------------------------------------

Inputs = Callable[[], Sequence[Any]]


@dataclass
class Side:
    """One rewrite: the module after it and what the function returned."""

    gm: fx.GraphModule
    matches: list[Any]


@dataclass
class Outcome:
    original: fx.GraphModule
    fx: Side
    ours: Side


def describe(value: Any) -> Any:
    """A node-identity-free picture of a ``nodes_map`` value: names for nodes, recursively."""
    if isinstance(value, Node):
        return value.name
    if isinstance(value, (list, tuple)):
        return type(value)(describe(v) for v in value)
    return ("literal", repr(value))


def describe_match(m: Any) -> dict[str, Any]:
    picture = {
        "anchor": m.anchor.name,
        "nodes_map": {p.name: describe(g) for p, g in m.nodes_map.items()},
    }
    if isinstance(m, ReplacedPatterns):
        picture["replacements"] = [describe(n) for n in m.replacements]
    return picture


def as_graph_module(target: Any) -> fx.GraphModule:
    return target if isinstance(target, fx.GraphModule) else fx.symbolic_trace(target)


def fresh(obj: Any) -> Any:
    """Each side gets its own copy of module/graph arguments; functions are shared."""
    if isinstance(obj, (torch.nn.Module, fx.Graph)):
        return copy.deepcopy(obj)
    return obj


def rewrite_fx(gm: fx.GraphModule, pattern: Any, replacement: Any, api: str, kwargs: dict) -> list[Any]:
    if api == "replace_pattern":
        return fx_rewriter.replace_pattern(gm, fresh(pattern), fresh(replacement))
    return fx_rewriter.replace_pattern_with_filters(gm, fresh(pattern), fresh(replacement), **kwargs)


def rewrite_ours(gm: fx.GraphModule, pattern: Any, replacement: Any, api: str, kwargs: dict) -> list[Any]:
    if api == "replace_pattern":
        return fxrewrite.replace_pattern(gm, fresh(pattern), fresh(replacement))
    return fxrewrite.replace_pattern_with_filters(gm, fresh(pattern), fresh(replacement), **kwargs)


def run(inputs: Inputs | None, module: torch.nn.Module) -> Any:
    return module(*[x.clone() if isinstance(x, torch.Tensor) else x for x in inputs()])


def module_tree(gm: fx.GraphModule) -> dict[str, Any]:
    return {
        "modules": sorted((name, type(m).__name__) for name, m in gm.named_modules()),
        "parameters": sorted(name for name, _ in gm.named_parameters()),
        "buffers": sorted(name for name, _ in gm.named_buffers()),
    }


def get_attr_values(gm: fx.GraphModule) -> dict[str, Any]:
    values = {}
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            values[node.target] = fx.graph_module._get_attr(gm, node.target)
    return values


def assert_same(outcome: Outcome, inputs: Inputs | None, api: str) -> None:
    ref, ours = outcome.fx, outcome.ours
    returned = Match if api == "replace_pattern" else ReplacedPatterns
    assert all(type(m) is returned for m in ref.matches)
    assert [type(m) for m in ours.matches] == [returned] * len(ours.matches)
    assert len(ours.matches) == len(ref.matches)
    assert [describe_match(m) for m in ours.matches] == [describe_match(m) for m in ref.matches]
    ours.gm.graph.lint()
    ref.gm.graph.lint()
    assert ours.gm.code == ref.gm.code
    assert module_tree(ours.gm) == module_tree(ref.gm)
    ref_attrs, our_attrs = get_attr_values(ref.gm), get_attr_values(ours.gm)
    assert our_attrs.keys() == ref_attrs.keys()
    for name, value in ref_attrs.items():
        if isinstance(value, torch.Tensor):
            torch.testing.assert_close(our_attrs[name], value)
    if inputs is not None:
        torch.testing.assert_close(run(inputs, ours.gm), run(inputs, ref.gm))


def differential(
    target: Any,
    pattern: Any,
    replacement: Any = None,
    *,
    inputs: Inputs | None,
    expect: int | None = None,
    api: str = "replace_pattern",
    **kwargs: Any,
) -> Outcome:
    """Rewrite copies of ``target`` with torch.fx and with fxrewrite and require the same result.

    ``expect`` pins the number of matches torch.fx finds, so a scenario cannot silently stop
    exercising what its name says.
    """
    if kwargs and api == "replace_pattern":
        api = "with_filters"
    original = as_graph_module(target)
    ref_gm, our_gm = copy.deepcopy(original), copy.deepcopy(original)
    ref = Side(ref_gm, rewrite_fx(ref_gm, pattern, replacement, api, kwargs))
    ours = Side(our_gm, rewrite_ours(our_gm, pattern, replacement, api, kwargs))
    if expect is not None:
        assert len(ref.matches) == expect, "the scenario no longer does what it says (torch.fx side)"
    outcome = Outcome(original, ref, ours)
    assert_same(outcome, inputs, api)
    return outcome


def both_apis(test: Callable[..., Any]) -> Callable[..., Any]:
    return pytest.mark.parametrize("api", ["replace_pattern", "with_filters"])(test)


def randn(*shapes: Sequence[int]) -> Inputs:
    """Inputs of the given shapes; the same numbers on every call."""

    def make() -> list[torch.Tensor]:
        generator = torch.Generator().manual_seed(0)
        return [torch.randn(*s, generator=generator) for s in shapes]

    return make


def count_targets(gm: fx.GraphModule, target: Any) -> int:
    return sum(1 for n in gm.graph.nodes if n.target == target)


# ---------------------------------------------------------------------------------------------
# basic scenarios, as functions and as nn.Modules
# ---------------------------------------------------------------------------------------------


class NegPlusRelu(torch.nn.Module):
    def forward(self, x):
        v = torch.neg(x) + torch.relu(x)
        return torch.add(v, v)


def neg_plus_relu(x):
    return torch.neg(x) + torch.relu(x)


@both_apis
def test_identity_rewrite_keeps_the_program(api):
    out = differential(NegPlusRelu(), neg_plus_relu, neg_plus_relu, inputs=randn((2, 3)), expect=1, api=api)
    torch.testing.assert_close(run(randn((2, 3)), out.ours.gm), run(randn((2, 3)), out.original))


@both_apis
def test_one_node_pattern(api):
    class M(torch.nn.Module):
        def forward(self, x):
            v = torch.neg(x)
            return torch.add(v, v)

    differential(M(), lambda x: torch.neg(x), lambda x: torch.relu(x), inputs=randn((2, 3)), expect=1, api=api)


@both_apis
def test_single_match_of_a_two_op_pattern(api):
    differential(NegPlusRelu(), neg_plus_relu, lambda x: torch.relu(x), inputs=randn((2, 3)), expect=1, api=api)


@both_apis
def test_two_matches_are_both_replaced(api):
    class M(torch.nn.Module):
        def forward(self, x, w1, w2):
            m1 = torch.cat([w1, w2]).sum()
            m2 = torch.cat([w1, w2]).sum()
            return x + torch.max(m1) + torch.max(m2)

    out = differential(
        M(),
        lambda w1, w2: torch.cat([w1, w2]).sum(),
        lambda w1, w2: torch.stack([w1, w2]),
        inputs=randn((1, 3), (1, 3), (1, 3)),
        expect=2,
        api=api,
    )
    assert count_targets(out.ours.gm, torch.stack) == 2


def test_argument_order_is_kept():
    class M(torch.nn.Module):
        def forward(self, x, y):
            return torch.mm(x, y)

    def mm(a, b):
        return torch.mm(a, b)

    differential(M(), mm, mm, inputs=randn((3, 4), (4, 5)), expect=1)


def test_only_the_matched_operand_is_replaced():
    class M(torch.nn.Module):
        def forward(self, x, y):
            v = torch.neg(y) + torch.relu(x)
            return torch.add(v, v)

    differential(M(), lambda x: torch.relu(x), lambda x: torch.neg(x), inputs=randn((4, 4), (4, 4)), expect=1)


def test_pattern_that_is_the_whole_graph():
    def whole(x):
        a = torch.neg(x)
        return torch.add(a, a)

    def replacement(x):
        a = torch.sigmoid(x)
        return torch.cat([a, a])

    differential(whole, whole, replacement, inputs=randn((3, 4)), expect=1)


def test_returning_node_may_have_users_outside_the_match():
    def f(x):
        y = torch.relu(x)
        return torch.neg(y) - y

    differential(f, lambda x: torch.relu(x), lambda x: torch.sigmoid(x), inputs=randn((3, 4)), expect=1)


def test_inner_node_used_outside_the_match_prevents_it():
    class M(torch.nn.Module):
        def forward(self, x, w1, w2, b1, b2):
            m0 = torch.cat([w1, w2])  # noqa: F841
            m1 = torch.cat([w1, w2])
            m2 = torch.cat([x, b2])
            t0 = torch.addmm(b1, m1, m2.t())  # noqa: F841
            t1 = torch.sum(w1, 1)
            t2 = torch.addmm(b1, m1, m2.t())
            return torch.sum(t1), torch.sum(t2)

    def pattern(x, w1, w2, b1, b2):
        m1 = torch.cat([w1, w2])
        m2 = torch.cat([x, b2])
        return torch.addmm(b1, m1, m2.t())

    def replacement(x, w1, w2, b1, b2):
        return torch.cat([x, w1, w2])

    out = differential(M(), pattern, replacement, inputs=randn((2, 3), (2, 3), (2, 3), (4,), (2, 3)), expect=0)
    assert out.ours.matches == []
    assert out.ours.gm.code == out.original.code


def test_placeholder_matches_a_computed_node():
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.dtype = torch.float16

        def forward(self, x):
            x += 3
            x = x.dequantize()
            x = torch.sigmoid(x)
            return x.to(self.dtype)

    def pattern(x):
        return torch.sigmoid(x.dequantize()).to(torch.float16)

    out = differential(M(), pattern, lambda x: x, inputs=randn((3, 4)), expect=1)
    assert describe_match(out.ours.matches[0])["nodes_map"]["x"] == "add"


def _placeholders(gm: fx.GraphModule) -> list[Node]:
    return [n for n in gm.graph.nodes if n.op == "placeholder"]


@both_apis
def test_consecutive_matches_feed_each_other(api):
    """Each later match reads the output of the previous replacement: ``nodes_map`` of its
    placeholder must name the *new* node, as torch.fx reports it."""

    def f(x):
        return torch.sigmoid(torch.sigmoid(torch.sigmoid(x)))

    out = differential(f, lambda x: torch.sigmoid(x), lambda x: torch.exp(x), inputs=randn((3, 4)), expect=3,
                       api=api)
    assert count_targets(out.ours.gm, torch.exp) == 3


@both_apis
def test_overlapping_matches_keep_the_first(api):
    def f(x):
        for _ in range(4):
            x = torch.sigmoid(x)
        return x

    def pattern(x):
        return torch.sigmoid(torch.sigmoid(x))

    out = differential(f, pattern, lambda x: torch.neg(x), inputs=randn((3, 4)), expect=2, api=api)
    assert count_targets(out.ours.gm, torch.neg) == 2


@both_apis
def test_overlapping_matches_in_an_odd_chain(api):
    def f(x):
        for _ in range(5):
            x = torch.sigmoid(x)
        return x

    def pattern(x):
        return torch.sigmoid(torch.sigmoid(x))

    differential(f, pattern, lambda x: torch.neg(x), inputs=randn((3, 4)), expect=2, api=api)


@both_apis
def test_pattern_with_two_outputs(api):
    def f(x):
        return torch.sigmoid(x) + torch.relu(x)

    def pattern(a):
        return torch.sigmoid(a), torch.relu(a)

    def replacement(x):
        return torch.exp(x), torch.abs(x)

    differential(f, pattern, replacement, inputs=randn((3, 4)), expect=1, api=api)


@both_apis
def test_replacement_returning_one_node_twice(api):
    def f(x1, x2):
        x = x1 - x2
        return torch.sigmoid(x) + torch.relu(x)

    def pattern(a1, a2):
        a = a1 - a2
        return torch.sigmoid(a), torch.relu(a), a

    def replacement(x1, x2):
        y1 = torch.exp(x1)
        y2 = torch.abs(x2)
        return y2, y2, y1

    differential(f, pattern, replacement, inputs=randn((3, 4), (3, 4)), expect=1, api=api)


@both_apis
def test_pattern_returning_an_intermediate_value(api):
    """``a`` is both returned and consumed inside the pattern; only ``b`` is an anchor."""

    def f(x, y):
        a = torch.relu(x)
        b = torch.sigmoid(a) * y
        return a + b

    def pattern(x, y):
        a = torch.relu(x)
        return a, torch.sigmoid(a) * y

    def replacement(x, y):
        a = torch.clamp(x, min=0)
        return a, torch.sigmoid(a) * y

    differential(f, pattern, replacement, inputs=randn((3, 4), (3, 4)), expect=1, api=api)


def test_unused_graph_inputs_stay():
    class M(torch.nn.Module):
        def forward(self, x, y, z):
            return x + y

    out = differential(M(), lambda x, y: x + y, lambda x, y: x - y, inputs=randn((3,), (3,), (3,)), expect=1)
    assert len(_placeholders(out.ours.gm)) == 3


def test_result_without_users_is_replaced_in_place():
    """The returning node (an in-place copy) has no users: the replacement must land where the
    matched node was, before the ``relu`` that reads the mutated cache."""

    class M(torch.nn.Module):
        def forward(self, x, y, cache):
            m = torch.mul(x, y)
            n = cache.index_copy(0, torch.tensor([0]), m)
            p = torch.ops.aten.copy.default(cache, n)
            torch.ops.aten.copy_.default(cache, p)
            return torch.relu(cache)

    def pattern(dst, src):
        p = torch.ops.aten.copy.default(dst, src)
        return torch.ops.aten.copy_.default(dst, p)

    def replacement(dst, src):
        return torch.ops.aten.copy_.default(dst, src)

    differential(M(), pattern, replacement, inputs=randn((1, 8), (1, 8), (2, 8)), expect=1)


def test_method_calls_in_the_pattern():
    class M(torch.nn.Module):
        def forward(self, x):
            return x.dequantize().sigmoid().to(torch.float16)

    def pattern(x):
        return x.dequantize().sigmoid().to(torch.float16)

    differential(M(), pattern, lambda x: x, inputs=randn((3, 4)), expect=1)


class LinearMul(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w0 = torch.nn.Parameter(torch.randn(8, 8))
        self.b0 = torch.nn.Parameter(torch.randn(8))

    def forward(self, x):
        lin = F.linear(x, self.w0, bias=self.b0)
        return x * lin + x


@both_apis
def test_keyword_arguments_and_a_wrapped_replacement(api):
    def pattern(a, b, bias):
        lin = F.linear(a, b, bias=bias)
        return lin, a * lin

    def replacement(a, b, bias):
        lin, mul = linear_and_scale(a, b, bias)
        return lin, mul

    out = differential(LinearMul(), pattern, replacement, inputs=randn((2, 8)), expect=1, api=api)
    assert count_targets(out.ours.gm, linear_and_scale) == 1


def test_keyword_arguments_are_compared_as_written():
    """torch.fx compares kwargs by name and position as written: ``sum(x, dim=1)`` is not
    ``sum(x, 1)`` (fxrewrite's own matcher normalises them; the compat layer must not)."""

    def f(x):
        return torch.sum(x, 1) + torch.sum(x, dim=0).sum()

    differential(f, lambda x: torch.sum(x, dim=1), lambda x: torch.mean(x, dim=1), inputs=randn((3, 3)),
                 expect=0)
    differential(f, lambda x: torch.sum(x, 1), lambda x: torch.mean(x, 1), inputs=randn((3, 3)), expect=1)


def test_pattern_calling_a_wrapped_function():
    def f(x):
        return opaque_scale(torch.relu(x), 3.0) + 1

    def pattern(x, k):
        return opaque_scale(torch.relu(x), k)

    def replacement(x, k):
        return torch.relu(x) * k

    out = differential(f, pattern, replacement, inputs=randn((3,)), expect=1)
    assert count_targets(out.ours.gm, opaque_scale) == 0


class ThreeCandidates(torch.nn.Module):
    """Three candidate anchors for a two-output pattern; the middle one fails half-way."""

    def __init__(self):
        super().__init__()
        for i in range(5):
            self.register_parameter(f"w{i}", torch.nn.Parameter(torch.randn(8, 8) / 4))
            self.register_parameter(f"b{i}", torch.nn.Parameter(torch.randn(8) / 4))

    def forward(self, in0, in1):
        l1 = F.linear(in1, self.w0, bias=self.b0)
        l2 = F.linear(l1, self.w1, bias=self.b1)
        s1 = in1 * l2 + in1
        l3 = F.linear(s1, self.w2, bias=self.b2)
        m2 = l3 * torch.sigmoid(l3)
        l4 = F.linear(in0, self.w3, bias=self.b3)
        l5 = F.linear(l4, self.w4, bias=self.b4)
        s2 = in0 * l5 + in0
        return torch.cat([m2, s2], dim=1)


@both_apis
def test_failed_candidate_is_reverted_before_the_next(api):
    def pattern(a, b, bias, c):
        lin = F.linear(a, b, bias=bias)
        return lin, c * lin

    def replacement(a, b, bias, c):
        lin, mul = linear_and_scale_by(a, b, bias, c)
        return lin, mul

    out = differential(ThreeCandidates(), pattern, replacement, inputs=randn((2, 8), (2, 8)), expect=2, api=api)
    assert count_targets(out.ours.gm, linear_and_scale_by) == 2


def test_list_arguments_bound_to_placeholders():
    class M(torch.nn.Module):
        def forward(self, x):
            return torch.ops.aten._reshape_alias_copy.default(x, [1, 2], [3, 4])

    def pattern(x, size, stride):
        return torch.ops.aten._reshape_alias_copy.default(x, size, stride)

    def replacement(x, size, stride):
        return torch.ops.aten._reshape_alias_copy.default(x, stride, size)

    out = differential(M(), pattern, replacement, inputs=None, expect=1)
    assert "_reshape_alias_copy.default(x, [3, 4], [1, 2])" in out.ours.gm.code


def test_op_overload_defaults_are_filled_in():
    """For ``OpOverload`` targets torch.fx compares arguments after filling in schema defaults:
    an explicit ``padding=[0, 0]`` in the pattern matches a graph call that omits it."""

    class M(torch.nn.Module):
        def forward(self, x):
            return torch.ops.aten.max_pool2d_with_indices.default(x, [2, 2], stride=[2, 2])[0]

    def pattern(x, kernel, stride):
        return torch.ops.aten.max_pool2d_with_indices.default(x, kernel, stride, padding=[0, 0])

    differential(M(), pattern, pattern, inputs=randn((1, 1, 4, 4)), expect=1)


aten = torch.ops.aten


@pytest.mark.parametrize(
    ("graph_fn", "pattern"),
    [
        (lambda x, y: aten.add.Tensor(x, y), lambda x, y: aten.add.Tensor(x, y, alpha=1)),
        (lambda x, y: aten.add.Tensor(x, y, alpha=1), lambda x, y: aten.add.Tensor(x, y)),
        (lambda x, y: aten.add.Tensor(x, y, alpha=2), lambda x, y: aten.add.Tensor(x, y)),  # no match
        (lambda x, y: aten.sum.dim_IntList(x, [1]) + y, lambda x, y: aten.sum.dim_IntList(x, [1], False) + y),
        (lambda x, y: aten.sum.dim_IntList(x, [1], keepdim=False) + y,
         lambda x, y: aten.sum.dim_IntList(x, [1], False) + y),
    ],
    ids=["explicit-default-in-pattern", "explicit-default-in-graph", "non-default-value", "positional-default",
         "keyword-vs-positional"],
)
def test_op_overload_arguments_are_compared_after_defaults(graph_fn, pattern):
    """When the argument counts differ, torch.fx compares ``OpOverload`` calls argument by
    argument of the schema, defaults filled in (``matcher_utils.SubgraphMatcher._match_nodes``)."""
    differential(graph_fn, pattern, pattern, inputs=randn((3, 3), (3,)))


def test_replacements_list_the_new_nodes():
    class M(torch.nn.Module):
        def forward(self, x, y):
            return torch.add(x, y)

    def replacement(x, y):
        return torch.sub(torch.mul(x, y), y)

    out = differential(M(), lambda x, y: torch.add(x, y), replacement, inputs=randn((3,), (3,)), expect=1,
                       api="with_filters")
    assert [n.target for n in out.ours.matches[0].replacements] == [torch.mul, torch.sub]


def test_trivial_replacement_adds_no_nodes():
    class M(torch.nn.Module):
        def forward(self, x):
            v = torch.neg(x)
            v = torch.add(v, v)
            return torch.add(v, v)

    out = differential(M(), lambda x: torch.add(x, x), lambda x: x, inputs=randn((1, 5)), expect=2,
                       match_filters=[])
    assert [m.replacements for m in out.ours.matches] == [[], []]


@both_apis
def test_pattern_that_matches_nothing(api):
    out = differential(NegPlusRelu(), lambda x: torch.tanh(torch.exp(x)), lambda x: x, inputs=randn((2,)),
                       expect=0, api=api)
    assert out.ours.matches == []
    assert out.ours.gm.code == out.original.code


# ---------------------------------------------------------------------------------------------
# patterns and replacements given as GraphModule, nn.Module and Graph
# ---------------------------------------------------------------------------------------------


def test_pattern_and_replacement_as_graph_modules():
    class Pattern(torch.nn.Module):
        def forward(self, x):
            return torch.neg(x) + torch.relu(x)

    class Replacement(torch.nn.Module):
        def forward(self, x):
            return torch.sigmoid(x)

    differential(NegPlusRelu(), fx.symbolic_trace(Pattern()), fx.symbolic_trace(Replacement()),
                 inputs=randn((3, 4)), expect=1)


class SigmoidRelu(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.sigmoid = torch.nn.Sigmoid()
        self.submod = torch.nn.ReLU()

    def forward(self, x):
        return self.submod(self.sigmoid(x))


class TanhRelu(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.tanh = torch.nn.Tanh()
        self.submod = torch.nn.ReLU()

    def forward(self, x):
        return self.submod(self.tanh(x))


class PlusOneThenSigmoidRelu(SigmoidRelu):
    def forward(self, x):
        return super().forward(x + 1)


@both_apis
def test_call_module_pattern_and_submodules_of_the_replacement(api):
    """Modules match by attribute path; the replacement's new submodule is copied in, the
    matched one that is no longer used is deleted, an existing one of the same name is kept."""
    out = differential(PlusOneThenSigmoidRelu(), SigmoidRelu(), TanhRelu(), inputs=randn((3, 4)), expect=1,
                       api=api)
    gm = out.ours.gm
    assert isinstance(gm.get_submodule("tanh"), torch.nn.Tanh)
    assert isinstance(gm.get_submodule("submod"), torch.nn.ReLU)
    with pytest.raises(AttributeError):
        gm.get_submodule("sigmoid")


def test_call_module_matches_by_path_not_by_type():
    class Renamed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.gate = torch.nn.Sigmoid()
            self.act = torch.nn.ReLU()

        def forward(self, x):
            return self.act(self.gate(x))

    out = differential(Renamed(), SigmoidRelu(), TanhRelu(), inputs=randn((3, 4)), expect=0)
    assert out.ours.gm.code == out.original.code


def test_replacement_graph_module_with_submodules():
    out = differential(PlusOneThenSigmoidRelu(), fx.symbolic_trace(SigmoidRelu()), fx.symbolic_trace(TanhRelu()),
                       inputs=randn((3, 4)), expect=1)
    assert isinstance(out.ours.gm.get_submodule("tanh"), torch.nn.Tanh)


class PlusAMinusB(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.tensor([1.0])
        self.b = torch.tensor([2.0])

    def forward(self, x):
        return x + self.a - self.b


class PlusA(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.tensor([1.0])

    def forward(self, x):
        return x + self.a


class MinusC(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.c = torch.tensor([3.0])

    def forward(self, x):
        return x - self.c


@both_apis
def test_replacement_with_tensor_attributes(api):
    out = differential(PlusAMinusB(), PlusA(), MinusC(), inputs=randn((3,)), expect=1, api=api)
    torch.testing.assert_close(out.ours.gm.c, torch.tensor([3.0]))


def test_pattern_tensor_attribute_matches_any_tensor_attribute():
    class PlusB(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.b = torch.tensor([5.0])

        def forward(self, x):
            return torch.relu(x + self.b)

    differential(PlusB(), PlusA(), MinusC(), inputs=randn((3,)), expect=1)


def test_pattern_parameter_attribute_matches_only_a_parameter_like_torch_fx():
    class PlusParameterA(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Parameter(torch.tensor([1.0]))

        def forward(self, x):
            return x + self.a

    class PlusBufferB(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("b", torch.tensor([5.0]))

        def forward(self, x):
            return torch.relu(x + self.b)

    class PlusParameterB(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.b = torch.nn.Parameter(torch.tensor([5.0]))

        def forward(self, x):
            return torch.relu(x + self.b)

    differential(PlusBufferB(), PlusParameterA(), MinusC(), inputs=randn((3,)), expect=0)
    differential(PlusParameterB(), PlusParameterA(), MinusC(), inputs=randn((3,)), expect=1)


def test_replacement_parameter_is_copied_into_the_module():
    class Scale(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = torch.nn.Parameter(torch.full((4,), 0.5))

        def forward(self, x):
            return torch.sigmoid(x) * self.scale

    out = differential(NegPlusRelu(), neg_plus_relu, Scale(), inputs=randn((2, 4)), expect=1)
    assert "scale" in dict(out.ours.gm.named_parameters())


def test_existing_attribute_of_the_module_takes_precedence():
    class HasC(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("c", torch.tensor([10.0]))

        def forward(self, x):
            return torch.relu(x) + self.c

    out = differential(HasC(), lambda x: torch.relu(x), MinusC(), inputs=randn((3,)), expect=1)
    torch.testing.assert_close(out.ours.gm.c, torch.tensor([10.0]))


def test_pattern_and_replacement_as_graphs():
    pattern = fx.symbolic_trace(neg_plus_relu).graph
    replacement = fx.symbolic_trace(lambda x: torch.sigmoid(x) * 2).graph
    differential(NegPlusRelu(), pattern, replacement, inputs=randn((3, 4)), expect=1, api="with_filters")


# ---------------------------------------------------------------------------------------------
# literals, placeholders and what torch.fx's matcher implies
# ---------------------------------------------------------------------------------------------


class AddScalarThenTensor(torch.nn.Module):
    """First site adds a scalar literal, second adds a tensor node."""

    def forward(self, x):
        x = torch.relu(torch.add(x, 2))
        y = x + 1
        return torch.relu(torch.add(x, y))


def add_relu(x, num):
    return torch.relu(torch.add(x, num))


def mul_instead(x, num):
    return torch.mul(x, num)


@both_apis
def test_placeholder_binds_a_literal_and_a_node(api):
    out = differential(AddScalarThenTensor(), add_relu, mul_instead, inputs=randn((4,)), expect=2, api=api)
    assert [describe(m.nodes_map[k]) for m in out.ours.matches for k in m.nodes_map if k.name == "num"] == [
        ("literal", "2"),
        "add_1",
    ]


def test_placeholder_binds_a_dtype():
    def f(x):
        return x.to(torch.float64).sum()

    differential(f, lambda x, d: x.to(d), lambda x, d: torch.abs(x).to(d), inputs=randn((3,)), expect=1)


@pytest.mark.parametrize(("lo", "hi", "expect"), [(0.5, 0.5, 1), (0.0, 1.0, 0)])
def test_a_placeholder_used_twice_binds_one_value(lo, hi, expect):
    def f(x):
        return torch.clamp(x, lo, hi)

    differential(f, lambda x, v: torch.clamp(x, v, v), lambda x, v: torch.full_like(x, 1.0) * v,
                 inputs=randn((3,)), expect=expect)


@pytest.mark.parametrize(("literal", "expect"), [(1, 1), (2, 0), (1.0, 0), (True, 0)])
def test_literals_must_have_the_same_type_and_value(literal, expect):
    def f(x):
        return torch.relu(x + literal)

    differential(f, lambda x: x + 1, lambda x: x - 1, inputs=randn((3,)), expect=expect)


@pytest.mark.parametrize(("dim", "expect"), [(0, 1), (1, 0)])
def test_literals_inside_argument_lists(dim, expect):
    def f(a, b):
        return torch.cat([a, b], dim).sum()

    differential(f, lambda a, b: torch.cat([a, b], 0), lambda a, b: torch.cat([b, a], 0),
                 inputs=randn((2, 2), (2, 2)), expect=expect)


@both_apis
def test_placeholder_binds_a_list_of_nodes(api):
    def f(a, b):
        return torch.relu(torch.cat([a, b]))

    differential(f, lambda xs: torch.relu(torch.cat(xs)), lambda xs: torch.relu(torch.stack(xs)),
                 inputs=randn((2,), (2,)), expect=1, api=api)


@pytest.mark.parametrize(("order", "expect"), [("as_written", 1), ("commuted", 0)])
def test_no_commutativity(order, expect):
    def f(x, y):
        return (torch.relu(x) + y) if order == "as_written" else (y + torch.relu(x))

    differential(f, lambda x, y: torch.relu(x) + y, lambda x, y: torch.sigmoid(x) + y,
                 inputs=randn((3,), (3,)), expect=expect)


@pytest.mark.parametrize(("spelling", "expect"), [("operator", 1), ("torch.add", 0), ("method", 0)])
def test_targets_must_be_identical(spelling, expect):
    def f(x, y):
        if spelling == "operator":
            return torch.relu(x + y)
        if spelling == "torch.add":
            return torch.relu(torch.add(x, y))
        return torch.relu(x.add(y))

    differential(f, lambda a, b: a + b, lambda a, b: a - b, inputs=randn((3,), (3,)), expect=expect)


@pytest.mark.parametrize(("same_input", "expect"), [(False, 1), (True, 0)])
def test_distinct_placeholders_bind_distinct_nodes(same_input, expect):
    """torch.fx's matcher is injective: ``a * b`` does not match ``x * x``."""

    def f(x, y):
        return torch.relu(x * (x if same_input else y))

    differential(f, lambda a, b: a * b, lambda a, b: torch.mul(b, a), inputs=randn((3,), (3,)), expect=expect)


@pytest.mark.parametrize(("same_input", "expect"), [(True, 1), (False, 0)])
def test_repeated_placeholder_needs_one_node(same_input, expect):
    def f(x, y):
        return torch.relu(x * (x if same_input else y))

    differential(f, lambda a: a * a, lambda a: torch.square(a), inputs=randn((3,), (3,)), expect=expect)


def two_unrelated_outputs(x, y):
    return torch.relu(x), torch.neg(y)


def two_unrelated_replacement(x, y):
    return torch.clamp(x, min=0), torch.mul(y, -1)


@both_apis
def test_disconnected_two_output_pattern(api):
    def f(x, y):
        return torch.relu(x) + torch.neg(y)

    differential(f, two_unrelated_outputs, two_unrelated_replacement, inputs=randn((3,), (3,)), expect=1, api=api)


@both_apis
def test_two_anchors_with_several_candidates_each(api):
    """Every (relu, neg) pair is a candidate; torch.fx keeps the first non-overlapping ones in
    the order of its backtracking over the anchors."""

    def f(a, b, c, d):
        return torch.relu(a) + torch.relu(b) + torch.neg(c) + torch.neg(d)

    differential(f, two_unrelated_outputs, two_unrelated_replacement, inputs=randn((3,), (3,), (3,), (3,)),
                 expect=2, api=api)


@pytest.mark.parametrize(("shared", "expect"), [(True, 1), (False, 0)])
def test_diamond_pattern_needs_the_shared_node(shared, expect):
    def f(x):
        if shared:
            r = torch.relu(x)
            return r * r
        return torch.relu(x) * torch.relu(x)

    def pattern(x):
        a = torch.relu(x)
        return a * a

    differential(f, pattern, lambda x: torch.square(torch.relu(x)), inputs=randn((4,)), expect=expect)


def test_placeholder_binds_none():
    class NoBias(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(4, 4))

        def forward(self, x):
            return torch.relu(F.linear(x, self.w, bias=None))

    def pattern(a, w, bias):
        return torch.relu(F.linear(a, w, bias=bias))

    def replacement(a, w, bias):
        return torch.clamp(F.linear(a, w, bias=bias), min=0)

    differential(NoBias(), pattern, replacement, inputs=randn((2, 4)), expect=1)


@both_apis
def test_match_that_would_form_a_cycle_is_refused(api):
    """Fusing {relu, neg} would need ``sin`` both after relu and before neg."""

    def f(x):
        r = torch.relu(x)
        s = torch.sin(r)
        return torch.neg(s)

    out = differential(f, two_unrelated_outputs, two_unrelated_replacement, inputs=randn((3,)), expect=0, api=api)
    assert out.ours.gm.code == out.original.code


# ---------------------------------------------------------------------------------------------
# match_filters, replacement_callback, ignore_literals
# ---------------------------------------------------------------------------------------------


def second_placeholder_is_a_number(match, original_graph, pattern_graph):
    num = [n for n in pattern_graph.nodes if n.op == "placeholder"][1]
    return isinstance(match.nodes_map[num], (int, float))


def test_match_filter_keeps_the_literal_site():
    out = differential(AddScalarThenTensor(), add_relu, mul_instead, inputs=randn((4,)), expect=1,
                       match_filters=[second_placeholder_is_a_number])
    assert [n.target for m in out.ours.matches for n in m.replacements] == [torch.mul]


@pytest.mark.parametrize(
    ("filters", "expect"),
    [
        ([], 2),
        ([lambda m, g, p: True], 2),
        ([lambda m, g, p: True, lambda m, g, p: False], 0),
        ([second_placeholder_is_a_number, lambda m, g, p: True], 1),
    ],
)
def test_all_filters_must_accept(filters, expect):
    differential(AddScalarThenTensor(), add_relu, mul_instead, inputs=randn((4,)), expect=expect,
                 match_filters=filters)


def test_filters_see_the_same_internal_match():
    seen: dict[str, list[Any]] = {"fx": [], "ours": []}
    side = ["fx"]

    def record(match, original_graph, pattern_graph):
        seen[side[0]].append(
            {
                "anchors": [a.name for a in match.anchors],
                "nodes_map": {p.name: describe(g) for p, g in match.nodes_map.items()},
                "placeholder_nodes": [describe(n) for n in match.placeholder_nodes],
                "returning_nodes": [describe(n) for n in match.returning_nodes],
                "pattern_placeholders": [n.name for n in pattern_graph.nodes if n.op == "placeholder"],
            }
        )
        return True

    original = fx.symbolic_trace(ThreeCandidates())
    fx_gm, our_gm = copy.deepcopy(original), copy.deepcopy(original)

    def pattern(a, b, bias, c):
        lin = F.linear(a, b, bias=bias)
        return lin, c * lin

    fx_rewriter.replace_pattern_with_filters(fx_gm, pattern, pattern, [record])
    side[0] = "ours"
    fxrewrite.replace_pattern_with_filters(our_gm, pattern, pattern, [record])
    assert len(seen["fx"]) == 2
    assert seen["ours"] == seen["fx"]


def replace_by_literal(match, original_graph, pattern_graph):
    """Builds the replacement from the matched literal: multiplying by 2 becomes an add."""
    num = match.placeholder_nodes[1]
    if num == 2:
        return fx.symbolic_trace(lambda x, num: x + x).graph
    return fx.symbolic_trace(lambda x, num: torch.mul(x, num)).graph


class TimesTwoAndThree(torch.nn.Module):
    def forward(self, x):
        return torch.relu(torch.mul(x, 2)) + torch.relu(torch.mul(x, 3))


@pytest.mark.parametrize("replacement", [None, mul_instead])
def test_replacement_callback_builds_per_match(replacement):
    calls = []

    def callback(match, original_graph, pattern_graph):
        calls.append(describe(match.placeholder_nodes))
        return replace_by_literal(match, original_graph, pattern_graph)

    out = differential(TimesTwoAndThree(), lambda x, num: torch.relu(torch.mul(x, num)), replacement,
                       inputs=randn((4,)), expect=2, replacement_callback=callback)
    assert calls[: len(calls) // 2] == calls[len(calls) // 2:]
    assert len(calls) == 4
    assert count_targets(out.ours.gm, torch.mul) == 1


def test_replacement_callback_returning_a_fresh_graph_each_time():
    class M(torch.nn.Module):
        def forward(self, x, y):
            return torch.add(x, y) + torch.add(y, x)

    def replacement(x, y):
        return torch.sub(torch.mul(x, y), y)

    differential(M(), lambda x, y: torch.add(x, y), None, inputs=randn((3,), (3,)), expect=2,
                 replacement_callback=lambda *args: fx.symbolic_trace(replacement).graph)


def test_ignore_literals_lets_a_literal_match_another_literal():
    def f(x):
        return torch.relu(x + 2) * 3

    differential(f, lambda x: torch.relu(x + 1), lambda x: torch.sigmoid(x), inputs=randn((3,)), expect=1,
                 ignore_literals=True)
    differential(f, lambda x: torch.relu(x + 1), lambda x: torch.sigmoid(x), inputs=randn((3,)), expect=0,
                 ignore_literals=False)


def test_ignore_literals_with_a_callback_reading_the_literal():
    def f(x):
        return torch.relu(torch.mul(x, 2)) + torch.relu(torch.mul(x, 3))

    def callback(match, original_graph, pattern_graph):
        mul = next(g for p, g in match.nodes_map.items() if p.target is torch.mul)
        k = mul.args[1]
        return fx.symbolic_trace(lambda x: torch.relu(x * k + 0.0)).graph

    differential(f, lambda x: torch.relu(torch.mul(x, 7)), None, inputs=randn((4,)), expect=2,
                 ignore_literals=True, replacement_callback=callback)


class AddNode(torch.nn.Module):
    def forward(self, x, y):
        return x + y


def plus_one(x):
    return x + 1


def test_ignore_literals_unsound_in_torch_fx_refused_by_fxrewrite():
    """Pattern ``x + 1`` under ``ignore_literals`` must not match ``x + y``.

    Rewriting a pattern by *itself* can never change a program, yet torch.fx turns ``x + y``
    into ``x + 1``: its matcher lets the pattern literal stand for the node ``y`` and the
    replacement then drops ``y``. fxrewrite refuses that match and leaves the module as it was.
    """
    original = fx.symbolic_trace(AddNode())
    fx_gm, our_gm = copy.deepcopy(original), copy.deepcopy(original)
    x, y = torch.randn(5), torch.randn(5)
    expected = original(x, y)

    fx_matches = fx_rewriter.replace_pattern_with_filters(fx_gm, plus_one, plus_one, ignore_literals=True)
    assert len(fx_matches) == 1  # the bug: torch.fx accepts the match ...
    assert not torch.allclose(fx_gm(x, y), expected)  # ... and changes the program
    torch.testing.assert_close(fx_gm(x, y), x + 1)

    our_matches = fxrewrite.replace_pattern_with_filters(our_gm, plus_one, plus_one, ignore_literals=True)
    assert our_matches == []
    our_gm.graph.lint()
    assert our_gm.code == original.code
    torch.testing.assert_close(our_gm(x, y), expected)


def test_ignore_literals_refuses_only_the_node_site():
    """Where a literal sits in the graph, fxrewrite reports exactly torch.fx's match."""

    class Mixed(torch.nn.Module):
        def forward(self, x, y):
            return torch.relu(x + y) + torch.relu(x + 3)

    def pattern(x):
        return torch.relu(x + 1)

    original = fx.symbolic_trace(Mixed())
    fx_gm, our_gm = copy.deepcopy(original), copy.deepcopy(original)
    fx_matches = fx_rewriter.replace_pattern_with_filters(fx_gm, pattern, pattern, ignore_literals=True)
    our_matches = fxrewrite.replace_pattern_with_filters(our_gm, pattern, pattern, ignore_literals=True)
    assert len(fx_matches) == 2
    def picture(m: Any) -> dict[str, Any]:  # replacement node names depend on earlier rewrites
        return {k: v for k, v in describe_match(m).items() if k != "replacements"}

    assert [picture(m) for m in our_matches] == [
        picture(m) for m in fx_matches if picture(m)["nodes_map"]["relu"] == "relu_1"  # the ``x + 3`` site
    ]
    our_gm.graph.lint()
    x, y = torch.randn(4), torch.randn(4)
    # the kept match rewrote ``x + 3`` into ``x + 1`` (what ignore_literals asks for), nothing else
    torch.testing.assert_close(our_gm(x, y), torch.relu(x + y) + torch.relu(x + 1))


def test_ignore_literals_keeps_a_repeated_placeholder_consistent():
    """torch.fx, with ``ignore_literals``, binds ``v`` to ``0.0`` and then accepts ``1.0`` for
    the same ``v``: ``clamp(x, 0.0, 1.0)`` becomes ``clamp(x, 0.0, 0.0)``. fxrewrite refuses."""

    def f(x):
        return torch.clamp(x, 0.0, 1.0)

    def pattern(x, v):
        return torch.clamp(x, v, v)

    original = fx.symbolic_trace(f)
    fx_gm, our_gm = copy.deepcopy(original), copy.deepcopy(original)
    x = torch.linspace(-2, 2, 9)
    assert len(fx_rewriter.replace_pattern_with_filters(fx_gm, pattern, pattern, ignore_literals=True)) == 1
    torch.testing.assert_close(fx_gm(x), torch.zeros(9))  # torch.fx's rewrite changed the program
    assert fxrewrite.replace_pattern_with_filters(our_gm, pattern, pattern, ignore_literals=True) == []
    assert our_gm.code == original.code
    torch.testing.assert_close(our_gm(x), original(x))


def test_ignore_literals_pattern_call_never_matches_a_literal():
    """Pattern ``x + relu(y)`` against graph ``x + 1``: torch.fx accepts the match, then fails
    with ``KeyError`` (``y`` was never bound); fxrewrite finds no match."""

    def f(x):
        return torch.add(x, 1)

    def pattern(x, y):
        return torch.add(x, torch.relu(y))

    original = fx.symbolic_trace(f)
    with pytest.raises(KeyError):
        fx_rewriter.replace_pattern_with_filters(copy.deepcopy(original), pattern, pattern, ignore_literals=True)
    our_gm = copy.deepcopy(original)
    assert fxrewrite.replace_pattern_with_filters(our_gm, pattern, pattern, ignore_literals=True) == []
    assert our_gm.code == original.code


# ---------------------------------------------------------------------------------------------
# errors that both raise
# ---------------------------------------------------------------------------------------------


def _both_raise(target: Any, pattern: Any, replacement: Any, **kwargs: Any) -> tuple[BaseException, fx.GraphModule,
                                                                                     fx.GraphModule]:
    original = as_graph_module(target)
    fx_gm, our_gm = copy.deepcopy(original), copy.deepcopy(original)
    with pytest.raises(Exception):  # noqa: B017 - torch.fx raises AssertionError or RuntimeError
        fx_rewriter.replace_pattern_with_filters(fx_gm, pattern, replacement, **kwargs)
    with pytest.raises(Exception) as ours:
        fxrewrite.replace_pattern_with_filters(our_gm, pattern, replacement, **kwargs)
    return ours.value, original, our_gm


def _unused_placeholder(x, y):
    return torch.neg(x)


def _unused_intermediate(x):
    torch.relu(x)
    return torch.neg(x)


@pytest.mark.parametrize(
    ("pattern", "fx_error"),
    [
        # torch.fx: placeholders count as impure, so it fails later, on the unbound ``y``
        (_unused_placeholder, KeyError),
        (_unused_intermediate, AssertionError),  # "... pattern with dead code"
    ],
)
@pytest.mark.parametrize("api", ["replace_pattern", "with_filters"])
def test_dead_code_in_the_pattern_is_an_error(pattern, fx_error, api):
    def f(x, y):
        return torch.neg(x) + torch.relu(y)

    original = fx.symbolic_trace(f)
    fx_gm, our_gm = copy.deepcopy(original), copy.deepcopy(original)
    fx_fn = fx_rewriter.replace_pattern if api == "replace_pattern" else fx_rewriter.replace_pattern_with_filters
    our_fn = fxrewrite.replace_pattern if api == "replace_pattern" else fxrewrite.replace_pattern_with_filters
    with pytest.raises(fx_error):
        fx_fn(fx_gm, pattern, pattern)
    with pytest.raises(Exception):  # noqa: B017 - the type is fxrewrite's choice; the graph must be intact
        our_fn(our_gm, pattern, pattern)
    assert our_gm.code == original.code
    our_gm.graph.lint()


def test_placeholder_count_mismatch_is_an_error():
    _, original, our_gm = _both_raise(NegPlusRelu(), neg_plus_relu, lambda x, y: x + y)
    assert our_gm.code == original.code


def test_missing_replacement_is_an_error():
    _, original, our_gm = _both_raise(NegPlusRelu(), neg_plus_relu, None)
    assert our_gm.code == original.code


def test_output_count_mismatch_is_an_error():
    def f(x):
        return torch.sigmoid(x) + torch.relu(x)

    _both_raise(f, lambda a: (torch.sigmoid(a), torch.relu(a)), lambda a: torch.exp(a))


# ---------------------------------------------------------------------------------------------
# scale: same results on a long chain, and linear cost on a very long one
# ---------------------------------------------------------------------------------------------


def neg_then_sigmoid(x):
    return torch.sigmoid(torch.neg(x))


def one_minus_sigmoid(x):
    return 1 - torch.sigmoid(x)


def chain_module(n_pairs: int) -> fx.GraphModule:
    """``x -> neg -> sigmoid -> neg -> sigmoid ...`` built node by node (tracing 20k Python
    calls would dominate the test)."""
    graph = fx.Graph()
    value = graph.placeholder("x")
    for _ in range(n_pairs):
        value = graph.call_function(torch.sigmoid, (graph.call_function(torch.neg, (value,)),))
    graph.output(value)
    return fx.GraphModule(torch.nn.Module(), graph)


@both_apis
def test_long_chain_matches_torch_fx(api):
    out = differential(chain_module(150), neg_then_sigmoid, one_minus_sigmoid, inputs=randn((8,)), expect=150,
                       api=api)
    torch.testing.assert_close(run(randn((8,)), out.ours.gm), run(randn((8,)), out.original))


@pytest.mark.slow
def test_twenty_thousand_node_chain():
    """10 000 matches in a 20 000-node chain: torch.fx needs a whole-graph cycle check per match
    (quadratic); fxrewrite must finish and be right. No timing is asserted."""
    n_pairs = 10_000
    original = chain_module(n_pairs)
    gm = copy.deepcopy(original)
    matches = fxrewrite.replace_pattern_with_filters(gm, neg_then_sigmoid, one_minus_sigmoid)
    assert len(matches) == n_pairs
    gm.graph.lint()
    assert count_targets(gm, torch.neg) == 0
    assert count_targets(gm, torch.sigmoid) == n_pairs
    assert count_targets(gm, operator.sub) == n_pairs
    # every later match reads the previous replacement's output, as torch.fx reports it
    x_of = [next(g for p, g in m.nodes_map.items() if p.op == "placeholder") for m in matches]
    assert all(x_of[i] is matches[i - 1].replacements[-1] for i in range(1, n_pairs))
    x = torch.randn(16)
    torch.testing.assert_close(gm(x), original(x))


class CallCounter:
    """Counts Python and C function calls made while active (``sys.setprofile``): a
    deterministic measure of work, unlike wall-clock time."""

    def __init__(self) -> None:
        self.calls = 0

    def _profile(self, frame, event, arg):
        if event in ("call", "c_call"):
            self.calls += 1

    def __enter__(self) -> CallCounter:
        self._previous = sys.getprofile()
        sys.setprofile(self._profile)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.setprofile(self._previous)


def calls_to_rewrite(rewrite: Callable[..., Any], n_pairs: int) -> int:
    gm = chain_module(n_pairs)
    with CallCounter() as counter:
        matches = rewrite(gm, neg_then_sigmoid, one_minus_sigmoid)
    assert len(matches) == n_pairs
    return counter.calls


@pytest.mark.slow
def test_work_grows_linearly_with_the_graph():
    """An 8x longer chain must cost about 8x the calls (quadratic would be ~64x). The same
    measure applied to torch.fx on a 4x longer chain shows its quadratic growth (~16x)."""
    calls_to_rewrite(fxrewrite.replace_pattern, 10)  # warm caches and lazy imports
    small = calls_to_rewrite(fxrewrite.replace_pattern, 250)
    large = calls_to_rewrite(fxrewrite.replace_pattern, 2000)
    assert large / small < 12, f"fxrewrite made {large / small:.1f}x the calls on an 8x larger graph"
    fx_small = calls_to_rewrite(fx_rewriter.replace_pattern, 250)
    fx_large = calls_to_rewrite(fx_rewriter.replace_pattern, 1000)
    assert fx_large / fx_small > 8, f"the measure no longer sees torch.fx's quadratic cost ({fx_large / fx_small:.1f}x)"


def test_output_count_mismatch_leaves_the_graph_untouched():
    def f(x):
        return torch.sigmoid(x) + torch.relu(x)

    def pattern(a):
        return torch.sigmoid(a), torch.relu(a)

    gm = torch.fx.symbolic_trace(f)
    before = gm.code, [n.format_node() for n in gm.graph.nodes]
    with pytest.raises(ValueError, match="the pattern returns 2 values but the replacement returns 1"):
        fxrewrite.replace_pattern(gm, pattern, lambda a: torch.exp(a))
    assert (gm.code, [n.format_node() for n in gm.graph.nodes]) == before
