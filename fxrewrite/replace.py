"""Splice one replacement into a graph by Proxy retracing.

The rule's replacement function is *called* with ``torch.fx.Proxy`` objects for the tensors a
match bound (and the real values of literal and module captures), with the graph's insertion
point set where the matched region was. Every operation it performs records a node; Python
logic runs at rewrite time. Calling an ``nn.Module`` records ``call_module`` (a module of the
target keeps its path, a new one is registered under a fresh name); a tensor becomes a buffer.

The splice is a transaction: if the replacement raises, or returns something unusable, every
node, submodule and buffer it created is removed again and :class:`RewriteError` is raised,
naming the rule, its origin and the graph node. Only then are uses rewired and the matched
nodes erased.

How module calls are recorded is :mod:`fxrewrite._module_calls`; the guard that keeps a
replacement from changing the modules its match captured is :mod:`fxrewrite._captured`. A
replacement that depends on nothing but its arguments is called twice, then replayed from the
graph it recorded (:class:`_Template`). Fast paths and their slow twins (module flags, each with
a differential test): :data:`REPLAY` (call every time), :data:`FLAT_REPLAY` (fill a replayed
node's arguments with torch.fx's ``map_aggregate``), :data:`FAST_DELETION` (a template that
creates no node replayed by the whole splice), :data:`DIRECT_MODULE_CALLS` (record a
module call with torch.fx's ``create_proxy``), :data:`JOURNALED_NAMES` (copy the graph's name
counts before a call that may be rolled back), and ``PATCH_ALWAYS`` / ``PATCH_DUNDER_CALL`` in
:mod:`fxrewrite._module_calls`.
"""

from __future__ import annotations

import bisect
import collections
import contextlib
import dis
import inspect
import re
from collections.abc import Callable, Hashable, MutableMapping, Sequence
from typing import Any

import attrs
import torch
import torch.fx as fx
from torch.fx.node import Node

from ._captured import CapturedModules, ModuleWrite, captured_modules
from ._module_calls import DUNDER, Holds, first_mode, next_mode, recording
from ._torch import add_fresh_submodule, add_node, fresh_node_name, is_erased, node_name_base, tree_leaves
from .canon import (
    METADATA_ATTRIBUTES,
    METADATA_METHODS,
    alias_class,
    aten_spelling,
    effects,
    is_aten_graph,
    mutation,
    result_kind,
    writers_of,
    written_arguments,
)
from .errors import ModuleWriteError, Refuse, RewriteError
from .match import Match, node_position
from .meta import copy_value, has_values, propagate_values, rule_metadata, value_of
from .rule import Rule

__all__ = ["Change", "Splicer", "insertion_point", "placement_refusal"]


#: Node metadata saying where in the module tree a node comes from; new nodes take the anchor's.
_SCOPE_META = ("nn_module_stack", "source_fn_stack", "fwd_nn_module_stack", "fwd_source_fn_stack")



def _concrete(value: Any) -> bool:
    """A Python value without symbolic parts (a SymInt would leak a shape variable into code)."""
    return not any(isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool))
                   for v in tree_leaves(value))


class _ValueProxy(fx.Proxy):
    """A Proxy that answers ``.dtype``, ``.shape``, ``.size()``, ``.dim()``, ``.device``,
    ``.numel()``, ``.is_floating_point()`` ... (canon's :data:`~fxrewrite.canon.METADATA_ATTRIBUTES`
    and :data:`~fxrewrite.canon.METADATA_METHODS`) with the concrete values in its node's metadata
    (fake tensors), so a replacement can branch on them at rewrite time; every tensor operation
    is still recorded. Without metadata it records, like any Proxy."""

    def _value(self) -> Any:
        return value_of(self.node) if getattr(self.tracer, "annotate", False) else None

    def __getattr__(self, name: str) -> Any:
        val = self._value()
        if isinstance(val, torch.Tensor) and not name.startswith("__"):
            if name in METADATA_ATTRIBUTES and _concrete(getattr(val, name)):
                self.tracer.read_metadata = True  # type: ignore[attr-defined]
                return getattr(val, name)
            if name in METADATA_METHODS:
                self.tracer.read_metadata = True  # type: ignore[attr-defined]
                return _ConcreteMethod(self, name, getattr(val, name))
        return super().__getattr__(name)

    def __len__(self) -> int:
        val = self._value()
        self.tracer.read_metadata = True  # type: ignore[attr-defined]
        if isinstance(val, (tuple, list)):
            return len(val)
        if isinstance(val, torch.Tensor) and val.dim() and _concrete(val.shape[0]):
            return int(val.shape[0])
        return super().__len__()

    def __iter__(self) -> Any:
        val = self._value()
        if isinstance(val, (tuple, list)):
            return iter([self[i] for i in range(len(val))])  # type: ignore[index]
        frame = inspect.currentframe()
        caller = frame.f_back if frame is not None else None
        if caller is not None:  # a, b = proxy: unpack as torch.fx does, from the caller's bytecode
            instructions = list(dis.get_instructions(caller.f_code))
            index = bisect.bisect_left(instructions, caller.f_lasti, key=lambda i: i.offset)
            if index < len(instructions) and instructions[index].opname == "UNPACK_SEQUENCE":
                return iter([self[i] for i in range(instructions[index].argval)])  # type: ignore[index]
        return self.tracer.iter(self)


class _ConcreteMethod:
    """``proxy.size`` on an annotated node: calling it gives the concrete answer when it has no
    symbolic part, else records the call."""

    def __init__(self, proxy: _ValueProxy, name: str, method: Any) -> None:
        self.proxy, self.name, self.method = proxy, name, method

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        value = self.method(*args, **kwargs)
        if _concrete(value):
            return value
        return self.proxy.tracer.create_proxy("call_method", self.name, (self.proxy, *args), kwargs)


#: Record a replacement's module call with ``add_node`` (the slow twin, False: torch.fx's
#: ``Tracer.create_proxy``, as under ``preserve_node_meta`` always).
DIRECT_MODULE_CALLS = True


