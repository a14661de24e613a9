"""The matcher's fast paths against their slow twins (``fxrewrite.match``, ``fxrewrite.canon``).

* ``match.COMPILED``: choice-free patterns walked by their compiled :class:`_Program`
  (``_CompiledWalk``, ``_compiled_sound_match``) instead of the straight walk;
* ``canon.meaning.FAST_KEYS``: node keys of targets that cannot be respelled, from a table;
* ``canon.schema.PLANNED_BINDING``: ATen schemas read once per schema, not at every bind;
* ``canon.identities.FAST_IDENTITY_TEST``: whether a call may be an identity, from a table by target;
* ``canon.schema.FAST_SCHEMA_KIND``: what a call computes, filed by the types of its arguments;
* ``canon.schema.FAST_RESULT_KIND``: that table read first for calls without metadata of targets
  that go straight to their schema.

Each test finds every match of every rule of the shipped library (``fxrewrite.load_rules()``) at
every node of a graph, as the driver asks (no rejections asked for), once with the fast paths and
once with their slow twins, and compares the matches found (rule, anchor, bindings, nodes,
outputs) and counts them: they must be exactly the same, and there must be many.
"""

from __future__ import annotations

import contextlib
import operator
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.fx as fx
from _helpers import standard_rules
from hypothesis import HealthCheck, given, settings

import fxrewrite.canon.identities as identities
import fxrewrite.canon.meaning as meaning
import fxrewrite.canon.schema as schema
import fxrewrite.match as match
from fxrewrite.canon import node_keys
from fxrewrite.index import OpIndex
from fxrewrite.match import match_at
from fxrewrite.meta import propagate_inputs
from fxrewrite.target import to_graph_module

LIBRARY = standard_rules()


@contextlib.contextmanager
def _fast(fast: bool) -> Iterator[None]:
    saved = (match.COMPILED, meaning.FAST_KEYS, schema.PLANNED_BINDING, identities.FAST_IDENTITY_TEST,
             schema.FAST_SCHEMA_KIND, schema.FAST_RESULT_KIND)
    match.COMPILED = meaning.FAST_KEYS = schema.PLANNED_BINDING = identities.FAST_IDENTITY_TEST = fast
    schema.FAST_SCHEMA_KIND = schema.FAST_RESULT_KIND = fast
    try:
        yield
    finally:
        (match.COMPILED, meaning.FAST_KEYS, schema.PLANNED_BINDING, identities.FAST_IDENTITY_TEST,
         schema.FAST_SCHEMA_KIND, schema.FAST_RESULT_KIND) = saved


def every_match(gm: fx.GraphModule, rules=LIBRARY, *, fast: bool) -> list[tuple]:
    """Every match of every rule anchored at one of a node's keys, at every node, as the driver asks."""
    by_key: dict = {}
    for rule in rules:
        by_key.setdefault(rule.anchor_key, []).append(rule)
    modules = dict(gm.named_modules())
    found = []
    with _fast(fast):
        index = OpIndex(gm.graph)
        for node in gm.graph.nodes:
            for key in node_keys(node):
                for rule in by_key.get(key, ()):
                    for m in match_at(rule.compiled, node, gm, modules=modules, candidates=index.nodes):
                        found.append((rule.name, node.name, sorted((k, str(v)) for k, v in m.bindings.items()),
                                      [n.name for n in m.nodes], [n.name for n in m.outputs]))
    return found


def assert_same_matches(gm: fx.GraphModule, rules=LIBRARY) -> int:
    slow = every_match(gm, rules, fast=False)
    assert every_match(gm, rules, fast=True) == slow
    return len(slow)


def test_the_fast_paths_find_the_matches_of_their_slow_twins_on_a_small_program():
    def program(x, y):
        a = torch.neg(torch.neg(x)) + torch.relu(torch.relu(y))
        s = torch.softmax(a @ y.transpose(-2, -1) * 0.5, -1) @ y
        return s.abs().abs(), a[:, None], 1 / a

    gm = fx.symbolic_trace(program)
    assert assert_same_matches(gm) >= 4
    propagate_inputs(gm, (torch.randn(3, 3), torch.randn(3, 3)))
    assert assert_same_matches(gm) >= 4


@pytest.mark.slow  # every shipped rule on every shipped case, with and without shapes: ~10 s
@pytest.mark.parametrize("shapes", [False, True], ids=["no metadata", "shapes"])
def test_the_fast_paths_find_the_matches_of_their_slow_twins_on_every_shipped_case(shapes):
    from test_stdlib import CASES  # tests/e2e is on sys.path, as for test_match

    total = 0
    for case_name, case in sorted(CASES.items()):
        gm = to_graph_module(case.model(), inplace=False)
        if shapes:
            propagate_inputs(gm, case.inputs())
        try:
            total += assert_same_matches(gm)
        except AssertionError as failure:
            raise AssertionError(f"case {case_name}") from failure
    assert total > 150


