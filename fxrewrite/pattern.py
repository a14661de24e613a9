"""Trace a rule's pattern function into a :class:`Pattern`: an fx graph plus what the matcher
needs to know about it (variables, typed captures, outputs, the anchor and its index key).

>>> import torch
>>> def pattern(x):
...     return torch.neg(torch.neg(x))
>>> p = trace_pattern(pattern, rule_name="double_neg", origin="<doc>")
>>> [param.name for param in p.params], p.anchor.target is torch.neg
(['x'], True)

Parameters are *variables* unless annotated. ``int``, ``float``, ``bool``, ``str`` and
``torch.dtype`` annotations make a *literal capture* (it binds a Python constant in the graph);
an ``nn.Module`` subclass makes a *module capture* (it binds a ``call_module`` node whose
module is an instance of that class).
"""

from __future__ import annotations

import contextlib
import inspect
import math
import sys
import threading
import types
import typing
from collections.abc import Callable, Hashable, Iterator, Mapping
from typing import Any, Literal

import attrs
import torch
import torch.fx as fx
from torch.fx.node import Node

from ._torch import (
    add_node,
    autowrap_function_ids,
    autowrap_patches,
    fresh_node_name,
    fx_tracing,
    is_fx_tracing,
    set_code_fields,
)
from .canon import is_commutative_call, mutation, node_key, pattern_identity, result_kind
from .errors import RuleDefinitionError

__all__ = ["LITERAL_TYPES", "Accept", "Param", "Pattern", "pattern_from_graph", "trace_pattern"]

ParamKind = Literal["tensor", "literal", "module"]

#: Held while torch.fx traces (its Tracer patches ``nn.Module.__call__`` for the whole process, so
#: two traces at once in two threads would record each other's module calls).
TRACING = threading.RLock()

#: Annotations that turn a pattern parameter into a literal capture.
LITERAL_TYPES: tuple[type, ...] = (int, float, bool, str, torch.dtype)

_INNER_OPS = frozenset({"call_function", "call_method", "call_module", "get_attr"})


@attrs.frozen
class Accept:
    """What a module capture accepts beyond plain instances of its class, given as
    ``typing.Annotated`` metadata::

        def pattern(conv: Annotated[nn.Conv2d, fxrewrite.Accept(hooks=True)], x): ...

    By default a module capture ``conv: nn.Conv2d`` refuses a module with hooks or a
    parametrization (folding it away would drop their effect) and a subclass that overrides a
    method of ``nn.Conv2d`` (``torch.ao.nn.qat.Conv2d`` fake-quantises its weight in ``forward``).
    ``hooks=True`` / ``subclasses=True`` say the rule is right for those too. A module the
    program calls at several places is not handed to a replacement either (a fold at one place
    would change the others); ``shared=True`` says the rule never changes the module.
    """

    hooks: bool = False
    subclasses: bool = False
    shared: bool = False


@attrs.frozen
class Param:
    """One pattern parameter: a variable (``tensor``), a literal capture or a module capture."""

    name: str
    kind: ParamKind
    annotation: Any = None
    accept: Accept = Accept()
    #: A literal capture annotated ``float | None`` (``Optional[float]``): it also binds ``None``,
    #: an optional argument the program leaves out (``scale=None``).
    optional: bool = False

    def accepts_literal(self, value: Any) -> bool:
        """True when ``value`` (a constant in the graph) may be bound by this literal capture."""
        if isinstance(value, Node) or self.kind != "literal":
            return False
        if value is None:
            return self.optional
        if self.annotation is float:
            return type(value) in (float, int)
        return type(value) is self.annotation


