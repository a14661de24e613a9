"""Canonical operations: one op key, and one way of lining up arguments, for every spelling of
the same computation.

``operator.add``, ``torch.add``, ``Tensor.add`` (a ``call_method``) and ``torch.ops.aten.add.Tensor``
are the same op; so are ``torch.multiply`` and ``torch.mul``. An *op key* names the op; the
matcher only tries a rule at a node whose key equals the key of the rule's anchor:

>>> import operator, torch
>>> op_key_of("call_function", operator.add) == op_key_of("call_method", "add") \\
...     == op_key_of("call_function", torch.ops.aten.add.Tensor) == ("aten", "add")
True
>>> op_key_of("call_module", "encoder.layers.0")   # modules are matched by isinstance
('call_module',)

Arguments are lined up by the op's ATen schema, with keyword arguments placed and defaults
filled in, so ``torch.sum(x, dim=1)``, ``torch.sum(x, 1)``, ``x.sum(1)`` and the exported
``aten.sum.dim_IntList(x, [1])`` compare equal:

>>> x = torch.fx.Graph().placeholder("x")
>>> canonical_arguments("call_method", "sum", (x, 1), {})
{'self': x, 'dim': [1], 'keepdim': False, 'dtype': None}
>>> canonical_arguments("call_function", torch.ops.aten.sum.dim_IntList, (x, [1]), {})
{'self': x, 'dim': [1], 'keepdim': False, 'dtype': None}

A call whose target has no ATen counterpart keeps its own key, ``(op, target)``, and is matched
by its arguments as written.
"""

from __future__ import annotations

import inspect
import operator
from collections.abc import Callable, Hashable, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch.fx.node import Node

__all__ = [
    "ALIASES",
    "COMMUTATIVE",
    "FUNCTIONALS",
    "IGNORED_ARGUMENTS",
    "OPERATORS",
    "aten_overload",
    "canonical_arguments",
    "canonical_name",
    "is_commutative_call",
    "op_key_of",
]

#: Python operators and the ATen op each computes on tensors.
OPERATORS: Mapping[Callable[..., Any], str] = {
    operator.add: "add", operator.sub: "sub", operator.mul: "mul", operator.truediv: "div",
    operator.floordiv: "floor_divide", operator.mod: "remainder", operator.pow: "pow",
    operator.matmul: "matmul", operator.neg: "neg", operator.abs: "abs", operator.invert: "bitwise_not",
    operator.and_: "bitwise_and", operator.or_: "bitwise_or", operator.xor: "bitwise_xor",
    operator.eq: "eq", operator.ne: "ne", operator.lt: "lt", operator.le: "le", operator.gt: "gt",
    operator.ge: "ge",
}

#: Alternative names of one ATen op (same schema, same result).
ALIASES: Mapping[str, str] = {
    "multiply": "mul", "subtract": "sub", "true_divide": "div", "divide": "div", "negative": "neg",
    "absolute": "abs", "special_expit": "sigmoid", "clip": "clamp", "greater": "gt", "greater_equal": "ge",
    "less": "lt", "less_equal": "le", "not_equal": "ne", "arccos": "acos", "arcsin": "asin", "arctan": "atan",
    "arccosh": "acosh", "arcsinh": "asinh", "arctanh": "atanh", "fix": "trunc", "special_exp2": "exp2",
    "special_expm1": "expm1", "special_log1p": "log1p", "special_round": "round", "special_sinc": "sinc",
    "special_log_softmax": "log_softmax", "special_softmax": "softmax", "matrix_power": "linalg_matrix_power",
}

#: Ops whose first two operands commute (``add``/``sub`` only with ``alpha`` 1, see below).
COMMUTATIVE: frozenset[str] = frozenset({
    "add", "mul", "maximum", "minimum", "eq", "ne", "logical_and", "logical_or", "logical_xor",
    "bitwise_and", "bitwise_or", "bitwise_xor",
})

#: Arguments that select an implementation, not a result: ignored when comparing calls.
IGNORED_ARGUMENTS: Mapping[str, frozenset[str]] = {
    "layer_norm": frozenset({"cudnn_enable"}),
    "batch_norm": frozenset({"cudnn_enabled"}),
    "group_norm": frozenset({"cudnn_enabled"}),
    "instance_norm": frozenset({"cudnn_enabled"}),
}

_TORCH_MODULES = ("torch", "torch._C._nn", "torch._C._special", "torch._C._linalg", "torch._C._fft",
                  "torch._C._VariableFunctions")


# -- Python-level functionals (torch.nn.functional) whose signature differs from ATen's ------

def _relu(input: Any, inplace: bool = False) -> Any:
    return None if inplace else ("relu", {"self": input})


def _silu(input: Any, inplace: bool = False) -> Any:
    return None if inplace else ("silu", {"self": input})


def _softmax_like(name: str) -> Callable[..., Any]:
    def adapt(input: Any, dim: Any = None, _stacklevel: int = 3, dtype: Any = None) -> Any:
        return None if dim is None else (name, {"self": input, "dim": dim, "dtype": dtype})

    return adapt


def _layer_norm(input: Any, normalized_shape: Any, weight: Any = None, bias: Any = None, eps: float = 1e-5) -> Any:
    return ("layer_norm", {"input": input, "normalized_shape": list(normalized_shape), "weight": weight,
                           "bias": bias, "eps": eps, "cudnn_enable": True})


def _dropout(input: Any, p: float = 0.5, training: bool = True, inplace: bool = False) -> Any:
    return None if inplace else ("dropout", {"input": input, "p": p, "train": training})


