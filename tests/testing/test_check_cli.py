"""fxrewrite.testing.check_cli.run_check: the table, the reports and the exit status."""

from __future__ import annotations

import io
import re

import pytest

from fxrewrite.errors import RuleLoadError
from fxrewrite.loader import load_rules
from fxrewrite.testing import check_cli
from fxrewrite.testing.check_cli import run_check
from fxrewrite.testing.equivalence import CheckResult

SOUND = 'rule double_neg "Replaces -(-x) by x.":\n    torch.neg(torch.neg(x)) => x\n'
UNSOUND = "rule div_self:\n    x / x => torch.ones_like(x)\n"


def check(paths, **kw):
    out = io.StringIO()
    status = run_check([str(p) for p in paths], out=out, **kw)
    return status, out.getvalue()


def test_all_sound_exits_zero_with_a_table(tmp_path):
    (tmp_path / "good.fxr").write_text(SOUND)
    status, out = check([tmp_path], examples=15)
    lines = out.splitlines()
    assert status == 0
    assert re.match(r"rule\s+origin\s+examples\s+verdict\s+numerics\s+time$", lines[0])
    assert re.match(r"double_neg\s+\S*good\.fxr:1\s+\d+\s+sound\s+tolerance\s+\d+\.\d\ds$", lines[1])
    assert lines[-1].startswith("1 rule(s) checked in ") and lines[-1].endswith(": 1 sound")


@pytest.mark.slow
def test_an_unsound_rule_exits_one_and_prints_its_report(tmp_path):
    (tmp_path / "mixed.fxr").write_text(SOUND + "\n" + UNSOUND)
    status, out = check([tmp_path], examples=15)
    assert status == 1
    assert re.search(r"^div_self\s+\S*mixed\.fxr:4\s+\d+\s+UNSOUND\s", out, re.MULTILINE)
    assert "rule 'div_self' is unsound: the replacement computes different values" in out
    assert "    x = torch.tensor(0.0, dtype=torch.float32)  # shape ()" in out
    assert out.rstrip().endswith(": 1 sound, 1 unsound")


@pytest.mark.slow
def test_several_paths_and_the_seed(tmp_path):
    (tmp_path / "a.fxr").write_text(SOUND)
    (tmp_path / "b.fxr").write_text(UNSOUND)
    status, out = check([tmp_path / "a.fxr", tmp_path / "b.fxr"], examples=15, seed=5)
    assert status == 1 and "seed=5" in out and "double_neg" in out


def test_origins_are_shown_relative_to_the_working_directory(tmp_path, monkeypatch):
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "good.fxr").write_text(SOUND)
    monkeypatch.chdir(tmp_path)
    _, out = check(["rules"], examples=5)
    assert re.search(r"^double_neg\s+rules/good\.fxr:1\s", out, re.MULTILINE)


@pytest.mark.slow
def test_without_paths_the_shipped_library_is_checked(monkeypatch):
    checked = []

    def fake_check(rule, *, max_examples, seed):
        checked.append(rule.name)
        return CheckResult(rule.name, rule.origin, "sound", max_examples, 0.0, "ok")

    monkeypatch.setattr(check_cli, "check_rule", fake_check)
    status, out = check([], examples=3)
    assert status == 0 and checked == [r.name for r in load_rules()]
    assert out.rstrip().endswith(f"{len(checked)} sound")


def test_a_missing_path_raises_the_loader_error(tmp_path):
    with pytest.raises(RuleLoadError, match="no such rule file or directory"):
        check([tmp_path / "missing"])


# -- selection, processes, progress ---------------------------------------------------------------

THREE = (SOUND + "\nrule relu_relu:\n    torch.relu(torch.relu(x)) => torch.relu(x)\n"
         "\nrule neg_sub:\n    torch.neg(x - y) => y - x\n")


def rows(out):
    return [line.split()[0] for line in out.splitlines()[1:] if line and not line.startswith(("\n", " "))
            and re.match(r"\S+\s+\S+:\d+\s+\d+\s+\S+\s+\S+\s+\d+\.\d\ds$", line)]


@pytest.mark.slow
def test_processes_give_the_rows_and_reports_of_one_process(tmp_path):
    (tmp_path / "a.fxr").write_text(THREE)
    (tmp_path / "b.fxr").write_text(UNSOUND)
    status_1, out_1 = check([tmp_path], examples=10, jobs=1)
    status_2, out_2 = check([tmp_path], examples=10, jobs=2)
    assert status_1 == status_2 == 1
    assert rows(out_1) == ["double_neg", "relu_relu", "neg_sub", "div_self"]  # one process: rule order
    assert sorted(rows(out_2)) == sorted(rows(out_1))  # several: as they finish
    assert out_1.split("\n\n", 1)[1].rsplit("\n\n", 1)[0] == out_2.split("\n\n", 1)[1].rsplit("\n\n", 1)[0]
    assert "rule 'div_self' is unsound" in out_2
    assert "    x = torch.tensor(0.0, dtype=torch.float32)  # shape ()" in out_2
    assert out_2.rstrip().endswith(": 3 sound, 1 unsound")


@pytest.mark.slow
def test_spawned_processes_load_the_rules_again(tmp_path, monkeypatch):
    (tmp_path / "a.fxr").write_text(THREE)
    monkeypatch.setattr(check_cli, "_START_METHOD", "spawn")
    status, out = check([tmp_path], examples=5, jobs=2, keyword="relu or neg_sub")
    assert status == 0 and sorted(rows(out)) == ["neg_sub", "relu_relu"]


