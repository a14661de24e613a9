"""``fxrewrite check [PATHS...]``: property-test every rule of some rule files.

:func:`run_check` loads the rules (the shipped library when no path is given), keeps those
selected by ``-k EXPR`` and ``--rule NAME``, checks each one with
:func:`~fxrewrite.testing.check_rule` (in ``jobs`` worker processes), prints one table row per
rule as soon as it is checked (in rule order with one process; with several, as they finish,
the likely slow rules having started first), then the reports of the rules that are not sound
(in rule order), and a summary line. On a terminal a status line shows the progress. Exit status:
0 when every selected rule is sound, 1 otherwise (unsound, untestable or error). Loading errors
(:class:`~fxrewrite.errors.RuleLoadError`, ...) and a bad selection
(:class:`~fxrewrite.errors.RuleSelectionError`) propagate; the command line turns them into
status 2.
"""

from __future__ import annotations

import contextlib
import gc
import multiprocessing
import os
import pickle
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from pathlib import Path
from typing import Any, TextIO

import attrs

from ..errors import FxRewriteError
from ..rule import Rule
from .equivalence import DEFAULT_EXAMPLES, CheckResult, check_rule

__all__ = ["DOMAIN_CANDIDATES", "RuleSelectionError", "checked", "default_jobs", "run_check", "select_rules",
           "setup_error", "working_domain"]

_COLUMNS = ("rule", "origin", "examples", "verdict", "numerics", "time")


class RuleSelectionError(FxRewriteError, ValueError):
    """``-k EXPR`` does not parse, or ``--rule NAME`` names no loaded rule."""