@attrs.frozen(eq=False)
class Pattern:
    """A traced pattern, ready to be matched.

    ``graph`` is the fx graph of the pattern function; ``outputs`` are the pattern nodes it
    returns (several for a multi-output pattern); ``anchor`` is the output the matcher starts
    from, and ``anchor_key`` the op key under which the pattern is indexed.
    """

    graph: fx.Graph
    params: tuple[Param, ...]
    placeholders: Mapping[str, Node]
    outputs: tuple[Node, ...]
    anchor: Node
    anchor_key: Hashable
    param_of: Mapping[Node, Param]
    commutative: frozenset[Node]
    depth: int
    #: Pattern nodes that compute something (everything but placeholders and the output).
    inner_nodes: tuple[Node, ...]
    #: Op keys of the operations feeding the anchor: a graph node lacking one cannot match.
    anchor_input_keys: frozenset[Hashable] = frozenset()
    #: Pattern nodes computing Python values from the bound tensors' metadata (``q.size(-1)``,
    #: ``math.sqrt(q.size(-1))``, ``v.dtype``): a graph may hold them folded to a constant.
    value_nodes: frozenset[Node] = frozenset()
    #: At most one way to match at a given anchor: one output, no size expression (matched as
    #: written or as a folded constant), no module call, and no commutative operation whose two
    #: operand orders could both be tried (one operand of ``x * s`` only ever matches a graph node,
    #: the other only a constant: the graph's operands decide the order, see :func:`operand_kind`).
    #: The matcher walks such patterns without backtracking.
    choice_free: bool = False
    #: Pattern nodes that may compute their input unchanged (``x.to(v.dtype)``, an unwritten
    #: ``clone()``, ``dropout(x, p, training=False)``), with that input and the dtype the value must
    #: have for it (``None``: always): where the graph has no such node, the matcher looks for
    #: the input instead. Only nodes whose other arguments bind nothing that occurs nowhere else.
    identities: Mapping[Node, tuple[Node, Any]] = attrs.field(factory=dict)

    def operand_kind(self, value: Any) -> OperandKind:
        """What the pattern value ``value`` can match: see :func:`operand_kind`."""
        return operand_kind(value, self.param_of, self.value_nodes)

    @property
    def is_multi_output(self) -> bool:
        return len(self.outputs) > 1

    @property
    def module_captures(self) -> tuple[Param, ...]:
        return tuple(p for p in self.params if p.kind == "module")


class _CaptureMisuse(RuleDefinitionError):
    """A module capture used other than by calling it; gets the rule's name and origin added."""


class _ModuleCaptureStub:
    """Stands for a module-capture parameter while a pattern is traced: calling it records a
    ``call_module`` node whose target is the parameter's name."""

    def __init__(self, tracer: fx.Tracer, param: Param) -> None:
        self._tracer = tracer
        self._param = param

    def __call__(self, *args: Any, **kwargs: Any) -> fx.Proxy:
        return self._tracer.create_proxy("call_module", self._param.name, args, kwargs)

    def __getattr__(self, attr: str) -> Any:
        name = self._param.name
        raise _CaptureMisuse(
            f"pattern reads '{name}.{attr}', but a module capture can only be called in a pattern "
            f"('{name}(x)'); read its attributes in the replacement or in a where= guard instead."
        )


class ThreadConfinedTracer(fx.Tracer):
    """A torch.fx Tracer whose process-wide patches (``nn.Module.__call__``, ``__getattr__``)
    act only in the thread that traces: a module called by another thread meanwhile runs as
    usual. Trace under :data:`TRACING`."""

    def trace(self, root: Any, concrete_args: Any = None) -> fx.Graph:
        self._tracing_thread = threading.get_ident()
        return super().trace(root, concrete_args)

    def _other_thread(self) -> bool:
        return threading.get_ident() != getattr(self, "_tracing_thread", None)

    def call_module(self, m: torch.nn.Module, forward: Callable[..., Any], args: tuple[Any, ...],
                    kwargs: dict[str, Any]) -> Any:
        if self._other_thread():
            return forward(*args, **kwargs)
        return super().call_module(m, forward, args, kwargs)

    def getattr(self, attr: str, attr_val: Any, parameter_proxy_cache: dict[str, Any]) -> Any:
        if self._other_thread():
            return attr_val
        return super().getattr(attr, attr_val, parameter_proxy_cache)


class _ModuleCalled(Exception):
    """An ``nn.Module`` was called while a pattern was traced quickly: trace it the plain way."""


