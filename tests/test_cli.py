"""The command line, end to end through fxrewrite.cli.main."""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import tomllib
import torch
from _helpers import assert_rewrite_sound, write_source

import fxrewrite
import fxrewrite.target
from fxrewrite.cli import build_parser, main


@pytest.mark.slow
def test_check_command_reports_every_rule_and_exits_0_when_sound():
    out = io.StringIO()
    assert main(["check", "rules/algebra.fxr", "--examples", "5"], out=out) == 0
    text = out.getvalue()
    assert "double_neg" in text and "sound" in text


@pytest.mark.slow
def test_check_command_exits_1_on_an_unsound_rule(tmp_path):
    bad = tmp_path / "bad.fxr"
    bad.write_text('rule sub_self "Replaces x - x by zeros.":\n    x - x => torch.zeros_like(x)\n')
    out = io.StringIO()
    assert main(["check", str(bad), "--examples", "50"], out=out) == 1
    assert "unsound" in out.getvalue()


def test_list_command_lists_the_shipped_rules():
    out = io.StringIO()
    assert main(["list"], out=out) == 0
    assert "conv_bn_fold" in out.getvalue() and "rule(s)" in out.getvalue()


# ---- apply, explain, list as a user runs them ---------------------------------------------------------------------

ROOT = Path(__file__).resolve().parent.parent

MODEL = '''
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.drop = nn.Dropout(0.25)

    def forward(self, x):
        h = torch.relu(self.drop(torch.relu(self.lin(x))))  # relu(relu(.)) once the eval dropout is gone
        g = torch.relu(torch.relu(x))
        return torch.neg(torch.neg(h)) * 2 + g


def model():
    torch.manual_seed(0)  # the same weights every time the file is loaded
    return Net().eval()


def example_inputs():
    return (torch.randn(4, 8),)
'''

NEG_NEG = ('rule neg_neg "Replaces -(-x) by x.":\n    torch.neg(torch.neg(x)) => x\n\n'
           'rule exp_log:\n    torch.exp(torch.log(x)) => x\n')

WIDE_RELU = '''
import torch
import fxrewrite


@fxrewrite.rule(where=lambda m: m["x"].shape[-1] % 8 == 0)
def wide_relu(x):
    "Replaces relu(relu(x)) by relu(x) where the last dimension is a multiple of 8."
    return torch.relu(torch.relu(x))


@wide_relu.replacement
def wide_relu(x):
    return torch.relu(x)
'''

LOOP = '''
import torch
import fxrewrite

relu_relu = fxrewrite.Rule.from_functions(lambda x: torch.relu(torch.relu(x)), lambda x: torch.relu(x),
                                          name="relu_relu")
'''


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A user's folder: a model file and rule files, the current directory."""
    (tmp_path / "net.py").write_text(MODEL.lstrip())
    (tmp_path / "neg.fxr").write_text(NEG_NEG)
    (tmp_path / "wide.py").write_text(WIDE_RELU.lstrip())
    (tmp_path / "loop.py").write_text(LOOP.lstrip())
    monkeypatch.chdir(tmp_path)
    return tmp_path


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(list(argv), out=out)
    return code, out.getvalue(), err.getvalue()


