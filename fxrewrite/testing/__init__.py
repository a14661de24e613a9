"""Property-test rewrite rules and rewritten programs with Hypothesis.

>>> import torch
>>> from fxrewrite import Rule
>>> from fxrewrite.testing import check_rule
>>> rule = Rule.from_functions(lambda x: x / x, lambda x: torch.ones_like(x), name="div_self")
>>> result = check_rule(rule, max_examples=50)
>>> result.ok, result.counterexample["x"]
(False, tensor(0.))

* :func:`check_rule` / :func:`assert_rule_equivalent`: is a rule's replacement equivalent to
  its pattern? A counterexample is shrunk and reported in full.
* :func:`inputs_for`, :func:`tensors`, :func:`tensor_shapes`, :func:`elements`: the strategies.
* :func:`assert_equivalent`, :func:`compare` (from :mod:`fxrewrite.verify`): whole programs.
* the pytest plugin (``pytest rules/``) and ``fxrewrite check`` build on :func:`check_rule`.

Importing this package imports Hypothesis; ``import fxrewrite`` does not.
"""

from __future__ import annotations

from ..verify import assert_equivalent, compare, format_value
from .equivalence import CheckResult, Counterexample, Tolerance, assert_rule_equivalent, check_rule, evaluate
from .strategies import DEFAULT_DTYPES, DOMAIN_KEYS, Domain, elements, inputs_for, tensor_shapes, tensors

__all__ = [
    "DEFAULT_DTYPES",
    "DOMAIN_KEYS",
    "CheckResult",
    "Counterexample",
    "Domain",
    "Tolerance",
    "assert_equivalent",
    "assert_rule_equivalent",
    "check_rule",
    "compare",
    "elements",
    "evaluate",
    "format_value",
    "inputs_for",
    "tensor_shapes",
    "tensors",
]
