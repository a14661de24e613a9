"""The main job on real models: rewrite the example models, check them, and time them.

Usage::

    python benchmarks/bench_models.py                   # full sizes, 1 thread, median of 30 runs
    python benchmarks/bench_models.py --quick           # small sizes, median of 5 runs (< 1 minute)
    python benchmarks/bench_models.py --models gpt,resnet --threads 4 --repeat 50 --json out.json

For each model of ``examples/`` and each way of capturing it, the script

1. rewrites the model with the rules that go with it: the shipped library
   (``fxrewrite.load_rules()``), plus the example's own rules where it has some;
2. checks that the rewritten module computes what the original computes
   (``torch.testing.assert_close``; the quantised model within its predicted rounding error,
   see ``examples/05_quantized_linear.py``) and that its graph lints;
3. times the forward pass of the original and of the rewritten module on CPU, in this process,
   under ``torch.no_grad()``: ``--warmup`` untimed runs of each, then ``--repeat`` timed runs
   alternating original and rewritten (so that drifting machine load hits both alike), and
   reports the medians, their ratio (``speedup`` = before / after; above 1 is faster) and the
   spread of the samples (interquartile range / median, the larger of the two modules).

Timing uses one intra-op thread (``--threads 1``) and the process's CPU time (``--clock cpu``,
``time.process_time``) by default: on a shared machine CPU time does not count the time the
process waits for a core, so the numbers move much less with other load than wall time. With
``--threads N > 1`` CPU time adds up the threads' time; use ``--clock wall`` there for latency.

Models (full size; ``--quick`` shrinks them):

* ``resnet`` (examples/02): a ResNet-style network, 32 channels, 2 blocks, on 8 x 3 x 64 x 64,
  BatchNorm with non-default statistics, eval mode;
* ``gpt`` (examples/03): a GPT decoder, 4 layers, d_model 128, 4 heads, 128 tokens, batch 4,
  hand-written causal attention (additive mask) and tanh GELU;
* ``mobilenet`` (examples/04): MobileNetV3-style blocks with hand-written activations, 32
  channels, 2 blocks, on 8 x 3 x 64 x 64;
* ``quantized`` (examples/05): an MLP 512 -> 2048 -> 2048 -> 10 on a batch of 64, every Linear
  swapped for an int8 weight-quantised linear (dequantised in forward).

Captures (``--levels``): ``traced`` rewrites the ``nn.Module`` (``torch.fx.symbolic_trace``,
shapes propagated from the example inputs so that guards can read them); ``export`` rewrites
``torch.export.export(model, inputs).module()``. "Before" is the eager model for ``traced`` and
the un-rewritten exported module for ``export``.

The exit code is 0 whatever the timings (this is a report, not a test); it is 1 when an
equivalence check fails or a rewrite raises.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import statistics
import sys
import time
import traceback
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

import torch  # noqa: E402 - after the NumPy warning filter
from torch import fx, nn  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
try:
    import fxrewrite
except ImportError:  # running from a checkout without the package installed
    sys.path.insert(0, str(ROOT))
    import fxrewrite

EXAMPLES = ROOT / "examples"
MODELS = ("resnet", "gpt", "mobilenet", "quantized")
LEVELS = ("traced", "export")


def load_example(filename: str) -> ModuleType:
    """Import ``examples/<filename>`` (its name starts with a digit, so not with ``import``)."""
    name = "bench_example_" + filename.removesuffix(".py")
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / filename)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        spec.loader.exec_module(module)
    return module


# ----------------------------------------------------------------------------------------------
# the models
# ----------------------------------------------------------------------------------------------


@dataclass
class Case:
    """One model with its inputs, its rules and how close the rewritten outputs must be."""

    name: str
    source: str
    model: nn.Module
    inputs: tuple[Any, ...]
    rules: fxrewrite.RuleSet
    check: Callable[[torch.Tensor, torch.Tensor], None]
    description: str


def _close(rtol: float = 1e-4, atol: float = 1e-5) -> Callable[[torch.Tensor, torch.Tensor], None]:
    def check(actual: torch.Tensor, expected: torch.Tensor) -> None:
        torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol)

    return check


def _randomize_batch_norms(model: nn.Module, seed: int) -> nn.Module:
    """BatchNorm statistics and affine parameters away from their defaults (a trained model)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.modules.batchnorm._BatchNorm):
                n = module.num_features
                module.running_mean.copy_(torch.rand(n, generator=generator) - 0.5)
                module.running_var.copy_(0.5 + 1.5 * torch.rand(n, generator=generator))
                module.weight.copy_(0.5 + torch.rand(n, generator=generator))
                module.bias.copy_(0.4 * torch.rand(n, generator=generator) - 0.2)
    return model.eval()


