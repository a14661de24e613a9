"""Module calls a replacement makes on Proxies are recorded as ``call_module`` nodes
(``fxrewrite._module_calls``): the modes agree, and ``nn.Module`` computes as torch's own between
replacements, after a drive and in other threads."""

from __future__ import annotations

import copy
import threading

import pytest
import torch
import torch.fx as fx
from _helpers import X, assert_rewrite_sound

import fxrewrite._module_calls as module_calls
from fxrewrite import Rule, RuleSet, rewrite

#: torch's own methods, and module classes looked up at run time (a replacement reading them names
#: no module class in its code).
ORIGINAL = {"__call__": vars(torch.nn.Module)["__call__"], "_call_impl": vars(torch.nn.Module)["_call_impl"]}
MODULE_CLASSES = {"relu": torch.nn.ReLU, "tanh": torch.nn.Tanh}


def _replaced() -> set[str]:
    """Which of ``nn.Module.__call__`` and ``nn.Module._call_impl`` are replaced now. (Its code
    names no module class: the replacements calling it must not look as if they could call a
    module.)"""
    module = vars(torch.nn)["Module"]
    return {slot for slot, original in ORIGINAL.items() if vars(module)[slot] is not original}


def _no_hooks_left() -> bool:
    return not torch.nn.modules.module._global_forward_pre_hooks


@pytest.mark.parametrize("held", [True, False], ids=["held", "around each call"])
@pytest.mark.parametrize("dunder", [False, True], ids=["impl", "dunder"])
def test_nn_module_is_replaced_inside_replacements_and_computes_as_torchs_own_outside_them(monkeypatch, dunder, held):
    """The replacement sees ``_call_impl`` replaced (``__call__`` in the slow twin). A guard run
    before the first replacement sees torch's own ``nn.Module``; one run after it sees the method
    still replaced when the drive holds it (``HOLD_FOR_THE_DRIVE``), torch's own when it is put
    back around each call; either way a module it calls on a tensor computes and runs its hooks
    as torch's own call does. After the rewrite, everything is torch's own."""
    monkeypatch.setattr(module_calls, "PATCH_DUNDER_CALL", dunder)
    monkeypatch.setattr(module_calls, "HOLD_FOR_THE_DRIVE", held)
    seen: dict[str, list[set[str]]] = {"guard": [], "replacement": []}
    linear = torch.nn.Linear(4, 4)
    probe, hooked = torch.nn.Tanh(), []
    probe.register_forward_hook(lambda module, args, out: hooked.append(module))

    def guard(match):
        seen["guard"].append(_replaced())
        torch.testing.assert_close(probe(X), torch.tanh(X))
        return True

    def replacement(x):
        seen["replacement"].append(_replaced())
        return linear(x)  # recorded as call_module, not traced through

    rule = Rule.from_functions(lambda x: torch.neg(torch.neg(x)), replacement, name="neg_neg_linear", where=guard)
    f = lambda a: torch.neg(torch.neg(torch.relu(torch.neg(torch.neg(a)))))  # noqa: E731
    result = rewrite(f, rule)
    slot = "__call__" if dunder else "_call_impl"
    assert seen == {"guard": [set(), {slot} if held else set()], "replacement": [{slot}, {slot}]}
    assert hooked == [probe, probe]
    assert _replaced() == set() and _no_hooks_left()
    assert [n.op for n in result.module.graph.nodes].count("call_module") == 2
    result.module.graph.lint()
    torch.testing.assert_close(result.module(X), linear(torch.relu(linear(X))))


def _relu_module_rule(*, catch: bool = False) -> Rule:
    """neg(neg(x)) => a new ReLU module called on x * 2 (a node made before the module call, and
    a module no capture and no name in the replacement's code reveals)."""

    def replacement(x):
        doubled = x * 2.0
        try:
            return MODULE_CLASSES["relu"]()(doubled) + torch.tensor(1.0)
        except Exception:
            if not catch:
                raise
            return doubled

    return Rule.from_functions(lambda x: torch.neg(torch.neg(x)), replacement, name="neg_neg_relu_module")


