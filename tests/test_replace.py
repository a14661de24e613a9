"""Splicing a replacement in: failures leave the graph exactly as it was."""

from __future__ import annotations

import copy
import operator

import pytest
import torch
import torch.fx as fx
from _helpers import (
    X,
    assert_consistent,
    assert_rewrite_sound,
    assert_same_state,
    graph_state,
    memoizing_rule,
    reordering_rule,
    traced_net,
)

from fxrewrite import RewriteError, Rule, rewrite


def snapshot(gm: fx.GraphModule):
    return gm.code, [n.format_node() for n in gm.graph.nodes], sorted(dict(gm.named_children())), \
        sorted(dict(gm.named_buffers()))


def traced():
    return fx.symbolic_trace(lambda a: torch.neg(torch.neg(a)) + torch.relu(a))


def neg_neg(replacement, **kw):
    return Rule.from_functions(lambda x: torch.neg(torch.neg(x)), replacement, name="neg_neg", **kw)


def test_replacement_that_raises_leaves_the_graph_untouched_and_names_the_rule():
    def replacement(x):
        y = torch.sigmoid(x)  # a node is created before the failure ...
        torch.nn.Linear(1, 1)(y)  # ... and a module registered
        raise ValueError("cannot do it")

    gm = traced()
    before = snapshot(gm)
    with pytest.raises(RewriteError) as info:
        rewrite(gm, neg_neg(replacement), inplace=True)
    message = str(info.value)
    assert "rule 'neg_neg'" in message and "test_replace.py:" in message and "graph node 'neg_1'" in message
    assert "ValueError: cannot do it" in message and "left as it was" in message
    assert snapshot(gm) == before
    gm.graph.lint()
    x = torch.randn(3)
    torch.testing.assert_close(gm(x), x + torch.relu(x))


def test_failure_after_earlier_rewrites_in_place_keeps_them_and_says_so():
    calls = []

    def replacement(x):
        calls.append(x)
        if len(calls) == 2:
            raise RuntimeError("second time fails")
        return x

    gm = fx.symbolic_trace(lambda a: torch.neg(torch.neg(a)) + torch.neg(torch.neg(a * 2)))
    with pytest.raises(RewriteError) as info:
        rewrite(gm, neg_neg(replacement), inplace=True)
    assert "keeps the 1 rewrite(s) applied before this error" in "\n".join(getattr(info.value, "__notes__", []))
    gm.graph.lint()
    x = torch.randn(3)
    torch.testing.assert_close(gm(x), x + x * 2)  # consistent code: recompiled after the rollback


@pytest.mark.filterwarnings("ignore::fxrewrite.RuleWarning")
def test_failing_rewrite_never_touches_the_callers_module():
    gm = traced()
    before = snapshot(gm)
    with pytest.raises(RewriteError):
        rewrite(gm, neg_neg(lambda x: 1 / 0))
    assert snapshot(gm) == before


def test_replacement_returning_wrong_number_of_values_is_an_error():
    def pattern(x):
        return torch.sin(x), torch.cos(x)

    r = Rule.from_functions(pattern, lambda x: torch.sin(x), name="sincos")
    gm = fx.symbolic_trace(lambda a: torch.sin(a) + torch.cos(a))
    before = snapshot(gm)
    with pytest.raises(RewriteError, match=r"the pattern has 2 outputs but the replacement returned a single Proxy"):
        rewrite(gm, r, inplace=True)
    assert snapshot(gm) == before


@pytest.mark.filterwarnings("ignore::fxrewrite.RuleWarning")
def test_replacement_returning_a_non_tensor_is_an_error():
    gm = traced()
    before = snapshot(gm)
    with pytest.raises(RewriteError, match=r"output 0 of the replacement is 3 \(int\)"):
        rewrite(gm, neg_neg(lambda x: 3), inplace=True)
    assert snapshot(gm) == before


@pytest.mark.filterwarnings("ignore::fxrewrite.RuleWarning")
def test_replacement_returning_a_tensor_constant_becomes_a_buffer():
    gm = fx.symbolic_trace(lambda a: torch.neg(torch.neg(torch.zeros(2) * a)))
    result = rewrite(gm, neg_neg(lambda x: torch.ones(2)))
    assert [n.op for n in result.module.graph.nodes].count("get_attr") >= 1
    assert_rewrite_sound(lambda a: torch.ones(2), result, torch.randn(2))  # what the (inexact) rule computes


