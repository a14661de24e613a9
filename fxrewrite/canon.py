"""Operation keys and the commutative-op table.

An *op key* names what a graph node computes, in a form that can index rules: the matcher
only tries a rule at a node whose op key equals the key of the rule's anchor. Keys are
plain hashable tuples:

>>> import operator, torch
>>> op_key_of("call_function", operator.add)
('call_function', <built-in function add>)
>>> op_key_of("call_method", "transpose")
('call_method', 'transpose')
>>> op_key_of("call_module", "encoder.layers.0")   # modules are matched by isinstance
('call_module',)
>>> op_key_of("get_attr", "weight")                 # attributes are matched by value type
('get_attr',)

A commutative node's first two positional operands may be swapped without changing the
value, provided it has no keyword arguments (``torch.add(x, y, alpha=2)`` is not symmetric):

>>> is_commutative_call("call_function", operator.mul, (1, 2), {})
True
>>> is_commutative_call("call_function", torch.add, (1, 2), {"alpha": 2})
False
"""

from __future__ import annotations

import operator
from collections.abc import Hashable, Mapping
from typing import Any

import torch

__all__ = ["COMMUTATIVE_FUNCTIONS", "COMMUTATIVE_METHODS", "is_commutative_call", "op_key_of"]

#: Functions whose two positional operands commute (when called without keyword arguments).
COMMUTATIVE_FUNCTIONS: frozenset[Any] = frozenset(
    {
        operator.add,
        operator.mul,
        operator.and_,
        operator.or_,
        operator.xor,
        operator.eq,
        operator.ne,
        torch.add,
        torch.mul,
        torch.maximum,
        torch.minimum,
        torch.eq,
        torch.ne,
        torch.logical_and,
        torch.logical_or,
        torch.logical_xor,
        torch.bitwise_and,
        torch.bitwise_or,
        torch.bitwise_xor,
    }
)

#: ``Tensor`` methods whose receiver and single operand commute.
COMMUTATIVE_METHODS: frozenset[str] = frozenset(
    {
        "add",
        "mul",
        "maximum",
        "minimum",
        "eq",
        "ne",
        "logical_and",
        "logical_or",
        "logical_xor",
        "bitwise_and",
        "bitwise_or",
        "bitwise_xor",
    }
)


def op_key_of(op: str, target: Any) -> Hashable:
    """The index key of a node with opcode ``op`` and ``target``."""
    if op in ("call_module", "get_attr"):
        return (op,)
    return (op, target)


def is_commutative_call(op: str, target: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> bool:
    """True when swapping ``args[0]`` and ``args[1]`` of this call leaves its value unchanged."""
    if len(args) != 2 or kwargs:
        return False
    if op == "call_function":
        return target in COMMUTATIVE_FUNCTIONS
    if op == "call_method":
        return target in COMMUTATIVE_METHODS
    return False
