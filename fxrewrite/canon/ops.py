"""The names of operations: op keys, the Python operators and ``torch.nn.functional`` functions
that are ATen ops, literals, dtype conversions, checks, and the Tensor-API tables.
"""

from __future__ import annotations

import inspect
import math
import operator
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch.fx.node import Node

from ..meta import value_of

__all__ = [
    "ALIASES",
    "COMMUTATIVE",
    "CONVERSION_METHODS",
    "FUNCTIONALS",
    "IGNORED_ARGUMENTS",
    "METADATA_ATTRIBUTES",
    "METADATA_METHODS",
    "OPERATORS",
    "VALUE_ATTRIBUTES",
    "VALUE_METHODS",
    "VIEW_ATTRIBUTES",
    "canonical_name",
    "dtype_conversion",
    "is_aten_graph",
    "is_check",
    "op_key_of",
    "same_literal",
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
    try:
        if target not in _CONVERSION_TARGETS:  # most calls: three tuple scans and their lookups saved
            return None
    except TypeError:  # an unhashable target: the scans below
        pass
    if target in (torch.ops.aten.to.dtype, torch.ops.aten.to, torch.Tensor.to):
        return _converted(x, rest, kwargs, {"non_blocking": False, "copy": False, "memory_format": None})
    if target in (torch.ops.aten._to_copy.default, torch.ops.aten._to_copy):
        return _converted(x, rest, kwargs, _TO_COPY_DEFAULTS)
    if target in (torch.ops.prims.convert_element_type.default, torch.ops.prims.convert_element_type):
        return _converted(x, rest, kwargs, {})
    return None


#: Every target :func:`dtype_conversion` reads as a conversion (the checks there, in one set).
_CONVERSION_TARGETS: frozenset[Any] = frozenset({
    torch.ops.aten.to.dtype, torch.ops.aten.to, torch.Tensor.to, torch.ops.aten._to_copy.default,
    torch.ops.aten._to_copy, torch.ops.prims.convert_element_type.default, torch.ops.prims.convert_element_type,
})


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
    overload = torch._ops.OpOverload
    for n in nodes:  # noqa: SIM110 - a loop, not any() over a generator: asked at every splice
        if isinstance(n.target, overload):
            return True
    return False


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


#: Attributes that view their tensor (``x.T``, ``x.real``) and attributes that are Python values.
VIEW_ATTRIBUTES = frozenset({"T", "mT", "H", "mH", "real", "imag", "data"})
VALUE_ATTRIBUTES = frozenset({"shape", "dtype", "device", "ndim", "layout", "is_cuda", "requires_grad", "is_sparse",
                              "is_quantized", "is_meta", "names", "itemsize", "nbytes"})
#: The value attributes a tensor's metadata (a fake tensor) fixes, so a replacement may read them
#: at rewrite time (:mod:`fxrewrite.replace`); ``requires_grad`` and ``names`` may differ at run time.
METADATA_ATTRIBUTES = VALUE_ATTRIBUTES - {"requires_grad", "names"}

#: Tensor methods that compute Python values.
VALUE_METHODS = frozenset({"dim", "size", "numel", "item", "tolist", "stride", "element_size", "nelement",
                           "is_floating_point", "is_complex", "is_contiguous", "get_device", "data_ptr",
                           "storage_offset", "ndimension"})
#: The value methods a tensor's metadata answers (not ``item``, ``tolist``, ``data_ptr``: they read
#: the data; not ``stride``/``is_contiguous``: a replacement's own result may be laid out otherwise).
METADATA_METHODS = frozenset({"size", "dim", "numel", "is_floating_point", "is_complex", "element_size", "ndimension",
                              "nelement", "get_device"})