def test_python_logic_in_replacement_runs_at_rewrite_time():
    def pattern(x, n: int):
        return torch.roll(x, n)

    def replacement(x, n: int):
        return x if n % 4 == 0 else torch.roll(x, n % 4)

    r = Rule.from_functions(pattern, replacement, name="roll_mod", where=lambda m: m["n"] >= 4)
    f = lambda a: torch.roll(a, 8) + torch.roll(a, 5)  # noqa: E731
    result = rewrite(f, r)
    assert "torch.roll(a, 1)" in result.code and "torch.roll(a, 8)" not in result.code
    assert_rewrite_sound(f, result, torch.arange(4.0))


def test_value_metadata_moves_to_the_new_output():
    gm = traced()
    for n in gm.graph.nodes:
        if n.name == "neg_1":
            n.meta["val"] = torch.empty(3)
    result = rewrite(gm, neg_neg(lambda x: torch.mul(x, 1.0)))
    mul = next(n for n in result.module.graph.nodes if n.target is torch.mul)
    assert mul.meta["val"].shape == (3,)
    assert_rewrite_sound(gm, result, torch.randn(3))


# ---- replay: a replacement's recorded graph spliced again, instead of calling it per match -------------------------

def _thrice(case):
    """The case's program three times over, so each rule matches three times (the first call
    records the replacement's graph, the second confirms it, the third is replayed)."""
    import torch.nn as nn

    program = case.model()
    names = ", ".join(f"a{i}" for i in range(len(case.inputs())))
    namespace: dict = {}
    exec(f"def forward(self, {names}):\n    run = self.inner if self.inner is not None else self.program\n"
         f"    return run({names}), run({names}), run({names})\n", namespace)

    class Thrice(nn.Module):
        forward = namespace["forward"]

        def __init__(self):
            super().__init__()
            self.inner = program if isinstance(program, nn.Module) else None
            self.program = None if isinstance(program, nn.Module) else program

    return Thrice()


def _spliced(result):
    """Everything a splice decides: code, node names, targets, provenance and value metadata."""
    nodes = []
    for n in result.module.graph.nodes:
        val = n.meta.get("val")
        shape = (tuple(val.shape), val.dtype) if isinstance(val, torch.Tensor) else None
        nodes.append((n.name, n.op, str(n.target), str(n.args), str(n.kwargs), n.type, sorted(n.meta),
                      n.meta.get("stack_trace"), n.meta.get("fxrewrite_rule"), n.meta.get("nn_module_stack"), shape))
    return result.code, nodes


@pytest.mark.slow
def test_replaying_a_replacement_splices_what_calling_it_again_would_on_the_whole_library(monkeypatch):
    """Replayed (arguments filled in one pass where flat, or by torch.fx's ``map_aggregate``,
    the slow twin) or called again: the same code, names, metadata and numbers."""
    from test_stdlib import CASES, LIBRARY  # tests/ is on sys.path, as for _helpers

    import fxrewrite.replace as replace

    replayed = 0
    for name, case in sorted(CASES.items()):
        rule, inputs = LIBRARY[name], case.inputs()
        results = {}
        torch.manual_seed(0)
        original = _thrice(case)
        for replay, flat in ((True, True), (True, False), (False, True)):
            monkeypatch.setattr(replace, "REPLAY", replay)
            monkeypatch.setattr(replace, "FLAT_REPLAY", flat)
            program = copy.deepcopy(original)
            traced = torch.fx.symbolic_trace(program) if not case.shapes else program
            results[replay, flat] = rewrite(traced, rule, example_inputs=inputs)
        called = results[False, True]
        for config in ((True, True), (True, False)):
            assert results[config].report.applied == called.report.applied, name
            assert _spliced(results[config]) == _spliced(called), name
            results[config].module.graph.lint()
            torch.testing.assert_close(results[config].module(*inputs), called.module(*inputs), equal_nan=True)
        replayed += results[True, True].report.applied[name] >= 3
    assert replayed > 60  # most rules fired thrice, so most were replayed


