"""Rule sets inside torch.compile: ``inductor_pass`` at each Inductor stage, its content-hash
``uuid`` and the FX graph cache, ``backend``, two passes side by side, ``rewrite_graph``.

Compiles run on CPU Inductor in one temporary cache directory for the whole module (so the
cache test starts cold and nothing is left in the user's cache). Every compiled result is
compared with eager by ``torch.testing.assert_close``.
"""

from __future__ import annotations

import collections
import operator
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.fx as fx
import torch.nn.functional as F
from _helpers import hf_attention_rule, tiny_eager_gpt2
from torch._dynamo.utils import counters
from torch._inductor.custom_graph_pass import CustomGraphPass

import fxrewrite
from fxrewrite import Rule, RuleSet
from fxrewrite.errors import ArgumentError
from fxrewrite.inductor import RulePass, compile_options, fingerprint
from fxrewrite.loader import import_file
from fxrewrite.rewrite import rewrite_graph

SILU = Rule.from_functions(lambda x: x * torch.sigmoid(x), lambda x: F.silu(x), name="silu")
NEG_NEG = Rule.from_functions(lambda x: torch.neg(torch.neg(x)), lambda x: x, name="neg_neg")
RULES = RuleSet([SILU, NEG_NEG])

X, W = torch.randn(4, 8), torch.randn(8, 8)


def gated(x, w):
    y = x @ w
    return -(-(y * torch.sigmoid(y))) + 1  # noqa: B002 (two negations, on purpose)


def silu_when_aligned(x):
    if x.shape[-1] % 4 == 0 and x.dtype == torch.float32:  # branches on the matched value's metadata
        return F.silu(x)
    return x * torch.sigmoid(x)


SILU_ALIGNED = Rule.from_functions(lambda x: x * torch.sigmoid(x), silu_when_aligned, name="silu_aligned")


def op_names(graph: fx.Graph) -> collections.Counter:
    """How often each op is called: ``neg`` for operator.neg, torch.neg and aten.neg alike."""
    def name(n: fx.Node) -> str:
        if isinstance(n.target, torch._ops.OpOverload):
            return n.target.overloadpacket.__name__
        return getattr(n.target, "__name__", str(n.target))

    names = collections.Counter(name(n) for n in graph.nodes if n.op == "call_function")
    names["neg(neg)"] = sum(1 for n in graph.nodes if n.op == "call_function" and name(n) == "neg"
                            and isinstance(n.args[0], fx.Node) and name(n.args[0]) == "neg")
    return names


class Census(CustomGraphPass):
    """Someone else's pass: records the ops of each graph it sees."""

    def __init__(self) -> None:
        self.seen: list[collections.Counter] = []

    def __call__(self, graph: fx.Graph) -> None:
        self.seen.append(op_names(graph))

    def uuid(self) -> str:
        return "fxrewrite-tests-census-v1"


@pytest.fixture(scope="module", autouse=True)
def inductor_cache():
    """One fresh Inductor cache directory for this module's compiles."""
    from torch._inductor.utils import fresh_cache

    with fresh_cache():
        yield


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def compile_with(fn, options, *args):
    return torch.compile(fn, options={**options, "fx_graph_cache": False})(*args)


# -- the pass at every stage ------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["pre_grad", "joint", "joint_post", "post_grad", "post_grad_post"])
def test_one_rule_set_rewrites_at_every_inductor_stage(stage):
    rules, census = fxrewrite.inductor_pass(RULES, stage=stage), Census()
    out = compile_with(gated, compile_options(rules, census, stage=stage), X, W)
    torch.testing.assert_close(out, gated(X, W))
    assert rules.report.applied == {"silu": 1, "neg_neg": 1} and rules.graphs == 1
    assert census.seen and census.seen[0]["neg(neg)"] == 0  # no -(-y) left after the pass


