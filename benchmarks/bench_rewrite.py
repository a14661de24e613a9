"""Benchmark ``fxrewrite.rewrite`` against its floors (issue 24), ``gm.recompile()`` and
``torch.fx.replace_pattern``.

Usage::

    python benchmarks/bench_rewrite.py                  # every workload, 4k/8k/64k nodes, median of 3
    python benchmarks/bench_rewrite.py --quick          # small sizes, one run each (a smoke test, ~30 s)
    python benchmarks/bench_rewrite.py --workloads create3 --sizes 8000 --profile
    python benchmarks/bench_rewrite.py --check-library  # also time `fxrewrite check -j 2` on the shipped rules

The graphs are ordinary Python programs traced by ``torch.fx.symbolic_trace`` (:class:`Program`):
a walk driven by a fixed-seed RNG (the same program every run) applies filler ops (``relu,
sigmoid, tanh, sin, add, mul``) either along a ``chain`` (each op reads the previous value) or in
a ``dag`` (each op reads 1-2 of the last 8 values), and now and then calls the workload's *block*,
a Python function the rules match (never two blocks back to back). The *density* is the fraction
of the graph's nodes inside planted blocks. Workloads:

* ``create1``, ``create3``, ``create10``: R rules ``a_i(b_i(x)) => k new nodes`` (``a_i, b_i``
  distinct ops absent from the filler; the replacement is a chain of ``k`` scale/shift/clamp
  ops); each planted block is a random rule's pattern. The rewritten module must compute what
  the same program with each block replaced by hand (traced again) computes.
* ``delete``: the original benchmark, ``neg(neg(x)) => x`` plus identities that are tried and
  rarely fire (R of them); the output must not change.
* ``modules``: ``bn_j(conv_j(x))`` pairs of 1x1 ``Conv2d``/``BatchNorm2d`` submodules (eval mode),
  rewritten by the shipped ``rules/fusion.py`` (``conv_bn_fold`` creates one folded ``Conv2d``
  per match: module captures); the output must not change (up to rounding).
* ``attention``: ``k = x * 0.5; v = x + 0.25; softmax(x @ k.transpose(-2, -1) * 0.35, -1) @ v``
  blocks (7 nodes, 5 matched) rewritten to ``scaled_dot_product_attention`` by the shipped
  ``rules/attention.py`` (11 rules); torch.fx gets the one pattern that matches.

Each row times, in one process, the median of ``--repeat`` runs of: copying ``rewrite(gm, rules)``,
``rewrite(gm, rules, inplace=True)`` on a fresh module, ``torch.fx.replace_pattern`` rule by rule
(when it fits in ``--fx-limit`` seconds), and the floors, interleaved: the **one-pass copying
floor** (copy the nodes that stay with ``Graph.node_copy`` and emit each replacement in its place
with ``Graph.create_node``, one pass, the matches known in advance, then the new module's code),
the **in-place floor** (the same edits made by hand in place, then ``recompile()``), and, as
context, "copy, then edit", one ``recompile()`` and one pass over ``graph.nodes``. Each floor
must build the graph the rewrite builds (same nodes by op and target) and compute what it must.
Times are CPU time of this process (``--clock cpu``) so other processes barely move them.
Memory: ``tracemalloc`` peak of one copying ``rewrite`` against ``recompile()``'s own peak plus
the retained size of one copy of the graph.

The report gives each row's verdict against the two floor targets (rewrite / copying floor
<= 1.25, in place / in-place floor <= 1.2) and ends with the issue's target table. The exit
code is 1 only when a correctness check fails or a measured call raises; missed targets are
reported, not failed. Rule-count workloads are in ``bench_rules.py``.
"""

from __future__ import annotations

import argparse
import collections
import copy
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
import subprocess
import sys
import threading
import time
import tracemalloc
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

import torch  # noqa: E402
from torch import fx, nn  # noqa: E402
from torch.nn.utils.fusion import fuse_conv_bn_weights  # noqa: E402

try:
    import fxrewrite
except ImportError:  # running from a checkout without the package installed
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    import fxrewrite
from fxrewrite._gc import collections_paused  # noqa: E402
from fxrewrite._torch import add_node, fresh_node_name, node_name_base  # noqa: E402
from fxrewrite.target import _copy_graph, to_graph_module  # noqa: E402

RULES_DIR = Path(__file__).resolve().parent.parent / "rules"
SEED = 20240611
WINDOW = 8
DEFAULT_SIZES = (4000, 8000, 64000)
QUICK_SIZES = (500, 1000)
SHAPES = ("chain", "dag")
WORKLOADS = ("create1", "create3", "create10", "delete", "modules", "attention")

UNARY_OPS: tuple[Callable[..., Any], ...] = (torch.relu, torch.sigmoid, torch.tanh, torch.sin)
BINARY_OPS: tuple[Callable[..., Any], ...] = (operator.add, operator.mul)
OP_MIX = UNARY_OPS + BINARY_OPS
CHAIN_CONSTANTS = {operator.add: 0.5, operator.mul: 0.75}
#: Ops of the created-node rules' patterns: bounded (no overflow along a 64k chain), absent from the filler.
PATTERN_OPS: tuple[Callable[..., Any], ...] = (torch.neg, torch.cos, torch.atan, torch.erf, torch.abs, torch.sign,
                                               torch.floor, torch.ceil, torch.trunc, torch.round, torch.asinh)
ATTENTION_SCALE = 0.35
CHECK_TARGET_SECONDS = 35.0  # issue 24: `fxrewrite check rules -j 2`


# ----------------------------------------------------------------------------------------------
# the grid
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Config:
    """One line of the grid: a workload on a graph shape at a density with R rules (``rules`` is
    0 for the workloads that use a shipped rule file: R is that file's size)."""

    workload: str
    shape: str
    density: float
    rules: int


FULL_GRID = (
    Config("create3", "chain", 0.5, 10), Config("create3", "chain", 0.1, 10), Config("create3", "chain", 0.1, 50),
    Config("create3", "chain", 0.5, 50), Config("create3", "dag", 0.5, 10),
    Config("create1", "chain", 0.5, 10), Config("create10", "chain", 0.5, 10),
    Config("delete", "chain", 0.1, 10), Config("delete", "dag", 0.5, 50),
    Config("modules", "chain", 0.1, 0), Config("attention", "chain", 0.5, 0),
)


def quick_grid() -> tuple[Config, ...]:
    """One configuration per workload."""
    seen: dict[str, Config] = {}
    for c in FULL_GRID:
        seen.setdefault(c.workload, c)
    return tuple(seen.values())


# ----------------------------------------------------------------------------------------------
# graphs: ordinary Python programs, traced by torch.fx
# ----------------------------------------------------------------------------------------------


@dataclass
class GraphSpec:
    """A synthetic program, traced, and where its planted blocks are."""

    config: Config
    size: int
    #: per planted block: (graph index of its first node, of its last node, rule index); node 0
    #: is the placeholder ``x``
    blocks: list[tuple[int, int, int]]
    program: Program
    traced: fx.GraphModule
    #: graph indices of the nodes a rewrite erases (the blocks' matched nodes)
    erased: frozenset[int] = frozenset()

    @property
    def actual_density(self) -> float:
        return sum(last - first + 1 for first, last, _ in self.blocks) / self.size