@pytest.mark.parametrize("replacement", [lambda x: torch.clamp(x * 2.0, min=-1.0, max=1.0),
                                         lambda x: torch.cat([x, x * 2.0], dim=-1).sum(-1, keepdim=True),
                                         lambda x: x.permute(1, 0).reshape((2, -1))[:, 1:]],
                         ids=["flat", "a list", "a tuple and slices"])
def test_a_replayed_node_gets_the_arguments_calling_the_replacement_gives_it(monkeypatch, replacement):
    import fxrewrite.replace as replace

    def fn(a):
        return [torch.neg(torch.neg(a * k)) for k in range(4)]

    results = {}
    for replay, flat in ((True, True), (True, False), (False, True)):
        monkeypatch.setattr(replace, "REPLAY", replay)
        monkeypatch.setattr(replace, "FLAT_REPLAY", flat)
        results[replay, flat] = rewrite(fn, neg_neg(replacement))
        assert results[replay, flat].report.applied["neg_neg"] == 4
    assert _spliced(results[True, True]) == _spliced(results[True, False]) == _spliced(results[False, True])
    a = torch.randn(2, 2)
    for got, expected in zip(results[True, True].module(a), fn(a)):
        torch.testing.assert_close(got, replacement(expected))
    results[True, True].module.graph.lint()


def test_a_replacement_with_state_is_not_replayed():
    calls = []

    def replacement(x):
        calls.append(1)
        return torch.relu(x) * len(calls)  # a different graph each call

    rule = Rule.from_functions(lambda x: torch.neg(torch.neg(x)), replacement, name="stateful")

    def fn(a):
        return torch.neg(torch.neg(a)) + torch.neg(torch.neg(a * 2)) + torch.neg(torch.neg(a * 3))

    result = rewrite(fn, rule)
    assert len(calls) == 3  # the second call recorded another graph than the first: never replayed
    assert "* 3" in result.code
    assert_rewrite_sound(lambda a: torch.relu(a) * 1 + torch.relu(a * 2) * 2 + torch.relu(a * 3) * 3, result,
                         torch.randn(4))  # what the stateful replacement computes


def test_replay_calls_a_pure_replacement_twice_however_many_matches():
    calls = []

    def replacement(x):
        calls.append(1)
        return torch.relu(x) - torch.relu(-x)

    rule = Rule.from_functions(lambda x: torch.neg(torch.neg(x)), replacement, name="pure")

    def fn(a):
        out = a
        for k in range(10):
            out = out + torch.neg(torch.neg(a * k))
        return out

    result = rewrite(fn, rule)
    assert result.report.applied["pure"] == 10 and len(calls) == 2
    result.module.graph.lint()
    a = torch.randn(4)
    torch.testing.assert_close(result.module(a), fn(a))


@pytest.mark.filterwarnings("ignore::fxrewrite.RuleWarning")  # a rule that ignores a bound tensor on purpose
def test_a_template_recorded_where_two_variables_bound_one_value_is_not_replayed_where_they_differ():
    # found by the long fuzz run: x.reshape_as(y).reshape_as(z) => x.reshape_as(z), first matched
    # with x and y both bound to x0, was replayed with y's value for x where they differed
    rule = Rule.from_functions(lambda x, y, z: x.reshape_as(y).reshape_as(z), lambda x, y, z: x.reshape_as(z),
                               name="reshape_as_reshape_as")

    def fn(a):
        same = a.reshape_as(a).reshape_as(a * 1)
        again = a.reshape_as(a).reshape_as(a * 1)
        different = a.reshape_as(torch.ceil(a)).reshape_as(a * 1)
        return same, again, different

    result = rewrite(fn, rule)
    assert result.report.applied["reshape_as_reshape_as"] == 3
    result.module.graph.lint()
    a = torch.randn(3, 3)
    for got, expected in zip(result.module(a), fn(a)):
        torch.testing.assert_close(got, expected)