@pytest.mark.slow
def test_joint_stage_rewrites_forward_and_backward_and_gradients_match():
    rules = fxrewrite.inductor_pass(NEG_NEG, stage="joint")
    x = X.clone().requires_grad_()
    out = compile_with(gated, rules.options, x, W)
    out.sum().backward()
    expected_x = X.clone().requires_grad_()
    gated(expected_x, W).sum().backward()
    torch.testing.assert_close(out, gated(X, W))
    torch.testing.assert_close(x.grad, expected_x.grad)
    assert rules.report.applied == {"neg_neg": 2}  # -(-y) forward, -(-grad) backward


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["pre_grad", "post_grad"])
def test_replacement_branching_on_shape_and_dtype_runs_at_torch_and_aten_stages(stage):
    rules = fxrewrite.inductor_pass(SILU_ALIGNED, stage=stage)
    out = compile_with(lambda x: torch.relu(x * torch.sigmoid(x)), rules.options, X)
    torch.testing.assert_close(out, torch.relu(X * torch.sigmoid(X)))
    assert rules.report.applied == {"silu_aligned": 1}


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["pre_grad", "post_grad"])
def test_replacement_branching_on_a_symbolic_size_under_dynamic_shapes(stage):
    rules = fxrewrite.inductor_pass(SILU_ALIGNED, stage=stage)
    compiled = torch.compile(lambda x: torch.relu(x * torch.sigmoid(x)), dynamic=True,
                             options={**rules.options, "fx_graph_cache": False})
    for x in (X, torch.randn(7, 12)):
        torch.testing.assert_close(compiled(x), torch.relu(x * torch.sigmoid(x)))
    # The pass saw the graph and matched; the replacement's branch on a symbolic size is refused,
    # the place left as it was, and the report says why.
    report = rules.report
    assert rules.graphs == 1 and report.attempts["silu_aligned"] == 1 and report.applied["silu_aligned"] == 0
    (reason,) = report.reasons["silu_aligned"]
    assert "branches on a size that is symbolic in this graph (dynamic shapes)" in reason


@pytest.mark.slow
def test_rules_without_branches_work_under_dynamic_shapes():
    rules = fxrewrite.inductor_pass(RULES, stage="post_grad")
    compiled = torch.compile(gated, dynamic=True, options={**rules.options, "fx_graph_cache": False})
    for x in (X, torch.randn(7, 8)):
        torch.testing.assert_close(compiled(x, W), gated(x, W))
    assert rules.report.applied == {"silu": 1, "neg_neg": 1} and rules.graphs == 1


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["pre_grad", "post_grad"])
def test_inductor_hands_the_pass_the_subgraphs_of_torch_cond_too(stage):
    def branchy(x):
        return torch.cond(x.sum() > 0, lambda x: -(-x) + 1, lambda x: -(-x) * 2, (x,))  # noqa: B002

    rules = fxrewrite.inductor_pass(NEG_NEG, stage=stage)
    compiled = torch.compile(branchy, options={**rules.options, "fx_graph_cache": False})
    for x in (X, -X.abs()):
        torch.testing.assert_close(compiled(x), branchy(x))
    assert rules.report.applied == {"neg_neg": 2} and rules.graphs == 3  # the graph and both branches


@pytest.mark.slow
def test_post_grad_pass_lowers_new_nodes_through_inductors_decompositions():
    gm = torch.export.export(_Gated(), (X, W)).run_decompositions().graph_module
    before = op_names(gm.graph)
    rules = fxrewrite.inductor_pass(RULES, stage="post_grad")
    rules(gm.graph)
    gm.graph.lint()
    after = op_names(gm.graph)
    assert rules.report.applied == {"silu": 1, "neg_neg": 1}
    assert before["neg(neg)"] == 1 and after["neg(neg)"] == 0
    assert after["silu"] == 0  # Inductor decomposes aten.silu (it would refuse to lower it): it comes back decomposed
    assert all(isinstance(n.meta.get("val"), torch.Tensor) for n in gm.graph.nodes if n.op == "call_function")
    torch.testing.assert_close(gm(X, W)[0], gated(X, W))


class _Gated(torch.nn.Module):
    def forward(self, x, w):
        return gated(x, w)


@pytest.mark.slow
def test_pre_grad_pass_keeps_dynamos_metadata_convention():
    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    backend = fxrewrite.backend(SILU_ALIGNED, then=record)
    torch.testing.assert_close(torch.compile(lambda x: x * torch.sigmoid(x), backend=backend)(X), F.silu(X))
    (gm,) = graphs
    silu = [n for n in gm.graph.nodes if n.target is F.silu]
    assert len(silu) == 1 and isinstance(silu[0].meta.get("example_value"), torch.Tensor)
    assert not any("val" in n.meta for n in gm.graph.nodes)  # the lent values were given back