class _PatternTracer(ThreadConfinedTracer):
    """A tracer that hands module-capture parameters to the pattern as call-recording stubs.

    A plain function is traced by :meth:`trace_quickly`; ``plain=True`` (or anything else:
    a module, concrete arguments, a trace inside another fx trace) takes its slow twin,
    ``torch.fx.Tracer.trace``. ``tests/test_pattern.py`` checks that both give the same graph
    for every rule of the library and of the examples.
    """

    def __init__(self, params: tuple[Param, ...], *, plain: bool = False) -> None:
        # fx.Tracer()'s default autowrap of `math`, without recomputing the ids at every Tracer()
        super().__init__(autowrap_modules=(), autowrap_functions=())  # type: ignore[arg-type]  # torch types it 1-tuple
        self._autowrap_function_ids = set(autowrap_function_ids())
        self._autowrap_search = [math]
        self._params = params
        self._plain = plain

    def create_args_for_root(self, root_fn, is_module, concrete_args=None):  # type: ignore[no-untyped-def]
        fn, args = super().create_args_for_root(root_fn, is_module, concrete_args)
        return fn, self._stubbed(args)

    def _stubbed(self, args: list[Any]) -> list[Any]:
        """The placeholders' proxies, a module capture's replaced by its call-recording stub."""
        by_name = {p.name: p for p in self._params}
        stubbed = []
        for arg in args:
            param = by_name.get(str(getattr(getattr(arg, "node", None), "target", "")))
            stubbed.append(_ModuleCaptureStub(self, param) if param and param.kind == "module" else arg)
        return stubbed

    def create_arg(self, a: Any) -> Any:
        """``fx.Tracer.create_arg``, its type tests skipped for the values a pattern passes most
        (a proxy, a number, a string, a dtype, a plain tuple or list of them): for exactly those
        types fx's own tests all fail and it ends in its base class's table of the same
        conversions (``torch.fx.proxy._create_arg_bypass``). The plain tracer (``plain=True``)
        takes fx's path for every value."""
        kind = type(a)
        if kind in _PLAIN_ARGS and not self._plain:
            return a.node if kind is fx.Proxy else a
        if kind in _PLAIN_SEQUENCES and not self._plain:
            return kind(self.create_arg(item) for item in a)
        return super().create_arg(a)

    def trace(self, root: Any, concrete_args: Any = None) -> fx.Graph:
        if self._plain or not isinstance(root, types.FunctionType) or concrete_args is not None or is_fx_tracing():
            return super().trace(root, concrete_args)
        try:
            return self.trace_quickly(root)
        except _ModuleCalled:
            return super().trace(root, concrete_args)

    def trace_quickly(self, fn: types.FunctionType) -> fx.Graph:
        """What ``torch.fx.Tracer.trace(fn)`` (the slow twin) does for a plain function, less
        two per-trace costs that cannot change its graph: it builds the autowrap wrappers
        (``math.sqrt`` ...) once per function instead of once per trace, and it does not patch
        ``nn.Module.__call__`` and ``__getattr__`` (an assignment to ``nn.Module`` invalidates the
        type caches of its every subclass: four of them cost about 0.7 ms a trace). The
        ``__getattr__`` patch only turns a parameter or buffer *of the root* into a ``get_attr``,
        and a function's root has none; the ``__call__`` patch matters when the pattern calls a
        module, so a module called meanwhile on this thread (seen by a global forward pre-hook,
        which other threads' module calls pass through unchanged) raises :class:`_ModuleCalled`,
        and :meth:`trace` retraces the plain way."""
        self._tracing_thread = threading.get_ident()
        called: list[torch.nn.Module] = []

        def refuse(module: torch.nn.Module, inputs: Any) -> None:
            if threading.get_ident() == self._tracing_thread:
                called.append(module)
                raise _ModuleCalled

        handle = torch.nn.modules.module.register_module_forward_pre_hook(refuse)
        try:
            with fx_tracing():
                self._record(fn)
        except Exception:
            if called:  # the pattern caught _ModuleCalled and failed otherwise
                raise _ModuleCalled from None
            raise
        finally:
            handle.remove()
        if called:
            raise _ModuleCalled
        return self.graph

    def _record(self, fn: types.FunctionType) -> None:
        """The body of ``torch.fx.Tracer.trace`` for a function root, in its order, without the
        ``nn.Module`` patches (see :meth:`trace_quickly`)."""
        self.root = torch.nn.Module()
        self.graph = fx.Graph(tracer_cls=type(self))
        set_code_fields(self.graph, fn)
        self.tensor_attrs = {}
        fn_globals = fn.__globals__
        traced, args = fn, self._placeholders(fn)
        with autowrap_patches(fn_globals, self._autowrap_function_ids, self._autowrap_search):
            returns = inspect.get_annotations(inspect.unwrap(traced)).get("return", None)
            self.create_node("output", "output", (self.create_arg(traced(*args)),), {}, type_expr=returns)


    def _placeholders(self, fn: types.FunctionType) -> list[Any]:
        """What ``create_args_for_root(fn, False)`` returns for a function whose parameters are
        all positional (a pattern's: :func:`signature_params` allows no other), without its
        ``inspect.signature``: one placeholder per parameter, in order, with its default and its
        annotation as written; module captures stubbed. Any other function takes fx's way."""
        code = fn.__code__
        if fn is not inspect.unwrap(fn) or code.co_kwonlyargcount or code.co_flags & _VARIADIC:
            return self.create_args_for_root(fn, False)[1]
        names = code.co_varnames[:code.co_argcount]
        defaults = fn.__defaults__ or ()
        first_default = len(names) - len(defaults)
        annotations = fn.__annotations__
        args = [self.create_proxy("placeholder", name, (defaults[i - first_default],) if i >= first_default else (),
                                  {}, type_expr=annotations.get(name, None))
                for i, name in enumerate(names)]
        return self._stubbed(args)


