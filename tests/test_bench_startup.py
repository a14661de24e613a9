"""benchmarks/bench_startup.py: cold-process start-up figures and their verdict."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

from fxrewrite.loader import import_file

BENCH = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_startup.py"


@pytest.fixture(scope="module")
def bench():
    return import_file(BENCH, prefix="tests_")


def _row(load_wall: float, load_cpu: float, lark: bool) -> dict:
    row = {name: [0.01, 0.01] for name in ("import fxrewrite", "import torch", "load_rules() call")}
    return {**row, "load": [load_wall, load_cpu], "rules": 140, "lark": [lark]}


@pytest.mark.parametrize("warm, verdict", [
    ((0.09, 0.08), "meets the target of 0.1 s"),
    ((0.30, 0.09), "meets in CPU time only the target"),
    ((0.30, 0.20), "misses the target"),
])
def test_the_verdict_compares_the_warm_load_with_the_target(bench, warm, verdict):
    out = io.StringIO()
    rows = {"cache off": _row(0.5, 0.4, True), "cache cold": _row(0.5, 0.4, True), "cache warm": _row(*warm, False)}
    bench.report(rows, 3, out)
    text = out.getvalue()
    assert verdict in text and "medians of 3 processes" in text
    assert [line.split()[0] for line in text.splitlines()[2:5]] == ["cache", "cache", "cache"]


def test_the_measured_processes_use_their_own_cache_and_bytecode_directories(bench, tmp_path):
    envs = bench.environments(tmp_path, keep_bytecode_setting=False)
    assert envs["cache off"]["FXREWRITE_CACHE"] == "0" and "FXREWRITE_CACHE" not in envs["cache warm"]
    assert all(env["XDG_CACHE_HOME"] == str(tmp_path / "xdg") for env in envs.values())
    assert all("PYTHONDONTWRITEBYTECODE" not in env for env in envs.values())
    kept = bench.environments(tmp_path, keep_bytecode_setting=True)["cache warm"]
    assert kept.get("PYTHONPYCACHEPREFIX") == os.environ.get("PYTHONPYCACHEPREFIX")
    assert kept.get("PYTHONDONTWRITEBYTECODE") == os.environ.get("PYTHONDONTWRITEBYTECODE")


@pytest.mark.slow  # seven fresh processes that import torch
def test_one_run_per_row_reports_every_row_and_the_library_loads_without_lark_when_cached(bench):
    out = io.StringIO()
    assert bench.main(["--runs", "1"], out=out) == 0
    lines = out.getvalue().splitlines()
    warm = next(line for line in lines if line.startswith("cache warm"))
    off = next(line for line in lines if line.startswith("cache off"))
    assert warm.endswith("False") and off.endswith("True")
    assert lines[-1].startswith("verdict: load of the shipped library, cache warm:")
