"""Numerics contracts: declared on the rule (``numerics=``), validated when it is built,
enforced by ``check_rule`` (fxrewrite/testing/_numerics.py) and shown in its reports."""

from __future__ import annotations

import pytest
import torch

from fxrewrite import Rule
from fxrewrite.errors import RuleDefinitionError
from fxrewrite.rule import describe_numerics, parse_numerics
from fxrewrite.testing import check_rule
from fxrewrite.testing._numerics import values_problem

F32 = {"dtypes": (torch.float32,)}


def _rule(pattern, replacement, numerics=None, **kw) -> Rule:  # type: ignore[no-untyped-def]
    return Rule.from_functions(pattern, replacement, name="r", numerics=numerics, **kw)


def _cast_twice(x, d1: torch.dtype, d2: torch.dtype):
    return x.to(d1).to(d2)


def _cast_once(x, d1: torch.dtype, d2: torch.dtype):
    return x.to(d2)


def _floats_only(m) -> bool:  # type: ignore[no-untyped-def]
    floats = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
    return m["x"].dtype in floats and m["d1"] in floats and m["d2"] in floats


# -- declaring ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("declared", "contract"), [
    ("bitwise", "bitwise"), ("ulp:3", "ulp:3"), (("ulp", 3), "ulp:3"), ("ULP 3", "ulp:3"),
    ("as-precise", "as-precise"), ("as_precise", "as-precise"), ("tolerance", "tolerance"), (None, None),
])
def test_numerics_is_kept_in_one_spelling(declared, contract):
    assert _rule(lambda x: x + 0.0, lambda x: x, declared).numerics == contract


@pytest.mark.parametrize("bad", ["exact", "ulp:-1", "ulp:x", 3, ("ulp",)])
def test_an_unknown_contract_is_an_error_naming_the_rule_and_the_spellings(bad):
    with pytest.raises(RuleDefinitionError, match=r"rule 'r' .*numerics= takes one of 'tolerance', 'bitwise', "
                                                   r"'ulp:K' .* or 'as-precise', got"):
        _rule(lambda x: x + 0.0, lambda x: x, bad)


def test_a_contract_and_a_tolerance_are_an_error():
    with pytest.raises(RuleDefinitionError, match=r"numerics='bitwise' and tolerance= both say how close"):
        _rule(lambda x: x + 0.0, lambda x: x, "bitwise", tolerance={"atol": 1e-3})


def test_the_decorator_takes_numerics_too():
    import fxrewrite

    @fxrewrite.rule(numerics="ulp:1")
    def add_zero(x):
        return x + 0.0

    @add_zero.replacement
    def add_zero(x):
        return x

    assert add_zero.numerics == "ulp:1"


def test_describe_numerics_says_what_the_contract_promises():
    def rule(**kw):  # type: ignore[no-untyped-def]
        return _rule(lambda x: x * 1.0, lambda x: x, **kw)

    assert describe_numerics(rule(numerics="bitwise")).startswith("bitwise (the very same values")
    assert describe_numerics(rule(tolerance={"atol": 1e-3})) == "tolerance (values within the declared {'atol': 0.001})"
    assert describe_numerics(rule()).startswith("tolerance (values within the declared tolerance, or assert_close")
    assert "within 4 units in the last place" in describe_numerics(rule(numerics="ulp:4"))
    assert parse_numerics(None, "r") is None


# -- enforcing ---------------------------------------------------------------------------------


def test_bitwise_tells_the_sign_of_zero():
    rule = _rule(lambda x: x + 0.0, lambda x: x, "bitwise", domain=F32)
    problem = values_problem(rule, {}, torch.tensor([0.0, 1.0]), torch.tensor([-0.0, 1.0]), None, None)
    assert problem is not None and problem.startswith("values differ in the sign of zero at 1 of 2 elements")


def test_bitwise_equal_nans_are_equal():
    rule = _rule(lambda x: x + 0.0, lambda x: x, "bitwise")
    nan = torch.tensor([float("nan"), 2.0])
    assert values_problem(rule, {}, nan, nan.clone(), None, None) is None


def test_ulp_counts_units_in_the_last_place_of_the_patterns_value():
    rule = _rule(lambda x: x + 0.0, lambda x: x, "ulp:1")
    one = torch.tensor([1.0])
    above = torch.nextafter(one, torch.tensor([2.0]))
    assert values_problem(rule, {}, one, above, None, None) is None
    two_up = torch.nextafter(above, torch.tensor([2.0]))
    problem = values_problem(rule, {}, one, two_up, None, None)
    assert problem is not None and "values differ by more than 1 ulp" in problem and "(2 ulp)" in problem


def test_ulp_never_lets_inf_equal_a_finite_value():
    rule = _rule(lambda x: x + 0.0, lambda x: x, "ulp:1000")
    problem = values_problem(rule, {}, torch.tensor([float("inf")]), torch.tensor([3.0e38]), None, None)
    assert problem is not None and "values differ" in problem


def test_a_contract_keeps_shape_and_dtype_problems_as_they_are():
    rule = _rule(lambda x: x + 0.0, lambda x: x, "ulp:1")
    problem = values_problem(rule, {}, torch.zeros(2), torch.zeros(2, dtype=torch.float64), None, None)
    assert problem is not None and "dtypes differ" in problem


@pytest.mark.slow
def test_bf16_then_f16_is_unsound_bitwise_and_under_the_default_tolerance():
    buggy = _rule(_cast_twice, _cast_once, where=_floats_only)  # Inductor's pointless_convert, torch 2.13
    assert check_rule(buggy, repair=False).verdict == "unsound"
    assert check_rule(_rule(_cast_twice, _cast_once, "bitwise", where=_floats_only), repair=False).verdict == "unsound"


@pytest.mark.slow
def test_collapsing_two_casts_is_at_least_as_precise():
    # x -> d2 directly is the nearest d2 value to x: never less precise than through d1
    result = check_rule(_rule(_cast_twice, _cast_once, "as-precise", where=_floats_only), repair=False)
    assert result.ok, result.message
    assert "numerics:    as-precise" in result.message


def test_as_precise_rejects_a_less_precise_replacement():
    worse = _rule(lambda x: x * 3.0, lambda x: (x.to(torch.float16) * 3.0).to(x.dtype), "as-precise",
                  domain={"dtypes": (torch.float32,), "special_values": False, "min_value": -100.0,
                          "max_value": 100.0})
    result = check_rule(worse, max_examples=50, repair=False)
    assert result.verdict == "unsound", result.message
    assert "less precise" in result.counterexamples[0].problem and "numerics as-precise" in result.message


def test_the_unsound_report_names_the_contract():
    result = check_rule(_rule(lambda x: x * 1.0, lambda x: x + 1e-3, "ulp:2", domain=F32), max_examples=30,
                        repair=False)
    assert result.verdict == "unsound"
    assert "  numerics:    ulp:2 (every value within 2 units in the last place" in result.message
