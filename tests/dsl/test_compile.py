"""fxrewrite.dsl.compile: the domain line's values are validated where they are written."""

from __future__ import annotations

import pytest

from fxrewrite import RuleDefinitionError
from fxrewrite.domain import Domain
from fxrewrite.dsl import parse_rules


def refused(text: str) -> str:
    with pytest.raises(RuleDefinitionError) as info:
        parse_rules(text, source="decl.fxr")
    return str(info.value)


@pytest.mark.parametrize("line, message", [
    ("domain ranks = (3, 1)", "domain['ranks'] must be a (min, max) pair"),
    ("domain sides = (0, 2)", "domain['sides'] must start at 1"),
    ("domain shapes = 'same'", "domain['shapes'] is 'broadcast' or 'equal'"),
    ("domain special_values = 1", "domain['special_values'] must be True or False"),
    ("domain x: min_value = 'a'", "domain['inputs']['x']['min_value'] must be a number or None"),
    ("domain x: shape = 3", "domain['inputs']['x']['shape'] must be a tuple of sizes"),
])
def test_a_bad_domain_value_is_an_error_at_its_line(line, message):
    text = refused(f"rule r:\n    x * 1 => x\n    {line}\n")
    assert text.startswith("decl.fxr:3:") and "rule 'r': " + message in text
    assert line in text  # the line is shown, with a caret


def test_a_domain_line_makes_a_typed_domain():
    (rule,) = parse_rules("rule r:\n    x * 1 => x\n    domain ranks = (1, 2)\n    domain x: shape = (2,)\n")
    assert isinstance(rule.domain, Domain)
    assert rule.domain.ranks == (1, 2) and rule.domain.tensor_domain("x").shape == (2,)
