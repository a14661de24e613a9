"""Property-test rewrite rules and rewritten programs with Hypothesis.

>>> import torch
>>> from fxrewrite import Rule
>>> from fxrewrite.testing import check_rule
>>> rule = Rule.from_functions(lambda x: x / x, lambda x: torch.ones_like(x), name="div_self")
>>> result = check_rule(rule, max_examples=50)
>>> result.ok, result.counterexample["x"]
(False, tensor(0.))

* :func:`check_rule` / :func:`assert_rule_equivalent`: is a rule's replacement equivalent to
  its pattern? Counterexamples are shrunk and reported in full.
* :func:`inputs_for`, :func:`tensors`, :func:`tensor_shapes`, :func:`elements`: the strategies.
* :func:`assert_equivalent`, :func:`compare` (from :mod:`fxrewrite.verify`): whole programs.
* the pytest plugin (``pytest rules/``, :mod:`fxrewrite.testing.plugin`) and ``fxrewrite
  check`` (:mod:`fxrewrite.testing.check_cli`) build on :func:`check_rule`.

The names are imported on first use, so that loading the pytest plugin (a submodule) does
not import Hypothesis; ``import fxrewrite`` never does.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..verify import assert_equivalent, compare, format_value
    from .equivalence import CheckResult, Counterexample, Tolerance, assert_rule_equivalent, check_rule, evaluate
    from .strategies import DEFAULT_DTYPES, DOMAIN_KEYS, Domain, elements, inputs_for, tensor_shapes, tensors

__all__ = [
    "CheckResult",
    "Counterexample",
    "DEFAULT_DTYPES",
    "DOMAIN_KEYS",
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

_HOME = {
    **dict.fromkeys(("assert_equivalent", "compare", "format_value"), "fxrewrite.verify"),
    **dict.fromkeys(("CheckResult", "Counterexample", "Tolerance", "assert_rule_equivalent", "check_rule", "evaluate"),
                    "fxrewrite.testing.equivalence"),
    **dict.fromkeys(("DEFAULT_DTYPES", "DOMAIN_KEYS", "Domain", "elements", "inputs_for", "tensor_shapes", "tensors"),
                    "fxrewrite.testing.strategies"),
}


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'fxrewrite.testing' has no attribute '{name}'; it exports {__all__}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
