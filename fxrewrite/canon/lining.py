"""Lining up the arguments of two calls of one op, by schema and by meaning.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Mapping
from typing import Any

import torch
from torch.fx.node import Node

from .meaning import (
    _BY_MEANING,
    _GETITEM_KEY,
    _RESPELLABLE_KEYS,
    _in_place_key,
    by_meaning,
    meaning_input,
    node_key,
    respelled,
)
from .ops import op_key_of
from .schema import canonical_arguments, result_kind

__all__ = [
    "lined_up_arguments",
    "lined_up_as",
    "named_arguments",
    "plain_meaning",
]


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
    calls = pn.op in ("call_function", "call_method")
    return lined_up_as(pn, gn, _meaning_name(pn, gn) if canonical and calls else None, canonical)


def lined_up_as(pn: Node, gn: Node, meaning: str | None, canonical: bool = True, *,
                pattern_named: dict[str, Any] | None = None
                ) -> tuple[tuple[str, ...], tuple[Any, ...], tuple[Any, ...]] | None:
    """:func:`lined_up_arguments` with the op the calls compare as by meaning already decided
    (``meaning``: what ``_meaning_name(pn, gn)`` gives, or :func:`plain_meaning` of ``pn`` when
    ``gn`` is no other op respelled), and ``pn``'s arguments by name (:func:`named_arguments`)
    given when known: the matcher's compiled walk works both out once per pattern node."""
    if canonical and pn.op in ("call_function", "call_method"):
        if meaning is not None:
            return _lined_up_by_meaning(meaning, pn, gn, pattern_named)
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
    if p_key != _GETITEM_KEY and p_key[0] != "aten":  # type: ignore[index]
        return None
    g_key = node_key(gn)
    g_respelled = g_key != op_key_of(gn.op, gn.target)
    if p_key == _GETITEM_KEY:
        respelled_either = p_key != op_key_of(pn.op, pn.target) or g_respelled
        return "getitem" if respelled_either and g_key == p_key else None
    name = p_key[1]  # type: ignore[index]
    if name in _BY_MEANING or g_respelled or p_key != op_key_of(pn.op, pn.target):
        return name if g_key == p_key else None
    return None


def plain_meaning(pn: Node) -> str | None:
    """What :func:`_meaning_name` gives for ``pn`` and any graph node ``gn`` that computes
    ``node_key(pn)`` and is no other op respelled (``node_key(gn) == op_key_of(gn.op, gn.target)``):
    it then depends on the pattern node alone."""
    p_key = node_key(pn)
    p_respelled = p_key != op_key_of(pn.op, pn.target)
    if p_key == _GETITEM_KEY:
        return "getitem" if p_respelled else None
    if p_key[0] != "aten":  # type: ignore[index]
        return None
    name = p_key[1]  # type: ignore[index]
    return name if name in _BY_MEANING or p_respelled else None


def _lined_up_by_meaning(name: str, pn: Node, gn: Node, p_named: dict[str, Any] | None = None
                         ) -> tuple[tuple[str, ...], tuple[Any, ...], tuple[Any, ...]] | None:
    if p_named is None:
        p_named = named_arguments(pn)
    g_named = named_arguments(gn)
    if p_named is None or g_named is None or p_named.keys() != g_named.keys():
        return None
    names = tuple(p_named)
    g_values = tuple(g_named[k] for k in names)
    p_values, g_meant = by_meaning(name, names, tuple(p_named.values()), g_values, meaning_input(name, g_values))
    return names, p_values, g_meant


def named_arguments(node: Node) -> dict[str, Any] | None:
    """The arguments of a call by name, as calls compared by meaning line them up: those of the op
    it is a respelling of, else by ATen schema (``#0``, ``#1`` for a plain ``getitem``)."""
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