def test_pass_report_adds_up_over_graphs():
    rules = fxrewrite.inductor_pass(RULES, stage="pre_grad")
    for fn in (gated, lambda x, w: torch.neg(torch.neg(x @ w))):
        gm = fx.symbolic_trace(fn)
        rules(gm.graph)
        gm.graph.lint()
        torch.testing.assert_close(gm(X, W), fn(X, W))
    assert rules.graphs == 2
    assert rules.report.applied == {"silu": 1, "neg_neg": 2} and rules.report.rewrites == 3
    assert isinstance(rules.report, fxrewrite.Report)


# -- uuid and the FX graph cache ----------------------------------------------------------------


def test_uuid_is_a_content_hash_of_the_rules():
    def scaled(k: float) -> Rule:
        return Rule.from_functions(lambda x: torch.mul(x, 2.0), lambda x: x * k, name="double")

    base = fxrewrite.inductor_pass(RULES).uuid()
    assert base == fxrewrite.inductor_pass(RuleSet([SILU, NEG_NEG])).uuid()
    assert isinstance(base, str) and len(base) == 64
    changed_replacement = Rule.from_functions(lambda x: x * torch.sigmoid(x), lambda x: x / (1 + torch.exp(-x)),
                                              name="silu")
    others = [
        RuleSet([changed_replacement, NEG_NEG]),
        RuleSet([NEG_NEG, SILU]),  # order decides which rule fires first
        RuleSet([SILU]),
        RuleSet([Rule.from_functions(SILU.pattern, SILU.replacement, name="silu2"), NEG_NEG]),
        RuleSet([Rule.from_functions(SILU.pattern, SILU.replacement, name="silu", priority=3), NEG_NEG]),
        RuleSet([Rule.from_functions(SILU.pattern, SILU.replacement, name="silu", where=lambda m: True), NEG_NEG]),
        RuleSet([Rule.from_functions(SILU.pattern, SILU.replacement, name="silu", tolerance={"rtol": 1e-3}),
                 NEG_NEG]),
        RuleSet([Rule.from_functions(SILU.pattern, SILU.replacement, name="silu", domain={"special_values": False}),
                 NEG_NEG]),
    ]
    uuids = [fxrewrite.inductor_pass(r).uuid() for r in others]
    assert len({base, *uuids}) == len(others) + 1
    assert fingerprint(scaled(2.0)) == fingerprint(scaled(2.0)) != fingerprint(scaled(3.0))  # closed-over constant
    assert fxrewrite.inductor_pass(RULES, stage="pre_grad").uuid() != base


def test_uuid_follows_the_content_of_closed_over_tensors_and_arrays():
    def scaled(table) -> Rule:
        return Rule.from_functions(lambda x: torch.mul(x, 2.0), lambda x: x * float(table[-1]), name="double")

    one_changed = torch.zeros(1000)
    one_changed[7] = 1.0
    assert fingerprint(scaled(torch.zeros(1000))) == fingerprint(scaled(torch.zeros(1000)))
    assert fingerprint(scaled(torch.zeros(1000))) != fingerprint(scaled(one_changed))
    np = pytest.importorskip("numpy")
    changed = np.zeros(1000)
    changed[7] = 1.0  # repr() of a large array elides it; the hash reads the bytes
    assert fingerprint(scaled(np.zeros(1000))) == fingerprint(scaled(np.zeros(1000))) != fingerprint(scaled(changed))


def test_uuid_of_dsl_rules_follows_the_rule_text():
    one = fxrewrite.parse_rules("rule neg2:\n    torch.neg(torch.neg(x)) => x\n")
    same = fxrewrite.parse_rules("rule neg2:\n    torch.neg(torch.neg(x)) => x\n")
    other = fxrewrite.parse_rules("rule neg2:\n    torch.neg(torch.neg(x)) => x * 1\n")
    assert fingerprint(one) == fingerprint(same) != fingerprint(other)


RULE_FILES = {
    "act.fxr": """\
        rule silu "x * sigmoid(x) is silu":
            x * torch.sigmoid(x) => F.silu(x)
        """,
    "scale.py": """\
        import torch
        import fxrewrite

        SCALE = {scale}

        @fxrewrite.rule(priority=1)
        def double(x):
            return x + x

        @double.replacement
        def double(x):
            return x * SCALE
        """,
}
UUID_OF_DIR = ("import sys, fxrewrite; print('torch._inductor' in sys.modules); "
               "print(fxrewrite.inductor_pass(fxrewrite.load_rules(sys.argv[1])).uuid())")


