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
    for row in ("copying rewrite / one-pass copying floor, every row", "in place / in-place floor, every row",
                "scaling exponent", "fxrewrite check, shipped library, -j 2", "peak memory of a copying rewrite",
                "copying rewrite / copy-then-edit floor, all rows"):
        assert row in text
    assert "CORRECTNESS: PASS" in text
    assert "rw/fl" in text and "rw/cf" in text and "hand-written floor worst" in text
    verdicts = text[text.index("per-row verdicts against the floors"):text.index("targets (issue 24")]
    for workload in bench.WORKLOADS:  # one verdict line per row, with both verdicts
        lines = [line for line in verdicts.splitlines() if line.startswith(f"{workload:<9} chain")]
        assert len(lines) == 2 and all(len([w for w in line.split() if w in ("PASS", "FAIL")]) == 2 for line in lines)


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


def test_the_graphs_are_python_programs_traced_by_fx_and_their_blocks_are_where_the_spec_says(bench):
    import torch

    _, work, spec, gm = _planted(bench, "create3")
    assert isinstance(spec.program, torch.nn.Module) and spec.traced.code == torch.fx.symbolic_trace(spec.program).code
    nodes = list(gm.graph.nodes)
    for first, last, rule in spec.blocks:
        outer, inner = work.pairs[rule]
        assert (nodes[first].target, nodes[last].target) == (inner, outer) and last == first + 1
    x = work.example_input()
    torch.testing.assert_close(gm(x), spec.program(x), rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("workload", WORKLOADS)
def test_the_one_pass_floor_builds_the_rewrite_s_graph_and_leaves_the_input_untouched(bench, workload):
    import torch

    import fxrewrite

    _, work, spec, gm = _planted(bench, workload)
    before = gm.code
    floor = bench.one_pass_floor(gm, spec, work)
    floor.graph.lint()
    assert floor is not gm and gm.code == before
    result = fxrewrite.rewrite(gm, work.ruleset())
    incidental = result.report.rewrites - len(spec.blocks)
    missing = bench.graph_signature(floor) - bench.graph_signature(result.module)
    assert not bench.graph_signature(result.module) - bench.graph_signature(floor)
    assert sum(missing.values()) == incidental and (incidental == 0 or workload == "delete")
    x = work.example_input()
    torch.testing.assert_close(floor(x), work.expected_module(spec)(x), rtol=1e-4, atol=1e-5, equal_nan=True)


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
    modules = bench.module_signature(gm)
    in_place = bench.hand_rewrite(gm, spec, work)
    assert in_place is gm and gm.code != before
    torch.testing.assert_close(gm(x), floor(x), rtol=0, atol=0, equal_nan=True)
    # both floors drop the submodules the erased nodes called, as the rewrite does; the copy's
    # deletions leave the input's submodules alone
    assert bench.module_signature(floor) == bench.module_signature(gm) == bench.module_signature(
        bench.one_pass_floor(bench.build(spec), spec, work))
    if workload == "modules":
        assert modules["BatchNorm2d"] == len(spec.blocks) and "BatchNorm2d" not in bench.module_signature(gm)


def test_the_floors_hold_the_submodules_the_rewrite_s_module_holds(bench):
    import fxrewrite

    _, work, spec, gm = _planted(bench, "modules")
    result = fxrewrite.rewrite(gm, work.ruleset())
    expected = bench.module_signature(result.module)
    assert bench.module_signature(bench.one_pass_floor(gm, spec, work)) == expected
    assert bench.module_signature(bench.copying_hand_rewrite(gm, spec, work)) == expected
    assert bench.module_signature(bench.hand_rewrite(bench.build(spec), spec, work)) == expected


def test_a_wrong_floor_is_reported_as_a_correctness_failure(bench, monkeypatch):
    # the floor's check must be able to fail: a floor leaving out the created nodes computes something else
    monkeypatch.setattr(bench.CreateNodes, "emit", lambda self, graph, block, rule, value_of, make, add_module:
                        value_of(block[0].args[0]))
    out = io.StringIO()
    status = bench.main(["--quick", "--sizes", "300", "--workloads", "create1", "-q", "--no-fx", "--no-memory"],
                        out=out)
    assert status == 1 and "the hand-written floor: output differs" in out.getvalue()


def test_a_wrong_rewrite_is_reported_as_a_correctness_failure(bench, monkeypatch):
    # the check must be able to fail: the expected module gets one more op than the rules create
    original = bench.CreateNodes.replaced

    def one_more(self, program, rule, x):
        return original(self, program, rule, x) * 3.0

    monkeypatch.setattr(bench.CreateNodes, "replaced", one_more)
    out = io.StringIO()
    status = bench.main(["--quick", "--sizes", "300", "--workloads", "create1", "-q", "--no-fx", "--no-memory"],
                        out=out)
    assert status == 1 and "CORRECTNESS: FAIL" in out.getvalue() and "output differs" in out.getvalue()


def test_a_floor_building_another_graph_is_reported_as_a_correctness_failure(bench, monkeypatch):
    # both sides of a ratio must build the same graph: a floor keeping the matched nodes does not
    monkeypatch.setattr(bench.CreateNodes, "matched", lambda self, block: [])
    out = io.StringIO()
    status = bench.main(["--quick", "--sizes", "300", "--workloads", "create1", "-q", "--no-fx", "--no-memory"],
                        out=out)
    assert status == 1 and "the one-pass copying floor builds another graph than the rewrite" in out.getvalue()


def test_a_floor_keeping_submodules_the_rewrite_deletes_is_reported_as_a_correctness_failure(bench, monkeypatch):
    # both sides must hold the same submodules: an in-place floor keeping a bn it no longer calls does not
    original = bench.hand_rewrite

    def keeping_one(gm, spec, work):
        result = original(gm, spec, work)
        result.add_submodule("kept_bn", bench.nn.BatchNorm2d(1))
        return result

    monkeypatch.setattr(bench, "hand_rewrite", keeping_one)
    out = io.StringIO()
    status = bench.main(["--quick", "--sizes", "300", "--workloads", "modules", "-q", "--no-fx", "--no-memory"],
                        out=out)
    assert status == 1 and "hold other submodules" in out.getvalue()


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


@pytest.fixture(scope="module")
def bench_rules():
    return _load("bench_rules")


@pytest.mark.slow
def test_bench_rules_quick_mode_reports_both_families_and_their_verdicts(bench_rules):
    out = io.StringIO()
    assert bench_rules.main(["--quick", "--nodes", "600"], out=out) == 0, out.getvalue()
    text = out.getvalue()
    for family in bench_rules.FAMILIES:
        assert sum(line.startswith(f"{family:<8}") for line in text.splitlines()) == 2
        assert f"{family:<8} R=100 vs R=10" in text
    assert "CORRECTNESS: PASS" in text


def test_bench_rules_counts_the_rules_the_index_let_the_driver_try(bench_rules):
    row = bench_rules.measure("literal", 100, 300, 1)
    assert not row.errors, row.errors
    # 100 rules share the anchor and differ in literals: the index offers the one that fits.
    assert row.indexed_attempts * 20 < row.plain_attempts, (row.indexed_attempts, row.plain_attempts)


def test_the_rule_families_are_the_same_program_for_every_rule_count_and_the_index_makes_the_same_rewrites(
        bench_rules):
    import torch

    import fxrewrite

    for family in bench_rules.FAMILIES:
        gm, planted = bench_rules.build(family, 200)
        expected, _ = bench_rules.build(family, 200, rewritten=True)
        rules = bench_rules.ruleset(family, 12)
        with bench_rules.indexed("plain"):
            plain = fxrewrite.rewrite(gm, rules)
        with bench_rules.indexed("indexed"):
            indexed = fxrewrite.rewrite(gm, rules)
        assert planted and plain.report.rewrites == indexed.report.rewrites == planted
        assert plain.code == indexed.code and indexed.report.attempts == plain.report.attempts
        indexed.module.graph.lint()
        x = torch.linspace(-2, 2, 16)
        torch.testing.assert_close(indexed.module(x), expected(x), rtol=1e-5, atol=1e-6, equal_nan=True)