_PLAIN_ARGS = frozenset({fx.Proxy, int, float, bool, str, type(None), torch.dtype})
_PLAIN_SEQUENCES = frozenset({tuple, list})
_VARIADIC = inspect.CO_VARARGS | inspect.CO_VARKEYWORDS


def trace_pattern(fn: Callable[..., Any], *, rule_name: str, origin: str) -> Pattern:
    """Trace ``fn`` with torch.fx and analyse it as a pattern.

    Raises :class:`RuleDefinitionError` naming ``rule_name`` and ``origin`` when ``fn`` cannot be
    traced or is not a valid pattern.
    """
    where = f"rule '{rule_name}' ({origin})"
    params = signature_params(fn, where=where, role="pattern")
    book: _Book | None = getattr(_BOOK, "value", None)
    graph = book.replayed(rule_name, fn) if book is not None else None
    if graph is None:
        graph = _traced(fn, params, where)
        if book is not None:
            book.record(rule_name, fn, graph)
    return pattern_from_graph(graph, params, where=where)


def _traced(fn: Callable[..., Any], params: tuple[Param, ...], where: str) -> fx.Graph:
    from .isolation import torch_state_preserved  # tracing runs fn: it must leave torch's global state as it was

    try:
        with TRACING, torch_state_preserved():
            return _PatternTracer(params).trace(fn)
    except _CaptureMisuse as exc:
        raise RuleDefinitionError(f"{where}: {exc}") from None
    except RuleDefinitionError:
        raise  # already says where (e.g. raised by a DSL pattern with its file:line)
    except Exception as exc:  # torch.fx raises TraceError, TypeError, NameError, RuntimeError ...
        raise RuleDefinitionError(_untraceable_message(where, exc)) from exc


def pattern_from_graph(graph: fx.Graph, params: tuple[Param, ...] | None = None, *, where: str,
                       fx_style: bool = False) -> Pattern:
    """Analyse an already traced pattern graph (every placeholder a variable unless ``params``
    says otherwise). ``fx_style`` accepts what torch.fx patterns may contain and fxrewrite
    rules may not: ``get_attr`` nodes (matching any tensor attribute) and in-place ops."""
    placeholders = {n.target: n for n in graph.nodes if n.op == "placeholder"}
    if params is None:
        params = tuple(Param(name, "tensor") for name in placeholders)
    param_of = {placeholders[p.name]: p for p in params}
    for node, param in param_of.items():  # the resolved annotation (a string under `from __future__ import ...`)
        if param.kind == "literal":
            node.type = param.annotation
    outputs = _pattern_outputs(graph, where)
    _check_nodes(graph, param_of, outputs, where, fx_style)
    anchor = outputs[-1] if len(outputs) == 1 else max(outputs, key=_position_in(graph))
    value_nodes = _value_nodes(graph)
    inner_nodes = tuple(n for n in graph.nodes if n.op in _INNER_OPS)
    identities = _pattern_identities(inner_nodes, outputs)
    commutative = frozenset(n for n in inner_nodes if is_commutative_call(n.op, n.target, n.args, n.kwargs))
    return Pattern(
        graph=graph,
        params=params,
        placeholders=placeholders,
        outputs=outputs,
        anchor=anchor,
        anchor_key=node_key(anchor),
        param_of=param_of,
        commutative=commutative,
        depth=_depth(graph),
        inner_nodes=inner_nodes,
        anchor_input_keys=frozenset(node_key(a) for a in anchor.all_input_nodes
                                    # values may be folded, and identities absent
                                    if a.op in _INNER_OPS and a not in value_nodes and a not in identities),
        value_nodes=value_nodes,
        choice_free=(len(outputs) == 1 and not value_nodes and not identities
                     and all(n.op != "call_module" for n in inner_nodes)
                     and all(_order_decided(n, param_of, value_nodes) for n in commutative)),
        identities=identities,
    )


def _pattern_identities(inner_nodes: tuple[Node, ...], outputs: tuple[Node, ...]) -> dict[Node, tuple[Node, Any]]:
    """See :attr:`Pattern.identities`. Kept in place: the pattern's own outputs; an identity of a
    variable (``x.contiguous().contiguous()``, ``linear(x.contiguous(), w)``: such a rule is *about*
    the identity, and looking past it would match the rule's own result); and a node whose other
    arguments read a placeholder that nothing else reads (``F.dropout(w, p=p, training=False)``
    with ``p`` only there), so that every parameter binds."""
    found: dict[Node, tuple[Node, Any]] = {}
    for n in inner_nodes:
        identity = pattern_identity(n)
        if identity is None or n in outputs or identity[0].op == "placeholder":
            continue
        others = [a for a in n.all_input_nodes if a is not identity[0]]
        if all(_read_elsewhere(a, n) for a in others):
            found[n] = identity
    return found


