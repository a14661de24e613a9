"""Matching by meaning, spellings: op keys of nodes, calls that are another op respelled
(``x[:, None]`` is ``unsqueeze``), and arguments compared by meaning (dims from the end), and
the numbers 0-d tensor constants hold.
"""

from __future__ import annotations

import operator
from collections.abc import Hashable, Mapping
from typing import Any

import torch
from torch.fx.node import Node

from .._torch import tree_leaves
from ..meta import lent_constant, tensor_value
from .effects import aliased_inputs, mutation
from .identities import _attribute_value, _is_one, identity_source, may_be_identity
from .ops import canonical_name, op_key_of
from .schema import _resolve, canonical_arguments, result_kind

__all__ = [
    "DIM_ARGUMENTS",
    "DTYPE_ARGUMENTS",
    "by_meaning",
    "constant_scalar",
    "input_keys",
    "input_target",
    "meaning_input",
    "node_key",
    "node_keys",
    "respelled",
    "target_key",
]


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
    if FAST_KEYS:
        try:
            return _plain_keys[node.op, node.target][0]
        except (KeyError, TypeError):
            pass
    key = op_key_of(node.op, node.target)
    if key in _RESPELLABLE_KEYS or _in_place_key(key):
        found = respelled(node)
        if found is not None:
            return _respelled_key(found[0])
    else:
        _file_plain(node.op, node.target, key)
    return key


def node_keys(node: Node, canonical: bool = True) -> tuple[Hashable, ...]:
    """Every key a rule anchored at ``node`` may be filed under: :func:`node_key` first, then the
    key of the target as written when the node is another op respelled (a ``permute`` swapping
    two dims is a transpose, and still a permute to a rule about permutes). Without
    ``canonical``: the target as written only (torch.fx's notion of "same op")."""
    if canonical and FAST_KEYS:
        try:  # the hot path: asked ~30k times in a rewrite of 8k nodes
            return _plain_keys[node.op, node.target]
        except (KeyError, TypeError):
            pass
    key = op_key_of(node.op, node.target, canonical)
    if canonical and (key in _RESPELLABLE_KEYS or _in_place_key(key)):
        found = respelled(node)
        if found is not None:
            return (_respelled_key(found[0]), key)
    elif canonical:
        _file_plain(node.op, node.target, key)
    return (key,)


#: Use :data:`_plain_keys` (the keys of targets that no call of can be another op respelled);
#: ``False`` is the slow twin, the key worked out anew at every call (``tests/canon/test_meaning.py``
#: checks both agree on every node of traced, exported and rewritten graphs).
FAST_KEYS = True
#: ``(op, target) -> (key,)`` for the targets whose key is neither respellable nor in place: their
#: nodes' keys depend on the target alone, never on arguments, users or metadata, so the entry
#: never goes stale (targets are only added; a graph's nodes never change their op or target).
_plain_keys: dict[tuple[str, Any], tuple[Hashable, ...]] = {}


def _file_plain(op: str, target: Any, key: Hashable) -> None:
    try:
        _plain_keys[op, target] = (key,)
    except TypeError:  # an unhashable target
        pass


def target_key(op: str, target: Any) -> Hashable | None:
    """The one key :func:`node_keys` gives every node with opcode ``op`` calling ``target``,
    whatever its arguments, users or metadata; ``None`` where a call of it may be another op
    respelled (its keys then depend on its arguments).

    >>> import torch
    >>> target_key("call_function", torch.neg), target_key("call_function", operator.getitem)
    (('aten', 'neg'), None)
    """
    key = op_key_of(op, target)
    if key in _RESPELLABLE_KEYS or _in_place_key(key):
        return None
    return key


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
    superset is all the driver's cheap pre-check needs), for :attr:`Pattern.anchor_input_keys`.
    An input whose target :data:`_plain_inputs` files is read from it (:data:`FAST_KEYS`)."""
    keys: list[Hashable] = []
    plain = _plain_inputs.get if FAST_KEYS else None
    for a in node._input_nodes:  # (fx's dict behind all_input_nodes, in the same order: no list built)
        if plain is not None:
            try:  # (asked at every visit of the driver: one look-up per input, where it can)
                found = plain((a.op, a.target))
            except TypeError:  # an unhashable target
                found = None
            if found is not None:
                keys += found
                continue
        keys += node_keys(a)
        _file_plain_input(a)
        depth = 1  # (no loop or set per input where nothing is looked through)
        while depth < _INPUT_KEY_DEPTH and may_be_identity(a) and a.args and isinstance(a.args[0], Node):
            a = a.args[0]
            keys += node_keys(a)
            depth += 1
    return frozenset(keys)


#: ``(op, target) -> keys`` of the inputs :func:`input_keys` reads without asking
#: :func:`node_keys` and :func:`~fxrewrite.canon.identities.may_be_identity`: targets whose keys
#: are plain (:data:`_plain_keys`) and that no call of can be an identity (a function or method
#: :func:`may_be_identity` refuses by its target alone, a placeholder, an attribute); never stale,
#: as :data:`_plain_keys`.
_plain_inputs: dict[tuple[str, Any], tuple[Hashable, ...]] = {}
_TARGET_ONLY_IDENTITY = frozenset({"call_function", "call_method", "placeholder", "get_attr"})


def input_target(node: Node) -> tuple[str, Any] | None:
    """``(op, target)`` of ``node``'s one input node when that alone decides :func:`input_keys`
    of ``node`` (the input's target is filed in :data:`_plain_inputs`: its keys are its target's
    and no call of it is an identity to look through); else ``None``. A caller may keep what it
    worked out from ``input_keys(node)`` under it."""
    inputs = node._input_nodes
    if len(inputs) != 1:
        return None
    for a in inputs:
        target = (a.op, a.target)
        try:
            return target if target in _plain_inputs else None
        except TypeError:  # an unhashable target
            return None
    return None


def _file_plain_input(node: Node) -> None:
    if node.op not in _TARGET_ONLY_IDENTITY or may_be_identity(node):
        return
    try:
        keys = _plain_keys.get((node.op, node.target))
        if keys is not None:
            _plain_inputs[node.op, node.target] = keys
    except TypeError:  # an unhashable target
        pass


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
        if _holds_node(p_out[i]):
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


_LEAF_TYPES = frozenset({int, float, bool, str, type(None), torch.dtype})


def _holds_node(value: Any) -> bool:
    """Is a graph value among the leaves of ``value`` (``tree_leaves``)? A number, string, dtype
    or ``None`` is a leaf of its own, so it is answered without flattening."""
    kind = type(value)
    if kind is Node:
        return True
    if kind in _LEAF_TYPES:
        return False
    return any(isinstance(leaf, Node) for leaf in tree_leaves(value))


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
