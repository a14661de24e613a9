"""The matcher: find where a :class:`~fxrewrite.pattern.Pattern` occurs in an fx graph.

A match is a map from pattern nodes to graph values that respects operations, arguments and
literals, found by walking backwards from an *anchor* (the pattern's last output) over
arguments, with backtracking over the operand orders of commutative operations and, for
multi-output patterns, over the users of already matched values.

Variables bind like mathematics: one variable always binds the same value, two variables may
bind the same value. A match is *sound* only if

* every matched inner node that is not an output has no user outside the match (containment),
* no variable binds a value the match computes (it would be erased while still needed),
* for multi-output patterns, no path leaves the match and re-enters it (no cycle).

>>> import torch, torch.fx as fx
>>> from fxrewrite.pattern import trace_pattern
>>> pattern = trace_pattern(lambda x, y: torch.relu(x + y), rule_name="r", origin="<doc>")
>>> gm = fx.symbolic_trace(lambda a: torch.relu(a + a))
>>> relu = next(n for n in gm.graph.nodes if n.target is torch.relu)
>>> m = next(iter(match_at(pattern, relu, gm)))
>>> m.node("x").name, m.node("y").name
('a', 'a')
"""

from __future__ import annotations

import itertools
import operator
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import attrs
import torch
from torch.fx.node import Node
from torch.nn.modules import module as module_module

from . import _torch
from .canon import (
    attribute_at,
    constant_scalar,
    identity_source,
    is_check,
    is_commutative_call,
    known_floating,
    lined_up_arguments,
    lined_up_as,
    may_be_identity,
    named_arguments,
    node_key,
    node_keys,
    op_key_of,
    plain_meaning,
    result_kind,
    same_literal,
    through_identities,
)
from .canon.effects import is_parametrized
from .canon.meaning import target_key
from .errors import MetadataError
from .meta import has_value, tensor_value, value_of
from .pattern import Param, Pattern

__all__ = ["Match", "MatchOptions", "Rejection", "TensorView", "match_at", "matcher", "module_refusal", "node_position"]

_MISSING = object()

LinedUp = tuple[tuple[str, ...], tuple[Any, ...], tuple[Any, ...]]


#: ``node_position(node)``: a key that orders the nodes of one graph topologically (graph order), in O(1).
node_position = _torch.node_position


@attrs.frozen
class MatchOptions:
    """How pattern variables and literals bind.

    The defaults are fxrewrite's own semantics; :mod:`fxrewrite.compat` uses
    ``MatchOptions.torch_fx(...)`` to reproduce ``torch.fx.replace_pattern``.
    """

    commutative: bool = True
    canonical: bool = True
    variables_bind_literals: bool = False
    injective: bool = False
    ignore_literals: bool = False

    @classmethod
    def torch_fx(cls, *, ignore_literals: bool = False) -> MatchOptions:
        return cls(commutative=False, canonical=False, variables_bind_literals=True, injective=True,
                   ignore_literals=ignore_literals)


_DEFAULTS = MatchOptions()  # the driver's: the compiled walk's only options


@attrs.frozen
class TensorView:
    """What a guard sees of a tensor bound in a match: shape, dtype, device and rank, read from
    the graph node's metadata (``meta["val"]`` from torch.export / fake tensors, or
    ``meta["tensor_meta"]`` from ``ShapeProp``)."""

    node: Node

    def _meta(self) -> Any:
        value = tensor_value(self.node)
        if value is not None:
            return value
        raise _MissingMetadata(self.node)

    @property
    def shape(self) -> torch.Size:
        return torch.Size(self._meta().shape)

    @property
    def dtype(self) -> torch.dtype:
        return self._meta().dtype

    @property
    def device(self) -> torch.device:
        meta = self._meta()
        return getattr(meta, "device", torch.device("cpu"))

    @property
    def ndim(self) -> int:
        return len(self._meta().shape)

    def dim(self) -> int:
        return self.ndim

    def is_floating_point(self) -> bool:
        """From the metadata, or, on a graph without it, from how the graph computes the value
        (a floating parameter, a module with floating weights, ``softmax``, ...; see
        :func:`fxrewrite.canon.known_floating`). Raises :class:`MetadataError` when neither tells."""
        known = known_floating(self.node)
        if known is None:
            self._meta()  # raises MetadataError, saying how to provide metadata
        return bool(known)

    def size(self, dim: int | None = None) -> Any:
        return self.shape if dim is None else self.shape[dim]

    def __repr__(self) -> str:
        return f"TensorView({self.node.name})"


class _MissingMetadata(MetadataError):
    """The :class:`MetadataError` a :class:`TensorView` raises, its message written only when read:
    guards on graphs without metadata catch it at every match (``rules/``' ``view``), and
    formatting the node cost 5 us of the 6 us a refusal took."""

    def __init__(self, node: Node) -> None:
        super().__init__()
        self.node = node

    def __str__(self) -> str:
        return (f"node '{self.node.name}' ({self.node.format_node()}) carries no shape/dtype metadata. "
                f"Pass example_inputs=(...) to fxrewrite.rewrite so shapes are propagated, or run "
                f"torch.fx.passes.shape_prop.ShapeProp on the module first, or rewrite a torch.export graph.")

    def __repr__(self) -> str:
        return f"MetadataError({str(self)!r})"

    def __reduce__(self) -> Any:  # pickled (a checker worker's error) as the plain error with its message
        return MetadataError, (str(self),)


@attrs.frozen(eq=False)
class Match:
    """One occurrence of a pattern in a graph.

    ``bindings`` maps each pattern parameter to what it bound: a graph ``Node`` for a variable,
    the constant for a literal capture, the ``nn.Module`` for a module capture. ``nodes`` are the
    graph nodes the match computes (they are erased by a rewrite), ``outputs`` the graph nodes
    standing for the pattern's results, ``anchor`` the node the match was found from.

    In a guard, ``m["x"]`` is a :class:`TensorView` for a tensor, the value of a literal capture
    or the module of a module capture; ``m.node("x")`` is the bound fx ``Node``.
    """

    pattern: Pattern
    bindings: Mapping[str, Any]
    nodes: tuple[Node, ...]
    outputs: tuple[Node, ...]
    anchor: Node
    module_paths: Mapping[str, str] = attrs.field(factory=dict)
    #: Every pattern node (placeholders included) mapped to the graph value it matched.
    node_map: Mapping[Node, Any] = attrs.field(factory=dict, repr=False)

    def __getitem__(self, name: str) -> Any:
        value = self._binding(name)
        return TensorView(value) if isinstance(value, Node) else value

    def __contains__(self, name: object) -> bool:
        return name in self.bindings

    def keys(self) -> Iterable[str]:
        return self.bindings.keys()

    def node(self, name: str) -> Node:
        """The graph node bound to variable ``name`` (for a module capture: its call_module node)."""
        value = self._binding(name)
        if isinstance(value, Node):
            return value
        if name in self.module_paths:
            path = self.module_paths[name]
            return next(n for n in self.nodes if n.op == "call_module" and n.target == path)
        raise TypeError(f"'{name}' bound the constant {value!r}, not a graph node; use m[{name!r}] to read it.")

    def _binding(self, name: str) -> Any:
        try:
            return self.bindings[name]
        except KeyError:
            raise KeyError(f"the pattern has no parameter '{name}'; it has {sorted(self.bindings)}") from None

    @classmethod
    def on_copy(cls, pattern: Pattern, copies: Mapping[Node, Node], values: Mapping[str, Any]) -> Match:
        """The match of ``pattern`` against a copy of its own graph: ``copies`` maps each pattern
        node to its copy (as ``Graph.graph_copy`` fills it in), literal and module captures are
        bound to ``values``, and module captures are called under their own names. What a rule's
        guards see when its pattern computes on concrete values (the property checker's
        :func:`~fxrewrite.testing.strategies.match_for`). No search: the correspondence is known,
        and in the copy a literal capture is a placeholder, which the matcher would bind instead
        of its value."""
        bindings = {p.name: copies[pattern.placeholders[p.name]] if p.kind == "tensor" else values[p.name]
                    for p in pattern.params}
        module_paths = {p.name: p.name for p in pattern.params if p.kind == "module"}
        return cls(pattern, bindings, tuple(copies[n] for n in pattern.inner_nodes),
                   tuple(copies[n] for n in pattern.outputs), copies[pattern.anchor], module_paths, dict(copies))


@attrs.frozen
class Rejection:
    """Why a pattern did not match at a graph node: the pattern node and graph value where it
    failed, the reason, and how many pattern nodes were matched by then (``progress``)."""

    pattern_node: Node
    graph_value: Any
    reason: str
    progress: int