class Workload:
    """What a workload plants (a Python function of the block's input), the rules that rewrite
    it, and what the rewrite leaves in its place (another Python function)."""

    name = ""
    block_size = 2
    exact = True  # the rewritten module computes exactly what ``expected`` computes
    needs_modules = False  # blocks call submodules: the program runs once eagerly to create them

    def __init__(self, config: Config) -> None:
        self.config = config
        self._templates: dict[int, fx.Graph] = {}

    def example_input(self) -> torch.Tensor:
        return torch.randn(4, generator=torch.Generator().manual_seed(0))

    def choose(self, rng: random.Random) -> int:
        """The rule the next block is planted for."""
        return 0

    def block(self, program: Program, rule: int, x: Any) -> Any:
        """The planted block reading ``x``: ``block_size`` ops, a pattern of ``rule``."""
        raise NotImplementedError

    def replaced(self, program: Program, rule: int, x: Any) -> Any:
        """What the rewrite leaves for a block of ``rule`` reading ``x`` (for ``expected``)."""
        raise NotImplementedError

    def ruleset(self) -> fxrewrite.RuleSet:
        raise NotImplementedError

    def fx_rules(self) -> list[tuple[str, Callable[..., Any], Callable[..., Any]]] | None:
        """(name, pattern, replacement) for ``torch.fx.replace_pattern``, or None when fx cannot."""
        return None

    def expected_module(self, spec: GraphSpec) -> fx.GraphModule:
        """A module computing what the rewritten graph must compute."""
        return build(spec, rewritten=self.exact)

    # -- the floors' edits (no matching: where the blocks are is known) ---------------------------
    def replacement(self, rule: int) -> Callable[..., Any]:
        """The replacement as a function of :meth:`replacement_inputs` (traced once per rule)."""
        return lambda x: self.replaced(Program.for_templates(), rule, x)

    def replacement_inputs(self, block: list[fx.Node]) -> tuple[fx.Node, ...]:
        return (block[0].args[0],)  # type: ignore[return-value]

    def matched(self, block: list[fx.Node]) -> list[fx.Node]:
        """The block's nodes a rewrite erases."""
        return block

    def emit(self, graph: fx.Graph, block: list[fx.Node], rule: int, value_of: Callable[[fx.Node], fx.Node],
             make: Callable[..., fx.Node], add_module: Callable[[str, nn.Module], Any]) -> fx.Node:
        """Create, at ``graph``'s insertion point, what the rule leaves for ``block`` (the nodes of
        the source graph, ``value_of`` mapping them into ``graph``) and return the value replacing
        the block's last node. ``make(graph, op, target, args, kwargs)`` creates one node."""
        template = self._templates.get(rule)
        if template is None:
            template = self._templates[rule] = fx.symbolic_trace(self.replacement(rule)).graph
        inputs = iter(self.replacement_inputs(block))
        local: dict[fx.Node, Any] = {}
        for t in template.nodes:
            if t.op == "placeholder":
                local[t] = value_of(next(inputs))
            elif t.op == "output":
                return local[t.args[0]]  # type: ignore[index]
            else:
                args = tuple(local[a] if isinstance(a, fx.Node) else a for a in t.args)
                kwargs = {k: local[v] if isinstance(v, fx.Node) else v for k, v in t.kwargs.items()}
                local[t] = make(graph, t.op, t.target, args, kwargs)
        raise AssertionError("a template without output")


def _pair_rules(count: int) -> list[tuple[Callable[..., Any], Callable[..., Any]]]:
    """``count`` distinct (outer, inner) pattern op pairs, a fixed permutation of all pairs."""
    pairs = [(a, b) for a in PATTERN_OPS for b in PATTERN_OPS if a is not b]
    random.Random(SEED).shuffle(pairs)
    if count > len(pairs):
        raise ValueError(f"at most {len(pairs)} created-node rules are defined, asked for {count}")
    return pairs[:count]


def scale_shift_clamp(x: Any, rule: int, k: int) -> Any:
    """A created-node rule's replacement: ``k`` ops, scale, shift, clamp, repeated."""
    for j in range(k):
        kind = j % 3
        if kind == 0:
            x = x * (0.5 + rule / 128)
        elif kind == 1:
            x = x + 0.25
        else:
            x = torch.clamp(x, -4.0, 4.0)
    return x


class CreateNodes(Workload):
    """R rules ``a_i(b_i(x)) => k new nodes``."""

    def __init__(self, config: Config, k: int) -> None:
        super().__init__(config)
        self.k = k
        self.name = f"create{k}"
        self.pairs = _pair_rules(config.rules)

    def choose(self, rng: random.Random) -> int:
        return rng.randrange(len(self.pairs))

    def block(self, program: Program, rule: int, x: Any) -> Any:
        outer, inner = self.pairs[rule]
        return outer(inner(x))

    def replaced(self, program: Program, rule: int, x: Any) -> Any:
        return scale_shift_clamp(x, rule, self.k)

    def _functions(self, rule: int) -> tuple[str, Callable[..., Any], Callable[..., Any]]:
        outer, inner = self.pairs[rule]

        def pattern(x):  # type: ignore[no-untyped-def]
            return outer(inner(x))

        def replacement(x):  # type: ignore[no-untyped-def]
            return scale_shift_clamp(x, rule, self.k)

        return f"{outer.__name__}_{inner.__name__}_to_{self.k}", pattern, replacement

    def ruleset(self) -> fxrewrite.RuleSet:
        defs = [self._functions(i) for i in range(len(self.pairs))]
        return fxrewrite.RuleSet([fxrewrite.Rule.from_functions(p, r, name=n) for n, p, r in defs])

    def fx_rules(self) -> list[tuple[str, Callable[..., Any], Callable[..., Any]]]:
        return [self._functions(i) for i in range(len(self.pairs))]


class DeleteNodes(Workload):
    """``neg(neg(x)) => x`` first, then identities over unary ops that are tried and rarely fire."""

    name = "delete"

    def block(self, program: Program, rule: int, x: Any) -> Any:
        return torch.neg(torch.neg(x))

    def replaced(self, program: Program, rule: int, x: Any) -> Any:
        return x

    def ruleset(self) -> fxrewrite.RuleSet:
        return fxrewrite.RuleSet([fxrewrite.Rule.from_functions(p, r, name=n) for n, p, r in self.fx_rules()])

    def fx_rules(self) -> list[tuple[str, Callable[..., Any], Callable[..., Any]]]:
        return identity_rules(self.config.rules)


def identity_rules(count: int) -> list[tuple[str, Callable[..., Any], Callable[..., Any]]]:
    """``neg_neg`` then exact identities ``outer(p(x)) => p(x)`` for ``outer`` idempotent on
    p's values, and ``e(neg(x)) => e(x)`` for even ``e``."""

    def neg_neg(x):  # type: ignore[no-untyped-def]
        return torch.neg(torch.neg(x))

    def same(x):  # type: ignore[no-untyped-def]
        return x

    defs = [("neg_neg", neg_neg, same)]
    nonneg = (torch.relu, torch.sigmoid, torch.exp, torch.abs, torch.square, torch.cosh)
    for outer in (torch.relu, torch.abs):
        for p in nonneg:
            defs.append((f"{outer.__name__}_{p.__name__}", _compose(outer, p), _compose(p)))
    for e in (torch.abs, torch.cos, torch.cosh, torch.square):
        defs.append((f"{e.__name__}_neg", _compose(e, torch.neg), _compose(e)))
    rounding = (torch.floor, torch.ceil, torch.trunc, torch.round)
    for r1 in rounding:
        for r2 in (*rounding, torch.sign):
            defs.append((f"{r1.__name__}_{r2.__name__}", _compose(r1, r2), _compose(r2)))
    for p in (torch.exp, torch.abs, torch.square, torch.cosh):
        for q in (torch.sin, torch.tanh, torch.sigmoid, torch.cos, torch.atan):
            defs.append((f"relu_{p.__name__}_{q.__name__}", _compose(torch.relu, p, q), _compose(p, q)))
    if count > len(defs):
        raise ValueError(f"at most {len(defs)} identity rules are defined, asked for {count}")
    return defs[:count]


def _compose(*ops: Callable[..., Any]) -> Callable[..., Any]:
    def fn(x):  # type: ignore[no-untyped-def]
        for op in reversed(ops):
            x = op(x)
        return x

    return fn


