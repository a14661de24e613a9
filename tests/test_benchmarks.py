"""The benchmark scripts run (quick mode) and check what they measure."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from fxrewrite.loader import import_file

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def _load(name: str):
    return import_file(BENCHMARKS / f"{name}.py", prefix="tests_")


@pytest.fixture(scope="module")
def bench():
    return _load("bench_rewrite")


@pytest.mark.slow
def test_quick_run_prints_every_workload_the_target_table_and_passes_its_correctness_checks(bench):
    out = io.StringIO()
    assert bench.main(["--quick", "--sizes", "300,600", "-q", "--fx-max-nodes", "300"], out=out) == 0
    text = out.getvalue()
    for workload in bench.WORKLOADS:
        assert f"\n{workload:<9} chain    300" in text or f"\n{workload:<9} chain    299" in text, workload
    for row in ("copying rewrite, 3 created nodes, 50% matched, R=10, 8k and 64k", "the same, 10% matched",
                "inplace=True, all rows", "scaling exponent", "fxrewrite check, shipped library, -j 2",
                "peak memory of a copying rewrite"):
        assert row in text
    assert "CORRECTNESS: PASS" in text
    assert "rw/fl" in text and "hand-written floor worst" in text


WORKLOADS = ["create1", "create3", "create10", "delete", "modules", "attention"]


def _planted(bench, workload):
    """The first grid configuration of ``workload``, its workload, and a 400-node graph of it."""
    config = next(c for c in bench.FULL_GRID if c.workload == workload)
    work = bench.workload(config)
    spec = bench.make_spec(work, 400)
    return config, work, spec, bench.build(spec)


@pytest.mark.parametrize("workload", WORKLOADS)
def test_every_planted_block_is_rewritten_and_the_output_is_the_expected_one(bench, workload):
    import torch

    import fxrewrite

    config, work, spec, gm = _planted(bench, workload)
    assert len(gm.graph.nodes) == 400 and spec.blocks
    assert abs(spec.actual_density - config.density) < 0.15
    result = fxrewrite.rewrite(gm, work.ruleset())
    result.module.graph.lint()
    planted = result.report.applied["neg_neg"] if workload == "delete" else result.report.rewrites
    assert planted == len(spec.blocks)
    x = work.example_input()
    torch.testing.assert_close(result.module(x), work.expected_module(spec)(x), rtol=1e-4, atol=1e-5,
                               equal_nan=True)


@pytest.mark.parametrize("workload", WORKLOADS)
def test_the_hand_written_floor_makes_the_rewrite_s_edits_and_leaves_the_input_untouched(bench, workload):
    import torch

    _, work, spec, gm = _planted(bench, workload)
    before = gm.code
    floor = bench.copying_hand_rewrite(gm, spec, work)
    floor.graph.lint()
    assert floor is not gm and gm.code == before
    erased = sum(last - first + 1 for first, last, _ in spec.blocks) if workload != "attention" else 0
    assert len(floor.graph.nodes) <= len(gm.graph.nodes) - erased + len(spec.blocks) * max(getattr(work, "k", 1), 1)
    x = work.example_input()
    torch.testing.assert_close(floor(x), work.expected_module(spec)(x), rtol=1e-4, atol=1e-5, equal_nan=True)
    in_place = bench.hand_rewrite(gm, spec, work)
    assert in_place is gm and gm.code != before
    torch.testing.assert_close(gm(x), floor(x), rtol=0, atol=0, equal_nan=True)


def test_a_wrong_floor_is_reported_as_a_correctness_failure(bench, monkeypatch):
    # the floor's check must be able to fail: a floor leaving out the created nodes computes something else
    monkeypatch.setattr(bench.CreateNodes, "hand_replacement", lambda self, gm, block, rule: block[0].args[0])
    out = io.StringIO()
    status = bench.main(["--quick", "--sizes", "300", "--workloads", "create1", "-q", "--no-fx", "--no-memory"],
                        out=out)
    assert status == 1 and "the hand-written floor: output differs" in out.getvalue()


def test_a_wrong_rewrite_is_reported_as_a_correctness_failure(bench, monkeypatch):
    # the check must be able to fail: the expected module gets one more op than the rules create
    original = bench.CreateNodes.replacement_ops

    def one_more(self, rule, src, emit):
        return emit(("call_function", bench.operator.mul, (original(self, rule, src, emit), 3.0)))

    monkeypatch.setattr(bench.CreateNodes, "replacement_ops", one_more)
    out = io.StringIO()
    status = bench.main(["--quick", "--sizes", "300", "--workloads", "create1", "-q", "--no-fx", "--no-memory"],
                        out=out)
    assert status == 1 and "CORRECTNESS: FAIL" in out.getvalue() and "output differs" in out.getvalue()


@pytest.mark.slow
def test_bench_scale_quick_mode_runs_and_reports(capsys):
    bench = _load("bench_scale")
    code = bench.main(["--quick", "--nodes", "600"])
    out = capsys.readouterr().out
    assert code == 0, out
    for word in ("nodes", "rewrite", "recompile", "peak", "graph"):
        assert word in out


@pytest.mark.slow
def test_bench_models_quick_runs_checks_and_prints_the_table():
    bench_models = _load("bench_models")
    buf = io.StringIO()
    assert bench_models.main(["--quick"], out=buf) == 0, buf.getvalue()
    out = buf.getvalue()
    header = next(line for line in out.splitlines() if line.startswith("model "))
    assert header.split()[:4] == ["model", "level", "nodes", "rewrites"]
    for model in bench_models.MODELS:
        for level in bench_models.LEVELS:
            assert any(line.split()[:2] == [model, level] for line in out.splitlines()), (model, level)
    assert "causal_attention x1" in out and "conv_bn_fold x3" in out and "quantize_linear x3" in out
