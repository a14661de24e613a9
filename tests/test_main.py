"""``python -m fxrewrite`` (fxrewrite/__main__.py) is the command line: it runs ``cli.main`` with
the process's arguments and exits with its status. (The commands themselves: tests/test_cli.py.)"""

from __future__ import annotations

import subprocess
import sys

import fxrewrite


def run_module(*argv: str) -> subprocess.CompletedProcess[str]:
    """``python -m fxrewrite ARGV`` in a fresh process, as a user runs it (``runpy`` in this process
    would meet pytest's import hook, which an installed plugin puts on fxrewrite's modules)."""
    return subprocess.run([sys.executable, "-m", "fxrewrite", *argv], capture_output=True, text=True, check=False)


def test_python_dash_m_fxrewrite_runs_the_command_line_and_exits_with_its_status():
    done = run_module("--version")
    assert done.returncode == 0 and fxrewrite.__version__ in done.stdout


def test_a_bad_command_exits_with_an_error_status():
    done = run_module("no-such-command")
    assert done.returncode != 0 and "no-such-command" in done.stderr