def write_rules(root: Path, scale: str) -> Path:
    root.mkdir()
    for name, text in RULE_FILES.items():
        (root / name).write_text(textwrap.dedent(text).format(scale=scale))
    return root


GUARDED_FXR = """\
rule square_self "x * x is square(x)":
    x * x => torch.square(x)
    where x.dtype.is_floating_point
"""


def test_uuid_does_not_depend_on_where_the_rules_live(tmp_path, monkeypatch):
    rules_dir = write_rules(tmp_path / "rules", "2.0")
    (rules_dir / "guarded.fxr").write_text(GUARDED_FXR)  # a guard's description names its file:line
    copy = tmp_path / "clone" / "ci" / "rules"
    shutil.copytree(rules_dir, copy)
    for name in [*RULE_FILES, "guarded.fxr", None]:
        here, there = (rules_dir / name, copy / name) if name else (rules_dir, copy)
        assert fxrewrite.inductor_pass(here).uuid() == fxrewrite.inductor_pass(there).uuid(), name
    monkeypatch.chdir(tmp_path)  # spelled relative or absolute: the same rules
    assert fxrewrite.inductor_pass("clone/ci/rules").uuid() == fxrewrite.inductor_pass(rules_dir).uuid()
    (copy / "guarded.fxr").write_text(GUARDED_FXR.replace("x.dtype.is_floating_point", "x.dim() > 1"))
    assert fxrewrite.inductor_pass(copy).uuid() != fxrewrite.inductor_pass(rules_dir).uuid()  # content counts


@pytest.mark.slow
def test_uuid_is_the_same_in_another_process_and_follows_closed_over_globals(tmp_path):
    rules_dir = write_rules(tmp_path / "rules", "2.0")
    moved = shutil.copytree(rules_dir, tmp_path / "elsewhere" / "rules")  # another process, another folder
    other = subprocess.run([sys.executable, "-c", UUID_OF_DIR, str(moved)], capture_output=True, text=True,
                           check=True, env={"PYTHONHASHSEED": "123", **_env()}).stdout.split()
    inductor_imported_by_import_fxrewrite, other = other
    assert inductor_imported_by_import_fxrewrite == "False"  # torch._inductor is imported on first use only
    fxrewrite.inductor._package_digest.cache_clear()  # fxrewrite's own files are hashed as they are now
    uuid = fxrewrite.inductor_pass(fxrewrite.load_rules(rules_dir)).uuid()
    assert other == uuid
    changed = write_rules(tmp_path / "changed", "2.5")  # only the module constant the replacement reads
    assert fxrewrite.inductor_pass(fxrewrite.load_rules(changed)).uuid() != uuid


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}


def cache_counts() -> dict[str, int]:
    return {k.removeprefix("fxgraph_cache_"): v for k, v in counters["inductor"].items() if k.startswith("fxgraph_")}


def compile_cached(options) -> dict[str, int]:
    torch._dynamo.reset()
    counters.clear()
    with torch._inductor.config.patch({**options, "fx_graph_cache": True}):
        torch.testing.assert_close(torch.compile(gated)(X, W), gated(X, W))
    return cache_counts()


@pytest.mark.slow
def test_fx_graph_cache_hits_for_the_same_rules_and_misses_for_a_changed_rule():
    first = fxrewrite.inductor_pass(RULES, stage="post_grad")
    assert compile_cached(first.options) == {"miss": 1}
    assert first.report.applied == {"silu": 1, "neg_neg": 1}
    again = fxrewrite.inductor_pass(RuleSet([SILU, NEG_NEG]), stage="post_grad")  # equal content, new objects
    assert compile_cached(again.options) == {"hit": 1}
    assert again.graphs == 0  # served from the cache: the pass did not run
    changed = Rule.from_functions(NEG_NEG.pattern, lambda x: x * 1.0, name="neg_neg")
    assert compile_cached(fxrewrite.inductor_pass(RuleSet([SILU, changed])).options) == {"miss": 1}


@pytest.mark.slow
def test_a_pass_without_uuid_bypasses_the_cache_so_the_cache_test_can_fail():
    class NoUuid(Census):
        def uuid(self):
            return None

    assert compile_cached({"post_grad_custom_pre_pass": NoUuid()}) == {"bypass": 1}