def fxrewrite_command(*argv: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """``fxrewrite ARGV`` in a fresh interpreter, as a user types it."""
    return subprocess.run([sys.executable, "-m", "fxrewrite", *argv], cwd=cwd, capture_output=True, text=True,
                          timeout=300, check=False)


def rows(out: str) -> dict[str, list[str]]:
    """The report table's rows by rule name (the header row included, under 'rule')."""
    table = {}
    for line in out.splitlines():
        cells = line.split()
        if (len(cells) == 5 and cells[1:4] and all(c.isdigit() for c in cells[1:4])) or cells[:2] == ["rule", "fired"]:
            table[cells[0]] = cells[1:]
    return table


def test_version_is_the_package_version():
    done = fxrewrite_command("--version")
    assert (done.returncode, done.stdout.strip(), done.stderr) == (0, f"fxrewrite {fxrewrite.__version__}", "")


def test_the_version_has_one_source():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in pyproject["project"] and "version" in pyproject["project"]["dynamic"]
    source = ROOT / pyproject["tool"]["hatch"]["version"]["path"]
    assert source.name == "_version.py" and f'__version__ = "{fxrewrite.__version__}"' in source.read_text()
    assert "__version__ = " not in (ROOT / "fxrewrite" / "__init__.py").read_text()


def test_help_does_not_import_torch():
    script = ("import sys\nfrom fxrewrite.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
              "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.'))[:3])")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_apply_shows_the_rules_that_fired_and_one_line_for_the_rest(project):
    code, out, err = run("apply", "net.py:model", "--rules", "neg.fxr", "--rules", "wide.py", "--shapes")
    assert (code, err) == (0, "")
    table = rows(out)
    assert list(table) == ["rule", "neg_neg", "wide_relu"]
    assert table["rule"] == ["fired", "guarded", "tried", "ms"]
    assert table["neg_neg"][0] == "1" and table["wide_relu"][0] == "2"  # the eval dropout is seen through
    assert "3 rewrite(s) in " in out and "1 other rule(s) did not match (0 of them were tried; --all lists them)" in out


def test_apply_all_shows_every_rule(project):
    code, out, _ = run("apply", "net.py:model", "--rules", "neg.fxr", "--rules", "loop.py", "--all")
    assert code == 0
    table = rows(out)
    assert list(table) == ["rule", "neg_neg", "exp_log", "relu_relu"]
    assert table["exp_log"][:3] == ["0", "0", "0"] and table["relu_relu"][0] == "2"  # through the eval dropout
    assert "did not match" not in out


def test_the_report_table_is_the_same_in_the_api_and_the_cli(project):
    code, out, _ = run("apply", "net.py:model", "--rules", "neg.fxr")
    target = fxrewrite.target.load_target("net.py:model")
    result = fxrewrite.rewrite(target.model, fxrewrite.load_rules("neg.fxr"))
    assert_rewrite_sound(target.model, result, *target.example_inputs)
    report = result.report
    assert code == 0
    cli_rows = [line for line in out.splitlines()[1:3]]
    api_rows = str(report).splitlines()[:2]
    assert [r.split()[:4] for r in cli_rows] == [r.split()[:4] for r in api_rows]


@pytest.mark.slow
def test_apply_add_rules_adds_to_the_standard_library(project):
    (project / "twice.fxr").write_text("rule twice:\n    x * 2 => x + x\n")
    code, out, err = run("apply", "net.py:model", "--add-rules", "twice.fxr", "--check")
    assert (code, err) == (0, "")
    standard = len(fxrewrite.load_rules())
    assert out.splitlines()[0] == f"net.py:model: 12 nodes, {standard + 1} rules"
    table = rows(out)
    assert table["twice"][0] == "1" and table["dropout_layer_inactive"][0] == "1"
    assert "check: ok" in out


def test_apply_add_rules_adds_to_the_given_rules(project):
    code, out, _ = run("apply", "net.py:model", "--rules", "neg.fxr", "--add-rules", "loop.py", "--all")
    assert code == 0
    assert ", 3 rules" in out.splitlines()[0] and set(rows(out)) == {"rule", "neg_neg", "exp_log", "relu_relu"}


def test_apply_add_rules_naming_a_standard_rule_again_is_an_error(project):
    (project / "clash.fxr").write_text("rule relu_relu:\n    torch.relu(torch.relu(x)) => torch.relu(x)\n")
    code, _, err = run("apply", "net.py:model", "--add-rules", "clash.fxr")
    assert code == 2 and "relu_relu" in err and "rename one" in err


def test_a_guard_without_shapes_refuses_and_the_table_says_how_to_get_them(project):
    code, out, err = run("apply", "net.py:model", "--rules", "wide.py")
    assert (code, err) == (0, "")
    assert rows(out)["wide_relu"][:2] == ["0", "2"]  # both relu pairs (the eval dropout is seen through)
    assert "guards of wide_relu refused matches and the graph carries no shapes/dtypes" in out
    assert "add --shapes" in out and "--export" in out
    code, out, _ = run("apply", "net.py:model", "--rules", "wide.py", "--shapes")
    assert rows(out)["wide_relu"][:2] == ["2", "0"] and "carries no shapes" not in out


@pytest.mark.slow
def test_linear_bn_fold_without_shapes_says_why_it_was_guarded_and_fires_with_them(project):
    """The issue's case: the shipped linear_bn_fold showed `guarded 1` and explain only said
    that its guard returned False."""
    (project / "lb.py").write_text("import torch\nfrom torch import nn\n\n\ndef model():\n"
                                   "    torch.manual_seed(0)\n"
                                   "    return nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8)).eval()\n\n\n"
                                   "def example_inputs():\n    return (torch.randn(4, 8),)\n")
    code, out, _ = run("apply", "lb.py:model")
    assert code == 0 and rows(out)["linear_bn_fold"][:2] == ["0", "1"]
    assert "guards of linear_bn_fold refused matches and the graph carries no shapes/dtypes" in out
    code, out, _ = run("explain", "lb.py:model", "--rule", "linear_bn_fold")
    assert "returned False (the graph carries no shapes/dtypes; if the guard reads them" in out
    assert out.splitlines()[-1].startswith("Guards refused on a graph without shapes/dtypes: add --shapes")
    code, out, _ = run("apply", "lb.py:model", "--shapes", "--check")
    assert code == 0 and rows(out)["linear_bn_fold"][:2] == ["1", "0"] and "check: ok" in out


def test_max_rewrites_bounds_the_rewrites_and_the_error_says_how_to_raise_it(project):
    (project / "deep.py").write_text("import torch\n\ndef model():\n    return Deep()\n\n"
                                     "class Deep(torch.nn.Module):\n    def forward(self, x):\n"
                                     "        return torch.relu(torch.relu(torch.relu(x)))\n")
    code, _, err = run("apply", "deep.py:model", "--rules", "loop.py", "--max-rewrites", "1")
    assert code == 2
    assert "did not reach a fixed point within 1 rewrites" in err and "--max-rewrites N" in err
    assert err.count("--max-rewrites") == 1 and "Raise max_rewrites" not in err  # the hint once, as an option
    code, out, _ = run("apply", "deep.py:model", "--rules", "loop.py", "--max-rewrites", "2")
    assert code == 0 and rows(out)["relu_relu"][0] == "2"


@pytest.mark.parametrize("argv", [["apply", "net.py:model", "--max-rewrites", "-1"],
                                  ["apply", "net.py:model", "--max-rewrites", "many"],
                                  ["explain", "net.py:model", "--misses", "-2"]])
def test_counts_must_be_whole_numbers(project, capsys, argv):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert f"expected a whole number, 0 or more, got {argv[-1]!r}" in capsys.readouterr().err


def test_check_failure_shows_the_inputs_and_both_outputs(project):
    (project / "wrong.fxr").write_text("rule neg_neg_wrong:\n    torch.neg(torch.neg(x)) => torch.neg(x)\n")
    code, out, _ = run("apply", "net.py:model", "--rules", "wrong.fxr", "--check")
    assert code == 1
    assert "check: FAILED, the rewritten module differs from the original on example_inputs()" in out
    assert "  inputs:\n    x = " in out and "  before -> " in out and "  after  -> " in out


def test_check_passes_rewrites_that_only_round_differently(project):
    (project / "reassoc.fxr").write_text("rule mul_two:\n    x * 2 => x + x\n")
    code, out, _ = run("apply", "net.py:model", "--rules", "reassoc.fxr", "--check")
    assert code == 0 and "check: ok" in out


@pytest.mark.slow
def test_explain_after_others_sees_the_graph_apply_leaves(project):
    """-(-h) sits between two relus: the standard relu_relu misses there on the traced graph, but
    the rest of the standard library removes it (double_neg), and then it matches. (An eval-mode
    dropout would not do: the matcher sees through it.)"""
    (project / "negs.py").write_text(MODEL.replace("torch.relu(self.drop(torch.relu(self.lin(x))))",
                                                   "torch.relu(torch.neg(torch.neg(torch.relu(self.lin(x)))))"))
    code, before, _ = run("explain", "negs.py:model", "--rule", "relu_relu")
    assert code == 0
    assert "match at 'relu_3'" in before and "match at 'relu_1'" not in before
    assert "miss at 'relu_1' (relu_1 = torch.relu(neg_1))" in before
    code, after, _ = run("explain", "negs.py:model", "--rule", "relu_relu", "--after-others")
    others = len(fxrewrite.load_rules()) - 1
    assert code == 0
    assert after.splitlines()[0] == f"(explained against the graph after the other {others} rule(s) ran)"
    assert "match at 'relu_1'" in after and "match at 'relu_3'" in after


@pytest.mark.slow
def test_check_add_rules_checks_the_standard_library_and_the_added_rules(project):
    (project / "mine.fxr").write_text("rule abs_twice:\n    torch.abs(torch.abs(x)) => torch.abs(x)\n")
    code, out, _ = run("check", "--add-rules", "mine.fxr", "--rule", "abs_twice", "--rule", "double_neg",
                       "--examples", "5", "-j", "1")
    assert code == 0, out
    assert "abs_twice" in out and "double_neg" in out and "2 rule(s) checked" in out
    (project / "neg_only.fxr").write_text(NEG_NEG.split("\n\n")[0])
    code, out, _ = run("check", "neg_only.fxr", "--add-rules", "mine.fxr", "--examples", "5", "-j", "1")
    assert code == 0, out
    assert "neg_neg" in out and "abs_twice" in out and "2 rule(s) checked" in out


def test_explain_says_when_guards_refuse_for_lack_of_shapes(project):
    code, out, err = run("explain", "net.py:model", "--rules", "wide.py")
    assert (code, err) == (0, "")
    assert "needs shapes/dtypes and the graph carries no shapes/dtypes" in out
    assert out.splitlines()[-1].startswith("Guards refused on a graph without shapes/dtypes: add --shapes")


def test_list_shows_origins_relative_to_the_rules_directory_for_py_and_fxr(project):
    rules = project / "my_rules"
    rules.mkdir()
    shutil.copy(project / "neg.fxr", rules)
    shutil.copy(project / "wide.py", rules)
    code, out, _ = run("list", "my_rules")
    assert code == 0
    origins = [line.split("  ")[-1] for line in out.splitlines() if "[priority" in line]
    assert origins == ["my_rules/neg.fxr:1", "my_rules/neg.fxr:4", "my_rules/wide.py:5"]
    code, out, _ = run("list")
    origins = [line.split("  ")[-1] for line in out.splitlines() if "[priority" in line]
    assert origins and all(not o.startswith("/") and str(ROOT) not in o for o in origins)
    assert out.splitlines()[-1] == f"{len(origins)} rule(s) (the standard library, in {ROOT / 'rules'})"


@pytest.mark.slow
def test_list_into_a_closed_pipe_is_not_an_error():
    done = subprocess.run(f"{sys.executable} -m fxrewrite list | head -1", shell=True, cwd=ROOT, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.stdout.count("\n") == 1 and done.stderr == ""


def test_every_option_is_documented():
    doc = (ROOT / "docs" / "cli.md").read_text()
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    options = {o for a in parser._actions for o in a.option_strings if o not in ("-h", "--help")}
    for name in ("apply", "explain", "list"):
        options |= {o for a in commands[name]._actions for o in a.option_strings if o not in ("-h", "--help")}
    undocumented = sorted(o for o in options if f"`{o}" not in doc)
    assert undocumented == []


# ---- a clean run prints nothing but its report --------------------------------------------------------------------


@pytest.mark.parametrize("argv", [
    ["apply", "examples/02_conv_bn_folding.py:trained_model", "--check"],
    ["apply", "examples/03_attention_to_sdpa.py:gpt", "--export", "--check"],
], ids=["traced", "export"])
@pytest.mark.slow
def test_a_clean_run_prints_no_warning(argv):
    done = fxrewrite_command(*argv)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stderr == ""
    assert done.stdout.rstrip().endswith("check: ok, the rewritten module matches the original on example_inputs()")


def test_numpy_is_a_dependency_so_torch_never_warns_it_is_missing():
    """torch prints 'UserWarning: Failed to initialize NumPy' when numpy is absent; a fresh venv
    from `pip install torch==2.13.0 && pip install .` gets it through fxrewrite's dependencies."""
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert any(d.split(">")[0].split("=")[0].strip() == "numpy" for d in dependencies)


# ---- -o: a folder that can be moved ------------------------------------------------------------------------------


@pytest.mark.slow
def test_output_folder_can_be_moved_and_imported_from_its_new_place(project, tmp_path_factory):
    code, out, err = run("apply", "net.py:model", "--rules", "neg.fxr", "-o", "written")
    assert (code, err) == (0, ""), out
    assert "from written import RewrittenModule" in out
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    shutil.move(project / "written", elsewhere / "moved")
    x = torch.randn(4, 8)
    target = fxrewrite.target.load_target("net.py:model")
    torch.save({"x": x, "expected": target.model(x).detach()}, elsewhere / "io.pt")
    script = textwrap.dedent("""
        import sys, torch
        sys.path.insert(0, sys.argv[1])
        from moved import RewrittenModule
        model = RewrittenModule()
        data = torch.load(sys.argv[1] + "/io.pt")
        torch.testing.assert_close(model(data["x"]), data["expected"])
        assert not any(n.target is torch.neg for n in torch.fx.symbolic_trace(model).graph.nodes)
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", script, str(elsewhere)], cwd="/", capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
    assert str(project) not in (elsewhere / "moved" / "module.py").read_text()


def test_output_folder_name_must_be_an_identifier(project):
    code, _, err = run("apply", "net.py:model", "--rules", "neg.fxr", "-o", "my-model")
    assert code == 2 and "must be an identifier; use e.g. 'my_model'" in err
    assert not (project / "my-model").exists()


def test_output_with_export_writes_a_loadable_program(project, tmp_path_factory):
    code, out, err = run("apply", "net.py:model", "--rules", "neg.fxr", "--export", "-o", "written", "--check")
    assert (code, err) == (0, ""), out
    saved = project / "written.pt2"
    assert f"wrote the rewritten program to {saved}" in out and "check: ok" in out
    assert "rewrite(s)" in out.split("wrote the rewritten program")[0]  # written after rewriting
    shipped = tmp_path_factory.mktemp("elsewhere") / "net.pt2"
    shutil.move(saved, shipped)  # a file: it can be moved too
    program = torch.export.load(shipped)
    assert isinstance(program, torch.export.ExportedProgram)
    assert not any(n.target is torch.ops.aten.neg.default for n in program.graph.nodes)
    target = fxrewrite.target.load_target("net.py:model")
    x = target.example_inputs[0]
    torch.testing.assert_close(program.module()(x), target.model(x))


def test_output_with_export_may_name_the_program_file_and_is_checked_before_rewriting(project):
    code, out, _ = run("apply", "net.py:model", "--rules", "neg.fxr", "--export", "-o", "out/net.pt2")
    assert code == 0 and (project / "out" / "net.pt2").is_file() and not (project / "out" / "net.pt2.pt2").exists()
    (project / "taken.pt2").mkdir()
    code, out, err = run("apply", "net.py:model", "--rules", "neg.fxr", "--export", "-o", "taken")
    assert code == 2 and "is a directory" in err and "rewrite(s)" not in out
    code, out, err = run("apply", "net.py:model", "--rules", "neg.fxr", "-o", "my-model")
    assert code == 2 and "rewrite(s)" not in out  # a bad folder name too: refused before the work


GATED = """
import torch


class Gated(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        y = self.lin(x)
        return -(-(y * torch.sigmoid(y))) + 1


def model():
    return Gated().eval()


def example_inputs():
    return (torch.randn(4, 8),)
"""

SILU_NEG = ('rule silu:\n    x * torch.sigmoid(x) => F.silu(x)\n\n'
            'rule neg_neg:\n    torch.neg(torch.neg(x)) => x\n')


@pytest.mark.slow
@pytest.mark.parametrize(("stage", "written"), [("pre_grad", "operator.mul"), ("post_grad", "aten.mul.Tensor")])
def test_explain_stage_explains_the_graph_a_compile_pass_is_handed(project, stage, written):
    (project / "gated.py").write_text(GATED)
    (project / "silu.fxr").write_text(SILU_NEG)
    code, out, err = run("explain", "gated.py:model", "--rules", "silu.fxr", "--stage", stage)
    assert (code, err) == (0, ""), out
    lines = out.splitlines()
    assert lines[0].startswith(f"(explained against graph 1 of 1 torch.compile hands a pass at stage '{stage}', ")
    assert "rule silu (" in out and "1 match(es) among 1 candidate(s)" in out
    assert f"miss at 'neg' (neg = {written.replace('mul.Tensor', 'neg.default').replace('mul', 'neg')}(mul))" in out


def test_explain_stage_needs_example_inputs_and_no_export(project):
    code, _, err = run("explain", "net.py:model", "--rules", "neg.fxr", "--stage", "pre_grad", "--export")
    assert code == 2 and "drop --export and --shapes" in err
    (project / "bare.py").write_text("import torch\nmodel = torch.nn.ReLU()\n")
    code, _, err = run("explain", "bare.py:model", "--rules", "neg.fxr", "--stage", "pre_grad")
    assert code == 2 and "--stage needs example inputs" in err


MY_RULES = ('rule neg_neg_mine "Replaces -(-x) by x.":\n    torch.neg(torch.neg(x)) => x\n\n'
            'rule mul_three_mine:\n    x * 3 => x + x + x\n\n'
            'rule exp_log_mine:\n    torch.exp(torch.log(x)) => x\n')


def test_apply_names_each_added_rule_that_did_not_fire_with_its_closest_miss(project):
    (project / "my_rules").mkdir()
    (project / "my_rules" / "mine.fxr").write_text(MY_RULES)
    code, out, err = run("apply", "net.py:model", "--rules", "neg.fxr", "--add-rules", "my_rules")
    assert (code, err) == (0, ""), out
    lines = out.splitlines()
    table = rows(out)
    assert table["neg_neg"][0] == "1" and "neg_neg_mine" not in table  # the shipped one fired first
    # exp_log (of neg.fxr) did not match and is folded into the summary; the added rules are not
    assert "; 1 other rule(s) did not match" in out
    mine = [line for line in lines if line.startswith("your rule ")]
    assert [line.split()[2] for line in mine] == ["neg_neg_mine", "mul_three_mine", "exp_log_mine"]
    assert mine[0] == ("your rule neg_neg_mine (my_rules/mine.fxr:1) did not fire (tried at 1 node(s)): no node of "
                       "the graph computes aten.neg, the op its pattern ends with")  # neg_neg took them
    assert ("closest miss at 'mul' (mul = operator.mul(relu_1, 2)): argument 2 differs: pattern has 3, graph has 2"
            in mine[1])
    assert mine[2].endswith("no node of the graph computes aten.exp, the op its pattern ends with")
    assert lines[-1] == ("(every miss: fxrewrite explain net.py:model --rules neg.fxr --add-rules my_rules "
                         "--rule neg_neg_mine --rule mul_three_mine --rule exp_log_mine --after-others)")
    code, out, _ = run("apply", "net.py:model", "--rules", "neg.fxr", "--rules", "my_rules")
    assert code == 0 and "your rule" not in out  # only --add-rules rules are yours


GUARDED_RULES = """
import torch
import fxrewrite


@fxrewrite.rule(where=lambda m: m["x"].dim() >= 1 and m["x"].shape[-1] % 8 == 0)
def wide_relu(x):
    "relu(relu(x)) where the last dimension is a multiple of 8."
    return torch.relu(torch.relu(x))


@wide_relu.replacement
def wide_relu(x):
    return torch.relu(x)


never = fxrewrite.Rule.from_functions(lambda x: torch.neg(torch.neg(x)), lambda x: x, name="never",
                                      where=lambda m: m["x"].dim() == 7)
"""


@pytest.mark.slow
def test_check_suggests_for_an_untestable_rule_only_a_domain_that_works(project):
    (project / "guarded.py").write_text(GUARDED_RULES)
    code, out, _ = run("check", "guarded.py", "--examples", "10", "-j", "1")
    assert code == 1 and "wide_relu" in out and "UNTESTABLE" in out
    fixes = [line.split("fix:", 1)[1].strip() for line in out.splitlines() if line.strip().startswith("fix:")]
    assert len(fixes) == 2
    suggested = re.fullmatch(r"declare domain=(\{.*\}) \(checked: .*\)\.", fixes[0])
    assert suggested, fixes[0]
    domain = eval(suggested.group(1), {"torch": torch})  # the suggestion, declared as written
    rule = fxrewrite.load_rules("guarded.py")["wide_relu"]
    declared = fxrewrite.Rule.from_functions(rule.pattern, rule.replacement, name="wide_relu", where=rule.where,
                                             domain=domain)
    from fxrewrite.testing import check_rule

    assert check_rule(declared, max_examples=20).verdict == "sound"
    assert fixes[1].startswith("no domain fxrewrite tried")  # dim() == 7: none is known, and it says so


# ---- bad targets and rule files on the command line ---------------------------------------------------------


MODELS = """
    import sys
    import torch

    class Fine(torch.nn.Module):
        def forward(self, x):
            return torch.neg(torch.neg(x)) + 1

    class Branchy(torch.nn.Module):
        def forward(self, x):
            return x if x.sum() > 0 else -x

    class NeedsWidth(torch.nn.Module):
        def __init__(self, width):
            super().__init__()

    def factory_of_a_number():
        return 42

    number = 7

    def example_inputs():
        return (torch.randn(3),)
"""


@pytest.fixture
def cli_files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_source(tmp_path / "models.py", MODELS)
    write_source(tmp_path / "broken.py", "import torch\nraise RuntimeError('model file is broken')\n")
    write_source(tmp_path / "rules.fxr", "rule double_neg:\n    torch.neg(torch.neg(x)) => x\n")
    write_source(tmp_path / "bad.fxr", "rule bad:\n    torch.neg(x) x\n")
    return tmp_path


@pytest.mark.parametrize("argv, fragments", [
    (["apply", "models.py:Branchy"], ["symbolic_trace failed on 'models.py:Branchy'", "TraceError", "Try --export"]),
    (["explain", "models.py:Branchy"], ["symbolic_trace failed on 'models.py:Branchy'"]),
    (["apply", "models.py:NeedsWidth"], ["calling the class 'models.py:NeedsWidth' with no arguments failed",
                                         "missing 1 required positional argument: 'width'"]),
    (["apply", "models.py:factory_of_a_number"], ["the factory 'models.py:factory_of_a_number' returned a int, "
                                                  "not an nn.Module"]),
    (["apply", "models.py:number"], ["'models.py:number' is a int; it must be an nn.Module"]),
    (["apply", "models.py:Nope"], ["'models.py' defines no 'Nope' (it defines: Branchy, Fine,"]),
    (["apply", "missing.py:Net"], ["no such file: 'missing.py' (the current directory is"]),
    (["apply", "broken.py:Net"], ["cannot import 'broken.py' for target 'broken.py:Net'",
                                  "RuntimeError: model file is broken"]),
    (["apply", "no_such_package_xyz.models:Net"], ["cannot import 'no_such_package_xyz.models'",
                                                   "ModuleNotFoundError"]),
    (["apply", "models"], ["cannot read the target 'models': write it as path/to/file.py:NAME"]),
    (["apply", "models.py:Fine", "--rules", "nowhere"], ["no such rule file or directory: 'nowhere'"]),
    (["apply", "models.py:Fine", "--rules", "bad.fxr"], ["bad.fxr:2:18: expected '=>' followed by the replacement"]),
    (["explain", "models.py:Fine", "--rules", "rules.fxr", "--rule", "nope"], ["no rule named nope"]),
    (["list", "nowhere", "rules.fxr"], ["no such rule file or directory: 'nowhere'"]),
])
def test_cli_errors_exit_2_with_the_message_on_stderr(cli_files, argv, fragments):
    code, _, err = run(*argv)
    assert code == 2
    assert err.startswith(f"fxrewrite {argv[0]}: error: ")
    for fragment in fragments:
        assert fragment in err
    assert "Traceback" not in err


def test_cli_export_failure_exits_2(cli_files):
    code, _, err = run("apply", "models.py:Branchy", "--export")
    assert code == 2 and "fxrewrite apply: error: torch.export.export failed on 'models.py:Branchy'" in err


def test_cli_applies_rules_to_a_good_target(cli_files):
    code, out, err = run("apply", "models.py:Fine", "--rules", "rules.fxr", "--check")
    assert (code, err) == (0, "")
    assert "double_neg" in out and "check: ok" in out


@pytest.mark.parametrize("argv", [["list", "rules.fxr", "rules.fxr"],
                                  ["apply", "models.py:Fine", "--rules", "rules.fxr", "--rules", "rules.fxr"]])
def test_cli_given_the_same_rule_file_twice_loads_it_once(cli_files, argv):
    (cli_files / "bad.fxr").unlink()
    code, _, err = run(*argv)
    assert (code, err) == (0, "")


def test_cli_target_that_exits_while_imported_exits_2_with_a_message(cli_files):
    write_source(cli_files / "script.py", "import sys\nsys.exit(0)\n")
    try:
        code, _, err = run("apply", "script.py:Net")
    except SystemExit as exc:
        pytest.fail(f"SystemExit({exc.code}) escaped fxrewrite.cli.main")
    assert code == 2 and "cannot import 'script.py'" in err


def test_list_says_each_rules_numerics_contract(tmp_path):
    (tmp_path / "contracts.fxr").write_text("rule neg_neg_exact:\n    -(-x) => x\n    numerics bitwise\n")
    out = io.StringIO()
    assert main(["list", str(tmp_path)], out=out) == 0
    assert "    numerics: bitwise (" in out.getvalue()


@pytest.mark.slow
def test_check_verbose_shows_the_inputs_drawn_kept_and_rejected_per_rule():
    out = io.StringIO()
    assert main(["check", "rules/algebra.fxr", "--examples", "5", "-j", "1", "-k", "double_neg", "-v"], out=out) == 0
    assert re.search(r"^ +inputs: drawn \d+, kept \d+, rejected \d+%$", out.getvalue(), re.MULTILINE)
    quiet = io.StringIO()
    assert main(["check", "rules/algebra.fxr", "--examples", "5", "-j", "1", "-k", "double_neg"], out=quiet) == 0
    assert "inputs: drawn" not in quiet.getvalue()
