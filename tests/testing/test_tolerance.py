"""fxrewrite.testing._tolerance: a rule's tolerance declaration, parsed and described."""

from __future__ import annotations

import pytest
import torch

from fxrewrite.errors import RuleDefinitionError
from fxrewrite.testing import Tolerance


def test_tolerance_parsing():
    assert Tolerance.parse(None, where="r") == Tolerance()
    assert Tolerance.parse({"rtol": 1e-3}, where="r") == Tolerance(rtol=1e-3)
    with pytest.raises(ValueError, match=r"unknown tolerance key\(s\) \['abs'\]"):
        Tolerance.parse({"abs": 1}, where="r")


def test_a_bad_tolerance_value_is_a_definition_error_naming_the_key():
    for bad in (-1, True, "1e-3"):
        with pytest.raises(RuleDefinitionError, match=r"rule 'r': tolerance\['atol'\] must be a number >= 0"):
            Tolerance.parse({"atol": bad}, where="rule 'r'")


def test_the_description_shows_the_values_in_effect_for_the_dtype():
    assert Tolerance().describe(torch.float64) == ("default (as torch.testing.assert_close; for torch.float64: "
                                                   "rtol=1e-07, atol=1e-07)")
    assert Tolerance(rtol=0.5).describe(torch.int64) == "declared {'rtol': 0.5} (for torch.int64: exact)"
    assert Tolerance().describe() == Tolerance().describe(torch.float32)
