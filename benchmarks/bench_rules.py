"""Benchmark how ``fxrewrite.rewrite`` scales with the number of rules (issue 24), and the checker.

Usage::

    python benchmarks/bench_rules.py                 # R = 10, 100, 1000 on a 16k-node program, median of 3
    python benchmarks/bench_rules.py --quick         # R = 10, 100 on 2k nodes, one run (a smoke test)
    python benchmarks/bench_rules.py --check         # also time `fxrewrite check rules -j 2` (about a minute)

Two rule families, each ``R`` rules, on the same program for every ``R`` (a Python function traced
by ``torch.fx``: a seeded chain of filler ops with blocks of the family's first 10 rules planted
in it, so every ``R`` makes the same rewrites):

* ``literal``: ``(x + C_i) * D_i => x * D_i + C_i * D_i``, rules that differ only in literals.
  The filler multiplies and adds by other constants, so many ``mul(add(...))`` nodes are tried.
* ``ops``: ``a_i(x) - b_i(y) => a_i(x) + (-b_i(y))``, rules whose anchor (``sub``) reads other
  ops; the filler applies the same unary ops and subtracts.

Each row times a copying ``rewrite`` (CPU time, median of ``--repeat``, one process) with the
driver's slow twin (``plain``: every rule of the anchor's op key tried at each node,
``fxrewrite.driver.PLAIN_RULES``) and with :class:`fxrewrite.dispatch.RuleIndex` (``indexed``: the
driver's own since it asks the index; on a driver that does not, :func:`indexed_rules` patches it
in), and counts match attempts (``Report.attempts``). Both must make the same rewrites and leave the
same code. The verdicts are the issue's targets: R=1000 against R=10, at most 1.25x for
``literal`` and 1.1x for ``ops``.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import attrs

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

import torch  # noqa: E402
from torch import fx  # noqa: E402

try:
    import fxrewrite
except ImportError:  # running from a checkout without the package installed
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    import fxrewrite
from fxrewrite._gc import collections_paused  # noqa: E402
from fxrewrite.dispatch import RuleIndex  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SEED = 20251126
FAMILIES = ("literal", "ops")
DEFAULT_RULES = (10, 100, 1000)
QUICK_RULES = (10, 100)
DEFAULT_NODES = 16000
QUICK_NODES = 2000
PLANTED_RULES = 10  # blocks are planted for the first 10 rules of a family: the same program for every R
DENSITY = 0.1  # fraction of the program's nodes inside planted blocks
TARGETS = {"literal": 1.25, "ops": 1.1}  # R=1000 / R=10, issue 24
CHECK_TARGET_SECONDS = 35.0
#: Unary ops of the ``ops`` family and its filler: bounded on the values the program computes.
UNARY = (torch.sin, torch.cos, torch.tanh, torch.sigmoid, torch.atan, torch.erf, torch.abs, torch.neg, torch.relu,
         torch.sign, torch.floor, torch.ceil, torch.trunc, torch.round, torch.asinh, torch.sinh, torch.exp,
         torch.expm1, torch.log1p, torch.square, torch.frac, torch.nn.functional.silu, torch.nn.functional.gelu,
         torch.nn.functional.softsign, torch.nn.functional.hardtanh, torch.nn.functional.relu6,
         torch.nn.functional.hardsigmoid, torch.nn.functional.hardswish, torch.nn.functional.mish,
         torch.nn.functional.elu, torch.nn.functional.selu, torch.nn.functional.celu, torch.nn.functional.softplus,
         torch.nn.functional.tanhshrink)


# ----------------------------------------------------------------------------------------------
# the two families, as Python
# ----------------------------------------------------------------------------------------------


def literals(i: int) -> tuple[float, float]:
    """``(C_i, D_i)`` of the literal family's rule ``i``: distinct per rule, never the filler's
    constants, so a rewrite's result is not matched again."""
    return 1.0 + i / 1024, 2.0 + i / 512