def _read_elsewhere(value: Node, node: Node) -> bool:
    """Does a placeholder feeding ``value`` (or ``value`` itself) reach the pattern's result other
    than through ``node``?"""
    roots = [value] if value.op == "placeholder" else [a for a in value.all_input_nodes if a.op == "placeholder"]
    if value.op != "placeholder" and any(a.op != "placeholder" for a in value.all_input_nodes):
        return False  # v.dtype of an intermediate value: keep it simple
    return all(any(user is not node and user is not value for user in root.users) for root in roots)


OperandKind = Literal["node", "constant"] | None

_CONSTANT_TYPES = (bool, int, float, complex, str)


def operand_kind(value: Any, param_of: Mapping[Node, Param], value_nodes: frozenset[Node]) -> OperandKind:
    """What a pattern value can match under the default :class:`~fxrewrite.match.MatchOptions`:
    only a graph node (``"node"``: an operation, a tensor variable), only a constant
    (``"constant"``: a number or string written in the pattern, a literal capture other than a
    dtype), or either (``None``: a dtype capture, a size expression, a list ...).

    >>> gm = fx.symbolic_trace(lambda x: torch.relu(x) * 2.0)
    >>> relu, mul = [n for n in gm.graph.nodes if n.op == "call_function"]
    >>> [operand_kind(v, {}, frozenset()) for v in mul.args]
    ['node', 'constant']
    """
    if isinstance(value, Node):
        param = param_of.get(value)
        if param is None:
            return "node" if value.op in _INNER_OPS and value not in value_nodes else None
        if param.kind == "tensor":
            return "node"
        return "constant" if param.kind == "literal" and param.annotation is not torch.dtype else None
    return "constant" if isinstance(value, _CONSTANT_TYPES) else None


def _order_decided(n: Node, param_of: Mapping[Node, Param], value_nodes: frozenset[Node]) -> bool:
    """Does the graph decide which operand order of the commutative pattern node ``n`` can
    match? It does when one operand matches only nodes and the other only constants."""
    if len(n.args) != 2 or n.kwargs:
        return False
    kinds = {operand_kind(a, param_of, value_nodes) for a in n.args}
    return kinds == {"node", "constant"}


def signature_params(fn: Callable[..., Any], *, where: str, role: str) -> tuple[Param, ...]:
    """The parameters of a pattern (or replacement) function, classified by annotation."""
    try:
        sig = inspect.signature(fn, eval_str=True)
    except (NameError, TypeError, ValueError, SyntaxError) as exc:
        raise RuleDefinitionError(f"{where}: cannot read the signature of the {role}: {exc}") from None
    params = []
    for p in sig.parameters.values():
        if p.kind not in (p.POSITIONAL_OR_KEYWORD, p.POSITIONAL_ONLY):
            raise RuleDefinitionError(
                f"{where}: {role} parameter '{p.name}' is {p.kind.description}; "
                f"patterns and replacements take plain named parameters, one per variable or capture."
            )
        params.append(_classify(p, where=where, role=role))
    return tuple(params)


def _classify(p: inspect.Parameter, *, where: str, role: str) -> Param:
    ann = p.annotation
    if typing.get_origin(ann) is typing.Annotated:
        accepts = [m for m in ann.__metadata__ if isinstance(m, Accept)]
        base = ann.__origin__
        if accepts and isinstance(base, type) and issubclass(base, torch.nn.Module):
            return Param(p.name, "module", base, accepts[0])
        ann = base
    if ann is inspect.Parameter.empty or ann is torch.Tensor or ann is Any:
        return Param(p.name, "tensor")
    if ann in LITERAL_TYPES:
        return Param(p.name, "literal", ann)
    optional = _optional_literal(ann)
    if optional is not None:
        return Param(p.name, "literal", optional, optional=True)
    if isinstance(ann, type) and issubclass(ann, torch.nn.Module):
        return Param(p.name, "module", ann)
    raise RuleDefinitionError(
        f"{where}: {role} parameter '{p.name}' is annotated {ann!r}; use no annotation (or torch.Tensor) "
        f"for a variable, one of int, float, bool, str, torch.dtype for a literal capture (or one of them "
        f"'| None', for a capture that may also bind None), or an nn.Module subclass for a module capture."
    )


