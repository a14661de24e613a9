"""fxrewrite.testing.equivalence (check_rule): verdicts, shrinking, guards, declarations, arguments."""

from __future__ import annotations

import math
import re

import pytest
import torch
from _helpers import folded_conv
from torch import nn

from fxrewrite import Rule
from fxrewrite.errors import NotEquivalent, RuleDefinitionError, RuleWarning
from fxrewrite.testing import CheckResult, Tolerance, assert_rule_equivalent, check_rule, inputs_for

EXAMPLES = 60


def rule(pattern, replacement, name="r", **kw):
    return Rule.from_functions(pattern, replacement, name=name, **kw)


DOUBLE_NEG = rule(lambda x: torch.neg(torch.neg(x)), lambda x: x, name="double_neg")
DIV_SELF = rule(lambda x: x / x, lambda x: torch.ones_like(x), name="div_self")
FLOATS = {"dtypes": (torch.float32, torch.float64)}


# -- verdicts ---------------------------------------------------------------------------------


def test_a_sound_rule_passes_every_example():
    result = check_rule(DOUBLE_NEG, max_examples=EXAMPLES)
    assert isinstance(result, CheckResult)
    assert result.ok and result.verdict == "sound" and result.counterexample is None
    assert result.examples_run >= EXAMPLES and result.seconds > 0
    assert result.message.startswith(f"rule 'double_neg' is sound on {result.examples_run} examples")


@pytest.mark.slow
def test_an_unsound_rule_gets_a_counterexample_shrunk_to_one_element():
    result = check_rule(DIV_SELF, max_examples=EXAMPLES)
    assert not result.ok and result.verdict == "unsound"
    x = result.counterexample["x"]
    assert x.numel() == 1 and x.dtype == torch.float32 and x.item() == 0.0
    assert 1 <= result.examples_run <= EXAMPLES


@pytest.mark.slow
def test_special_values_are_found():
    mul_zero = rule(lambda x: x * 0.0, lambda x: torch.zeros_like(x), name="mul_zero",
                    domain={"dtypes": (torch.float32,)})
    x = check_rule(mul_zero, max_examples=EXAMPLES).counterexample["x"]
    assert x.numel() == 1 and not math.isfinite(x.item())


@pytest.mark.slow
def test_one_counterexample_per_kind_of_difference():
    mul_zero = rule(lambda x: x * 0, lambda x: torch.zeros_like(x), name="mul_zero")
    result = check_rule(mul_zero, max_examples=100)
    kinds = [c.kind for c in result.counterexamples]
    assert kinds == ["values", "dtype"]
    assert result.counterexamples[1].inputs["x"].dtype == torch.bool
    assert "another counterexample: the replacement returns a different dtype" in result.message


@pytest.mark.slow
def test_broadcasting_differences_are_found():
    with pytest.warns(RuleWarning, match="the replacement ignores 'y'"):  # which is what the search must show
        add_sub = rule(lambda x, y: x + y - y, lambda x, y: x, name="add_sub",
                       domain={**FLOATS, "special_values": False, "min_value": -100, "max_value": 100})
    result = check_rule(add_sub, max_examples=100)
    shape = next(c for c in result.counterexamples if c.kind == "shape")
    assert shape.inputs["x"].dim() < shape.inputs["y"].dim() or shape.inputs["x"].shape != shape.inputs["y"].shape
    assert "shapes differ: pattern" in shape.problem


@pytest.mark.slow
def test_a_replacement_that_raises_is_a_counterexample():
    def replacement(x):
        return torch.mm(x.reshape(-1), x)  # mm needs matrices

    result = check_rule(rule(lambda x: torch.neg(x), replacement, name="mm"), max_examples=EXAMPLES)
    assert result.verdict == "unsound"
    assert result.message.startswith("rule 'mm' is unsound: the replacement raises where the pattern does not")
    assert "replacement -> raised RuntimeError:" in result.message


def test_the_random_generator_is_seeded_identically_for_both_sides():
    def pattern(x, drop: nn.Dropout):
        return drop(x)

    def replacement(x, drop: nn.Dropout):
        return nn.functional.dropout(x, drop.p, training=drop.training)

    dropout = rule(pattern, replacement, name="dropout",
                   domain={**FLOATS, "modules": {"drop": lambda: nn.Dropout(0.5).train()}})
    assert check_rule(dropout, max_examples=30).ok


