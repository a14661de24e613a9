"""``python -m fxrewrite`` (fxrewrite/__main__.py) is the command line: it runs ``cli.main`` with
the process's arguments and exits with its status. (The commands themselves: tests/test_cli.py.)"""

from __future__ import annotations

import runpy
import sys

import pytest

import fxrewrite


def run_module(monkeypatch, *argv: str) -> int:
    monkeypatch.setattr(sys, "argv", ["fxrewrite", *argv])
    with pytest.raises(SystemExit) as exited:
        runpy.run_module("fxrewrite", run_name="__main__", alter_sys=False)
    return exited.value.code


def test_python_dash_m_fxrewrite_runs_the_command_line_and_exits_with_its_status(monkeypatch, capsys):
    assert run_module(monkeypatch, "--version") in (0, None)
    assert fxrewrite.__version__ in capsys.readouterr().out


def test_a_bad_command_exits_with_an_error_status(monkeypatch, capsys):
    assert run_module(monkeypatch, "no-such-command") not in (0, None)
    assert "no-such-command" in capsys.readouterr().err
