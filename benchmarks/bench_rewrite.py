"""Benchmark ``fxrewrite.rewrite`` against ``torch.fx.replace_pattern`` and the floors.

Usage::

    python benchmarks/bench_rewrite.py                      # sizes 1000,4000,16000,64000, 3 repeats
    python benchmarks/bench_rewrite.py --quick              # sizes 1000,4000, 1 repeat (< 1 minute)
    python benchmarks/bench_rewrite.py --sizes 2000,8000 --repeat 5 --shapes chain --rules 10
    python benchmarks/bench_rewrite.py --sizes 64000 --shapes chain --densities 0.1 --rules 10 --profile

Synthetic graphs are built directly with ``torch.fx.Graph`` (no tracing of huge functions):

* ``chain``: every op consumes the previous value (binary ops take a float constant as the
  second operand);
* ``dag``: every op consumes 1-2 values chosen with a fixed-seed RNG among the last 8 values;
  a value about to leave that window unused is consumed by the next op, and the values still
  unused at the end are returned, so the graph has no dead code.

The op mix is ``relu, sigmoid, tanh, sin, add, mul``; ``torch.neg`` appears only in planted
``neg(neg(v))`` pairs (never back to back, never fed by another ``neg``), so the first rule,
``neg(neg(x)) => x``, fires exactly once per planted pair. The *density* is the fraction of the
graph's nodes that belong to a planted pair.

Rule sets have 1, 10 and 50 rules: ``neg_neg`` first, then exact identities over unary ops
(``relu(sigmoid(x)) => sigmoid(x)``, ``abs(neg(x)) => abs(x)``, ``floor(ceil(x)) => ceil(x)``,
``relu(exp(sin(x))) => exp(sin(x))``, ...). Most are anchored at ops present in the graph but
need ops that are absent, so they are *tried* without firing; ``relu_relu`` and
``relu_sigmoid`` do fire now and then. Every rule is an exact identity, so the rewritten
module must compute what the original computes.

For every (shape, N, density, rule count) the script times, in one process, the median of
``--repeat`` runs, each on a fresh GraphModule built outside the timed region:

* ``fxrewrite.rewrite(gm, rules)`` (copying mode) and ``fxrewrite.rewrite(gm, rules, inplace=True)``;
* ``torch.fx.replace_pattern`` applied rule by rule (one call per rule, as fx requires);
* the floors: one Python pass ``for n in gm.graph.nodes: pass`` and one ``gm.recompile()``;

checks that every rewritten module computes the same as the original on a ``(4,)`` tensor and
that fxrewrite and fx applied the expected number of ``neg_neg`` rewrites, then prints a table,
the log-log scaling exponents and a PASS/FAIL line for the performance targets
(``rewrite <= 2x recompile`` everywhere, scaling exponent <= 1.1).

The exit code is 0 when the targets are missed (this is a report, not a test); it is 1 only when
a correctness check fails or a measured call raises.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import json
import math
import operator
import pstats
import random
import signal
import statistics
import sys
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

import torch
from torch import fx

try:
    import fxrewrite
except ImportError:  # running from a checkout without the package installed
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    import fxrewrite

DEFAULT_SIZES = (1000, 4000, 16000, 64000)
QUICK_SIZES = (1000, 4000)
DEFAULT_DENSITIES = (0.0, 0.1, 0.5)
DEFAULT_RULE_COUNTS = (1, 10, 50)
SHAPES = ("chain", "dag")
WINDOW = 8
SEED = 20240611

#: Targets (see DESIGN.md, "Performance model").
TARGET_RATIO = 2.0  # rewrite <= 2x recompile
TARGET_EXPONENT = 1.1  # time ~ N^k with k <= 1.1

UNARY_OPS: tuple[Callable[..., Any], ...] = (torch.relu, torch.sigmoid, torch.tanh, torch.sin)
BINARY_OPS: tuple[Callable[..., Any], ...] = (operator.add, operator.mul)
OP_MIX = UNARY_OPS + BINARY_OPS
CHAIN_CONSTANTS = {operator.add: 0.5, operator.mul: 0.75}


# ----------------------------------------------------------------------------------------------
# graphs
# ----------------------------------------------------------------------------------------------


@dataclass
class GraphSpec:
    """A recipe for a synthetic graph: ``ops[i]`` computes value ``i + 1`` (value 0 is the
    placeholder ``x``); an int argument refers to a value, a float is a constant."""

    shape: str
    size: int
    density: float
    ops: list[tuple[Callable[..., Any], tuple[Any, ...]]]
    outputs: list[int]
    pairs: int

    @property
    def actual_density(self) -> float:
        return 2 * self.pairs / self.size


def _pair_probability(density: float) -> float:
    """Probability of planting a pair at a step that may hold one (never two pairs in a row).

    With pair probability q after a single op, pairs are a fraction q/(1+q) of the steps and
    their nodes a fraction 2q/(1+2q) of the nodes; solve for q.
    """
    if density <= 0:
        return 0.0
    if density >= 2 / 3:
        raise ValueError(f"density {density} too high: at most 2/3 of the nodes can be in non-adjacent pairs")
    return density / (2 * (1 - density))


def make_spec(shape: str, size: int, density: float, seed: int = SEED) -> GraphSpec:
    """The recipe of a ``shape`` graph of ``size`` nodes (placeholder and output included)."""
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; expected one of {SHAPES}")
    if size < 4:
        raise ValueError("size must be at least 4")
    rng = random.Random(f"{seed}-{shape}-{size}-{density}")
    q = _pair_probability(density)
    budget = size - 2  # placeholder and output
    ops: list[tuple[Callable[..., Any], tuple[Any, ...]]] = []
    is_neg: list[bool] = [False]  # per value: produced by torch.neg
    users: list[int] = [0]
    pairs = 0
    last_was_pair = True  # no pair on the placeholder itself

    def emit(target: Callable[..., Any], args: tuple[Any, ...], neg: bool = False) -> int:
        ops.append((target, args))
        is_neg.append(neg)
        users.append(0)
        for a in args:
            if isinstance(a, int):
                users[a] += 1
        return len(ops)

    if shape == "chain":
        prev = 0
        while len(ops) < budget:
            if not last_was_pair and len(ops) + 2 <= budget and rng.random() < q:
                inner = emit(torch.neg, (prev,), neg=True)
                prev = emit(torch.neg, (inner,), neg=True)
                pairs += 1
                last_was_pair = True
                continue
            op = rng.choice(OP_MIX)
            args = (prev, CHAIN_CONSTANTS[op]) if op in CHAIN_CONSTANTS else (prev,)
            prev = emit(op, args)
            last_was_pair = False
        return GraphSpec(shape, size, density, ops, [prev], pairs)

    pool: list[int] = [0]  # the last WINDOW values (inner negs excluded)
    pending: list[int] = []  # values that left the window unused: the next ops consume them

    def push(v: int) -> None:
        pool.append(v)
        if len(pool) > WINDOW:
            old = pool.pop(0)
            if users[old] == 0:
                pending.append(old)

    while len(ops) < budget:
        plant = not last_was_pair and len(ops) + 2 <= budget and rng.random() < q
        if plant and pending and is_neg[pending[0]]:
            plant = False  # consume the pending neg with a single op first
        if plant:
            if pending:
                src = pending.pop(0)
            else:
                src = rng.choice([v for v in pool if not is_neg[v]])
            inner = emit(torch.neg, (src,), neg=True)
            push(emit(torch.neg, (inner,), neg=True))
            pairs += 1
            last_was_pair = True
            continue
        op = rng.choice(OP_MIX)
        arity = 2 if op in BINARY_OPS else 1
        args: list[int] = []
        while pending and len(args) < arity:
            args.append(pending.pop(0))
        while len(args) < arity:
            choices = [v for v in pool if v not in args] or pool
            args.append(rng.choice(choices))
        push(emit(op, tuple(args)))
        last_was_pair = False
    outputs = pending + [v for v in pool if users[v] == 0]
    return GraphSpec(shape, size, density, ops, outputs, pairs)


def build(spec: GraphSpec) -> fx.GraphModule:
    """A fresh (recompiled) GraphModule from ``spec``."""
    g = fx.Graph()
    values: list[fx.Node] = [g.placeholder("x")]
    append = values.append
    call = g.call_function
    for target, args in spec.ops:
        append(call(target, tuple(values[a] if isinstance(a, int) else a for a in args)))
    outs = [values[i] for i in spec.outputs]
    g.output(outs[0] if len(outs) == 1 else tuple(outs))
    return fx.GraphModule(torch.nn.Module(), g)


# ----------------------------------------------------------------------------------------------
# rules
# ----------------------------------------------------------------------------------------------


@dataclass
class RuleDef:
    name: str
    pattern: Callable[..., Any]
    replacement: Callable[..., Any]


def _chain_fn(ops: Sequence[Callable[..., Any]]) -> Callable[..., Any]:
    """``ops[0](ops[1](...ops[-1](x)))`` as a function of ``x``."""

    def fn(x):  # type: ignore[no-untyped-def]
        for op in reversed(ops):
            x = op(x)
        return x

    return fn


def _unary_rule(ops: Sequence[Callable[..., Any]], keep: Sequence[Callable[..., Any]] | None = None) -> RuleDef:
    """``ops[0](ops[1](...(x))) => keep(...(x))``; by default ``keep`` drops the outermost op."""
    keep = ops[1:] if keep is None else keep
    name = "_".join(op.__name__ for op in ops)
    return RuleDef(name, _chain_fn(ops), _chain_fn(keep))


def _special_rules() -> list[RuleDef]:
    def neg_neg(x):  # type: ignore[no-untyped-def]
        return torch.neg(torch.neg(x))

    def neg_neg_r(x):  # type: ignore[no-untyped-def]
        return x

    def add_relu_relu_neg(x):  # type: ignore[no-untyped-def]
        return torch.relu(x) + torch.relu(torch.neg(x))

    def add_relu_relu_neg_r(x):  # type: ignore[no-untyped-def]
        return torch.abs(x)

    def mul_abs_sign(x):  # type: ignore[no-untyped-def]
        return torch.abs(x) * torch.sign(x)

    def mul_abs_sign_r(x):  # type: ignore[no-untyped-def]
        return x

    def neg_sub(x, y):  # type: ignore[no-untyped-def]
        return torch.neg(x - y)

    def neg_sub_r(x, y):  # type: ignore[no-untyped-def]
        return y - x

    return [
        RuleDef("neg_neg", neg_neg, neg_neg_r),
        _unary_rule((torch.relu, torch.relu)),
        _unary_rule((torch.relu, torch.sigmoid)),
        RuleDef("add_relu_relu_neg", add_relu_relu_neg, add_relu_relu_neg_r),
        RuleDef("mul_abs_sign", mul_abs_sign, mul_abs_sign_r),
        RuleDef("neg_sub", neg_sub, neg_sub_r),
    ]


def all_rule_defs() -> list[RuleDef]:
    """Every benchmark rule, in rule-set order (``neg_neg`` first); all distinct exact identities."""
    defs = _special_rules()
    nonneg = (torch.relu, torch.sigmoid, torch.exp, torch.abs, torch.square, torch.cosh)
    # outer op is idempotent on non-negative values: relu(p(x)) = p(x), abs(p(x)) = p(x)
    defs += [_unary_rule((outer, p)) for outer in (torch.relu, torch.abs) for p in nonneg
             if (outer, p) not in ((torch.relu, torch.relu), (torch.relu, torch.sigmoid))]
    # even functions: e(neg(x)) = e(x)
    defs += [_unary_rule((e, torch.neg), keep=(e,)) for e in (torch.abs, torch.cos, torch.cosh, torch.square)]
    # integer-valued results are fixed points of rounding: r1(r2(x)) = r2(x)
    rounding = (torch.floor, torch.ceil, torch.trunc, torch.round)
    defs += [_unary_rule((r1, r2)) for r1 in rounding for r2 in (*rounding, torch.sign)]
    # three-node patterns anchored at relu: relu(p(q(x))) = p(q(x)) for p >= 0
    defs += [_unary_rule((torch.relu, p, q)) for p in (torch.exp, torch.abs, torch.square, torch.cosh)
             for q in (torch.sin, torch.tanh, torch.sigmoid, torch.cos, torch.atan)]
    # an order that mixes anchors in the 10-rule set: specials, then one of each family
    head = [d for d in defs if d.name in {"relu_exp", "abs_neg", "cos_neg", "floor_floor"}]
    ordered = defs[:6] + head + [d for d in defs[6:] if d not in head]
    names = [d.name for d in ordered]
    assert len(set(names)) == len(names), names
    return ordered


def rule_defs(count: int) -> list[RuleDef]:
    """The first ``count`` benchmark rules."""
    ordered = all_rule_defs()
    if count > len(ordered):
        raise ValueError(f"at most {len(ordered)} benchmark rules are defined, asked for {count}")
    return ordered[:count]


def make_ruleset(count: int) -> tuple[fxrewrite.RuleSet, list[RuleDef]]:
    defs = rule_defs(count)
    rules = [fxrewrite.Rule.from_functions(d.pattern, d.replacement, name=d.name) for d in defs]
    return fxrewrite.RuleSet(rules), defs


# ----------------------------------------------------------------------------------------------
# timing
# ----------------------------------------------------------------------------------------------


class _Timeout(Exception):
    pass


def _alarm_available() -> bool:
    return hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()


#: ``cpu``: CPU time of this process (robust when other processes share the machine);
#: ``wall``: elapsed time.
CLOCKS: dict[str, Callable[[], float]] = {"cpu": time.process_time, "wall": time.perf_counter}


def _timed(fn: Callable[[], Any], limit: float | None = None,
           clock: Callable[[], float] = time.process_time) -> tuple[float, Any]:
    """Seconds taken by ``fn()`` (on ``clock``) and its result; raises ``_Timeout`` after
    ``limit`` seconds on the same clock (when an interval timer can be used: main thread, POSIX)."""
    gc.collect()
    use_alarm = limit is not None and _alarm_available()
    if use_alarm:
        cpu = clock is time.process_time
        which, signum = (signal.ITIMER_PROF, signal.SIGPROF) if cpu else (signal.ITIMER_REAL, signal.SIGALRM)

        def on_alarm(signum, frame):  # type: ignore[no-untyped-def]
            raise _Timeout()

        previous = signal.signal(signum, on_alarm)
        signal.setitimer(which, limit)
    try:
        start = clock()
        result = fn()
        elapsed = clock() - start
    finally:
        if use_alarm:
            signal.setitimer(which, 0)
            signal.signal(signum, previous)
    return elapsed, result


def _node_pass(gm: fx.GraphModule) -> None:
    for n in gm.graph.nodes:
        pass


def _fx_apply(gm: fx.GraphModule, defs: Sequence[RuleDef]) -> dict[str, int]:
    counts = {}
    for d in defs:
        counts[d.name] = len(fx.replace_pattern(gm, d.pattern, d.replacement))
    return counts


@dataclass
class Row:
    shape: str
    size: int
    density: float
    rules: int
    actual_density: float = 0.0
    planted: int = 0
    rewrite_ms: float | None = None
    inplace_ms: float | None = None
    fx_ms: float | None = None
    fx_status: str = "ok"  # ok | skipped | timeout | error
    fx_runs: int = 0  # runs in the fx median (fewer than --repeat when fx is slow)
    recompile_ms: float | None = None
    pass_ms: float | None = None
    rewrites: int | None = None
    neg_neg_rewrite: int | None = None
    neg_neg_inplace: int | None = None
    neg_neg_fx: int | None = None
    errors: list[str] = field(default_factory=list)

    @property
    def key(self) -> tuple[str, float, int]:
        return (self.shape, self.density, self.rules)


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) * 1e3 if xs else None


def _same_output(expected: Any, gm: fx.GraphModule, x: torch.Tensor, what: str, errors: list[str]) -> None:
    try:
        got = gm(x)
        torch.testing.assert_close(got, expected, equal_nan=True, rtol=1e-5, atol=1e-6)
    except Exception as exc:  # noqa: BLE001 - reported, not raised
        text = str(exc).strip().splitlines()
        errors.append(f"{what}: output differs from the original: {text[0] if text else type(exc).__name__}")


def _count_neg(gm: fx.GraphModule) -> int:
    return sum(1 for n in gm.graph.nodes if n.op == "call_function" and n.target is torch.neg)


class Bench:
    def __init__(self, args: argparse.Namespace, out: Any) -> None:
        self.args = args
        self.out = out
        self.rows: list[Row] = []
        self.rulesets = {k: make_ruleset(k) for k in args.rules}
        # fx history per (shape, density, rules): [(size, seconds)], and whether to give up
        self.fx_history: dict[tuple[str, float, int], list[tuple[int, float]]] = {}
        self.fx_given_up: set[tuple[str, float, int]] = set()
        self.x = torch.randn(4, generator=torch.Generator().manual_seed(0))

    def log(self, text: str) -> None:
        if self.args.verbose:
            print(text, file=self.out, flush=True)

    def fx_plan(self, key: tuple[str, float, int], size: int) -> str | None:
        """None to measure fx, or why it is skipped."""
        if self.args.no_fx:
            return "skipped"
        if self.args.fx_max_nodes is not None and size > self.args.fx_max_nodes:
            return "skipped"
        if self.args.fx_max_rules is not None and key[2] > self.args.fx_max_rules:
            return "skipped"
        if key in self.fx_given_up:
            return "skipped"
        hist = self.fx_history.get(key, [])
        if hist:
            (n1, t1) = hist[-1]
            slope = 1.0
            if len(hist) >= 2:
                (n0, t0) = hist[-2]
                if t0 > 0 and t1 > 0 and n1 != n0:
                    slope = max(1.0, math.log(t1 / t0) / math.log(n1 / n0))
            projected = t1 * (size / n1) ** slope
            if projected > self.args.fx_limit:
                return "skipped"
        return None

    def run_graph(self, shape: str, size: int, density: float) -> None:
        spec = make_spec(shape, size, density)
        base = build(spec)
        n_nodes = len(base.graph.nodes)
        expected = base(self.x)
        clock = CLOCKS[self.args.clock]
        # ``base`` lives through every measurement of this graph: freeze it (with everything else
        # alive now) so the gc.collect() before each timed call does not traverse it again.
        gc.collect()
        gc.freeze()
        try:
            self._run_rules(spec, base, expected, n_nodes, clock)
        finally:
            gc.unfreeze()

    def _run_rules(self, spec: GraphSpec, base: fx.GraphModule, expected: Any, n_nodes: int,
                   clock: Callable[[], float]) -> None:
        shape, density, repeat = spec.shape, spec.density, self.args.repeat
        self.log(f"  graph {shape} N={n_nodes} density={density:.0%} (actual {spec.actual_density:.1%}, "
                 f"{spec.pairs} neg pairs, {len(spec.outputs)} output(s))")
        for count in self.args.rules:
            ruleset, defs = self.rulesets[count]
            row = Row(shape, n_nodes, density, count, spec.actual_density, spec.pairs)
            fx_skip = self.fx_plan(row.key, n_nodes)
            times: dict[str, list[float]] = {"rewrite": [], "inplace": [], "fx": [], "pass": [], "recompile": []}
            last: dict[str, Any] = {}
            for _ in range(repeat):
                # the floors, interleaved with the runs they are compared with
                times["pass"].append(_timed(partial(_node_pass, base), clock=clock)[0])
                times["recompile"].append(_timed(base.recompile, clock=clock)[0])
                # copying mode: the input is never modified, so every run can take the base module
                try:
                    t, res = _timed(partial(fxrewrite.rewrite, base, ruleset), clock=clock)
                    times["rewrite"].append(t)
                    last["rewrite"] = res
                    if len(base.graph.nodes) != n_nodes or res.module is base:
                        row.errors.append("rewrite(inplace=False) modified its input module")
                        base = build(spec)
                except Exception as exc:  # noqa: BLE001
                    row.errors.append(f"rewrite raised {type(exc).__name__}: {exc}")
                # in place
                gm = build(spec)
                try:
                    t, res = _timed(partial(fxrewrite.rewrite, gm, ruleset, inplace=True), clock=clock)
                    times["inplace"].append(t)
                    last["inplace"] = res
                    if res.module is not gm:
                        row.errors.append("rewrite(inplace=True) did not return the module it was given")
                except Exception as exc:  # noqa: BLE001
                    row.errors.append(f"rewrite(inplace=True) raised {type(exc).__name__}: {exc}")
                # torch.fx, rule by rule; runs after the first stop once fx has used --fx-limit seconds
                if fx_skip is None and sum(times["fx"]) < self.args.fx_limit:
                    gm = build(spec)
                    try:
                        t, counts = _timed(partial(_fx_apply, gm, defs), limit=self.args.fx_limit, clock=clock)
                        times["fx"].append(t)
                        last["fx"] = (gm, counts)
                    except _Timeout:
                        fx_skip = "timeout"
                        self.fx_given_up.add(row.key)
                    except Exception as exc:  # noqa: BLE001
                        fx_skip = "error"
                        self.fx_given_up.add(row.key)
                        row.errors.append(f"torch.fx.replace_pattern raised {type(exc).__name__}: {exc}")
                gm = None
            row.pass_ms = _median(times["pass"])
            row.recompile_ms = _median(times["recompile"])
            row.rewrite_ms = _median(times["rewrite"])
            row.inplace_ms = _median(times["inplace"])
            if fx_skip is None and times["fx"]:
                row.fx_ms = _median(times["fx"])
                row.fx_runs = len(times["fx"])
                self.fx_history.setdefault(row.key, []).append((n_nodes, statistics.median(times["fx"])))
            else:
                row.fx_status = fx_skip or "skipped"
            self.verify(row, expected, last)
            self.rows.append(row)
            self.log("    " + format_row(row, self.args.fx_limit))
            last.clear()

    def verify(self, row: Row, expected: Any, last: dict[str, Any]) -> None:
        if "rewrite" in last:
            res = last["rewrite"]
            row.rewrites = res.report.rewrites
            row.neg_neg_rewrite = res.report.applied.get("neg_neg")
            _same_output(expected, res.module, self.x, "rewrite", row.errors)
            if _count_neg(res.module):
                row.errors.append(f"rewrite left {_count_neg(res.module)} torch.neg node(s)")
        if "inplace" in last:
            res = last["inplace"]
            row.neg_neg_inplace = res.report.applied.get("neg_neg")
            _same_output(expected, res.module, self.x, "rewrite(inplace=True)", row.errors)
        if "fx" in last:
            gm, counts = last["fx"]
            row.neg_neg_fx = counts.get("neg_neg")
            _same_output(expected, gm, self.x, "torch.fx.replace_pattern", row.errors)
        for what, got in (("rewrite", row.neg_neg_rewrite), ("inplace", row.neg_neg_inplace),
                          ("fx", row.neg_neg_fx)):
            if got is not None and got != row.planted:
                row.errors.append(f"{what} applied neg_neg {got} time(s), expected {row.planted} (planted pairs)")


# ----------------------------------------------------------------------------------------------
# report
# ----------------------------------------------------------------------------------------------

HEADER = (f"{'shape':<5} {'N':>6} {'dens':>4} {'rules':>5} {'rewrite ms':>10} {'inplace ms':>10} "
          f"{'fx ms':>9} {'recomp ms':>9} {'pass ms':>7} {'rw/rc':>5} {'ip/rc':>5} {'fx/rw':>6} "
          f"{'applied':>7}")


def _ms(v: float | None, width: int) -> str:
    if v is None:
        return f"{'-':>{width}}"
    return f"{v:>{width}.1f}" if v >= 10 else f"{v:>{width}.2f}"


def _x(v: float | None, width: int, prefix: str = "") -> str:
    if v is None:
        return f"{'-':>{width}}"
    return f"{prefix + format(v, '.2f'):>{width}}"


def format_row(row: Row, fx_limit: float) -> str:
    if row.fx_ms is not None:
        fx_cell = _ms(row.fx_ms, 9)
        fx_ratio = _x(_ratio(row.fx_ms, row.rewrite_ms), 6)
    elif row.fx_status == "timeout":
        fx_cell = f"{'>' + format(fx_limit * 1e3, '.0f'):>9}"
        fx_ratio = _x(_ratio(fx_limit * 1e3, row.rewrite_ms), 6, ">")
    else:
        fx_cell = f"{row.fx_status:>9}"
        fx_ratio = f"{'-':>6}"
    applied = "-" if row.rewrites is None else str(row.rewrites)
    text = (f"{row.shape:<5} {row.size:>6} {row.density:>4.0%} {row.rules:>5} {_ms(row.rewrite_ms, 10)} "
            f"{_ms(row.inplace_ms, 10)} {fx_cell} {_ms(row.recompile_ms, 9)} {_ms(row.pass_ms, 7)} "
            f"{_x(_ratio(row.rewrite_ms, row.recompile_ms), 5)} {_x(_ratio(row.inplace_ms, row.recompile_ms), 5)} "
            f"{fx_ratio} {applied:>7}")
    return text + ("  ERROR" if row.errors else "")


def _slope(points: list[tuple[int, float | None]]) -> float | None:
    pts = [(n, t) for n, t in points if t]
    if len(pts) < 2:
        return None
    (n0, t0), (n1, t1) = min(pts), max(pts)
    if n1 == n0:
        return None
    return math.log(t1 / t0) / math.log(n1 / n0)


def exponents(rows: list[Row]) -> list[dict[str, Any]]:
    """Log-log slope of time vs N from the smallest to the largest size, per configuration."""
    groups: dict[tuple[str, float, int], list[Row]] = {}
    for r in rows:
        groups.setdefault(r.key, []).append(r)
    out = []
    for (shape, density, rules), rs in groups.items():
        rs = sorted(rs, key=lambda r: r.size)
        out.append({
            "shape": shape, "density": density, "rules": rules,
            "from": rs[0].size, "to": rs[-1].size,
            "rewrite": _slope([(r.size, r.rewrite_ms) for r in rs]),
            "inplace": _slope([(r.size, r.inplace_ms) for r in rs]),
            "fx": _slope([(r.size, r.fx_ms) for r in rs]) if all(r.fx_ms for r in rs) else None,
            "recompile": _slope([(r.size, r.recompile_ms) for r in rs]),
        })
    return out


def _fmt_k(v: float | None) -> str:
    return f"{'-':>9}" if v is None else f"{v:>9.2f}"


def report(rows: list[Row], fx_limit: float, out: Any) -> dict[str, Any]:
    def p(text: str = "") -> None:
        print(text, file=out)

    p()
    p(HEADER)
    p("-" * len(HEADER))
    prev = None
    for r in sorted(rows, key=lambda r: (r.shape, r.density, r.rules, r.size)):
        if prev is not None and (r.shape, r.density) != prev:
            p()
        prev = (r.shape, r.density)
        p(format_row(r, fx_limit))
    p()
    exps = exponents(rows)
    p("scaling exponent k (time ~ N^k, log-log slope from the smallest to the largest N)")
    p(f"{'shape':<5} {'dens':>4} {'rules':>5} {'N range':>13} {'rewrite':>9} {'inplace':>9} {'fx':>9} {'recompile':>9}")
    for e in exps:
        p(f"{e['shape']:<5} {e['density']:>4.0%} {e['rules']:>5} {str(e['from']) + '-' + str(e['to']):>13} "
          f"{_fmt_k(e['rewrite'])} {_fmt_k(e['inplace'])} {_fmt_k(e['fx'])} {_fmt_k(e['recompile'])}")
    p()

    def worst(attr: str) -> tuple[float | None, Row | None]:
        best: tuple[float | None, Row | None] = (None, None)
        for r in rows:
            v = _ratio(getattr(r, attr), r.recompile_ms)
            if v is not None and (best[0] is None or v > best[0]):
                best = (v, r)
        return best

    def where(r: Row | None) -> str:
        return "" if r is None else f" at {r.shape} N={r.size} density={r.density:.0%} rules={r.rules}"

    def worst_k(attr: str) -> tuple[float | None, dict[str, Any] | None]:
        vals = [(e[attr], e) for e in exps if e[attr] is not None]
        return max(vals, key=lambda t: t[0]) if vals else (None, None)

    verdicts = {}
    lines = []
    for attr, label in (("rewrite_ms", "rewrite"), ("inplace_ms", "inplace")):
        v, r = worst(attr)
        ok = v is not None and v <= TARGET_RATIO
        verdicts[f"{label}_ratio"] = ok
        lines.append(f"  {label:<8} <= {TARGET_RATIO:g}x recompile at every size and rule count: "
                     f"{'PASS' if ok else 'FAIL'} (worst {v:.2f}x{where(r)})" if v is not None
                     else f"  {label:<8} <= {TARGET_RATIO:g}x recompile: FAIL (not measured)")
    multi_size = any(e["from"] != e["to"] for e in exps)
    for label in ("rewrite", "inplace"):
        k, e = worst_k(label)
        if not multi_size:
            lines.append(f"  {label:<8} scaling exponent <= {TARGET_EXPONENT}: n/a (one size only)")
            continue
        ok = k is not None and k <= TARGET_EXPONENT
        verdicts[f"{label}_exponent"] = ok
        at = "" if e is None else f" at {e['shape']} density={e['density']:.0%} rules={e['rules']}"
        lines.append(f"  {label:<8} scaling exponent <= {TARGET_EXPONENT}: {'PASS' if ok else 'FAIL'} "
                     f"(worst {k:.3f}{at})" if k is not None else f"  {label} scaling exponent: FAIL (not measured)")
    errors = [(r, e) for r in rows for e in r.errors]
    p("targets (DESIGN.md, Performance model):")
    for line in lines:
        p(line)
    overall = all(verdicts.values())
    p(f"TARGETS: {'PASS' if overall else 'FAIL'}")
    if errors:
        p()
        p(f"CORRECTNESS: FAIL ({len(errors)} problem(s))")
        for r, e in errors[:40]:
            p(f"  {r.shape} N={r.size} density={r.density:.0%} rules={r.rules}: {e}")
        if len(errors) > 40:
            p(f"  ... and {len(errors) - 40} more")
    else:
        p("CORRECTNESS: PASS (every rewritten module matches the original on a (4,) input; neg_neg "
          "applied once per planted pair by rewrite, inplace and fx)")
    return {"verdicts": verdicts, "targets_pass": overall, "correct": not errors, "exponents": exps}


# ----------------------------------------------------------------------------------------------
# profiling
# ----------------------------------------------------------------------------------------------


def profile(shape: str, size: int, density: float, rules: int, out: Any, top: int = 15) -> None:
    """cProfile one copying-mode ``rewrite``; print the top entries by cumulative time from
    fxrewrite's own modules, then overall. (cProfile's own wall-clock timer: a Python-level
    CPU-time timer would multiply the profiling overhead; profile on a quiet machine.)"""
    spec = make_spec(shape, size, density)
    ruleset, _ = make_ruleset(rules)
    gm = build(spec)
    gc.collect()
    prof = cProfile.Profile()
    prof.enable()
    fxrewrite.rewrite(gm, ruleset)
    prof.disable()
    for title, restriction in ((f"fxrewrite modules, top {top} by cumulative time", r"fxrewrite[/\\]"),
                               (f"all functions, top {top} by cumulative time", None)):
        buf = io.StringIO()
        stats = pstats.Stats(prof, stream=buf).sort_stats("cumulative")
        if restriction:
            stats.print_stats(restriction, top)
        else:
            stats.print_stats(top)
        print(f"\nprofile of fxrewrite.rewrite: {shape} N={len(gm.graph.nodes)} density={density:.0%} "
              f"rules={rules} -- {title}", file=out)
        text = buf.getvalue()
        start = text.find("   ncalls")
        print(text[start:] if start >= 0 else text, file=out)


# ----------------------------------------------------------------------------------------------
# command line
# ----------------------------------------------------------------------------------------------


def _ints(text: str) -> list[int]:
    return [int(float(t)) for t in text.split(",") if t.strip()]


def _floats(text: str) -> list[float]:
    return [float(t.rstrip("%")) / (100 if t.endswith("%") else 1) for t in text.split(",") if t.strip()]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="bench_rewrite.py",
        description="Time fxrewrite.rewrite against torch.fx.replace_pattern and the floors "
                    "(one pass over graph.nodes, one gm.recompile()) on synthetic fx graphs.")
    ap.add_argument("--sizes", type=_ints, default=None,
                    help="graph sizes in nodes, comma separated (default 1000,4000,16000,64000; "
                         "--quick: 1000,4000)")
    ap.add_argument("--repeat", type=int, default=None, help="runs per measurement, median reported "
                                                             "(default 3; --quick: 1)")
    ap.add_argument("--quick", action="store_true", help="sizes 1000,4000 and 1 repeat (about 30 s)")
    ap.add_argument("--shapes", type=lambda s: [t for t in s.split(",") if t], default=list(SHAPES),
                    help="chain, dag or both (default chain,dag)")
    ap.add_argument("--densities", type=_floats, default=list(DEFAULT_DENSITIES),
                    help="fractions of nodes in planted neg(neg(x)) pairs (default 0,0.1,0.5; '10%%' works)")
    ap.add_argument("--rules", type=_ints, default=list(DEFAULT_RULE_COUNTS),
                    help="rule-set sizes (default 1,10,50)")
    ap.add_argument("--fx-limit", type=float, default=15.0,
                    help="seconds allowed to one torch.fx measurement (all rules of one run); larger graphs "
                         "of a configuration that hit it, or are projected to, print 'timeout'/'skipped' "
                         "(default 15)")
    ap.add_argument("--fx-max-nodes", type=int, default=None, help="skip torch.fx above this many nodes")
    ap.add_argument("--fx-max-rules", type=int, default=None,
                    help="skip torch.fx for rule sets larger than this (default: no limit; --quick: 1)")
    ap.add_argument("--no-fx", action="store_true", help="do not time torch.fx.replace_pattern")
    ap.add_argument("--clock", choices=sorted(CLOCKS), default="cpu",
                    help="cpu: CPU time of this process (default; robust on a shared machine); wall: elapsed time")
    ap.add_argument("--json", type=Path, default=None, help="also write the rows and verdicts to this file")
    ap.add_argument("--profile", action="store_true",
                    help="afterwards, cProfile one rewrite of the first shape/density/rule count at the "
                         "largest size and print the top entries")
    ap.add_argument("-q", "--quiet", dest="verbose", action="store_false",
                    help="print only the final table (no progress lines)")
    args = ap.parse_args(argv)
    if args.sizes is None:
        args.sizes = list(QUICK_SIZES if args.quick else DEFAULT_SIZES)
    if args.repeat is None:
        args.repeat = 1 if args.quick else 3
    if args.fx_max_rules is None and args.quick:
        args.fx_max_rules = 1
    if args.repeat < 1:
        ap.error("--repeat must be at least 1")
    for s in args.shapes:
        if s not in SHAPES:
            ap.error(f"unknown shape {s!r}; choose from {', '.join(SHAPES)}")
    for d in args.densities:
        if not 0 <= d < 2 / 3:
            ap.error(f"density {d} out of range [0, 2/3)")
    for k in args.rules:
        if not 1 <= k <= len(all_rule_defs()):
            ap.error(f"rule count {k} out of range 1..{len(all_rule_defs())}")
    args.sizes = sorted(set(args.sizes))
    return args


def main(argv: Sequence[str] | None = None, out: Any = None) -> int:
    """Run the benchmark and print the report; returns the exit code (0 unless a correctness
    check failed or a measured call raised)."""
    out = out if out is not None else sys.stdout
    args = parse_args(argv)
    started = time.perf_counter()
    print(f"fxrewrite {fxrewrite.__version__}, torch {torch.__version__}, Python {sys.version.split()[0]}; "
          f"sizes {','.join(map(str, args.sizes))}, repeat {args.repeat} (median), shapes {','.join(args.shapes)}, "
          f"densities {','.join(f'{d:.0%}' for d in args.densities)}, rules {','.join(map(str, args.rules))}, "
          f"fx limit {args.fx_limit:g} s, clock {args.clock}", file=out, flush=True)
    bench = Bench(args, out)
    # gc.collect() runs before every timed call; freezing what start-up created (torch, the rules)
    # keeps those collections cheap. Collection stays enabled inside the timed regions.
    gc.collect()
    gc.freeze()
    try:
        for shape in args.shapes:
            for density in args.densities:
                for size in args.sizes:
                    bench.run_graph(shape, size, density)
    finally:
        gc.unfreeze()
    summary = report(bench.rows, args.fx_limit, out)
    print(f"\ntotal benchmark time {time.perf_counter() - started:.1f} s", file=out)
    if args.json is not None:
        args.json.write_text(json.dumps({"rows": [asdict(r) for r in bench.rows], **summary}, indent=1, default=str))
    if args.profile:
        profile(args.shapes[0], max(args.sizes), args.densities[0], args.rules[0], out)
    return 0 if summary["correct"] else 1


if __name__ == "__main__":
    sys.exit(main())
