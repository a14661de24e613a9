"""fxrewrite.testing: the public names, imported on first use."""

from __future__ import annotations

import subprocess
import sys

import pytest

import fxrewrite.testing

PUBLIC = [
    "CheckResult",
    "Counterexample",
    "DEFAULT_DTYPES",
    "DOMAIN_KEYS",
    "Domain",
    "Tolerance",
    "assert_equivalent",
    "assert_rule_equivalent",
    "check_rule",
    "compare",
    "elements",
    "evaluate",
    "format_value",
    "inputs_for",
    "tensor_shapes",
    "tensors",
]


def test_public_names_are_pinned_sorted_and_importable():
    assert fxrewrite.testing.__all__ == PUBLIC == sorted(PUBLIC)
    assert dir(fxrewrite.testing) == PUBLIC
    for name in PUBLIC:
        assert getattr(fxrewrite.testing, name) is not None


def test_an_unknown_name_says_what_exists():
    with pytest.raises(AttributeError, match="has no attribute 'check'; it exports"):
        fxrewrite.testing.check  # noqa: B018


@pytest.mark.slow
def test_hypothesis_is_imported_on_first_use_only():
    code = ("import sys, fxrewrite.testing; before = 'hypothesis' in sys.modules; "
            "from fxrewrite.testing import check_rule; print(before, 'hypothesis' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "True"]
