"""Rules that call ``torch.library`` custom ops: a rules directory brings its ops in ``_ops.py``,
imported once, before its rule files, by the loader, ``fxrewrite check``/``apply`` and the pytest
plugin; an op that does not exist is a set-up error, never an unsound rule."""

from __future__ import annotations

import io
import itertools
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _helpers import write_source

import fxrewrite
from fxrewrite.cli import main
from fxrewrite.errors import RuleLoadError
from fxrewrite.loader import OPS_FILE, import_ops, load_rules
from fxrewrite.testing.check_cli import setup_error

_NAMESPACES = itertools.count()

OPS = """
import torch

CALLS = []


@torch.library.custom_op("{ns}::linear_relu", mutates_args=())
def linear_relu(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    CALLS.append(1)
    return torch.relu(torch.nn.functional.linear(x, w, b))


@linear_relu.register_fake
def _(x, w, b):
    return x.new_empty(*x.shape[:-1], w.shape[0])
"""

RULE = """
rule linear_relu "Replaces relu(linear(x, w, b)) by {ns}.linear_relu.":
    torch.relu(F.linear(x, w, b)) => torch.ops.{ns}.linear_relu(x, w, b)
"""

MODEL = """
import torch
from torch import nn


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x):
        return torch.relu(self.b(torch.relu(self.a(x))))


def model():
    torch.manual_seed(0)
    return MLP().eval()


def example_inputs():
    return (torch.randn(2, 8),)
"""


def rules_with_ops(root: Path, *, ops: bool = True) -> tuple[Path, str]:
    """A rules directory whose rule calls a custom op of a namespace used by no other test
    (an op can be registered once per process); with its ``_ops.py`` unless ``ops=False``."""
    ns = f"fxr_ops_test{os.getpid()}_{next(_NAMESPACES)}"
    write_source(root / "linear.fxr", RULE.format(ns=ns))
    if ops:
        write_source(root / OPS_FILE, OPS.format(ns=ns))
    return root, ns


def test_loading_one_rule_file_imports_the_ops_file_next_to_it_first(tmp_path):
    root, ns = rules_with_ops(tmp_path / "dsl_rules")
    assert not hasattr(getattr(torch.ops, ns), "linear_relu")
    rules = load_rules(root / "linear.fxr")  # one file, as the pytest plugin loads it
    assert rules.names == ("linear_relu",)
    assert hasattr(getattr(torch.ops, ns), "linear_relu")
    assert load_rules(root).names == ("linear_relu",)  # again, and the whole directory: imported once
    assert import_ops(root) is import_ops(root)


def test_an_ops_file_that_fails_to_import_is_a_load_error_naming_it(tmp_path):
    root, _ = rules_with_ops(tmp_path / "broken")
    (root / OPS_FILE).write_text("import torch\nraise RuntimeError('no compiler here')\n")
    with pytest.raises(RuleLoadError, match=r"the ops file '.*broken/_ops.py' .*RuntimeError: no compiler here"):
        load_rules(root)


def test_the_ops_file_is_not_a_rule_file(tmp_path):
    root, _ = rules_with_ops(tmp_path / "rules")
    assert [Path(r.origin).name for r in load_rules(root)] == ["linear.fxr:1"]
    assert main(["list", str(root)], out=io.StringIO()) == 0


def test_a_rule_whose_op_does_not_exist_is_a_setup_error_naming_the_op_and_the_fix(tmp_path):
    root, ns = rules_with_ops(tmp_path / "no_ops", ops=False)
    rule = load_rules(root)["linear_relu"]
    problem = setup_error(rule)
    assert problem is not None
    assert f"'torch.ops.{ns}.linear_relu' does not exist" in problem
    assert "set-up error" in problem and "'_ops.py' next to the rule file" in problem


def test_a_python_rule_calling_a_missing_op_is_a_setup_error_too(tmp_path):
    rule = fxrewrite.Rule.from_functions(lambda x: torch.relu(x), lambda x: torch.ops.fxr_nowhere.fast_relu(x),
                                         name="fast_relu")
    assert "fxr_nowhere" in (setup_error(rule) or "")
    sound = fxrewrite.Rule.from_functions(lambda x: torch.relu(torch.relu(x)), lambda x: torch.relu(x), name="rr")
    assert setup_error(sound) is None


def test_check_command_reports_a_missing_op_as_an_error_not_as_unsound(tmp_path):
    root, _ = rules_with_ops(tmp_path / "no_ops", ops=False)
    out = io.StringIO()
    assert main(["check", str(root), "--examples", "5", "-j", "1"], out=out) == 1
    text = out.getvalue()
    assert "ERROR" in text and "set-up error" in text and "1 error" in text
    assert "unsound" not in text.lower() and "repair" not in text