class _Steps:
    """The state of matching one pattern at one anchor candidate (the bindings ``p2g``, what was
    looked through or assumed, the closest miss) and the single steps that decide one pattern
    value against one graph value. Two walks take their decisions from these steps: the
    backtracking :class:`_Search`, and its fast twin :class:`_StraightWalk` for patterns without
    alternatives.
    """

    def __init__(self, pattern: Pattern, modules: Mapping[str, torch.nn.Module], options: MatchOptions,
                 candidates: Callable[[Any], Iterable[Node]] | None, record: bool) -> None:
        self.pattern = pattern
        self.modules = modules
        self.options = options
        self.candidates = candidates
        self.p2g: dict[Node, Any] = {}
        self.used: dict[Node, int] = {}
        self.record = record
        self.failure: Rejection | None = None
        self.folded_nodes: list[Node] = []
        #: Graph nodes the pattern looked through (identities: a no-op cast, inactive dropout, ...),
        #: each with the pattern node found behind it; they are part of the match.
        self.skipped: list[tuple[Node, Node]] = []
        #: Pattern identities the graph lacks (``w.to(v.dtype)`` where the graph has ``w``): the
        #: pattern node, the graph value standing for it, and the dtype that value must have.
        self.assumed: list[tuple[Node, Any, Any]] = []

    # -- bookkeeping -------------------------------------------------------------------------
    def fail(self, pn: Any, gv: Any, reason: Callable[[], str]) -> None:
        """Remember why the search failed where it got furthest (the closest miss; on a tie, the
        first failure, i.e. the operand order as written). ``reason`` is only called then: the
        driver, which asks no reasons, does not pay for formatting them."""
        if self.record and (self.failure is None or len(self.p2g) > self.failure.progress):
            self.failure = Rejection(pn, gv, reason(), len(self.p2g))

    def bind(self, pn: Node, gv: Any) -> None:
        self.p2g[pn] = gv
        if self.options.injective and isinstance(gv, Node):
            self.used[gv] = self.used.get(gv, 0) + 1

    def unbind(self, pn: Node) -> None:
        gv = self.p2g.pop(pn)
        if self.options.injective and isinstance(gv, Node):
            self.used[gv] -= 1
            if not self.used[gv]:
                del self.used[gv]

    # -- structural matching -----------------------------------------------------------------
    # Each check below decides one step and records why it failed; the generators (which explore
    # alternatives) and the straight walk (for patterns without any: see Pattern.choice_free)
    # both take their decisions from them.

    def literal_agrees(self, pv: Any, gv: Any, name: str | None) -> bool:
        """A pattern constant against a graph argument."""
        if isinstance(gv, Node):
            self.fail(pv, gv, lambda: f"{_argument(name)}expected the constant {pv!r}, found the value of node "
                                      f"'{gv.name}'")
            return False
        if self.options.ignore_literals or same_literal(pv, gv):
            return True
        self.fail(pv, gv, lambda: f"{_argument(name) or 'literal '}differs: pattern has {pv!r}, graph has {gv!r}")
        return False

    def same_length(self, pv: Any, gv: Any, name: str | None) -> bool:
        """A pattern list or tuple against a graph argument."""
        if isinstance(gv, (list, tuple)) and len(gv) == len(pv):
            return True
        self.fail(pv, gv, lambda: f"{_argument(name)}expected a sequence of {len(pv)} values, found {gv!r}")
        return False

    def agrees_with_binding(self, pn: Node, bound: Any, gv: Any) -> bool:
        """A pattern node met again: the graph value must be the one it already bound (or that
        value behind identities: ``x.float()`` of a float ``x`` is ``x``)."""
        if bound is gv or (not isinstance(gv, Node) and not isinstance(bound, Node) and same_literal(bound, gv)):
            return True
        if (self.options.canonical and isinstance(gv, Node) and isinstance(bound, Node)
                and through_identities(gv) is through_identities(bound)):
            return True
        self.fail(pn, gv, lambda: f"'{pn.name}' is already bound to {_show(bound)}, here it would be {_show(gv)}")
        return False

    def identities_between(self, pn: Node, gv: Any) -> list[Node] | None:
        """The identity nodes from the graph value ``gv`` back to the value the operation ``pn``
        already bound: they are part of the match (erased with it). ``None`` when ``gv`` is
        not that value behind identities; ``[]`` when it is the value itself."""
        bound = self.p2g[pn]
        chain: list[Node] = []
        while gv is not bound:
            source = identity_source(gv) if self.options.canonical and isinstance(gv, Node) else None
            if source is None:
                return None
            chain.append(gv)
            gv = source
        return chain

    def looked_through(self, pn: Node, gv: Any) -> Node | None:
        """The value behind ``gv`` when ``gv`` is an identity (a conversion to the dtype it has,
        inactive dropout, ...) that the pattern operation ``pn`` is to be looked for behind:
        ``gv`` computes another op than ``pn``."""
        if not self.options.canonical or not isinstance(gv, Node) or pn.op == "get_attr" or pn in self.pattern.outputs:
            return None  # an output is where the match ends: what lies behind it is not the match's result
        return identity_source(gv)

    def variable_value(self, pn: Node, param: Param, gv: Any) -> Any:
        """What the variable ``param`` binds for the graph value ``gv`` (a dtype capture binds the
        dtype a node computes), or ``_MISSING`` when it cannot bind it."""
        if param.kind == "module":
            if isinstance(gv, str):
                return gv
            return self.refuse(pn, gv, lambda: f"module capture '{param.name}' can only bind a submodule path, not "
                                               f"{_show(gv)}")
        if param.kind == "literal" and isinstance(gv, Node) and self.options.canonical \
                and param.annotation is not torch.dtype:
            number = constant_scalar(gv)  # a 0-d tensor constant: torch.tensor(-1e9) in forward
            if number is not None and param.accepts_literal(number):
                return number
        if param.kind == "literal" and param.annotation is torch.dtype and isinstance(gv, Node):
            known = _known_dtype(gv)  # a dtype the graph computes (x.to(y.dtype)), known from its metadata
            if known is not None:
                return known
            return self.refuse(pn, gv, lambda: f"'{param.name}' is a dtype capture; node '{gv.name}' computes no "
                                               f"known dtype")
        if isinstance(gv, Node):
            if param.kind != "tensor" or (self.options.injective and gv in self.used):
                return self.refuse(pn, gv, lambda: f"'{param.name}' is a {param.kind} capture and cannot bind node "
                                                   f"'{gv.name}'")
            if not self.options.variables_bind_literals and result_kind(gv) not in ("tensor", "unknown"):
                return self.refuse(pn, gv, lambda: f"'{param.name}' is a tensor variable; node '{gv.name}' computes "
                                                   f"a Python value")
            # the value itself, not an identity in front of it (a no-op cast the match may also
            # compute, or that stays for other users)
            return through_identities(gv) if self.options.canonical else gv
        if param.accepts_literal(gv) or (param.kind == "tensor" and self.options.variables_bind_literals):
            return gv
        return self.refuse(pn, gv, lambda: f"'{param.name}' cannot bind the constant {gv!r} (annotate it, e.g. "
                                           f"'{param.name}: float')")

    def refuse(self, pn: Node, gv: Any, reason: Callable[[], str]) -> Any:
        """:meth:`fail`, then ``_MISSING`` (nothing to bind)."""
        self.fail(pn, gv, reason)
        return _MISSING

    def folds(self, pn: Node, gv: Any) -> bool:
        """Does the pattern's size or dtype expression ``pn`` stand where the graph holds something
        else than the same operation (a folded constant)?"""
        return pn in self.pattern.value_nodes and self.options.canonical and (
            not isinstance(gv, Node) or not self.same_op(pn, gv))

    def same_op(self, pn: Node, gv: Node) -> bool:
        """Does the graph node ``gv`` compute the pattern operation ``pn`` (by op key)?"""
        if self.options.canonical:
            return node_key(pn) in node_keys(gv)
        return op_key_of(gv.op, gv.target, False) == op_key_of(pn.op, pn.target, False)

    def operation_arguments(self, pn: Node, gv: Any) -> LinedUp | None:
        """The arguments of the pattern operation ``pn`` and the graph node ``gv`` lined up, when
        ``gv`` computes the same operation; else ``None``."""
        if not isinstance(gv, Node):
            self.fail(pn, gv, lambda: f"expected an operation ({pn.format_node()}), found the constant {gv!r}")
            return None
        canonical = self.options.canonical
        if not self.same_op(pn, gv):
            self.fail(pn, gv, lambda: f"op differs: pattern has {_op_name(pn)}, graph has {_op_name(gv)}")
            return None
        if self.options.injective and gv in self.used:
            self.fail(pn, gv, lambda: f"graph node '{gv.name}' is already matched by another pattern node")
            return None
        values = lined_up_arguments(pn, gv, canonical)
        if values is None:
            self.fail(pn, gv, lambda: f"arguments differ: pattern {_arity(pn)}, graph {_arity(gv)}")
            return None
        if pn.op == "get_attr" and not _same_attribute_kind(pn, gv):
            self.fail(pn, gv, lambda: f"attribute '{gv.target}' is not a {type(_attribute(pn)).__name__} like the "
                                      f"pattern's '{pn.target}'")
            return None
        return values