class FoldConvBn(Workload):
    """``bn(conv(x))`` submodule pairs, folded by the shipped ``conv_bn_fold`` (module captures)."""

    name = "modules"
    exact = False
    needs_modules = True

    def example_input(self) -> torch.Tensor:
        return torch.randn(1, 1, 2, 2, generator=torch.Generator().manual_seed(0))

    def block(self, program: Program, rule: int, x: Any) -> Any:
        j = len(program.blocks)
        if not hasattr(program, f"conv{j}"):  # the eager run creates them; the trace finds them
            generator = torch.Generator().manual_seed(j)
            conv, bn = nn.Conv2d(1, 1, 1), nn.BatchNorm2d(1)
            with torch.no_grad():
                conv.weight.uniform_(0.5, 1.5, generator=generator)
                bn.running_mean.uniform_(-0.5, 0.5, generator=generator)
                bn.running_var.uniform_(0.5, 1.5, generator=generator)
            program.add_module(f"conv{j}", conv)
            program.add_module(f"bn{j}", bn.eval())
        return getattr(program, f"bn{j}")(getattr(program, f"conv{j}")(x))

    def ruleset(self) -> fxrewrite.RuleSet:
        return fxrewrite.load_rules(RULES_DIR / "fusion.py")

    def emit(self, graph: fx.Graph, block: list[fx.Node], rule: int, value_of: Callable[[fx.Node], fx.Node],
             make: Callable[..., fx.Node], add_module: Callable[[str, nn.Module], Any]) -> fx.Node:
        program = block[0].graph.owning_module
        assert program is not None
        conv, bn = (program.get_submodule(str(n.target)) for n in block)
        name = f"{block[0].target}_folded"
        folded = copy.deepcopy(conv)
        assert isinstance(bn, nn.BatchNorm2d) and bn.running_mean is not None and bn.running_var is not None
        assert isinstance(folded, nn.Conv2d)
        folded.weight, folded.bias = fuse_conv_bn_weights(conv.weight, conv.bias, bn.running_mean, bn.running_var,
                                                          bn.eps, bn.weight, bn.bias)
        add_module(name, folded)
        return make(graph, "call_module", name, (value_of(block[0].args[0]),), {})  # type: ignore[arg-type]


class Attention(Workload):
    """``softmax(q @ k.transpose(-2, -1) * s, -1) @ v`` blocks (q the block's input, k and v
    computed from it), rewritten to SDPA by the shipped ``rules/attention.py``."""

    name = "attention"
    block_size = 7
    exact = False

    def example_input(self) -> torch.Tensor:
        return torch.randn(1, 3, 4, generator=torch.Generator().manual_seed(0))

    def block(self, program: Program, rule: int, x: Any) -> Any:
        k, v = x * 0.5, x + 0.25
        return attention(x, k, v)

    def replaced(self, program: Program, rule: int, x: Any) -> Any:
        return sdpa(x, x * 0.5, x + 0.25)

    def replacement(self, rule: int) -> Callable[..., Any]:
        return sdpa

    def replacement_inputs(self, block: list[fx.Node]) -> tuple[fx.Node, ...]:
        return block[0].args[0], block[0], block[1]  # type: ignore[return-value]

    def matched(self, block: list[fx.Node]) -> list[fx.Node]:
        return block[2:]  # k and v stay: the rule binds them as variables

    def ruleset(self) -> fxrewrite.RuleSet:
        return fxrewrite.load_rules(RULES_DIR / "attention.py")

    def fx_rules(self) -> list[tuple[str, Callable[..., Any], Callable[..., Any]]]:
        return [("attention", attention, sdpa)]


def attention(q: Any, k: Any, v: Any) -> Any:
    return torch.softmax(q @ k.transpose(-2, -1) * ATTENTION_SCALE, -1) @ v


def sdpa(q: Any, k: Any, v: Any) -> Any:
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=ATTENTION_SCALE)


def workload(config: Config) -> Workload:
    if config.workload.startswith("create"):
        return CreateNodes(config, int(config.workload[len("create"):]))
    return {"delete": DeleteNodes, "modules": FoldConvBn, "attention": Attention}[config.workload](config)


def _plant_probability(density: float, block: int) -> float:
    """Probability of planting at a step that may hold a block (never two blocks in a row):
    blocks of ``block`` nodes are a fraction ``block*q / (1 + block*q)`` of the nodes."""
    if density <= 0:
        return 0.0
    if density >= block / (block + 1):
        raise ValueError(f"density {density} too high for non-adjacent blocks of {block} nodes")
    return density / (block * (1 - density))


class Program(nn.Module):
    """A synthetic program of ``size`` nodes (placeholder and output included), as Python: a
    walk driven by a fixed-seed RNG (the same program every run) that applies filler ops
    (``relu, sigmoid, tanh, sin, add, mul``) and, now and then, the workload's block (its
    pattern; with ``rewritten``, what the rewrite leaves instead). ``chain``: each op reads the
    previous value; ``dag``: each op reads 1-2 of the last :data:`WINDOW` values, values leaving
    the window unused are read next, and the values nobody reads are the outputs. Each call
    records where the blocks are, counted in graph nodes (:attr:`blocks`)."""

    def __init__(self, work: Workload | None, size: int, *, rewritten: bool = False) -> None:
        super().__init__()
        self.work, self.size, self.rewritten = work, size, rewritten
        self.blocks: list[tuple[int, int, int]] = []

    @classmethod
    def for_templates(cls) -> Program:
        return cls(None, 0)

    def forward(self, x: Any) -> Any:
        assert self.work is not None
        self.blocks = []
        config = self.work.config
        if config.shape not in SHAPES:
            raise ValueError(f"unknown shape {config.shape!r}; expected one of {SHAPES}")
        rng = random.Random(f"{SEED}-{config}-{self.size}")
        return (self._chain if config.shape == "chain" else self._dag)(rng, x)

    def _plant(self, rng: random.Random, x: Any, count: int) -> Any:
        """The block reading ``x``, its nodes counted from ``count + 1``."""
        assert self.work is not None
        rule = self.work.choose(rng)
        self.blocks.append((count + 1, count + self.work.block_size, rule))
        return (self.work.replaced if self.rewritten else self.work.block)(self, rule, x)

    def _may_plant(self, rng: random.Random, count: int, last_was_block: bool) -> bool:
        assert self.work is not None
        q = _plant_probability(self.work.config.density, self.work.block_size)
        return not last_was_block and count + self.work.block_size <= self.size - 2 and rng.random() < q

    def _chain(self, rng: random.Random, x: Any) -> Any:
        assert self.work is not None
        count, last_was_block, budget = 0, True, self.size - 2  # no block on the placeholder itself
        while count < budget:
            if self._may_plant(rng, count, last_was_block):
                x, count, last_was_block = self._plant(rng, x, count), count + self.work.block_size, True
                continue
            op = rng.choice(OP_MIX)
            x = op(x, CHAIN_CONSTANTS[op]) if op in CHAIN_CONSTANTS else op(x)
            count, last_was_block = count + 1, False
        return x

    def _dag(self, rng: random.Random, x: Any) -> Any:
        """Values are named by the graph index of their node (0: the placeholder)."""
        assert self.work is not None
        values, users = {0: x}, {0: 0}
        pool: list[int] = [0]  # the last WINDOW values
        pending: list[int] = []  # values that left the window unused: the next ops consume them
        planted: set[int] = set()

        def push(v: int, value: Any) -> None:
            values[v], users[v] = value, 0
            pool.append(v)
            if len(pool) > WINDOW:
                old = pool.pop(0)
                if users[old] == 0:
                    pending.append(old)

        count, last_was_block, budget = 0, True, self.size - 2
        while count < budget:
            if self._may_plant(rng, count, last_was_block):
                candidates = [v for v in pool if v not in planted] or pool
                src = pending.pop(0) if pending and pending[0] not in planted else rng.choice(candidates)
                users[src] += 1
                value = self._plant(rng, values[src], count)
                count, last_was_block = count + self.work.block_size, True
                planted.add(count)
                push(count, value)
                continue
            op = rng.choice(OP_MIX)
            arity = 2 if op in BINARY_OPS else 1
            args: list[int] = []
            while pending and len(args) < arity:
                args.append(pending.pop(0))
            while len(args) < arity:
                args.append(rng.choice([v for v in pool if v not in args] or pool))
            for a in args:
                users[a] += 1
            count, last_was_block = count + 1, False
            push(count, op(*(values[a] for a in args)))
        outputs = pending + [v for v in pool if users[v] == 0]
        return values[outputs[0]] if len(outputs) == 1 else tuple(values[v] for v in outputs)


def make_spec(work: Workload, size: int) -> GraphSpec:
    """The program of ``size`` nodes for ``work``, traced by ``torch.fx.symbolic_trace``."""
    program = Program(work, size)
    if work.needs_modules:
        with torch.no_grad():
            program(work.example_input())  # creates the blocks' submodules, which the trace then calls
    traced = fx.symbolic_trace(program)
    nodes = list(traced.graph.nodes)
    if len(nodes) != size:
        raise AssertionError(f"the {work.name} program traced to {len(nodes)} nodes, expected {size}")
    position = {n: i for i, n in enumerate(nodes)}
    erased = frozenset(position[n] for first, last, _ in program.blocks
                       for n in work.matched(nodes[first:last + 1]))
    return GraphSpec(work.config, size, list(program.blocks), program, traced, erased)


