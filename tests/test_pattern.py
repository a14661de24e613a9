"""Tracing a rule's pattern (``fxrewrite.pattern``): parameters and their kinds, outputs and the
anchor, the nodes that compute Python values, and the patterns refused when a rule is built."""

from __future__ import annotations

import math
import re
from typing import Annotated

import pytest
import torch
import torch.nn as nn

import fxrewrite
from fxrewrite import Rule
from fxrewrite.errors import RuleDefinitionError
from fxrewrite.pattern import Accept, trace_pattern


def traced(fn):
    return trace_pattern(fn, rule_name="p", origin="<test>:1")


def test_parameters_are_variables_literal_captures_or_module_captures():
    def pattern(x, s: float, d: torch.dtype, conv: nn.Conv2d):
        return conv(x).to(d) * s

    p = traced(pattern)
    assert [(q.name, q.kind) for q in p.params] == [("x", "tensor"), ("s", "literal"), ("d", "literal"),
                                                     ("conv", "module")]
    assert p.anchor.target is __import__("operator").mul and p.anchor_key == ("aten", "mul")


def test_annotated_module_captures_say_what_else_they_accept():
    def pattern(x, lin: Annotated[nn.Linear, fxrewrite.Accept(hooks=True)]):
        return torch.relu(lin(x))

    (_, lin) = traced(pattern).params
    assert lin.kind == "module" and lin.annotation is nn.Linear and lin.accept == Accept(hooks=True)


def test_size_and_dtype_expressions_are_value_nodes_and_not_anchor_inputs():
    p = traced(lambda q, k: (q @ k) / math.sqrt(q.size(-1)))
    assert sorted(n.name for n in p.value_nodes) == ["size", "sqrt"]
    assert ("aten", "matmul") in p.anchor_input_keys and ("aten", "size") not in p.anchor_input_keys


def test_multi_output_patterns_anchor_at_their_last_output():
    def pattern(x):
        return torch.sin(x), torch.cos(x)

    p = traced(pattern)
    assert p.is_multi_output and p.anchor.target is torch.cos


@pytest.mark.parametrize("fn, fragment", [
    (lambda x: x, "returns its parameter 'x' unchanged"),
    (lambda x: x.add_(1), "in-place method"),
    (lambda x, y: torch.relu(x), "pattern parameter 'y' is never used"),
    (lambda x: torch.relu(x) if x.sum() > 0 else x, "cannot be traced"),
])
def test_patterns_that_cannot_be_matched_are_refused_when_built(fn, fragment):
    with pytest.raises(RuleDefinitionError, match=fragment):
        traced(fn)


def test_a_pattern_that_changes_global_state_leaves_no_trace():
    def pattern(x):
        torch.set_default_dtype(torch.float64)
        return torch.relu(x)

    before = torch.get_default_dtype()
    traced(pattern)
    assert torch.get_default_dtype() == before


@pytest.mark.parametrize("pattern, fragments", [
    (lambda x: torch.relu(x) if x.sum() > 0 else x, ["control flow", "where= guard", "torch.fx.wrap"]),
    (lambda x: torch.relu(x) if x.shape[0] > 2 else x, ["control flow", "where= guard"]),
    (lambda x: sum(t for t in x), ["Proxy object cannot be iterated", "cannot branch or loop"]),
    (lambda x: x.view(len(x), -1), ["'len' is not supported in symbolic tracing", "torch.fx.wrap"]),
    (lambda x: x * int(x), ["TypeError: int() argument must be", "torch operations on its parameters only"]),
    # RUF015's next(...) would be another pattern: this one must build the list to fail the way it does
    (lambda x: [x[i] for i in range(x.size(0))][0], ["'Proxy' object cannot be interpreted as an integer"]),  # noqa: RUF015
    (lambda x: x + torch.ones(3), ["tensor constant", "Pass the value as a parameter instead"]),
    (lambda x: torch.relu(x).add_(1), ["in-place method '.add_()'", "patterns must be pure"]),
    (lambda x: x + torch.rand_like(x), ["has a side effect"]),
])
def test_untraceable_or_impure_pattern_is_a_definition_error_naming_rule_and_origin(pattern, fragments):
    with pytest.raises(RuleDefinitionError) as info:
        Rule.from_functions(pattern, lambda x: x, name="bad")
    message = str(info.value)
    assert message.startswith("rule 'bad' (") and "test_pattern.py:" in message
    for fragment in fragments:
        assert fragment in message


# ---- optional literal captures ----------------------------------------------------------------


def _clamp_twice(x, lo: float | None, hi: float | None):
    return torch.clamp(torch.clamp(x, lo, hi), lo, hi)


def test_an_optional_literal_capture_binds_a_number_or_none():
    rule = Rule.from_functions(_clamp_twice, lambda x, lo, hi: torch.clamp(x, lo, hi), name="clamp_twice")
    lo = next(p for p in rule.compiled.params if p.name == "lo")
    assert (lo.kind, lo.annotation, lo.optional) == ("literal", float, True)
    assert lo.accepts_literal(None) and lo.accepts_literal(0.5) and not lo.accepts_literal("a")
    program = lambda a: a.clamp(min=0.0).clamp(min=0.0)  # noqa: E731 - a one-line program
    result = fxrewrite.rewrite(program, rule)
    assert result.report.applied["clamp_twice"] == 1
    x = torch.randn(5)
    result.module.graph.lint()
    torch.testing.assert_close(result.module(x), program(x))


def test_a_plain_literal_capture_does_not_bind_none():
    plain = Rule.from_functions(lambda x, lo: torch.clamp(torch.clamp(x, lo, None), lo, None),
                                lambda x, lo: torch.clamp(x, lo, None), name="plain")
    (_, lo) = plain.compiled.params
    assert not lo.optional and not lo.accepts_literal(None)


def test_an_optional_capture_of_something_else_than_a_literal_type_is_an_error():
    def pattern(x, m: nn.Linear | None):
        return x

    with pytest.raises(RuleDefinitionError, match=re.escape("'| None', for a capture that may also bind None")):
        trace_pattern(pattern, rule_name="r", origin="<test>")
