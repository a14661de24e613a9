"""``fxrewrite check [PATHS...]``: property-test every rule of some rule files.

:func:`run_check` loads the rules (the shipped library when no path is given), checks each one
with :func:`~fxrewrite.testing.check_rule`, prints one table row per rule as it is checked, then
the report of every rule that is not sound, and a summary line. Exit status: 0 when every rule
is sound, 1 otherwise. Loading errors (:class:`~fxrewrite.errors.RuleLoadError`, ...) propagate;
the command line turns them into status 2.
"""

from __future__ import annotations

import os
import sys
import time
from collections import Counter
from collections.abc import Sequence
from typing import TextIO

from ..rule import Rule
from .equivalence import DEFAULT_EXAMPLES, CheckResult, check_rule

__all__ = ["run_check"]

_COLUMNS = ("rule", "origin", "examples", "verdict", "time")


def _load(paths: Sequence[str]) -> list[Rule]:
    from ..loader import load_rules

    if not paths:
        return list(load_rules())
    return [rule for path in paths for rule in load_rules(path)]


def _short_origin(origin: str) -> str:
    """``origin`` relative to the current directory when it lies below it."""
    file, sep, line = origin.rpartition(":")
    if not sep or not os.path.isabs(file):
        return origin
    relative = os.path.relpath(file)
    return f"{relative}:{line}" if not relative.startswith("..") else origin


class _Table:
    def __init__(self, rules: Sequence[Rule], out: TextIO) -> None:
        self.out = out
        self.name_width = max([len(_COLUMNS[0]), *(len(r.name) for r in rules)])
        self.origin_width = max([len(_COLUMNS[1]), *(len(_short_origin(r.origin)) for r in rules)])

    def row(self, rule: str, origin: str, examples: str, verdict: str, seconds: str) -> None:
        line = (f"{rule:<{self.name_width}}  {origin:<{self.origin_width}}  {examples:>8}  {verdict:<10}  "
                f"{seconds:>7}").rstrip()
        print(line, file=self.out, flush=True)

    def header(self) -> None:
        self.row(*_COLUMNS)

    def result(self, result: CheckResult) -> None:
        verdict = result.verdict if result.ok else result.verdict.upper()
        self.row(result.rule, _short_origin(result.origin), str(result.examples_run), verdict,
                 f"{result.seconds:.2f}s")


def _summary(results: Sequence[CheckResult], seconds: float) -> str:
    counts = Counter(r.verdict for r in results)
    parts = [f"{counts[v]} {v}" for v in ("sound", "unsound", "untestable", "error") if counts[v]]
    return f"{len(results)} rule(s) checked in {seconds:.1f}s: {', '.join(parts) or 'nothing to check'}"


def run_check(paths: list[str], *, examples: int = DEFAULT_EXAMPLES, seed: int | None = None,
              out: TextIO = sys.stdout) -> int:
    """Check every rule under ``paths`` (default: the shipped library); print a table, the
    report of each rule that is not sound, and a summary. Returns 0 when all rules are sound,
    1 otherwise.

    >>> import io, pathlib, tempfile
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (folder / "demo.fxr").write_text("rule double_neg:\\n    torch.neg(torch.neg(x)) => x\\n")
    >>> out = io.StringIO()
    >>> run_check([str(folder)], examples=20, out=out)
    0
    >>> print(out.getvalue().splitlines()[-1])  # doctest: +ELLIPSIS
    1 rule(s) checked in ...s: 1 sound
    """
    start = time.perf_counter()
    rules = _load(paths)
    table = _Table(rules, out)
    table.header()
    results = []
    for rule in rules:
        result = check_rule(rule, max_examples=examples, seed=seed)
        table.result(result)
        results.append(result)
    failures = [r for r in results if not r.ok]
    for result in failures:
        print(f"\n{result.message}", file=out)
    print(f"\n{_summary(results, time.perf_counter() - start)}", file=out)
    return 1 if failures else 0