def build(spec: GraphSpec, rewritten: bool = False) -> fx.GraphModule:
    """A fresh (recompiled) GraphModule of ``spec``'s program; with ``rewritten``, of the program
    with each planted block replaced by what the rule leaves in its place, traced."""
    if rewritten:
        assert spec.program.work is not None
        return fx.symbolic_trace(Program(spec.program.work, spec.size, rewritten=True))
    graph = fx.Graph()
    graph.output(graph.graph_copy(spec.traced.graph, {}))
    return fx.GraphModule(spec.traced, graph)


# ----------------------------------------------------------------------------------------------
# timing and memory
# ----------------------------------------------------------------------------------------------


class _Timeout(Exception):
    pass


CLOCKS: dict[str, Callable[[], float]] = {"cpu": time.process_time, "wall": time.perf_counter}


def _alarm_available() -> bool:
    return hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()


def _timed(fn: Callable[[], Any], limit: float | None = None,
           clock: Callable[[], float] = time.process_time) -> tuple[float, Any]:
    """Seconds taken by ``fn()`` on ``clock`` and its result; raises ``_Timeout`` after ``limit``."""
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


def _traced_memory(fn: Callable[[], Any]) -> tuple[int, int, Any]:
    """(peak, retained) bytes allocated by ``fn()`` as ``tracemalloc`` sees them, and its result."""
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        result = fn()
        current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak - base, current - base, result


def _node_pass(gm: fx.GraphModule) -> None:
    for _ in gm.graph.nodes:
        pass


def _fx_apply(gm: fx.GraphModule, defs: Sequence[tuple[str, Callable[..., Any], Callable[..., Any]]]) -> list[int]:
    """Rewrites by ``torch.fx.replace_pattern``, rule by rule (one call per rule, as fx requires)."""
    return [len(fx.replace_pattern(gm, pattern, replacement)) for _, pattern, replacement in defs]


def cheapest_node(graph: fx.Graph, op: str, target: Any, args: tuple[Any, ...],
                  kwargs: dict[str, Any] | None = None) -> fx.Node:
    """A node inserted the cheapest way known (fxrewrite's ``add_node``: ``create_node``
    without its per-argument pytree walk), for the in-place floor."""
    name = fresh_node_name(graph, node_name_base(graph, target))
    return add_node(graph, name, op, target, args, kwargs or {})


def _create_node(graph: fx.Graph, op: str, target: Any, args: tuple[Any, ...],
                 kwargs: dict[str, Any] | None = None) -> fx.Node:
    """A node created by plain ``Graph.create_node``, for the one-pass copying floor."""
    return graph.create_node(op, target, args, kwargs)  # type: ignore[arg-type]


def _same(node: fx.Node) -> fx.Node:
    return node


def hand_rewrite(gm: fx.GraphModule, spec: GraphSpec, work: Workload) -> fx.GraphModule:
    """The in-place floor of a rewrite on fx: the edits a rule set makes, written by hand where the
    blocks are known to be (no matching, no checks, no lint), then ``recompile()``; with the
    cyclic GC paused, as ``rewrite`` pauses it. The submodules the erased nodes called are
    deleted (the rewrite deletes the submodules no node calls any more: both sides build the
    same module), each by its known path, the cheapest way."""
    with collections_paused():
        nodes = list(gm.graph.nodes)
        orphans: list[str] = []
        for first, last, rule in spec.blocks:
            block = nodes[first:last + 1]
            with gm.graph.inserting_before(block[-1]):
                value = work.emit(gm.graph, block, rule, _same, cheapest_node, gm.add_submodule)
            block[-1].replace_all_uses_with(value)
            for node in reversed(block):
                if not node.users:
                    if node.op == "call_module":
                        orphans.append(str(node.target))
                    gm.graph.erase_node(node)
        for path in orphans:
            gm.delete_submodule(path)
        gm.recompile()
    return gm


def copying_hand_rewrite(base: fx.GraphModule, spec: GraphSpec, work: Workload) -> fx.GraphModule:
    """:func:`hand_rewrite` of the cheapest copy of ``base`` known (the one ``rewrite`` makes):
    "copy, then edit", the floor of issue 12 (context since issue 24)."""
    with collections_paused():
        return hand_rewrite(to_graph_module(base), spec, work)


def one_pass_floor(base: fx.GraphModule, spec: GraphSpec, work: Workload) -> fx.GraphModule:
    """The one-pass copying floor (issue 24): one pass over ``base``'s nodes that copies the
    nodes that stay (``Graph.node_copy``) and emits each replacement in its place
    (``Graph.create_node``), the matches known in advance; then the new module's code
    (``GraphModule`` compiles it). The input is left untouched, as by a copying ``rewrite``. The
    new module holds only the submodules its graph calls (``GraphModule`` copies those from a
    dict root), as the rewrite's result does."""
    with collections_paused():
        graph = fx.Graph()
        env: dict[fx.Node, fx.Node] = {}
        modules: dict[str, nn.Module] = {}
        ends = {last: (first, rule) for first, last, rule in spec.blocks}
        erased = spec.erased
        nodes = list(base.graph.nodes)
        for i, node in enumerate(nodes):
            block = ends.get(i)
            if block is not None:
                env[node] = work.emit(graph, nodes[block[0]:i + 1], block[1], env.__getitem__, _create_node,
                                      modules.__setitem__)
            elif i not in erased:
                env[node] = graph.node_copy(node, env.__getitem__)
        root: nn.Module | dict[str, Any] = {**dict(base.named_children()), **modules} if modules else base
        return fx.GraphModule(root, graph)


def graph_signature(gm: fx.GraphModule) -> collections.Counter[tuple[str, str]]:
    """What a graph computes, up to node names and order: its nodes by op and target (a module
    by its class)."""
    def target(n: fx.Node) -> str:
        if n.op == "call_module":
            return type(gm.get_submodule(str(n.target))).__name__
        return n.target if isinstance(n.target, str) else getattr(n.target, "__name__", str(n.target))

    return collections.Counter((n.op, target(n)) for n in gm.graph.nodes)


def module_signature(gm: fx.GraphModule) -> collections.Counter[str]:
    """The submodules a module holds, by class (names differ between the rewrite and a floor)."""
    return collections.Counter(type(m).__name__ for _, m in gm.named_modules())


@dataclass
class Row:
    workload: str
    shape: str
    density: float
    rules: int
    size: int  # requested
    nodes: int = 0  # built
    actual_density: float = 0.0
    planted: int = 0
    rewrite_ms: float | None = None
    inplace_ms: float | None = None
    fx_ms: float | None = None
    fx_status: str = "ok"  # ok | skipped | timeout | error | n/a
    recompile_ms: float | None = None
    #: ``recompile()`` of the rewritten module: fx's code generation for the result, which a
    #: rewrite ends with (larger than the input's when replacements create nodes).
    result_recompile_ms: float | None = None
    #: The floor: the same edits by hand at the planted blocks, then ``recompile()``, on a copy
    #: (``floor_ms``) and in place (``inplace_floor_ms``); see :func:`hand_rewrite`.
    floor_ms: float | None = None
    inplace_floor_ms: float | None = None
    #: The one-pass copying floor (issue 24): copy the nodes that stay, emit each replacement in
    #: its place, one pass, then the new module's code; see :func:`one_pass_floor`.
    copy_floor_ms: float | None = None
    pass_ms: float | None = None
    applied: int | None = None
    rewrite_peak_kb: float | None = None
    recompile_peak_kb: float | None = None
    copy_kb: float | None = None
    #: The same two for the rewritten module (larger than the input when replacements create nodes).
    result_recompile_peak_kb: float | None = None
    result_copy_kb: float | None = None
    floor_peak_kb: float | None = None
    errors: list[str] = field(default_factory=list)

    @property
    def key(self) -> tuple[str, str, float, int]:
        return (self.workload, self.shape, self.density, self.rules)

    @property
    def memory_budget_kb(self) -> float | None:
        if self.recompile_peak_kb is None or self.copy_kb is None:
            return None
        return self.recompile_peak_kb + self.copy_kb

    @property
    def result_memory_budget_kb(self) -> float | None:
        if self.result_recompile_peak_kb is None or self.result_copy_kb is None:
            return None
        return self.result_recompile_peak_kb + self.result_copy_kb


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _median_ms(xs: list[float]) -> float | None:
    return statistics.median(xs) * 1e3 if xs else None


