"""Calls read through the ATen schema: arguments bound and normalised, the overload a call
resolves to, what kind of value a node computes, and a call's ATen spelling.
"""

from __future__ import annotations

import inspect
import operator
from collections.abc import Hashable, Mapping
from typing import Any, Literal

import torch
from torch.fx.node import Node

from ..meta import _DYNAMO_VALUE, _TENSOR_META, _VALUE, described, has_value, value_of
from .ops import (
    _VARARG_METHODS,
    COMMUTATIVE,
    FUNCTIONALS,
    IGNORED_ARGUMENTS,
    VALUE_ATTRIBUTES,
    VALUE_METHODS,
    VIEW_ATTRIBUTES,
    canonical_name,
    dtype_conversion,
    same_literal,
)

__all__ = [
    "ResultKind",
    "aten_overload",
    "aten_spelling",
    "canonical_arguments",
    "is_commutative_call",
    "result_kind",
]


# -- arguments ------------------------------------------------------------------------------

def canonical_arguments(op: str, target: Any, args: tuple[Any, ...],
                        kwargs: Mapping[str, Any]) -> dict[str, Any] | None:
    """The call's arguments named by the ATen schema of its op, defaults filled in, without
    the arguments that only select an implementation (:data:`IGNORED_ARGUMENTS`); ``None``
    when the call cannot be put in that form (no ATen op, or no overload accepts it)."""
    conversion = dtype_conversion(op, target, args, kwargs)
    if conversion is not None:
        return conversion
    found = aten_overload(op, target, args, kwargs)
    if found is None:
        return None
    ignored = IGNORED_ARGUMENTS.get(canonical_name(op, target) or "")
    if ignored is None:
        return found[1]  # a dict of its own already (bound for this call)
    return {k: v for k, v in found[1].items() if k not in ignored}


def aten_overload(op: str, target: Any, args: tuple[Any, ...],
                  kwargs: Mapping[str, Any]) -> tuple[torch._ops.OpOverload, dict[str, Any]] | None:
    """The ATen overload a call resolves to, and its arguments by schema name."""
    name = canonical_name(op, target)
    if name is None or "::" in name:
        return _custom_op(target, args, kwargs)
    if name == "to":
        conversion = dtype_conversion(op, target, args, kwargs)
        if conversion is not None and not isinstance(target, torch._ops.OpOverload):
            return torch.ops.aten.to.dtype, {**conversion, "non_blocking": False, "copy": False, "memory_format": None}
    if op == "call_function" and target in FUNCTIONALS:
        return _functional(target, name, args, kwargs)
    if op == "call_method" and name in _VARARG_METHODS and _varargs(args):
        args = (args[0], list(args[1:]))
    if isinstance(target, torch._ops.OpOverload):
        bound = _bind(target._schema, args, kwargs)
        return None if bound is None else (target, bound)
    return _resolve(getattr(torch.ops.aten, name), args, kwargs)


def _varargs(args: tuple[Any, ...]) -> bool:
    """``x.view(2, -1)`` or ``x.view(n)`` with an int, not ``x.view(shape)`` with one node
    (which may hold a whole ``torch.Size``)."""
    if len(args) < 2 or isinstance(args[1], bool):
        return False
    if len(args) == 2:
        return isinstance(args[1], int)
    return all(isinstance(a, (int, Node)) and not isinstance(a, bool) for a in args[1:])


