"""A rule's domain and tolerance: typed values, validated where the rule is defined."""

from __future__ import annotations

import re

import attrs
import pytest
import torch
from torch import nn

import fxrewrite
from fxrewrite import Rule, RuleDefinitionError
from fxrewrite.analysis import _probe_dtypes, _probe_inputs, _probe_ranks
from fxrewrite.domain import DOMAIN_KEYS, Domain, Tolerance


def neg(x):
    return -x


def test_a_misspelt_domain_key_fails_at_definition_naming_rule_file_line_and_the_key_meant():
    with pytest.raises(RuleDefinitionError) as info:
        Rule.from_functions(neg, neg, name="negate", domain={"dtypez": (torch.float32,)})
    message = str(info.value)
    assert re.match(r"rule 'negate' \(.*test_domain\.py:\d+\): unknown domain key\(s\) \['dtypez'\]", message)
    assert "did you mean 'dtypes'?" in message


def test_the_decorator_validates_the_domain_when_the_rule_is_built():
    with pytest.raises(RuleDefinitionError, match=r"rule 'negate' .*did you mean 'ranks'\?"):
        @fxrewrite.rule(domain={"rank": (1, 2)})
        def negate(x):
            return -x

        @negate.replacement
        def negate(x):
            return -x


@pytest.mark.parametrize("domain, message", [
    ({"ranks": (3, 1)}, r"domain\['ranks'\] must be a \(min, max\) pair"),
    ({"dtypes": "float32"}, "sequence of torch dtypes"),
    ({"min_value": "0"}, r"domain\['min_value'\] must be a number or None"),
    ({"inputs": {"x": {"shape": "2x3"}}}, r"domain\['inputs'\]\['x'\]\['shape'\] must be a tuple of sizes"),
    ({"inputs": {"x": {"min_val": 0}}}, r"did you mean 'min_value'\?"),
    ({"modules": {"m": 3}}, "zero-argument factory"),
    ({"literals": {"x": [1]}}, r"'x' is a tensor parameter; move it to domain\['inputs'\]"),
    ("float32", "domain= takes a dict"),
])
def test_a_bad_domain_value_fails_at_definition(domain, message):
    with pytest.raises(RuleDefinitionError, match=message):
        Rule.from_functions(neg, neg, name="negate", domain=domain)


def test_a_misspelt_tolerance_key_fails_at_definition():
    with pytest.raises(RuleDefinitionError, match=r"rule 'negate' .*unknown tolerance key\(s\) \['atl'\] "
                                                  r"\(did you mean 'atol'\?\)"):
        Rule.from_functions(neg, neg, name="negate", tolerance={"atl": 1e-3})
    with pytest.raises(RuleDefinitionError, match=r"tolerance\['atol'\] must be a number >= 0"):
        Rule.from_functions(neg, neg, name="negate", tolerance={"atol": -1})


def test_a_declared_domain_is_a_typed_value_still_read_as_the_dict_declared():
    def add(x, n: int):
        return x + n

    declared = {"dtypes": [torch.float32], "ranks": (1, 2), "literals": {"n": (1, 2)}}
    r = Rule.from_functions(add, add, name="r", domain=declared, tolerance={"atol": 1e-3})
    assert isinstance(r.domain, Domain) and isinstance(r.tolerance, Tolerance)
    assert r.domain == declared and dict(r.domain) == declared and r.domain["literals"]["n"] == (1, 2)
    assert r.domain.dtypes == (torch.float32,) and r.domain.sides == (1, 3)  # typed, defaults filled in
    assert r.tolerance == {"atol": 1e-3} and r.tolerance.rtol is None and {**r.tolerance} == {"atol": 1e-3}


def test_evolve_validates_a_new_domain_too():
    r = Rule.from_functions(neg, neg, name="negate")
    assert r.domain is None and r.tolerance is None
    assert isinstance(attrs.evolve(r, domain={"ranks": (1, 1)}).domain, Domain)
    with pytest.raises(RuleDefinitionError, match=r"rule 'negate' .*did you mean 'sides'\?"):
        attrs.evolve(r, domain={"side": (1, 2)})


def test_domain_keys_are_the_domain_fields():
    assert set(DOMAIN_KEYS) == {f.name for f in attrs.fields(Domain)} - {"declared"}


def test_analysis_probes_with_the_typed_domain():
    r = Rule.from_functions(lambda x, y: x + y, lambda x, y: y + x, name="r",
                            domain={"dtypes": torch.float64, "ranks": (2, 3), "sides": (4, 5),
                                    "inputs": {"y": {"dtypes": (torch.int32,), "shape": (4,)}}})
    assert _probe_dtypes(r) == (torch.float64,)
    assert {ranks["x"] for ranks in _probe_ranks(r) if ranks["x"] == ranks["y"]} == {2, 3}
    inputs = _probe_inputs(r, torch.float64, {"x": 2, "y": 2}, {})
    assert inputs["x"].shape == (4, 4) and inputs["y"].shape == (4,) and inputs["y"].dtype == torch.int32


def test_a_module_factory_in_the_domain_is_checked_callable_not_called():
    calls = []

    def factory():
        calls.append(1)
        return nn.ReLU()

    def call(x, m: nn.ReLU):
        return m(x)

    r = Rule.from_functions(call, call, name="r", domain={"modules": {"m": factory}})
    assert r.domain.modules["m"] is factory and calls == []