def default_jobs() -> int:
    """Worker processes by default: the cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def setup_error(rule: Rule) -> str | None:
    """What is missing for ``rule`` to run at all, or ``None``: its replacement, called once on
    fx Proxies, names an op or function that does not exist (a ``torch.library`` op whose
    registering module was not imported). That is a set-up error, reported as such, never as a
    counterexample: nothing about the rule's soundness is known until it can run.

    >>> from fxrewrite import parse_rules
    >>> rule = parse_rules("rule mine:\\n    torch.relu(x) => torch.ops.nolib.fast_relu(x)\\n")["mine"]
    >>> print(setup_error(rule))  # doctest: +ELLIPSIS
    rule 'mine' (<string>:1) cannot run: ... 'torch.ops.nolib.fast_relu' does not exist ...
    """
    import torch.fx as fx

    from ..errors import RuleDefinitionError

    graph = fx.Graph()
    tracer = fx.proxy.GraphAppendingTracer(graph)
    arguments: dict[str, Any] = {}
    for param in rule.compiled.params:
        if param.kind == "tensor":
            arguments[param.name] = fx.Proxy(graph.placeholder(param.name), tracer)
        elif param.kind == "literal" and _probe_literal(param.annotation) is not None:
            arguments[param.name] = _probe_literal(param.annotation)
        else:
            return None  # a module capture: nothing to call the replacement with here
    try:
        rule.replacement(**arguments)
    except RuleDefinitionError as exc:  # a rule file's name that does not resolve
        problem = str(exc).rstrip(".")
    except AttributeError as exc:  # torch.ops.<namespace>.<op> in a Python rule
        if "_OpNamespace" not in str(exc) and "torch.ops" not in str(exc):
            return None
        problem = f"{type(exc).__name__}: {str(exc).rstrip('.')}"
    except Exception:  # anything else is the checker's business (it may depend on the inputs)
        return None
    else:
        return None
    return (f"rule '{rule.name}' ({rule.origin}) cannot run: its replacement calls something that does not exist: "
            f"{problem}. This is a set-up error, not a verdict on the rule. If it is a torch.library op, register it "
            f"in '_ops.py' next to the rule file: fxrewrite imports that file before loading the rules, in "
            f"load_rules, `fxrewrite check`/`apply`/`lint` and `pytest` alike (docs/cli.md, 'Ops your rules call').")


def _probe_literal(annotation: Any) -> Any:
    import torch

    if annotation is torch.dtype:
        return torch.float32
    return {int: 1, float: 1.0, bool: True, str: ""}.get(annotation)


def checked(rule: Rule, *, examples: int = DEFAULT_EXAMPLES, seed: int | None = None) -> CheckResult:
    """:func:`~fxrewrite.testing.check_rule`, after making sure the rule can run at all: a
    rule with a :func:`setup_error` gets the verdict ``"error"`` with that message. An
    untestable rule's ``fix:`` suggests a domain only once it is checked to work (see
    :func:`working_domain`), or says that none is known."""
    problem = setup_error(rule)
    if problem is not None:
        return CheckResult(rule=rule.name, origin=rule.origin, verdict="error", examples_run=0, seconds=0.0,
                           message=problem)
    result = check_rule(rule, max_examples=examples, seed=seed)
    if result.verdict == "untestable":
        result = attrs.evolve(result, message=_with_fix(result.message, _domain_fix(rule, seed)))
    return result


#: Domains tried for a rule whose pattern and guards accept no drawn input, smallest first:
#: larger sides (a guard on a size, such as ``shape[-1] % 8 == 0``), then the same in float32.
DOMAIN_CANDIDATES: tuple[dict[str, Any], ...] = (
    {"ranks": (2, 4), "sides": (2, 4)},
    *({"ranks": (1, 4), "sides": (side, side)} for side in (8, 16, 32, 64)),
)


def working_domain(rule: Rule, *, seed: int | None = None) -> dict[str, Any] | None:
    """The first domain of :data:`DOMAIN_CANDIDATES` (merged into the rule's own, alone and with
    ``dtypes=(torch.float32,)``) under which the rule can be checked: its inputs pass the probe
    of the pattern and guards, and a short search finds it testable. ``None`` when none does."""
    import torch

    from .strategies import plan_inputs

    for extra in ({}, {"dtypes": (torch.float32,)}):
        for candidate in DOMAIN_CANDIDATES:
            domain = {**(rule.domain or {}), **candidate, **extra}
            try:
                if plan_inputs(rule, domain=domain).probe_failure is not None:
                    continue
            except FxRewriteError:  # a candidate the rule's own declarations make invalid
                continue
            if check_rule(attrs.evolve(rule, domain=domain), max_examples=10, seed=seed,
                          repair=False).verdict != "untestable":
                return domain
    return None


def _domain_fix(rule: Rule, seed: int | None) -> str:
    domain = working_domain(rule, seed=seed)
    if domain is None:
        return ("no domain fxrewrite tried (larger sides, ranks 1..4, float32) makes inputs the pattern and guards "
                "accept: declare a domain= that does, or check the guard (can it be true at all?).")
    shown = ", ".join(f"{k!r}: {_shown_value(v)}" for k, v in domain.items())
    return f"declare domain={{{shown}}} (checked: the pattern and guards accept inputs drawn from it)."


def _shown_value(value: Any) -> str:
    if isinstance(value, tuple):
        return "(" + ", ".join(_shown_value(v) for v in value) + ("," if len(value) == 1 else "") + ")"
    return f"torch.{str(value).removeprefix('torch.')}" if type(value).__name__ == "dtype" else repr(value)


def _with_fix(message: str, fix: str) -> str:
    """``message`` with its ``fix:`` line replaced by ``fix``."""
    lines = message.splitlines()
    for i, line in enumerate(lines):
        if line.lstrip().startswith("fix:"):
            lines[i] = f"{line[:line.index('fix:')]}fix:         {fix}"
            return "\n".join(lines)
    return f"{message}\n  fix:         {fix}"


def _load(paths: Sequence[str]) -> list[Rule]:
    from ..loader import load_rules

    if not paths:
        return list(load_rules())
    return [rule for path in paths for rule in load_rules(path)]


def _keywords(rule: Rule) -> tuple[str, ...]:
    """What ``-k`` matches against: the rule's name and its file's name (with and without
    suffix), as pytest matches a test's name and its module's."""
    file = Path(rule.origin.rpartition(":")[0] or rule.origin)
    return (rule.name, file.name, file.stem)


def select_rules(rules: Sequence[Rule], *, keyword: str | None = None,
                 names: Sequence[str] | None = None) -> list[Rule]:
    """The rules matching ``keyword`` (a pytest ``-k`` expression: case-insensitive substrings
    of the rule's name or file name, combined with ``and``, ``or``, ``not`` and parentheses)
    and, when ``names`` is given, named there; in their original order.

    >>> from fxrewrite.loader import load_rules
    >>> [r.name for r in select_rules(load_rules(), keyword="relu_relu or (gelu and not tanh and scaled)")]
    ['relu_relu', 'relu_relu6', 'gelu_erf_scaled']
    """
    selected = list(rules)
    if names:
        known = {r.name for r in rules}
        missing = [n for n in names if n not in known]
        if missing:
            raise RuleSelectionError(
                f"no rule named {', '.join(repr(n) for n in missing)} among the {len(rules)} loaded rule(s); "
                f"`fxrewrite list` shows their names.")
        wanted = set(names)
        selected = [r for r in selected if r.name in wanted]
    if keyword:
        matches = _keyword_matcher(keyword)
        selected = [r for r in selected if matches(_keywords(r))]
    return selected


def _keyword_matcher(expression: str) -> Callable[[tuple[str, ...]], bool]:
    from _pytest.mark.expression import Expression  # pytest's own -k grammar

    try:
        compiled = Expression.compile(expression)
    except SyntaxError as exc:
        raise RuleSelectionError(
            f"-k {expression!r} is not a valid expression ({exc.msg if hasattr(exc, 'msg') else exc}); write "
            f"substrings of rule or file names joined by and/or/not, e.g. -k 'relu and not gelu'.") from None

    def matches(keywords: tuple[str, ...]) -> bool:
        def named(word: str, /, **_: str | int | bool | None) -> bool:
            return any(word.lower() in k.lower() for k in keywords)

        return compiled.evaluate(named)

    return matches


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
        #: each rule's numerics contract, the promise its verdict was checked against
        self.contracts = {r.name: r.numerics or "tolerance" for r in rules}

    def row(self, rule: str, origin: str, examples: str, verdict: str, numerics: str, seconds: str) -> None:
        line = (f"{rule:<{self.name_width}}  {origin:<{self.origin_width}}  {examples:>8}  {verdict:<10}  "
                f"{numerics:<10}  {seconds:>7}").rstrip()
        print(line, file=self.out, flush=True)

    def header(self) -> None:
        self.row(*_COLUMNS)

    def result(self, result: CheckResult, draws: str | None = None) -> None:
        verdict = result.verdict if result.ok else result.verdict.upper()
        self.row(result.rule, _short_origin(result.origin), str(result.examples_run), verdict,
                 self.contracts.get(result.rule, "tolerance"), f"{result.seconds:.2f}s")
        if draws:
            print(f"{'':<{self.name_width}}  inputs: {draws}", file=self.out, flush=True)


class _Status:
    """One status line, rewritten in place, when ``out`` is a terminal; nothing otherwise."""

    def __init__(self, out: TextIO, total: int, enabled: bool | None) -> None:
        self.out = out
        self.total = total
        self.enabled = _is_terminal(out) if enabled is None else enabled
        self.shown = False

    def show(self, done: int, running: Sequence[str]) -> None:
        if not self.enabled:
            return
        names = ", ".join(running[:3]) + (f" (+{len(running) - 3})" if len(running) > 3 else "")
        progress = f"\r\033[K[{done}/{self.total}]"
        self.out.write(f"{progress} checking {names}" if running else progress)
        self.out.flush()
        self.shown = True

    def clear(self) -> None:
        if self.shown:
            self.out.write("\r\033[K")
            self.out.flush()
            self.shown = False


def _is_terminal(out: TextIO) -> bool:
    try:
        return out.isatty()
    except (AttributeError, ValueError):
        return False


def _summary(results: Sequence[CheckResult], seconds: float) -> str:
    counts = Counter(r.verdict for r in results)
    parts = [f"{counts[v]} {v}" for v in ("sound", "unsound", "untestable", "error") if counts[v]]
    return f"{len(results)} rule(s) checked in {seconds:.1f}s: {', '.join(parts) or 'nothing to check'}"


def run_check(paths: list[str], *, examples: int = DEFAULT_EXAMPLES, seed: int | None = None,
              out: TextIO = sys.stdout, jobs: int = 1, keyword: str | None = None,
              names: Sequence[str] | None = None, progress: bool | None = None, verbose: bool = False) -> int:
    """Check the rules under ``paths`` (default: the shipped library) selected by ``keyword``
    and ``names`` (see :func:`select_rules`), in ``jobs`` worker processes; print a table, the
    report of each rule that is not sound, and a summary. ``progress`` shows a status line
    (default: when ``out`` is a terminal); ``verbose`` adds a line under each rule's row with the
    inputs drawn, kept (the pattern ran and every guard held) and the share rejected. Returns 0
    when all rules are sound, 1 otherwise.

    >>> import io, pathlib, tempfile
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (folder / "demo.fxr").write_text("rule double_neg:\\n    torch.neg(torch.neg(x)) => x\\n")
    >>> out = io.StringIO()
    >>> run_check([str(folder)], examples=20, out=out)
    0
    >>> print(out.getvalue().splitlines()[-1])  # doctest: +ELLIPSIS
    1 rule(s) checked in ...s: 1 sound
    """
    if jobs < 1:
        raise RuleSelectionError(f"-j must be at least 1, got {jobs}.")
    start = time.perf_counter()
    rules = select_rules(_load(paths), keyword=keyword, names=names)
    table = _Table(rules, out)
    table.header()
    status = _Status(out, len(rules), progress)
    results = {}
    for index, result, draws in _results(rules, examples, seed, jobs, status):
        status.clear()
        table.result(result, draws if verbose else None)
        results[index] = result
    status.clear()
    failures = [results[i] for i in sorted(results) if not results[i].ok]
    for result in failures:
        print(f"\n{result.message}", file=out)
    print(f"\n{_summary(list(results.values()), time.perf_counter() - start)}", file=out)
    return 1 if failures else 0


def _checked_with_draws(rule: Rule, examples: int, seed: int | None) -> tuple[CheckResult, str]:
    """:func:`checked`, and what its searches drew: ``drawn N, kept K, rejected P%``."""
    from ._plan import draw_counts, reset_draw_counts

    reset_draw_counts(rule)
    result = checked(rule, examples=examples, seed=seed)
    return result, draw_counts(rule).describe()


def _results(rules: Sequence[Rule], examples: int, seed: int | None, jobs: int,
             status: _Status) -> Iterator[tuple[int, CheckResult, str]]:
    """``(index, result, draws)`` for each rule, as each is checked."""
    if jobs == 1 or len(rules) < 2:
        for i, rule in enumerate(rules):
            status.show(i, [rule.name])
            with fewer_collections():
                checked_rule = _checked_with_draws(rule, examples, seed)
            yield i, *checked_rule
        return
    yield from _parallel(rules, examples, seed, min(jobs, len(rules)), status)


# -- worker processes -----------------------------------------------------------------------------

#: The rules being checked, in every worker (inherited when forked, else loaded by _initialize).
_RULES: list[Rule] = []
#: How workers start: "fork" where the platform has it (they inherit the loaded rules), else
#: "spawn" (they load the rule files again).
_START_METHOD = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"


def _initialize(files: Sequence[str] | None, keys: Sequence[tuple[str, str]]) -> None:
    """In a worker: collect garbage less (:func:`fewer_collections`, for the worker's life); when
    spawned, load the rule files again and line the rules up as the parent has them."""
    if files is not None:
        by_key = {(r.name, r.origin): r for path in files for r in _load([path])}
        _RULES[:] = [by_key[key] for key in keys]
    gc.freeze()  # as fewer_collections() does, for the rest of the worker's life
    gc.set_threshold(*CHECK_GC_THRESHOLDS)


#: Thresholds of Python's cyclic garbage collector while rules are checked (its defaults are
#: ``(700, 10, 10)``): a search allocates many short-lived objects (Hypothesis' choices, spans,
#: tensors) and the collections they trigger were ~12% of the checker's CPU, most of it in the
#: few full collections that walk the whole heap (torch, the loaded rules), ~0.2 s each.
CHECK_GC_THRESHOLDS = (10_000, 10, 10)


@contextlib.contextmanager
def fewer_collections() -> Iterator[None]:
    """Check rules with less garbage collection: what is alive on entry is frozen (never walked
    by a collection, ``gc.freeze``) and collections start after :data:`CHECK_GC_THRESHOLDS`
    allocations; both are undone on exit. Garbage is still collected, less often. Library
    checks of 28 rules, one process, CPU, 3 alternating pairs: 13.0/12.1/11.3 s -> 10.8/11.1/10.6 s."""
    thresholds = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(*CHECK_GC_THRESHOLDS)
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()


def _check_one(index: int, examples: int, seed: int | None) -> tuple[CheckResult, str]:
    result, draws = _checked_with_draws(_RULES[index], examples, seed)
    return _portable(result), draws


def _portable(result: CheckResult) -> CheckResult:
    """The result without what may not cross a process boundary (counterexample tensors,
    modules, exceptions): the report in ``message`` says it all."""
    slim = attrs.evolve(result, counterexamples=())
    try:
        pickle.dumps(slim)
    except Exception:
        slim = CheckResult(rule=result.rule, origin=result.origin, verdict=result.verdict,
                           examples_run=result.examples_run, seconds=result.seconds, message=result.message)
    return slim


def _expected_cost(rule: Rule) -> tuple[int, int, int]:
    """A guess at how long a rule takes to check, to start the slow ones first: guards reject
    drawn inputs (more draws per example), and each tensor argument is drawn element by element."""
    params = rule.compiled.params
    return (1 if rule.where else 0, sum(p.kind == "tensor" for p in params), len(rule.compiled.inner_nodes))


def _parallel(rules: Sequence[Rule], examples: int, seed: int | None, jobs: int,
              status: _Status) -> Iterator[tuple[int, CheckResult, str]]:
    """Check ``rules`` in ``jobs`` processes, the likely slow ones first."""
    _RULES[:] = rules
    spawned = _START_METHOD != "fork"
    files = _files_of(rules) if spawned else None
    keys = [(r.name, r.origin) for r in rules] if spawned else []
    pool = ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context(_START_METHOD),
                               initializer=_initialize, initargs=(files, keys))
    try:
        yield from _collect(pool, rules, examples, seed, jobs, status)
    finally:  # also on Ctrl-C or an error: do not wait for the rules still queued
        pool.shutdown(wait=True, cancel_futures=True)


def _collect(pool: ProcessPoolExecutor, rules: Sequence[Rule], examples: int, seed: int | None, jobs: int,
             status: _Status) -> Iterator[tuple[int, CheckResult, str]]:
    order = sorted(range(len(rules)), key=lambda i: _expected_cost(rules[i]), reverse=True)
    pending: dict[Future[tuple[CheckResult, str]], int] = {pool.submit(_check_one, i, examples, seed): i for i in order}
    done: set[int] = set()
    started = order[:jobs]  # roughly what runs: the pool hands out work in submission order
    while pending:
        status.show(len(done), [rules[i].name for i in started if i not in done])
        finished, _ = wait(pending, return_when=FIRST_COMPLETED)
        for future in finished:
            index = pending.pop(future)
            done.add(index)
            following = [i for i in order if i not in done and i not in started]
            started += following[:1]
            yield index, *future.result()


def _files_of(rules: Sequence[Rule]) -> list[str]:
    """The files to load again in a spawned worker."""
    files = dict.fromkeys(rule.origin.rpartition(":")[0] for rule in rules)
    return [f for f in files if f]
