"""Matching by meaning, identities: ops that may leave their input unchanged (a cast to the
dtype it has, inactive dropout, an unwritten copy, ...), what is known about floating point
without metadata.
"""

from __future__ import annotations

import inspect
import operator
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch.fx.node import Node

from ..meta import described, tensor_value
from .effects import _held_in, _inplace_flag, _submodule, is_written
from .ops import canonical_name, dtype_conversion
from .schema import _KIND_BUDGET, _PYTHON_ARITHMETIC, canonical_arguments

__all__ = [
    "IDENTITIES",
    "attribute_at",
    "identity_refusal",
    "identity_source",
    "known_floating",
    "may_be_identity",
    "pattern_identity",
    "same_shape",
    "through_identities",
]


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
    op = node.op
    if op == "call_module":
        return _dropout_module(node) is not None
    if op != "call_function" and op != "call_method":
        return False
    if FAST_IDENTITY_TEST:
        try:  # the matcher asks this of every graph node it meets
            return _identity_targets[op, node.target]
        except KeyError:
            found = _identity_targets[op, node.target] = _may_be_identity_call(op, node.target)
            return found
        except TypeError:  # an unhashable target
            pass
    return _may_be_identity_call(op, node.target)


def _may_be_identity_call(op: str, target: Any) -> bool:
    return canonical_name(op, target) in _IDENTITY_NAMES or _is_dropout_function(target)


#: Read :func:`may_be_identity`'s answer for calls from :data:`_identity_targets`; ``False`` (the
#: slow twin): work it out at every call (``tests/test_match_compiled.py`` checks they agree).
FAST_IDENTITY_TEST = True
#: ``(op, target) -> bool`` for calls: the answer depends on the target alone, so it never goes stale.
_identity_targets: dict[tuple[str, Any], bool] = {}


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