def literal_rule(i: int) -> fxrewrite.Rule:
    c, d = literals(i)
    return fxrewrite.Rule.from_functions(lambda x: (x + c) * d, lambda x: x * d + c * d, name=f"shift_scale_{i}")


def op_pair(i: int) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """The ops ``(a_i, b_i)`` of the ops family's rule ``i`` (a fixed order of distinct pairs)."""
    pairs = [(a, b) for a in UNARY for b in UNARY if a is not b]
    random.Random(SEED).shuffle(pairs)
    if i >= len(pairs):
        raise ValueError(f"the ops family has {len(pairs)} rules, asked for rule {i}")
    return pairs[i]


def ops_rule(i: int) -> fxrewrite.Rule:
    a, b = op_pair(i)
    return fxrewrite.Rule.from_functions(lambda x, y: a(x) - b(y), lambda x, y: a(x) + torch.neg(b(y)),
                                         name=f"sub_{a.__name__}_{b.__name__}")


def ruleset(family: str, count: int) -> fxrewrite.RuleSet:
    make = literal_rule if family == "literal" else ops_rule
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fxrewrite.RuleSet([make(i) for i in range(count)])


class Program(torch.nn.Module):
    """A seeded chain of ``size`` filler ops with blocks of the family's first rules planted in
    it; ``rewritten`` computes what the rewrite leaves (the expected result)."""

    def __init__(self, family: str, size: int, *, rewritten: bool = False) -> None:
        super().__init__()
        self.family, self.size, self.rewritten = family, size, rewritten
        self.planted = 0

    def forward(self, x: Any) -> Any:
        rng = random.Random(f"{SEED}-{self.family}-{self.size}")
        block = 2 if self.family == "literal" else 3
        self.planted = 0
        count, y = 0, x
        while count < self.size - 2 - block:
            if rng.random() < DENSITY / block:
                x, count = self._block(rng.randrange(PLANTED_RULES), x, y), count + block
                self.planted += 1
            else:
                x, y, count = self._filler(rng, x), x, count + 1
        return x

    def _block(self, i: int, x: Any, y: Any) -> Any:
        if self.family == "literal":
            c, d = literals(i)
            return x * d + c * d if self.rewritten else (x + c) * d
        a, b = op_pair(i)
        return a(x) + torch.neg(b(y)) if self.rewritten else a(x) - b(y)

    def _filler(self, rng: random.Random, x: Any) -> Any:
        kind = rng.random()
        if self.family == "literal":  # products of sums by other constants: tried by every rule
            return x * 0.75 if kind < 0.35 else x + 0.5 if kind < 0.7 else torch.tanh(x)
        return x - 0.25 if kind < 0.3 else rng.choice(UNARY)(x)


def build(family: str, size: int, *, rewritten: bool = False) -> tuple[fx.GraphModule, int]:
    """The traced program and the number of blocks planted in it."""
    program = Program(family, size, rewritten=rewritten)
    gm = fx.symbolic_trace(program)
    return gm, program.planted


# ----------------------------------------------------------------------------------------------
# the index, wired into the driver for the measurement
# ----------------------------------------------------------------------------------------------


def _driver_class() -> type:
    """The worklist driver's class (``fxrewrite.driver`` once the driver has its own module)."""
    for module, name in (("fxrewrite.driver", "Driver"), ("fxrewrite.rewrite", "_Driver")):
        try:
            found = getattr(__import__(module, fromlist=[name]), name)
        except (ImportError, AttributeError):
            continue
        if hasattr(found, "_rules_at"):
            return found  # type: ignore[no-any-return]
    raise RuntimeError("no driver class with _rules_at found: wire RuleIndex into this version by hand")


#: Rules tried (candidates, summed over visits) by the last drive made under :func:`indexed_rules`.
TRIES: list[int] = [0]


