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
    assert re.match(r"rule\s+origin\s+examples\s+verdict\s+time$", lines[0])
    assert re.match(r"double_neg\s+\S*good\.fxr:1\s+\d+\s+sound\s+\d+\.\d\ds$", lines[1])
    assert lines[-1].startswith("1 rule(s) checked in ") and lines[-1].endswith(": 1 sound")


def test_an_unsound_rule_exits_one_and_prints_its_report(tmp_path):
    (tmp_path / "mixed.fxr").write_text(SOUND + "\n" + UNSOUND)
    status, out = check([tmp_path], examples=15)
    assert status == 1
    assert re.search(r"^div_self\s+\S*mixed\.fxr:4\s+\d+\s+UNSOUND\s", out, re.MULTILINE)
    assert "rule 'div_self' is unsound: the replacement computes different values" in out
    assert "    x = torch.tensor(0.0, dtype=torch.float32)  # shape ()" in out
    assert out.rstrip().endswith(": 1 sound, 1 unsound")


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