def _differs(expected: Any, got: Any, exact: bool) -> str | None:
    try:
        if exact:
            torch.testing.assert_close(got, expected, equal_nan=True, rtol=0, atol=0)
        else:
            torch.testing.assert_close(got, expected, equal_nan=True, rtol=1e-4, atol=1e-5)
    except AssertionError as exc:
        text = str(exc).strip().splitlines()
        return text[0] if text else "differs"
    return None


class Bench:
    def __init__(self, args: argparse.Namespace, out: Any) -> None:
        self.args = args
        self.out = out
        self.rows: list[Row] = []
        self.fx_history: dict[tuple[str, str, float, int], list[tuple[int, float]]] = {}
        self.fx_given_up: set[tuple[str, str, float, int]] = set()

    def log(self, text: str) -> None:
        if self.args.verbose:
            print(text, file=self.out, flush=True)

    def fx_plan(self, row: Row, work: Workload) -> str | None:
        """None to time fx, or why not."""
        if work.fx_rules() is None:
            return "n/a"
        if self.args.no_fx or (self.args.fx_max_nodes is not None and row.size > self.args.fx_max_nodes):
            return "skipped"
        if row.key in self.fx_given_up:
            return "skipped"
        hist = self.fx_history.get(row.key, [])
        if hist:
            (n1, t1) = hist[-1]
            slope = 1.0
            if len(hist) >= 2:
                (n0, t0) = hist[-2]
                if t0 > 0 and t1 > 0 and n1 != n0:
                    slope = max(1.0, math.log(t1 / t0) / math.log(n1 / n0))
            if t1 * (row.size / n1) ** slope > self.args.fx_limit:
                return "skipped"
        return None

    def run_config(self, config: Config) -> None:
        work = workload(config)
        ruleset = work.ruleset()
        self.log(f"  {config.workload} {config.shape} density={config.density:.0%} rules={len(ruleset)}")
        for size in self.args.sizes:
            spec = make_spec(work, size)
            row = Row(config.workload, config.shape, config.density, len(ruleset), size)
            base = build(spec)
            row.nodes, row.actual_density, row.planted = len(base.graph.nodes), spec.actual_density, len(spec.blocks)
            x = work.example_input()
            expected = work.expected_module(spec)(x)
            gc.collect()
            gc.freeze()  # base lives through every measurement of this row: keep collections cheap
            try:
                self._measure(row, spec, work, ruleset, base, x, expected)
            finally:
                gc.unfreeze()
            self.rows.append(row)
            self.log("    " + format_row(row, self.args.fx_limit))

    def _measure(self, row: Row, spec: GraphSpec, work: Workload, ruleset: fxrewrite.RuleSet,
                 base: fx.GraphModule, x: torch.Tensor, expected: Any) -> None:
        clock = CLOCKS[self.args.clock]
        times: dict[str, list[float]] = {"rewrite": [], "inplace": [], "fx": [], "pass": [], "recompile": [],
                                         "result_recompile": [], "floor": [], "inplace_floor": [], "copy_floor": []}
        fx_skip = self.fx_plan(row, work)
        before = base.code
        for _ in range(self.args.repeat):
            times["pass"].append(_timed(partial(_node_pass, base), clock=clock)[0])
            times["recompile"].append(_timed(base.recompile, clock=clock)[0])
            try:
                t, result = _timed(partial(fxrewrite.rewrite, base, ruleset), clock=clock)
                times["rewrite"].append(t)
                self._check(row, work, result, x, expected, "rewrite")
                incidental = result.report.rewrites - row.planted if work.name == "delete" else 0
                self._same_graph(row, result.module, one_pass_floor(base, spec, work), "the one-pass copying floor",
                                 incidental)
                if base.code != before or result.module is base:
                    row.errors.append("rewrite(inplace=False) modified its input module")
                times["result_recompile"].append(_timed(result.module.recompile, clock=clock)[0])
            except Exception as exc:  # reported
                row.errors.append(f"rewrite raised {type(exc).__name__}: {exc}")
            result = None
            gm = build(spec)
            try:
                t, result = _timed(partial(fxrewrite.rewrite, gm, ruleset, inplace=True), clock=clock)
                times["inplace"].append(t)
                self._check(row, work, result, x, expected, "rewrite(inplace=True)")
            except Exception as exc:  # reported
                row.errors.append(f"rewrite(inplace=True) raised {type(exc).__name__}: {exc}")
            result = gm = None
            self._time_floor(spec, work, base, times, clock, row, x, expected)
            if fx_skip is None and sum(times["fx"]) < self.args.fx_limit:
                fx_skip = self._time_fx(row, spec, work, times, clock, x, expected)
        row.pass_ms, row.recompile_ms = _median_ms(times["pass"]), _median_ms(times["recompile"])
        row.result_recompile_ms = _median_ms(times["result_recompile"])
        row.rewrite_ms, row.inplace_ms = _median_ms(times["rewrite"]), _median_ms(times["inplace"])
        row.floor_ms, row.inplace_floor_ms = _median_ms(times["floor"]), _median_ms(times["inplace_floor"])
        row.copy_floor_ms = _median_ms(times["copy_floor"])
        if fx_skip is None and times["fx"]:
            row.fx_ms = _median_ms(times["fx"])
            self.fx_history.setdefault(row.key, []).append((row.size, statistics.median(times["fx"])))
        else:
            row.fx_status = fx_skip or "skipped"
        if not self.args.no_memory:
            self._memory(row, base, ruleset, spec, work)

    def _time_floor(self, spec: GraphSpec, work: Workload, base: fx.GraphModule, times: dict[str, list[float]],
                    clock: Callable[[], float], row: Row, x: torch.Tensor, expected: Any) -> None:
        """Time the floor on a copy of ``base`` and in place on a fresh module; check both compute
        what they must (a floor that computed something else would prove nothing)."""
        t, floor = _timed(partial(copying_hand_rewrite, base, spec, work), clock=clock)
        times["floor"].append(t)
        t, one_pass = _timed(partial(one_pass_floor, base, spec, work), clock=clock)
        times["copy_floor"].append(t)
        gm = build(spec)
        t, _ = _timed(partial(hand_rewrite, gm, spec, work), clock=clock)
        times["inplace_floor"].append(t)
        for what, module in (("floor", floor), ("inplace floor", gm), ("one-pass copying floor", one_pass)):
            problem = _differs(expected, module(x), work.exact)
            if problem:
                row.errors.append(f"the hand-written {what}: output differs from the expected one: {problem}")
            module.graph.lint()
        self._same_graph(row, gm, one_pass, "the in-place floor")

    @staticmethod
    def _same_graph(row: Row, got: fx.GraphModule, floor: fx.GraphModule, what: str, incidental: int = 0) -> None:
        """Both sides of a ratio must build the same graph (up to names and order). ``delete``'s
        identity rules also fire where the filler happens to spell one (``relu(sigmoid(x))``):
        those ``incidental`` rewrites each remove one node the floor keeps (the floor is then a
        little cheaper than the rewrite's work, never dearer)."""
        extra, missing = graph_signature(got) - graph_signature(floor), graph_signature(floor) - graph_signature(got)
        if extra or sum(missing.values()) != incidental:
            row.errors.append(f"{what} builds another graph than the rewrite: the rewrite has {dict(extra)} more, "
                              f"{dict(missing)} fewer ({incidental} incidental identity rewrites)")
        if module_signature(got) != module_signature(floor):  # e.g. a side keeping the submodules it no longer calls
            row.errors.append(f"{what} and the module it is compared with hold other submodules: "
                              f"{dict(module_signature(floor))} against {dict(module_signature(got))}")

    def _time_fx(self, row: Row, spec: GraphSpec, work: Workload, times: dict[str, list[float]],
                 clock: Callable[[], float], x: torch.Tensor, expected: Any) -> str | None:
        gm = build(spec)
        try:
            t, counts = _timed(partial(_fx_apply, gm, work.fx_rules() or []), limit=self.args.fx_limit, clock=clock)
        except _Timeout:
            self.fx_given_up.add(row.key)
            return "timeout"
        except Exception as exc:  # reported
            self.fx_given_up.add(row.key)
            row.errors.append(f"torch.fx.replace_pattern raised {type(exc).__name__}: {exc}")
            return "error"
        times["fx"].append(t)
        count = counts[0] if work.name == "delete" else sum(counts)  # delete: the other rules may fire too
        if count != row.planted:
            row.errors.append(f"torch.fx applied {count} rewrite(s), expected {row.planted} (planted blocks)")
        problem = _differs(expected, gm(x), work.exact)
        if problem:
            row.errors.append(f"torch.fx.replace_pattern: output differs: {problem}")
        return None

    def _check(self, row: Row, work: Workload, result: fxrewrite.RewriteResult, x: torch.Tensor, expected: Any,
               what: str) -> None:
        row.applied = result.report.rewrites
        if result.report.rewrites != row.planted and work.name != "delete":
            row.errors.append(f"{what} applied {result.report.rewrites} rewrite(s), expected {row.planted}")
        if work.name == "delete" and result.report.applied.get("neg_neg") != row.planted:
            row.errors.append(f"{what} applied neg_neg {result.report.applied.get('neg_neg')} time(s), "
                              f"expected {row.planted}")
        problem = _differs(expected, result.module(x), work.exact)
        if problem:
            row.errors.append(f"{what}: output differs from the expected one: {problem}")

    def _memory(self, row: Row, base: fx.GraphModule, ruleset: fxrewrite.RuleSet, spec: GraphSpec,
                work: Workload) -> None:
        """Peak of one copying rewrite vs recompile's own peak plus one copy of the graph (and
        the peak of the hand-written floor)."""
        row.recompile_peak_kb = _traced_memory(base.recompile)[0] / 1024
        row.copy_kb = _traced_memory(partial(_copy_graph, base.graph))[1] / 1024
        try:
            peak, _, result = _traced_memory(partial(fxrewrite.rewrite, base, ruleset))
        except Exception as exc:  # already reported by the timed runs
            row.errors.append(f"rewrite under tracemalloc raised {type(exc).__name__}: {exc}")
            return
        row.rewrite_peak_kb = peak / 1024
        row.result_recompile_peak_kb = _traced_memory(result.module.recompile)[0] / 1024
        row.result_copy_kb = _traced_memory(partial(_copy_graph, result.module.graph))[1] / 1024
        result = None
        row.floor_peak_kb = _traced_memory(partial(copying_hand_rewrite, base, spec, work))[0] / 1024