def _optional_literal(ann: Any) -> Any:
    """``float`` for ``float | None`` / ``Optional[float]`` (any literal type), else ``None``."""
    if typing.get_origin(ann) not in (typing.Union, types.UnionType):
        return None
    members = [a for a in typing.get_args(ann) if a is not type(None)]
    if len(members) != 1 or len(typing.get_args(ann)) != 2 or members[0] not in LITERAL_TYPES:
        return None
    return members[0]


def _untraceable_message(where: str, exc: Exception) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if "control flow" in text or "iteration" in text or "len(" in text or isinstance(exc, fx.proxy.TraceError):
        fix = (
            "A pattern is traced with torch.fx, so it cannot branch or loop on a traced value. "
            "Move the condition into a where= guard, capture a constant with a typed parameter "
            "(e.g. 'n: int'), or mark a helper function with torch.fx.wrap so it is matched as one call."
        )
    else:
        fix = (
            "Write the pattern with torch operations on its parameters only; call modules through a "
            "module-capture parameter annotated with their class (e.g. 'conv: nn.Conv2d')."
        )
    return f"{where}: the pattern cannot be traced ({type(exc).__name__}: {text}). {fix}"


def _pattern_outputs(graph: fx.Graph, where: str) -> tuple[Node, ...]:
    output = next(n for n in reversed(graph.nodes) if n.op == "output")
    result = output.args[0]
    values = tuple(result) if isinstance(result, (tuple, list)) else (result,)
    for v in values:
        if not isinstance(v, Node):
            raise RuleDefinitionError(
                f"{where}: the pattern returns the constant {v!r}; a pattern must return the values it "
                f"computes from its parameters."
            )
        if v.op == "placeholder":
            raise RuleDefinitionError(
                f"{where}: the pattern returns its parameter '{v.target}' unchanged, so it would match "
                f"every value in the graph; a pattern's result must be computed by an operation."
            )
    return values


def _check_nodes(graph: fx.Graph, param_of: Mapping[Node, Param], outputs: tuple[Node, ...], where: str,
                 fx_style: bool) -> None:
    output_set = set(outputs)
    for n in graph.nodes:
        if n.op == "get_attr" and not fx_style:
            raise RuleDefinitionError(
                f"{where}: the pattern reads the attribute or tensor constant '{n.target}'; patterns "
                f"cannot contain tensor constants. Pass the value as a parameter instead."
            )
        if n.op in (*_INNER_OPS, "get_attr") and not n.users and n not in output_set:
            raise RuleDefinitionError(
                f"{where}: the pattern computes '{n.format_node()}' but never uses the result; "
                f"remove it or return it."
            )
        param = param_of.get(n)
        if param is not None and param.kind != "module" and not n.users:
            raise RuleDefinitionError(
                f"{where}: pattern parameter '{param.name}' is never used; remove it from the pattern."
            )
        if not fx_style:
            _check_pure(n, where)
    used_modules = {n.target for n in graph.nodes if n.op == "call_module"}
    for param in param_of.values():
        if param.kind == "module" and param.name not in used_modules:
            raise RuleDefinitionError(
                f"{where}: module capture '{param.name}' is never called in the pattern; call it "
                f"('{param.name}(x)') or remove it."
            )


def _check_pure(n: Node, where: str) -> None:
    """Patterns describe values: no in-place ops, no out= arguments, no side effects."""
    problem = mutation(n)
    if problem is None and n.op in _INNER_OPS and n.op != "call_module" and n.is_impure():
        problem = "has a side effect"
    if problem:
        raise RuleDefinitionError(
            f"{where}: the pattern {problem} ({n.format_node()}); patterns must be pure computations. "
            f"Match the out-of-place op instead."
        )


def _value_nodes(graph: fx.Graph) -> frozenset[Node]:
    """Nodes computing a Python value only from placeholders and other such nodes."""
    found: set[Node] = set()
    for n in graph.nodes:
        if (n.op in ("call_function", "call_method") and result_kind(n) == "value"
                and all(a.op == "placeholder" or a in found for a in n.all_input_nodes)):
            found.add(n)
    return frozenset(found)


def _position_in(graph: fx.Graph) -> Callable[[Node], int]:
    position = {n: i for i, n in enumerate(graph.nodes)}
    return position.__getitem__


def _depth(graph: fx.Graph) -> int:
    """Longest chain of computing nodes in the pattern: how far downstream a change can create
    a new match."""
    depth: dict[Node, int] = {}
    for n in graph.nodes:
        if n.op in _INNER_OPS:
            depth[n] = 1 + max((depth.get(a, 0) for a in n.all_input_nodes), default=0)
    return max(depth.values(), default=0)


# ---- recorded traces: a traced graph as plain data, and back (the DSL's trace cache) -------------
# The slow twin of a replayed graph is the trace itself: tests/test_cache.py checks, for every rule
# file of the library, that the graphs replayed from the cache equal fresh traces.


