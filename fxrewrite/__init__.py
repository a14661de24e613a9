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

from .analysis import Finding, analyze
from .compat import replace_pattern, replace_pattern_with_filters
from .errors import (
    ArgumentError,
    DidNotConverge,
    FxRewriteError,
    MetadataError,
    NotEquivalent,
    RewriteError,
    RuleDefinitionError,
    RuleLoadError,
    RuleSyntaxError,
    RuleWarning,
    TargetError,
)
from .explain import Explanation, explain, find_matches
from .loader import load_rules, parse_rules
from .match import Match, TensorView
from .pattern import Accept
from .report import Report, RewriteResult, RuleStats
from .rewrite import rewrite
from .rule import Rule, RuleSet, rule

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

__version__ = "0.1.0"

_LAZY = {"backend": "inductor", "inductor_pass": "inductor"}  # torch._inductor takes seconds to import


def __getattr__(name: str) -> object:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'fxrewrite' has no attribute '{name}'")
