"""Tracing a rule's pattern (``fxrewrite.pattern``): parameters and their kinds, outputs and the
anchor, the nodes that compute Python values, and the patterns refused when a rule is built."""

from __future__ import annotations

import math
import re
from typing import Annotated

import pytest
import torch
import torch.nn as nn

import fxrewrite
from fxrewrite import Rule
from fxrewrite.errors import RuleDefinitionError
from fxrewrite.pattern import Accept, trace_pattern


def traced(fn):
    return trace_pattern(fn, rule_name="p", origin="<test>:1")


def test_parameters_are_variables_literal_captures_or_module_captures():
    def pattern(x, s: float, d: torch.dtype, conv: nn.Conv2d):
        return conv(x).to(d) * s

    p = traced(pattern)
    assert [(q.name, q.kind) for q in p.params] == [("x", "tensor"), ("s", "literal"), ("d", "literal"),
                                                     ("conv", "module")]
    assert p.anchor.target is __import__("operator").mul and p.anchor_key == ("aten", "mul")


def test_annotated_module_captures_say_what_else_they_accept():
    def pattern(x, lin: Annotated[nn.Linear, fxrewrite.Accept(hooks=True)]):
        return torch.relu(lin(x))

    (_, lin) = traced(pattern).params
    assert lin.kind == "module" and lin.annotation is nn.Linear and lin.accept == Accept(hooks=True)


def test_size_and_dtype_expressions_are_value_nodes_and_not_anchor_inputs():
    p = traced(lambda q, k: (q @ k) / math.sqrt(q.size(-1)))
    assert sorted(n.name for n in p.value_nodes) == ["size", "sqrt"]
    assert ("aten", "matmul") in p.anchor_input_keys and ("aten", "size") not in p.anchor_input_keys


def test_multi_output_patterns_anchor_at_their_last_output():
    def pattern(x):
        return torch.sin(x), torch.cos(x)

    p = traced(pattern)
    assert p.is_multi_output and p.anchor.target is torch.cos


@pytest.mark.parametrize("fn, fragment", [
    (lambda x: x, "returns its parameter 'x' unchanged"),
    (lambda x: x.add_(1), "in-place method"),
    (lambda x, y: torch.relu(x), "pattern parameter 'y' is never used"),
    (lambda x: torch.relu(x) if x.sum() > 0 else x, "cannot be traced"),
])
def test_patterns_that_cannot_be_matched_are_refused_when_built(fn, fragment):
    with pytest.raises(RuleDefinitionError, match=fragment):
        traced(fn)


def test_a_pattern_that_changes_global_state_leaves_no_trace():
    def pattern(x):
        torch.set_default_dtype(torch.float64)
        return torch.relu(x)

    before = torch.get_default_dtype()
    traced(pattern)
    assert torch.get_default_dtype() == before


@pytest.mark.parametrize("pattern, fragments", [
    (lambda x: torch.relu(x) if x.sum() > 0 else x, ["control flow", "where= guard", "torch.fx.wrap"]),
    (lambda x: torch.relu(x) if x.shape[0] > 2 else x, ["control flow", "where= guard"]),
    (lambda x: sum(t for t in x), ["Proxy object cannot be iterated", "cannot branch or loop"]),
    (lambda x: x.view(len(x), -1), ["'len' is not supported in symbolic tracing", "torch.fx.wrap"]),
    (lambda x: x * int(x), ["TypeError: int() argument must be", "torch operations on its parameters only"]),
    # RUF015's next(...) would be another pattern: this one must build the list to fail the way it does
    (lambda x: [x[i] for i in range(x.size(0))][0], ["'Proxy' object cannot be interpreted as an integer"]),  # noqa: RUF015
    (lambda x: x + torch.ones(3), ["tensor constant", "Pass the value as a parameter instead"]),
    (lambda x: torch.relu(x).add_(1), ["in-place method '.add_()'", "patterns must be pure"]),
    (lambda x: x + torch.rand_like(x), ["has a side effect"]),
])
def test_untraceable_or_impure_pattern_is_a_definition_error_naming_rule_and_origin(pattern, fragments):
    with pytest.raises(RuleDefinitionError) as info:
        Rule.from_functions(pattern, lambda x: x, name="bad")
    message = str(info.value)
    assert message.startswith("rule 'bad' (") and "test_pattern.py:" in message
    for fragment in fragments:
        assert fragment in message


_BAD_PATTERNS = [
    lambda x: torch.relu(x) if x.sum() > 0 else x,
    lambda x: sum(t for t in x),
    lambda x: x.view(len(x), -1),
    lambda x: x * int(x),
    lambda x: [x[i] for i in range(x.size(0))][0],  # noqa: RUF015
    lambda x: x + torch.ones(3),
    lambda x: torch.relu(x).add_(1),
    lambda x, y: torch.relu(x),
    lambda x: x,
    lambda x: 2.0,
]


