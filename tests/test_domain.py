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
from fxrewrite.domain import DOMAIN_KEYS, DependentFactory, Domain, Tolerance, factory_needs


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


def conv_then_norm(x, conv: nn.Conv2d, bn: nn.BatchNorm2d):
    return bn(conv(x))


def test_a_module_factory_may_name_another_module_capture():
    def norm_after(conv, eps=1e-3):  # a parameter with a default is not a capture's name
        return nn.BatchNorm2d(conv.out_channels, eps=eps)

    r = Rule.from_functions(conv_then_norm, conv_then_norm, name="r",
                            domain={"modules": {"conv": lambda: nn.Conv2d(2, 5, 1), "bn": norm_after}})
    factory = r.domain.modules["bn"]
    assert isinstance(factory, DependentFactory) and factory.needs == ("conv",) and factory.make is norm_after
    assert r.domain["modules"]["bn"] is norm_after  # the mapping is what was declared
    assert factory(conv=nn.Conv2d(1, 3, 1)).num_features == 3  # the module drawn for 'conv', by name
    assert factory().num_features == 5  # called alone, it builds 'conv' from its own factory first
    assert factory_needs(norm_after) == ("conv",) and factory_needs(nn.ReLU) == ()


@pytest.mark.parametrize("modules, message", [
    ({"conv": lambda: nn.Conv2d(2, 4, 1), "bn": lambda cnv: nn.BatchNorm2d(4)},
     r"rule 'r' .*: the factory of domain\['modules'\]\['bn'\] takes 'cnv', .*'cnv' is not a parameter of the rule "
     r"\(its module captures: \['bn', 'conv'\]\); rename the parameter after one of them or give it a default"),
    ({"conv": lambda: nn.Conv2d(2, 4, 1), "bn": lambda x: nn.BatchNorm2d(x.shape[1])},
     r"takes 'x', .*'x' is a tensor parameter, drawn after the modules"),
    ({"conv": lambda bn: nn.Conv2d(2, bn.num_features, 1), "bn": lambda conv: nn.BatchNorm2d(conv.out_channels)},
     r"rule 'r' .*: the factories of domain\['modules'\] name each other in a cycle \('conv' -> 'bn' -> 'conv'\), "
     r"so none of them can be drawn first; make one of them build its module without the others"),
    ({"conv": lambda conv: conv, "bn": lambda: nn.BatchNorm2d(4)},
     r"the factory of domain\['modules'\]\['conv'\] names its own capture"),
])
def test_a_module_factory_naming_what_it_cannot_receive_fails_at_definition(modules, message):
    with pytest.raises(RuleDefinitionError, match=message):
        Rule.from_functions(conv_then_norm, conv_then_norm, name="r", domain={"modules": modules})


def conv_alone(x, conv: nn.Conv2d):
    return conv(x)


def test_a_factory_for_a_name_the_rule_does_not_capture_is_ignored_as_other_names_are():
    shared = {"modules": {"conv": lambda: nn.Conv2d(2, 4, 1), "other": lambda elsewhere: elsewhere}}
    r = Rule.from_functions(conv_alone, conv_alone, name="r", domain=shared)
    assert isinstance(r.domain.modules["other"], DependentFactory)
