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

The package is the one authority on what an operation means; each module answers one kind of
question, and each imports only the ones above it in this list:

- :mod:`~fxrewrite.canon.ops`: names and op keys, the Python operators and functionals that are
  ATen ops, literals, dtype conversions, checks, the Tensor-API tables;
- :mod:`~fxrewrite.canon.schema`: calls read through the ATen schema (binding, overloads, the
  kind of value a node computes, ATen spelling);
- :mod:`~fxrewrite.canon.effects`: writes and aliasing;
- :mod:`~fxrewrite.canon.identities`: ops that may leave their input unchanged;
- :mod:`~fxrewrite.canon.meaning`: op keys of graph nodes, respelled calls, arguments by meaning;
- :mod:`~fxrewrite.canon.lining`: two calls of one op, lined up argument by argument.

Import from ``fxrewrite.canon``: the names below are its API, wherever they live.
"""

from __future__ import annotations

from .effects import (
    AUTOGRAD_ONLY_WRITES,
    alias_class,
    aliased_inputs,
    is_written,
    mutation,
    writers_of,
    writes_in_place,
    written_arguments,
)
from .identities import (
    IDENTITIES,
    attribute_at,
    identity_refusal,
    identity_source,
    known_floating,
    may_be_identity,
    pattern_identity,
    same_shape,
    through_identities,
)
from .lining import lined_up_arguments, lined_up_as, named_arguments, plain_meaning
from .meaning import (
    DIM_ARGUMENTS,
    DTYPE_ARGUMENTS,
    by_meaning,
    constant_scalar,
    input_keys,
    meaning_input,
    node_key,
    node_keys,
    respelled,
)
from .ops import (
    ALIASES,
    COMMUTATIVE,
    CONVERSION_METHODS,
    FUNCTIONALS,
    IGNORED_ARGUMENTS,
    METADATA_ATTRIBUTES,
    METADATA_METHODS,
    OPERATORS,
    VALUE_ATTRIBUTES,
    VALUE_METHODS,
    VIEW_ATTRIBUTES,
    canonical_name,
    dtype_conversion,
    is_aten_graph,
    is_check,
    op_key_of,
    same_literal,
)
from .schema import (
    ResultKind,
    aten_overload,
    aten_spelling,
    canonical_arguments,
    is_commutative_call,
    result_kind,
)

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
    "lined_up_as",
    "may_be_identity",
    "meaning_input",
    "mutation",
    "named_arguments",
    "node_key",
    "node_keys",
    "op_key_of",
    "pattern_identity",
    "plain_meaning",
    "respelled",
    "result_kind",
    "same_literal",
    "same_shape",
    "through_identities",
    "writers_of",
    "writes_in_place",
    "written_arguments",
]