def test_a_bad_pattern_fails_with_the_same_error_traced_quickly_or_the_plain_way(monkeypatch):
    """The quick tracer's fast paths (placeholders, argument conversion) against fx's own tracer
    (plain=True, their slow twin): a pattern that cannot be a rule gets the very same error."""
    from fxrewrite.pattern import _PatternTracer

    def message(pattern):
        with pytest.raises(RuleDefinitionError) as info:
            Rule.from_functions(pattern, lambda x: x, name="bad")
        return f"{type(info.value.__cause__).__name__}: {info.value}"

    calls = []
    quickly = _PatternTracer.trace_quickly
    monkeypatch.setattr(_PatternTracer, "trace_quickly", lambda self, fn: calls.append(fn) or quickly(self, fn))
    quick = [message(p) for p in _BAD_PATTERNS]
    assert len(calls) == len(_BAD_PATTERNS)
    init = _PatternTracer.__init__
    monkeypatch.setattr(_PatternTracer, "__init__", lambda self, params, plain=False: init(self, params, plain=True))
    assert [message(p) for p in _BAD_PATTERNS] == quick
    assert len(calls) == len(_BAD_PATTERNS)  # the plain way took no quick path


# ---- optional literal captures ----------------------------------------------------------------


def _clamp_twice(x, lo: float | None, hi: float | None):
    return torch.clamp(torch.clamp(x, lo, hi), lo, hi)


def test_an_optional_literal_capture_binds_a_number_or_none():
    rule = Rule.from_functions(_clamp_twice, lambda x, lo, hi: torch.clamp(x, lo, hi), name="clamp_twice")
    lo = next(p for p in rule.compiled.params if p.name == "lo")
    assert (lo.kind, lo.annotation, lo.optional) == ("literal", float, True)
    assert lo.accepts_literal(None) and lo.accepts_literal(0.5) and not lo.accepts_literal("a")
    program = lambda a: a.clamp(min=0.0).clamp(min=0.0)  # noqa: E731 - a one-line program
    result = fxrewrite.rewrite(program, rule)
    assert result.report.applied["clamp_twice"] == 1
    x = torch.randn(5)
    result.module.graph.lint()
    torch.testing.assert_close(result.module(x), program(x))


def test_a_plain_literal_capture_does_not_bind_none():
    plain = Rule.from_functions(lambda x, lo: torch.clamp(torch.clamp(x, lo, None), lo, None),
                                lambda x, lo: torch.clamp(x, lo, None), name="plain")
    (_, lo) = plain.compiled.params
    assert not lo.optional and not lo.accepts_literal(None)


def test_an_optional_capture_of_something_else_than_a_literal_type_is_an_error():
    def pattern(x, m: nn.Linear | None):
        return x

    with pytest.raises(RuleDefinitionError, match=re.escape("'| None', for a capture that may also bind None")):
        trace_pattern(pattern, rule_name="r", origin="<test>")


# ---- the quick tracer and its slow twin (torch.fx.Tracer.trace) ----------------------------------


def _graph_text(graph: torch.fx.Graph) -> list[tuple]:
    """Everything the traced graph says, node by node (arguments by node name)."""
    def plain(value):
        return torch.fx.node.map_arg(value, lambda n: ("node", n.name))

    return [(n.op, n.name, n.target, plain(n.args), plain(n.kwargs), n.type, dict(n.meta)) for n in graph.nodes]


def _both_ways(fn, params=None):
    from fxrewrite.pattern import TRACING, _PatternTracer, signature_params

    params = signature_params(fn, where="<test>", role="pattern") if params is None else params
    with TRACING:
        quick = _PatternTracer(params).trace_quickly(fn)
        plain = _PatternTracer(params, plain=True).trace(fn)
    return quick, plain


def _assert_same_graph(quick: torch.fx.Graph, plain: torch.fx.Graph) -> None:
    assert _graph_text(quick) == _graph_text(plain)
    assert quick._co_fields == plain._co_fields
    assert quick.python_code("self").src == plain.python_code("self").src


def _library_and_example_rules():
    from pathlib import Path

    from fxrewrite.loader import load_rules

    root = Path(__file__).resolve().parent.parent
    yield from load_rules()
    for folder in sorted((root / "examples").glob("*_rules")):
        yield from load_rules(folder)


@pytest.mark.slow  # loads the library and the examples, and traces each pattern twice: 2 s
def test_quick_tracing_gives_the_plain_graph_for_every_library_and_example_rule():
    rules = list(_library_and_example_rules())
    assert len(rules) > 140
    for rule in rules:
        _assert_same_graph(*_both_ways(rule.pattern, rule.compiled.params))


def test_quick_tracing_records_autowrapped_math_and_fx_wrapped_functions_as_fx_does():
    namespace: dict = {"__name__": "wrapped_for_a_test"}
    exec(compile("import math, torch, torch.fx\nfrom math import sqrt\n"
                 "def scaled(x):\n    return x * 2\n"
                 "torch.fx.wrap('scaled')\n"
                 "def pattern(q):\n    return scaled(q) / sqrt(q.size(-1)) + math.log(q.size(0))\n",
                 "<wrapped>", "exec"), namespace)
    quick, plain = _both_ways(namespace["pattern"])
    _assert_same_graph(quick, plain)
    assert {"scaled", "sqrt", "log"} <= {getattr(n.target, "__name__", None) for n in quick.nodes}
    assert namespace["sqrt"] is math.sqrt and namespace["scaled"].__name__ == "scaled"  # patches undone
    assert math.log.__module__ == "math" and not hasattr(math.log, "__fx_already_patched")