class _Search(_Steps):
    """Backtracking search for one pattern at one anchor candidate.

    The generators below yield once per consistent extension of ``p2g`` and undo their own
    bindings when resumed, so the search explores alternatives without copying state.
    """

    # -- the backtracking search ---------------------------------------------------------------
    def value(self, pv: Any, gv: Any, name: str | None = None) -> Iterator[None]:
        if isinstance(pv, Node):
            yield from self.node(pv, gv)
        elif isinstance(pv, (list, tuple)):
            if self.same_length(pv, gv, name):
                yield from self.sequence(pv, gv, 0, (name,) * len(pv) if name else None)
        elif self.literal_agrees(pv, gv, name):
            yield

    def sequence(self, pvs: Any, gvs: Any, i: int, names: tuple[str, ...] | None = None) -> Iterator[None]:
        if i == len(pvs):
            yield
            return
        for _ in self.value(pvs[i], gvs[i], names[i] if names else None):
            yield from self.sequence(pvs, gvs, i + 1, names)

    def node(self, pn: Node, gv: Any) -> Iterator[None]:
        bound = self.p2g.get(pn, _MISSING)
        if bound is not _MISSING:
            if pn not in self.pattern.param_of and bound is not gv and isinstance(gv, Node) and isinstance(bound, Node):
                # an operation met again, maybe behind identities
                yield from self.operation_again(pn, gv)
            elif self.agrees_with_binding(pn, bound, gv):
                yield
            return
        param = self.pattern.param_of.get(pn)
        if param is not None:
            yield from self.variable(pn, param, gv)
        else:
            yield from self.operation(pn, gv)

    def operation_again(self, pn: Node, gv: Any) -> Iterator[None]:
        chain = self.identities_between(pn, gv)
        if chain is None:
            self.fail(pn, gv, lambda: f"'{pn.name}' is already bound to {_show(self.p2g[pn])}, here it would be "
                                      f"{_show(gv)}")
            return
        self.skipped.extend((n, pn) for n in chain)
        yield
        del self.skipped[len(self.skipped) - len(chain):]

    def variable(self, pn: Node, param: Param, gv: Any) -> Iterator[None]:
        value = self.variable_value(pn, param, gv)
        if value is _MISSING:
            return
        self.bind(pn, value)
        yield
        self.unbind(pn)

    def operation(self, pn: Node, gv: Any) -> Iterator[None]:
        if self.folds(pn, gv):
            yield from self.folded(pn, gv)
            return
        behind = self.looked_through(pn, gv)
        if behind is None or self.same_op(pn, gv):
            values = self.operation_arguments(pn, gv)
            if values is not None:
                self.bind(pn, gv)
                if pn.op == "call_module":
                    yield from self.module(pn, gv, values)
                else:
                    yield from self.arguments(pn, gv, values)
                self.unbind(pn)
        if behind is not None:  # also look for the operation behind the identity
            self.skipped.append((gv, pn))
            yield from self.node(pn, behind)
            self.skipped.pop()
        identity = self.pattern.identities.get(pn) if self.options.canonical else None
        if identity is not None and isinstance(gv, Node) and not self.same_op(pn, gv):
            yield from self.assumed_identity(pn, gv, *identity)

    def assumed_identity(self, pn: Node, gv: Node, source: Node, dtype: Any) -> Iterator[None]:
        """The pattern's identity ``pn`` (a cast, a copy, inactive dropout) where the graph has
        none: its input is looked for at ``gv``; a cast holds if ``gv`` has the dtype it casts to
        (checked once the match is complete, see :func:`_assumed_refusal`)."""
        self.bind(pn, gv)
        self.assumed.append((pn, gv, dtype))
        yield from self.node(source, gv)
        self.assumed.pop()
        self.unbind(pn)

    def folded(self, pn: Node, gv: Any) -> Iterator[None]:
        """A pattern expression of the bound values' sizes or dtypes (``q.size(-1)``) where the
        graph holds a constant (torch.export folds sizes): bind it now, compare the values once
        the whole match is known (:func:`_folded_refusal`)."""
        if isinstance(gv, Node) and result_kind(gv) != "value":
            self.fail(pn, gv, lambda: f"expected a Python value ({pn.format_node()}), found node '{gv.name}' computing "
                                      f"{result_kind(gv)}")
            return
        if not isinstance(gv, (Node, bool, int, float, torch.dtype, torch.SymInt, torch.SymFloat)):
            self.fail(pn, gv, lambda: f"expected a Python value ({pn.format_node()}), found the constant {gv!r}")
            return
        self.bind(pn, gv)
        self.folded_nodes.append(pn)
        yield
        self.folded_nodes.pop()
        self.unbind(pn)

    def module(self, pn: Node, gn: Node, values: LinedUp) -> Iterator[None]:
        capture = self.pattern.placeholders.get(str(pn.target))
        param = self.pattern.param_of.get(capture) if capture is not None else None
        module = self.modules.get(str(gn.target))
        if param is None or param.kind != "module":  # a torch.fx-style pattern naming a submodule path
            if gn.target == pn.target:
                yield from self.arguments(pn, gn, values)
            else:
                self.fail(pn, gn, lambda: f"module differs: pattern calls '{pn.target}', graph calls '{gn.target}'")
            return
        if not isinstance(module, param.annotation):
            self.fail(pn, gn, lambda: f"module '{gn.target}' is a {type(module).__name__}, not a "
                                      f"{param.annotation.__name__}")
            return
        problem = module_refusal(module, param)
        if problem is not None:
            self.fail(pn, gn, lambda: f"module '{gn.target}' {problem}")
            return
        assert capture is not None  # a module capture always has its placeholder
        for _ in self.node(capture, gn.target):
            yield from self.arguments(pn, gn, values)

    def arguments(self, pn: Node, gn: Node, values: LinedUp) -> Iterator[None]:
        names, p_values, g_values = values
        yield from self.sequence(p_values, g_values, 0, names)
        if (self.options.commutative and pn in self.pattern.commutative
                and is_commutative_call(gn.op, gn.target, gn.args, gn.kwargs) and g_values[0] is not g_values[1]):
            yield from self.sequence(p_values, (g_values[1], g_values[0], *g_values[2:]), 0, names)

    # -- multi-output patterns ---------------------------------------------------------------
    def remaining_outputs(self) -> Iterator[None]:
        """Extend a match of the anchor to the pattern's other outputs, through the users of
        values already matched (or, for a disconnected pattern, through the index)."""
        step = self._next_unbound()
        if step is None:
            yield
            return
        pn, via = step
        key = node_key(pn) if self.options.canonical else op_key_of(pn.op, pn.target, False)
        if via is not None:
            pool = sorted(via.users, key=node_position)
        elif self.candidates is not None:
            pool = list(self.candidates(key))
        else:
            pool = []
        for gn in pool:
            if self.same_op(pn, gn):
                for _ in self.node(pn, gn):
                    yield from self.remaining_outputs()

    def _next_unbound(self) -> tuple[Node, Node | None] | None:
        unbound = [n for n in self.pattern.inner_nodes if n not in self.p2g]
        if not unbound:
            return None
        for pn in unbound:
            for arg in pn.all_input_nodes:
                gv = self.p2g.get(arg, _MISSING)
                if isinstance(gv, Node):
                    return pn, gv
        # no unbound node touches the matched part: start the next component from an output
        first = next(o for o in self.pattern.outputs if o not in self.p2g)
        return first, None