@pytest.mark.slow
def test_k_selects_by_rule_and_file_name_like_pytest(tmp_path):
    (tmp_path / "algebra.fxr").write_text(THREE)
    (tmp_path / "other.fxr").write_text(UNSOUND)
    assert rows(check([tmp_path], examples=5, keyword="neg and not sub")[1]) == ["double_neg"]
    assert rows(check([tmp_path], examples=5, keyword="ALGEBRA and not (relu or neg_sub)")[1]) == ["double_neg"]
    status, out = check([tmp_path], examples=5, keyword="other")
    assert status == 1 and rows(out) == ["div_self"]
    assert rows(check([tmp_path], examples=5, keyword="nothing_like_this")[1]) == []


def test_rule_names_select_exactly(tmp_path):
    (tmp_path / "algebra.fxr").write_text(THREE)
    assert rows(check([tmp_path], examples=5, names=["neg_sub", "double_neg"])[1]) == ["double_neg", "neg_sub"]


@pytest.mark.parametrize(("options", "message"), [
    ({"keyword": "relu and ("}, r"-k 'relu and \(' is not a valid expression"),
    ({"names": ["relu_relu", "nope"]}, r"no rule named 'nope' among the 3 loaded rule\(s\); `fxrewrite list`"),
    ({"jobs": 0}, "-j must be at least 1, got 0"),
])
def test_a_bad_selection_is_an_error_saying_what_to_write(tmp_path, options, message):
    (tmp_path / "algebra.fxr").write_text(THREE)
    with pytest.raises(check_cli.RuleSelectionError, match=message):
        check([tmp_path], examples=5, **options)


class Terminal(io.StringIO):
    def isatty(self):
        return True


@pytest.mark.slow
def test_a_terminal_gets_a_status_line_that_is_cleared_before_each_row(tmp_path):
    (tmp_path / "algebra.fxr").write_text(THREE)
    out = Terminal()
    assert run_check([str(tmp_path)], examples=5, out=out, jobs=2) == 0
    text = out.getvalue()
    assert "\r\x1b[K[0/3] checking " in text
    assert all(not line.startswith("[") for line in text.replace("\r\x1b[K", "\n").splitlines() if "sound" in line)
    plain = io.StringIO()
    run_check([str(tmp_path)], examples=5, out=plain, jobs=2)
    assert "\x1b[K" not in plain.getvalue()


@pytest.mark.slow
def test_the_command_line_selects_runs_in_processes_and_exits_1_on_an_unsound_rule(tmp_path, capsys):
    from fxrewrite.cli import main

    (tmp_path / "algebra.fxr").write_text(THREE + "\n" + UNSOUND)
    out = io.StringIO()
    assert main(["check", str(tmp_path), "--examples", "10", "-j", "2", "-k", "div or relu"], out=out) == 1
    assert sorted(rows(out.getvalue())) == ["div_self", "relu_relu"]
    assert main(["check", str(tmp_path), "--examples", "10", "--rule", "relu_relu"], out=io.StringIO()) == 0
    assert main(["check", str(tmp_path), "-k", "(("], out=io.StringIO()) == 2
    assert "is not a valid expression" in capsys.readouterr().err


def test_the_table_shows_each_rules_numerics_contract(tmp_path):
    (tmp_path / "contracts.fxr").write_text(
        "rule neg_neg_exact:\n    -(-x) => x\n    numerics bitwise\n\n"
        "rule abs_abs_loose:\n    torch.abs(torch.abs(x)) => torch.abs(x)\n")
    out = io.StringIO()
    run_check([str(tmp_path)], examples=5, out=out)
    lines = {line.split()[0]: line.split() for line in out.getvalue().splitlines() if line.strip()}
    assert lines["rule"][4] == "numerics"
    assert lines["neg_neg_exact"][4] == "bitwise" and lines["abs_abs_loose"][4] == "tolerance"


@pytest.mark.slow
def test_verbose_shows_each_rules_inputs_drawn_kept_and_rejected(tmp_path):
    (tmp_path / "algebra.fxr").write_text(THREE)
    for jobs in (1, 2):
        status, out = check([tmp_path], examples=5, jobs=jobs, verbose=True)
        drawn = re.findall(r"^ +inputs: drawn (\d+), kept (\d+), rejected (\d+)%$", out, re.MULTILINE)
        assert status == 0 and len(drawn) == 3, out
        assert all(int(d) >= int(k) > 0 for d, k, _ in drawn)
    assert "inputs:" not in check([tmp_path], examples=5)[1]


def test_rules_are_checked_with_fewer_garbage_collections_and_the_settings_come_back():
    import gc

    from fxrewrite.testing import check_cli

    before, frozen = gc.get_threshold(), gc.get_freeze_count()
    with check_cli.fewer_collections():
        assert gc.get_threshold() == check_cli.CHECK_GC_THRESHOLDS and gc.get_freeze_count() > frozen
    assert gc.get_threshold() == before and gc.get_freeze_count() == frozen
    with pytest.raises(KeyError), check_cli.fewer_collections():
        raise KeyError("a check that fails")
    assert gc.get_threshold() == before and gc.get_freeze_count() == frozen


def test_a_worker_collects_less_for_its_whole_life():
    import gc

    from fxrewrite.testing import check_cli

    before = gc.get_threshold()
    try:
        check_cli._initialize(None, [])
        assert gc.get_threshold() == check_cli.CHECK_GC_THRESHOLDS
    finally:
        gc.set_threshold(*before)
        gc.unfreeze()