class _Recorder:
    def __init__(self) -> None:
        self.calls: list[torch.nn.Module] = []

    def module_call(self, module, args, kwargs):
        self.calls.append(module)
        return args[0]


@pytest.mark.parametrize("mode", [module_calls.WATCH, module_calls.IMPL, module_calls.DUNDER])
def test_a_recording_block_puts_everything_back_when_it_raises_and_when_nested(mode):
    """``recording``: inside, this thread's tracer records (its mode's slot replaced, its watcher
    registered); a nested block records into its own tracer and gives the outer one back; on
    leaving, also by an exception, the slot, the tracer and the global hooks are torch's again."""
    outer, inner = _Recorder(), _Recorder()
    proxy = fx.Proxy(fx.Graph().placeholder("x"))
    relu = torch.nn.ReLU()
    slot = {module_calls.IMPL: {"_call_impl"}, module_calls.DUNDER: {"__call__"}}.get(mode, set())
    with pytest.raises(ZeroDivisionError), module_calls.recording(outer, mode) as watch:
        assert _replaced() == slot and (watch is None) == (mode == module_calls.DUNDER)
        with module_calls.recording(inner, module_calls.IMPL):
            assert relu(proxy) is proxy  # recorded, not run
        assert _replaced() == slot and module_calls._ModuleCalls.active_tracer() is (
            None if mode == module_calls.WATCH else outer)
        if mode != module_calls.WATCH:  # (the watcher stops every module call)
            assert relu(proxy) is proxy
            torch.testing.assert_close(relu(-X), torch.relu(-X))  # on tensors: torch's own call
        raise ZeroDivisionError("the block raises")
    assert inner.calls == [relu] and outer.calls == ([] if mode == module_calls.WATCH else [relu])
    assert _replaced() == set() and _no_hooks_left() and module_calls._ModuleCalls.active_tracer() is None


@pytest.mark.parametrize("held", [True, False], ids=["held", "not held"])
def test_a_held_slot_stays_replaced_between_recordings_and_calls_torchs_own_outside_them(monkeypatch, held):
    """``Holds.keep`` (``HOLD_FOR_THE_DRIVE``) keeps a mode's slot replaced after its recording
    block ends, once however often it is kept, until ``release``; meanwhile a module called on a
    tensor, or on a Proxy with no recording block, runs torch's own call (its hooks too) and
    nothing is recorded. Off, keeping holds nothing."""
    monkeypatch.setattr(module_calls, "HOLD_FOR_THE_DRIVE", held)
    recorder, holds = _Recorder(), module_calls.Holds()
    relu = torch.nn.ReLU()
    hooked: list[torch.nn.Module] = []
    relu.register_forward_hook(lambda module, args, out: hooked.append(module))
    graph = fx.Graph()
    proxy = fx.Proxy(graph.placeholder("x"))
    try:
        for mode in (module_calls.IMPL, module_calls.IMPL, module_calls.DUNDER, module_calls.WATCH):
            holds.keep(mode)
            with module_calls.recording(recorder, mode):
                pass
        assert _replaced() == ({"_call_impl", "__call__"} if held else set())
        torch.testing.assert_close(relu(-X), torch.relu(-X))
        traced = relu(proxy)  # no recording block: traced through, as torch's own call does
        assert isinstance(traced, fx.Proxy) and traced.node.target is torch.nn.functional.relu
        assert recorder.calls == [] and hooked == [relu, relu]
    finally:
        holds.release()
    assert _replaced() == set() and _no_hooks_left() and module_calls._ModuleCalls.active_tracer() is None
    holds.release()  # twice: nothing more to give back
    assert _replaced() == set()


