"""fxrewrite.testing._inputs, asked directly: the input plan of a rule (its parameters sorted by
kind, the tensors a module capture is called on, the guard harness, the domain parsed and checked,
module captures checked buildable) and the strategy ``inputs_for`` makes of it."""

from __future__ import annotations

import _helpers
import pytest
import torch
from torch import nn

from fxrewrite import Rule
from fxrewrite.errors import ArgumentError, RuleDefinitionError
from fxrewrite.testing import _plan
from fxrewrite.testing._inputs import _module_consumers, inputs_for, plan_inputs


def draws(strategy, n=30):
    """``n`` deterministic draws of ``strategy`` (:func:`_helpers.draws`; 30 by default here)."""
    return _helpers.draws(strategy, n)


def rule(pattern, **kw):
    return Rule.from_functions(pattern, pattern, name="r", **kw)


def scaled_linear(x, lin: nn.Linear, s: float):
    return lin(x) * s


class NeedsArguments(nn.Module):
    """A module class no default instance can be made of."""

    def __init__(self, features: int, scale: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.full((features,), scale))

    def forward(self, x):
        return torch.matmul(x, self.weight)  # x's last dimension must be ``features``


# -- the plan ------------------------------------------------------------------------------------------


def test_the_plan_sorts_the_parameters_by_kind_in_their_order():
    plan = plan_inputs(rule(scaled_linear))
    assert [p.name for p in plan.tensors] == ["x"]
    assert [p.name for p in plan.literals] == ["s"] and [p.name for p in plan.modules] == ["lin"]
    assert plan.harness is None  # no guard, nothing to evaluate one on


def test_a_guarded_rule_gets_a_harness_for_its_guards():
    plan = plan_inputs(rule(lambda x: torch.neg(x), where=lambda m: m["x"].dim() > 0))
    assert plan.harness is not None and plan.harness.rule is plan.rule


def test_the_tensors_a_module_capture_is_called_on_directly_are_its_consumers():
    def pattern(x, y, conv: nn.Conv2d, bn: nn.BatchNorm2d, s: float):
        return bn(conv(x)) + torch.relu(y) * s

    assert _module_consumers(rule(pattern)) == {"x": "conv"}  # bn is called on conv's result, not on a tensor


def test_a_tensor_passed_to_two_modules_is_the_first_ones():
    def pattern(x, first: nn.Linear, second: nn.Linear):
        return first(x) + second(x)

    assert _module_consumers(rule(pattern)) == {"x": "first"}


def test_a_tensor_a_module_is_called_on_by_keyword_is_its_consumer_too():
    def by_keyword(x, q, lin: nn.Linear, attn: nn.MultiheadAttention):
        return lin(input=x) + attn(key=x, value=x, query=q)[0]

    assert _module_consumers(rule(by_keyword)) == {"x": "lin", "q": "attn"}  # query is attn's first argument


def test_the_domain_given_to_the_plan_replaces_the_rules_own():
    r = rule(lambda x: torch.neg(x), domain={"dtypes": (torch.float64,)})
    assert plan_inputs(r).domain.dtypes == (torch.float64,)
    assert plan_inputs(r, domain={"dtypes": (torch.int32,)}).domain.dtypes == (torch.int32,)
    assert {d["x"].dtype for d in draws(inputs_for(r, domain={"dtypes": (torch.int32,)}), 10)} == {torch.int32}


def test_a_malformed_domain_is_refused_with_the_rules_name():
    with pytest.raises(RuleDefinitionError, match=r"rule 'r'.*domain\['ranks'\]"):
        plan_inputs(rule(lambda x: torch.neg(x)), domain={"ranks": (3, 1)})


def test_a_domain_entry_under_another_kind_of_parameter_is_refused_and_other_names_are_ignored():
    with pytest.raises(RuleDefinitionError, match=r"domain\['literals'\] is for literal parameters, but 'x' is a "
                                                  r"tensor parameter; move it to domain\['inputs'\]"):
        plan_inputs(rule(lambda x: torch.neg(x)), domain={"literals": {"x": [1]}})
    assert plan_inputs(rule(lambda x: torch.neg(x)), domain={"literals": {"other_rules": [1]}})


def test_a_module_capture_that_cannot_be_built_asks_for_a_factory():
    def pattern(x, scale: NeedsArguments):
        return scale(x)

    with pytest.raises(RuleDefinitionError) as info:
        plan_inputs(rule(pattern))
    message = str(info.value)
    assert "cannot build a 'NeedsArguments' for module capture 'scale'" in message
    assert "domain={'modules': {'scale': lambda: NeedsArguments(...)}}" in message
    factory = {"modules": {"scale": lambda: NeedsArguments(3, 2.0)}, "ranks": (1, 2)}
    drawn = draws(inputs_for(rule(pattern, domain=factory)), 10)
    assert drawn and all(isinstance(d["scale"], NeedsArguments) and d["x"].shape[-1] == 3 for d in drawn)


# -- the strategy ----------------------------------------------------------------------------------------


def test_inputs_for_refuses_what_is_not_a_rule():
    with pytest.raises(ArgumentError, match=r"inputs_for\(\): rule takes a fxrewrite.Rule, got .*function"):
        inputs_for(scaled_linear)  # type: ignore[arg-type]


def test_every_parameter_is_drawn_by_name_with_a_value_of_its_kind():
    drawn = draws(inputs_for(rule(scaled_linear)), 20)
    assert drawn
    for d in drawn:
        assert sorted(d) == ["lin", "s", "x"]
        assert isinstance(d["x"], torch.Tensor) and isinstance(d["lin"], nn.Linear) and isinstance(d["s"], float)
        assert d["x"].shape[-1] == d["lin"].in_features  # fitted to the module it is called on


def test_every_drawn_input_is_one_the_plan_accepts_and_the_guard_holds_on():
    r = rule(lambda x, y: x * y, where=lambda m: m["x"].shape == m["y"].shape and m["x"].dim() >= 1)
    plan = plan_inputs(r)
    drawn = draws(plan.strategy(), 30)
    assert drawn and all(_plan.accepts(plan, d) for d in drawn)
    assert all(d["x"].shape == d["y"].shape and d["x"].dim() >= 1 for d in drawn)


def test_the_declared_domain_bounds_what_is_drawn():
    domain = {"dtypes": (torch.float32,), "ranks": (0, 1), "sides": (1, 2), "min_value": -1.0, "max_value": 1.0,
              "special_values": False}
    drawn = draws(inputs_for(rule(lambda x: torch.neg(x), domain=domain)), 30)
    assert drawn and {d["x"].dtype for d in drawn} == {torch.float32}
    assert all(d["x"].dim() <= 1 and all(1 <= side <= 2 for side in d["x"].shape) for d in drawn)
    assert all(bool(d["x"].isfinite().all()) and bool((d["x"].abs() <= 1).all()) for d in drawn)
    assert any(d["x"].dim() == 0 for d in drawn)  # 0-d tensors are drawn where the domain allows them


def test_a_domain_bounded_on_one_side_by_infinity_draws_every_dtype():
    domain = {"dtypes": (torch.int64, torch.float32), "min_value": 0, "max_value": float("inf"),
              "special_values": False}
    drawn = draws(inputs_for(rule(lambda x: torch.neg(x), domain=domain)), 30)
    assert {d["x"].dtype for d in drawn} == {torch.int64, torch.float32}
    assert all(bool((d["x"] >= 0).all()) for d in drawn)