# -- the backend --------------------------------------------------------------------------------


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x):
        y = self.proj(x)
        return -(-(y * torch.sigmoid(y)))  # noqa: B002 (two negations, on purpose)


@pytest.mark.slow
def test_backend_rewrites_dynamos_graph_then_hands_it_to_inductor():
    model, backend = _Block().eval(), fxrewrite.backend(RULES)
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(model, backend=backend)(X), model(X))
    assert backend.report.applied == {"silu": 1, "neg_neg": 1} and backend.graphs == 1


@pytest.mark.slow
def test_backend_hands_the_rewritten_graph_to_eager_or_a_callable():
    graphs = []

    def inspect_then_eager(gm, example_inputs):
        graphs.append(op_names(gm.graph))
        return gm.forward

    model = _Block().eval()
    for then in ("eager", inspect_then_eager):
        torch._dynamo.reset()
        backend = fxrewrite.backend(RULES, then=then)
        with torch.no_grad():
            torch.testing.assert_close(torch.compile(model, backend=backend)(X), model(X))
        assert backend.report.applied == {"silu": 1, "neg_neg": 1}
    assert graphs[0]["silu"] == 1 and graphs[0]["neg"] == 0 and graphs[0]["sigmoid"] == 0  # torch level


def test_backend_with_an_unknown_name_or_a_non_callable_is_an_error():
    with pytest.raises(ArgumentError, match="knows no backend of that name"):
        fxrewrite.backend(RULES, then="no-such-backend")
    with pytest.raises(ArgumentError, match="expected a backend name or a callable"):
        fxrewrite.backend(RULES, then=42)


# -- side by side -------------------------------------------------------------------------------


@pytest.mark.slow
def test_two_rule_sets_and_someone_elses_pass_run_side_by_side_in_order():
    first, census = fxrewrite.inductor_pass(SILU, stage="pre_grad"), Census()
    second = fxrewrite.inductor_pass(NEG_NEG, stage="pre_grad")
    options = compile_options(first, census, second, stage="pre_grad")
    assert options == {"pre_grad_custom_pass": [first, census, second]}
    torch.testing.assert_close(compile_with(gated, options, X, W), gated(X, W))
    assert first.report.applied == {"silu": 1} and second.report.applied == {"neg_neg": 1}
    (seen,) = census.seen  # between the two: silu already there, the negs not yet removed
    assert seen["silu"] == 1 and seen["neg(neg)"] == 1


def test_compile_options_needs_a_stage_for_a_pass_that_is_not_fxrewrites():
    with pytest.raises(ArgumentError, match="say at which stage it runs"):
        compile_options(fxrewrite.inductor_pass(SILU), Census())


def test_unknown_stage_is_an_error():
    with pytest.raises(ArgumentError, match="unknown stage"):
        fxrewrite.inductor_pass(RULES, stage="post-grad")


def test_a_copied_pass_is_the_pass_so_its_report_adds_up():
    import copy

    rules = fxrewrite.inductor_pass(RULES)
    assert copy.deepcopy(rules) is rules and copy.deepcopy({"p": [rules]})["p"][0] is rules


def test_pass_is_a_custom_graph_pass_for_the_stage_it_names():
    for stage, option in fxrewrite.inductor.STAGES.items():
        p = fxrewrite.inductor_pass(RULES, stage=stage)
        assert isinstance(p, (CustomGraphPass, RulePass)) and p.options == {option: p}
        assert hasattr(torch._inductor.config, option)


# -- rewrite_graph ------------------------------------------------------------------------------


def test_rewrite_graph_rewrites_a_graph_without_an_owning_module():
    traced = fx.symbolic_trace(gated)
    graph = fx.Graph()
    env = {}
    for n in traced.graph.nodes:
        env[n] = graph.node_copy(n, env.__getitem__)
    assert graph.owning_module is None
    report = rewrite_graph(graph, RULES)
    graph.lint()
    assert report.applied == {"silu": 1, "neg_neg": 1}
    torch.testing.assert_close(fx.GraphModule(torch.nn.Module(), graph)(X, W), gated(X, W))


def test_rewrite_graph_refuses_what_is_not_a_graph():
    with pytest.raises(ArgumentError, match=r"takes a torch\.fx\.Graph"):
        rewrite_graph(fx.symbolic_trace(gated), RULES)


# -- examples/08 --------------------------------------------------------------------------------