def _images(batch: int, size: int) -> tuple[torch.Tensor]:
    return (torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(1)),)


def resnet_case(quick: bool, library: fxrewrite.RuleSet) -> Case:
    example = load_example("02_conv_bn_folding.py")
    channels, blocks, batch, size = (8, 1, 2, 16) if quick else (32, 2, 8, 64)
    torch.manual_seed(0)
    model = _randomize_batch_norms(example.SmallResNet(channels=channels, blocks=blocks), seed=0)
    return Case("resnet", "02_conv_bn_folding.py", model, _images(batch, size), library, _close(),
                f"{channels} ch, {blocks} blocks, {batch}x3x{size}x{size}")


def gpt_case(quick: bool, library: fxrewrite.RuleSet) -> Case:
    example = load_example("03_attention_to_sdpa.py")
    sizes = ({"vocab": 128, "d_model": 32, "heads": 2, "layers": 1, "seq": 32} if quick
             else {"vocab": 512, "d_model": 128, "heads": 4, "layers": 4, "seq": 128})
    batch = 2 if quick else 4
    model = example.gpt(**sizes)
    return Case("gpt", "03_attention_to_sdpa.py", model, (example.tokens_for(model, batch=batch),),
                library + example.CAUSAL_RULES, _close(atol=1e-4),
                f"{sizes['layers']} layers, d {sizes['d_model']}, {sizes['heads']} heads, seq {sizes['seq']}, "
                f"batch {batch}")


def mobilenet_case(quick: bool, library: fxrewrite.RuleSet) -> Case:
    example = load_example("04_activation_fusions.py")
    channels, blocks, batch, size = (8, 1, 2, 16) if quick else (32, 2, 8, 64)
    model = example.mobile_net(channels=channels, blocks=blocks)
    return Case("mobilenet", "04_activation_fusions.py", model, _images(batch, size),
                library + fxrewrite.RuleSet([example.silu_from_exp]), _close(),
                f"{channels} ch, {blocks} blocks, {batch}x3x{size}x{size}")


def quantized_case(quick: bool, library: fxrewrite.RuleSet) -> Case:
    example = load_example("05_quantized_linear.py")
    features, hidden, batch = (32, 64, 8) if quick else (512, 2048, 64)
    model = example.mlp(features=features, hidden=hidden)

    def check(actual: torch.Tensor, expected: torch.Tensor) -> None:
        example.assert_end_to_end(actual, expected, model)

    return Case("quantized", "05_quantized_linear.py", model, example.example_inputs(batch, features),
                example.RULES, check, f"MLP {features}->{hidden}->{hidden}->10, batch {batch}, int8 weights")


CASES: dict[str, Callable[[bool, fxrewrite.RuleSet], Case]] = {
    "resnet": resnet_case, "gpt": gpt_case, "mobilenet": mobilenet_case, "quantized": quantized_case,
}


# ----------------------------------------------------------------------------------------------
# measuring
# ----------------------------------------------------------------------------------------------


@dataclass
class Row:
    model: str
    level: str
    description: str
    nodes_before: int = 0
    nodes_after: int = 0
    rewrites: int = 0
    fired: dict[str, int] = field(default_factory=dict)
    rewrite_ms: float = 0.0
    equivalent: bool = False
    max_abs_error: float = float("nan")
    before_ms: float = float("nan")
    after_ms: float = float("nan")
    spread: float = float("nan")
    alone: dict[str, float] = field(default_factory=dict)
    error: str = ""

    @property
    def speedup(self) -> float:
        return self.before_ms / self.after_ms if self.after_ms > 0 else float("nan")


