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

__all__ = ["COLUMNS", "MAX_REASONS", "NO_METADATA", "Report", "RewriteResult", "RuleStats", "format_table"]

#: How many refusal reasons a rule's stats keep (examples, not a log).
MAX_REASONS = 3


@attrs.frozen
class RuleStats:
    """What happened to one rule during a rewrite."""

    attempts: int = 0
    applied: int = 0
    rejected: int = 0
    seconds: float = 0.0
    reasons: tuple[str, ...] = ()

    def __add__(self, other: RuleStats) -> RuleStats:
        """The stats of two rewrites together (the first :data:`MAX_REASONS` reasons kept)."""
        return RuleStats(self.attempts + other.attempts, self.applied + other.applied, self.rejected + other.rejected,
                         self.seconds + other.seconds, (*self.reasons, *other.reasons)[:MAX_REASONS])


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

    @property
    def without_metadata(self) -> tuple[str, ...]:
        """Rules whose guards refused a match on a graph that carries no shapes/dtypes (pass
        ``example_inputs=`` to :func:`~fxrewrite.rewrite`, or rewrite a ``torch.export`` graph)."""
        return tuple(name for name, s in self.stats.items() if any(NO_METADATA in r for r in s.reasons))

    def __str__(self) -> str:
        return format_table(self)

    def __add__(self, other: Report) -> Report:
        """Two rewrites' reports summed rule by rule (an Inductor pass sums the graphs it is handed).

        >>> one = Report({"neg_neg": RuleStats(attempts=2, applied=1)}, 1, 0.5)
        >>> two = Report({"neg_neg": RuleStats(attempts=1, applied=1), "abs_abs": RuleStats(attempts=1)}, 1, 0.25)
        >>> total = one + two
        >>> total.applied, total.attempts, total.rewrites, total.seconds
        ({'neg_neg': 2, 'abs_abs': 0}, {'neg_neg': 3, 'abs_abs': 1}, 2, 0.75)
        """
        names = dict.fromkeys([*self.stats, *other.stats])
        stats = {name: self.stats.get(name, RuleStats()) + other.stats.get(name, RuleStats()) for name in names}
        return Report(stats, self.rewrites + other.rewrites, self.seconds + other.seconds,
                      other.last_rewrite or self.last_rewrite)


#: Every refusal reason that blames missing shape/dtype metadata contains this phrase.
NO_METADATA = "the graph carries no shapes/dtypes"

#: The columns of a report table: what each count means is in :class:`RuleStats`.
COLUMNS = ("rule", "fired", "guarded", "tried", "ms")

_METADATA_HOW = "pass example_inputs= (or rewrite a torch.export graph)"


def format_table(report: Report, *, all_rows: bool = False, metadata_hint: str = _METADATA_HOW,
                 more: str | None = None) -> str:
    """``report`` as a table: one row per rule that fired or whose guards refused a match (every
    rule with ``all_rows=True``), then one summary line, and a hint when guards refused for lack
    of shapes/dtypes. ``str(report)``, ``fxrewrite apply`` and the docs all show this table;
    ``metadata_hint`` says how to get shapes, ``more`` how to see the rows left out.

    Columns: ``fired`` (rewrites applied), ``guarded`` (matches a guard refused), ``tried``
    (anchor candidates the rule was tried at) and ``ms`` (time in the rule).

    >>> stats = {"conv_bn": RuleStats(attempts=16, applied=5), "relu_relu": RuleStats(attempts=5),
    ...          "neg_neg": RuleStats()}
    >>> print(format_table(Report(stats, rewrites=5, seconds=0.0123)))
    rule     fired  guarded  tried    ms
    conv_bn      5        0     16  0.00
    5 rewrite(s) in 12.3 ms; 2 other rule(s) did not match (1 of them was tried)
    """
    shown = {name: s for name, s in report.stats.items() if all_rows or s.applied or s.rejected}
    lines = _rows(shown) if shown else []
    summary = f"{report.rewrites} rewrite(s) in {report.seconds * 1e3:.1f} ms"
    hidden = [s for name, s in report.stats.items() if name not in shown]
    if hidden:
        tried = sum(1 for s in hidden if s.attempts)
        summary += (f"; {len(hidden)} {'other ' if shown else ''}rule(s) did not match "
                    f"({tried} of them {'was' if tried == 1 else 'were'} tried{'; ' + more if more else ''})")
    lines.append(summary)
    if report.without_metadata:
        lines.append(f"guards of {', '.join(report.without_metadata)} refused matches and {NO_METADATA}: if they "
                     f"need them, {metadata_hint}")
    return "\n".join(lines)


def _rows(stats: Mapping[str, RuleStats]) -> list[str]:
    cells = [(name, str(s.applied), str(s.rejected), str(s.attempts), f"{s.seconds * 1e3:.2f}")
             for name, s in stats.items()]
    widths = [max(len(column), *(len(row[i]) for row in cells)) for i, column in enumerate(COLUMNS)]

    def line(row: tuple[str, ...]) -> str:
        first = row[0].ljust(widths[0])
        return "  ".join([first, *(cell.rjust(width) for cell, width in zip(row[1:], widths[1:], strict=True))])

    return [line(COLUMNS), *(line(row) for row in cells)]


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


