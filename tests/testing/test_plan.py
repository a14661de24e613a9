"""fxrewrite.testing._plan: layouts drawn before values for guarded rules, literal dims grouped
by the op that takes them, and the counts of what was drawn and kept."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings

from fxrewrite import Rule
from fxrewrite.testing._plan import (
    _draws_layouts_first,
    _index_groups,
    _Layout,
    _layouts_refused,
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


def test_unguarded_rules_and_rules_with_literals_keep_the_plain_draw():
    assert not _draws_layouts_first(plan_inputs(Rule.from_functions(lambda x: -x, lambda x: -x, name="n")))

    def scaled(x, s: float):
        return x * s

    guarded = Rule.from_functions(scaled, scaled, name="s", where=lambda m: m["x"].dim() > 0)
    assert not _draws_layouts_first(plan_inputs(guarded))


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