class _Unrecordable(Exception):
    """A value of a traced graph that plain data cannot name (see :func:`graph_record`)."""


def graph_record(graph: fx.Graph) -> tuple[Any, ...] | None:
    """A freshly traced pattern ``graph`` as plain data (tuples, lists, strings, numbers: what a
    pickle holds without naming any class), one ``(op, name, target, args, kwargs, type, meta)`` a
    node; ``None`` when the graph holds what plain data cannot name: metadata other than numbers
    and strings (fx marks an autowrapped call ``is_wrapped``), a ``get_attr`` (a
    tensor constant), or a function, class or constant not found again under its module and name
    (a method, a lambda).

    >>> g = fx.symbolic_trace(lambda x: torch.relu(x) * 2.0).graph
    >>> graph_record(g)[1]
    ('call_function', 'relu', ('ref', 'torch', 'relu'), ('t', [('n', 0)]), ('d', []), None, [])
    """
    index: dict[Node, int] = {}
    nodes = []
    try:
        for n in graph.nodes:
            if n.op == "get_attr" or any(type(v) not in _SCALARS for v in n.meta.values()):
                return None  # a get_attr's value lives on the tracer's root; metadata beyond fx's is_wrapped flag
            target = n.target if isinstance(n.target, str) else _reference(n.target)
            type_ = n.type if n.type is None or isinstance(n.type, str) else _reference(n.type)  # str: unevaluated
            nodes.append((n.op, n.name, target, _data(n.args, index), _data(n.kwargs, index), type_,
                          sorted(n.meta.items())))
            index[n] = len(index)
    except _Unrecordable:
        return None
    return tuple(nodes)


#: :func:`graph_from_record` inserts each node directly (``_torch.add_node``, under the name
#: reserved as ``create_node`` reserves it) rather than through ``graph.create_node``, whose
#: per-argument pytree walk only warns about raw symbolic values, which plain data cannot hold:
#: a third of rebuilding the library's graphs. ``False`` is the slow twin (``create_node``);
#: ``tests/test_pattern.py`` checks both rebuild every library pattern alike.
DIRECT_REPLAY = True


def graph_from_record(record: tuple[Any, ...], fn: Callable[..., Any]) -> fx.Graph | None:
    """The graph :func:`graph_record` wrote, as the quick tracer builds it for ``fn`` (its code
    fields, tracer class, node names); ``None`` when a function, class or constant is no longer
    what the record names (a module function replaced since, a name now bound elsewhere)."""
    graph = fx.Graph(tracer_cls=_PatternTracer)
    set_code_fields(graph, fn)
    nodes: list[Node] = []
    try:
        for op, name, target, args, kwargs, type_, meta in record:
            target = target if isinstance(target, str) else _referenced(target)
            type_ = type_ if type_ is None or isinstance(type_, str) else _referenced(type_)
            args, kwargs = _value(args, nodes), _value(kwargs, nodes)
            if type(args) is not tuple or type(kwargs) is not dict:
                return None  # not what graph_record writes
            if DIRECT_REPLAY:
                if fresh_node_name(graph, name) != name:
                    return None
                node = add_node(graph, name, op, target, args, kwargs, type_, dict(meta))
            else:
                node = graph.create_node(op, target, args, kwargs, name, type_)
                if node.name != name:
                    return None
                node.meta.update(meta)
            nodes.append(node)
    except (_Unrecordable, TypeError, ValueError, IndexError):
        return None
    return graph


def _reference(value: Any) -> tuple[str, str, str]:
    """``('ref', module, name)`` of a module-level function or class, found again by them."""
    module, name = getattr(value, "__module__", None), getattr(value, "__name__", None)
    if not (isinstance(module, str) and isinstance(name, str)) or _lookup(module, name) is not value:
        raise _Unrecordable(value)
    return ("ref", module, name)


def _referenced(data: Any) -> Any:
    """What ``('ref', module, name)`` names now: it must be already imported (nothing is imported
    for a record), say it is that very name (a replacement put there since says otherwise), and
    wrap nothing (``functools.wraps`` copies the name of what it wraps)."""
    _, module, name = data
    value = _lookup(module, name)
    if (value is None or getattr(value, "__module__", None) != module or getattr(value, "__name__", None) != name
            or hasattr(value, "__wrapped__")):
        raise _Unrecordable(data)
    return value


def _lookup(module: str, name: str) -> Any:
    return getattr(sys.modules.get(module), name, None)


_SCALARS = (bool, int, float, str, type(None))