class _ReplacementTracer(fx.Tracer):
    """Records a replacement's operations into the target graph, remembering what it created.

    One tracer serves a whole ``rewrite`` call (building an fx Tracer is not cheap);
    :meth:`begin` points it at the next rule.
    """

    def __init__(self, gm: fx.GraphModule, modules: dict[str, torch.nn.Module]) -> None:
        super().__init__()
        self.graph = gm.graph
        self.root = gm
        self.root_module = gm  # the GraphModule itself (fx types ``root`` as any nn.Module)
        self.modules = modules
        self.rule: Rule | None = None
        self.created: list[Node] = []
        self.new_attributes: list[str] = []
        self._module_paths = {id(m): name for name, m in modules.items()}
        self._tensor_paths: dict[int, str] | None = None
        self._node_meta: dict[str, Any] = rule_metadata(None, "")
        self.aten = False
        self.annotate = False
        #: Set when the replacement read a matched value's metadata or called a module: its graph
        #: may then differ from match to match, so it is not replayed.
        self.read_metadata = False
        self.called_module = False
        self._next_suffix: dict[str, int] = {}
        self._bases: dict[str, str] = {}  # "<rule>_<what>" -> the identifier made of it (see _fresh_name)
        #: Per rule name: what every node its replacement creates carries, where the replaced code
        #: sat aside (see :meth:`begin`); read only, copied into each node's ``meta``.
        self._rule_meta: dict[str, dict[str, Any]] = {}

    def begin(self, rule: Rule, aten: bool, annotate: bool = False, anchor: Node | None = None) -> None:
        self.rule = rule
        self.aten = aten
        self.annotate = annotate
        self.created = []
        self.new_attributes = []
        self.read_metadata = self.called_module = False
        #: What every node the replacement creates carries: where the replaced code sat (read by
        #: torch.export.unflatten, quantizers and ExecuTorch partitioners from every node), where
        #: the rule is written (``stack_trace``) and which rule made it.
        base = self._rule_meta.get(rule.name)
        if base is None:
            base = self._rule_meta[rule.name] = rule_metadata(rule.name, _stack_trace(rule))
        meta = anchor.meta if anchor is not None else None
        scope = {k: meta[k] for k in _SCOPE_META if k in meta} if meta else None
        self._node_meta = {**scope, **base} if scope else base

    def create_node(self, kind, target, args, kwargs, name=None, type_expr=None):  # type: ignore[no-untyped-def]
        if self.aten and kind in ("call_function", "call_method"):
            kind, target, args, kwargs = aten_spelling(kind, target, args, kwargs)
        node = super().create_node(kind, target, args, kwargs, name, type_expr)
        node.meta.update(self._node_meta)
        self.created.append(node)
        if self.annotate:  # the replacement may ask this value's shape next
            propagate_values(self.root_module, [node])
        return node

    def proxy(self, node: Node) -> fx.Proxy:
        return _ValueProxy(node, self)

    def create_arg(self, a: Any) -> Any:
        if isinstance(a, torch.Tensor) and not isinstance(a, fx.Proxy):
            return self.create_node("get_attr", self._tensor_path(a), (), {})
        return super().create_arg(a)

    def _tensor_path(self, tensor: torch.Tensor) -> str:
        if self._tensor_paths is None:
            named = [*self.root.named_parameters(), *self.root.named_buffers()]
            self._tensor_paths = {id(t): name for name, t in named}
        path = self._tensor_paths.get(id(tensor))
        if path is None:
            path = self._fresh_name("const")
            if isinstance(tensor, torch.nn.Parameter):
                self.root.register_parameter(path, tensor)
            else:
                self.root.register_buffer(path, tensor)
            self.new_attributes.append(path)
            self._tensor_paths[id(tensor)] = path
        return path

    def replay_node(self, kind: str, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                    name_base: str, *, as_fx: bool) -> Node:
        """Record a node of a replayed replacement: the node :meth:`create_node` would record (its
        ATen spelling already decided), built directly under a fresh name from ``name_base``, or
        (``as_fx``) by torch.fx's own ``create_node``."""
        if as_fx:
            node = fx.Tracer.create_node(self, kind, target, args, kwargs)
            node.meta.update(self._node_meta)
        else:
            node = add_node(self.graph, fresh_node_name(self.graph, name_base), kind, target, args, kwargs,
                            meta=self._node_meta)
        self.created.append(node)
        return node

    def module_call(self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> fx.Proxy:
        self.called_module = True
        path = self._module_paths.get(id(module))
        if path is None:
            path = self._fresh_name(type(module).__name__.lower())
            if DIRECT_MODULE_CALLS:
                add_fresh_submodule(self.root_module, path, module)
            else:
                self.root_module.add_submodule(path, module)
            self.new_attributes.append(path)
            self.modules[path] = module
            self._module_paths[id(module)] = path
        if not DIRECT_MODULE_CALLS or fx.traceback.has_preserved_node_meta():
            return self.create_proxy("call_module", path, args, kwargs)
        # the node torch.fx's create_proxy would record (its ATen spelling never applies to
        # call_module), built directly as a replayed node is
        if not kwargs and all(isinstance(a, fx.Proxy) for a in args):  # what create_arg makes of them
            node_args: Any = tuple(a.node for a in args)
            node_kwargs: Any = {}
        else:
            node_args, node_kwargs = self.create_arg(args), self.create_arg(kwargs)
        node = add_node(self.graph, fresh_node_name(self.graph, node_name_base(self.graph, path)), "call_module",
                        path, node_args, node_kwargs, meta=self._node_meta)
        self.created.append(node)
        if self.annotate:
            propagate_values(self.root_module, [node])
        return self.proxy(node)

    def _fresh_name(self, what: str) -> str:
        """``<rule>_<what>_<k>`` with the first free ``k``; the search resumes where the last one
        for this base stopped (a rule folding a thousand convolutions costs linear time)."""
        prefix = f"{self.rule.name if self.rule else 'fxrewrite'}_{what}"
        base = self._bases.get(prefix)
        if base is None:
            base = self._bases[prefix] = re.sub(r"\W", "_", prefix)
        k = self._next_suffix.get(base, 0)
        while _has_attribute(self.root, f"{base}_{k}"):
            k += 1
        self._next_suffix[base] = k + 1
        return f"{base}_{k}"

    def names(self) -> _NameMark:
        """Where the graph's and the module's fresh names stand (for :meth:`rollback`); close it
        (:meth:`_NameMark.close`) once the replacement's call ended."""
        return _NameMark(self.graph._graph_namespace, self._next_suffix)

    def rollback(self, names: _NameMark | None = None) -> None:
        """Remove what the replacement created; with ``names`` (from :meth:`names` before it ran),
        also free the names it took, so that calling it again makes the same names."""
        if names is not None:
            names.free(self.created)
            self._next_suffix = dict(names.suffixes)
        for node in reversed(self.created):
            if not is_erased(node):
                for user in list(node.users):
                    user.replace_input_with(node, None)  # type: ignore[arg-type]  # created nodes only feed each other
                self.graph.erase_node(node)
        for path in reversed(self.new_attributes):
            value = getattr(self.root, path)
            delattr(self.root, path)
            self.modules.pop(path, None)
            self._module_paths.pop(id(value), None)
            if self._tensor_paths is not None:
                self._tensor_paths.pop(id(value), None)
        self.created = []
        self.new_attributes = []


def _has_attribute(module: torch.nn.Module, name: str) -> bool:
    """``hasattr(module, name)``, read from the module's tables where that is all it would read
    (:func:`~fxrewrite.canon.effects.plain_attribute`; its slow twin, ``FAST_MODULE_ATTRIBUTES``
    off: ``hasattr``, whose miss raises inside ``nn.Module.__getattr__``)."""
    if effects.FAST_MODULE_ATTRIBUTES:
        found = effects.plain_attribute(module, name)
        if found is not effects.UNSURE:
            return found is not effects.ABSENT
    return hasattr(module, name)


#: Mark where a graph's fresh names stand before a replacement runs by journaling the name counts
#: its call changes (:class:`_CountJournal`, opened in constant time); ``False`` (the slow twin):
#: copy every count, one per name base the graph ever used (``conv17`` is a base of its own), which
#: made each fold of a 64k-node graph copy thousands of them. ``tests/test_module_calls.py`` checks
#: that both splice the same graphs, names included, when a replacement is called again.
JOURNALED_NAMES = True
_ABSENT = object()


class _CountJournal(MutableMapping[str, int]):
    """Stands for a graph namespace's name counts (``base -> last number``, torch.fx's
    ``_base_count``) while one replacement runs: reads and writes go to the counts, and the first
    write of each base keeps the value it had, so that :meth:`undo` puts back exactly what the
    call changed."""

    def __init__(self, counts: dict[str, int]) -> None:
        self.counts = counts
        self.before: dict[str, Any] = {}

    def get(self, key: str, default: Any = None) -> Any:
        return self.counts.get(key, default)

    def __getitem__(self, key: str) -> int:
        return self.counts[key]

    def __setitem__(self, key: str, value: int) -> None:
        if key not in self.before:
            self.before[key] = self.counts.get(key, _ABSENT)
        self.counts[key] = value

    def __delitem__(self, key: str) -> None:
        if key not in self.before:
            self.before[key] = self.counts.get(key, _ABSENT)
        del self.counts[key]

    def __iter__(self) -> Any:
        return iter(self.counts)

    def __len__(self) -> int:
        return len(self.counts)

    def undo(self) -> None:
        for key, value in self.before.items():
            if value is _ABSENT:
                self.counts.pop(key, None)
            else:
                self.counts[key] = value
        self.before.clear()


class _NameMark:
    """Where a graph's fresh names stood before a replacement ran (:meth:`_ReplacementTracer.names`):
    the tracer's module-name suffixes (a few, copied) and the graph's name counts, journaled while
    the call runs (:data:`JOURNALED_NAMES`) or copied. :meth:`free` puts them back and frees the
    names the call's nodes took; :meth:`close` ends the journal (the counts are torch.fx's again)."""

    def __init__(self, namespace: Any, suffixes: dict[str, int]) -> None:
        self.namespace = namespace
        self.suffixes = dict(suffixes)
        counts = getattr(namespace, "_base_count", None)
        self.journal: _CountJournal | None = None
        self.counts: dict[str, int] | None = None
        if JOURNALED_NAMES and type(counts) is dict:
            self.journal = namespace._base_count = _CountJournal(counts)
        else:
            self.counts = dict(counts or {})

    def close(self) -> None:
        journal = self.journal
        if journal is not None and self.namespace.__dict__.get("_base_count") is journal:
            self.namespace._base_count = journal.counts

    def free(self, created: Sequence[Node]) -> None:
        namespace = self.namespace
        used = getattr(namespace, "_used_names", None)
        if used is None or not hasattr(namespace, "_base_count"):
            return
        for node in created:
            used.discard(node.name)
        if self.journal is not None:
            self.journal.undo()
        else:
            namespace._base_count.clear()
            namespace._base_count.update(self.counts)


def _stack_trace(rule: Rule) -> str:
    """The ``stack_trace`` of the nodes a rule creates: its definition, where tools show a
    node's origin (``print_readable``, Inductor's provenance)."""
    file, _, line = rule.origin.rpartition(":")
    summary = f"fxrewrite rule {rule.name}" + (f": {rule.doc}" if rule.doc else "")
    return f'File "{file or rule.origin}", line {line if line.isdigit() else 0}, in {rule.name}\n    {summary}\n'


#: Replay replacements from a recorded template instead of calling them again (see :class:`_Template`).
REPLAY = True


@attrs.frozen
class _Slot:
    """In a template, the value bound to the pattern parameter ``name``."""

    name: str


@attrs.frozen
class _Made:
    """In a template, the ``index``-th node the replacement created."""

    index: int


@attrs.frozen
class _Template:
    """A replacement's recorded graph: the nodes it made (arguments refer to bound values and
    earlier nodes) and which values it returned. Replaying it splices the same nodes as calling
    the replacement again would, without running Python and ``__torch_function__`` per match.

    Only replacements that depend on nothing but their arguments are replayed: the template is
    keyed by the rule, the graph's level, and the literal captures' values; a replacement that
    read a matched value's shape or dtype, called a module or made a tensor constant is always
    called; and a template is used only after a second call recorded the very same graph. The
    checks a call's result gets (inputs live and earlier, constants an op can take, no write into
    an input, a tensor where the pattern matched one) were passed by the recorded calls and hold
    for every replay: a replay reads only the match's bound values (tensors, before the insertion
    point), makes the same operations on them and passes the same constants.
    """

    nodes: tuple[tuple[str, Any, Any, Any], ...]
    outputs: tuple[Any, ...]
    #: The name each node's fresh name is made from (``mul`` for ``mul_17``), as ``create_node`` makes it.
    name_bases: tuple[str, ...] = attrs.field(eq=False)
    #: Per node: no argument is a container (tuple, list, dict, slice), so a replay fills them in
    #: one pass instead of torch.fx's ``map_aggregate`` (:data:`FLAT_REPLAY`).
    flat: tuple[bool, ...] = attrs.field(eq=False, default=())
    #: Does one of its nodes write in place (into a tensor it made)? (Read from the recorded call.)
    writes: bool = attrs.field(eq=False, default=False)

    @classmethod
    def record(cls, match: Match, created: list[Node], outputs: list[Node], writes: bool) -> _Template | None:
        slots = {v: _Slot(k) for k, v in match.bindings.items() if isinstance(v, Node)}
        made = {n: _Made(i) for i, n in enumerate(created)}

        def symbolic(value: Any) -> Any:
            if isinstance(value, Node):
                return made.get(value) or slots.get(value) or _UNKNOWN
            return value

        nodes = tuple((n.op, n.target, fx.node.map_aggregate(n.args, symbolic),
                       fx.node.map_aggregate(n.kwargs, symbolic)) for n in created)
        graph = match.anchor.graph
        template = cls(nodes, tuple(symbolic(o) for o in outputs),
                       tuple(node_name_base(graph, n.target) for n in created),
                       tuple(_flat(args) and _flat(kwargs.values()) for _, _, args, kwargs in nodes), writes)
        leaves = tree_leaves((template.nodes, template.outputs))
        return None if any(leaf is _UNKNOWN for leaf in leaves) else template

    def outputs_of(self, match: Match) -> list[Node]:
        """What a template that creates no node returns for ``match``: values the match bound
        (what :meth:`replay` returns for it)."""
        bindings = match.bindings
        return [bindings[o.name] if isinstance(o, _Slot) else o for o in self.outputs]

    def replay(self, match: Match, tracer: _ReplacementTracer) -> list[Node]:
        made: list[Node] = []
        bindings = match.bindings

        def concrete(value: Any) -> Any:
            if isinstance(value, _Slot):
                return bindings[value.name]
            return made[value.index] if isinstance(value, _Made) else value

        as_fx = fx.traceback.has_preserved_node_meta()  # fx copies the ambient node meta: build nodes as fx does
        flat = self.flat if FLAT_REPLAY else (False,) * len(self.nodes)
        for (op, target, args, kwargs), base, one_pass in zip(self.nodes, self.name_bases, flat):
            if one_pass:  # the node's constructor makes its containers immutable, as map_aggregate does
                args = tuple([concrete(a) for a in args])
                kwargs = {k: concrete(v) for k, v in kwargs.items()}
            else:
                args, kwargs = fx.node.map_aggregate(args, concrete), fx.node.map_aggregate(kwargs, concrete)
            made.append(tracer.replay_node(op, target, args, kwargs, base, as_fx=as_fx))
        return [concrete(o) for o in self.outputs]


#: Splice a confirmed template that creates no node (a deletion) without the tracer, the insertion
#: point's context or the replay (:meth:`Splicer._delete`); ``False`` is the slow twin, the full
#: splice with its replay (``tests/test_replace.py`` checks both splice the same graphs).
FAST_DELETION = True
#: Fill a replayed node's arguments in one pass when none is a container (the slow twin, False:
#: always torch.fx's ``map_aggregate``).
FLAT_REPLAY = True


def _flat(values: Any) -> bool:
    return not any(isinstance(v, (tuple, list, dict, slice)) for v in values)


_UNKNOWN = object()  # a node the replacement read that is neither bound nor its own: never replayed


class Change:
    """What one splice did to the graph: the event :class:`Splicer` sends its listeners once the
    graph is consistent again (uses rewired, matched nodes erased). The driver refills its
    worklist from it (see :mod:`fxrewrite.driver`). Read only (a plain class with slots: one
    is made per rewrite)."""

    __slots__ = ("created", "erased", "inputs", "replaced", "writes")

    def __init__(self, created: tuple[Node, ...], erased: tuple[Node, ...],
                 replaced: tuple[tuple[Node, Node], ...], inputs: tuple[Node, ...], writes: bool = False) -> None:
        #: The nodes the replacement created, in the order it created them.
        self.created = created
        #: The matched nodes, erased now.
        self.erased = erased
        #: Per pattern output, in the pattern's order: the matched node, and the node that stands
        #: for it now (one of ``created``, or a value the match read when the replacement returns it).
        self.replaced = replaced
        #: The graph values the match read (its bound nodes): each lost the matched nodes as users.
        self.inputs = inputs
        #: Does a created node write in place (into a tensor the replacement made: writes into
        #: anything else are refused)? ``canon.writes_in_place(created)``, worked out once by the splicer.
        self.writes = writes

    def __repr__(self) -> str:
        return (f"Change(created={list(self.created)}, erased={list(self.erased)}, replaced={list(self.replaced)}, "
                f"inputs={list(self.inputs)})")


class Splicer:
    """Splices replacements into one GraphModule and tells its listeners (:meth:`listen`) what
    each splice changed (:class:`Change`).

    While a replacement function runs, calling any ``nn.Module`` on Proxies in this thread
    records a ``call_module`` node instead of tracing through its ``forward`` (see
    :mod:`fxrewrite._module_calls`). Used as a context manager (a drive), the splicer keeps the
    method of ``nn.Module`` that recording replaces from its first replacement that records to
    the block's end (:class:`~fxrewrite._module_calls.Holds`), instead of replacing it around each call.
    """

    def __init__(self, gm: fx.GraphModule, modules: dict[str, torch.nn.Module]) -> None:
        self.gm = gm
        self.tracer = _ReplacementTracer(gm, modules)
        self._listeners: list[Callable[[Change], object]] = []
        #: Per template key: the template of the first call, then (once a second call recorded the
        #: same) the confirmed template, or None when the replacement cannot be replayed.
        self._templates: dict[Hashable, tuple[_Template | None, bool]] = {}
        self.sites = _ModuleCallSites(gm.graph)
        #: Per replacement (rule name, function id): the mode of :mod:`fxrewrite._module_calls` it is called in.
        self._modes: dict[tuple[str, int], str] = {}
        #: Per rule (by id, the rule kept alive): the names of its literal captures (see :func:`_literal_captures`).
        self._captures: dict[int, tuple[Rule, tuple[str, ...] | None]] = {}
        self._holds: Holds | None = None  # inside ``with splicer:``, the slots held until its end

    def __enter__(self) -> Splicer:
        if self._holds is None:
            self._holds = Holds()
        return self

    def __exit__(self, *exc: object) -> None:
        holds, self._holds = self._holds, None
        if holds is not None:
            holds.release()

    def listen(self, listener: Callable[[Change], object]) -> None:
        """Call ``listener(change)`` after every successful splice, in the order listeners were added."""
        self._listeners.append(listener)

    def splice(self, match: Match, rule: Rule) -> list[Node]:
        """Replace ``match`` by ``rule.replacement``; returns the nodes created.

        Raises :class:`RewriteError` (graph unchanged) if the replacement fails.
        """
        point = insertion_point(match)
        if point is None:
            raise RewriteError(_where(rule, match) + ": no place in the graph where the replacement's inputs "
                               "are all computed and its results not yet used; this match cannot be rewritten.")
        literal_names = self._literal_captures(rule)
        guard = _guard_for(match, self.tracer) if literal_names is None else None  # only module captures bind modules
        tracer = self.tracer
        # replacements see shapes and dtypes when the graph has them; a rule rewriting a Python value
        # (x.shape[d] => x.size(d)) is recorded as written, never folded to a constant
        annotated = has_values(match.bindings.values()) and all(result_kind(o) != "value" for o in match.outputs)
        aten = is_aten_graph(match.nodes)
        key = _template_key(rule, match, aten, annotated, literal_names) if REPLAY else None
        known = self._templates.get(key) if key is not None else None
        if FAST_DELETION and known is not None and known[1] and known[0] is not None and not known[0].nodes:
            return self._delete(match, known[0])
        tracer.begin(rule, aten=aten, annotate=annotated, anchor=match.anchor)
        try:
            with self.gm.graph.inserting_before(point):
                template = known[0] if known is not None and known[1] else None
                replayed = template is not None
                if template is not None:
                    new_outputs, writes = template.replay(match, tracer), template.writes
                else:
                    new_outputs, writes = self._call(match, rule, guard)
            if annotated:
                propagate_values(self.gm, tracer.created)
            if not replayed:  # what a replay builds passed these checks when it was recorded
                _refuse_non_tensor_outputs(match, rule, new_outputs)
                _check_created(match, rule, tracer.created)
                _refuse_unbound_op_calls(match, rule, tracer.created)
        except Exception as exc:
            tracer.rollback()
            if guard is not None:
                guard.undo()
            if isinstance(exc, ModuleWrite):
                raise ModuleWriteError(_module_write_message(rule, match, exc)) from None
            if isinstance(exc, (RewriteError, Refuse)):
                raise
            if isinstance(exc, fx.proxy.TraceError) and annotated:
                raise Refuse("the replacement branches on a size that is symbolic in this graph (dynamic shapes); "
                             "it is left as it was") from exc
            raise RewriteError(f"{_where(rule, match)}: the replacement raised {type(exc).__name__}: {exc}. The graph "
                               f"was left as it was before this rewrite; {_fix_for(exc, annotated)}") from exc
        if key is not None and (known is None or not known[1]):
            self._learn(key, known, match, tracer, new_outputs, writes)
        return self._finish(match, tracer.created, new_outputs, writes)

    def _delete(self, match: Match, template: _Template) -> list[Node]:
        """Splice a confirmed template that creates no node (a deletion: ``neg(neg(x)) => x``): the
        match's outputs are rewired to values it read, as the replay and the rest of :meth:`splice`
        would do, without the tracer, the insertion point or the replay (:data:`FAST_DELETION`)."""
        return self._finish(match, [], template.outputs_of(match), False)

    def _finish(self, match: Match, created: list[Node], new_outputs: list[Node], writes: bool) -> list[Node]:
        """The end of every splice: the match's outputs rewired to ``new_outputs``, its nodes
        erased, the call sites counted and the listeners told (``writes``: does a created node
        write in place); ``created`` is returned."""
        _rewire(match, new_outputs)
        _erase(self.gm.graph, match)
        self.sites.spliced(created, match.nodes)
        if self._listeners:
            self._notify(match, created, new_outputs, writes)
        return created

    def _call(self, match: Match, rule: Rule, guard: CapturedModules | None) -> tuple[list[Node], bool]:
        """Call the replacement on Proxies, recording its module calls and guarding the modules the
        match captured; the nodes that stand for the pattern's outputs, and whether a node it
        created writes in place.

        The replacement runs in the mode of :mod:`fxrewrite._module_calls` it was last called in
        (first: :func:`~fxrewrite._module_calls.first_mode`). When a module call got past that
        mode's recording (:class:`~fxrewrite._module_calls.ModuleCallSeen`), what the call created
        and changed is rolled back and the replacement called again in the next mode, which this
        splicer keeps for it from then on."""
        tracer = self.tracer
        key = (rule.name, id(rule.replacement))
        mode = self._modes.get(key)
        if mode is None:
            mode = self._modes[key] = first_mode(rule)
        while True:
            result, again = self._call_in(mode, match, rule, guard)
            if not again:
                break
            mode = self._modes[key] = next_mode(mode)
        if guard is not None:
            guard.check()
            _refuse_shared_modules(match, rule, tracer, self.sites)
        new_outputs = _output_nodes(result, match, rule, tracer)
        return new_outputs, _refuse_input_mutation(match, rule, tracer.created)

    def _call_in(self, mode: str, match: Match, rule: Rule, guard: CapturedModules | None) -> tuple[Any, bool]:
        """Call the replacement once, module calls recorded in ``mode``: its result and whether
        a module call got past the recording (then everything the call did is undone and its
        names freed, so that calling it again makes the same graph)."""
        tracer = self.tracer
        if self._holds is not None:
            self._holds.keep(mode)
        names = tracer.names() if mode != DUNDER else None  # nothing gets past DUNDER: never rolled back here
        watch = None
        try:
            try:
                with guard if guard is not None else contextlib.nullcontext(), recording(tracer, mode) as watch:
                    result = rule.replacement(**_arguments(match, tracer))
            except Exception:
                if watch is None or not watch.called:
                    raise
            if watch is None or not watch.called:
                return result, False
            tracer.rollback(names)
        finally:
            if names is not None:
                names.close()
        tracer.read_metadata = False
        if guard is not None:
            guard.undo()
        return None, True

    def _literal_captures(self, rule: Rule) -> tuple[str, ...] | None:
        """:func:`_literal_captures` of ``rule``, read once per rule."""
        known = self._captures.get(id(rule))
        if known is None or known[0] is not rule:
            known = self._captures[id(rule)] = (rule, _literal_captures(rule))
        return known[1]

    def _notify(self, match: Match, created: list[Node], new_outputs: list[Node], writes: bool) -> None:
        """Send the listeners the :class:`Change` a splice made."""
        outputs = match.outputs
        replaced = ((outputs[0], new_outputs[0]),) if len(outputs) == 1 else tuple(zip(outputs, new_outputs))
        change = Change(tuple(created) if created else (), tuple(match.nodes), replaced,
                        tuple([v for v in match.bindings.values() if isinstance(v, Node)]), writes)
        for listener in self._listeners:
            listener(change)

    def _learn(self, key: Hashable, known: tuple[_Template | None, bool] | None, match: Match,
               tracer: _ReplacementTracer, outputs: list[Node], writes: bool) -> None:
        """After calling a replacement: remember its graph, and trust it for replay once a
        second call recorded the same one."""
        if tracer.read_metadata or tracer.called_module or tracer.new_attributes:
            self._templates[key] = (None, True)  # depends on more than its arguments: always call it
            return
        template = _Template.record(match, tracer.created, outputs, writes)
        if known is None:
            self._templates[key] = (template, False)
        else:
            same = template is not None and template == known[0]
            self._templates[key] = (template, True) if same else (None, True)


def _template_key(rule: Rule, match: Match, aten: bool, annotate: bool,
                  literal_names: tuple[str, ...] | None) -> Hashable | None:
    """What a replacement's recorded graph may depend on besides the bound tensors: the rule,
    the graph's level, the values of its literal captures (``literal_names``, from
    :func:`_literal_captures`) and which variables bound the same value (``None``: never
    replayed, e.g. a module capture)."""
    if literal_names is None:
        return None
    bindings = match.bindings
    if not literal_names and len(bindings) == 1:  # (what the rest makes of no literal and one binding)
        return (rule.name, id(rule.replacement), aten, annotate, (), ())
    # repr: -0.0 is not 0.0 here
    literals = tuple([(name, type(bindings[name]), repr(bindings[name])) for name in literal_names]) \
        if literal_names else ()
    # which variables bound the same value: a template records one of them for both, so it is only
    # replayed for matches that share values the same way (x * x recorded is not x * y); one binding shares nothing
    sharing: tuple[tuple[str, ...], ...] = ()
    if len(bindings) > 1:
        nodes = [v for v in bindings.values() if isinstance(v, Node)]
        if len(set(nodes)) < len(nodes):
            shared: dict[Node, list[str]] = {}
            for name, value in bindings.items():
                if isinstance(value, Node):
                    shared.setdefault(value, []).append(name)
            sharing = tuple(sorted(tuple(names) for names in shared.values() if len(names) > 1))
    if literals:
        try:
            hash(literals)  # a type whose metaclass makes it unhashable: never replayed
        except TypeError:
            return None
    return (rule.name, id(rule.replacement), aten, annotate, literals, sharing)  # the rest: strs, ints, bools


def _literal_captures(rule: Rule) -> tuple[str, ...] | None:
    """The names of ``rule``'s literal captures; ``None`` when it has a module capture (its
    replacement is never replayed)."""
    params = rule.compiled.params
    if any(p.kind == "module" for p in params):
        return None
    return tuple(p.name for p in params if p.kind == "literal")


def placement_refusal(match: Match,
                      writers: Callable[[Node], tuple[Node, ...] | None] = writers_of) -> str | None:
    """Why the replacement of ``match`` cannot take the match's place, or ``None``: there is no
    point after every input and before every outside use of an output, or a value the match
    reads is written in place once the match has started reading it (the replacement would read
    it at another time), or a value it returns is written in place (a replacement returning its
    input would carry the write into it). A write before the match, into a fresh tensor or
    into a value the match does not touch, refuses nothing. ``writers`` is
    :func:`~fxrewrite.canon.writers_of` (the driver passes a cached one)."""
    point = insertion_point(match)
    if point is None:
        return "no point of the graph comes after every input of the match and before every use of its results"
    start = min((node_position(n) for n in match.nodes), default=node_position(point))
    for value in match.bindings.values():
        if isinstance(value, Node):
            found = writers(value)
            late = None if found is None else next((w for w in found if node_position(w) >= start), None)
            if found is None or late is not None:
                return _written_refusal("the input", value, late)
    for output in match.outputs:
        found = writers(output)
        if found is None or found:
            return _written_refusal("the result", output, found[0] if found else None)
    return None


def _written_refusal(what: str, value: Node, writer: Node | None) -> str:
    if writer is None:
        return (f"{what} '{value.name}' shares storage with too many values to prove that nothing writes into it in "
                f"place")
    return (f"{what} '{value.name}' (or a view of it) is written in place by '{writer.name}' ({mutation(writer)}) "
            f"while the match reads or returns it; rewriting could move the computation across the write")


def insertion_point(match: Match) -> Node | None:
    """Where the replacement goes: before the anchor for single-output matches; for
    multi-output matches, the first point after every input and before every outside use of
    an output. ``None`` when no such point exists."""
    if len(match.outputs) == 1:
        return match.anchor
    inputs = [v for v in match.bindings.values() if isinstance(v, Node)]
    after = max((node_position(v) for v in inputs), default=None)
    inner = set(match.nodes)
    outside_users = [u for o in match.outputs for u in o.users if u not in inner]
    first_use = min((node_position(u) for u in outside_users), default=None)
    for n in match.nodes:
        if after is None or node_position(n) > after:
            if first_use is None or node_position(n) <= first_use:
                return n
            break
    if outside_users and (after is None or first_use > after):
        return min(outside_users, key=node_position)
    return None


def _refuse_non_tensor_outputs(match: Match, rule: Rule, outputs: list[Node]) -> None:
    """Where the pattern matched a tensor, the replacement must return one, not ``x.shape``."""
    for i, (old, new) in enumerate(zip(match.outputs, outputs)):
        if result_kind(new) == "value" and result_kind(old) != "value":
            raise RewriteError(
                f"{_where(rule, match)}: output {i} of the replacement ({new.format_node()}) is not a tensor, but "
                f"the pattern matched a tensor there; return a tensor computed from the replacement's arguments."
            )


def _refuse_input_mutation(match: Match, rule: Rule, created: list[Node]) -> bool:
    """A replacement writes in place only into tensors it made: not into an input, a view of one
    (``x.view(-1).add_(1)``: the rest of the program still reads ``x``, and the caller's tensor
    would change), a constant or anything else the graph held before it. Returns whether a
    created node writes in place (``canon.writes_in_place(created)``)."""
    inputs: set[Node] | None = None
    fresh: set[Node] | None = None
    writes = False
    for node in created:
        if mutation(node) is None:
            continue
        writes = True
        written = written_arguments(node)
        if not written:
            continue
        if inputs is None:
            inputs = {v for v in match.bindings.values() if isinstance(v, Node)}
        direct = [v for v in written if v in inputs]
        if direct:
            raise RewriteError(
                f"{_where(rule, match)}: the replacement writes in place into its input '{direct[0].name}' "
                f"({node.format_node()}), which the rest of the program still reads; use the out-of-place op."
            )
        if fresh is None:
            fresh = set(created)
        for value in written:
            held = _held_value(value, fresh)
            if held is not None:
                raise RewriteError(
                    f"{_where(rule, match)}: the replacement writes in place into '{value.name}' "
                    f"({node.format_node()}), which {held}; write only into tensors the replacement made "
                    f"(or use the out-of-place op).")
    return writes


def _held_value(value: Node, fresh: set[Node]) -> str | None:
    """Why a write into ``value`` reaches beyond the tensors a replacement made (``fresh``: the
    nodes it created), or ``None``: a value that may share its storage
    (:func:`~fxrewrite.canon.alias_class`) was in the graph before, or is a constant."""
    members = alias_class(value)
    if members is None:
        return "shares storage with too many values to prove that it is the replacement's own"
    for member in members:
        if member.op == "get_attr" or member not in fresh:
            what = "a tensor the module holds (written at every run)" if member.op == "get_attr" else \
                "a value the replacement did not make"
            return f"is {what}" if member is value else f"may share storage with '{member.name}', {what}"
    return None


def _fix_for(exc: Exception, annotated: bool) -> str:
    if isinstance(exc, fx.proxy.TraceError) and not annotated:
        return ("the replacement branches on a shape, dtype or value the graph does not carry. Pass "
                "example_inputs=(...) to rewrite (on the command line: --shapes) so replacements see the matched "
                "values' shapes and dtypes, or rewrite a torch.export graph (it carries them).")
    return "fix the replacement (it is called with Proxies for tensors)."


#: Integer constants beyond what a torch op takes (int64) cannot be a node's argument.
_INT_LIMIT = 1 << 63


def _check_created(match: Match, rule: Rule, created: list[Node]) -> None:
    """The new nodes read only live nodes of this graph that come before them, and no constant
    no op can take: a replacement that kept a Proxy from another rewrite, or computed a
    gigantic Python int, is refused before it can break the graph or its code."""
    graph = match.anchor.graph
    for node in created:
        for arg in node.all_input_nodes:
            if is_erased(arg) or arg.graph is not graph or node_position(arg) >= node_position(node):
                raise RewriteError(
                    f"{_where(rule, match)}: the replacement's node '{node.name}' reads '{arg.name}', which is not a "
                    f"live value of this graph before it (a Proxy kept from another rewrite, or a node moved?). The "
                    f"graph was left as it was; compute everything from the replacement's own arguments.")
        for value in _constants((node.args, node.kwargs)):
            if isinstance(value, int) and not isinstance(value, bool) and not -_INT_LIMIT <= value < _INT_LIMIT:
                raise RewriteError(
                    f"{_where(rule, match)}: the replacement passes the integer constant {_short(value)} to "
                    f"'{node.name}', beyond int64; no torch op takes it. The graph was left as it was.")


def _refuse_unbound_op_calls(match: Match, rule: Rule, created: list[Node]) -> None:
    """Every op call the replacement recorded binds to the op's schema (an overload's, for
    ``torch.ops.ns.op``): a call with an argument missing or too many would be written into the
    graph and raise only when the program runs."""
    for node in created:
        if node.op != "call_function":
            continue
        schemas = _op_schemas(node.target)
        if not schemas:
            continue
        problems = [_binding_problem(schema, node) for schema in schemas]
        if all(problems):
            shown = "; ".join(f"{schema} ({problem})" for schema, problem in zip(schemas, problems))
            raise RewriteError(
                f"{_where(rule, match)}: the replacement calls {_op_name(node.target)} with arguments that fit none "
                f"of its schemas: {shown}. The call was {_call_text(node)}. The graph was left as it was; fix the "
                f"replacement's call.")


def _call_text(node: Node) -> str:
    arguments = [*map(repr, node.args), *(f"{k}={v!r}" for k, v in node.kwargs.items())]
    return f"{_op_name(node.target)}({', '.join(arguments)})"


def _op_schemas(target: Any) -> list[Any]:
    if isinstance(target, torch._ops.OpOverload):
        return [target._schema]
    if isinstance(target, torch._ops.OpOverloadPacket):
        return [getattr(target, name)._schema for name in target.overloads()]
    return []


def _op_name(target: Any) -> str:
    packet = target.overloadpacket if isinstance(target, torch._ops.OpOverload) else target
    return f"torch.ops.{packet._qualified_op_name.replace('::', '.')}"


def _binding_problem(schema: Any, node: Node) -> str | None:
    """Why ``node``'s arguments do not bind to ``schema`` (``None``: they do)."""
    from torch.fx.operator_schemas import _torchscript_schema_to_signature

    try:
        _torchscript_schema_to_signature(schema).bind(*node.args, **node.kwargs)
    except TypeError as exc:
        return str(exc)
    except Exception:  # a schema Python cannot express as a signature: nothing to check against
        return None
    return None


def _constants(value: Any) -> Any:
    """The non-node leaves of a node's arguments (tuples, lists and dicts walked)."""
    if isinstance(value, (tuple, list)):
        for v in value:
            yield from _constants(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _constants(v)
    elif not isinstance(value, Node):
        yield value


def _short(value: int) -> str:
    return f"with {value.bit_length()} bits" if value.bit_length() > 128 else str(value)


def _where(rule: Rule, match: Match) -> str:
    return f"rule '{rule.name}' ({rule.origin}) at graph node '{match.anchor.name}' ({match.anchor.format_node()})"


def _arguments(match: Match, tracer: _ReplacementTracer) -> dict[str, Any]:
    return {
        name: tracer.proxy(value) if isinstance(value, Node) else value
        for name, value in match.bindings.items()
    }


def _output_nodes(result: Any, match: Match, rule: Rule, tracer: _ReplacementTracer) -> list[Node]:
    n_out = len(match.outputs)
    if n_out > 1 and isinstance(result, fx.Proxy):  # one call returning several tensors (split, topk, ...)
        result = _unpacked(result, n_out, match, rule)
    values = list(result) if n_out > 1 and isinstance(result, (tuple, list)) else [result]
    if len(values) != n_out:
        kind = "Proxy" if isinstance(result, fx.Proxy) else type(result).__name__
        got = f"{len(values)} value(s)" if isinstance(result, (tuple, list)) else f"a single {kind}"
        raise RewriteError(
            f"{_where(rule, match)}: the pattern has {n_out} outputs but the replacement returned {got}; "
            f"return a tuple with one value per pattern output, in the same order."
        )
    nodes = []
    for i, value in enumerate(values):
        if isinstance(value, fx.Proxy):
            nodes.append(value.node)
        elif isinstance(value, torch.Tensor):
            nodes.append(tracer.create_arg(value))
        else:
            raise RewriteError(
                f"{_where(rule, match)}: output {i} of the replacement is {value!r} ({type(value).__name__}), "
                f"but the pattern matched a tensor there; return a value computed from the replacement's "
                f"arguments (or a torch.Tensor constant)."
            )
    return nodes


def _unpacked(result: fx.Proxy, n_out: int, match: Match, rule: Rule) -> Any:
    val = value_of(result.node)
    if isinstance(val, (tuple, list)) and len(val) != n_out:
        raise RewriteError(
            f"{_where(rule, match)}: the pattern has {n_out} outputs but the replacement returned one call with "
            f"{len(val)} results; return exactly one value per pattern output.")
    if result_kind(result.node) == "tensor":
        return result  # one tensor: reported as a count mismatch below
    return [result[i] for i in range(n_out)]  # type: ignore[index]


def _rewire(match: Match, new_outputs: list[Node]) -> None:
    for old, new in zip(match.outputs, new_outputs):
        if old is not new:
            copy_value(old, new)  # the new output computes the same value: same shape and dtype
            old.replace_all_uses_with(new)


def _erase(graph: fx.Graph, match: Match) -> None:
    for node in reversed(match.nodes):
        if not is_erased(node):
            graph.erase_node(node)


# -- the modules a match captured stay as they were ----------------------------------------------


def _guard_for(match: Match, tracer: _ReplacementTracer) -> CapturedModules | None:
    """The guard for the modules ``match`` binds, named by their path; ``None`` when it binds none."""
    modules = {tracer._module_paths.get(id(v), name): v for name, v in match.bindings.items()
               if isinstance(v, torch.nn.Module)}
    return captured_modules(modules) if modules else None


def _module_write_message(rule: Rule, match: Match, exc: ModuleWrite) -> str:
    return (f"{_where(rule, match)}: the replacement changes '{exc.label}' ({exc.how}), which belongs to a module "
            f"the match captured. That module is the program's own, called wherever the program calls it, and unless "
            f"rewrite() works on a copy it is the caller's model too. The change was undone and the graph left as "
            f"it was; compute new tensors from the module's and call a new module (e.g. copy.deepcopy(conv) with "
            f"new weights) instead of writing into it.")


def _refuse_shared_modules(match: Match, rule: Rule, tracer: _ReplacementTracer, sites: _ModuleCallSites) -> None:
    """A module capture is not handed to a replacement when the program calls that module at
    more than one place (a fold at one of them would change the others), unless the capture
    accepts it (``Accept(shared=True)``)."""
    for param in rule.compiled.module_captures:
        if param.accept.shared:
            continue
        path = tracer._module_paths.get(id(match.bindings[param.name]))
        if path is None:
            continue
        calls = sites.count(path, tracer.created)  # the replacement's own calls of it are not other places
        if calls > 1:
            raise Refuse(f"module capture '{param.name}' is '{path}', which the program calls at {calls} places; "
                         f"replacing one call must not change the others (declare "
                         f"'{param.name}: Annotated[{param.annotation.__name__}, fxrewrite.Accept(shared=True)]' "
                         f"if the rule never changes the module)")


class _ModuleCallSites:
    """How many ``call_module`` nodes call each module path: counted in one pass when first
    asked, then kept current by :meth:`spliced` (torch.fx finds such nodes by scanning every
    ``call_module`` node, which made each fold of a module capture cost the graph's size). The
    count is trusted only while the graph holds as many ``call_module`` nodes as it accounts
    for (else it is counted again); the slow twin is ``graph.find_nodes(op="call_module",
    target=path)``, used where torch.fx's lookup table is not there."""

    def __init__(self, graph: fx.Graph) -> None:
        self.graph = graph
        self._counts: collections.Counter[str] | None = None
        self._total = 0

    def _table(self) -> Any:
        table = getattr(getattr(self.graph, "_find_nodes_lookup_table", None), "table", None)
        return None if table is None else table.get(("call_module", None), {})

    def count(self, path: str, created: list[Node]) -> int:
        """The nodes calling ``path``, those in ``created`` (not yet accounted for) left out."""
        table = self._table()
        fresh = [n for n in created if n.op == "call_module"]
        if table is None:
            skip = set(fresh)
            return sum(n not in skip for n in self.graph.find_nodes(op="call_module", target=path, sort=False))
        if self._counts is None or len(table) != self._total + len(fresh):
            skip = set(fresh)
            self._counts = collections.Counter(str(n.target) for n in table if n not in skip)
            self._total = len(table) - len(fresh)
        return self._counts[path]

    def spliced(self, created: list[Node], erased: Sequence[Node]) -> None:
        """Account for a splice: ``created`` are in the graph, ``erased`` are gone."""
        if self._counts is None:
            return
        for node in created:
            if node.op == "call_module" and not is_erased(node):
                self._counts[str(node.target)] += 1
                self._total += 1
        for node in erased:
            if node.op == "call_module":
                self._counts[str(node.target)] -= 1
                self._total -= 1
