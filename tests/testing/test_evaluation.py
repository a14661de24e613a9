"""fxrewrite.testing._evaluation: one input, both sides."""

from __future__ import annotations

import pytest
import torch

from fxrewrite import Rule
from fxrewrite.testing import Tolerance, evaluate
from fxrewrite.testing.equivalence import PatternRaised


def rule(pattern, replacement, name="r", **kw):
    return Rule.from_functions(pattern, replacement, name=name, **kw)


DIV_SELF = rule(lambda x: x / x, lambda x: torch.ones_like(x), name="div_self")


def test_inputs_are_not_modified_by_the_check():
    x = torch.zeros(2)
    counterexample = evaluate(DIV_SELF, {"x": x})
    assert counterexample.kind == "values" and torch.equal(x, torch.zeros(2))


def test_agreeing_sides_are_no_counterexample():
    assert evaluate(DIV_SELF, {"x": torch.tensor([2.0, 3.0])}) is None


def test_a_pattern_that_raises_puts_the_input_outside_the_domain():
    mm = rule(lambda x: torch.mm(x, x), lambda x: x @ x, name="mm")
    with pytest.raises(PatternRaised, match="the pattern of rule 'mm' raises on these inputs"):
        evaluate(mm, {"x": torch.ones(3)})


def test_a_replacement_that_raises_is_a_counterexample_carrying_the_error():
    found = evaluate(rule(lambda x: -x, lambda x: torch.mm(x, x), name="mm"), {"x": torch.ones(3)})
    assert found.kind == "raises" and isinstance(found.replacement_error, RuntimeError)
    assert found.problem.startswith("the replacement raised RuntimeError: ")


def test_the_tolerance_decides_what_differs():
    close = rule(lambda x: x * 1.0, lambda x: x + 1e-3, name="close")
    assert evaluate(close, {"x": torch.ones(2)}) is not None
    assert evaluate(close, {"x": torch.ones(2)}, Tolerance(atol=1e-2)) is None


def test_inputs_modified_differently_are_a_mutation_counterexample():
    def replacement(x):
        return x.add_(1)  # the same values, but written into x

    found = evaluate(rule(lambda x: x + 1, replacement, name="add_"), {"x": torch.zeros(2)})
    assert found.kind == "mutation" and "leave input 'x' modified differently" in found.problem


def test_an_output_aliasing_an_input_on_one_side_only_is_a_note():
    notes = {}
    assert evaluate(rule(lambda x: x.contiguous(), lambda x: x.clone(), name="c"), {"x": torch.ones(2)},
                    notes=notes) is None
    assert notes["aliasing"].startswith("the replacement's output is a new tensor where the pattern's shares the "
                                        "storage of input 'x'")