def test_a_splicer_block_gives_back_what_it_held_also_when_it_raises():
    """A splicer used as a context manager holds the slot its replacements recorded in until the
    block ends, also by an exception; outside a block it holds nothing after a splice."""
    from fxrewrite.match import match_at
    from fxrewrite.replace import Splicer

    linear = torch.nn.Linear(4, 4)
    rule = Rule.from_functions(lambda x: torch.neg(torch.neg(x)), lambda x: linear(x), name="neg_neg_linear")

    def splice_all(splicer, gm):
        for node in list(gm.graph.nodes):
            if node.op == "call_function" and not node._erased:
                for match in match_at(rule.compiled, node, gm):
                    splicer.splice(match, rule)
                    break

    gm = fx.symbolic_trace(lambda a: torch.neg(torch.neg(a)) + 1)
    with pytest.raises(ZeroDivisionError), Splicer(gm, dict(gm.named_modules())) as splicer:
        splice_all(splicer, gm)
        assert _replaced() == {"_call_impl"}
        raise ZeroDivisionError("the drive fails")
    assert _replaced() == set() and _no_hooks_left()
    gm = fx.symbolic_trace(lambda a: torch.neg(torch.neg(a)) + 1)
    splice_all(Splicer(gm, dict(gm.named_modules())), gm)
    assert _replaced() == set()
    assert [n.op for n in gm.graph.nodes].count("call_module") == 1
    gm.graph.lint()
    gm.recompile()
    torch.testing.assert_close(gm(X), linear(X) + 1)


@pytest.mark.parametrize("catch", [False, True])
def test_a_replacement_calling_a_module_it_does_not_name_records_the_same_graph_in_every_mode(monkeypatch, catch):
    """The slow twins (``PATCH_ALWAYS``: every replacement called with module calls recorded;
    ``PATCH_DUNDER_CALL``: recorded by replacing ``nn.Module.__call__``) and the fast paths (the
    replacement first called unpatched, rolled back and called again when it calls a module,
    even if it catches the stop; ``_call_impl`` replaced) splice the same graph, names included,
    whether the graph's name counts were journaled during the stopped call or copied before it
    (``replace.JOURNALED_NAMES``)."""
    import fxrewrite.replace as replace

    f = lambda a: torch.neg(torch.neg(torch.relu(torch.neg(torch.neg(a)))))  # noqa: E731
    codes = set()
    for always, dunder, journaled in ((True, True, True), (True, False, True), (False, True, True),
                                      (False, False, True), (False, False, False)):
        monkeypatch.setattr(module_calls, "PATCH_ALWAYS", always)
        monkeypatch.setattr(module_calls, "PATCH_DUNDER_CALL", dunder)
        monkeypatch.setattr(replace, "JOURNALED_NAMES", journaled)  # the names taken before the stop, freed
        result = rewrite(f, _relu_module_rule(catch=catch))
        codes.add(result.code)
        assert [n.op for n in result.module.graph.nodes].count("call_module") == 2
        assert_rewrite_sound(lambda a: torch.relu(2.0 * torch.relu(torch.relu(2.0 * a) + 1.0)) + 1.0, result, X)
    assert len(codes) == 1
    assert _no_hooks_left() and _replaced() == set()


def test_a_replacement_without_module_calls_runs_unpatched_and_one_with_them_patched_from_its_first_call(
        monkeypatch):
    """Nothing is replaced around a replacement that calls no module; once a replacement was
    seen calling one, it is called with ``_call_impl`` replaced from then on (once per rewrite).
    (The modes, seen with ``_call_impl`` put back around each call: a drive holding it would
    show it replaced around every later call.)"""
    monkeypatch.setattr(module_calls, "HOLD_FOR_THE_DRIVE", False)
    patched: dict[str, list[set[str]]] = {"plain": [], "module": []}

    def plain(x):
        patched["plain"].append(_replaced())
        return torch.abs(x)

    def module(x):
        patched["module"].append(_replaced())
        return MODULE_CLASSES["tanh"]()(x)

    rules = [Rule.from_functions(lambda x: torch.neg(torch.neg(x)), plain, name="neg_neg_abs"),
             Rule.from_functions(lambda x: torch.relu(torch.relu(x)), module, name="relu_relu_tanh")]
    f = lambda a: torch.relu(torch.relu(torch.neg(torch.neg(torch.relu(torch.relu(torch.neg(torch.neg(a))))))))  # noqa: E731
    result = rewrite(f, RuleSet(rules))
    assert patched["plain"] and all(s == set() for s in patched["plain"])  # called (not only replayed), never patched
    assert patched["module"] == [set(), {"_call_impl"}, {"_call_impl"}]  # seen calling a module, again, then patched
    assert _replaced() == set()
    assert_rewrite_sound(lambda a: torch.tanh(torch.abs(torch.tanh(torch.abs(a)))), result, X)


