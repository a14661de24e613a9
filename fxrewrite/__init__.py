"""fxrewrite: subgraph pattern-rewriting rules for PyTorch programs, built on torch.fx.

>>> import torch, fxrewrite
>>> @fxrewrite.rule
... def double_neg(x):
...     "Replaces neg(neg(x)) by x."
...     return torch.neg(torch.neg(x))
>>> @double_neg.replacement
... def double_neg(x):
...     return x
>>> result = fxrewrite.rewrite(lambda a: torch.neg(torch.neg(a)) + 1, double_neg)
>>> print(result.code.strip())
def forward(self, a):
    add = a + 1;  a = None
    return add
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

from .errors import (
    ArgumentError,
    DidNotConverge,
    FxRewriteError,
    MetadataError,
    NotEquivalent,
    Refuse,
    RewriteError,
    RuleDefinitionError,
    RuleLoadError,
    RuleSyntaxError,
    RuleWarning,
    TargetError,
)

if TYPE_CHECKING:
    from .analysis import Finding, analyze
    from .compat import replace_pattern, replace_pattern_with_filters
    from .explain import Explanation, explain, find_matches
    from .inductor import backend, inductor_pass
    from .loader import load_rules, parse_rules
    from .match import Match, TensorView
    from .pattern import Accept
    from .report import Report, RewriteResult, RuleStats
    from .rewrite import rewrite
    from .rule import Rule, RuleSet, rule

# The public names of modules that import torch, imported on first use, so `fxrewrite --help`
# and `import fxrewrite.errors` do not import torch (torch._inductor alone takes seconds).
_LAZY = {
    "Accept": "pattern",
    "Explanation": "explain", "explain": "explain", "find_matches": "explain",
    "Finding": "analysis", "analyze": "analysis",
    "Match": "match", "TensorView": "match",
    "Report": "report", "RewriteResult": "report", "RuleStats": "report",
    "Rule": "rule", "RuleSet": "rule", "rule": "rule",
    "backend": "inductor", "inductor_pass": "inductor",
    "load_rules": "loader", "parse_rules": "loader",
    "replace_pattern": "compat", "replace_pattern_with_filters": "compat",
    "rewrite": "rewrite",
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'fxrewrite' has no attribute '{name}'")
    value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


class _Package(types.ModuleType):
    """Importing the submodules ``fxrewrite.rule``, ``.rewrite`` and ``.explain`` must not
    replace the functions of the same name on the package (the import system sets a submodule
    as an attribute of its parent)."""

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(value, types.ModuleType) and _LAZY.get(name) == name:
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package

__all__ = [
    "Accept",
    "ArgumentError",
    "DidNotConverge",
    "Explanation",
    "Finding",
    "FxRewriteError",
    "Match",
    "MetadataError",
    "NotEquivalent",
    "Refuse",
    "Report",
    "RewriteError",
    "RewriteResult",
    "Rule",
    "RuleDefinitionError",
    "RuleLoadError",
    "RuleSet",
    "RuleStats",
    "RuleSyntaxError",
    "RuleWarning",
    "TargetError",
    "TensorView",
    "__version__",
    "analyze",
    "backend",
    "explain",
    "find_matches",
    "inductor_pass",
    "load_rules",
    "parse_rules",
    "replace_pattern",
    "replace_pattern_with_filters",
    "rewrite",
    "rule",
]

from ._version import __version__  # noqa: E402  (one source, read by pyproject too)
