"""What a rewrite did: per-rule counts, and the rewritten module with its code.

>>> import torch, fxrewrite
>>> r = fxrewrite.Rule.from_functions(lambda x: torch.neg(torch.neg(x)), lambda x: x, name="neg_neg")
>>> result = fxrewrite.rewrite(lambda a: torch.neg(torch.neg(a)), r)
>>> result.report.applied
{'neg_neg': 1}
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
import torch.fx as fx

__all__ = ["Report", "RewriteResult", "RuleStats"]


@attrs.frozen
class RuleStats:
    """What happened to one rule during a rewrite."""

    attempts: int = 0
    applied: int = 0
    rejected: int = 0
    seconds: float = 0.0
    reasons: tuple[str, ...] = ()


@attrs.frozen
class Report:
    """Per-rule counts of a :func:`rewrite` call.

    ``applied[name]`` is how often the rule fired; ``attempts[name]`` how many anchor
    candidates it was tried at; ``rejected[name]`` how many structural matches its guards
    refused (``reasons[name]`` says why, a few examples each).
    """

    stats: Mapping[str, RuleStats]
    rewrites: int
    seconds: float
    #: The last rewrite applied: rule name, origin and the graph node it replaced.
    last_rewrite: str | None = None

    @property
    def applied(self) -> Mapping[str, int]:
        return {name: s.applied for name, s in self.stats.items()}

    @property
    def attempts(self) -> Mapping[str, int]:
        return {name: s.attempts for name, s in self.stats.items()}

    @property
    def rejected(self) -> Mapping[str, int]:
        return {name: s.rejected for name, s in self.stats.items()}

    @property
    def reasons(self) -> Mapping[str, tuple[str, ...]]:
        return {name: s.reasons for name, s in self.stats.items()}

    def __str__(self) -> str:
        width = max([len("rule"), *(len(n) for n in self.stats)])
        lines = [f"{'rule':<{width}}  {'applied':>7}  {'tried':>7}  {'guarded':>7}  {'ms':>8}"]
        for name, s in self.stats.items():
            lines.append(f"{name:<{width}}  {s.applied:>7}  {s.attempts:>7}  {s.rejected:>7}  {s.seconds * 1e3:>8.2f}")
        lines.append(f"{self.rewrites} rewrite(s) in {self.seconds * 1e3:.1f} ms")
        return "\n".join(lines)


@attrs.frozen
class RewriteResult:
    """The rewritten module (recompiled), its code and the report; when the target was a
    ``torch.export.ExportedProgram``, also the rewritten program (see :mod:`fxrewrite.exported`)."""

    module: fx.GraphModule
    report: Report
    exported_program: Any = None  # torch.export.ExportedProgram | None

    @property
    def code(self) -> str:
        return self.module.code