@pytest.mark.filterwarnings("ignore:Dynamo does not know how to trace")
def test_a_compiled_module_bypassing_call_impl_is_called_again_with_dunder_call_replaced():
    """``nn.Module.__call__`` calls a ``compile()``-d module without ``_call_impl``: the watcher
    stops that call on Proxies, and the replacement is called again with ``__call__`` replaced,
    which records it as every other module call (the same code as the slow twin)."""
    linear = torch.nn.Linear(4, 4)
    linear.compile(backend="eager")
    slots: list[set[str]] = []

    def replacement(x):
        slots.append(_replaced())
        return linear(x) * 2

    rule = Rule.from_functions(lambda x: torch.neg(torch.neg(x)), replacement, name="neg_neg_compiled")
    f = lambda a: torch.neg(torch.neg(torch.relu(torch.neg(torch.neg(a)))))  # noqa: E731
    result = rewrite(f, rule)
    both = {"_call_impl", "__call__"}  # the drive holds _call_impl from the first call on
    assert slots == [{"_call_impl"}, both, both]
    assert [n.op for n in result.module.graph.nodes].count("call_module") == 2
    assert _no_hooks_left() and _replaced() == set()
    result.module.graph.lint()
    torch.testing.assert_close(result.module(X), linear(torch.relu(linear(X) * 2)) * 2)


class _Folds(torch.nn.Module):
    """Three conv -> bn pairs."""

    def __init__(self) -> None:
        super().__init__()
        self.convs = torch.nn.ModuleList(torch.nn.Conv2d(3, 3, 1) for _ in range(3))
        self.bns = torch.nn.ModuleList(torch.nn.BatchNorm2d(3).eval() for _ in range(3))
        with torch.no_grad():
            for bn in self.bns:
                bn.running_mean.uniform_(-0.5, 0.5)
                bn.running_var.uniform_(0.5, 1.5)

    def forward(self, x):
        for conv, bn in zip(self.convs, self.bns):
            x = torch.relu(bn(conv(x)))
        return x


@pytest.mark.parametrize("inplace", [False, True])
def test_the_shipped_conv_bn_fold_splices_the_same_graph_with_every_slow_twin(monkeypatch, inplace):
    """``_call_impl`` or ``__call__`` replaced, the module call recorded directly or by torch.fx's
    ``create_proxy`` (``replace.DIRECT_MODULE_CALLS``): the same code and the same numbers."""
    from _helpers import standard_rules

    import fxrewrite.replace as replace

    torch.manual_seed(0)
    model, x = _Folds().eval(), torch.randn(2, 3, 4, 4)
    results = {}
    for dunder, direct in ((False, True), (True, True), (False, False)):
        monkeypatch.setattr(module_calls, "PATCH_DUNDER_CALL", dunder)
        monkeypatch.setattr(replace, "DIRECT_MODULE_CALLS", direct)
        program = copy.deepcopy(model)
        results[dunder, direct] = rewrite(fx.symbolic_trace(program) if inplace else program,
                                          standard_rules()["conv_bn_fold"], inplace=inplace)
        assert results[dunder, direct].report.applied["conv_bn_fold"] == 3
        assert_rewrite_sound(model, results[dunder, direct], x, rtol=1e-5, atol=1e-5)
    fast = results[False, True]
    for slow in ((True, True), (False, False)):
        assert results[slow].code == fast.code
        assert [(name, type(m)) for name, m in results[slow].module.named_modules()][1:] == [
            (name, type(m)) for name, m in fast.module.named_modules()][1:]  # (each root has a class of its own)
        assert [(n.name, sorted(n.meta)) for n in results[slow].module.graph.nodes] == [
            (n.name, sorted(n.meta)) for n in fast.module.graph.nodes]
        torch.testing.assert_close(results[slow].module(x), fast.module(x), rtol=0, atol=0)