def _builtin_index() -> Any:
    """The driver module when the driver asks a RuleIndex itself (``PLAIN_RULES`` its slow twin)."""
    try:
        import fxrewrite.driver as driver
    except ImportError:
        return None
    return driver if hasattr(driver, "PLAIN_RULES") else None


@contextlib.contextmanager
def plain_rules() -> Iterator[None]:
    """Within the block, the driver tries every rule of a node's op key (the index's slow twin)."""
    driver = _builtin_index()
    if driver is None:
        yield
        return
    saved, driver.PLAIN_RULES = driver.PLAIN_RULES, True
    try:
        yield
    finally:
        driver.PLAIN_RULES = saved


@contextlib.contextmanager
def indexed(how: str) -> Iterator[None]:
    """``plain`` or ``indexed`` drives, whichever the driver does by itself."""
    if how == "plain":
        with (plain_rules() if _builtin_index() is not None else contextlib.nullcontext()):
            yield
    else:
        with (counted_tries() if _builtin_index() is not None else indexed_rules()):
            yield


@contextlib.contextmanager
def counted_tries() -> Iterator[None]:
    """Within the block, :data:`TRIES` gets the rules the driver's own index let it try (its
    report's attempts less those it counted for the rules the index left out)."""
    cls = _driver_class()
    saved = cls.report

    def report(self: Any, seconds: float) -> Any:
        counted = saved(self, seconds)
        TRIES[0] = sum(counted.attempts.values()) - sum(self.rules.left_out().values())
        return counted

    cls.report = report  # type: ignore[attr-defined]
    try:
        yield
    finally:
        cls.report = saved  # type: ignore[attr-defined]


@contextlib.contextmanager
def indexed_rules() -> Iterator[None]:
    """Within the block, the driver asks a :class:`RuleIndex` per priority level for the rules to
    try at a node instead of trying every rule of the node's op key: the change proposed for the
    driver itself, made here by patching it for the measurement. ``Report.attempts`` keeps its
    meaning (the visits of a node the rule is anchored at): a rule the index leaves out is
    counted as the plain driver counts it, from the visits per op key, without a loop over it."""
    cls = _driver_class()
    saved = {name: getattr(cls, name) for name in ("__init__", "_rules_at", "_visit", "report")}

    def __init__(self: Any, gm: fx.GraphModule, ruleset: fxrewrite.RuleSet, **kwargs: Any) -> None:
        saved["__init__"](self, gm, ruleset, **kwargs)
        self.rule_index = {p: RuleIndex([r for r in ruleset if r.priority == p]) for p in self.by_level}

    def _rules_at(self: Any, node: fx.Node, level: int) -> Any:
        return self.rule_index[level].candidates(node)

    def _visit(self: Any, node: fx.Node, level: int) -> None:
        before = self.rewrites
        saved["_visit"](self, node, level)
        self.rule_index[level].visited(node, self._last[0] if self.rewrites > before else None)

    def report(self: Any, seconds: float) -> Any:
        counted = saved["report"](self, seconds)
        TRIES[0] = sum(counted.attempts.values())
        left_out = {name: n for index in self.rule_index.values() for name, n in index.left_out().items()}
        stats = {name: attrs.evolve(s, attempts=s.attempts + left_out.get(name, 0))
                 for name, s in counted.stats.items()}
        return attrs.evolve(counted, stats=stats)

    cls.__init__, cls._rules_at, cls._visit, cls.report = __init__, _rules_at, _visit, report  # type: ignore[misc]
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(cls, name, value)


# ----------------------------------------------------------------------------------------------
# measuring
# ----------------------------------------------------------------------------------------------


@dataclass
class Row:
    family: str
    rules: int
    nodes: int
    planted: int
    plain_ms: float | None = None
    indexed_ms: float | None = None
    plain_attempts: int = 0
    indexed_attempts: int = 0
    build_s: float = 0.0
    errors: list[str] = field(default_factory=list)