def test_a_replay_under_preserved_node_meta_records_the_ambient_meta_as_a_call_does(monkeypatch):
    # Inductor and export run passes under fx.traceback.preserve_node_meta(): fx copies the ambient
    # node meta (here a custom annotation) into every node it creates; a replay must do the same
    import torch.fx.traceback as fx_traceback

    import fxrewrite.replace as replace

    rule = Rule.from_functions(lambda x: torch.neg(torch.neg(x)), lambda x: torch.relu(x) * 2, name="neg_neg_relu")

    def fn(a):
        return [torch.neg(torch.neg(a * k)) for k in range(4)]

    results = {}
    for replay in (True, False):
        monkeypatch.setattr(replace, "REPLAY", replay)
        with fx_traceback.preserve_node_meta(), fx_traceback.set_current_meta(_annotated_node()):
            results[replay] = rewrite(fn, rule)
    assert results[True].report.applied["neg_neg_relu"] == 4
    assert _spliced(results[True]) == _spliced(results[False])
    customs = [n.meta.get("custom") for n in results[True].module.graph.nodes if n.meta.get("fxrewrite_rule")]
    assert customs == [{"pass": "mine"}] * 8
    results[True].module.graph.lint()
    a = torch.randn(4)
    for got, expected in zip(results[True].module(a), fn(a)):
        torch.testing.assert_close(got, torch.relu(expected) * 2)


@pytest.mark.filterwarnings("ignore::fxrewrite.RuleWarning")  # add_zero ignores y's broadcasting on purpose
@pytest.mark.parametrize("example", [False, True], ids=["plain", "with values"])
def test_a_deletion_spliced_without_the_replay_makes_what_the_replay_makes(monkeypatch, example):
    """``FAST_DELETION`` (a confirmed template that creates no node: rewire and erase only) and its
    slow twin, the whole splice with its replay: the same code, names, metadata, reports and
    numbers, for deletions returning one of two variables, past a literal, and with both
    variables bound to one value (a template of its own)."""
    import fxrewrite.replace as replace
    from fxrewrite import RuleSet

    rules = RuleSet([
        neg_neg(lambda x: x),
        Rule.from_functions(lambda x, y: torch.add(x, torch.mul(y, 0.0)), lambda x, y: x, name="add_zero"),
    ])

    def fn(a):
        outs = []
        for k in range(6):
            b = torch.sin(a * (k + 1))
            outs.append(torch.neg(torch.neg(torch.neg(torch.neg(b)))) * torch.add(b, torch.mul(a, 0.0)))
            outs.append(torch.add(b, torch.mul(b, 0.0)))  # x and y bound to one value
            outs.append(torch.relu(torch.neg(torch.neg(b))))
        return outs

    a = torch.randn(3, 4)
    results = {}
    for fast in (True, False):
        monkeypatch.setattr(replace, "FAST_DELETION", fast)
        results[fast] = rewrite(fn, rules, example_inputs=(a,) if example else None)
        assert results[fast].report.applied == {"neg_neg": 18, "add_zero": 12}
        results[fast].module.graph.lint()
    assert _spliced(results[True]) == _spliced(results[False])
    assert results[True].report.attempts == results[False].report.attempts
    for got, expected in zip(results[True].module(a), fn(a)):
        torch.testing.assert_close(got, expected)


def _annotated_node():
    graph = torch.fx.Graph()
    node = graph.placeholder("ambient")
    node.meta["custom"] = {"pass": "mine"}
    return node


# ---- replacements that return something other than a tensor ----------------------------------------------------


@pytest.mark.parametrize("replacement", [lambda x: x.shape, lambda x: x.dim(), lambda x: x.size(0) * 1.0],
                         ids=["shape", "dim", "size"])
def test_replacement_returning_a_proxy_of_a_non_tensor_is_a_rewrite_error(replacement):
    _, gm = traced_net()
    with pytest.raises(RewriteError, match="but the pattern matched a tensor there"):
        rewrite(gm, neg_neg(replacement), example_inputs=(X.clone(),))


# ---- replacements that read values not live before them -----------------------------------------------------


@pytest.mark.parametrize("make", [memoizing_rule, reordering_rule], ids=["stale proxy", "reordered node"])
@pytest.mark.parametrize("inplace", [False, True], ids=["copy", "inplace"])
def test_replacement_reading_a_value_that_is_not_live_before_it_is_refused_and_rolled_back(make, inplace):
    r = make()
    if make is memoizing_rule:
        rewrite(lambda a: torch.neg(torch.neg(a)), r)  # caches a Proxy of that graph
    model, gm = traced_net()
    before = graph_state(gm)
    with pytest.raises(RewriteError, match=f"rule '{r.name}' .* which is not a live value of this graph before it"):
        rewrite(gm, r, inplace=inplace)
    assert_same_state(before, graph_state(gm))
    assert_consistent(gm, model)