def test_a_module_call_on_an_annotated_graph_gets_its_value_and_its_constant_and_keyword_arguments(monkeypatch):
    """A module called with a tensor constant and a keyword on a graph with shapes: the node
    carries its value, the constant becomes a buffer, as torch.fx's create_proxy records it."""
    import fxrewrite.replace as replace

    class Scale(torch.nn.Module):
        def forward(self, x, *, by):
            return x * by

    def replacement(x):
        return Scale()(x, by=torch.full((4,), 2.0)) + torch.relu(x)

    rule = Rule.from_functions(lambda x: torch.neg(torch.neg(x)), replacement, name="neg_neg_scale")
    f = lambda a: torch.neg(torch.neg(a)) * 3  # noqa: E731
    results = {}
    for direct in (True, False):
        monkeypatch.setattr(replace, "DIRECT_MODULE_CALLS", direct)
        results[direct] = rewrite(f, rule, example_inputs=(X,))
        call = next(n for n in results[direct].module.graph.nodes if n.op == "call_module")
        assert call.meta["val"].shape == X.shape and set(call.kwargs) == {"by"}
        assert_rewrite_sound(lambda a: (a * 2.0 + torch.relu(a)) * 3, results[direct], X)
    assert results[True].code == results[False].code
    assert [(n.name, sorted(n.meta)) for n in results[True].module.graph.nodes] == [
        (n.name, sorted(n.meta)) for n in results[False].module.graph.nodes]


def test_forwards_in_other_threads_run_torchs_own_call_while_replacements_record_module_calls():
    """While one thread's replacements record module calls (``_call_impl`` replaced, the watcher's
    hook registered), other threads' modules compute as always and their calls are not recorded."""
    errors: list[BaseException] = []
    stop = threading.Event()
    bystander = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    x = torch.randn(2, 4)
    expected = bystander(x)

    def forwarding():
        try:
            while not stop.is_set():
                torch.testing.assert_close(bystander(x), expected)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    linear = torch.nn.Linear(4, 4)
    rule = Rule.from_functions(lambda x: torch.neg(torch.neg(x)), lambda x: linear(x), name="neg_neg_linear")
    f = lambda a: sum(torch.neg(torch.neg(a * k)) for k in range(20))  # noqa: E731
    traced = fx.symbolic_trace(f)  # before the thread starts: torch.fx's own tracing patches every thread
    watcher = threading.Thread(target=forwarding)
    watcher.start()
    try:
        for _ in range(3):
            result = rewrite(traced, rule)
            assert [n.op for n in result.module.graph.nodes].count("call_module") == 20
    finally:
        stop.set()
        watcher.join()
    assert not errors, errors[:2]
    assert _replaced() == set() and _no_hooks_left()


@pytest.mark.slow
def test_every_mode_splices_what_the_slow_twins_splice_on_the_whole_library(monkeypatch):
    """The shipped library's cases, each program three times over, rewritten with the fast
    paths and with both slow twins (``PATCH_ALWAYS``, ``PATCH_DUNDER_CALL``): the same code,
    names, metadata and numbers."""
    from test_replace import _spliced, _thrice
    from test_stdlib import CASES, LIBRARY

    import fxrewrite.replace as replace

    for name, case in sorted(CASES.items()):
        rule, inputs = LIBRARY[name], case.inputs()
        results = {}
        torch.manual_seed(0)
        original = _thrice(case)
        for slow in (False, True):
            monkeypatch.setattr(module_calls, "PATCH_ALWAYS", slow)
            monkeypatch.setattr(module_calls, "PATCH_DUNDER_CALL", slow)
            monkeypatch.setattr(replace, "DIRECT_MODULE_CALLS", not slow)
            program = copy.deepcopy(original)
            traced = torch.fx.symbolic_trace(program) if not case.shapes else program
            results[slow] = rewrite(traced, rule, example_inputs=inputs)
        assert results[True].report.applied == results[False].report.applied, name
        assert _spliced(results[True]) == _spliced(results[False]), name
        results[False].module.graph.lint()
        torch.testing.assert_close(results[False].module(*inputs), results[True].module(*inputs), equal_nan=True)