# ----------------------------------------------------------------------------------------------
# report
# ----------------------------------------------------------------------------------------------

HEADER = (f"{'workload':<9} {'shape':<5} {'N':>6} {'dens':>4} {'R':>3} {'rewrite ms':>10} {'inplace ms':>10} "
          f"{'fx ms':>9} {'recomp ms':>9} {'rw/rc':>5} {'ip/rc':>5} {'rw/rr':>5} {'fl/rc':>5} {'ifl/rc':>6} "
          f"{'rw/fl':>5} {'rw/cf':>5} {'ip/fl':>5} {'fx/rw':>6} {'applied':>7} {'mem/budget':>10}")


def _ms(v: float | None, width: int) -> str:
    if v is None:
        return f"{'-':>{width}}"
    return f"{v:>{width}.1f}" if v >= 10 else f"{v:>{width}.2f}"


def _x(v: float | None, width: int, prefix: str = "") -> str:
    return f"{'-':>{width}}" if v is None else f"{prefix + format(v, '.2f'):>{width}}"


def format_row(row: Row, fx_limit: float) -> str:
    if row.fx_ms is not None:
        fx_cell, fx_ratio = _ms(row.fx_ms, 9), _x(_ratio(row.fx_ms, row.rewrite_ms), 6)
    elif row.fx_status == "timeout":
        fx_cell = f"{'>' + format(fx_limit * 1e3, '.0f'):>9}"
        fx_ratio = _x(_ratio(fx_limit * 1e3, row.rewrite_ms), 6, ">")
    else:
        fx_cell, fx_ratio = f"{row.fx_status:>9}", f"{'-':>6}"
    applied = "-" if row.applied is None else str(row.applied)
    memory = _x(_ratio(row.rewrite_peak_kb, row.memory_budget_kb), 10)
    text = (f"{row.workload:<9} {row.shape:<5} {row.nodes:>6} {row.density:>4.0%} {row.rules:>3} "
            f"{_ms(row.rewrite_ms, 10)} {_ms(row.inplace_ms, 10)} {fx_cell} {_ms(row.recompile_ms, 9)} "
            f"{_x(_ratio(row.rewrite_ms, row.recompile_ms), 5)} {_x(_ratio(row.inplace_ms, row.recompile_ms), 5)} "
            f"{_x(_ratio(row.rewrite_ms, row.result_recompile_ms), 5)} {_x(_ratio(row.floor_ms, row.recompile_ms), 5)} "
            f"{_x(_ratio(row.inplace_floor_ms, row.recompile_ms), 6)} {_x(_ratio(row.rewrite_ms, row.floor_ms), 5)} "
            f"{_x(_ratio(row.rewrite_ms, row.copy_floor_ms), 5)} "
            f"{_x(_ratio(row.inplace_ms, row.inplace_floor_ms), 5)} {fx_ratio} {applied:>7} {memory}")
    return text + ("  ERROR" if row.errors else "")


def _slope(points: list[tuple[int, float | None]]) -> float | None:
    pts = [(n, t) for n, t in points if t]
    if len(pts) < 2:
        return None
    (n0, t0), (n1, t1) = min(pts), max(pts)
    return None if n1 == n0 else math.log(t1 / t0) / math.log(n1 / n0)


def exponents(rows: list[Row]) -> list[dict[str, Any]]:
    """Log-log slope of time vs N from the smallest to the largest size, per configuration."""
    groups: dict[tuple[str, str, float, int], list[Row]] = {}
    for r in rows:
        groups.setdefault(r.key, []).append(r)
    out = []
    for (work, shape, density, rules), rs in groups.items():
        rs = sorted(rs, key=lambda r: r.nodes)
        out.append({
            "workload": work, "shape": shape, "density": density, "rules": rules,
            "from": rs[0].nodes, "to": rs[-1].nodes,
            "rewrite": _slope([(r.nodes, r.rewrite_ms) for r in rs]),
            "inplace": _slope([(r.nodes, r.inplace_ms) for r in rs]),
            "fx": _slope([(r.nodes, r.fx_ms) for r in rs]) if all(r.fx_ms for r in rs) else None,
            "recompile": _slope([(r.nodes, r.recompile_ms) for r in rs]),
        })
    return out


@dataclass
class Target:
    """One row of the issue's target table and its verdict."""

    workload: str
    target: str
    measured: str
    verdict: str  # PASS | FAIL | not measured


def _worst(values: list[tuple[float, str]]) -> tuple[float, str] | None:
    return max(values, key=lambda v: v[0]) if values else None


def _ratio_target(rows: list[Row], label: str, select: Callable[[Row], bool], attr: str, limit: float,
                  floor: str = "recompile_ms", unit: str = "recompile", hand: str | None = None) -> Target:
    """The worst ``attr / floor`` over the selected rows against ``limit``; with ``hand`` (the
    attribute of the matching hand-written floor), also the worst ``hand / floor``: when that is
    over the limit too, the target is below what any rewrite built on fx's edits can reach."""
    def where(r: Row) -> str:
        return f"{r.workload} {r.shape} N={r.nodes} {r.density:.0%} R={r.rules}"

    values = [(v, where(r)) for r in rows if select(r) for v in [_ratio(getattr(r, attr), getattr(r, floor))]
              if v is not None]
    worst = _worst(values)
    if worst is None:
        return Target(label, f"<= {limit:g}x {unit}", "-", "not measured")
    verdict = "PASS" if worst[0] <= limit else "FAIL"
    shown = ", ".join(f"{v:.2f}x" for v, _ in values[:4]) + (", ..." if len(values) > 4 else "")
    measured = f"{shown} (worst {worst[0]:.2f}x at {worst[1]})"
    floors = [(v, where(r)) for r in rows if select(r) and hand for v in [_ratio(getattr(r, hand), getattr(r, floor))]
              if v is not None]
    worst_floor = _worst(floors)
    if worst_floor is not None:
        over = sum(v > limit for v, _ in floors)
        measured += (f"; hand-written floor worst {worst_floor[0]:.2f}x, over the limit on {over} of "
                     f"{len(floors)} row(s)")
    return Target(label, f"<= {limit:g}x {unit}", measured, verdict)