class _StraightWalk(_Steps):
    """Matching without backtracking, for patterns where every step has at most one way to
    succeed (:attr:`Pattern.choice_free`): it binds exactly what the first solution of its slow
    twin :class:`_Search` binds, without a generator per step, or raises :class:`_Undecided`
    where the graph leaves a choice after all. ``tests/test_match.py`` checks the two agree on
    every shipped rule and case.
    """

    def straight_node(self, pn: Node, gv: Any) -> bool:
        """Match ``pn`` at ``gv`` without backtracking, leaving the bindings in place: for
        patterns where every step has at most one way to succeed (:attr:`Pattern.choice_free`),
        it binds exactly what the first solution of :meth:`node` binds, without a generator per
        step."""
        bound = self.p2g.get(pn, _MISSING)
        if bound is not _MISSING:
            if pn in self.pattern.param_of or bound is gv or not isinstance(gv, Node) or not isinstance(bound, Node):
                return self.agrees_with_binding(pn, bound, gv)
            chain = self.identities_between(pn, gv)
            if chain is None:
                return self.agrees_with_binding(pn, bound, gv)  # records why
            self.skipped.extend((n, pn) for n in chain)
            return True
        param = self.pattern.param_of.get(pn)
        if param is not None:
            value = self.variable_value(pn, param, gv)
            if value is _MISSING:
                return False
            self.bind(pn, value)
            return True
        behind = self.looked_through(pn, gv)
        if behind is not None:
            if self.same_op(pn, gv):
                raise _Undecided  # the op itself, or the op behind it: let the search try both
            self.skipped.append((gv, pn))
            return self.straight_node(pn, behind)
        values = self.operation_arguments(pn, gv)
        if values is None:
            return False
        self.bind(pn, gv)
        names, p_values, g_values = values
        if pn in self.pattern.commutative and self.options.commutative and is_commutative_call(
                gv.op, gv.target, gv.args, gv.kwargs):
            g_values = self.decided_order(p_values, g_values)
        for name, p, g in zip(names, p_values, g_values):  # noqa: SIM110 - a loop: no generator per node
            if not self.straight_value(p, g, name):
                return False
        return True

    def decided_order(self, p_values: tuple[Any, ...], g_values: tuple[Any, ...]) -> tuple[Any, ...]:
        """The graph operands of a commutative call in the one order that can match (see
        :attr:`Pattern.choice_free`): the pattern operand matching only nodes faces the graph's
        node operand. When the graph has no such operand, or two, neither order matches and the
        order as written is returned."""
        kinds = (self.pattern.operand_kind(p_values[0]), self.pattern.operand_kind(p_values[1]))
        if self.options.variables_bind_literals or set(kinds) != {"constant", "node"}:
            # variables may bind constants too (torch.fx's matching), or the call is lined up
            # otherwise than the pattern as traced: both orders may match, let the search try them
            raise _Undecided
        node_side = kinds.index("node")
        if not isinstance(g_values[node_side], Node) and isinstance(g_values[1 - node_side], Node):
            return (g_values[1], g_values[0], *g_values[2:])
        return g_values

    def straight_value(self, pv: Any, gv: Any, name: str | None) -> bool:
        if isinstance(pv, Node):
            return self.straight_node(pv, gv)
        if isinstance(pv, (list, tuple)):
            if not self.same_length(pv, gv, name):
                return False
            for p, g in zip(pv, gv):  # noqa: SIM110 - as above
                if not self.straight_value(p, g, name):
                    return False
            return True
        return self.literal_agrees(pv, gv, name)


#: Match choice-free patterns by their :class:`_Program` (facts about each pattern node worked out
#: once per pattern) with :class:`_CompiledWalk`; ``False`` is the slow twin, :class:`_StraightWalk`
#: on every try. ``tests/test_match_compiled.py`` checks that both find exactly the same matches
#: with the shipped library on fuzzed graphs and the end-to-end models.
COMPILED = True


class _NodeFacts:
    """What the compiled walk needs to know of one pattern operation, worked out once."""

    __slots__ = ("args", "arity", "commutative", "inline", "key", "looks_through", "meaning", "named", "names",
                 "simple")

    def __init__(self, pattern: Pattern, pn: Node) -> None:
        #: The op key a graph node must be filed under (:meth:`_Steps.same_op`).
        self.key = node_key(pn)
        #: Whether an identity in the graph is looked through here (:meth:`_Steps.looked_through`).
        self.looks_through = pn.op != "get_attr" and pn not in pattern.outputs
        self.commutative = pn in pattern.commutative
        #: How the arguments compare when the graph node is no other op respelled.
        self.meaning = plain_meaning(pn) if pn.op in ("call_function", "call_method") else None
        #: Its arguments by name, for comparing by meaning (the pattern's graph never changes).
        self.named = named_arguments(pn) if self.meaning is not None else None
        #: Nothing but a call of a function or method (a get_attr or module call takes the straight walk's path).
        self.simple = pn.op in ("call_function", "call_method")
        #: A call that lines up as written with a call of the same target and as many positional
        #: arguments and no keywords (what :func:`~fxrewrite.canon.lined_up_as` does for them).
        self.inline = self.simple and self.meaning is None and pn.target is not operator.truediv and not pn.kwargs
        self.args = pn.args
        self.arity = len(pn.args)
        self.names = tuple(f"#{i}" for i in range(self.arity))


class _Program:
    """A choice-free pattern compiled for :class:`_CompiledWalk` and its soundness check (or a
    one-output pattern calling module captures, compiled for its closures only): per pattern
    node, its parameter or its :class:`_NodeFacts`; the nodes a match computes; the parameters
    with their placeholders."""

    __slots__ = ("__weakref__", "chain", "computed", "facts", "output", "params", "placeholders", "tree")

    def __init__(self, pattern: Pattern) -> None:
        self.params: dict[Node, Param] = dict(pattern.param_of)
        self.facts = {pn: _NodeFacts(pattern, pn) for pn in pattern.inner_nodes}
        #: The pattern nodes whose graph values the match computes (see :func:`_sound_match`).
        self.computed = tuple(pn for pn in pattern.inner_nodes
                              if pn not in pattern.value_nodes or pn in pattern.outputs)
        self.placeholders = tuple((param, pattern.placeholders[param.name]) for param in pattern.params)
        #: The one output (only patterns with one are compiled).
        self.output: Node = pattern.outputs[0]
        #: The pattern as a chain of closures, when it is a tree of plain calls and module
        #: captures' calls (:func:`_tree_matcher`).
        self.tree = _tree_matcher(pattern, self)
        #: The closures' fast twin for a chain of one-argument calls (:func:`_chain_matcher`).
        self.chain = _chain_matcher(pattern, self, self.tree) if self.tree is not None else None


#: Match a choice-free pattern that is a tree of plain calls (:func:`_tree_matcher`) by closures
#: built once per pattern, handing every graph that does something else there (an identity to
#: look through, a call respelled or with keywords, a user outside the match) to the compiled
#: walk; ``False`` is the slow twin, the compiled walk at every try (``tests/test_match.py`` checks
#: both find the same matches). delete dag 8k: neg(neg(x)) at the outer negs 7.5 -> ~5 us.
FAST_TREES = True
#: Match a tree pattern that calls module captures (``bn(conv(x))``; not choice-free: an identity
#: module between the calls could be matched or looked through) by the same closures, handing
#: every graph where the search could take another path to it; ``False`` is the slow twin, the
#: search (:class:`_Search`) at every try (``tests/test_match.py`` checks both find the same
#: matches and refuse the same modules: classes, hooks, subclasses, missing submodules). modules
#: chain 8k: conv_bn_fold at a BatchNorm 27 -> ~7 us.
FAST_MODULE_TREES = True
#: Match a pattern that is a chain of one-argument calls over one tensor variable (``neg(neg(x))``,
#: ``relu(exp(sin(x)))``) by one loop down the chain (:func:`_chain_matcher`), handing every graph
#: where a call is not the pattern's own target with one argument to the tree closures; ``False``
#: is the slow twin, the tree closures at every try (``tests/test_match.py`` checks both find the
#: same matches and hand over the same tries). delete dag 8k: neg(neg(x)) at the outer negs 4.5 -> 3.1 us.
FAST_CHAINS = True
_FALLBACK: Any = object()  # the tree matcher cannot tell: the compiled walk (or for module patterns the search) decides
_Modules = Mapping[str, torch.nn.Module]
_Step = Callable[[Any, dict[Node, Any], _Modules], Any]  # True, False, or _FALLBACK
_Tree = Callable[[Node, _Modules], Any]  # a Match, None, or _FALLBACK


