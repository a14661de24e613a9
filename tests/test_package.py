"""The package's public surface and import-time behaviour."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import fxrewrite

PUBLIC = [
    "Accept",
    "ArgumentError",
    "DidNotConverge",
    "Explanation",
    "Finding",
    "FxRewriteError",
    "Match",
    "MetadataError",
    "NotEquivalent",
    "Refuse",
    "Report",
    "RewriteError",
    "RewriteResult",
    "Rule",
    "RuleDefinitionError",
    "RuleLoadError",
    "RuleSet",
    "RuleStats",
    "RuleSyntaxError",
    "RuleWarning",
    "TargetError",
    "TensorView",
    "__version__",
    "analyze",
    "backend",
    "explain",
    "find_matches",
    "inductor_pass",
    "load_rules",
    "parse_rules",
    "replace_pattern",
    "replace_pattern_with_filters",
    "rewrite",
    "rule",
]


def test_public_names_are_pinned_and_sorted():
    assert fxrewrite.__all__ == sorted(fxrewrite.__all__)
    assert fxrewrite.__all__ == PUBLIC
    for name in fxrewrite.__all__:
        assert hasattr(fxrewrite, name), name


def test_importing_fxrewrite_does_not_import_pytest_or_hypothesis():
    code = "import sys, fxrewrite; print(sorted(m for m in ('pytest', 'hypothesis') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_package_is_typed():
    assert (Path(fxrewrite.__file__).parent / "py.typed").exists()