class _Doubling(nn.Module):
    def forward(self, x):
        return x * 2


@pytest.mark.parametrize("module", [_Doubling(), nn.ReLU()], ids=["own module", "torch.nn module"])
def test_a_pattern_calling_a_module_is_traced_the_plain_way(module):
    from fxrewrite.pattern import TRACING, _ModuleCalled, _PatternTracer

    def through_module(x):
        return torch.neg(module(x))

    with TRACING, pytest.raises(_ModuleCalled):
        _PatternTracer(()).trace_quickly(through_module)
    errors = []
    for plain in (False, True):  # torch.fx refuses a module that is not part of the traced root
        with TRACING, pytest.raises(NameError, match="not installed as a submodule") as error:
            _PatternTracer((), plain=plain).trace(through_module)
        errors.append(str(error.value))
    assert errors[0] == errors[1]
    with pytest.raises(RuleDefinitionError, match="not installed as a submodule"):
        traced(through_module)
    assert nn.Module.__call__ is nn.Module._wrapped_call_impl  # nothing left patched


def test_a_module_called_on_another_thread_during_a_quick_trace_runs_as_usual():
    import threading

    from fxrewrite.pattern import TRACING, _PatternTracer

    done = threading.Event()
    out = []

    def pattern(x):
        worker = threading.Thread(target=lambda: (out.append(_Doubling()(torch.ones(1))), done.set()))
        worker.start()
        worker.join()
        return torch.neg(x)

    with TRACING:
        graph = _PatternTracer(()).trace_quickly(pattern)
    assert done.is_set() and torch.equal(out[0], torch.full((1,), 2.0))
    assert [n.op for n in graph.nodes] == ["placeholder", "call_function", "output"]


def test_a_pattern_traced_inside_another_fx_trace_takes_the_plain_way(monkeypatch):
    from fxrewrite import _torch
    from fxrewrite.pattern import _PatternTracer

    def not_quickly(self, fn):
        raise AssertionError("the quick tracer ran inside another fx trace (whose patches it would not see)")

    monkeypatch.setattr(_PatternTracer, "trace_quickly", not_quickly)
    with _torch.fx_tracing():
        p = traced(lambda x: torch.neg(torch.neg(x)))
    assert p.anchor.target is torch.neg


def test_a_quick_trace_leaves_no_tracing_state_behind():
    import torch.fx._symbolic_trace as symbolic_trace

    from fxrewrite import _torch

    traced(lambda q: q / math.sqrt(q.size(-1)))
    with pytest.raises(RuleDefinitionError):
        traced(lambda x: torch.relu(x) if x.sum() > 0 else x)
    assert not _torch.is_fx_tracing() and symbolic_trace.CURRENT_PATCHER is None
    assert math.sqrt.__module__ == "math" and not torch.nn.modules.module._global_forward_pre_hooks


def _rebuilt(record, fn, direct: bool, monkeypatch):
    from fxrewrite import pattern

    monkeypatch.setattr(pattern, "DIRECT_REPLAY", direct)
    return pattern.graph_from_record(record, fn)


def test_replayed_graphs_are_built_alike_directly_and_through_create_node(monkeypatch):
    """DIRECT_REPLAY (nodes inserted by _torch.add_node) against its slow twin (create_node), on
    the record of every library pattern: the same nodes, names, arguments, metadata, code."""
    from fxrewrite.loader import load_rules
    from fxrewrite.pattern import graph_record

    rebuilt = 0
    for rule in load_rules():
        record = graph_record(rule.compiled.graph)
        if record is None:
            continue
        direct, slow = (_rebuilt(record, rule.pattern, flag, monkeypatch) for flag in (True, False))
        assert direct is not None and slow is not None, rule.name
        _assert_same_graph(direct, slow)
        assert _graph_text(direct) == _graph_text(rule.compiled.graph)
        direct.lint()
        rebuilt += 1
    assert rebuilt >= 130


@pytest.mark.parametrize("direct", [True, False])
def test_a_record_whose_names_or_arguments_do_not_fit_is_not_replayed_either_way(direct, monkeypatch):
    from fxrewrite.pattern import graph_record

    def pattern(x):
        return torch.neg(torch.neg(x))

    record = graph_record(torch.fx.symbolic_trace(pattern).graph)
    assert _rebuilt(record, pattern, direct, monkeypatch) is not None
    renamed = tuple((op, "neg" if name == "neg_1" else name, *rest) for op, name, *rest in record)  # neg twice
    assert _rebuilt(renamed, pattern, direct, monkeypatch) is None
    untupled = tuple((op, name, target, ("l", []) if op == "call_function" else args, *rest)
                     for op, name, target, args, *rest in record)
    assert _rebuilt(untupled, pattern, direct, monkeypatch) is None