def _cpu(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.process_time()
    result = fn()
    return time.process_time() - start, result


def warm_up() -> None:
    """One untimed rewrite of each kind on a small program: first calls (lazy imports, caches)
    are not the rows' business."""
    for family in FAMILIES:
        gm, _ = build(family, 200)
        rules = ruleset(family, PLANTED_RULES)
        for how in ("plain", "indexed"):
            with indexed(how):
                fxrewrite.rewrite(gm, rules)


def measure(family: str, count: int, size: int, repeat: int) -> Row:
    started = time.perf_counter()
    rules = ruleset(family, count)
    gm, planted = build(family, size)
    expected_gm, _ = build(family, size, rewritten=True)
    row = Row(family, count, len(gm.graph.nodes), planted, build_s=time.perf_counter() - started)
    x = torch.linspace(-2, 2, 16)
    expected = expected_gm(x)
    times: dict[str, list[float]] = {"plain": [], "indexed": []}
    codes: dict[str, str] = {}
    for _ in range(repeat):
        for how in ("plain", "indexed"):
            with collections_paused(), indexed(how):
                seconds, result = _cpu(lambda: fxrewrite.rewrite(gm, rules))
            times[how].append(seconds)
            attempts = sum(result.report.attempts.values())
            tries = TRIES[0]
            setattr(row, f"{how}_attempts", tries if how == "indexed" else attempts)
            if how == "indexed" and attempts != row.plain_attempts:
                row.errors.append(f"Report.attempts differs with the index: {attempts}, plain {row.plain_attempts}")
            codes[how] = result.code
            if result.report.rewrites != planted:
                row.errors.append(f"{how}: {result.report.rewrites} rewrites, expected {planted} (planted blocks)")
            try:
                result.module.graph.lint()
                torch.testing.assert_close(result.module(x), expected, rtol=1e-5, atol=1e-6, equal_nan=True)
            except AssertionError as exc:
                row.errors.append(f"{how}: the rewritten program differs: {str(exc).splitlines()[0]}")
    if codes["plain"] != codes["indexed"]:
        row.errors.append("the indexed driver left other code than the plain one")
    row.plain_ms, row.indexed_ms = (statistics.median(times[h]) * 1e3 for h in ("plain", "indexed"))
    return row


def check_seconds(jobs: int = 2) -> tuple[float, str]:
    """Wall time of ``fxrewrite check rules -j JOBS`` on the shipped rules, and its last line."""
    command = [sys.executable, "-m", "fxrewrite", "check", str(ROOT / "rules"), "-j", str(jobs)]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False, cwd=ROOT)
    seconds = time.perf_counter() - start
    last = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else f"exit {done.returncode}"
    return seconds, last