def _same_order(function: Callable[..., Any], name: str) -> Callable[..., Any]:
    """An adapter for a functional whose parameters are its ATen op's, in the same order, plus
    ``inplace`` (``F.leaky_relu(input, negative_slope=0.01, inplace=False)``)."""
    signature = inspect.signature(function)

    def adapt(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        values = dict(bound.arguments)
        if values.pop("inplace", False):
            return None
        return name, tuple(values.values())

    adapt.__signature__ = signature  # type: ignore[attr-defined]
    return adapt


_SAME_ORDER = {F.relu6: "relu6", F.hardswish: "hardswish", F.hardsigmoid: "hardsigmoid", F.mish: "mish",
               F.leaky_relu: "leaky_relu", F.elu: "elu", F.hardtanh: "hardtanh", F.selu: "selu", F.celu: "celu"}

#: ``torch.nn.functional`` functions written in Python, mapped onto their ATen op.
FUNCTIONALS: Mapping[Callable[..., Any], tuple[str, Callable[..., Any]]] = {
    **{f: (name, _same_order(f, name)) for f, name in _SAME_ORDER.items()},
    F.relu: ("relu", _relu),
    F.silu: ("silu", _silu),
    F.softmax: ("softmax", _softmax_like("softmax")),
    F.log_softmax: ("log_softmax", _softmax_like("log_softmax")),
    F.layer_norm: ("layer_norm", _layer_norm),
    F.dropout: ("dropout", _dropout),
}

#: Methods taking their list argument as varargs: ``x.permute(0, 2, 1)`` is ``permute(x, [0, 2, 1])``.
_VARARG_METHODS = frozenset({"permute", "view", "reshape", "expand", "repeat", "tile"})


# -- op keys --------------------------------------------------------------------------------

_name_cache: dict[Any, str | None] = {}


def canonical_name(op: str, target: Any) -> str | None:
    """The ATen op name a ``call_function``/``call_method`` target computes, or ``None``."""
    try:
        return _name_cache[target if op == "call_function" else ("method", target)]
    except (KeyError, TypeError):
        pass
    name = _method_name(target) if op == "call_method" else _function_name(target)
    try:
        _name_cache[target if op == "call_function" else ("method", target)] = name
    except TypeError:
        pass
    return name


def _aten_name(name: str) -> str | None:
    name = ALIASES.get(name, name)
    return name if hasattr(torch.ops.aten, name) else None


def _method_name(method: str) -> str | None:
    if not isinstance(method, str) or method.startswith("_") or method.endswith("_"):
        return None  # private and in-place methods are matched as written
    return _aten_name(method)


def _function_name(target: Any) -> str | None:
    if isinstance(target, torch._ops.OpOverload):
        return _overload_name(target.overloadpacket)
    if isinstance(target, torch._ops.OpOverloadPacket):
        return _overload_name(target)
    if target in OPERATORS:
        return OPERATORS[target]
    if target in FUNCTIONALS:
        return FUNCTIONALS[target][0]
    name = getattr(target, "__name__", None)
    if (isinstance(name, str) and type(target).__name__ == "builtin_function_or_method"
            and getattr(target, "__module__", None) in _TORCH_MODULES and not name.endswith("_")):
        return _aten_name(name)
    return None


def _overload_name(packet: torch._ops.OpOverloadPacket) -> str | None:
    namespace, _, name = packet._qualified_op_name.partition("::")
    if namespace != "aten":
        return f"{namespace}::{name}"
    return ALIASES.get(name, name)


def op_key_of(op: str, target: Any, canonical: bool = True) -> Hashable:
    """The index key of a node with opcode ``op`` and ``target`` (``canonical=False``: the
    target as written, torch.fx's notion of "same op")."""
    if op in ("call_module", "get_attr"):
        return (op,)
    if canonical and op in ("call_function", "call_method"):
        name = canonical_name(op, target)
        if name is not None:
            return ("aten", name)
    return (op, target)


# -- arguments ------------------------------------------------------------------------------

def canonical_arguments(op: str, target: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, Any] | None:
    """The call's arguments named by the ATen schema of its op, defaults filled in, without
    the arguments that only select an implementation (:data:`IGNORED_ARGUMENTS`); ``None``
    when the call cannot be put in that form (no ATen op, or no overload accepts it)."""
    found = aten_overload(op, target, args, kwargs)
    if found is None:
        return None
    ignored = IGNORED_ARGUMENTS.get(canonical_name(op, target) or "", frozenset())
    return {k: v for k, v in found[1].items() if k not in ignored}


def aten_overload(op: str, target: Any, args: tuple[Any, ...],
                  kwargs: Mapping[str, Any]) -> tuple[torch._ops.OpOverload, dict[str, Any]] | None:
    """The ATen overload a call resolves to, and its arguments by schema name."""
    name = canonical_name(op, target)
    if name is None or "::" in name:
        return _custom_op(target, args, kwargs)
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


def _resolve(packet: torch._ops.OpOverloadPacket, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
    """The first overload that accepts the call. Python numbers first try overloads that take
    them as Scalars (``pow.Tensor_Scalar``), as PyTorch's own argument parser does; only then
    overloads that take a number as a Tensor (``mul.Tensor(x, 0.5)``, as torch.export writes)."""
    overloads = [o for o in _ordered_overloads(packet) if not o._schema.is_mutable]
    for strict in (True, False):
        for overload in overloads:
            bound = _bind(overload._schema, args, kwargs, strict)
            if bound is not None:
                return overload, bound
    return None


def _bind(schema: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any], strict: bool = False) -> dict[str, Any] | None:
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
    optional = type_name.startswith("Optional[")
    is_list = "List[" in type_name
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
    val = node.meta.get("val", None)
    return node.op == "placeholder" or isinstance(val, (int, torch.SymInt))


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
