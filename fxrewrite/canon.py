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

import functools
import inspect
import math
import operator
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch.fx.node import Node

from ._torch import tree_leaves
from .meta import described, has_value, lent_constant, tensor_value, value_of

__all__ = [
    "AUTOGRAD_ONLY_WRITES",
    "ALIASES",
    "COMMUTATIVE",
    "CONVERSION_METHODS",
    "DIM_ARGUMENTS",
    "DTYPE_ARGUMENTS",
    "FUNCTIONALS",
    "IDENTITIES",
    "IGNORED_ARGUMENTS",
    "OPERATORS",
    "ResultKind",
    "METADATA_ATTRIBUTES",
    "METADATA_METHODS",
    "VALUE_ATTRIBUTES",
    "VALUE_METHODS",
    "VIEW_ATTRIBUTES",
    "alias_class",
    "aliased_inputs",
    "aten_overload",
    "aten_spelling",
    "attribute_at",
    "by_meaning",
    "canonical_arguments",
    "canonical_name",
    "constant_scalar",
    "dtype_conversion",
    "identity_refusal",
    "identity_source",
    "input_keys",
    "is_aten_graph",
    "is_check",
    "is_commutative_call",
    "is_written",
    "known_floating",
    "lined_up_arguments",
    "may_be_identity",
    "meaning_input",
    "mutation",
    "node_key",
    "node_keys",
    "op_key_of",
    "pattern_identity",
    "respelled",
    "result_kind",
    "same_literal",
    "same_shape",
    "through_identities",
    "writers_of",
    "written_arguments",
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
    "sym_size": "size", "sym_numel": "numel", "sym_stride": "stride",
    # dtype conversions are one op, "to" (see dtype_conversion)
    "_to_copy": "to", "type": "to",
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


def _by_name(function: Callable[..., Any], name: str) -> Callable[..., Any]:
    """An adapter for a functional whose parameters are its ATen op's, by name
    (``F.rms_norm(input, normalized_shape, weight=None, eps=None)``)."""
    signature = inspect.signature(function)

    def adapt(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return name, dict(bound.arguments)

    adapt.__signature__ = signature  # type: ignore[attr-defined]
    return adapt


_SAME_ORDER: dict[Callable[..., Any], str] = {
    F.relu6: "relu6", F.hardswish: "hardswish", F.hardsigmoid: "hardsigmoid", F.mish: "mish",
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
    **({F.rms_norm: ("rms_norm", _by_name(F.rms_norm, "rms_norm"))} if hasattr(F, "rms_norm") else {}),
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
    if method in CONVERSION_METHODS or method == "type":
        return "to"
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
    if (namespace, name) == ("prims", "convert_element_type"):
        return "to"
    if namespace != "aten":
        return f"{namespace}::{name}"
    return ALIASES.get(name, name)


_key_cache: dict[tuple[str, Any], Hashable] = {}


def op_key_of(op: str, target: Any, canonical: bool = True) -> Hashable:
    """The index key of a node with opcode ``op`` and ``target`` (``canonical=False``: the
    target as written, torch.fx's notion of "same op")."""
    if canonical:
        try:  # the hot path: the driver asks this a dozen times per rewrite
            return _key_cache[op, target]
        except (KeyError, TypeError):
            pass
    if op in ("call_module", "get_attr"):
        return (op,)
    key: Hashable = (op, target)
    if canonical and op in ("call_function", "call_method"):
        name = canonical_name(op, target)
        if name is not None:
            key = ("aten", name)
        try:
            _key_cache[op, target] = key
        except TypeError:  # an unhashable target
            pass
    return key


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
    ignored = IGNORED_ARGUMENTS.get(canonical_name(op, target) or "", frozenset())
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


# -- literals -------------------------------------------------------------------------------

def same_literal(a: Any, b: Any) -> bool:
    """Equal constants of the same type (nan equal to nan); nodes only to themselves.

    >>> same_literal(2, 2), same_literal(2, 2.0), same_literal(float("nan"), float("nan"))
    (True, False, True)
    """
    if type(a) is not type(b):
        return False
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    try:
        return bool(a == b)
    except Exception:  # values whose == is not a plain bool (e.g. tensors) never compare equal
        return False


# -- dtype conversions ----------------------------------------------------------------------

#: ``x.float()`` and friends: a conversion to a fixed dtype.
CONVERSION_METHODS: Mapping[str, torch.dtype] = {
    "float": torch.float32, "double": torch.float64, "half": torch.float16, "bfloat16": torch.bfloat16,
    "int": torch.int32, "long": torch.int64, "short": torch.int16, "char": torch.int8, "byte": torch.uint8,
    "bool": torch.bool, "cfloat": torch.complex64, "cdouble": torch.complex128,
}

_TO_COPY_DEFAULTS = {"layout": None, "device": None, "pin_memory": None, "non_blocking": False, "memory_format": None}


def _computes_dtype(value: Any) -> bool:
    """A dtype literal, or a node computing one (``v.dtype``, or a dtype in its metadata)."""
    if isinstance(value, torch.dtype):
        return True
    if not isinstance(value, Node):
        return False
    if value.op == "placeholder" and value.type is torch.dtype:  # a pattern's dtype capture
        return True
    if value.op == "call_function" and value.target is getattr and value.args[1:2] == ("dtype",):
        return True
    return isinstance(value_of(value), torch.dtype)


def dtype_conversion(op: str, target: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, Any] | None:
    """``{"self": x, "dtype": d}`` when the call only converts ``x`` to the dtype ``d``, in any of the
    spellings traced, exported and compiled graphs use: ``x.float()``, ``x.type(d)``, ``x.to(d)``,
    ``x.to(v.dtype)``, ``aten.to.dtype``, ``aten._to_copy(x, dtype=d)``, ``prims.convert_element_type``.

    >>> x = torch.fx.Graph().placeholder("x")
    >>> dtype_conversion("call_method", "half", (x,), {})
    {'self': x, 'dtype': torch.float16}
    >>> dtype_conversion("call_function", torch.ops.aten._to_copy.default, (x,), {"dtype": torch.float16})
    {'self': x, 'dtype': torch.float16}
    >>> dtype_conversion("call_method", "to", (x, "cpu"), {}) is None
    True
    """
    if not args or not isinstance(args[0], Node):
        return None
    x, rest = args[0], args[1:]
    if op == "call_method":
        if target in CONVERSION_METHODS:
            return {"self": x, "dtype": CONVERSION_METHODS[target]} if not rest and not kwargs else None
        if target in ("to", "type"):
            return _converted(x, rest, kwargs, {"non_blocking": False, "copy": False, "memory_format": None})
        return None
    if op != "call_function":
        return None
    if target in (torch.ops.aten.to.dtype, torch.ops.aten.to, torch.Tensor.to):
        return _converted(x, rest, kwargs, {"non_blocking": False, "copy": False, "memory_format": None})
    if target in (torch.ops.aten._to_copy.default, torch.ops.aten._to_copy):
        return _converted(x, rest, kwargs, _TO_COPY_DEFAULTS)
    if target in (torch.ops.prims.convert_element_type.default, torch.ops.prims.convert_element_type):
        return _converted(x, rest, kwargs, {})
    return None


def _converted(x: Node, rest: tuple[Any, ...], kwargs: Mapping[str, Any],
               defaults: Mapping[str, Any]) -> dict[str, Any] | None:
    options = dict(kwargs)
    dtype = options.pop("dtype", rest[0] if rest else None)
    if len(rest) > (0 if "dtype" in kwargs else 1) or not _computes_dtype(dtype):
        return None
    if any(k not in defaults or not same_literal(v, defaults[k]) for k, v in options.items()):
        return None
    return {"self": x, "dtype": dtype}


# -- check nodes ----------------------------------------------------------------------------

def is_aten_graph(nodes: Iterable[Node]) -> bool:
    """True when one of ``nodes`` calls an ATen overload (``aten.add.Tensor``): the graph is an
    exported, AOT or post-grad one, whose replacements must be written in ATen ops too.

    >>> g = torch.fx.Graph(); x = g.placeholder("x")
    >>> is_aten_graph([g.call_function(torch.relu, (x,))])
    False
    >>> is_aten_graph([g.call_function(torch.ops.aten.relu.default, (x,))])
    True
    """
    return any(isinstance(n.target, torch._ops.OpOverload) for n in nodes)


def is_check(node: Node) -> bool:
    """True for a node that only checks a value (``aten._assert_tensor_metadata``,
    ``_assert_scalar``, ``sym_constrain_range_for_size``, ...): torch.export adds them; it has no
    result and no other effect, so a match may absorb it."""
    if node.op != "call_function" or node.users:
        return False
    target = node.target
    if target is torch._assert:
        return True
    if not isinstance(target, torch._ops.OpOverload):
        return False
    name = target._schema.name.partition("::")[2]
    return name.startswith(("_assert", "sym_constrain_range", "_functional_assert", "_functional_sym_constrain"))


# -- effects: mutation and aliasing, from the ATen schemas ------------------------------------

def mutation(node: Node) -> str | None:
    """How ``node`` writes into an argument, in words, or ``None`` when it does not.

    >>> g = torch.fx.Graph(); x = g.placeholder("x")
    >>> mutation(g.call_method("add_", (x, 1)))
    "calls the in-place method '.add_()'"
    >>> mutation(g.call_function(torch.ops.aten.relu.default, (x,))) is None
    True
    """
    kwargs = node.kwargs
    if "out" in kwargs:
        return "writes into an out= argument"
    if _inplace_flag(node):
        return "passes inplace=True"
    if node.op == "call_module":
        module = _submodule(node)
        return f"calls the in-place module '{node.target}'" if getattr(module, "inplace", False) is True else None
    if node.op not in ("call_method", "call_function"):
        return None
    key = (node.op, node.target)
    try:
        return _target_mutation_cache[key]
    except (KeyError, TypeError):
        pass
    found = _target_mutation(node.op, node.target)
    try:
        _target_mutation_cache[key] = found
    except TypeError:  # an unhashable target
        pass
    return found


_target_mutation_cache: dict[tuple[str, Any], str | None] = {}


def _target_mutation(op: str, target: Any) -> str | None:
    """How calling ``target`` writes into an argument, whatever the arguments (see :func:`mutation`)."""
    if op == "call_method":
        if isinstance(target, str) and target.endswith("_") and not target.endswith("__"):
            return f"calls the in-place method '.{target}()'"
        return None
    if isinstance(target, torch._ops.OpOverload):
        return f"calls the mutating op {target}" if target._schema.is_mutable else None
    name = getattr(target, "__name__", "")
    if target is operator.setitem or target in _INPLACE_OPERATORS or (name.endswith("_") and not name.endswith("__")):
        return f"calls the in-place function {name}"
    return None


_INPLACE_OPERATORS = frozenset({
    operator.iadd, operator.isub, operator.imul, operator.itruediv, operator.ifloordiv, operator.imod,
    operator.ipow, operator.imatmul, operator.iand, operator.ior, operator.ixor, operator.ilshift, operator.irshift,
})


def written_arguments(node: Node) -> tuple[Node, ...]:
    """The graph values ``node`` writes into (empty for a pure call)."""
    if mutation(node) is None:
        return ()
    if "out" in node.kwargs:
        return tuple(v for v in tree_leaves(node.kwargs["out"]) if isinstance(v, Node))
    if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload) and not _inplace_flag(node):
        named = _bind(node.target._schema, node.args, node.kwargs) or {}
        written = [a.name for a in node.target._schema.arguments if a.alias_info is not None and a.alias_info.is_write]
        return tuple(v for name in written for v in tree_leaves(named.get(name))
                     if isinstance(v, Node))
    first = node.args[0] if node.args else None
    return (first,) if isinstance(first, Node) else ()


def _inplace_flag(node: Node) -> bool:
    if node.kwargs.get("inplace") is True:
        return True
    if node.op == "call_function" and _is_functional(node.target):
        try:
            bound = inspect.signature(node.target).bind(*node.args, **node.kwargs)  # type: ignore[arg-type]
        except TypeError:
            return False
        return bound.arguments.get("inplace") is True
    return False


def _is_functional(target: Any) -> bool:
    return _held_in(target, FUNCTIONALS)


def _held_in(target: Any, table: Any) -> bool:
    """``target in table``, false for an unhashable target (a call_function may call anything)."""
    try:
        return target in table
    except TypeError:
        return False


def _submodule(node: Node) -> Any:
    owner = node.graph.owning_module
    try:
        return owner.get_submodule(str(node.target)) if owner is not None else None
    except AttributeError:
        return None


#: Attributes that view their tensor (``x.T``, ``x.real``) and attributes that are Python values.
VIEW_ATTRIBUTES = frozenset({"T", "mT", "H", "mH", "real", "imag", "data"})
VALUE_ATTRIBUTES = frozenset({"shape", "dtype", "device", "ndim", "layout", "is_cuda", "requires_grad", "is_sparse",
                              "is_quantized", "is_meta", "names", "itemsize", "nbytes"})
#: The value attributes a tensor's metadata (a fake tensor) fixes, so a replacement may read them
#: at rewrite time (:mod:`fxrewrite.replace`); ``requires_grad`` and ``names`` may differ at run time.
METADATA_ATTRIBUTES = VALUE_ATTRIBUTES - {"requires_grad", "names"}


def aliased_inputs(node: Node) -> tuple[Node, ...]:
    """The input nodes whose storage ``node``'s result may share: from the alias annotations of
    the ATen schema (``Tensor(a) self -> Tensor(a)``), for every spelling of the call. Calls
    fxrewrite knows nothing about (modules, user functions) may alias any of their inputs.

    >>> g = torch.fx.Graph(); x = g.placeholder("x")
    >>> [n.name for n in aliased_inputs(g.call_method("contiguous", (x,)))]
    ['x']
    >>> aliased_inputs(g.call_function(torch.neg, (x,)))
    ()
    """
    if node.op in ("placeholder", "get_attr", "output"):
        return ()
    if node.op == "call_function" and node.target is operator.getitem:
        return (node.args[0],) if isinstance(node.args[0], Node) else ()
    if node.op == "call_function" and node.target is getattr:
        source = node.args[0]
        return (source,) if node.args[1] in VIEW_ATTRIBUTES and isinstance(source, Node) else ()
    if result_kind(node) == "value" or is_check(node):
        return ()
    if node.op in ("call_function", "call_method"):
        conversion = dtype_conversion(node.op, node.target, node.args, node.kwargs)
        if conversion is not None:  # `to` returns its input when the dtype already fits
            source = node.args[0]
            return (source,) if isinstance(source, Node) and not _always_copies(node) else ()
        found = aten_overload(node.op, node.target, node.args, node.kwargs)
        if found is not None:
            return _schema_aliases(*found)
    return tuple(node.all_input_nodes)


def _always_copies(node: Node) -> bool:
    return node.target in (torch.ops.aten._to_copy.default, torch.ops.prims.convert_element_type.default)


def _schema_aliases(overload: torch._ops.OpOverload, named: Mapping[str, Any]) -> tuple[Node, ...]:
    sets = set()
    for ret in overload._schema.returns:
        if ret.alias_info is not None:
            sets |= set(ret.alias_info.before_set) | set(ret.alias_info.after_set)
            if isinstance(ret.type, torch.ListType) and not sets:  # Tensor(a)[]: the elements alias
                sets |= {s for a in overload._schema.arguments if a.alias_info is not None
                         for s in a.alias_info.before_set}
    if not sets:
        return ()
    found = []
    for argument in overload._schema.arguments:
        info = argument.alias_info
        if info is not None and (set(info.before_set) | set(info.after_set)) & sets:
            found += [v for v in tree_leaves(named.get(argument.name)) if isinstance(v, Node)]
    return tuple(found)


def alias_class(node: Node, limit: int = 256) -> list[Node] | None:
    """``node`` and every value that may share its storage: what it views (its bases), and what
    views them, transitively; ``None`` when there are more than ``limit`` (treat as unknown)."""
    found, stack = {node: None}, [node]
    while stack:
        n = stack.pop()
        related = [*aliased_inputs(n), *(u for u in n.users if n in aliased_inputs(u))]
        for other in related:
            if other not in found:
                found[other] = None
                stack.append(other)
                if len(found) > limit:
                    return None
    return list(found)


def is_written(node: Node) -> bool:
    """True when ``node``'s value, or any value sharing its storage, is written in place
    somewhere in the graph (conservatively True when the alias class is too large to walk)."""
    return writers_of(node) != ()


#: In-place ops that change no value, only autograd's view of it.
AUTOGRAD_ONLY_WRITES = frozenset({"detach_", "requires_grad_"})


def writers_of(node: Node) -> tuple[Node, ...] | None:
    """The nodes writing in place into ``node``'s value or a value sharing its storage, in graph
    order; ``None`` when the alias class is too large to walk (treat as written). ``detach_``
    and ``requires_grad_`` write no value and are not counted.

    >>> g = torch.fx.Graph(); x = g.placeholder("x"); y = g.call_method("relu", (x,))
    >>> w = g.call_method("add_", (y, 1)); d = g.call_method("detach_", (x,))
    >>> [n.name for n in writers_of(y)], writers_of(x)
    (['add_'], ())
    """
    members = alias_class(node)
    if members is None:
        return None
    member_set = set(members)
    found = {user: None for member in members for user in member.users
             if mutation(user) is not None and not _autograd_only(user)
             and member_set.intersection(written_arguments(user))}
    return tuple(found)


def _autograd_only(node: Node) -> bool:
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        target = target._schema.name.partition("::")[2]
    return isinstance(target, str) and target in AUTOGRAD_ONLY_WRITES


# -- what a node computes -------------------------------------------------------------------

ResultKind = Literal["tensor", "value", "sequence", "none", "unknown"]

#: Tensor methods that compute Python values.
VALUE_METHODS = frozenset({"dim", "size", "numel", "item", "tolist", "stride", "element_size", "nelement",
                           "is_floating_point", "is_complex", "is_contiguous", "get_device", "data_ptr",
                           "storage_offset", "ndimension"})
#: The value methods a tensor's metadata answers (not ``item``, ``tolist``, ``data_ptr``: they read
#: the data; not ``stride``/``is_contiguous``: a replacement's own result may be laid out otherwise).
METADATA_METHODS = frozenset({"size", "dim", "numel", "is_floating_point", "is_complex", "element_size", "ndimension",
                              "nelement", "get_device"})

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
    return _kind(node, {})


_KIND_BUDGET = 64  # nodes visited to decide one node's kind (Python arithmetic looks at its inputs)


def _kind(node: Node, seen: dict[Node, ResultKind]) -> ResultKind:
    if node in seen:
        return seen[node]
    if len(seen) > _KIND_BUDGET:
        return "unknown"
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
    if node.target == "type" and len(node.args) == 1 and not node.kwargs:
        return "value"  # x.type() is the type's name
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
    if getattr(target, "__module__", None) == "math":
        return "value"
    if target in _PYTHON_ARITHMETIC:
        kinds = set()
        for a in node.all_input_nodes:
            kinds.add(_kind(a, seen))
            if "tensor" in kinds:
                return "tensor"
        return "value" if kinds == {"value"} else "unknown"
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


def _schema_kind(node: Node) -> ResultKind:
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


# -- lining up two calls of one op ----------------------------------------------------------

def lined_up_arguments(pn: Node, gn: Node, canonical: bool = True
                       ) -> tuple[tuple[str, ...], tuple[Any, ...], tuple[Any, ...]] | None:
    """The argument names and values of two calls of the same op, lined up for comparison;
    ``None`` when they cannot be lined up.

    Calls of one target with the same argument layout compare as written. Otherwise, with
    ``canonical``, both are lined up by the ATen schema of their op (see
    :func:`canonical_arguments`); without it (torch.fx's rule) only calls of an ATen
    ``OpOverload`` are, so ``aten.sum.dim_IntList(x, [1])`` and ``(x, [1], False)`` compare equal.
    """
    if canonical and pn.op in ("call_function", "call_method"):
        meaning = _meaning_name(pn, gn)
        if meaning is not None:
            return _lined_up_by_meaning(meaning, pn, gn)
        if pn.target is operator.truediv and gn.target is operator.truediv and not gn.kwargs and not pn.kwargs:
            return _python_division(pn, gn)
    p_args, p_kwargs, g_args, g_kwargs = pn.args, pn.kwargs, gn.args, gn.kwargs
    same_layout = len(p_args) == len(g_args) and p_kwargs.keys() == g_kwargs.keys()
    if same_layout and (pn.target == gn.target or not canonical or pn.op in ("call_module", "get_attr")):
        if not p_kwargs:
            return _positional_names(len(p_args)), p_args, g_args
        names = (*_positional_names(len(p_args)), *p_kwargs)
        return names, (*p_args, *p_kwargs.values()), (*g_args, *(g_kwargs[k] for k in p_kwargs))
    if canonical and pn.op in ("call_function", "call_method"):
        p_named = canonical_arguments(pn.op, pn.target, pn.args, pn.kwargs)
        g_named = canonical_arguments(gn.op, gn.target, gn.args, gn.kwargs)
        if p_named is None or g_named is None or p_named.keys() != g_named.keys():
            return None
        return tuple(p_named), tuple(p_named.values()), tuple(g_named[k] for k in p_named)
    if pn.op == "call_function" and isinstance(pn.target, torch._ops.OpOverload):
        schema = pn.target._schema.arguments
        names = tuple(a.name for a in schema)
        return names, _by_schema(schema, pn.args, pn.kwargs), _by_schema(schema, gn.args, gn.kwargs)
    return None


def _python_division(pn: Node, gn: Node) -> tuple[tuple[str, ...], tuple[Any, ...], tuple[Any, ...]] | None:
    """Two divisions ``a / b``, lined up as written; when the graph's computes a Python number
    (``1 / math.sqrt(d)``), an int constant is its float on both sides: true division of numbers
    gives the same float for ``1`` and ``1.0``."""
    if len(pn.args) != 2 or len(gn.args) != 2:
        return None
    names = _positional_names(2)
    if result_kind(gn) != "value":
        return names, pn.args, gn.args
    return names, tuple(_as_float(v) for v in pn.args), tuple(_as_float(v) for v in gn.args)


def _as_float(value: Any) -> Any:
    exact = isinstance(value, int) and not isinstance(value, bool) and abs(value) <= 2 ** 53
    return float(value) if exact else value


def _meaning_name(pn: Node, gn: Node) -> str | None:
    """The op two calls are compared as by meaning (see :func:`by_meaning`), or ``None`` when
    they compare as written or by schema only: the pattern's op when it has dims or a ``dtype=``
    to read by meaning, or when either call is another op respelled."""
    p_key = node_key(pn)
    if p_key == _GETITEM_KEY:
        respelled_either = p_key != op_key_of(pn.op, pn.target) or node_key(gn) != op_key_of(gn.op, gn.target)
        return "getitem" if respelled_either and node_key(gn) == p_key else None
    if p_key[0] != "aten":  # type: ignore[index]
        return None
    name = p_key[1]  # type: ignore[index]
    if name in _BY_MEANING or node_key(gn) != op_key_of(gn.op, gn.target) or p_key != op_key_of(pn.op, pn.target):
        return name if node_key(gn) == p_key else None
    return None


def _lined_up_by_meaning(name: str, pn: Node, gn: Node
                         ) -> tuple[tuple[str, ...], tuple[Any, ...], tuple[Any, ...]] | None:
    p_named = _named_arguments(pn)
    g_named = _named_arguments(gn)
    if p_named is None or g_named is None or p_named.keys() != g_named.keys():
        return None
    names = tuple(p_named)
    g_values = tuple(g_named[k] for k in names)
    p_values, g_meant = by_meaning(name, names, tuple(p_named.values()), g_values, meaning_input(name, g_values))
    return names, p_values, g_meant


def _named_arguments(node: Node) -> dict[str, Any] | None:
    key = op_key_of(node.op, node.target)
    found = respelled(node) if key in _RESPELLABLE_KEYS or _in_place_key(key) else None
    if found is not None:
        return found[1]
    if node.op == "call_function" and node.target is operator.getitem and len(node.args) == 2 and not node.kwargs:
        return {"#0": node.args[0], "#1": node.args[1]}
    return canonical_arguments(node.op, node.target, node.args, node.kwargs)


@functools.lru_cache(maxsize=64)
def _positional_names(count: int) -> tuple[str, ...]:
    """``("#0", "#1", ...)``: how positional arguments are named when calls line up as written."""
    return tuple(f"#{i}" for i in range(count))


def _by_schema(schema: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> tuple[Any, ...]:
    values = []
    for i, argument in enumerate(schema):
        if argument.name in kwargs:
            values.append(kwargs[argument.name])
        elif not argument.kwarg_only and i < len(args):
            values.append(args[i])
        else:
            values.append(argument.default_value)
    return tuple(values)


# -- floating point, known without metadata -------------------------------------------------

#: Ops whose tensor result is floating point whatever their (valid) inputs.
FLOATING_RESULTS = frozenset({
    "softmax", "log_softmax", "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sigmoid", "tanh", "sin",
    "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh", "erf", "erfc", "erfinv", "sqrt",
    "rsqrt", "reciprocal", "gelu", "silu", "mish", "softplus", "elu", "selu", "celu", "mean", "std", "var",
    "layer_norm", "batch_norm", "group_norm", "instance_norm", "rms_norm", "linear", "conv1d", "conv2d", "conv3d",
    "conv_transpose1d", "conv_transpose2d", "conv_transpose3d", "scaled_dot_product_attention", "logsumexp",
    "sinc", "lgamma", "digamma", "atan2", "hypot", "logit", "norm", "cumprod_float", "rand", "randn", "rand_like",
    "randn_like", "true_divide", "native_layer_norm", "native_batch_norm", "_softmax", "_log_softmax",
})

#: Ops whose result has the (promoted) dtype of their tensor inputs.
DTYPE_PRESERVING = frozenset({
    "add", "sub", "mul", "neg", "abs", "relu", "relu6", "hardtanh", "leaky_relu", "hardswish", "hardsigmoid",
    "clamp", "clamp_min", "clamp_max", "maximum", "minimum", "fmax", "fmin", "where", "cat", "stack", "sum",
    "amax", "amin", "matmul", "bmm", "mm", "addmm", "baddbmm", "pow", "square", "flatten", "view", "reshape",
    "transpose", "permute", "contiguous", "expand", "expand_as", "squeeze", "unsqueeze", "narrow", "select",
    "slice", "t", "mT", "dropout", "pad", "constant_pad_nd", "roll", "flip", "repeat", "tile", "masked_fill",
    "remainder", "floor_divide", "cumsum", "clone", "alias", "detach", "unflatten", "movedim", "diagonal",
    "addcmul", "addcdiv", "lerp", "prod", "sign", "positive", "ravel", "swapaxes", "moveaxis", "unfold",
    "view_as", "reshape_as", "div",
})


def known_floating(node: Node) -> bool | None:
    """Whether ``node`` computes a floating-point tensor: from its metadata, or, without
    metadata, from how the graph computes it (a floating parameter, a module with floating
    weights, ``softmax``, anything computed from a floating value by a dtype-preserving op, a
    conversion to a floating dtype). ``None`` when it cannot be told (a graph input).

    >>> gm = torch.fx.symbolic_trace(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU()))
    >>> [(n.name, known_floating(n)) for n in gm.graph.nodes if n.op != "output"]
    [('input_1', None), ('_0', True), ('_1', True)]
    """
    return _floating(node, {})


def _floating(node: Node, seen: dict[Node, bool | None]) -> bool | None:
    if node in seen:
        return seen[node]
    if len(seen) > _KIND_BUDGET:
        return None
    seen[node] = None
    seen[node] = answer = _floating_uncached(node, seen)
    return answer


def _floating_uncached(node: Node, seen: dict[Node, bool | None]) -> bool | None:
    val = described(node)
    if val is not None and hasattr(val, "dtype") and hasattr(val, "shape"):
        return bool(val.dtype.is_floating_point)
    if node.op == "get_attr":
        value = _attribute_value(node)
        return bool(value.dtype.is_floating_point) if isinstance(value, torch.Tensor) else None
    if node.op == "call_module":
        return _module_floating(node, seen)
    if node.op not in ("call_function", "call_method"):
        return None
    conversion = dtype_conversion(node.op, node.target, node.args, node.kwargs)
    if conversion is not None:
        dtype = conversion["dtype"]
        return bool(dtype.is_floating_point) if isinstance(dtype, torch.dtype) else None
    if node.target is operator.truediv:
        return True
    name = canonical_name(node.op, node.target)
    if node.op == "call_function" and node.target is operator.getitem:
        name = "select"  # an element of a tensor (tuples of results are not followed)
    if name == "div" and node.kwargs.get("rounding_mode") is None and len(node.args) < 3:
        return True
    if name in FLOATING_RESULTS:
        return True
    if name in DTYPE_PRESERVING or node.target in _PYTHON_ARITHMETIC:
        return _promoted_floating(node, seen)
    return None


def _promoted_floating(node: Node, seen: dict[Node, bool | None]) -> bool | None:
    """Type promotion: floating as soon as one operand is; a float constant makes it so too."""
    answers = [_floating(a, seen) for a in node.all_input_nodes]
    if any(answers) or any(isinstance(v, float) for v in (*node.args, *node.kwargs.values())):
        return True
    return False if answers and all(a is False for a in answers) else None


def _module_floating(node: Node, seen: dict[Node, bool | None]) -> bool | None:
    module = _submodule(node)
    if module is None:
        return None
    weights = list(module.parameters(recurse=False))
    if weights and all(w.dtype.is_floating_point for w in weights):
        return True  # Linear, Conv, norms, Embedding: the result takes the weights' dtype
    if type(module).__module__ in ("torch.nn.modules.activation", "torch.nn.modules.dropout") and node.args:
        first = node.args[0]
        return _floating(first, seen) if isinstance(first, Node) else None
    return None


def attribute_at(root: Any, path: str) -> Any:
    """The attribute at dotted ``path`` below ``root`` (a submodule, parameter or buffer), or
    ``None`` when it does not exist."""
    value: Any = root
    for part in path.split("."):
        value = getattr(value, part, None)
    return value


def _attribute_value(node: Node) -> Any:
    return attribute_at(node.graph.owning_module, str(node.target))


# -- matching by meaning: identities ---------------------------------------------------------
#
# A node whose value is its input's value (a cast to the dtype the value already has, inactive
# dropout, an unwritten clone) is seen through by the matcher: the pattern's operation is looked
# for behind it. Each identity below is stated once, with what proves it; without the proof
# (metadata a graph does not carry, a literal that is not constant) there is no identity, and
# :func:`identity_refusal` says what was missing (``explain`` prints it).

#: Ops that may leave their input's value unchanged, and under which condition (the table the
#: docs print; the checks are the ``_holds_*`` functions below).
IDENTITIES: Mapping[str, str] = {
    "to": "a conversion (.to, .type, .float(), _to_copy, convert_element_type) to the dtype, device and layout "
          "the value already has (from metadata)",
    "dropout": "dropout that is inactive: training=False or p=0 (F.dropout and its 1d/2d/3d/alpha forms, "
               "aten.dropout, an nn.Dropout module in eval mode)",
    "clone": "clone, alias, detach or lift_fresh_copy of a value that nothing writes into, keeping its layout; "
             "contiguous() of a value the metadata shows to be contiguous already",
    "view": "view, reshape, expand or _unsafe_view to the shape the value already has (from metadata)",
    "mul": "a multiplication or division by the literal 1 that keeps the value's dtype and shape (from metadata)",
}

_DROPOUTS = frozenset({"dropout", "alpha_dropout", "feature_alpha_dropout", "feature_dropout", "dropout1d",
                       "dropout2d", "dropout3d"})
_COPIES = frozenset({"clone", "contiguous", "alias", "detach", "lift_fresh_copy"})
_SAME_SHAPE_VIEWS = frozenset({"view", "reshape", "expand", "_unsafe_view", "view_as", "reshape_as", "expand_as"})
_SCALINGS = frozenset({"mul", "div"})
_IDENTITY_NAMES = frozenset({"to", *_DROPOUTS, *_COPIES, *_SAME_SHAPE_VIEWS, *_SCALINGS})
_DROPOUT_FUNCTIONS: frozenset[Any] = frozenset({
    F.dropout, F.alpha_dropout, F.feature_alpha_dropout, F.dropout1d, F.dropout2d, F.dropout3d, torch.dropout,
    torch.alpha_dropout, torch.feature_alpha_dropout, torch.feature_dropout,
})


def identity_source(node: Any) -> Node | None:
    """The node whose value ``node`` computes unchanged, when that is proved; else ``None``.

    >>> import torch.fx as fx
    >>> gm = fx.symbolic_trace(lambda x: F.dropout(x, 0.1, training=False).relu())
    >>> dropout = next(n for n in gm.graph.nodes if n.op == "call_function" and n.target is F.dropout)
    >>> identity_source(dropout).name
    'x'
    """
    source, _ = _identity(node)
    return source


def identity_refusal(node: Any) -> str | None:
    """Why ``node``, an op that can be an identity, is not seen as one here (missing metadata, an
    active dropout, a written clone); ``None`` when it is one or cannot be one."""
    return _identity(node)[1]


def pattern_identity(node: Node) -> tuple[Node, Any] | None:
    """For a pattern node that may compute its input unchanged: ``(input, dtype)``, where
    ``dtype`` is the dtype the matched value must have for that (a literal, or the pattern node
    computing it: ``v.dtype``), or ``None`` when the node is an identity whatever the value (an
    unwritten copy, dropout with ``training=False`` or ``p=0`` written as literals). The matcher
    may then find the input where the graph has no such node. ``None`` for any other node."""
    if node.op not in ("call_function", "call_method") or not node.args or not isinstance(node.args[0], Node):
        return None
    name = canonical_name(node.op, node.target) or ""
    if name == "to":
        conversion = dtype_conversion(node.op, node.target, node.args, node.kwargs)
        return None if conversion is None else (node.args[0], conversion["dtype"])
    if name in _COPIES and len(node.args) == 1:
        return node.args[0], None
    if (name in _DROPOUTS or _is_dropout_function(node.target)) and _holds_dropout(node) is None:
        return node.args[0], None  # inactive by its literals, as in a graph
    return None


def _is_dropout_function(target: Any) -> bool:
    return _held_in(target, _DROPOUT_FUNCTIONS)


def through_identities(value: Any) -> Any:
    """``value`` with the identities in front of it skipped (the value it computes unchanged)."""
    while isinstance(value, Node):
        source = identity_source(value)
        if source is None:
            return value
        value = source
    return value


def may_be_identity(node: Node) -> bool:
    """A cheap test (no metadata read): can ``node`` be an identity at all?"""
    if node.op == "call_module":
        return _dropout_module(node) is not None
    if node.op not in ("call_function", "call_method"):
        return False
    return canonical_name(node.op, node.target) in _IDENTITY_NAMES or _is_dropout_function(node.target)


def _identity(node: Any) -> tuple[Node | None, str | None]:
    if not isinstance(node, Node) or not may_be_identity(node):
        return None, None
    if node.op == "call_module":
        return _holds_dropout_module(node)
    name = canonical_name(node.op, node.target) or ""
    source = node.args[0] if node.args else node.kwargs.get("input", node.kwargs.get("self"))
    if name in _SCALINGS:
        return _holds_scaling(node, name)
    if not isinstance(source, Node):
        return None, None
    if name == "to":
        why = _holds_conversion(node, source)
    elif name in _COPIES:
        why = _holds_copy(node, source)
    elif name in _SAME_SHAPE_VIEWS:
        why = _holds_same_shape(node, source)
    else:
        why = _holds_dropout(node)
    return (source, None) if why is None else (None, why)


def _holds_conversion(node: Node, source: Node) -> str | None:
    before, after = tensor_value(source), tensor_value(node)
    if before is None or after is None:
        return f"'{node.name}' converts '{source.name}'; whether it changes the dtype needs metadata the graph " \
               f"does not carry (export the program, or pass example_inputs=)"
    if before.dtype != after.dtype:
        return f"'{node.name}' converts {before.dtype} to {after.dtype}"
    if dtype_conversion(node.op, node.target, node.args, node.kwargs) is not None:
        return None  # a dtype-only conversion to the dtype the value has
    for attribute in ("device", "layout"):
        if not hasattr(before, attribute) or getattr(before, attribute) != getattr(after, attribute, None):
            return f"'{node.name}' may change the {attribute} of '{source.name}'"
    return None


def _holds_copy(node: Node, source: Node) -> str | None:
    """A copy has its source's value, but a ``view`` of it may work where a view of the source
    raises: a copy that may change the layout (``contiguous()``, ``clone(memory_format=...)``)
    is an identity only where the source is contiguous already."""
    if is_written(node) or is_written(source):
        return f"'{node.name}' copies '{source.name}', and one of them is written in place"
    memory_format = node.kwargs.get("memory_format", node.args[1] if len(node.args) > 1 else None)
    changes_layout = canonical_name(node.op, node.target) == "contiguous" or memory_format not in (
        None, torch.preserve_format)
    if changes_layout:
        known = tensor_value(source)
        if not isinstance(known, torch.Tensor):
            return f"'{node.name}' may change the layout of '{source.name}', whose strides the graph does not carry"
        if not known.is_contiguous():
            return f"'{node.name}' makes the non-contiguous '{source.name}' contiguous (a later view may need it)"
    return None


def _holds_same_shape(node: Node, source: Node) -> str | None:
    before, after = tensor_value(source), tensor_value(node)
    if before is None or after is None:
        return f"'{node.name}' reshapes '{source.name}'; whether the shape changes needs metadata the graph does " \
               f"not carry"
    if not same_shape(before.shape, after.shape):
        return f"'{node.name}' changes the shape {tuple(before.shape)} to {tuple(after.shape)}"
    return None


def _holds_dropout(node: Node) -> str | None:
    named = canonical_arguments(node.op, node.target, node.args, node.kwargs)
    if named is None and node.op == "call_function" and node.target in _DROPOUT_FUNCTIONS:
        named = _dropout_arguments(node)
    if named is None or _inplace_flag(node):
        return f"'{node.name}' is a dropout fxrewrite cannot read the arguments of"
    p, train = named.get("p"), named.get("train", named.get("training"))
    if train is False or (isinstance(p, (int, float)) and not isinstance(p, bool) and p == 0):
        return None
    return f"'{node.name}' is an active dropout (p={p!r}, training={train!r})"


def _dropout_arguments(node: Node) -> dict[str, Any] | None:
    try:
        bound = inspect.signature(node.target).bind(*node.args, **node.kwargs)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    bound.apply_defaults()
    return dict(bound.arguments)


def _dropout_module(node: Node) -> Any:
    module = _submodule(node)
    return module if isinstance(module, torch.nn.modules.dropout._DropoutNd) else None


def _holds_dropout_module(node: Node) -> tuple[Node | None, str | None]:
    module = _dropout_module(node)
    source = node.args[0] if node.args else None
    if module is None or not isinstance(source, Node) or module.inplace:
        return None, None
    if not module.training or module.p == 0:
        return source, None
    return None, f"'{node.name}' calls the dropout module '{node.target}' in training mode (p={module.p})"


def _holds_scaling(node: Node, name: str) -> tuple[Node | None, str | None]:
    """``x * 1``, ``1 * x``, ``x / 1``: the value itself when the dtype and shape stay (``1.0 * x``
    promotes an integer ``x``; ``x * 1`` broadcasts nothing, but metadata says so for sure)."""
    args = node.args
    if len(args) != 2 or node.kwargs:
        return None, None
    ones = [i for i, a in enumerate(args) if _is_one(a)]
    if name == "div":
        ones = [i for i in ones if i == 1]
    source = args[1 - ones[0]] if len(ones) == 1 else None
    if not isinstance(source, Node):
        return None, None
    before, after = tensor_value(source), tensor_value(node)
    if before is None or after is None:
        return None, f"'{node.name}' scales '{source.name}' by 1; whether that keeps its dtype needs metadata"
    if before.dtype != after.dtype or not same_shape(before.shape, after.shape):
        return None, f"'{node.name}' scales '{source.name}' by 1 and changes its dtype or shape"
    return source, None


def _is_one(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == 1


def same_shape(a: Any, b: Any) -> bool:
    """Two shapes known to be equal (symbolic sizes compare by their expression, never by a
    guess)."""
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if isinstance(x, int) and isinstance(y, int):
            if x != y:
                return False
        elif str(x) != str(y):
            return False
    return True


# -- matching by meaning: arguments and respelled calls --------------------------------------
#
# Two calls mean the same when their arguments do: a dimension counted from the end or from the
# front of the known rank, the two dims of a transpose in either order, a reduction's ``dtype=``
# equal to its input's dtype or left out. Some calls are another op spelled differently:
# ``x[:, :, None]`` is ``unsqueeze(x, 2)``, ``x.mT`` and a permute swapping two dims are
# ``transpose``, ``1 / x`` is ``reciprocal(x)``. Only exact identities are here.

#: Per op, the arguments that name dimensions of its first tensor input (or of each of the
#: tensors it joins). ``unsqueeze`` and ``stack`` count them against one more dimension.
DIM_ARGUMENTS: Mapping[str, tuple[str, ...]] = {
    **{name: ("dim",) for name in (
        "softmax", "log_softmax", "_softmax", "_log_softmax", "sum", "mean", "amax", "amin", "argmax", "argmin",
        "prod", "cumsum", "cumprod", "logsumexp", "std", "var", "any", "all", "nansum", "nanmean", "squeeze",
        "unsqueeze", "cat", "concat", "concatenate", "stack", "select", "narrow", "slice", "index_select", "gather",
        "split", "split_with_sizes", "chunk", "unbind", "unflatten", "glu", "cummax", "cummin", "logcumsumexp",
        "max", "min", "median", "nanmedian", "mode", "kthvalue", "topk", "sort", "argsort", "diff", "norm",
        "var_mean", "std_mean", "count_nonzero", "size")},
    "transpose": ("dim0", "dim1"), "swapaxes": ("axis0", "axis1"), "swapdims": ("dim0", "dim1"),
    "permute": ("dims",), "flip": ("dims",), "roll": ("dims",), "flatten": ("start_dim", "end_dim"),
    "movedim": ("source", "destination"), "diagonal": ("dim1", "dim2"),
}
_ONE_MORE_DIM = frozenset({"unsqueeze", "stack"})
_JOINS = frozenset({"cat", "concat", "concatenate", "stack"})
_UNORDERED_PAIRS: Mapping[str, tuple[str, str]] = {"transpose": ("dim0", "dim1"), "swapaxes": ("axis0", "axis1"),
                                                   "swapdims": ("dim0", "dim1")}
#: Ops whose ``dtype=`` argument, equal to their input's dtype, is the same as no argument.
DTYPE_ARGUMENTS = frozenset({"softmax", "log_softmax", "sum", "mean", "prod", "cumsum", "cumprod", "nansum",
                             "nanmean", "logcumsumexp", "norm"})
_BY_MEANING = frozenset({*DIM_ARGUMENTS, *DTYPE_ARGUMENTS})
#: Op keys under which a node may be another op spelled differently (see :func:`respelled`).
_RESPELLABLE_KEYS: frozenset[Hashable] = frozenset({
    ("aten", "permute"), ("aten", "mT"), ("aten", "div"), ("call_function", operator.getitem),
    ("call_function", getattr),
})


def node_key(node: Node) -> Hashable:
    """The op key of what ``node`` computes: :func:`op_key_of` of its target, or of the op it is
    another spelling of (:func:`respelled`).

    >>> import torch.fx as fx
    >>> gm = fx.symbolic_trace(lambda x: (x[:, None], x.mT, 1 / x))
    >>> [node_key(n) for n in gm.graph.nodes if n.op == "call_function"]
    [('aten', 'unsqueeze'), ('aten', 'reciprocal'), ('aten', 'transpose')]
    """
    key = op_key_of(node.op, node.target)
    if key in _RESPELLABLE_KEYS or _in_place_key(key):
        found = respelled(node)
        if found is not None:
            return _respelled_key(found[0])
    return key


def node_keys(node: Node, canonical: bool = True) -> tuple[Hashable, ...]:
    """Every key a rule anchored at ``node`` may be filed under: :func:`node_key` first, then the
    key of the target as written when the node is another op respelled (a ``permute`` swapping
    two dims is a transpose, and still a permute to a rule about permutes). Without
    ``canonical``: the target as written only (torch.fx's notion of "same op")."""
    key = op_key_of(node.op, node.target, canonical)
    if canonical and (key in _RESPELLABLE_KEYS or _in_place_key(key)):
        found = respelled(node)
        if found is not None:
            return (_respelled_key(found[0]), key)
    return (key,)


_GETITEM_KEY: Hashable = ("call_function", operator.getitem)


def _respelled_key(name: str) -> Hashable:
    return _GETITEM_KEY if name == "getitem" else ("aten", name)


def _in_place_key(key: Hashable) -> bool:
    """The key of an in-place ATen op (``("aten", "div_")``)."""
    return (type(key) is tuple and len(key) == 2 and key[0] == "aten" and isinstance(key[1], str)
            and key[1].endswith("_") and not key[1].endswith("__"))


_INPUT_KEY_DEPTH = 4  # identities looked through when collecting the keys feeding a node


def input_keys(node: Node) -> frozenset[Hashable]:
    """The keys of what feeds ``node``, identities looked through (without proving them: a
    superset is all the driver's cheap pre-check needs), for :attr:`Pattern.anchor_input_keys`."""
    keys: set[Hashable] = set()
    for a in node.all_input_nodes:
        for _ in range(_INPUT_KEY_DEPTH):
            keys.update(node_keys(a))
            if not may_be_identity(a) or not a.args or not isinstance(a.args[0], Node):
                break
            a = a.args[0]
    return frozenset(keys)


def respelled(node: Node) -> tuple[str, dict[str, Any]] | None:
    """``(op, arguments)`` when ``node`` computes an ATen op under another spelling: an index
    that only inserts one dimension (``x[:, :, None]``, ``x[..., None]``) is ``unsqueeze``;
    ``x.mT`` and a ``permute`` that swaps two dims are ``transpose``; ``1 / x`` is ``reciprocal``;
    ``x.shape[d]`` is ``size``; the ``.values`` and ``.indices`` of a reduction's result
    (``x.max(d).values``) are its elements 0 and 1 (``getitem``, as export writes them).

    >>> x = torch.fx.Graph().placeholder("x")
    >>> respelled(torch.fx.Graph().call_function(operator.getitem, (x, (slice(None), None))))
    ('unsqueeze', {'self': x, 'dim': 1})
    """
    if node.op == "call_function" and node.target is operator.getitem:
        return _index_as_unsqueeze(node)
    if node.op == "call_function" and node.target is getattr:
        source, attribute = node.args[0], node.args[1]
        if not isinstance(source, Node):
            return None
        if attribute == "mT":
            return _matrix_transpose(source)
        if attribute in ("values", "indices") and _returns_values_and_indices(source):
            return "getitem", {"#0": source, "#1": 0 if attribute == "values" else 1}
        return ("size", {"self": source}) if attribute == "shape" else None
    name = canonical_name(node.op, node.target)
    if name == "mT" and node.args and isinstance(node.args[0], Node):
        return _matrix_transpose(node.args[0])
    if name is not None and _in_place_key(("aten", name)):
        return _in_place_as_functional(node, name)
    if name == "div":
        return _one_over(node)
    if name == "permute":
        return _permute_as_transpose(node)
    return None


#: Ops returning a ``(values, indices)`` named tuple.
_VALUES_AND_INDICES = frozenset({"max", "min", "sort", "topk", "mode", "median", "nanmedian", "kthvalue", "cummax",
                                 "cummin", "aminmax"})


def _returns_values_and_indices(node: Node) -> bool:
    return node.op in ("call_function", "call_method") and canonical_name(node.op, node.target) in _VALUES_AND_INDICES


def _matrix_transpose(source: Node) -> tuple[str, dict[str, Any]] | None:
    """``x.mT`` is ``x.transpose(-2, -1)`` on 2 or more dimensions. Not where the metadata knows
    fewer: on a 1-d tensor both raise, but on a 0-d tensor ``x.mT`` is ``x`` (deprecated, with a
    warning) where the transpose raises. Without metadata the rank is taken to be 2 or more, as
    ``k.mT`` in the code people write (``q @ k.mT``) needs."""
    known = tensor_value(source)
    if known is not None and len(known.shape) < 2:
        return None
    return "transpose", {"self": source, "dim0": -2, "dim1": -1}


def _index_as_unsqueeze(node: Node) -> tuple[str, dict[str, Any]] | None:
    source, index = node.args[0], node.args[1]
    if not isinstance(source, Node) or node.kwargs:
        return None
    if (isinstance(index, int) and not isinstance(index, bool) and source.op == "call_function"
            and source.target is getattr and source.args[1:] == ("shape",) and isinstance(source.args[0], Node)):
        return "size", {"self": source.args[0], "dim": index}  # x.shape[d] is x.size(d)
    entries = index if isinstance(index, tuple) else (index,)
    if sum(e is None for e in entries) != 1 or not all(e is None or e is Ellipsis or _full_slice(e) for e in entries):
        return None
    if not isinstance(index, tuple) and index is not None:
        return None
    at = entries.index(None)
    if Ellipsis in entries:
        if entries.count(Ellipsis) != 1 or entries.index(Ellipsis) > at:
            return None
        dim = at - len(entries)  # counted from the end: x[..., None, :] inserts at -2
    else:
        dim = at
    return "unsqueeze", {"self": source, "dim": dim}


def _in_place_as_functional(node: Node, name: str) -> tuple[str, dict[str, Any]] | None:
    """``a.div_(s)`` where nothing but this call ever sees ``a`` (a fresh tensor no other node
    reads, views or writes) computes what ``a.div(s)`` computes: no one can observe the write
    (Falcon's ``scores /= math.sqrt(d)``, as torch.export keeps it)."""
    functional = name[:-1]
    source = node.args[0] if node.args else None
    if not isinstance(source, Node) or not hasattr(torch.ops.aten, functional):
        return None
    if source.op not in ("call_function", "call_method") or list(source.users) != [node]:
        return None
    if aliased_inputs(source) or result_kind(source) != "tensor" or mutation(source) is not None:
        return None  # a view of something else, or an in-place result itself: the write is seen elsewhere
    found = _resolve(getattr(torch.ops.aten, functional), node.args, node.kwargs)
    return None if found is None else (functional, found[1])


def _full_slice(entry: Any) -> bool:
    return isinstance(entry, slice) and entry.start is None and entry.stop is None and entry.step is None


def _one_over(node: Node) -> tuple[str, dict[str, Any]] | None:
    if len(node.args) != 2 or node.kwargs or not _is_one(node.args[0]) or not isinstance(node.args[1], Node):
        return None
    if result_kind(node.args[1]) == "value":
        return None  # 1 / n of a Python number is Python arithmetic
    return "reciprocal", {"self": node.args[1]}


def _permute_as_transpose(node: Node) -> tuple[str, dict[str, Any]] | None:
    named = canonical_arguments(node.op, node.target, node.args, node.kwargs)
    if named is None or not isinstance(named.get("self"), Node):
        return None
    dims = named["dims"]
    if not isinstance(dims, (list, tuple)) or not all(isinstance(d, int) and not isinstance(d, bool) for d in dims):
        return None
    rank = len(dims)
    positive = [d % rank if -rank <= d < rank else None for d in dims]
    if None in positive or sorted(positive) != list(range(rank)):  # type: ignore[type-var]
        return None
    moved = [i for i, d in enumerate(positive) if d != i]
    if len(moved) != 2:
        return None
    return "transpose", {"self": named["self"], "dim0": moved[0] - rank, "dim1": moved[1] - rank}


def by_meaning(name: str, names: tuple[str, ...], p_values: tuple[Any, ...], g_values: tuple[Any, ...],
               graph_input: Any) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """The lined-up argument values of a pattern call and a graph call of op ``name``, with the
    constants the pattern writes put in the form their meaning has on the graph's input
    (``graph_input``, the value the op reads): dims counted from the end of its rank, the two
    dims of a transpose in order, a ``dtype=`` equal to its dtype dropped. A pattern's captures
    (nodes) and the graph values facing them stay as written, so a capture binds what the graph
    says.

    >>> x = torch.fx.Graph().placeholder("x")
    >>> by_meaning("transpose", ("self", "dim0", "dim1"), (x, -1, -2), (x, 2, 3), None)
    ((x, -2, -1), (x, 2, 3))
    """
    if name not in _BY_MEANING:
        return p_values, g_values
    known = tensor_value(graph_input)
    rank = None if known is None else len(known.shape) + (name in _ONE_MORE_DIM)
    dtype = None if known is None else known.dtype
    p_out, g_out = list(p_values), list(g_values)
    dims = DIM_ARGUMENTS.get(name, ())
    for i, arg in enumerate(names):
        if any(isinstance(leaf, Node) for leaf in tree_leaves(p_out[i])):
            continue  # a capture binds the value as the graph writes it
        if arg in dims:
            p_out[i], g_out[i] = _dims_from_end(p_out[i], rank), _dims_from_end(g_out[i], rank)
        elif arg == "dtype" and name in DTYPE_ARGUMENTS and dtype is not None:
            p_out[i], g_out[i] = (None if v == dtype else v for v in (p_out[i], g_out[i]))
    pair = _UNORDERED_PAIRS.get(name)
    if pair is not None and pair[0] in names and pair[1] in names:
        first, second = names.index(pair[0]), names.index(pair[1])
        if isinstance(p_out[first], Node) or isinstance(p_out[second], Node):
            return tuple(p_out), tuple(g_out)  # captures bind the dims as the graph writes them
        for values in (p_out, g_out):
            a, b = values[first], values[second]
            if isinstance(a, int) and isinstance(b, int) and a > b:
                values[first], values[second] = b, a
    return tuple(p_out), tuple(g_out)


def _dims_from_end(value: Any, rank: int | None) -> Any:
    """A dim (or list of dims) counted from the end of ``rank`` dimensions (unknown rank: as given)."""
    if isinstance(value, bool) or rank is None:
        return value
    if isinstance(value, int):
        return value - rank if 0 <= value < rank else value
    if isinstance(value, (list, tuple)) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return type(value)(v - rank if 0 <= v < rank else v for v in value)
    return value


def meaning_input(name: str, named_or_values: Any) -> Any:
    """The value whose rank and dtype an op's dims and ``dtype=`` refer to: its first tensor
    argument, or the first of the tensors it joins."""
    first = named_or_values[0] if named_or_values else None
    if name in _JOINS and isinstance(first, (list, tuple)):
        return first[0] if first else None
    return first


# -- constants held in tensors ---------------------------------------------------------------

#: Calls a one-element tensor constant passes through unchanged on its way into a computation
#: (``torch.tensor(-1e9)`` in ``forward`` exports as ``detach_(lift_fresh_copy(c))``).
_CONSTANT_WRAPPERS = frozenset({"lift_fresh_copy", "detach", "detach_", "clone", "alias"})


def constant_scalar(node: Any) -> Any:
    """The number a 0-d tensor constant holds, when ``node`` is one (a module attribute, or an
    exported program's lifted constant whose value :mod:`fxrewrite.exported` lends as
    ``meta["fxrewrite_constant"]``), seen through the copies and identities in front of it;
    ``None`` otherwise. A literal capture (``m: float``) binds it as it binds a written number.

    >>> gm = torch.fx.GraphModule(torch.nn.Module(), torch.fx.Graph())
    >>> gm.register_buffer("c", torch.tensor(-1e9))
    >>> c = gm.graph.get_attr("c")
    >>> constant_scalar(gm.graph.call_function(torch.ops.aten.detach.default, (c,)))
    -1000000000.0
    """
    for _ in range(_INPUT_KEY_DEPTH * 2):
        if not isinstance(node, Node):
            return None
        if node.op in ("placeholder", "get_attr"):
            value = lent_constant(node) if node.op == "placeholder" else _attribute_value(node)
            if isinstance(value, torch.Tensor) and value.dim() == 0 and not value.is_complex():
                return value.item()
            return None
        name = canonical_name(node.op, node.target) if node.op != "call_method" else str(node.target)
        if name in _CONSTANT_WRAPPERS and node.args:
            node = node.args[0]
            continue
        source = identity_source(node)
        if source is None:
            return None
        node = source
    return None