def _tree_matcher(pattern: Pattern, program: _Program) -> _Tree | None:
    """For a pattern whose operations are plain calls (compared as written, no keywords, not
    commutative) or calls of module captures (positional arguments only, each capture called
    once), each used once, each variable a tensor read once, its literals scalars: a function of
    an anchor (and the graph's submodules by path) returning the :class:`Match`, ``None`` (no
    match), or ``_FALLBACK``. It takes the compiled walk's steps in its order (for a module call,
    :meth:`_Search.module`'s) and :func:`_sound_match`'s checks, and falls back wherever those
    would take a path it does not have."""
    if (pattern.is_multi_output or pattern.value_nodes or pattern.identities or pattern.commutative
            or any(p.kind not in ("tensor", "module") for p in pattern.params)):
        return None
    read = [a for pn in pattern.inner_nodes for a in (*pn.args, *pn.kwargs.values())]
    nodes_read = [a for a in read if isinstance(a, Node)]
    tensors = {placeholder for param, placeholder in program.placeholders if param.kind == "tensor"}
    captures = set(pattern.placeholders.values()) - tensors
    called = [str(pn.target) for pn in pattern.inner_nodes if pn.op == "call_module"]
    if (len(set(nodes_read)) != len(nodes_read) or tensors - set(nodes_read) or captures & set(nodes_read)
            or len(set(called)) != len(called)
            or any(not isinstance(a, Node) and type(a) not in (int, float, bool, str, type(None)) for a in read)
            or not all(_tree_operation(pn, program) for pn in pattern.inner_nodes)):
        return None
    step = _tree_step(pattern.anchor, program)
    placeholders = tuple((param.name, placeholder, param.kind == "module")
                         for param, placeholder in program.placeholders)
    computed, output = program.computed, program.output

    def match(anchor: Node, modules: _Modules) -> Any:
        p2g: dict[Node, Any] = {}
        found = step(anchor, p2g, modules)
        if found is not True:
            return None if found is False else found
        inner = {p2g[pn]: pn for pn in computed}
        out = p2g[output]
        for gn in inner:
            if gn is not out:
                for user in gn.users:
                    if user not in inner:
                        return _FALLBACK  # (absorbable or not: _sound_match decides)
        bindings: dict[str, Any] = {}
        module_paths: dict[str, str] = {}
        for name, placeholder, is_module in placeholders:
            value = p2g[placeholder]
            if is_module:
                module_paths[name] = value
                value = modules[value]
            elif value in inner:
                return None
            bindings[name] = value
        return Match(pattern, bindings, _in_graph_order(list(inner)), (out,), anchor, module_paths, p2g)

    return match


def _tree_operation(pn: Node, program: _Program) -> bool:
    """Can the closures match the pattern operation ``pn``: a plain call compared as written, or
    a call of a module capture annotated with a class, with positional arguments only?"""
    if pn.op != "call_module":
        return program.facts[pn].simple and program.facts[pn].inline
    param = next((p for p, _ in program.placeholders if p.name == pn.target), None)
    return param is not None and param.kind == "module" and isinstance(param.annotation, type) and not pn.kwargs


def _tree_step(pn: Node, program: _Program) -> _Step:
    """The closure matching the pattern node ``pn`` (and what it reads) at a graph value."""
    if pn in program.params:
        def variable(gv: Any, p2g: dict[Node, Any], modules: _Modules) -> Any:  # _Steps.variable_value of a tensor
            if type(gv) is not Node:
                return _FALLBACK
            if result_kind(gv) not in ("tensor", "unknown"):
                return False
            p2g[pn] = through_identities(gv) if may_be_identity(gv) else gv  # (the cheap test first)
            return True
        return variable
    if pn.op == "call_module":
        return _module_call_step(pn, program)
    facts = program.facts[pn]
    key, target, arity, looks_through = facts.key, pn.target, facts.arity, facts.looks_through
    reads = _tree_reads(pn, program)

    def operation(gv: Any, p2g: dict[Node, Any], modules: _Modules) -> Any:  # _CompiledWalk.straight_node of a call
        if type(gv) is not Node and not isinstance(gv, Node):
            return False
        keys = node_keys(gv)
        if looks_through and may_be_identity(gv) and identity_source(gv) is not None:  # (the cheap test first)
            return _FALLBACK
        if key not in keys:
            return False
        g_args = gv.args
        if len(keys) != 1 or gv.kwargs or len(g_args) != arity or gv.target != target:
            return _FALLBACK
        p2g[pn] = gv
        return _tree_arguments(reads, g_args, p2g, modules)
    return operation


def _module_call_step(pn: Node, program: _Program) -> _Step:
    """The closure matching the call of a module capture ``pn`` (``conv(x)``) at a graph value:
    :meth:`_Search.operation` and :meth:`_Search.module` of such a call, which take another path
    only where the graph value is an identity to look through (handed over)."""
    param, capture = next((p, placeholder) for p, placeholder in program.placeholders if p.name == pn.target)
    facts = program.facts[pn]
    key, arity, looks_through, cls = facts.key, facts.arity, facts.looks_through, param.annotation
    reads = _tree_reads(pn, program)

    def module_call(gv: Any, p2g: dict[Node, Any], modules: _Modules) -> Any:
        if type(gv) is not Node and not isinstance(gv, Node):
            return False
        if looks_through and may_be_identity(gv) and identity_source(gv) is not None:  # (the cheap test first)
            return _FALLBACK
        if key not in node_keys(gv):
            return False
        g_args = gv.args
        if gv.kwargs or len(g_args) != arity:
            return _FALLBACK
        module = modules.get(str(gv.target))
        if not isinstance(module, cls) or module_refusal(module, param) is not None:
            return False
        p2g[pn] = gv
        p2g[capture] = gv.target
        return _tree_arguments(reads, g_args, p2g, modules)
    return module_call


_Reads = tuple[tuple[int, "_Step | None", Any], ...]


def _tree_reads(pn: Node, program: _Program) -> _Reads:
    """Per positional argument of ``pn``: its position, the closure matching it (``None`` for a
    literal) and the pattern's value."""
    return tuple((i, _tree_step(a, program) if isinstance(a, Node) else None, a) for i, a in enumerate(pn.args))


def _tree_arguments(reads: _Reads, g_args: tuple[Any, ...], p2g: dict[Node, Any], modules: _Modules) -> Any:
    """Match a call's arguments ``g_args`` by its ``reads`` (:func:`_tree_reads`), in order."""
    for i, step, literal in reads:
        if step is not None:
            found = step(g_args[i], p2g, modules)
            if found is not True:
                return found
        elif isinstance(g_args[i], Node) or not same_literal(literal, g_args[i]):
            return False
    return True


_Link = tuple[Node, str, Any]  # a chain's pattern call, its opcode and target


def _chain_matcher(pattern: Pattern, program: _Program, tree: _Tree) -> _Tree | None:
    """For a pattern the tree closures match (``tree``) that is a chain of calls of one argument
    each, down to its one tensor variable, each call's target filed under one key whatever its
    arguments (:func:`~fxrewrite.canon.meaning.target_key`) and never an identity: a function
    deciding as ``tree`` decides, by one loop. Where a graph node is not a call of the pattern's
    own target (the same object) with one argument and no keywords, or the variable's value no
    node, it hands the anchor to ``tree``; else it takes the closures' steps, which reduce to:
    each call met has the pattern's key and target, nothing to look through (no identity), the
    variable checked as :func:`_tree_step`'s, and the containment check, where every inner call
    of a chain must have one user (its one reader in the chain, as every other user lies outside
    the match). The matched calls are in graph order innermost first (each reads the next)."""
    links = _chain_links(pattern, program)
    if links is None:
        return None
    (param, placeholder), = program.placeholders
    name = param.name

    def match(anchor: Node, modules: _Modules) -> Any:
        p2g: dict[Node, Any] = {}
        gv: Any = anchor
        for pn, op, target in links:
            if gv.__class__ is not Node or gv.target is not target or gv.op != op:
                return tree(anchor, modules)
            g_args = gv._args
            if len(g_args) != 1 or gv._kwargs:
                return tree(anchor, modules)
            p2g[pn] = gv
            gv = g_args[0]
        if gv.__class__ is not Node:
            return tree(anchor, modules)
        if result_kind(gv) not in ("tensor", "unknown"):
            return None
        p2g[placeholder] = value = through_identities(gv) if may_be_identity(gv) else gv
        nodes = tuple(p2g.values())[-2::-1]  # the calls, innermost first
        for gn in nodes[:-1]:
            if len(gn.users) != 1:
                return _FALLBACK  # an inner call read outside the match (as the closures: _sound_match decides)
        if value in nodes:  # (the closures' check; a value read by the chain comes before all of it)
            return None
        return Match(pattern, {name: value}, nodes, (anchor,), anchor, {}, p2g)

    return match