def test_a_replacement_reads_itemsize_and_nbytes_from_the_metadata():
    """canon's METADATA_ATTRIBUTES: sizes in bytes follow from dtype and shape, so a replacement
    may branch on them at rewrite time (no getattr node is recorded)."""
    seen = []

    def replacement(x):
        seen.append((x.itemsize, x.nbytes))
        return x * 2 if x.itemsize == 4 else x + x

    rule = neg_neg(replacement)
    f = lambda a: torch.neg(torch.neg(a)) + 1  # noqa: E731
    result = rewrite(f, rule, example_inputs=(X,))
    assert seen == [(4, 4 * X.numel())]
    assert [n.target for n in result.module.graph.nodes if n.op != "placeholder" and n.op != "output"] == [
        operator.mul, operator.add]
    result.module.graph.lint()
    torch.testing.assert_close(result.module(X), X * 2 + 1)  # the branch taken: float32 has 4 bytes


class _Folds(torch.nn.Module):
    """Four conv -> bn pairs; the first conv is also called on its own (a second place)."""

    def __init__(self) -> None:
        super().__init__()
        self.convs = torch.nn.ModuleList(torch.nn.Conv2d(3, 3, 1) for _ in range(4))
        self.bns = torch.nn.ModuleList(torch.nn.BatchNorm2d(3).eval() for _ in range(4))

    def forward(self, x):
        y = self.convs[0](x)
        for conv, bn in zip(self.convs, self.bns):
            x = bn(conv(x))
        return x + y


def test_module_call_sites_are_counted_once_and_kept_current_as_the_slow_scan_counts_them(monkeypatch):
    """The splicer's per-path count of ``call_module`` nodes (kept current across folds) refuses
    and allows exactly what torch.fx's scan of every call_module node does: the shared conv is
    not folded, the three others are."""
    from _helpers import standard_rules

    import fxrewrite.replace as replace

    fold = standard_rules()["conv_bn_fold"]
    model, x = _Folds().eval(), torch.randn(2, 3, 4, 4)
    results = {}
    for slow in (False, True):
        if slow:
            monkeypatch.setattr(replace._ModuleCallSites, "_table", lambda self: None)
        results[slow] = rewrite(model, fold)
        assert_rewrite_sound(model, results[slow], x, rtol=1e-5, atol=1e-5)
    fast, plain = results[False], results[True]
    assert fast.code == plain.code
    assert fast.report.applied["conv_bn_fold"] == plain.report.applied["conv_bn_fold"] == 3
    assert fast.report.reasons == plain.report.reasons and "2 places" in fast.report.reasons["conv_bn_fold"][0]


def test_module_call_sites_recount_after_an_edit_the_splicer_did_not_make():
    import fxrewrite.replace as replace

    gm = fx.symbolic_trace(_Folds())
    sites = replace._ModuleCallSites(gm.graph)
    assert sites.count("convs.0", []) == 2
    extra = next(n for n in gm.graph.nodes if n.op == "call_module" and n.target == "convs.0")
    with gm.graph.inserting_after(extra):
        gm.graph.call_module("convs.0", (extra,))
    assert sites.count("convs.0", []) == 3  # more call_module nodes than accounted for: counted again


@pytest.mark.parametrize("journaled", [True, False])
def test_a_name_mark_puts_back_exactly_the_names_a_rolled_back_call_took(monkeypatch, journaled):
    """Names taken during a call (a new base, a base in use, an explicit suffix, a name taken and
    its node erased again) are freed and the graph's name counts are back as they were, whether
    they were journaled during the call (``JOURNALED_NAMES``) or copied before it; the graph then
    names nodes as it would have without the call, and keeps torch.fx's own dict of counts."""
    import fxrewrite.replace as replace

    monkeypatch.setattr(replace, "JOURNALED_NAMES", journaled)
    gm = fx.symbolic_trace(lambda a: torch.relu(torch.neg(torch.neg(a))) * 2)
    namespace = gm.graph._graph_namespace
    before = (dict(namespace._base_count), set(namespace._used_names))
    expected = [n.name for n in _names_made(copy.deepcopy(gm))]
    assert expected == ["neg_2", "neg_3", "sinh", "cosh_7", "neg_4"]
    tracer = replace._ReplacementTracer(gm, dict(gm.named_modules()))
    mark = tracer.names()
    made = _names_made(gm)
    tracer.created = made
    tracer.rollback(mark)
    mark.close()
    assert type(namespace._base_count) is dict
    assert (namespace._base_count, namespace._used_names) == before
    assert [n.name for n in _names_made(gm)] == expected
    gm.graph.lint()


