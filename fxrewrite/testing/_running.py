"""Running a rule on concrete values, as a rewrite would: :func:`call_rule_function` calls its
pattern or replacement eagerly (on fresh copies of the inputs, with the random generator seeded,
without autograd); :class:`GuardHarness` and :func:`match_for` build the
:class:`~fxrewrite.match.Match` its ``where=`` guards see in a graph that computes the pattern on
those values; :class:`GuardRaised` is the error for a guard that raises there. No Hypothesis here.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.fx as fx
from torch import nn
from torch.fx.node import Node

from ..errors import FxRewriteError
from ..match import Match
from ..meta import record_values
from ..rule import Rule
from ..verify import fresh_copy


class GuardRaised(FxRewriteError, RuntimeError):
    """A rule's ``where=`` guard raised on inputs the pattern accepts; a rewrite would fail there."""

    def __init__(self, message: str, inputs: Mapping[str, Any], error: BaseException) -> None:
        super().__init__(message)
        self.inputs = inputs
        self.error = error


def call_rule_function(fn: Callable[..., Any], inputs: Mapping[str, Any], *,
                       rng_seed: int = 0) -> tuple[Any, dict[str, Any]]:
    """Call a pattern or replacement eagerly on fresh copies of ``inputs`` (so in-place
    operations cannot leak), with the random generator seeded, without autograd. Returns the
    result and the copies (to see what the call modified)."""
    args = {name: fresh_copy(value) for name, value in inputs.items()}
    with torch.no_grad():
        return _seeded(rng_seed, lambda: fn(**args)), args


#: The harness computes the pattern's values with one generated function that returns every
#: node's value (:func:`_all_values_module`), ~20 us on an attention pattern where fx's
#: interpreter (:func:`~fxrewrite.meta.record_values`) took ~110 us, in every guard check and
#: stand-in try (8% of the checker's time). Patterns with module captures take it too (each
#: drawn module is set on the generated module under its capture's name): the interpreter costs
#: them as much, and the first exception it sees makes torch import ``torch._dynamo`` (~1 s of
#: CPU in each worker of ``fxrewrite check -j N``) to log a structured trace of the error.
#: False is the slow twin, the interpreter.
FAST_GUARD_VALUES = True

#: fxrewrite.meta's key for a node's value.
_VALUE = "val"


class GuardHarness:
    """The rule's pattern graph, copied into a ``GraphModule`` once, on which guards are
    evaluated for concrete inputs: the graph is run, each node's value recorded in
    ``meta["val"]``, and a :class:`~fxrewrite.match.Match` of the pattern against this copy of
    itself is built, so ``m["x"].shape``, ``.dtype`` and ``.dim()`` work as in a real rewrite."""

    def __init__(self, rule: Rule) -> None:
        pattern = rule.compiled
        graph = fx.Graph()
        self.env: dict[Node, Node] = {}
        graph.output(graph.graph_copy(pattern.graph, self.env))
        self.rule = rule
        self.module_names = tuple(p.name for p in pattern.params if p.kind == "module")
        root = nn.Module()
        for name in self.module_names:
            root.add_module(name, nn.Identity())
        self.gm = fx.GraphModule(root, graph)
        self.placeholders = tuple(str(n.target) for n in pattern.placeholders.values())
        self.values = _all_values_module(self.gm)

    def match(self, inputs: Mapping[str, Any]) -> Match:
        """Run the pattern graph on copies of ``inputs`` (raising what it raises) and return
        the match the guards would see."""
        for name in self.module_names:
            module = fresh_copy(inputs[name])
            setattr(self.gm, name, module)
            if self.values is not None:
                setattr(self.values, name, module)
        args = [fresh_copy(inputs[name]) for name in self.placeholders]
        with torch.no_grad():
            if FAST_GUARD_VALUES and self.values is not None:
                _record(self.gm.graph, self.values.forward(*args))  # not __call__, which prints what it raises
            else:
                record_values(self.gm, *args)
        return Match.on_copy(self.rule.compiled, self.env, inputs)


def _all_values_module(gm: fx.GraphModule) -> fx.GraphModule:
    """A module computing what ``gm`` computes and returning every node's value (output
    excepted), in graph order."""
    graph = fx.Graph()
    env: dict[Node, Node] = {}
    for node in gm.graph.nodes:
        if node.op != "output":
            env[node] = graph.node_copy(node, env.__getitem__)
    graph.output(tuple(env.values()))
    return fx.GraphModule(gm, graph)


def _record(graph: fx.Graph, values: tuple[Any, ...]) -> None:
    """Leave ``values`` (of :func:`_all_values_module`) in ``meta["val"]`` of ``graph``'s nodes,
    the output's value in the output's, as :func:`~fxrewrite.meta.record_values` does."""
    nodes = iter(values)
    for node in graph.nodes:
        if node.op == "output":
            node.meta[_VALUE] = fx.node.map_arg(node.args[0], lambda n: n.meta[_VALUE])
        else:
            node.meta[_VALUE] = next(nodes)


def match_for(rule: Rule, inputs: Mapping[str, Any]) -> Match:
    """A :class:`~fxrewrite.match.Match` of ``rule``'s pattern against a copy of its own graph
    evaluated on ``inputs``: what the rule's guards would see in a graph computing the pattern
    on these values. Raises whatever the pattern raises on them.

    >>> import torch
    >>> from fxrewrite import Rule
    >>> rule = Rule.from_functions(lambda x: torch.relu(torch.relu(x)), lambda x: torch.relu(x), name="r")
    >>> m = match_for(rule, {"x": torch.zeros(2, 3, dtype=torch.float64)})
    >>> m["x"].shape, m["x"].dtype, m["x"].dim()
    (torch.Size([2, 3]), torch.float64, 2)
    """
    return GuardHarness(rule).match(inputs)


def _guard_name(guard: Callable[..., Any]) -> str:
    return getattr(guard, "__qualname__", None) or repr(guard)


@functools.lru_cache(maxsize=64)
def _generator_state(seed: int) -> torch.Tensor:
    return torch.Generator().manual_seed(seed).get_state()


def _seeded(seed: int, make: Callable[[], Any]) -> Any:
    """``make()`` with torch's global generator seeded with ``seed``, restored afterwards."""
    saved = torch.default_generator.get_state()
    torch.default_generator.set_state(_generator_state(seed))
    try:
        return make()
    finally:
        torch.default_generator.set_state(saved)