def _custom_op(target: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
    if isinstance(target, torch._ops.OpOverload):
        bound = _bind(target._schema, args, kwargs)
        return None if bound is None else (target, bound)
    if isinstance(target, torch._ops.OpOverloadPacket):
        return _resolve(target, args, kwargs)
    return None


def _functional(target: Any, name: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
    adapter = FUNCTIONALS[target][1]
    try:
        bound = inspect.signature(adapter).bind(*args, **kwargs)
    except TypeError:
        return None
    result = adapter(*bound.args, **bound.kwargs)
    if result is None:
        return None
    aten_name, given = result
    packet = getattr(torch.ops.aten, aten_name)
    return _resolve(packet, given, {}) if isinstance(given, tuple) else _resolve(packet, (), given)


def _ordered_overloads(packet: torch._ops.OpOverloadPacket) -> list[torch._ops.OpOverload]:
    names = [n for n in packet.overloads() if "out" not in n.split("_")]
    names.sort(key=lambda n: (n not in ("default", "Tensor"), n != "Tensor"))
    return [getattr(packet, n) for n in names]


#: Per packet, its overloads in the order :func:`_resolve` tries them (the schemas never change).
_resolvable: dict[torch._ops.OpOverloadPacket, list[torch._ops.OpOverload]] = {}


def _resolve(packet: torch._ops.OpOverloadPacket, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
    """The first overload that accepts the call. Python numbers first try overloads that take
    them as Scalars (``pow.Tensor_Scalar``), as PyTorch's own argument parser does; only then
    overloads that take a number as a Tensor (``mul.Tensor(x, 0.5)``, as torch.export writes)."""
    overloads = _resolvable.get(packet)
    if overloads is None:
        overloads = _resolvable[packet] = [o for o in _ordered_overloads(packet) if not o._schema.is_mutable]
    for strict in (True, False):
        for overload in overloads:
            bound = _bind(overload._schema, args, kwargs, strict)
            if bound is not None:
                return overload, bound
    return None


class _Plan:
    """One ATen schema as :func:`_bind` reads it: per argument its name, whether it is keyword-only,
    its default (if any) and its type's name, worked out once (``str(argument.type)`` and the
    schema's accessors cost more than the binding itself)."""

    __slots__ = ("arguments", "names", "positional", "schema")

    def __init__(self, schema: Any) -> None:
        self.schema = schema  # held, so that the id the plan is filed under stays this schema's
        arguments = []
        for a in schema.arguments:  # one loop, each accessor read once (a cold load builds ~70 plans)
            has_default = a.has_default_value()
            type_name = str(a.type)
            arguments.append((a.name, a.kwarg_only, has_default, a.default_value if has_default else None,
                              type_name, type_name.startswith("Optional["), "List[" in type_name))
        self.arguments = tuple(arguments)
        self.positional = sum(not entry[1] for entry in arguments)
        self.names = frozenset(entry[0] for entry in arguments)


_plans: dict[int, _Plan] = {}


def _plan(schema: Any) -> _Plan:
    plan = _plans.get(id(schema))
    if plan is None or plan.schema is not schema:
        plan = _plans[id(schema)] = _Plan(schema)
    return plan


def _bind(schema: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any], strict: bool = False) -> dict[str, Any] | None:
    """The arguments of a call bound to the names of one ATen ``schema``, defaults filled in and
    values normalised (:func:`_normalise`), or ``None`` when the call does not fit the schema.

    Not :func:`torch.fx.operator_schemas.normalize_function`, because overload resolution here
    must decide on *graph* arguments: a ``Node`` or a pattern's capture stands where the schema
    says ``Tensor``, ``int`` or ``float`` (:func:`_accepts` asks what the node can be), and a
    Python number must be told apart from a Tensor (``strict``, as PyTorch's own parser prefers
    ``pow.Tensor_Scalar`` to ``pow.Tensor_Tensor``). ``normalize_function`` binds by Python
    signature only, needs ``arg_types`` (runtime types, which a pattern does not have) to pick
    among overloads, and returns ``None`` on ambiguity instead of trying them in order.
    """
    if not PLANNED_BINDING:
        return _bind_unplanned(schema, args, kwargs, strict)
    plan = _plan(schema)
    given = len(args)
    if given > plan.positional:
        return None
    if kwargs and any(k not in plan.names for k in kwargs):
        return None
    bound: dict[str, Any] = {}
    for i, (name, kwarg_only, has_default, default, type_name, optional, is_list) in enumerate(plan.arguments):
        if name in kwargs:
            value = kwargs[name]
            if not kwarg_only and i < given:
                return None  # given twice
        elif not kwarg_only and i < given:
            value = args[i]
        elif has_default:
            value = list(default) if isinstance(default, list) else default  # a fresh list, as the schema gives
        else:
            return None
        if not _accepts_as(type_name, optional, is_list, value) or (strict and _number_as_tensor(type_name, value)):
            return None
        bound[name] = _normalise(type_name, value) if is_list else value
    return bound


#: Bind by the schema's :class:`_Plan`; ``False`` is the slow twin, :func:`_bind_unplanned`
#: (``tests/canon/test_schema.py`` checks both bind alike).
PLANNED_BINDING = True


def _bind_unplanned(schema: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any],
                    strict: bool = False) -> dict[str, Any] | None:
    """:func:`_bind`, reading the schema's arguments anew at every call (the slow twin)."""
    positional = [a for a in schema.arguments if not a.kwarg_only]
    if len(args) > len(positional):
        return None
    names = {a.name for a in schema.arguments}
    if any(k not in names for k in kwargs):
        return None
    bound: dict[str, Any] = {}
    for i, argument in enumerate(schema.arguments):
        if argument.name in kwargs:
            value = kwargs[argument.name]
            if not argument.kwarg_only and i < len(args):
                return None  # given twice
        elif not argument.kwarg_only and i < len(args):
            value = args[i]
        elif argument.has_default_value():
            value = argument.default_value
        else:
            return None
        type_name = str(argument.type)
        if not _accepts(type_name, value) or (strict and _number_as_tensor(type_name, value)):
            return None
        bound[argument.name] = _normalise(type_name, value)
    return bound


_NODE_TYPES = frozenset({"Tensor", "number", "int", "float", "bool", "Optional[Tensor]", "Optional[number]",
                         "Optional[int]", "Optional[float]", "Optional[bool]"})
_INT_TYPES = frozenset({"int", "number", "Tensor", "float", "Optional[int]", "Optional[number]",
                        "Optional[float]", "Optional[Tensor]"})
_FLOAT_TYPES = frozenset({"float", "number", "Tensor", "Optional[float]", "Optional[number]", "Optional[Tensor]"})


def _accepts(type_name: str, value: Any) -> bool:
    return _accepts_as(type_name, type_name.startswith("Optional["), "List[" in type_name, value)


def _accepts_as(type_name: str, optional: bool, is_list: bool, value: Any) -> bool:
    """:func:`_accepts`, with whether the type is optional and a list already read off its name."""
    if value is None:
        return optional
    if isinstance(value, Node):  # a tensor, a symbolic number, or (in a pattern) a captured constant
        return type_name in _NODE_TYPES or (is_list and _scalar_like(value))
    if isinstance(value, bool):
        return type_name in ("bool", "Optional[bool]", "number", "Optional[number]", "Tensor")
    if isinstance(value, int):
        return type_name in _INT_TYPES or (is_list and "int" in type_name)
    if isinstance(value, float):
        return type_name in _FLOAT_TYPES or (is_list and "float" in type_name)
    if isinstance(value, (list, tuple)):
        return is_list
    if isinstance(value, str):
        return "str" in type_name
    if isinstance(value, torch.dtype):
        return type_name in ("int", "Optional[int]")  # ScalarType prints as int
    if isinstance(value, (torch.device, torch.layout, torch.memory_format)):
        return any(t in type_name for t in ("Device", "Layout", "MemoryFormat", "int"))
    return False


def _scalar_like(node: Node) -> bool:
    """A node that may stand for one number in a list: a pattern's captured constant or a
    graph input (placeholders), or a node whose value is known to be an int."""
    val = value_of(node)
    if node.op == "placeholder" or isinstance(val, (int, torch.SymInt)):
        return True
    return not has_value(node) and node.op == "call_function" and result_kind(node) == "value"


def _number_as_tensor(type_name: str, value: Any) -> bool:
    """A Python number passed as a Tensor, or a graph value passed as a number: what the strict
    pass of :func:`_resolve` refuses, so ``x * 2.0`` resolves to ``mul.Scalar``, not to
    ``mul.Tensor`` (number as tensor) or ``mul.default`` (tensor as number)."""
    tensor_type = type_name in ("Tensor", "Optional[Tensor]")
    if isinstance(value, Node):
        return not tensor_type
    return isinstance(value, (int, float)) and not isinstance(value, bool) and tensor_type


def _normalise(type_name: str, value: Any) -> Any:
    if "List[" in type_name:
        if isinstance(value, (int, Node)) and not isinstance(value, bool):
            return [value]
        if isinstance(value, tuple):
            return list(value)
    return value


def is_commutative_call(op: str, target: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> bool:
    """True when swapping the first two operands of this call leaves its value unchanged.

    >>> is_commutative_call("call_function", operator.mul, (1, 2), {})
    True
    >>> is_commutative_call("call_function", torch.add, (1, 2), {"alpha": 2})
    False
    """
    if len(args) != 2 or op not in ("call_function", "call_method"):
        return False
    name = canonical_name(op, target)
    if name not in COMMUTATIVE:
        return False
    return not kwargs or (name == "add" and set(kwargs) == {"alpha"} and kwargs["alpha"] == 1)


# -- what a node computes -------------------------------------------------------------------

ResultKind = Literal["tensor", "value", "sequence", "none", "unknown"]

_PYTHON_ARITHMETIC = frozenset({
    operator.add, operator.sub, operator.mul, operator.truediv, operator.floordiv, operator.mod, operator.pow,
    operator.neg, operator.pos, operator.abs, operator.eq, operator.ne, operator.lt, operator.le, operator.gt,
    operator.ge, operator.and_, operator.or_, operator.xor, operator.not_, operator.invert,
})


def result_kind(node: Node) -> ResultKind:
    """What ``node`` computes: ``"tensor"``, a Python ``"value"`` (an int, a size, a dtype ...),
    a ``"sequence"`` (a tuple of results), ``"none"``, or ``"unknown"``. Metadata decides when
    the node carries it; otherwise the op's schema and what fxrewrite knows of Python-level calls.

    >>> gm = torch.fx.symbolic_trace(lambda a: a.reshape(a.size(0) * a.size(1)))
    >>> [(n.name, result_kind(n)) for n in gm.graph.nodes if n.op == "call_method" or n.op == "call_function"]
    [('size', 'value'), ('size_1', 'value'), ('mul', 'value'), ('reshape', 'tensor')]
    """
    if FAST_RESULT_KIND:
        kind = _filed_kind(node)
        if kind is None and node.op == "call_function":
            kind = _arithmetic_kind(node)
        if kind is not None:
            return kind
    return _kind(node, {})


def _filed_kind(node: Node) -> ResultKind | None:
    """The kind of a call without keywords or metadata whose target goes straight to its schema,
    from :data:`_flat_kinds` (what :func:`_kind` would work out), or ``None`` when not filed."""
    if node._kwargs:  # (fx's fields behind the kwargs and args properties: asked at every match)
        return None
    meta = node.meta
    if not meta or (_VALUE not in meta and _DYNAMO_VALUE not in meta and meta.get(_TENSOR_META) is None):
        if node.op == "call_module":
            return "unknown"  # (what _kind says of a module call without metadata: modules have no schema)
        try:  # no metadata, a target that goes straight to its schema: the kind filed by argument types
            if (node.op, node.target) in _schema_targets:
                return _flat_kinds.get((node.op, node.target, tuple(map(type, node._args))))
        except TypeError:  # an unhashable target
            pass
    return None


def _arithmetic_kind(node: Node, depth: int = 8) -> ResultKind | None:
    """``"tensor"`` for Python arithmetic without metadata whose first input has a filed tensor
    kind (:func:`_filed_kind`), or is such arithmetic itself (up to ``depth`` deep): :func:`_kind`
    finds that first (the inputs walked in order, the first tensor decides; ``depth`` stays far
    within its budget); ``None`` when it is not decided here. ``x + y`` on traced tensors is the
    common case: no walk, no ``seen`` dict."""
    meta = node.meta
    if meta and (_VALUE in meta or _DYNAMO_VALUE in meta or meta.get(_TENSOR_META) is not None):
        return None
    try:
        if node.target not in _PYTHON_ARITHMETIC:
            return None
    except TypeError:  # an unhashable target
        return None
    for first in node._input_nodes:  # (fx's dict behind all_input_nodes, in its order: no list built)
        kind = _filed_kind(first)
        if kind is None and depth and first.op == "call_function":
            kind = _arithmetic_kind(first, depth - 1)
        return "tensor" if kind == "tensor" else None
    return None


#: Answer :func:`result_kind` of a call without keywords or metadata whose target goes straight to
#: :func:`_schema_kind` (no Python arithmetic, ``getattr``, ``getitem``, ``math``, value method)
#: from :data:`_flat_kinds`, without the walk of :func:`_kind`; ``False`` is the slow twin
#: (``tests/test_match_compiled.py`` compares both on traced, exported and pattern graphs).
FAST_RESULT_KIND = True
#: ``(op, target)`` whose calls without metadata :func:`_kind` hands to :func:`_schema_kind`
#: whatever their arguments (filled as :func:`_kind` meets them; targets only, never stale).
_schema_targets: set[tuple[str, Any]] = set()


def _file_schema_target(node: Node) -> None:
    try:
        _schema_targets.add((node.op, node.target))
    except TypeError:  # an unhashable target
        pass


_KIND_BUDGET = 64  # nodes visited to decide one node's kind (Python arithmetic looks at its inputs)


def _kind(node: Node, seen: dict[Node, ResultKind]) -> ResultKind:
    if node in seen:
        return seen[node]
    if len(seen) > _KIND_BUDGET:
        return "unknown"
    if FAST_RESULT_KIND:  # (an input of Python arithmetic, met in the walk)
        filed = _filed_kind(node)
        if filed is not None:
            seen[node] = filed
            return filed
    seen[node] = "unknown"  # while deciding (a graph has no cycles; this bounds the walk)
    kind = _kind_from_meta(node)
    if kind is None:
        if node.op == "placeholder" and node.type in (int, float, bool, str, torch.dtype):
            kind = "value"  # a pattern's literal capture
        elif node.op == "get_attr":
            kind = "tensor"
        elif node.op == "call_method":
            kind = _method_kind(node)
        elif node.op == "call_function":
            kind = _function_kind(node, seen)
        else:
            kind = "unknown"
    seen[node] = kind
    return kind


def _kind_from_meta(node: Node) -> ResultKind | None:
    if has_value(node):
        return _kind_of_value(value_of(node))
    meta = described(node)
    if meta is not None:
        return "tensor" if hasattr(meta, "shape") else "sequence"
    return None


def _kind_of_value(value: Any) -> ResultKind:
    if isinstance(value, torch.Tensor):
        return "tensor"
    if value is None:
        return "none"
    if isinstance(value, (tuple, list)) and not isinstance(value, torch.Size):
        return "sequence"
    return "value"


def _method_kind(node: Node) -> ResultKind:
    if node.target in VALUE_METHODS:
        return "value"
    if node.target == "type":
        if len(node.args) == 1 and not node.kwargs:
            return "value"  # x.type() is the type's name
    else:
        _file_schema_target(node)
    return _schema_kind(node)


def _function_kind(node: Node, seen: dict[Node, ResultKind]) -> ResultKind:
    target = node.target
    if target is getattr:
        if node.args[1] in VALUE_ATTRIBUTES:
            return "value"
        return "tensor" if node.args[1] in VIEW_ATTRIBUTES else "unknown"
    if target is operator.getitem:
        source = node.args[0]
        kind = _kind(source, seen) if isinstance(source, Node) else "unknown"
        return kind if kind in ("value", "tensor") else "unknown"
    if target in _PYTHON_ARITHMETIC:  # (before the math check: operator's functions are not math's)
        kinds = set()
        for a in node.all_input_nodes:
            kinds.add(_kind(a, seen))
            if "tensor" in kinds:
                return "tensor"
        return "value" if kinds == {"value"} else "unknown"
    if getattr(target, "__module__", None) == "math":
        return "value"
    _file_schema_target(node)
    return _schema_kind(node)


_schema_kinds: dict[Hashable, ResultKind] = {}


_PLAIN_LAYOUTS = {Node: "Node", int: "int", float: "float"}  # the common arguments, looked up directly


def _layout(value: Any) -> Hashable:
    """What overload resolution looks at in an argument: its type, not its value (a list by its
    elements' types), except for flags and names."""
    plain = _PLAIN_LAYOUTS.get(type(value))
    if plain is not None:
        return plain
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple([_layout(v) for v in value]))
    if value is None or isinstance(value, (bool, str, torch.dtype)):
        return (type(value).__name__, value)  # flags (inplace=True) change what the call is
    return type(value).__name__


#: Kinds filed by ``(op, target, the types of the positional arguments)`` for calls without keywords
#: whose arguments are all nodes, ints and floats (those types alone fix :func:`_layout`'s key):
#: one ``tuple(map(type, args))`` instead of :func:`_layout`. ``False`` is the slow twin (the
#: layout key at every call); ``tests/canon/test_schema.py`` checks that both answer alike.
FAST_SCHEMA_KIND = True

_flat_kinds: dict[Hashable, ResultKind] = {}


def _schema_kind(node: Node) -> ResultKind:
    if FAST_SCHEMA_KIND and not node.kwargs:
        args = node.args
        flat_key = (node.op, node.target, tuple(map(type, args)))
        try:
            return _flat_kinds[flat_key]
        except KeyError:
            kind = _schema_kind_by_layout(node)
            if all(t in _PLAIN_LAYOUTS for t in flat_key[2]):
                _flat_kinds[flat_key] = kind
            return kind
        except TypeError:  # an unhashable target
            pass
    return _schema_kind_by_layout(node)


def _schema_kind_by_layout(node: Node) -> ResultKind:
    """:func:`_schema_kind` filed by the layout of every argument (:func:`_layout`)."""
    try:
        kwargs = node.kwargs
        key = (node.op, node.target, _layout(node.args),
               tuple([(k, _layout(v)) for k, v in kwargs.items()]) if kwargs else ())
        return _schema_kinds[key]
    except KeyError:
        kind = _schema_kinds[key] = _schema_kind_uncached(node)
        return kind
    except TypeError:  # an unhashable target
        return _schema_kind_uncached(node)


def _schema_kind_uncached(node: Node) -> ResultKind:
    found = aten_overload(node.op, node.target, node.args, node.kwargs)
    if found is None:
        return "unknown"
    returns = found[0]._schema.returns
    if not returns:
        return "none"
    if len(returns) > 1:
        return "sequence"
    type_name = str(returns[0].type)
    if type_name == "Tensor":
        return "tensor"
    if "[]" in type_name or type_name.startswith(("List", "Tuple")):
        return "sequence"
    return "value"


# -- ATen spelling --------------------------------------------------------------------------

def aten_spelling(op: str, target: Any, args: tuple[Any, ...],
                  kwargs: Mapping[str, Any]) -> tuple[str, Any, tuple[Any, ...], dict[str, Any]]:
    """A torch-level call as the ATen overload torch.export would record, with its arguments laid
    out as torch.export does (trailing defaults dropped); calls without an ATen op unchanged.

    >>> x = torch.fx.Graph().placeholder("x")
    >>> aten_spelling("call_method", "sum", (x, 1), {})
    ('call_function', <OpOverload(op='aten.sum', overload='dim_IntList')>, (x, [1]), {})
    """
    found = aten_overload(op, target, args, kwargs)
    if found is None:
        return op, target, tuple(args), dict(kwargs)
    overload, named = found
    positional: list[tuple[Any, bool]] = []
    keywords: dict[str, Any] = {}
    for argument in overload._schema.arguments:
        value = named[argument.name]
        is_default = argument.has_default_value() and same_literal(value, argument.default_value)
        if argument.kwarg_only:
            if not is_default:
                keywords[argument.name] = value
        else:
            positional.append((value, is_default))
    while positional and positional[-1][1]:
        positional.pop()
    return "call_function", overload, tuple(v for v, _ in positional), keywords