def _names_made(gm: fx.GraphModule) -> list[fx.Node]:
    """Nodes made at the output: names from a new base, a base in use, an explicit suffix, and one erased again."""
    graph = gm.graph
    x = next(iter(graph.nodes))
    with graph.inserting_before(graph.output_node()):
        erased = graph.call_function(torch.neg, (x,))
        graph.erase_node(erased)
        return [erased, graph.call_function(torch.neg, (x,)), graph.call_function(torch.sinh, (x,)),
                graph.create_node("call_function", torch.cosh, (x,), name="cosh_7"),
                graph.call_function(torch.neg, (x,))]


class _Taken(fx.GraphModule):
    """A GraphModule whose class takes names a replacement's new module could get."""

    fresh_sigmoid_1 = 3

    @property
    def fresh_sigmoid_3(self):
        return 3


@pytest.mark.parametrize("fast", [True, False])
def test_a_new_module_takes_the_first_name_no_attribute_of_the_target_has(monkeypatch, fast):
    """The fresh names of new modules (``FAST_MODULE_ATTRIBUTES``: read from the module's tables,
    its slow twin ``hasattr``) pass over a buffer, a class attribute, a parameter, a property, a
    plain attribute and a submodule of the target that hold the names a rule would take."""
    from fxrewrite.canon import effects

    monkeypatch.setattr(effects, "FAST_MODULE_ATTRIBUTES", fast)

    def program(a):
        return [torch.sigmoid(a * k) for k in range(1, 5)]

    gm = _Taken(torch.nn.Module(), fx.symbolic_trace(program).graph)
    gm.register_buffer("fresh_sigmoid_0", torch.zeros(1))
    gm.register_parameter("fresh_sigmoid_2", torch.nn.Parameter(torch.zeros(1)))
    gm.fresh_sigmoid_4 = "taken"
    gm.add_module("fresh_sigmoid_5", torch.nn.Identity())
    result = rewrite(gm, Rule.from_functions(lambda x: torch.sigmoid(x), lambda x: torch.nn.Sigmoid()(x), name="fresh"),
                     inplace=True)
    result.module.graph.lint()
    called = [n.target for n in result.module.graph.nodes if n.op == "call_module"]
    assert called == ["fresh_sigmoid_6", "fresh_sigmoid_7", "fresh_sigmoid_8", "fresh_sigmoid_9"]
    a = torch.randn(3)
    for got, expected in zip(result.module(a), program(a)):
        torch.testing.assert_close(got, expected)


def test_a_splice_tells_whether_its_nodes_write_in_place_called_replayed_or_deleted(monkeypatch):
    """``Change.writes`` is ``canon.writes_in_place`` of the created nodes, whether the replacement
    was called, replayed from its template or spliced as a deletion (each rule matches four times)."""
    from fxrewrite import RuleSet, driver
    from fxrewrite.canon import writes_in_place

    seen = []
    original = driver.Driver._on_change

    def recording(self, change):
        seen.append((change.writes, writes_in_place(change.created)))
        original(self, change)

    monkeypatch.setattr(driver.Driver, "_on_change", recording)

    def doubled_in_place(x):
        y = torch.clone(x)
        y.mul_(2.0)  # into a tensor of its own
        return y

    rules = RuleSet([Rule.from_functions(lambda x: x * 2.0, doubled_in_place, name="doubled_in_place"),
                     Rule.from_functions(lambda x: torch.relu(torch.relu(x)), lambda x: torch.relu(x), name="plain"),
                     neg_neg(lambda x: x)])

    def f(a):
        return sum((a + k) * 2.0 + torch.relu(torch.relu(a - k)) + torch.neg(torch.neg(a * k)) for k in range(4))

    result = rewrite(f, rules)
    assert result.report.applied == {"doubled_in_place": 4, "plain": 4, "neg_neg": 4}
    assert all(told == truth for told, truth in seen)
    assert [told for told, _ in seen].count(True) == 4
    assert_rewrite_sound(f, result, X)