# ----------------------------------------------------------------------------------------------
# report
# ----------------------------------------------------------------------------------------------


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def report(rows: list[Row], out: Any, check: tuple[float, str] | None) -> bool:
    """Print the table and the verdicts; True when every correctness check passed."""
    def p(text: str = "") -> None:
        print(text, file=out)

    base = {(r.family): r for r in rows if r.rules == min(x.rules for x in rows if x.family == r.family)}
    p(f"{'family':<8} {'R':>5} {'nodes':>6} {'blocks':>6} {'plain ms':>9} {'vs R0':>7} {'tries':>9} "
      f"{'indexed ms':>10} {'vs R0':>7} {'tries':>7}")
    for r in rows:
        b = base[r.family]
        p(f"{r.family:<8} {r.rules:>5} {r.nodes:>6} {r.planted:>6} {r.plain_ms or 0:>9.1f} "
          f"{_x(_ratio(r.plain_ms, b.plain_ms)):>7} {r.plain_attempts:>9} {r.indexed_ms or 0:>10.1f} "
          f"{_x(_ratio(r.indexed_ms, b.indexed_ms)):>7} {r.indexed_attempts:>7}" + ("  ERROR" if r.errors else ""))
    p("vs R0: time against the same driver with the fewest rules measured (R0); tries: rules tried at a node, summed "
      "over the visits (plain: Report.attempts; indexed: the index's candidates; Report.attempts is the same for both)")
    p()
    p("targets (issue 24; CPU time, medians, one process):")
    for family, limit in TARGETS.items():
        top = max((r for r in rows if r.family == family), key=lambda r: r.rules, default=None)
        if top is None or top.rules == base[family].rules:
            p(f"  {family:<8} R=1000 vs R=10 <= {limit:g}x: not measured")
            continue
        for how in ("plain", "indexed"):
            v = _ratio(getattr(top, f"{how}_ms"), getattr(base[family], f"{how}_ms"))
            verdict = "PASS" if v is not None and v <= limit else "FAIL"
            p(f"  {family:<8} R={top.rules} vs R={base[family].rules} <= {limit:g}x  {how:<8} {_x(v):>7}  {verdict}")
    if check is not None:
        verdict = "PASS" if check[0] <= CHECK_TARGET_SECONDS else "FAIL"
        p(f"  fxrewrite check rules -j 2 <= {CHECK_TARGET_SECONDS:g} s: {check[0]:.0f} s wall  {verdict}  ({check[1]})")
    errors = [(r, e) for r in rows for e in r.errors]
    p()
    if errors:
        p(f"CORRECTNESS: FAIL ({len(errors)} problem(s))")
        for r, e in errors[:20]:
            p(f"  {r.family} R={r.rules}: {e}")
    else:
        p("CORRECTNESS: PASS (plain and indexed drivers make every planted rewrite, the same code, the expected "
          "numbers)")
    return not errors


def _ints(text: str) -> list[int]:
    return [int(t) for t in text.split(",") if t.strip()]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="bench_rules.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help=f"R = {','.join(map(str, QUICK_RULES))} on {QUICK_NODES} nodes, one run (a smoke test)")
    ap.add_argument("--rules", type=_ints, default=None, help="rule counts (default 10,100,1000)")
    ap.add_argument("--nodes", type=int, default=None, help=f"program size in nodes (default {DEFAULT_NODES})")
    ap.add_argument("--families", type=lambda s: [t for t in s.split(",") if t], default=list(FAMILIES),
                    help=f"only these families ({', '.join(FAMILIES)})")
    ap.add_argument("--repeat", type=int, default=None, help="runs per measurement, median reported (default 3)")
    ap.add_argument("--check", action="store_true", help="also time `fxrewrite check rules -j 2` (about a minute)")
    args = ap.parse_args(argv)
    args.rules = sorted(set(args.rules or (QUICK_RULES if args.quick else DEFAULT_RULES)))
    args.nodes = args.nodes or (QUICK_NODES if args.quick else DEFAULT_NODES)
    args.repeat = args.repeat or (1 if args.quick else 3)
    for f in args.families:
        if f not in FAMILIES:
            ap.error(f"unknown family {f!r}; choose from {', '.join(FAMILIES)}")
    if min(args.rules) < PLANTED_RULES:
        ap.error(f"rule counts must be at least {PLANTED_RULES} (blocks are planted for the first {PLANTED_RULES})")
    return args


def main(argv: Sequence[str] | None = None, out: Any = None) -> int:
    """Run the benchmark and print the report; 0 unless a correctness check failed."""
    out = out if out is not None else sys.stdout
    args = parse_args(argv)
    print(f"fxrewrite {fxrewrite.__version__}, torch {torch.__version__}; {args.nodes} nodes, R = "
          f"{','.join(map(str, args.rules))}, median of {args.repeat}, CPU time", file=out, flush=True)
    warm_up()
    rows = [measure(family, count, args.nodes, args.repeat) for family in args.families for count in args.rules]
    check = check_seconds() if args.check else None
    return 0 if report(rows, out, check) else 1


if __name__ == "__main__":
    sys.exit(main())
