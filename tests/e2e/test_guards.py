"""where= guards: what they see, how rejections are reported, and errors they raise."""

from __future__ import annotations

import itertools
from typing import Annotated

import pytest
import torch
import torch.fx as fx
from _helpers import assert_consistent, assert_rewrite_sound, assert_same_state, graph_state, neg_neg, traced_net

import fxrewrite
from fxrewrite import RewriteError, Rule, rewrite


def relu_relu(**kw):
    return Rule.from_functions(lambda x: torch.relu(torch.relu(x)), lambda x: torch.relu(x), name="relu_relu", **kw)


def f(a):
    return torch.relu(torch.relu(a))


def test_guard_reads_shape_from_example_inputs():
    wide = relu_relu(where=lambda m: m["x"].shape[-1] >= 8)
    assert rewrite(f, wide, example_inputs=(torch.randn(2, 16),)).report.applied["relu_relu"] == 1
    narrow = rewrite(f, wide, example_inputs=(torch.randn(2, 4),))
    assert narrow.report.applied["relu_relu"] == 0
    assert narrow.report.rejected["relu_relu"] == 1
    assert "returned False" in narrow.report.reasons["relu_relu"][0]
    x = torch.randn(2, 4)
    torch.testing.assert_close(narrow.module(x), f(x))
    narrow.module.graph.lint()


def test_guard_sees_dtype_dim_device_and_the_node():
    seen = {}

    def guard(m):
        view = m["x"]
        seen.update(dtype=view.dtype, dim=view.dim(), ndim=view.ndim, device=view.device, node=m.node("x").name,
                    size=view.size(-1), has_x="x" in m, keys=list(m.keys()), repr=repr(view))
        return True

    result = rewrite(f, relu_relu(where=guard), example_inputs=(torch.randn(3, 5, dtype=torch.float64),))
    assert result.report.applied["relu_relu"] == 1
    assert_rewrite_sound(f, result, torch.randn(3, 5, dtype=torch.float64))
    assert seen == {"dtype": torch.float64, "dim": 2, "ndim": 2, "device": torch.device("cpu"), "node": "a",
                    "size": 5, "has_x": True, "keys": ["x"], "repr": "TensorView(a)"}


def test_guard_reads_meta_val_when_the_graph_carries_it():
    gm = fx.symbolic_trace(f)
    placeholder = next(iter(gm.graph.nodes))
    placeholder.meta["val"] = torch.empty(7, 9)
    result = rewrite(gm, relu_relu(where=lambda m: m["x"].shape == (7, 9)))
    assert result.report.applied["relu_relu"] == 1
    assert_rewrite_sound(f, result, torch.randn(7, 9))


def test_guard_gets_literal_and_module_captures_as_values():
    # lin is called at two places: the capture says the rule never changes it
    def pattern(x, lin: Annotated[torch.nn.Linear, fxrewrite.Accept(shared=True)], s: float):
        return lin(x) * s

    seen = []

    def guard(m):
        seen.append((type(m["lin"]).__name__, m["s"], m.node("lin").op))
        return m["s"] > 1

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(2, 2)

        def forward(self, x):
            return self.lin(x) * 0.5 + self.lin(x) * 3.0

    r = Rule.from_functions(pattern, lambda x, lin, s: torch.div(lin(x), 1.0 / s), where=guard, name="scale_out")
    model = M()
    result = rewrite(model, r)
    assert set(seen) == {("Linear", 0.5, "call_module"), ("Linear", 3.0, "call_module")}
    assert result.report.applied["scale_out"] == 1 and result.report.rejected["scale_out"] >= 1
    assert_rewrite_sound(model, result, torch.randn(4, 2))


def test_guard_reading_a_literal_node_raises_type_error_with_hint():
    def pattern(x, s: float):
        return torch.relu(x * s)

    r = Rule.from_functions(pattern, lambda x, s: torch.relu(x * s), where=lambda m: m.node("s") is None, name="r")
    with pytest.raises(RewriteError, match=r"bound the constant 2.0, not a graph node"):
        rewrite(lambda a: torch.relu(a * 2.0), r)


def test_several_guards_must_all_pass():
    both = relu_relu(where=(lambda m: True, lambda m: False))
    result = rewrite(f, both)
    assert result.report.applied["relu_relu"] == 0 and result.report.rejected["relu_relu"] == 1
    assert_rewrite_sound(f, result, torch.randn(3))


def test_guard_that_raises_is_an_error_naming_the_rule_and_node():
    def broken(m):
        raise ZeroDivisionError("boom")

    with pytest.raises(RewriteError) as info:
        rewrite(f, relu_relu(where=broken))
    message = str(info.value)
    assert "rule 'relu_relu'" in message and "guard broken" in message and "ZeroDivisionError: boom" in message
    assert "graph node 'relu_1'" in message


def test_guard_needing_missing_metadata_refuses_and_says_how_to_provide_it():
    result = rewrite(f, relu_relu(where=lambda m: m["x"].shape[-1] > 1))
    assert result.report.applied["relu_relu"] == 0 and result.report.rejected["relu_relu"] == 1
    assert "example_inputs=" in result.report.reasons["relu_relu"][0]
    assert_rewrite_sound(f, result, torch.randn(3))


def test_bad_example_inputs_are_a_clear_error():
    with pytest.raises(RewriteError, match="could not propagate shapes"):
        rewrite(lambda a, b: a + b, relu_relu(), example_inputs=(torch.randn(2),))


def test_unknown_binding_name_lists_the_parameters():
    with pytest.raises(RewriteError, match=r"the pattern has no parameter 'y'; it has \['x'\]"):
        rewrite(f, relu_relu(where=lambda m: m["y"]))


def _guard_needs_missing_metadata(k):
    calls = itertools.count(1)

    def guard(m):
        return next(calls) < k or m["x"].shape[-1] == 4

    return neg_neg(lambda x: x, where=guard), {}


@pytest.mark.parametrize("k", [1, 2])
def test_guard_needing_missing_metadata_refuses_and_says_how_to_get_it(k):
    """Not an error: the rule does not fire where its guard cannot be decided (issue 11.4)."""
    model, gm = traced_net()
    rule, _ = _guard_needs_missing_metadata(k)
    before = graph_state(gm)
    result = rewrite(gm, rule)
    assert result.report.applied["neg_neg"] == k - 1
    assert result.report.rejected["neg_neg"] == 2 - (k - 1)
    assert "example_inputs=" in result.report.reasons["neg_neg"][0]
    assert_same_state(before, graph_state(gm))
    assert_consistent(result.module, model)