def _nodes(gm: nn.Module) -> int:
    return len(gm.graph.nodes) if isinstance(gm, fx.GraphModule) else 0


CLOCKS: dict[str, Callable[[], float]] = {"cpu": time.process_time, "wall": time.perf_counter}


def spread(samples: Sequence[float]) -> float:
    """Interquartile range / median."""
    if len(samples) < 4:
        return float("nan")
    q1, _, q3 = statistics.quantiles(samples, n=4)
    return (q3 - q1) / statistics.median(samples)


def time_pair(before: nn.Module, after: nn.Module, inputs: tuple[Any, ...], *, warmup: int, repeat: int,
              clock: Callable[[], float] = time.process_time) -> tuple[list[float], list[float]]:
    """Forward times (ms) of ``before`` and ``after``, timed alternately under no_grad."""
    samples: tuple[list[float], list[float]] = ([], [])
    modules = (before, after)
    with torch.no_grad():
        for _ in range(warmup):
            for module in modules:
                module(*inputs)
        gc.collect()
        for i in range(repeat):
            for k in ((0, 1) if i % 2 == 0 else (1, 0)):
                start = clock()
                modules[k](*inputs)
                samples[k].append((clock() - start) * 1e3)
    return samples


def capture(case: Case, level: str,
            rules: fxrewrite.RuleSet | None = None) -> tuple[nn.Module, fxrewrite.RewriteResult]:
    """(the module "before", the rewrite result) at ``level``."""
    rules = case.rules if rules is None else rules
    if level == "traced":
        return case.model, fxrewrite.rewrite(case.model, rules, example_inputs=case.inputs)
    before = torch.export.export(case.model, case.inputs).module()
    return before, fxrewrite.rewrite(before, rules)


def speedup_of(before: nn.Module, after: nn.Module, case: Case, args: argparse.Namespace) -> tuple[float, float, float]:
    """(before ms, after ms, spread) of the two modules."""
    times = time_pair(before, after, case.inputs, warmup=args.warmup, repeat=args.repeat, clock=CLOCKS[args.clock])
    return statistics.median(times[0]), statistics.median(times[1]), max(spread(times[0]), spread(times[1]))


def speedup_alone(case: Case, level: str, rule_name: str, args: argparse.Namespace) -> float:
    """The speedup of rewriting with the rule ``rule_name`` alone."""
    before, result = capture(case, level, fxrewrite.RuleSet([case.rules[rule_name]]))
    before_ms, after_ms, _ = speedup_of(before, result.module, case, args)
    return before_ms / after_ms


def measure(case: Case, level: str, args: argparse.Namespace) -> Row:
    row = Row(case.name, level, case.description)
    try:
        before, result = capture(case, level)
    except Exception as exc:  # reported in the table, exit code 1
        row.error = f"rewrite raised {type(exc).__name__}: {exc}"
        traceback.print_exc()
        return row
    row.nodes_before = _nodes(before) or _nodes(fx.symbolic_trace(before))
    row.nodes_after = _nodes(result.module)
    row.rewrites = result.report.rewrites
    row.fired = {name: n for name, n in result.report.applied.items() if n}
    row.rewrite_ms = result.report.seconds * 1e3
    with torch.no_grad():
        expected, actual = before(*case.inputs), result.module(*case.inputs)
    row.max_abs_error = float((actual - expected).abs().max())
    try:
        result.module.graph.lint()
        case.check(actual, expected)
        row.equivalent = True
    except AssertionError as exc:
        row.error = f"not equivalent: {str(exc).splitlines()[0]}"
    row.before_ms, row.after_ms, row.spread = speedup_of(before, result.module, case, args)
    if args.ablate and row.equivalent:
        row.alone = {name: speedup_alone(case, level, name, args) for name in row.fired}
    return row


# ----------------------------------------------------------------------------------------------
# report
# ----------------------------------------------------------------------------------------------

_HEADER = ("model", "level", "nodes", "rewrites", "equivalent", "before ms", "after ms", "speedup", "spread")