def _chain_links(pattern: Pattern, program: _Program) -> tuple[_Link, ...] | None:
    """The pattern's calls from its anchor down, when it is a chain :func:`_chain_matcher` takes."""
    if len(program.placeholders) != 1 or program.placeholders[0][0].kind != "tensor":
        return None
    links: list[_Link] = []
    pn: Any = pattern.anchor
    while pn in program.facts:
        if (pn.op not in ("call_function", "call_method") or len(pn.args) != 1 or pn.kwargs
                or not isinstance(pn.args[0], Node) or may_be_identity(pn)):
            return None
        try:
            if target_key(pn.op, pn.target) != program.facts[pn].key:
                return None
        except TypeError:  # an unhashable target
            return None
        links.append((pn, pn.op, pn.target))
        pn = pn.args[0]
    if pn is not program.placeholders[0][1] or len(links) != len(program.facts):
        return None
    return tuple(links)


_programs: weakref.WeakKeyDictionary[Pattern, _Program] = weakref.WeakKeyDictionary()


def _program(pattern: Pattern) -> _Program:
    """The compiled form of ``pattern`` (built at its first try, then kept as long as the pattern lives)."""
    program = _programs.get(pattern)
    if program is None:
        program = _programs[pattern] = _Program(pattern)
    return program


class _CompiledWalk(_StraightWalk):
    """:class:`_StraightWalk` with the pattern's side of each step read from its :class:`_Program`
    instead of being worked out again at every try: the same steps in the same order, the same
    bindings, the same answer (the slow twin is :class:`_StraightWalk`, see :data:`COMPILED`).
    Only for the default :class:`MatchOptions` and when no reasons are recorded."""

    def __init__(self, pattern: Pattern, modules: Mapping[str, torch.nn.Module], program: _Program,
                 candidates: Callable[[Any], Iterable[Node]] | None) -> None:  # _Steps' state, set directly
        self.pattern, self.modules, self.options, self.candidates, self.program = (
            pattern, modules, _DEFAULTS, candidates, program)
        self.p2g, self.used, self.record, self.failure = {}, {}, False, None
        self.folded_nodes, self.skipped, self.assumed = [], [], []

    def straight_node(self, pn: Node, gv: Any) -> bool:
        p2g, program = self.p2g, self.program
        if pn in p2g:
            return super().straight_node(pn, gv)
        param = program.params.get(pn)
        if param is not None:
            value = self.variable_value(pn, param, gv)
            if value is _MISSING:
                return False
            p2g[pn] = value
            return True
        facts = program.facts[pn]
        if not facts.simple:
            return super().straight_node(pn, gv)
        if type(gv) is not Node and not isinstance(gv, Node):
            return False
        keys = node_keys(gv)
        if facts.looks_through:
            behind = identity_source(gv)
            if behind is not None:
                if facts.key in keys:
                    raise _Undecided  # the op itself, or the op behind it: let the search try both
                self.skipped.append((gv, pn))
                return self.straight_node(pn, behind)
        if facts.key not in keys:
            return False
        g_args = gv.args
        if len(keys) != 1:  # another op respelled: line up by meaning
            values = lined_up_arguments(pn, gv)
        elif facts.inline and not gv.kwargs and len(g_args) == facts.arity and gv.target == pn.target:
            values = facts.names, facts.args, g_args
        else:
            values = lined_up_as(pn, gv, facts.meaning, pattern_named=facts.named)
        if values is None:
            return False
        p2g[pn] = gv
        names, p_values, g_values = values
        if facts.commutative and is_commutative_call(gv.op, gv.target, gv.args, gv.kwargs):
            g_values = self.decided_order(p_values, g_values)
        for name, p, g in zip(names, p_values, g_values):
            if type(p) is Node:
                if not self.straight_node(p, g):
                    return False
            elif not self.straight_value(p, g, name):
                return False
        return True


def _compiled_sound_match(program: _Program, pattern: Pattern, p2g: Mapping[Node, Any], anchor: Node,
                          modules: Mapping[str, torch.nn.Module], skipped: Iterable[tuple[Node, Node]]) -> Match | None:
    """:func:`_sound_match` (its slow twin) for a one-output pattern matched without assumed
    identities, from the pattern's :class:`_Program`; ``None`` where that gives no match."""
    output = p2g[program.output]
    inner: dict[Node, Node] = {}
    for pn in program.computed:
        gv = p2g.get(pn)
        if isinstance(gv, Node):
            inner[gv] = pn
    for gv, pn in skipped:
        inner.setdefault(gv, pn)
    checks: dict[Node, None] = {}
    for gn in inner:
        if gn is output:
            continue
        for user in gn.users:
            if user in inner or user in checks:
                continue
            if _absorbable(user, inner):
                checks[user] = None
                continue
            return None
    bindings: dict[str, Any] = {}
    for param, placeholder in program.placeholders:
        value = p2g.get(placeholder, _MISSING)
        if param.kind == "module":
            return _sound_match(pattern, p2g, anchor, modules, skipped)[0]
        if isinstance(value, Node) and value in inner:
            return None
        bindings[param.name] = value
    return Match(pattern, bindings, _in_graph_order([*inner, *checks]), (output,), anchor, {}, p2g)


def _in_graph_order(nodes: list[Node]) -> tuple[Node, ...]:
    """``nodes`` sorted by graph position (two, a two-op pattern's, compared rather than sorted)."""
    if len(nodes) == 2:
        a, b = nodes
        return (a, b) if _torch.node_position(a) < _torch.node_position(b) else (b, a)
    return tuple(sorted(nodes, key=_torch.node_position))


def match_at(pattern: Pattern, anchor: Node, owner: torch.nn.Module | None, *,
             options: MatchOptions = _DEFAULTS,
             candidates: Callable[[Any], Iterable[Node]] | None = None,
             on_reject: Callable[[Rejection], None] | None = None,
             modules: Mapping[str, torch.nn.Module] | None = None) -> Iterator[Match]:
    """Every sound match of ``pattern`` whose anchor is the graph node ``anchor``.

    ``owner`` is the module owning the graph (to look up ``call_module`` targets);
    ``candidates(key)`` lists graph nodes by op key, for patterns whose outputs are disconnected.
    ``on_reject`` receives a :class:`Rejection` for each way the anchor failed: the structural
    failure where the search got furthest, and each structural match that was not sound.
    """
    if modules is None:
        modules = dict(owner.named_modules()) if owner is not None and pattern.module_captures else {}
    return _matches(pattern, anchor, modules, options, candidates, on_reject, trees=FAST_TREES)


def matcher(pattern: Pattern, owner: torch.nn.Module | None, *, modules: Mapping[str, torch.nn.Module],
            candidates: Callable[[Any], Iterable[Node]] | None = None) -> Callable[[Node], Iterable[Match]]:
    """``match_at(pattern, anchor, owner, modules=modules, candidates=candidates)`` as a function of
    ``anchor``, with the same matches, for a caller that tries one pattern at many anchors (the
    driver keeps one per rule): a tree pattern's closures (:data:`FAST_TREES` and
    :data:`FAST_MODULE_TREES`, read here) are called directly, without a generator per try or a
    look-up of the pattern's compiled form; where they hand over, the compiled walk (or the
    search) goes on without trying them again.

    >>> from fxrewrite.pattern import trace_pattern
    >>> gm = torch.fx.symbolic_trace(lambda a: torch.neg(torch.neg(a)))
    >>> pattern = trace_pattern(lambda x: torch.neg(torch.neg(x)), rule_name="neg_neg", origin="<doc>")
    >>> outer = list(gm.graph.nodes)[2]
    >>> [m.bindings for m in matcher(pattern, gm, modules={})(outer)]
    [{'x': a}]
    """
    tree = _tree_for(pattern, _DEFAULTS)
    if tree is None:
        return lambda anchor: match_at(pattern, anchor, owner, modules=modules, candidates=candidates)

    def at(anchor: Node) -> Iterable[Match]:
        found = tree(anchor, modules)
        if found is _FALLBACK:
            return _matches(pattern, anchor, modules, _DEFAULTS, candidates, None, trees=False)
        return () if found is None else (found,)
    return at


def _tree_for(pattern: Pattern, options: MatchOptions) -> _Tree | None:
    """The closures matching ``pattern`` (:func:`_tree_matcher`) with these ``options``, when its
    fast path is on (:data:`FAST_TREES` with :data:`COMPILED` for a choice-free pattern,
    :data:`FAST_MODULE_TREES` for one calling module captures); else ``None``."""
    if not (options is _DEFAULTS or options == _DEFAULTS):
        return None
    if pattern.choice_free:
        if not (COMPILED and FAST_TREES):
            return None
        program = _program(pattern)
        return program.chain if FAST_CHAINS and program.chain is not None else program.tree
    if FAST_MODULE_TREES and not pattern.is_multi_output and pattern.module_captures:
        return _program(pattern).tree
    return None


