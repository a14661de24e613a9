"""fxrewrite.testing._report: the verdict and counterexample values, and the words of the reports.

(The mirror of fxrewrite/testing/_report.py; named apart from tests/test_report.py, the mirror of
fxrewrite/report.py, because pytest imports test files by their base name.)
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from fxrewrite import Rule
from fxrewrite.testing import CheckResult, Counterexample, check_rule
from fxrewrite.testing._report import KEY_ORDER, cannot_check_report, first_line, flaky_report

EXAMPLES = 60


def rule(pattern, replacement, name="r", **kw):
    return Rule.from_functions(pattern, replacement, name=name, **kw)


DIV_SELF = rule(lambda x: x / x, lambda x: torch.ones_like(x), name="div_self")


# -- the values ---------------------------------------------------------------------------------


@pytest.mark.parametrize("problem, error, kind", [
    ("values differ at 1 of 2 elements", None, "values"),
    ("shapes differ: pattern (2,), replacement (1,)", None, "shape"),
    ("dtypes differ: pattern torch.float32, replacement torch.int64", None, "dtype"),
    ("the pattern returns a tuple of 2, the replacement a tensor", None, "structure"),
    ("the two sides leave input 'x' modified differently (in-place operations): values differ", None, "mutation"),
    ("the replacement raised RuntimeError: boom", RuntimeError("boom"), "raises"),
])
def test_a_counterexample_is_of_the_kind_its_problem_names(problem, error, kind):
    found = Counterexample({"x": torch.ones(2)}, problem, torch.ones(2), None, error)
    assert found.kind == kind and found.headline.startswith("the ")


def test_differing_values_are_split_by_whether_an_output_is_finite():
    finite = Counterexample({}, "values differ at 1 of 1 elements", torch.tensor(1.0), torch.tensor(2.0))
    nan = Counterexample({}, "values differ at 1 of 1 elements", torch.tensor(float("nan")), torch.tensor(2.0))
    inf_in_a_tuple = Counterexample({}, "values differ", (torch.tensor(1.0), torch.tensor(float("inf"))), None)
    assert (finite.key, nan.key, inf_in_a_tuple.key) == ("values:finite", "values", "values")
    assert KEY_ORDER.index("values") < KEY_ORDER.index("values:finite") < KEY_ORDER.index("shape")


def test_a_result_is_ok_only_when_sound_and_shows_its_first_counterexample():
    found = Counterexample({"x": torch.zeros(1)}, "values differ")
    unsound = CheckResult("r", "f.py:1", "unsound", 3, 0.1, "m", (found,))
    assert not unsound.ok and unsound.counterexample is found.inputs
    assert CheckResult("r", "f.py:1", "sound", 3, 0.1, "m").ok
    assert CheckResult("r", "f.py:1", "sound", 3, 0.1, "m").counterexample is None


def test_one_line_reports_name_the_rule_and_where_it_is():
    r = DIV_SELF
    expected = f"rule 'div_self' ({r.origin}) cannot be checked: bad domain"
    assert cannot_check_report(r, ValueError("bad domain")) == expected
    assert flaky_report(r, ValueError()).startswith(f"rule 'div_self' ({r.origin}) cannot be checked: it is not "
                                                    f"deterministic")
    assert first_line(ValueError("one\ntwo")) == "one" and first_line(ValueError()) == ""


# -- the reports of check_rule ------------------------------------------------------------------


@pytest.mark.slow
def test_report_shows_inputs_outputs_difference_and_where_the_rule_is():
    message = check_rule(DIV_SELF, max_examples=EXAMPLES).message
    lines = message.splitlines()
    assert lines[0] == ("rule 'div_self' is unsound: the replacement computes different values "
                        "(and 1 more kind of difference below)")
    assert lines[1].startswith("  rule:        div_self at ") and f"{Path(__file__).name}:" in lines[1]
    assert "    x = torch.tensor(0.0, dtype=torch.float32)  # shape ()" in lines
    assert "  pattern     -> torch.tensor(nan, dtype=torch.float32)  # shape ()" in lines
    assert "  replacement -> torch.tensor(1.0, dtype=torch.float32)  # shape ()" in lines
    assert ("  difference:  values differ at 1 of 1 elements (rtol=1.3e-06, atol=1e-05): at index () pattern nan, "
            "replacement 1.0") in lines
    assert any(line.startswith("  search:      first counterexample after ") for line in lines)
    assert lines[-1].startswith("  fix:")


@pytest.mark.slow
def test_report_shows_the_declared_tolerance_and_domain():
    gelu = rule(lambda x: nn.functional.gelu(x), lambda x: nn.functional.gelu(x, approximate="tanh"), name="gelu_tanh",
                tolerance={"atol": 1e-5}, domain={"dtypes": (torch.float64,), "special_values": False})
    message = check_rule(gelu, max_examples=EXAMPLES).message
    assert "  tolerance:   declared {'atol': 1e-05} (for torch.float64: rtol=1e-07, atol=1e-05)" in message
    assert "  domain:      declared {'dtypes': (torch.float64,), 'special_values': False} -> dtypes float64" in message


@pytest.mark.slow
def test_report_shows_default_tolerance_and_domain():
    message = check_rule(DIV_SELF, max_examples=EXAMPLES).message
    assert ("  tolerance:   default (as torch.testing.assert_close; for torch.float32: rtol=1.3e-06, atol=1e-05)"
            in message)
    assert "  domain:      default -> dtypes float32, float64, int64, int32, uint8, bool" in message


@pytest.mark.slow
def test_report_shows_module_parameters():
    def pattern(x, lin: nn.Linear):
        return lin(x)

    def replacement(x, lin: nn.Linear):
        return x @ lin.weight.T  # forgets the bias

    drop_bias = rule(pattern, replacement, name="drop_bias", domain={"dtypes": (torch.float32,)})
    result = check_rule(drop_bias, max_examples=EXAMPLES)
    assert result.verdict == "unsound"
    assert "    lin = Linear(in_features=" in result.message and "    lin.bias = torch.tensor(" in result.message