# -- declarations: tolerance, domain, guards ----------------------------------------------------


GELU_TANH = dict(pattern=lambda x: nn.functional.gelu(x),
                 replacement=lambda x: nn.functional.gelu(x, approximate="tanh"),
                 name="gelu_tanh")
MODERATE_FLOATS = {**FLOATS, "special_values": False, "min_value": -1e3, "max_value": 1e3}


@pytest.mark.slow
def test_a_declared_tolerance_makes_an_approximation_sound():
    assert not check_rule(rule(**GELU_TANH, domain=MODERATE_FLOATS), max_examples=EXAMPLES).ok
    assert check_rule(rule(**GELU_TANH, domain=MODERATE_FLOATS, tolerance={"atol": 1e-3}), max_examples=EXAMPLES).ok


@pytest.mark.slow
def test_a_declared_domain_restricts_the_inputs():
    mul_one = dict(pattern=lambda x: x * 1, replacement=lambda x: x, name="mul_one")
    assert not check_rule(rule(**mul_one), max_examples=EXAMPLES).ok  # bool * 1 is int64
    assert check_rule(rule(**mul_one, domain=FLOATS), max_examples=EXAMPLES).ok


@pytest.mark.slow
def test_a_rule_unsound_only_where_its_guard_is_false_passes():
    floor_one = dict(pattern=lambda x: x // 1, replacement=lambda x: x, name="floor_one")
    assert not check_rule(rule(**floor_one), max_examples=EXAMPLES).ok
    integers = rule(**floor_one, where=lambda m: m["x"].dtype in (torch.int64, torch.int32, torch.uint8))
    assert check_rule(integers, max_examples=EXAMPLES).ok


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::fxrewrite.RuleWarning")  # a rule that ignores a bound tensor on purpose
def test_guards_on_shapes_are_respected():
    add_sub = dict(pattern=lambda x, y: x + y - y, replacement=lambda x, y: x, name="add_sub",
                   domain={**FLOATS, "special_values": False, "min_value": -10, "max_value": 10, "mixed_dtypes": False})
    guarded = rule(**add_sub, where=lambda m: m["x"].shape == torch.broadcast_shapes(m["x"].shape, m["y"].shape),
                   tolerance={"atol": 1e-4})
    assert check_rule(guarded, max_examples=EXAMPLES).ok


@pytest.mark.slow  # 1.2-1.4 s of CPU (it was so before the split)
def test_a_guard_that_raises_is_an_error_with_the_inputs():
    crashing = rule(lambda x: torch.neg(x), lambda x: torch.neg(x), name="crashing",
                    where=lambda m: m["x"].shape[0] > 1)
    result = check_rule(crashing, max_examples=EXAMPLES)
    assert result.verdict == "error" and not result.ok
    assert "has a guard that raises on inputs the pattern accepts" in result.message
    assert "raised IndexError" in result.message and "    x = torch.tensor(" in result.message


@pytest.mark.slow
def test_a_rule_whose_pattern_never_runs_is_untestable():
    never = rule(lambda x: torch.mm(x, x), lambda x: x @ x, name="never", domain={"ranks": (0, 1)})
    result = check_rule(never, max_examples=20)
    assert result.verdict == "untestable" and not result.ok
    assert "could not be tested" in result.message and "RuntimeError" in result.message


def test_a_malformed_declaration_is_an_error_that_names_it():
    # the domain and the tolerance are typed values (fxrewrite.domain): the rule is refused where it is built
    with pytest.raises(RuleDefinitionError, match=re.escape("unknown domain key(s) ['rank']")):
        rule(lambda x: -x, lambda x: -x, name="bad", domain={"rank": (1, 2)})
    with pytest.raises(RuleDefinitionError, match=re.escape("tolerance['atol'] must be a number >= 0")):
        rule(lambda x: -x, lambda x: -x, name="bad", tolerance={"atol": -1})


class Scaled(nn.Module):
    """A module the checker cannot build by itself (its constructor needs k)."""

    def __init__(self, k):
        super().__init__()
        self.k = k

    def forward(self, x):
        return x * self.k


def test_a_rule_whose_inputs_cannot_be_planned_is_an_error_that_says_what_to_declare():
    def pattern(x, m: Scaled):
        return m(x)

    result = check_rule(rule(pattern, lambda x, m: m(x), name="scaled"), max_examples=5)
    assert result.verdict == "error" and result.message.startswith("rule 'scaled' (")
    assert "cannot be checked: " in result.message and "declare a factory: domain={'modules'" in result.message


def test_tolerance_parsing():
    assert Tolerance.parse(None, where="r") == Tolerance()
    assert Tolerance.parse({"rtol": 1e-3}, where="r") == Tolerance(rtol=1e-3)
    with pytest.raises(ValueError, match=r"unknown tolerance key\(s\) \['abs'\]"):
        Tolerance.parse({"abs": 1}, where="r")


# -- modules ----------------------------------------------------------------------------------


def conv_bn_pattern(x, conv: nn.Conv2d, bn: nn.BatchNorm2d):
    return bn(conv(x))


CONV_BN = dict(domain={"dtypes": (torch.float32,), "special_values": False, "min_value": -10, "max_value": 10},
               tolerance={"rtol": 1e-4, "atol": 1e-4})


def test_conv_bn_folding_is_sound_on_default_modules():
    good = rule(conv_bn_pattern, lambda x, conv, bn: folded_conv(conv, bn)(x), name="conv_bn", **CONV_BN)
    result = check_rule(good, max_examples=40)
    assert result.ok, result.message


@pytest.mark.slow
def test_conv_bn_folding_that_drops_the_conv_bias_is_caught():
    bad = rule(conv_bn_pattern, lambda x, conv, bn: folded_conv(conv, bn, with_bias=False)(x), name="conv_bn_bad",
               **CONV_BN)
    result = check_rule(bad, max_examples=40)
    assert result.verdict == "unsound"
    assert result.counterexample["conv"].bias is not None
    assert "    conv.bias = torch.tensor(" in result.message and "    bn.running_mean = torch.tensor(" in result.message


# -- assert_rule_equivalent -------------------------------------------------------------------


@pytest.mark.slow
def test_assert_rule_equivalent_raises_not_equivalent_with_the_report():
    with pytest.raises(NotEquivalent) as info:
        assert_rule_equivalent(DIV_SELF, max_examples=EXAMPLES)
    assert str(info.value) == check_rule(DIV_SELF, max_examples=EXAMPLES).message
    assert isinstance(info.value, AssertionError)


def test_assert_rule_equivalent_returns_the_result_of_a_sound_rule():
    assert assert_rule_equivalent(DOUBLE_NEG, max_examples=10).examples_run >= 10


@pytest.mark.parametrize("call, fragment", [
    (lambda: check_rule(None), "check_rule(): rule takes a fxrewrite.Rule"),
    (lambda: check_rule("neg_neg"), "check_rule(): rule takes a fxrewrite.Rule"),
    (lambda: check_rule(_double_neg(), max_examples=0), "max_examples= takes a number of examples >= 1"),
    (lambda: check_rule(_double_neg(), seed="x"), "seed= takes an int or None"),
    (lambda: assert_rule_equivalent(None), "assert_rule_equivalent(): rule takes a fxrewrite.Rule"),
    (lambda: inputs_for(None), "inputs_for(): rule takes a fxrewrite.Rule"),
])
def test_a_bad_argument_is_an_argument_error_naming_it(call, fragment):
    from fxrewrite import ArgumentError

    with pytest.raises(ArgumentError, match=re.escape(fragment)):
        call()


def _double_neg():
    return Rule.from_functions(lambda x: torch.neg(torch.neg(x)), lambda x: x, name="neg_neg")


@pytest.mark.slow
def test_the_checker_draws_none_for_an_optional_capture():
    def pattern(x, lo: float | None, hi: float | None):
        return torch.clamp(torch.clamp(x, lo, hi), lo, hi)

    def wrong_without_hi(x, lo: float | None, hi: float | None):
        return torch.clamp(x, lo, 1.0 if hi is None else hi)  # makes up a bound where there is none

    sound = check_rule(Rule.from_functions(pattern, lambda x, lo, hi: torch.clamp(x, lo, hi), name="ok"),
                       max_examples=60)
    assert sound.ok, sound
    found = check_rule(Rule.from_functions(pattern, wrong_without_hi, name="bad"), max_examples=60)
    assert not found.ok and found.counterexample["hi"] is None