def _fuzzed_graph():
    from hypothesis import strategies as st
    from test_fuzz_rewrite import random_graph

    return st.composite(random_graph)()


@pytest.mark.slow  # 150 fuzzed graphs: ~15 s
def test_the_fast_paths_find_the_matches_of_their_slow_twins_on_fuzzed_graphs():
    counted = []

    @settings(max_examples=150, derandomize=True, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(_fuzzed_graph())
    def check(built):
        gm, inputs, _ = built
        counted.append(assert_same_matches(gm))
        propagate_inputs(gm, inputs)
        counted.append(assert_same_matches(gm))

    check()
    assert sum(counted) > 300 and sum(1 for c in counted if c) > 100


def _bench_rewrite():
    path = str(Path(__file__).resolve().parents[1] / "benchmarks")
    if path not in sys.path:
        sys.path.insert(0, path)
    import bench_rewrite

    return bench_rewrite


@pytest.mark.slow  # builds five benchmark programs: ~5 s
@pytest.mark.parametrize("workload", ["create1", "create3", "delete", "modules", "attention"])
def test_the_fast_paths_find_the_planted_blocks_of_the_benchmark(workload):
    bench = _bench_rewrite()
    config = next(c for c in bench.FULL_GRID if c.workload == workload)
    work = bench.workload(config)
    spec = bench.make_spec(work, 1000)
    gm = bench.build(spec)
    found = assert_same_matches(gm, work.ruleset())
    assert found >= len(spec.blocks)


def test_node_keys_from_the_table_are_the_keys_worked_out_anew():
    def program(x):
        y = x.permute(1, 0) + x[:, None].squeeze(1) + (1 / x) + x.mT
        z = torch.relu(y).div_(2.0)
        return z.max(-1).values, x.shape[0], torch.ops.aten.neg.default(z)

    gm = fx.symbolic_trace(program)
    exported = torch.export.export(torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.ReLU()),
                                   (torch.randn(2, 3),)).graph_module
    for graph_module in (gm, exported):
        for n in graph_module.graph.nodes:
            with _fast(False):
                slow = node_keys(n), meaning.node_key(n), node_keys(n, False), identities.may_be_identity(n)
            with _fast(True):
                for _ in range(2):  # the table is filled at the first call, read at the second
                    fast = node_keys(n), meaning.node_key(n), node_keys(n, False), identities.may_be_identity(n)
                    assert fast == slow, n.format_node()


def test_a_planned_binding_binds_as_the_schema_read_anew():
    x = fx.Graph().placeholder("x")
    calls = [
        (torch.ops.aten.sum, (x, [1]), {"keepdim": True}), (torch.ops.aten.sum, (x,), {}),
        (torch.ops.aten.max_pool2d, (x, [2, 2]), {}), (torch.ops.aten.transpose, (x, 0, 1), {}),
        (torch.ops.aten.add, (x, 2.0), {"alpha": 2}), (torch.ops.aten.add, (x, x), {}),
        (torch.ops.aten.softmax, (x, -1), {}), (torch.ops.aten.pow, (x, 2), {}), (torch.ops.aten.pow, (2, x), {}),
        (torch.ops.aten.layer_norm, (x, [3]), {"eps": 1e-5}), (torch.ops.aten.clamp, (x,), {"min": 0.0}),
        (torch.ops.aten.to, (x, torch.float16), {}), (torch.ops.aten.view, (x, [-1]), {}),
        (torch.ops.aten.sum, (x, 1), {"bogus": 1}), (torch.ops.aten.neg, (x, x), {}),
    ]
    for packet, args, kwargs in calls:
        for overload in (getattr(packet, name) for name in packet.overloads()):
            for strict in (False, True):
                planned = schema._bind(overload._schema, args, kwargs, strict)
                assert planned == schema._bind_unplanned(overload._schema, args, kwargs, strict), (overload, args)
    bound = schema._bind(torch.ops.aten.max_pool2d.default._schema, (x, [2, 2]), {})
    bound["stride"].append(9)  # a default list is the caller's own, as the schema gives a fresh one
    assert schema._bind(torch.ops.aten.max_pool2d.default._schema, (x, [2, 2]), {})["stride"] == []


