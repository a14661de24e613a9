"""The command line, end to end through fxrewrite.cli.main."""

from __future__ import annotations

import io

from fxrewrite.cli import main


def test_check_command_reports_every_rule_and_exits_0_when_sound():
    out = io.StringIO()
    assert main(["check", "rules/algebra.fxr", "--examples", "5"], out=out) == 0
    text = out.getvalue()
    assert "double_neg" in text and "sound" in text


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
