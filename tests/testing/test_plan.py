"""fxrewrite.testing._plan: layouts drawn before values for guarded rules and rules with literals
(a refused layout drawn again inside the input), literal dims grouped by the op that takes them,
and the counts of what was drawn and kept."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings

from fxrewrite import Rule
from fxrewrite.testing import _plan
from fxrewrite.testing._plan import (
    MAX_LAYOUT_TRIES,
    _draws_layouts_first,
    _index_groups,
    _Layout,
    _layouts_refused,
    admits_inputs,
    draw_counts,
    reset_draw_counts,
)
from fxrewrite.testing.strategies import plan_inputs

pytestmark = pytest.mark.slow  # each plan probes its pattern (about a second of CPU)

QUICK = settings(max_examples=15, database=None, derandomize=True, suppress_health_check=list(HealthCheck))


def _vector_bias(m) -> bool:  # type: ignore[no-untyped-def]
    return m["b"].dim() == 1 and m["w"].dim() == 2 and m["b"].shape[0] == m["w"].shape[0]


def bias_rule() -> Rule:
    return Rule.from_functions(lambda x, w, b: x @ w.t() + b, lambda x, w, b: F.linear(x, w, b),
                               name="bias", where=_vector_bias,
                               domain={"dtypes": (torch.float32,), "ranks": (2, 2), "sides": (1, 2)})


def test_a_layout_the_guard_refuses_is_refused_before_values_and_remembered():
    plan = plan_inputs(bias_rule())
    assert _draws_layouts_first(plan)
    f32 = torch.float32
    good = {"x": _Layout((2, 2), f32, False), "w": _Layout((2, 2), f32, False), "b": _Layout((2,), f32, False)}
    bad = {**good, "b": _Layout((2, 2), f32, False)}
    assert not _layouts_refused(plan, good, {}, {})
    assert _layouts_refused(plan, bad, {}, {})
    assert plan.counts.refused[(tuple(sorted(bad.items())), "[]")] is True


def test_a_layout_the_pattern_raises_on_for_ones_and_zeros_is_refused():
    plan = plan_inputs(bias_rule())
    f32 = torch.float32
    mismatched = {"x": _Layout((2, 1), f32, False), "w": _Layout((2, 2), f32, False), "b": _Layout((2,), f32, False)}
    assert _layouts_refused(plan, mismatched, {}, {})


def test_every_input_drawn_layouts_first_satisfies_the_guard_and_is_counted():
    rule = bias_rule()
    reset_draw_counts(rule)
    seen = []

    @QUICK
    @given(plan_inputs(rule).strategy())
    def body(inputs):  # type: ignore[no-untyped-def]
        seen.append(inputs)
        assert inputs["b"].dim() == 1 and inputs["b"].shape[0] == inputs["w"].shape[0]
        torch.testing.assert_close(inputs["x"] @ inputs["w"].t() + inputs["b"],
                                   F.linear(inputs["x"], inputs["w"], inputs["b"]), equal_nan=True)

    body()
    counts = draw_counts(rule)
    assert counts.kept == len(seen) > 0 and counts.drawn >= counts.kept
    assert counts.describe().startswith(f"drawn {counts.drawn}, kept {counts.kept}, rejected ")


def test_unguarded_rules_keep_the_plain_draw_and_rules_with_int_literals_draw_layouts_first():
    assert not _draws_layouts_first(plan_inputs(Rule.from_functions(lambda x: -x, lambda x: -x, name="n")))
    assert not _draws_layouts_first(plan_inputs(Rule.from_functions(lambda x, y: x / y, lambda x, y: x / y, name="d")))

    def scaled(x, s: float):
        return x * s

    guarded = Rule.from_functions(scaled, scaled, name="s", where=lambda m: m["x"].dim() > 0)
    assert _draws_layouts_first(plan_inputs(guarded))
    # a number literal the values meet keeps the plain draw (the overflow of (x * a) * b needs an
    # extreme x drawn beside the literals: tests/dsl/test_dsl_declarations.py)
    assert not _draws_layouts_first(plan_inputs(Rule.from_functions(scaled, scaled, name="u")))

    def summed(x, d: int):
        return x.sum(d)

    assert _draws_layouts_first(plan_inputs(Rule.from_functions(summed, summed, name="dims")))


def _summed(x, d: int):
    return torch.sum(x, d, keepdim=True).squeeze(d)


def summed_rule() -> Rule:
    return Rule.from_functions(_summed, _summed, name="summed", domain={"dtypes": (torch.float32,)})


@pytest.mark.parametrize("tries", [1, MAX_LAYOUT_TRIES])
def test_a_refused_layout_is_drawn_again_inside_the_input_and_only_accepted_inputs_come_out(tries, monkeypatch):
    # the slow twin is one try (reject the input at the first refusal, as before): both give
    # only inputs the pattern runs on; with tries, most refusals cost no input
    monkeypatch.setattr(_plan, "MAX_LAYOUT_TRIES", tries)
    rule = summed_rule()
    reset_draw_counts(rule)
    seen = []

    @QUICK
    @given(plan_inputs(rule).strategy())
    def body(inputs):  # type: ignore[no-untyped-def]
        x, d = inputs["x"], inputs["d"]
        assert -max(x.dim(), 1) <= d < max(x.dim(), 1)  # the pattern runs: d is a dim of x
        seen.append(inputs)

    body()
    counts = draw_counts(rule)
    assert counts.kept == len(seen) > 0
    if tries == 1:
        assert counts.drawn - counts.kept >= counts.layouts_refused > 0  # each refusal cost an input
    else:
        assert counts.layouts_refused > 0 and counts.drawn - counts.kept < counts.layouts_refused


def test_a_focus_whose_layouts_are_all_refused_is_not_admitted():
    def scores(q, k, s: float):
        return (q @ k.transpose(-2, -1)) * s

    rule = Rule.from_functions(scores, scores, name="scores", where=lambda m: m["q"].dim() >= 2,
                               domain={"dtypes": (torch.float32, torch.float64), "ranks": (2, 3),
                                       "literals": {"s": (0.5,)}})
    plan = plan_inputs(rule)
    assert admits_inputs(plan)
    assert not admits_inputs(plan.with_own_dtype("k"))  # matmul refuses float32 @ float64


def test_int_literals_are_grouped_by_the_op_that_takes_them():
    def two_permutes(x, a: int, b: int, c: int, d: int):
        return x.permute(a, b).permute(c, d)

    rule = Rule.from_functions(two_permutes, two_permutes, name="pp")
    assert _index_groups(plan_inputs(rule)) == [["a", "b"], ["c", "d"]]


def test_the_shape_relations_a_guard_accepts_are_found_when_the_plan_is_made_and_drawn_mostly():
    rule = bias_rule()
    plan = plan_inputs(rule)
    assert plan.relations and all(r["b"] == 1 and r["w"] == 0 for r in plan.relations)
    reset_draw_counts(rule)

    @QUICK
    @given(plan.strategy())
    def body(inputs):  # type: ignore[no-untyped-def]
        pass

    body()
    counts = draw_counts(rule)
    assert counts.rejected_percent < 60, counts.describe()  # 93% for linear_add_bias when drawn freely