def _matches(pattern: Pattern, anchor: Node, modules: Mapping[str, torch.nn.Module], options: MatchOptions,
             candidates: Callable[[Any], Iterable[Node]] | None, on_reject: Callable[[Rejection], None] | None, *,
             trees: bool) -> Iterator[Match]:
    """:func:`match_at`'s search; ``trees``: try a tree pattern's closures first (:func:`matcher`
    tried them already when it hands over)."""
    if trees and on_reject is None:
        tree = _tree_for(pattern, options)
        if tree is not None:
            found = tree(anchor, modules)
            if found is not _FALLBACK:
                if found is not None:
                    yield found
                return
    if pattern.choice_free and on_reject is None:
        if COMPILED and (options is _DEFAULTS or options == _DEFAULTS):
            walk: _StraightWalk = _CompiledWalk(pattern, modules, _program(pattern), candidates)
        else:
            walk = _StraightWalk(pattern, modules, options, candidates, record=False)
        try:  # one way to match at most: no search needed
            walked = walk.straight_node(pattern.anchor, anchor)
        except _Undecided:
            pass  # the search tries the alternatives
        else:
            if walked:
                if isinstance(walk, _CompiledWalk):  # (its bindings handed over: the walk ends here)
                    match = _compiled_sound_match(walk.program, pattern, walk.p2g, anchor, modules, walk.skipped)
                else:
                    match, _ = _sound_match(pattern, walk.p2g, anchor, modules, walk.skipped)
                if match is not None:
                    yield match
            return
    search = _Search(pattern, modules, options, candidates, record=on_reject is not None)
    extend = search.remaining_outputs if pattern.is_multi_output else _once
    for _ in search.node(pattern.anchor, anchor):
        for _ in extend():
            for reason in _folded_checks(search):
                match = None
                if reason is None:
                    reason = _assumed_refusal(search)
                if reason is None:
                    match, reason = _sound_match(pattern, search.p2g, anchor, modules, search.skipped,
                                                 [pn for pn, _, _ in search.assumed])
                if match is not None:
                    yield match
                elif on_reject is not None and reason is not None:
                    on_reject(reason)
    if search.failure is not None and on_reject is not None:
        on_reject(search.failure)


class _Undecided(Exception):
    """The straight walk met a commutative call whose operand order the graph does not decide."""


def _once() -> Iterator[None]:
    yield


def _sound_match(pattern: Pattern, p2g: Mapping[Node, Any], anchor: Node,
                 modules: Mapping[str, torch.nn.Module],
                 skipped: Iterable[tuple[Node, Node]] = (),
                 assumed: Iterable[Node] = ()) -> tuple[Match | None, Rejection | None]:
    inner: dict[Node, Node] = {}
    absent = set(assumed)  # pattern identities the graph lacks: they compute nothing there
    for pn in pattern.inner_nodes:
        gv = p2g.get(pn)
        if isinstance(gv, Node) and (pn not in pattern.value_nodes or pn in pattern.outputs) and pn not in absent:
            inner[gv] = pn
    for gv, pn in skipped:  # identities the pattern looked through: computed by the match too
        inner.setdefault(gv, pn)
    outputs = tuple(p2g[o] for o in pattern.outputs)
    output_set = set(outputs)
    checks: dict[Node, None] = {}
    for gn in inner:
        if gn in output_set:
            continue
        for user in gn.users:
            if user in inner or user in checks:
                continue
            if _absorbable(user, inner):
                checks[user] = None  # a check of the match's own values goes with the match
                continue
            return None, Rejection(inner[gn], gn, f"'{gn.name}' is also used by '{user.name}' outside the match",
                                   len(p2g))
    bindings: dict[str, Any] = {}
    module_paths: dict[str, str] = {}
    for param in pattern.params:
        value = p2g.get(pattern.placeholders[param.name], _MISSING)
        if param.kind == "module":
            module_paths[param.name] = value
            value = modules[value]
        elif isinstance(value, Node) and value in inner:
            return None, Rejection(pattern.placeholders[param.name], value,
                                   f"variable '{param.name}' would bind '{value.name}', which the match itself "
                                   f"computes", len(p2g))
        bindings[param.name] = value
    if pattern.is_multi_output and _creates_cycle(inner, bindings.values()):
        return None, Rejection(pattern.anchor, anchor, "replacing the match would create a cycle through the graph",
                               len(p2g))
    nodes = tuple(sorted([*inner, *checks], key=node_position))
    return Match(pattern, bindings, nodes, outputs, anchor, module_paths, dict(p2g)), None


def _assumed_refusal(search: _Search) -> Rejection | None:
    """Check the casts of the pattern that the graph lacks: each holds only where the value
    already has the dtype the pattern casts to (by the graph's metadata)."""
    for pn, gv, dtype in search.assumed:
        if dtype is None:
            continue
        known = tensor_value(gv)
        if known is None:
            return Rejection(pn, gv, f"the graph has no {_op_name(pn)} where the pattern casts; it is a no-op only "
                                     f"if '{gv.name}' already has the dtype, which needs metadata the graph does not "
                                     f"carry", len(search.p2g))
        try:
            expected = dtype if isinstance(dtype, torch.dtype) else _evaluate(dtype, search.p2g, {})
        except _NoMetadata:
            expected = None
        if expected != known.dtype:
            return Rejection(pn, gv, f"the graph has no {_op_name(pn)} where the pattern casts to {expected}; "
                                     f"'{gv.name}' is {known.dtype}", len(search.p2g))
    return None


def _known_dtype(node: Node) -> torch.dtype | None:
    """The dtype a node computes, when its metadata (or that of the tensor it reads ``.dtype``
    of) says."""
    val = value_of(node)
    if isinstance(val, torch.dtype):
        return val
    if node.op == "call_function" and node.target is getattr and node.args[1:2] == ("dtype",):
        source = tensor_value(node.args[0])
        return source.dtype if source is not None else None
    return None


def _absorbable(user: Node, inner: Mapping[Node, Node]) -> bool:
    """A node reading only the match's values that the match may take along when it is erased:
    a check (``_assert_tensor_metadata``) or an unused element of a tuple result (the indices
    of ``max(x, dim)`` that torch.export keeps)."""
    if not all(a in inner for a in user.all_input_nodes):
        return False
    return is_check(user) or (user.op == "call_function" and user.target is operator.getitem and not user.users)


def _folded_checks(search: _Search) -> Iterator[Rejection | None]:
    """Check the folded constants of a structural match: yields ``None`` (with the pattern's
    free variables bound) for each way they hold, else one reason. A variable that occurs only
    inside a folded expression (``math.sqrt(t.size(-1))``, where the graph holds 2.83) is tried
    with each tensor the match bound: the constant holds for the first that gives it."""
    if not search.folded_nodes:
        yield None
        return
    free = _free_placeholders(search.folded_nodes, search.p2g)
    if not free:
        yield _folded_refusal(search.folded_nodes, search.p2g)
        return
    tensors = list(dict.fromkeys(v for pn, v in search.p2g.items() if isinstance(v, Node) and pn.op == "placeholder"))
    reason = None
    for choice in itertools.product(tensors, repeat=len(free)):
        for pn, gv in zip(free, choice):
            search.bind(pn, gv)
        reason = _folded_refusal(search.folded_nodes, search.p2g)
        if reason is None:
            yield None
        for pn in free:
            search.unbind(pn)
        if reason is None:
            return
    yield reason or _folded_refusal(search.folded_nodes, search.p2g)


def _free_placeholders(folded: list[Node], p2g: Mapping[Node, Any]) -> list[Node]:
    free: dict[Node, None] = {}
    stack = list(folded)
    while stack:
        n = stack.pop()
        for a in n.all_input_nodes:
            if a.op == "placeholder" and a not in p2g:
                free[a] = None
            elif a.op != "placeholder":
                stack.append(a)
    return list(free)


def _folded_refusal(folded: list[Node], p2g: Mapping[Node, Any]) -> Rejection | None:
    """Compare each folded constant with what its pattern expression gives on the metadata of
    the values the match bound; a reason when one differs or cannot be computed."""
    for pn in folded:
        gv = p2g[pn]
        try:
            expected = _evaluate(pn, p2g, {})
        except _NoMetadata as missing:
            return Rejection(pn, gv, f"the graph holds {_show(gv)} where the pattern computes {pn.format_node()}; "
                                     f"comparing them needs the shape/dtype of '{missing}', which the graph does not "
                                     f"carry (pass example_inputs= to rewrite, or --shapes on the command line)",
                             len(p2g))
        actual = (value_of(gv) if has_value(gv) else _MISSING) if isinstance(gv, Node) else gv
        if not _same_value(expected, actual):
            return Rejection(pn, gv, f"the graph holds {_show(gv)} where the pattern's {pn.format_node()} gives "
                                     f"{expected!r} on the matched values", len(p2g))
    return None