def test_result_kinds_filed_by_argument_types_are_the_kinds_filed_by_layout():
    """``FAST_SCHEMA_KIND``: every node of a traced program, an exported one and the shipped
    library's patterns gets the same kind from the table by argument types (filled at the first
    call, read at the second) as from the layout key, and the table files flat calls only."""
    def program(x, n: int):
        y = x.permute(1, 0) + x[:, None].squeeze(1) + (1 / x) + x.mT + x.sum([0, 1], True)
        z = torch.relu(y).div_(2.0).view(-1, 3).view(x.size(0) * n, 3).clamp(min=0.0)
        return z.max(-1).values, x.shape[0], torch.ops.aten.neg.default(z), x.size(), torch.pow(2, x), x.int()

    gm = fx.symbolic_trace(program)
    exported = torch.export.export(torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.ReLU()),
                                   (torch.randn(2, 3),)).graph_module
    modules = fx.symbolic_trace(torch.nn.Sequential(torch.nn.Conv2d(1, 1, 1), torch.nn.ReLU()))
    described = fx.symbolic_trace(torch.nn.Sequential(torch.nn.Conv2d(1, 1, 1), torch.nn.ReLU()))
    propagate_inputs(described, (torch.randn(1, 1, 2, 2),))  # module calls with metadata
    graphs = [gm.graph, exported.graph, modules.graph, described.graph, *(rule.compiled.graph for rule in LIBRARY)]
    nodes = [n for g in graphs for n in g.nodes]
    with _fast(False):
        slow = [schema.result_kind(n) for n in nodes]
    assert [schema.result_kind(n) for n in described.graph.nodes if n.op == "call_module"] == ["tensor"] * 2
    schema._flat_kinds.clear()
    schema._schema_targets.clear()
    with _fast(True):
        for _ in range(2):
            assert [schema.result_kind(n) for n in nodes] == slow
    assert {"tensor", "value", "sequence"} <= set(slow)
    # FAST_RESULT_KIND: the second round read the table first for the targets that go to their schema
    assert (("call_function", torch.relu) in schema._schema_targets
            and ("call_function", torch.ops.aten.neg.default) in schema._schema_targets)
    assert not any(target in (getattr, operator.getitem, operator.add, operator.truediv, "size", "type")
                   for _, target in schema._schema_targets)
    plain = (fx.Node, int, float)
    assert schema._flat_kinds and all(all(t in plain for t in key[2]) for key in schema._flat_kinds)


def test_result_kinds_read_from_the_table_inside_the_walk_keep_its_budget():
    """``FAST_RESULT_KIND`` inside :func:`_kind`'s walk (the inputs of Python arithmetic): a chain
    of arithmetic longer than the walk's budget gets the kind the slow walk gives at every node."""
    def chain(x):
        y = torch.relu(x)
        for i in range(2 * schema._KIND_BUDGET):
            y = y * 0.5 if i % 2 else y + 1.0
        return y

    nodes = list(fx.symbolic_trace(chain).graph.nodes)
    with _fast(False):
        slow = [schema.result_kind(n) for n in nodes]
    with _fast(True):
        [schema.result_kind(n) for n in nodes]  # files relu's target
        assert [schema.result_kind(n) for n in nodes] == slow
    assert {"tensor", "unknown"} <= set(slow)  # the budget ran out far from relu


def test_result_kinds_of_python_arithmetic_decided_from_the_first_input_are_the_walks():
    """``FAST_RESULT_KIND`` for Python arithmetic (``_arithmetic_kind``): ``x + y`` whose first input
    is a filed tensor, or such arithmetic up to eight deep, is a tensor without the walk; a first
    input that is a size, a constant, deeper arithmetic, or a node with metadata is left to the
    walk. Every node gets the kind the slow walk gives, traced and with metadata."""
    def program(x, y):
        s = x.size(0) * 2 + 1  # values first
        a = torch.relu(x) + y  # a filed tensor first
        deep = a
        for i in range(12):  # arithmetic on arithmetic, past the fast path's depth
            deep = deep * 0.5 if i % 2 else deep + y
        c = 2.0 * x - s  # a constant first: the first input node is x
        d = (s + x) * a  # a value first, a tensor second
        return deep, c, d, -a, y ** 2

    gm = fx.symbolic_trace(program)
    annotated = fx.symbolic_trace(program)
    propagate_inputs(annotated, (torch.randn(3, 2), torch.randn(3, 2)))
    nodes = [n for g in (gm.graph, annotated.graph) for n in g.nodes]
    with _fast(False):
        slow = [schema.result_kind(n) for n in nodes]
    with _fast(True):
        [schema.result_kind(n) for n in nodes]  # files relu's target
        assert [schema.result_kind(n) for n in nodes] == slow
        decided = [n.name for n in gm.graph.nodes if schema._arithmetic_kind(n) is not None]
    assert {"tensor", "value"} <= set(slow)
    assert {"add_1", "mul_4", "neg"} <= set(decided) and len(decided) == 10, decided  # mul_5: nine deep
    assert not any(schema._arithmetic_kind(n) for n in annotated.graph.nodes)  # metadata: the walk reads it