def _near(size: int, wanted: int) -> bool:
    return abs(size - wanted) <= wanted * 0.05


def _create3_rows(density: float, rules: tuple[int, ...]) -> Callable[[Row], bool]:
    """The rows of the issue's create3 targets: chain graphs of 8k and 64k nodes at ``density``
    with one of these rule counts."""
    return lambda r: (r.workload == "create3" and r.shape == "chain" and r.density == density and r.rules in rules
                      and (_near(r.size, 8000) or _near(r.size, 64000)))


def _memory_target(rows: list[Row], budget: Callable[[Row], float | None], limit: str) -> Target:
    """The worst peak memory of a copying rewrite against ``budget(row)``, and the worst peak of
    the hand-written floor against the same budget."""
    memory = [(r.rewrite_peak_kb / b, f"{r.workload} {r.shape} N={r.nodes}")
              for r in rows for b in [budget(r)] if r.rewrite_peak_kb is not None and b]
    floors = [(r.floor_peak_kb / b, f"{r.workload} {r.shape} N={r.nodes}")
              for r in rows for b in [budget(r)] if r.floor_peak_kb is not None and b]
    worst, worst_floor = _worst(memory), _worst(floors)
    measured = "-" if worst is None else f"worst {worst[0]:.2f}x of that budget ({worst[1]})"
    if worst is not None and worst_floor is not None:
        measured += f"; hand-written floor worst {worst_floor[0]:.2f}x ({worst_floor[1]})"
    return Target("peak memory of a copying rewrite (tracemalloc)", limit, measured,
                  "not measured" if worst is None else ("PASS" if worst[0] <= 1.0 else "FAIL"))


#: Issue 24's targets, per row: (label, rewrite attribute, floor attribute, limit).
FLOOR_TARGETS = (("copying rewrite / one-pass copying floor", "rewrite_ms", "copy_floor_ms", 1.25),
                 ("in place / in-place floor", "inplace_ms", "inplace_floor_ms", 1.2))


def floor_verdicts(rows: list[Row]) -> list[tuple[Row, list[tuple[float | None, str]]]]:
    """Per row, each of :data:`FLOOR_TARGETS` as (ratio, verdict)."""
    out = []
    for r in sorted(rows, key=lambda r: (r.workload, r.shape, r.density, r.rules, r.size)):
        cells = []
        for _, attr, floor, limit in FLOOR_TARGETS:
            v = _ratio(getattr(r, attr), getattr(r, floor))
            cells.append((v, "-" if v is None else ("PASS" if v <= limit else "FAIL")))
        out.append((r, cells))
    return out


def _floor_target(rows: list[Row], label: str, attr: str, floor: str, limit: float) -> Target:
    values = [(v, f"{r.workload} {r.shape} N={r.nodes} {r.density:.0%} R={r.rules}") for r in rows
              for v in [_ratio(getattr(r, attr), getattr(r, floor))] if v is not None]
    worst = _worst(values)
    if worst is None:
        return Target(f"{label}, every row", f"<= {limit:g}x, each row", "-", "not measured")
    over = sum(v > limit for v, _ in values)
    return Target(f"{label}, every row", f"<= {limit:g}x, each row",
                  f"{len(values) - over} of {len(values)} rows pass; worst {worst[0]:.2f}x at {worst[1]}",
                  "PASS" if not over else "FAIL")


def targets(rows: list[Row], exps: list[dict[str, Any]], check_seconds: float | None,
            check_note: str) -> list[Target]:
    """The issue's target table, evaluated on the measured rows."""
    out = [_floor_target(rows, label, attr, floor, limit) for label, attr, floor, limit in FLOOR_TARGETS]
    slopes = [(e[kind], f"{kind} {e['workload']} {e['shape']} {e['density']:.0%} R={e['rules']}")
              for e in exps for kind in ("rewrite", "inplace") if e[kind] is not None and e["from"] < e["to"]]
    worst = _worst(slopes)
    spans = sorted({(e["from"], e["to"]) for e in exps})
    span = f"{spans[0][0]}->{spans[-1][1]}" if spans else "-"
    out.append(Target(f"scaling exponent {span}, every row", "<= 1.05", "-" if worst is None else
                      f"worst {worst[0]:.3f} ({worst[1]})",
                      "not measured" if worst is None else ("PASS" if worst[0] <= 1.05 else "FAIL")))
    out.append(Target("fxrewrite check, shipped library, -j 2", f"<= {CHECK_TARGET_SECONDS:g} s",
                      "-" if check_seconds is None else f"{check_seconds:.0f} s wall ({check_note})",
                      "not measured" if check_seconds is None else
                      ("PASS" if check_seconds <= CHECK_TARGET_SECONDS else "FAIL")))
    out.append(_memory_target(rows, lambda r: r.memory_budget_kb, "<= recompile peak + 1 graph copy"))
    return out


def context_rows(rows: list[Row]) -> list[Target]:
    """Issue 12's rows, kept as context: the rewrite against ``recompile()`` of its result and
    against "copy, then edit" (the floor of issue 12), and memory against the result's budget."""
    return [
        _ratio_target(rows, "copying rewrite, 3 created nodes, 50%, R=10", _create3_rows(0.5, (10,)), "rewrite_ms",
                      1.5, "result_recompile_ms", "result recompile"),
        _ratio_target(rows, "the same, 10% matched, R=10 and R=50", _create3_rows(0.1, (10, 50)), "rewrite_ms", 1.25,
                      "result_recompile_ms", "result recompile"),
        _ratio_target(rows, "copying rewrite / copy-then-edit floor, all rows", lambda r: True, "rewrite_ms", 1.25,
                      "floor_ms", "copy-then-edit floor"),
        _memory_target(rows, lambda r: r.result_memory_budget_kb, "<= result's recompile peak + 1 copy"),
    ]


def report(rows: list[Row], fx_limit: float, out: Any, check: tuple[float, str] | None) -> dict[str, Any]:
    def p(text: str = "") -> None:
        print(text, file=out)

    p()
    p(HEADER)
    p("-" * len(HEADER))
    prev = None
    for r in sorted(rows, key=lambda r: (r.workload, r.shape, r.density, r.rules, r.size)):
        if prev is not None and r.key != prev:
            p()
        prev = r.key
        p(format_row(r, fx_limit))
    p()
    p("rw/rc, ip/rc: copying and inplace rewrite / recompile() of the input module; rw/rr: copying rewrite / "
      "recompile() of its result (fx's code generation for the rewritten graph, part of every rewrite)")
    p("fl/rc, ifl/rc: the hand-written floor (the same edits made by hand at the planted blocks, no matching, "
      "then recompile(); on the copy rewrite makes / in place) / recompile(); rw/fl, ip/fl: rewrite / that floor")
    p("rw/cf: copying rewrite / the one-pass copying floor (copy the nodes that stay and emit each replacement in "
      "its place, one pass, then the new module's code)")
    p("mem/budget: tracemalloc peak of one copying rewrite / (recompile()'s own peak + one graph copy)")
    exps = exponents(rows)
    p()
    p("scaling exponent k (time ~ N^k, log-log slope from the smallest to the largest N)")
    p(f"{'workload':<9} {'shape':<5} {'dens':>4} {'R':>3} {'N range':>13} {'rewrite':>9} {'inplace':>9} {'fx':>9} "
      f"{'recompile':>9}")
    for e in exps:
        cells = " ".join("        -" if e[k] is None else f"{e[k]:>9.2f}"
                         for k in ("rewrite", "inplace", "fx", "recompile"))
        p(f"{e['workload']:<9} {e['shape']:<5} {e['density']:>4.0%} {e['rules']:>3} "
          f"{str(e['from']) + '-' + str(e['to']):>13} {cells}")
    p()
    p("per-row verdicts against the floors (issue 24; medians of the runs above, CPU time, this process)")
    p(f"{'workload':<9} {'shape':<5} {'N':>6} {'dens':>4} {'R':>3}  {'rewrite/copying floor':>21} {'<=1.25':>6}  "
      f"{'in place/in-place floor':>23} {'<=1.2':>5}")
    for r, ((cv, cverdict), (iv, iverdict)) in floor_verdicts(rows):
        p(f"{r.workload:<9} {r.shape:<5} {r.nodes:>6} {r.density:>4.0%} {r.rules:>3}  {_x(cv, 21)} {cverdict:>6}  "
          f"{_x(iv, 23)} {iverdict:>5}")
    table = targets(rows, exps, check[0] if check else None, check[1] if check else "")
    p()
    p("targets (issue 24, medians of the runs above, this process):")
    width = max(len(t.workload) for t in table)
    for t in table:
        p(f"  {t.workload:<{width}}  {t.target:<34}  {t.verdict:<12}  {t.measured}")
    measured = [t for t in table if t.verdict != "not measured"]
    overall = "PASS" if measured and all(t.verdict == "PASS" for t in measured) else "FAIL"
    p(f"TARGETS: {overall}" + (f" ({len(table) - len(measured)} not measured)" if len(measured) < len(table) else ""))
    p("context (issue 12's rows, not targets): the rewrite against recompile() of the rewritten module (the part "
      "of a rewrite no splice can save) and against copy-then-edit")
    for t in context_rows(rows):
        p(f"  {t.workload:<{width}}  {t.target:<34}  {t.verdict:<12}  {t.measured}")
    errors = [(r, e) for r in rows for e in r.errors]
    p()
    if errors:
        p(f"CORRECTNESS: FAIL ({len(errors)} problem(s))")
        for r, e in errors[:40]:
            p(f"  {r.workload} {r.shape} N={r.nodes} density={r.density:.0%} R={r.rules}: {e}")
    else:
        p("CORRECTNESS: PASS (every rewritten module computes what it must on an example input; every planted "
          "block rewritten once by rewrite, inplace and fx)")
    return {"targets": [asdict(t) for t in table], "targets_pass": overall == "PASS", "correct": not errors,
            "exponents": exps}