class _NoMetadata(LookupError):
    pass


def _evaluate(pn: Node, p2g: Mapping[Node, Any], memo: dict[Node, Any]) -> Any:
    """The value of a pattern expression of sizes/dtypes, computed on the bound values'
    metadata (fake tensors): ``q.size(-1)`` on the node bound to ``q``."""
    if pn in memo:
        return memo[pn]
    if pn.op in ("call_function", "call_method") and result_kind(pn) == "value":
        args = torch.fx.node.map_arg(pn.args, lambda a: _evaluate(a, p2g, memo))
        kwargs = torch.fx.node.map_arg(pn.kwargs, lambda a: _evaluate(a, p2g, memo))
        if pn.op == "call_method":
            value = getattr(args[0], str(pn.target))(*args[1:], **kwargs)
        else:
            value = pn.target(*args, **kwargs)  # type: ignore[operator]
    else:  # a placeholder or a tensor the match bound: its metadata
        value = _metadata_value(p2g.get(pn, _MISSING), pn)
    memo[pn] = value
    return value


def _metadata_value(bound: Any, pn: Node) -> Any:
    if not isinstance(bound, Node):
        if bound is _MISSING:
            raise _NoMetadata(pn.name)
        return bound  # a literal capture
    val = tensor_value(bound)
    if isinstance(val, torch.Tensor):
        return val
    if val is not None:  # ShapeProp's TensorMetadata: a meta tensor of its shape and dtype
        return torch.empty(val.shape, dtype=val.dtype, device="meta")
    raise _NoMetadata(bound.name)


def _same_value(expected: Any, actual: Any) -> bool:
    if actual is _MISSING:
        return False
    if isinstance(expected, torch.dtype) or isinstance(actual, torch.dtype):
        return expected == actual
    try:
        return bool(expected == actual)
    except Exception:  # a symbolic comparison that cannot be decided
        return False


def anchor_module_class(pattern: Pattern) -> type | None:
    """The class a graph node's module must be an instance of for ``pattern`` to match there as
    its anchor (default options), when the anchor is a module capture's call; else ``None``.

    The search meets the anchor as :meth:`_Search.operation` does: an output (nothing looked
    through behind it), no size expression and no pattern identity (no other way to match it),
    so it goes to :meth:`_Search.module`, which refuses a module that is not an instance of the
    capture's class before anything else. A driver may skip such nodes without the search
    (``fxrewrite.driver.FAST_MODULE_ANCHOR``)."""
    pn = pattern.anchor
    if (pn.op != "call_module" or pn not in pattern.outputs or pn in pattern.value_nodes
            or pn in pattern.identities):
        return None
    capture = pattern.placeholders.get(str(pn.target))
    param = pattern.param_of.get(capture) if capture is not None else None
    if param is None or param.kind != "module" or not isinstance(param.annotation, type):
        return None
    return param.annotation


def anchor_input_module_classes(pattern: Pattern) -> tuple[type, ...]:
    """The classes of the module captures whose calls ``pattern``'s anchor reads directly
    (``lin(x) + b``: ``nn.Linear``), for a one-output pattern: at a graph node, each must bind an
    input of the node calling a module of its class, or be found behind an input the search looks
    through (an identity: :meth:`_Search.operation`; no other way to match a call of a module
    capture that is no identity or size expression of the pattern), or :meth:`_Search.module`
    refuses it. A driver may skip nodes where one class has no such input
    (``fxrewrite.driver.FAST_MODULE_INPUTS``). Empty when the anchor reads no such call, and for
    a pattern the tree closures match (:func:`matcher`: they refuse such a module as cheaply)."""
    if pattern.is_multi_output or _tree_for(pattern, _DEFAULTS) is not None:
        return ()
    found = []
    for pn in pattern.anchor.all_input_nodes:
        if (pn.op != "call_module" or pn in pattern.outputs or pn in pattern.value_nodes
                or pn in pattern.identities):
            continue
        capture = pattern.placeholders.get(str(pn.target))
        param = pattern.param_of.get(capture) if capture is not None else None
        if param is not None and param.kind == "module" and isinstance(param.annotation, type):
            found.append(param.annotation)
    return tuple(found)


def module_refusal(module: torch.nn.Module, param: Param) -> str | None:
    """Why a module capture must not bind ``module`` (folding it away would change what the
    program computes), or ``None``: hooks, parametrizations, and subclasses that override a
    method of the annotated class, unless the capture accepts them (:class:`~fxrewrite.pattern.Accept`)."""
    if not param.accept.hooks:
        hooks = _hooks(module)
        if hooks:
            return (f"has {hooks}; folding it would drop their effect. If the rule is right for such modules, "
                    f"annotate '{param.name}: Annotated[{param.annotation.__name__}, fxrewrite.Accept(hooks=True)]'")
    if not param.accept.subclasses and type(module) is not param.annotation:
        overridden = _overridden_methods(type(module), param.annotation)
        if overridden:
            cls = param.annotation.__name__
            return (f"is a {type(module).__name__}, a subclass of {cls} that overrides {', '.join(overridden)}, so "
                    f"it may compute something else. If the rule is right for it, annotate "
                    f"'{param.name}: Annotated[{cls}, fxrewrite.Accept(subclasses=True)]'")
    return None


def _hooks(module: torch.nn.Module) -> str:
    kinds = []
    for attribute, what in (("_forward_hooks", "forward hooks"), ("_forward_pre_hooks", "forward pre-hooks"),
                            ("_backward_hooks", "backward hooks"), ("_backward_pre_hooks", "backward pre-hooks")):
        if getattr(module, attribute, None):
            kinds.append(what)
    if is_parametrized(module):
        kinds.append("a parametrization")
    for attribute in ("_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
                      "_global_backward_pre_hooks"):
        if getattr(module_module, attribute, None):
            kinds.append("global module hooks (torch.nn.modules.module.register_module_*_hook)")
            break
    return " and ".join(kinds)


_HARMLESS_OVERRIDES = frozenset({"extra_repr", "_get_name"})


def _overridden_methods(cls: type, base: type) -> list[str]:
    """Methods of ``base`` that a class between ``cls`` and ``base`` redefines, not counting the
    classes of ``torch.nn`` itself (``nn.Conv2d`` implements ``_ConvNd``; ``torch.ao.nn.qat.Conv2d``
    changes ``nn.Conv2d``)."""
    found = []
    for klass in cls.__mro__:
        if klass is base or not issubclass(klass, base):
            break
        if klass.__module__.startswith("torch.nn.modules."):
            continue
        for name, value in vars(klass).items():
            dunder = name.startswith("__") and name.endswith("__")
            if (callable(value) and not dunder and name not in _HARMLESS_OVERRIDES and hasattr(base, name)
                    and name not in found):
                found.append(name)
    return found


def _creates_cycle(inner: Mapping[Node, Node], inputs: Iterable[Any]) -> bool:
    """True when an input of the match depends on a node of the match (so the fused region
    would both feed and consume it). Only nodes from the match's first node on are visited."""
    first = min(node_position(n) for n in inner)
    stack = [v for v in inputs if isinstance(v, Node) and node_position(v) >= first]
    seen: set[Node] = set()
    while stack:
        n = stack.pop()
        if n in inner:
            return True
        if n in seen:
            continue
        seen.add(n)
        stack.extend(a for a in n.all_input_nodes if node_position(a) >= first)
    return False


def _attribute(node: Node) -> Any:
    return attribute_at(node.graph.owning_module, str(node.target))


def _same_attribute_kind(pn: Node, gn: Node) -> bool:
    """torch.fx's rule for ``get_attr`` in patterns: a tensor attribute matches a tensor of the
    same type (an ``nn.Parameter`` only a Parameter, a plain tensor buffer only a plain tensor)."""
    p_value, g_value = _attribute(pn), _attribute(gn)
    return type(p_value) is type(g_value) and isinstance(p_value, torch.Tensor)


def _argument(name: str | None) -> str:
    if name is None:
        return ""
    return f"argument {int(name[1:]) + 1} " if name.startswith("#") else f"argument '{name}' "


def _show(value: Any) -> str:
    return f"'{value.name}'" if isinstance(value, Node) else repr(value)


def _op_name(n: Node) -> str:
    if n.op == "call_function":
        return getattr(n.target, "__name__", str(n.target))
    if n.op == "call_method":
        return f".{n.target}()"
    return f"{n.op} {n.target}"


def _arity(n: Node) -> str:
    return f"{len(n.args)} positional, keywords {sorted(n.kwargs)}"
