"""Hypothesis strategies for property-testing rewrite rules.

:func:`tensors` draws tensors whose values include the ones that break rules (``0``, ``-0.0``,
``±inf``, ``nan``, the largest and smallest floats, negatives, integer extremes);
:func:`inputs_for` draws every argument of a rule's pattern at once — tensors of related
shapes (equal, broadcastable through size-1 and missing dimensions, different ranks) and
dtypes, literal captures of their declared type, and modules for module captures — keeping
only draws on which the pattern runs and the rule's ``where=`` guards hold.

>>> import torch
>>> from hypothesis import given
>>> @given(tensors(dtypes=torch.float32, shapes=(2, 3)))
... def test_shape(t):
...     assert t.shape == (2, 3) and t.dtype == torch.float32
>>> test_shape()

What :func:`inputs_for` draws is shaped by the rule's ``domain`` declaration, a dict whose
keys are listed in :data:`DOMAIN_KEYS` (see ``docs/testing.md``). Shrinking leads to small,
simple inputs: rank 0 or 1, size-1 dimensions, one dtype, values ``0``, ``1``, ``inf``...

This module is the public face of the strategies; the code lives in private modules, one job
each, imported in this order (each one only from those before it):

* ``_values``: numbers, shapes and tensors (:func:`elements`, :func:`tensor_shapes`,
  :func:`tensors`, :func:`ulp_neighbours`);
* ``_domain``: the ``domain`` declaration parsed (:class:`Domain`, :data:`DOMAIN_KEYS`);
* ``_nn_modules``: modules for module captures (:func:`default_module`, :func:`fit_input_shape`);
* ``_running``: a rule's pattern and guards run on concrete values (:func:`call_rule_function`,
  :class:`GuardHarness`, :func:`match_for`, :class:`GuardRaised`);
* ``_sizes``: the sizes of a view or reshape that fit its input (:func:`fitting_sizes`);
* ``_plan``: what is drawn for one rule, and the drawing (:class:`InputPlan`, :func:`accepts`);
* ``_probing``: the dtypes and ranks on which a rule's pattern runs, tried before searching;
* ``_inputs``: the entry points (:func:`plan_inputs`, :func:`inputs_for`).
"""

from __future__ import annotations

from ._domain import _INPUT_KEYS as _INPUT_KEYS  # read by tests/dsl: the DSL's settings are the tester's
from ._domain import DOMAIN_KEYS, Domain
from ._domain import ShapeMode as ShapeMode
from ._domain import TensorDomain as TensorDomain
from ._inputs import inputs_for, plan_inputs
from ._nn_modules import default_module as default_module
from ._nn_modules import fit_input_shape as fit_input_shape
from ._plan import InputPlan
from ._plan import accepts as accepts
from ._running import GuardHarness, GuardRaised, call_rule_function, match_for
from ._values import DEFAULT_DTYPES, elements, tensor_shapes, tensors
from ._values import DTYPE_SEPARATORS as DTYPE_SEPARATORS
from ._values import MAX_DISTINCT_VALUES as MAX_DISTINCT_VALUES
from ._values import ulp_neighbours as ulp_neighbours

__all__ = [
    "DEFAULT_DTYPES",
    "DOMAIN_KEYS",
    "Domain",
    "GuardHarness",
    "GuardRaised",
    "InputPlan",
    "call_rule_function",
    "elements",
    "inputs_for",
    "match_for",
    "plan_inputs",
    "tensor_shapes",
    "tensors",
]