def check_library(jobs: int, examples: int | None) -> tuple[float, str]:
    """Wall time of ``fxrewrite check -j JOBS`` on the shipped library, and the load average seen."""
    command = [sys.executable, "-m", "fxrewrite", "check", "-j", str(jobs)]
    if examples is not None:
        command += ["--examples", str(examples)]
    load = _load_average()
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - start
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else f"exit {done.returncode}"
    return seconds, f"{summary}; load average {load} -> {_load_average()}"


def _load_average() -> str:
    try:
        import os

        return "/".join(f"{v:.1f}" for v in os.getloadavg())
    except (AttributeError, OSError):
        return "n/a"


# ----------------------------------------------------------------------------------------------
# profiling
# ----------------------------------------------------------------------------------------------


def profile(config: Config, size: int, out: Any, top: int = 20) -> None:
    """cProfile one copying ``rewrite`` of ``config`` at ``size``; print the top entries by
    cumulative time from fxrewrite's modules, then by internal time overall."""
    work = workload(config)
    ruleset = work.ruleset()
    gm = build(make_spec(work, size))
    gc.collect()
    prof = cProfile.Profile()
    prof.enable()
    fxrewrite.rewrite(gm, ruleset)
    prof.disable()
    for title, sort, restriction in ((f"fxrewrite modules, top {top} by cumulative time", "cumulative",
                                      r"fxrewrite[/\\]"),
                                     (f"all functions, top {top} by internal time", "tottime", None)):
        buf = io.StringIO()
        stats = pstats.Stats(prof, stream=buf).sort_stats(sort)
        stats.print_stats(*((restriction, top) if restriction else (top,)))
        print(f"\nprofile of copying rewrite: {config.workload} {config.shape} N={len(gm.graph.nodes)} "
              f"density={config.density:.0%} R={len(ruleset)} -- {title}", file=out)
        text = buf.getvalue()
        start = text.find("   ncalls")
        print(text[start:] if start >= 0 else text, file=out)


# ----------------------------------------------------------------------------------------------
# command line
# ----------------------------------------------------------------------------------------------


def _ints(text: str) -> list[int]:
    return [int(float(t)) for t in text.split(",") if t.strip()]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="bench_rewrite.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help=f"sizes {','.join(map(str, QUICK_SIZES))}, one configuration per workload, 1 run (smoke test)")
    ap.add_argument("--sizes", type=_ints, default=None,
                    help=f"graph sizes in nodes (default {','.join(map(str, DEFAULT_SIZES))})")
    ap.add_argument("--repeat", type=int, default=None,
                    help="runs per measurement, median reported (default 3; --quick 1)")
    ap.add_argument("--workloads", type=lambda s: [t for t in s.split(",") if t], default=None,
                    help=f"only these workloads ({', '.join(WORKLOADS)})")
    ap.add_argument("--fx-limit", type=float, default=15.0,
                    help="seconds allowed to one torch.fx run (all rules); larger sizes projected over it are skipped")
    ap.add_argument("--fx-max-nodes", type=int, default=None, help="do not time torch.fx above this many nodes")
    ap.add_argument("--no-fx", action="store_true", help="do not time torch.fx.replace_pattern")
    ap.add_argument("--no-memory", action="store_true", help="do not measure peak memory with tracemalloc")
    ap.add_argument("--clock", choices=sorted(CLOCKS), default="cpu",
                    help="cpu: CPU time of this process (default; robust on a shared machine); wall: elapsed")
    ap.add_argument("--check-library", action="store_true",
                    help="also time `fxrewrite check -j 2` on the shipped library (the checker's target row)")
    ap.add_argument("--check-examples", type=int, default=None,
                    help="--examples for --check-library (default: its own)")
    ap.add_argument("--json", type=Path, default=None, help="also write rows, exponents and targets to this file")
    ap.add_argument("--profile", action="store_true",
                    help="afterwards, cProfile one copying rewrite of the slowest row (largest rw/cf at the largest N)")
    ap.add_argument("-q", "--quiet", dest="verbose", action="store_false", help="only the final report")
    args = ap.parse_args(argv)
    args.sizes = sorted(set(args.sizes or (QUICK_SIZES if args.quick else DEFAULT_SIZES)))
    args.repeat = args.repeat or (1 if args.quick else 3)
    if args.repeat < 1:
        ap.error("--repeat must be at least 1")
    if args.quick and args.fx_max_nodes is None:
        args.fx_max_nodes = max(QUICK_SIZES)
    grid = quick_grid() if args.quick else FULL_GRID
    for w in args.workloads or ():
        if w not in WORKLOADS:
            ap.error(f"unknown workload {w!r}; choose from {', '.join(WORKLOADS)}")
    args.grid = [c for c in grid if args.workloads is None or c.workload in args.workloads]
    if min(args.sizes) < 100:
        ap.error("sizes must be at least 100 nodes")
    return args


def main(argv: Sequence[str] | None = None, out: Any = None) -> int:
    """Run the benchmark and print the report; returns 0 unless a correctness check failed or a
    measured call raised."""
    out = out if out is not None else sys.stdout
    args = parse_args(argv)
    started = time.perf_counter()
    print(f"fxrewrite {fxrewrite.__version__}, torch {torch.__version__}, Python {sys.version.split()[0]}; sizes "
          f"{','.join(map(str, args.sizes))}, median of {args.repeat}, clock {args.clock}, fx limit "
          f"{args.fx_limit:g} s, load average {_load_average()}", file=out, flush=True)
    bench = Bench(args, out)
    gc.collect()
    gc.freeze()  # what start-up created (torch, the rules) stays out of the collections timed below
    try:
        for config in args.grid:
            bench.run_config(config)
    finally:
        gc.unfreeze()
    check = check_library(2, args.check_examples) if args.check_library else None
    summary = report(bench.rows, args.fx_limit, out, check)
    print(f"\ntotal benchmark time {time.perf_counter() - started:.1f} s", file=out)
    if args.json is not None:
        args.json.write_text(json.dumps({"rows": [asdict(r) for r in bench.rows], **summary}, indent=1, default=str))
    if args.profile and bench.rows:
        slowest = max(bench.rows, key=lambda r: (r.size, _ratio(r.rewrite_ms, r.copy_floor_ms) or 0))
        config = next(c for c in args.grid if (c.workload, c.shape, c.density) == slowest.key[:3]
                      and c.rules in (0, slowest.rules))
        profile(config, slowest.size, out)
    return 0 if summary["correct"] else 1


if __name__ == "__main__":
    sys.exit(main())