@pytest.mark.slow
def test_example_08_rules_directory_fires_inside_a_compiled_gpt():
    """tests/e2e/test_examples.py runs the whole script; this checks what fired, backend only."""
    example = import_file(Path(__file__).resolve().parent.parent / "examples" / "08_rules_in_torch_compile.py",
                          prefix="tests_")
    rules = fxrewrite.load_rules(example.RULES_DIR)
    assert fxrewrite.inductor_pass(example.RULES_DIR).uuid() == fxrewrite.inductor_pass(rules).uuid()  # a path works
    net = example.model()
    tokens = example.tokens_for(net)
    result = example.with_backend(rules, net, tokens)
    assert result["report"].applied == {"silu": 0, "gelu_tanh": 2, "masked_attention": 2}
    assert "scaled_dot_product_attention" in result["after"] and "softmax" not in result["after"]
    with torch.no_grad():
        torch.testing.assert_close(result["out"], net(tokens), rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_bench_compile_measures_the_pass_next_to_the_compile(capsys):
    path = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_compile.py"
    bench = import_file(path, prefix="tests_")
    rules_dir = path.parent.parent / "examples" / "08_rules"
    rows = bench.main(["--model", "tiny", "--layers", "1", "--stages", "pre_grad", "--rules", str(rules_dir)])
    baseline, with_pass = rows
    assert baseline["graphs"] == 0 and with_pass["graphs"] == 1 and with_pass["pass"] > 0
    assert with_pass["fired"] == {"gelu_tanh": 1, "masked_attention": 1}
    assert "pass/compile" in capsys.readouterr().out


# -- Hugging Face GPT-2 ------------------------------------------------------------------------


@pytest.mark.slow
def test_gpt2_eager_attention_becomes_sdpa_inside_torch_compile():
    model = tiny_eager_gpt2()
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(1))
    graphs = []

    def keep_then_eager(gm, example_inputs):
        graphs.append(op_names(gm.graph))
        return gm.forward

    backend = fxrewrite.backend(hf_attention_rule(), then=keep_then_eager)
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(model, backend=backend)(ids).logits, model(ids).logits,
                                   rtol=1e-4, atol=1e-5)
    assert backend.report.applied == {"hf_attention": 2}
    assert graphs[0]["scaled_dot_product_attention"] == 2 and graphs[0]["softmax"] == 0


# -- the graphs a stage is handed, for explain ---------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(("stage", "mul"), [("dynamo", operator.mul), ("pre_grad", operator.mul),
                                            ("post_grad", torch.ops.aten.mul.Tensor)])
def test_stage_graphs_are_what_a_pass_at_that_stage_is_handed_and_explain_reads_them(stage, mul):
    from fxrewrite.inductor import stage_graphs

    (gm,) = stage_graphs(gated, (X, W), stage=stage)
    assert mul in {n.target for n in gm.graph.nodes if n.op == "call_function"}
    gm.graph.lint()
    explained = fxrewrite.explain(gm, RULES)
    assert len(explained["silu"].matches) == 1 and len(explained["neg_neg"].matches) == 1
    typed = Rule.from_functions(lambda x: x * torch.sigmoid(x), lambda x: F.silu(x), name="silu_f32",
                                where=lambda m: m["x"].dtype == torch.float32)  # reads the fake values
    assert len(fxrewrite.explain(gm, typed)["silu_f32"].matches) == 1
    assert torch._inductor.config.pre_grad_custom_pass is None  # nothing left installed
    assert torch._inductor.config.post_grad_custom_pre_pass is None


@pytest.mark.slow
def test_stage_graphs_gives_one_graph_per_graph_break():
    from fxrewrite.inductor import stage_graphs

    def broken(x):
        y = torch.relu(torch.relu(x))
        torch._dynamo.graph_break()
        return -(-y)  # noqa: B002 (two negations, on purpose)

    graphs = stage_graphs(broken, (torch.randn(3),), stage="pre_grad")
    assert len(graphs) == 2
    assert [len(fxrewrite.explain(g, NEG_NEG)["neg_neg"].matches) for g in graphs] == [0, 1]


def test_stage_graphs_refuses_an_unknown_stage():
    from fxrewrite.inductor import stage_graphs

    with pytest.raises(ArgumentError, match="unknown stage; use 'dynamo' or one of 'pre_grad'"):
        stage_graphs(gated, (X, W), stage="pregrad")