def _fired(fired: dict[str, int]) -> str:
    return ", ".join(f"{name} x{n}" for name, n in fired.items()) or "(none)"


def table(rows: Sequence[Row]) -> str:
    cells = [_HEADER]
    for r in rows:
        ok = "yes" if r.equivalent else "NO"
        cells.append((r.model, r.level, f"{r.nodes_before}->{r.nodes_after}", str(r.rewrites),
                      f"{ok} ({r.max_abs_error:.1e})", f"{r.before_ms:.2f}", f"{r.after_ms:.2f}",
                      f"{r.speedup:.2f}x", f"{r.spread:.0%}"))
    widths = [max(len(c[i]) for c in cells) for i in range(len(_HEADER))]
    right = {2, 3, 5, 6, 7, 8}
    lines = ["  ".join(c[i].rjust(widths[i]) if i in right else c[i].ljust(widths[i]) for i in range(len(c)))
             for c in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(line.rstrip() for line in lines)


def details(rows: Sequence[Row]) -> str:
    lines = []
    for r in rows:
        lines.append(f"{r.model} / {r.level} ({r.description}): rewrite {r.rewrite_ms:.0f} ms; {_fired(r.fired)}")
        if r.alone:
            lines.append("    speedup of each rule alone: "
                         + ", ".join(f"{name} {ratio:.2f}x" for name, ratio in r.alone.items()))
        if r.error:
            lines.append(f"    ERROR: {r.error}")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------
# command line
# ----------------------------------------------------------------------------------------------


def _names(text: str, known: Sequence[str], what: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in known]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown {what} {', '.join(unknown)}; choose from {', '.join(known)}")
    return names


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench_models.py", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small models, --repeat 5 --warmup 2 (< 1 minute)")
    parser.add_argument("--models", type=lambda s: _names(s, MODELS, "model"), default=MODELS,
                        help=f"comma-separated subset of {','.join(MODELS)}")
    parser.add_argument("--levels", type=lambda s: _names(s, LEVELS, "level"), default=LEVELS,
                        help="comma-separated subset of traced,export")
    parser.add_argument("--repeat", type=int, default=None, help="timed runs of each module (default 30; quick 5)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed runs first (default 5; quick 2)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch.set_num_threads (default 1, for stable numbers; 0 leaves torch's default)")
    parser.add_argument("--ablate", action="store_true",
                        help="also time a rewrite with each rule that fired, alone (its share of the speedup)")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="cpu",
                        help="cpu: process CPU time (default; robust to other load), wall: elapsed time")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows as JSON")
    args = parser.parse_args(argv)
    args.repeat = args.repeat if args.repeat is not None else (5 if args.quick else 30)
    args.warmup = args.warmup if args.warmup is not None else (2 if args.quick else 5)
    return args


def main(argv: Sequence[str] | None = None, out: Any = None) -> int:
    """Run the benchmark and print the report; returns 0, or 1 when a check failed."""
    out = out if out is not None else sys.stdout
    args = parse_args(argv)
    threads = torch.get_num_threads()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    started = time.perf_counter()
    try:
        print(f"fxrewrite {fxrewrite.__version__}, torch {torch.__version__}, {torch.get_num_threads()} thread(s), "
              f"{'quick' if args.quick else 'full'} sizes, median of {args.repeat} runs after {args.warmup} warm-up, "
              f"{args.clock} clock",
              file=out, flush=True)
        library = fxrewrite.load_rules()
        rows = []
        for name in args.models:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                case = CASES[name](args.quick, library)
                for level in args.levels:
                    rows.append(measure(case, level, args))
                    print(f"  {name} / {level}: done", file=out, flush=True)
        print(f"\n{table(rows)}\n\n{details(rows)}", file=out)
        print(f"\ntotal benchmark time {time.perf_counter() - started:.1f} s", file=out)
        if args.json is not None:
            args.json.write_text(json.dumps([{**asdict(r), "speedup": r.speedup} for r in rows], indent=1))
    finally:
        torch.set_num_threads(threads)
    return 0 if all(r.equivalent and not r.error for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
