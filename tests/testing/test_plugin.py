"""The pytest plugin: `pytest rules/` property-tests every rule of every rule file."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from importlib.metadata import entry_points

import pytest

pytest_plugins = ["pytester"]


@pytest.fixture(autouse=True, scope="module")
def _import_what_the_inner_runs_import(tmp_path_factory):
    """pytester's in-process runs remove the modules they imported; re-importing some torch
    modules (e.g. ``torch._subclasses.schema_check_mode``, imported by a tensor's repr) in the
    next run crashes the interpreter. Import them once, here, before any inner run."""
    import torch

    from fxrewrite.loader import load_rules
    from fxrewrite.testing import check_rule

    folder = tmp_path_factory.mktemp("warm_up")
    (folder / "warm.fxr").write_text("rule warm:\n    x * 0.0 => torch.zeros_like(x)\n")
    (folder / "warm_rules.py").write_text(PY_RULES)
    for rule in load_rules(folder):
        check_rule(rule, max_examples=5)
    repr(torch.zeros(1))


def plugin_args() -> list[str]:
    """Load the plugin explicitly unless its ``pytest11`` entry point is installed."""
    installed = any(ep.name == "fxrewrite" for ep in entry_points(group="pytest11"))
    return [] if installed else ["-p", "fxrewrite.testing.plugin"]


ALGEBRA = """\
# two rules: one sound, one wrong on inf and nan
rule double_neg "Replaces -(-x) by x.":
    torch.neg(torch.neg(x)) => x

rule mul_zero:
    x * 0.0 => torch.zeros_like(x)
"""

PY_RULES = """\
import torch
import fxrewrite

relu_relu = fxrewrite.Rule.from_functions(
    lambda x: torch.relu(torch.relu(x)), lambda x: torch.relu(x), name="relu_relu")
"""


@pytest.fixture
def rules_dir(pytester: pytest.Pytester):
    rules = pytester.mkdir("rules")
    (rules / "algebra.fxr").write_text(ALGEBRA)
    (rules / "activations.py").write_text(PY_RULES)
    return rules


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest(*plugin_args(), "--fxrewrite-examples", "20", *args)


def test_every_rule_is_its_own_test_item(pytester, rules_dir):
    result = run(pytester, "rules", "--collect-only", "-q")
    result.stdout.fnmatch_lines([
        "rules/activations.py::relu_relu",
        "rules/algebra.fxr::double_neg",
        "rules/algebra.fxr::mul_zero",
    ])
    assert result.ret == 0


@pytest.mark.slow
def test_sound_rules_pass_and_an_unsound_rule_fails_with_its_counterexample(pytester, rules_dir):
    result = run(pytester, "rules", "-v")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines([
        "*rules/algebra.fxr::double_neg PASSED*",
        "*rules/algebra.fxr::mul_zero FAILED*",
        "*rule 'mul_zero' is unsound: the replacement computes different values*",
        "*rule:        mul_zero at *algebra.fxr:5",
        "*inputs:",
        "*x = torch.tensor(*dtype=torch.float32)  # shape*",
        "*pattern     -> torch.tensor(nan*",
        "*replacement -> torch.tensor(0.0*",
        "*domain:      default*",
        "*FAILED rules/algebra.fxr::mul_zero - rule 'mul_zero' is unsound*",
    ])
    assert "Traceback" not in result.stdout.str()


@pytest.mark.slow
def test_examples_and_seed_options_reach_the_search(pytester, rules_dir):
    result = pytester.runpytest(*plugin_args(), "rules/algebra.fxr", "--fxrewrite-examples", "13",
                                "--fxrewrite-seed", "7")
    result.stdout.fnmatch_lines(["*search:      first counterexample after * (max_examples=13, seed=7)"])


def test_options_are_in_their_own_help_group(pytester):
    result = pytester.runpytest(*plugin_args(), "--help")
    result.stdout.fnmatch_lines([
        "fxrewrite: property-test rewrite rules:",
        "*--fxrewrite-examples=N*",
        "*--fxrewrite-seed=S*",
    ])


def test_a_bad_example_count_is_a_usage_error(pytester, rules_dir):
    result = pytester.runpytest(*plugin_args(), "rules", "--fxrewrite-examples", "0")
    result.stderr.fnmatch_lines(["*--fxrewrite-examples must be at least 1, got 0.*"])
    assert result.ret == pytest.ExitCode.USAGE_ERROR


@pytest.mark.slow
def test_a_rule_file_that_does_not_load_is_a_collection_error(pytester):
    pytester.mkdir("rules")
    (pytester.path / "rules" / "broken.fxr").write_text("rule broken:\n    torch.neg(x =>\n")
    result = run(pytester, "rules")
    result.stdout.fnmatch_lines(["*ERROR collecting rules/broken.fxr*", "*fxrewrite could not load the rules of*"])
    assert result.ret == pytest.ExitCode.INTERRUPTED


def test_python_rule_modules_are_collected_only_under_a_named_path(pytester, rules_dir):
    bare = run(pytester, "--collect-only", "-q")
    assert "activations.py" not in bare.stdout.str()
    bare.stdout.fnmatch_lines(["rules/algebra.fxr::double_neg"])
    named = run(pytester, "rules", "--collect-only", "-q")
    named.stdout.fnmatch_lines(["rules/activations.py::relu_relu"])


def test_test_files_helpers_and_plain_modules_are_not_hijacked(pytester, rules_dir):
    rules = rules_dir
    ordinary_test = "\n\ndef test_ordinary():\n    assert relu_relu.name == 'relu_relu'\n"
    (rules / "test_rules.py").write_text(PY_RULES + ordinary_test)
    (rules / "_helpers.py").write_text(PY_RULES.replace("relu_relu", "helper_rule"))
    (rules / "conftest.py").write_text("import fxrewrite\n")
    (rules / "plain.py").write_text("raise RuntimeError('must not be imported')\n")
    (rules / "no_rules.py").write_text("import fxrewrite\nVALUE = 1\n")
    result = run(pytester, "rules", "--collect-only", "-q")
    out = result.stdout.str()
    assert "rules/test_rules.py::test_ordinary" in out
    assert "test_rules.py::relu_relu" not in out and "helper_rule" not in out and "plain.py" not in out
    assert "no_rules.py" not in out
    assert result.ret == 0


def test_a_python_rule_module_can_be_named_directly(pytester, rules_dir):
    result = run(pytester, "rules/activations.py", "-v")
    result.stdout.fnmatch_lines(["*rules/activations.py::relu_relu PASSED*"])
    result.assert_outcomes(passed=1)


def test_rule_items_carry_a_marker(pytester, rules_dir):
    result = run(pytester, "rules", "-m", "fxrewrite_rule", "--collect-only", "-q")
    result.stdout.fnmatch_lines(["*3 tests collected*"])


def test_loading_the_plugin_imports_neither_hypothesis_nor_the_checker():
    strategies = ("strategies", "_values", "_domain", "_nn_modules", "_running", "_plan", "_probing", "_inputs")
    checker = ("equivalence", "repair", "_restrictions", "_report", "_search", "_evaluation")
    modules = ("hypothesis", *(f"fxrewrite.testing.{m}" for m in (*checker, *strategies)))
    code = f"import sys, fxrewrite.testing.plugin; print(sorted(m for m in {modules!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.slow
def test_failure_report_in_a_subprocess_matches_check_rule(pytester, rules_dir):
    from fxrewrite.loader import load_rules
    from fxrewrite.testing import check_rule

    expected = check_rule(load_rules(rules_dir / "algebra.fxr")["mul_zero"], max_examples=20).message
    result = run(pytester, "rules/algebra.fxr")
    for line in textwrap.dedent(expected).splitlines()[2:6]:
        assert line in result.stdout.str()


PACKAGE_MODULE = '''\
"""A package module that mentions fxrewrite and cannot be imported by path (relative import).

>>> from fxrewrite import Rule
>>> double(2)
4
"""
from .helpers import double
'''


def test_package_modules_that_only_mention_fxrewrite_are_left_to_doctest(pytester):
    package = pytester.mkdir("pkg")
    (package / "__init__.py").write_text("")
    (package / "helpers.py").write_text("def double(x):\n    return 2 * x\n")
    (package / "core.py").write_text(PACKAGE_MODULE)
    (package / "lazy.py").write_text("def load():\n    from fxrewrite import Rule\n    return Rule\n")
    result = run(pytester, "--doctest-modules", "pkg", "-v")
    result.stdout.fnmatch_lines(["*pkg/core.py::pkg.core PASSED*"])
    result.assert_outcomes(passed=1)
    assert "could not load" not in result.stdout.str()


def test_a_module_importing_fxrewrite_in_an_indented_block_only_is_not_a_rule_module(pytester, rules_dir):
    (rules_dir / "guarded.py").write_text("try:\n    import fxrewrite\nexcept ImportError:\n    pass\n"
                                          "raise RuntimeError('must not be imported')\n")
    result = run(pytester, "rules", "--collect-only", "-q")
    assert "guarded.py" not in result.stdout.str() and result.ret == 0


@pytest.mark.slow  # starts two worker interpreters: ~25 s
@pytest.mark.filterwarnings("ignore:Benchmarks are automatically disabled")  # pytest-benchmark, when installed
def test_rule_items_run_under_pytest_xdist(pytester, rules_dir):
    pytest.importorskip("xdist")
    result = run(pytester, "rules", "-p", "xdist", "-n", "2", "-v")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(["*created: 2/2 workers*", "*FAILED rules/algebra.fxr::mul_zero*"])