@pytest.mark.slow
def test_check_and_apply_use_the_ops_of_the_rules_directory(tmp_path, monkeypatch):
    rules_with_ops(tmp_path / "dsl_rules")
    write_source(tmp_path / "mlp.py", MODEL)
    monkeypatch.chdir(tmp_path)
    out = io.StringIO()
    assert main(["check", "dsl_rules", "--examples", "5", "-j", "1"], out=out) == 0, out.getvalue()
    out = io.StringIO()
    assert main(["apply", "mlp.py:model", "--rules", "dsl_rules", "--export", "--check"], out=out) == 0, out.getvalue()
    assert "linear_relu      2" in out.getvalue() and "check: ok" in out.getvalue()


PYTEST_RUN = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--fxrewrite-examples", "5"]


def _pytest(root: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*PYTEST_RUN, *extra, str(root)], capture_output=True, text=True, cwd=root.parent,
                          timeout=300)


@pytest.mark.slow
def test_pytest_imports_the_ops_file_and_the_rule_passes(tmp_path):
    root, _ = rules_with_ops(tmp_path / "dsl_rules")
    result = _pytest(root)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 passed" in result.stdout


@pytest.mark.slow
def test_pytest_reports_a_missing_op_as_a_setup_error_without_a_log_flood(tmp_path):
    root, ns = rules_with_ops(tmp_path / "dsl_rules", ops=False)
    result = _pytest(root, "-o", "log_level=DEBUG")
    assert result.returncode == 1
    assert "1 error" in result.stdout and "failed" not in result.stdout
    assert "ERROR at setup of rule linear_relu" in result.stdout
    assert f"'torch.ops.{ns}.linear_relu' does not exist" in result.stdout
    assert "unsound" not in result.stdout and "DEBUG" not in result.stdout
    assert len(result.stdout.splitlines()) < 15, result.stdout


# ---- a replacement calling an op with the wrong arguments ---------------------------------------

BAD_RULE = """
rule linear_relu_short:
    torch.relu(F.linear(x, w, b)) => torch.ops.{ns}.linear_relu(x, w)
"""


def rules_with_a_short_call(root: Path) -> tuple[Path, str]:
    root, ns = rules_with_ops(root)
    (root / "linear.fxr").unlink()
    write_source(root / "short.fxr", BAD_RULE.format(ns=ns))
    return root, ns


def test_a_call_that_does_not_fit_the_ops_schema_is_refused_when_spliced(tmp_path):
    root, ns = rules_with_a_short_call(tmp_path / "bad_rules")
    rules = load_rules(root)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).eval()
    x = torch.randn(2, 8)
    program = torch.export.export(model, (x,))
    with pytest.raises(fxrewrite.RewriteError) as caught:
        fxrewrite.rewrite(program, rules)  # an ExportedProgram: no SpecViolationError, the rule's error
    message = str(caught.value)
    assert "rule 'linear_relu_short'" in message and f"torch.ops.{ns}.linear_relu" in message
    assert "missing a required argument: 'b'" in message and "short.fxr:1" in message
    with pytest.raises(fxrewrite.RewriteError, match="missing a required argument: 'b'"):
        fxrewrite.rewrite(program.module(), rules)


def test_apply_export_stops_on_the_bad_call_and_lint_reports_it_as_an_error(tmp_path, monkeypatch, capsys):
    rules_with_a_short_call(tmp_path / "bad_rules")
    write_source(tmp_path / "mlp.py", MODEL)
    monkeypatch.chdir(tmp_path)
    out = io.StringIO()
    assert main(["apply", "mlp.py:model", "--rules", "bad_rules", "--export"], out=out) == 2
    err = capsys.readouterr().err
    assert "linear_relu_short" in err and "missing a required argument: 'b'" in err
    assert "fired" not in out.getvalue()  # nothing was written
    out = io.StringIO()
    assert main(["lint", "bad_rules"], out=out) == 1
    text = out.getvalue()
    assert text.startswith("error: replacement-raises: rule 'linear_relu_short'")
    assert "missing a required argument: 'b'" in text and "1 error(s)" in text


def test_op_calls_that_fit_a_schema_are_spliced_as_before():
    add_one = fxrewrite.Rule.from_functions(lambda x: x + 1, lambda x: torch.ops.aten.add.Tensor(x, 1.0, alpha=1),
                                            name="add_one")
    add_pkt = fxrewrite.Rule.from_functions(lambda x: x - 1, lambda x: torch.ops.aten.sub(x, 1), name="sub_one")
    result = fxrewrite.rewrite(lambda x: (x + 1) * (x - 1), fxrewrite.RuleSet([add_one, add_pkt]))
    assert result.report.applied == {"add_one": 1, "sub_one": 1}
    result.module.graph.lint()
    x = torch.randn(3)
    torch.testing.assert_close(result.module(x), (x + 1) * (x - 1))
