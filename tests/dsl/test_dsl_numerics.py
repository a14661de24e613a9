"""The ``numerics`` line of a rule file: the rule's numerics contract, as ``numerics=`` in Python."""

from __future__ import annotations

import pytest
import torch

import fxrewrite
from fxrewrite.errors import RuleDefinitionError
from fxrewrite.testing import check_rule


def _rule(lines: str) -> fxrewrite.Rule:
    return fxrewrite.parse_rules(f"rule r:\n    x * 1.0 => x\n    {lines}\n")["r"]


@pytest.mark.parametrize(("line", "contract"), [
    ("numerics bitwise", "bitwise"),
    ("numerics ulp 2", "ulp:2"),
    ("numerics as_precise", "as-precise"),
    ("numerics tolerance", "tolerance"),
])
def test_a_numerics_line_declares_the_contract(line, contract):
    assert _rule(line).numerics == contract


def test_a_rule_without_a_numerics_line_has_none():
    assert _rule("domain dtypes=(torch.float32,)").numerics is None


def test_a_numerics_line_goes_with_domain_lines():
    rule = _rule("numerics bitwise\n    domain dtypes=(torch.float32,)")
    assert rule.numerics == "bitwise" and rule.domain == {"dtypes": (torch.float32,)}


def test_an_unknown_contract_is_an_error_with_line_and_spellings():
    with pytest.raises(RuleDefinitionError, match=r"<string>:3:5: rule 'r': unknown numerics contract 'bogus'; "
                                                   r"write 'numerics tolerance', 'numerics bitwise'"):
        _rule("numerics bogus")


def test_numerics_declared_twice_is_an_error():
    with pytest.raises(RuleDefinitionError, match=r"numerics is declared twice \(lines 3 and 4\)"):
        _rule("numerics bitwise\n    numerics ulp 1")


def test_a_contract_and_a_tolerance_line_are_an_error():
    with pytest.raises(RuleDefinitionError, match=r"numerics ulp 2 and a tolerance line both say how close"):
        _rule("numerics ulp 2\n    tolerance atol=1e-3")


@pytest.mark.slow  # property-checks rules under their contracts: 1.5 s of CPU
def test_the_checker_enforces_a_contract_written_in_the_dsl():
    exact = fxrewrite.parse_rules(
        "rule add_zero:\n    x + 0.0 => x\n    numerics bitwise\n    domain dtypes=(torch.float32,)\n")["add_zero"]
    result = check_rule(exact, max_examples=60, repair=False)
    assert result.verdict == "unsound"  # -0.0 + 0.0 is 0.0: the sign of zero differs
    assert "sign of zero" in result.message and "numerics:    bitwise" in result.message