def _data(value: Any, index: Mapping[Node, int]) -> Any:
    """A node argument as plain data: scalars as they are, anything else a tagged tuple."""
    kind = type(value)
    if kind in _SCALARS:
        return value
    if isinstance(value, Node):
        return ("n", index[value])
    if kind is tuple:
        return ("t", [_data(v, index) for v in value])
    if isinstance(value, list):  # fx's immutable_list too: fx makes every list one again
        return ("l", [_data(v, index) for v in value])
    if isinstance(value, dict) and all(type(k) is str for k in value):
        return ("d", [[k, _data(v, index)] for k, v in value.items()])
    if kind is torch.dtype:
        return ("dtype", str(value).removeprefix("torch."))
    if kind is slice:
        return ("slice", _data(value.start, index), _data(value.stop, index), _data(value.step, index))
    if value is Ellipsis:
        return ("...",)
    return _reference(value)


def _value(data: Any, nodes: list[Node]) -> Any:
    """The argument :func:`_data` wrote."""
    if type(data) in _SCALARS:
        return data
    tag = data[0]
    if tag == "n":
        return nodes[data[1]]
    if tag in ("t", "l"):
        items = [_value(v, nodes) for v in data[1]]
        return tuple(items) if tag == "t" else items
    if tag == "d":
        return {k: _value(v, nodes) for k, v in data[1]}
    if tag == "dtype":
        dtype = getattr(torch, data[1], None)
        if type(dtype) is not torch.dtype:
            raise _Unrecordable(data)
        return dtype
    if tag == "slice":
        return slice(*(_value(v, nodes) for v in data[1:]))
    if tag == "...":
        return Ellipsis
    return _referenced(data)


class _Book:
    """Patterns the block of :func:`recorded_traces` replays and records, by :meth:`key`."""

    def __init__(self, known: Mapping[str, Any]) -> None:
        from .isolation import function_modes_active

        self.known = known
        self.traced: dict[str, Any] = {}
        self._seen: set[str] = set()
        #: A torch function mode (``torch.device(...)`` entered, ``set_default_device``) may change
        #: what a trace records (a factory's ``device=``): then nothing is replayed or recorded.
        self.usable = not function_modes_active()

    @staticmethod
    def key(rule_name: str, fn: Callable[..., Any]) -> str:
        """The rule's name, and the pattern function's name and first line (its file's text is
        in the cache key): two patterns with one key are neither replayed nor recorded."""
        code = getattr(fn, "__code__", None)
        return f"{rule_name}|{getattr(fn, '__qualname__', '')}|{getattr(code, 'co_firstlineno', '')}"

    def replayed(self, rule_name: str, fn: Callable[..., Any]) -> fx.Graph | None:
        key = self.key(rule_name, fn)
        record = self.known.get(key) if self.usable and key not in self._seen else None
        graph = None if record is None else graph_from_record(record, fn)
        if graph is not None:
            self._seen.add(key)
        return graph

    def record(self, rule_name: str, fn: Callable[..., Any], graph: fx.Graph) -> None:
        key = self.key(rule_name, fn)
        self.traced[key] = graph_record(graph) if self.usable and key not in self._seen else None
        self._seen.add(key)


_BOOK = threading.local()


@contextlib.contextmanager
def recorded_traces(known: Mapping[str, Any] | None) -> Iterator[dict[str, Any]]:
    """Inside the block (on this thread), :func:`trace_pattern` takes the graph of a rule's
    pattern whose :meth:`_Book.key` is a key of ``known`` from its :func:`graph_record` instead of
    tracing it, when the record's functions, classes and constants are still what it names; a
    pattern it traces is recorded in the dict the block gets (``None``: not recordable). Every
    check of the pattern runs on the graph either way. The trace cache uses it for the patterns
    of a ``.fxr`` file (:func:`fxrewrite.dsl.parse_rules`) and of the shipped library's Python
    rule files (:func:`fxrewrite.loader.load_rules`)."""
    previous = getattr(_BOOK, "value", None)
    _BOOK.value = book = _Book(known or {})
    try:
        yield book.traced
    finally:
        _BOOK.value = previous


def tracing_state() -> str:
    """What besides a function decides its trace and can change while a process runs: the
    functions and methods registered with ``torch.fx.wrap`` (by module and name)."""
    from torch.fx import _symbolic_trace

    functions = sorted(f"{g.get('__name__')}.{name}" for (_, name), g in _symbolic_trace._wrapped_fns_to_patch.items())
    methods = sorted(f"{c.__module__}.{c.__qualname__}.{name}" for c, name in _symbolic_trace._wrapped_methods_to_patch)
    return "|".join(functions) + "||" + "|".join(methods)
