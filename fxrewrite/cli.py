"""The ``fxrewrite`` command line: wiring only, the work is done by the library.

    fxrewrite apply TARGET [--rules PATH ...] [-o OUT] [--check] [--diff] [--show-code] [--export] [--shapes]
    fxrewrite explain TARGET [--rules PATH ...] [--rule NAME ...] [--misses N] [--shapes] [--export]
    fxrewrite list [PATHS ...]
    fxrewrite check [PATHS ...] [--examples N] [--seed S]

Exit status: 0 on success, 1 when ``--check`` finds a difference, 2 on an error (the message
says what failed and what to do).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from collections.abc import Sequence
from typing import Any, TextIO

import torch

from .codegen import annotated_code, code_diff, write_module
from .errors import FxRewriteError, MetadataError, TargetError
from .rule import RuleSet
from .target import Target, load_target, traced_or_exported

__all__ = ["main"]


def _load_rules(paths: Sequence[str] | None) -> RuleSet:
    from .loader import load_rules

    if not paths:
        return load_rules()
    unique = {str(Path(p).resolve()): p for p in reversed(paths)}  # the same file given twice loads once
    rules = RuleSet(())
    for path in reversed(unique.values()):
        rules = rules + load_rules(path)
    return rules


def _shapes(target: Target, wanted: bool) -> tuple[Any, ...] | None:
    if not wanted:
        return None
    if target.example_inputs is None:
        raise TargetError(f"--shapes needs example inputs: define example_inputs() next to '{target.spec}'.")
    return target.example_inputs


def _check(target: Target, rewritten: torch.nn.Module, out: TextIO) -> bool:
    if target.example_inputs is None:
        raise TargetError(f"--check needs example inputs: define example_inputs() next to '{target.spec}'.")
    with torch.no_grad():
        expected = target.model(*target.example_inputs)
        actual = rewritten(*target.example_inputs)
    try:
        torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-5)
    except AssertionError as exc:
        print(f"check: FAILED, the rewritten module differs from the original on example_inputs():\n{exc}", file=out)
        return False
    print("check: ok, the rewritten module matches the original on example_inputs()", file=out)
    return True


def _progress_display(nodes: int) -> Any:
    """A progress line on stderr for long runs (big graphs, on a terminal); else nothing."""
    if nodes < 5000 or not sys.stderr.isatty():
        return None

    def show(rewrites: int, queued: int) -> None:
        end = "\n" if queued == 0 else ""
        print(f"\rrewriting: {rewrites} rewrite(s), {queued} node(s) left to visit   ", end=end, file=sys.stderr,
              flush=True)

    return show


def _print_report(report: Any, out: TextIO) -> None:
    active = {name: s for name, s in report.stats.items() if s.attempts or s.applied}
    width = max([len("rule"), *(len(n) for n in active)])
    print(f"{'rule':<{width}}  {'fired':>6}  {'guarded':>7}  {'tried':>6}  {'ms':>8}", file=out)
    for name, s in active.items():
        print(f"{name:<{width}}  {s.applied:>6}  {s.rejected:>7}  {s.attempts:>6}  {s.seconds * 1e3:>8.2f}", file=out)
    idle = len(report.stats) - len(active)
    print(f"{report.rewrites} rewrite(s) in {report.seconds * 1e3:.1f} ms; {idle} rule(s) found no candidate",
          file=out)


def cmd_apply(args: argparse.Namespace, out: TextIO) -> int:
    from .rewrite import rewrite

    target = load_target(args.target)
    rules = _load_rules(args.rules)
    before = traced_or_exported(target, export=args.export)
    print(f"{target.spec}: {len(before.graph.nodes)} nodes, {len(rules)} rules", file=out)
    result = rewrite(before, rules, example_inputs=_shapes(target, args.shapes),
                     on_progress=_progress_display(len(before.graph.nodes)))
    _print_report(result.report, out)
    if args.diff:
        print(code_diff(before, result.module, fromfile=f"{args.target} (before)", tofile="after"), file=out)
    if args.show_code:
        print(annotated_code(result.module), file=out)
    if args.output:
        folder = write_module(result.module, args.output)
        print(f"wrote the rewritten module to {folder}/ (import it with: from {folder.name} import "
              f"RewrittenModule)", file=out)
    if args.check and not _check(target, result.module, out):
        return 1
    return 0


def cmd_list(args: argparse.Namespace, out: TextIO) -> int:
    rules = _load_rules(args.paths)
    for r in rules:
        print(f"{r.name}  [priority {r.priority}]  {r.origin}\n    {r.doc or '(no doc)'}", file=out)
    print(f"{len(rules)} rule(s)", file=out)
    return 0


def cmd_explain(args: argparse.Namespace, out: TextIO) -> int:
    from .explain import explain

    target = load_target(args.target)
    rules = _load_rules(args.rules)
    if args.rule:
        missing = [name for name in args.rule if name not in rules]
        if missing:
            raise TargetError(f"no rule named {', '.join(missing)} in the loaded rules; see `fxrewrite list`.")
        rules = RuleSet(tuple(rules[name] for name in args.rule))
    gm = traced_or_exported(target, export=args.export)
    print(explain(rules, gm, example_inputs=_shapes(target, args.shapes), misses=args.misses), file=out)
    return 0


def cmd_check(args: argparse.Namespace, out: TextIO) -> int:
    from .testing.check_cli import run_check

    return run_check(args.paths, examples=args.examples, seed=args.seed, out=out)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fxrewrite", description="Pattern-rewriting rules for PyTorch programs.")
    sub = parser.add_subparsers(dest="command", required=True)

    apply = sub.add_parser("apply", help="rewrite a model with a rule set and report what changed")
    apply.add_argument("target", help="path/to/file.py:NAME or package.module:NAME (module, class or factory)")
    apply.add_argument("--rules", action="append", metavar="PATH",
                       help="rule file or directory (repeatable; default: the shipped standard library)")
    apply.add_argument("-o", "--output", metavar="OUT", help="write the rewritten module to this folder")
    apply.add_argument("--check", action="store_true", help="compare outputs on example_inputs() before and after")
    apply.add_argument("--diff", action="store_true", help="print a unified diff of the forward code")
    apply.add_argument("--show-code", action="store_true", help="print the rewritten code with provenance comments")
    apply.add_argument("--export", action="store_true", help="capture the model with torch.export instead of tracing")
    apply.add_argument("--shapes", action="store_true",
                       help="propagate shapes from example_inputs() so guards can read them")
    apply.set_defaults(run=cmd_apply)

    explain = sub.add_parser("explain", help="say where each rule matches and why it does not elsewhere")
    explain.add_argument("target", help="path/to/file.py:NAME or package.module:NAME")
    explain.add_argument("--rules", action="append", metavar="PATH", help="rule file or directory (repeatable)")
    explain.add_argument("--rule", action="append", metavar="NAME", help="explain only this rule (repeatable)")
    explain.add_argument("--misses", type=int, default=3, help="closest misses to show per rule (default 3)")
    explain.add_argument("--shapes", action="store_true",
                         help="propagate shapes from example_inputs() so guards can read them")
    explain.add_argument("--export", action="store_true", help="capture the model with torch.export")
    explain.set_defaults(run=cmd_explain)

    check = sub.add_parser("check", help="property-test rules: does each replacement compute what its pattern computes?")
    check.add_argument("paths", nargs="*", metavar="PATH", help="rule files or directories (default: shipped)")
    check.add_argument("--examples", type=int, default=100, metavar="N", help="examples drawn per rule")
    check.add_argument("--seed", type=int, default=None, metavar="S", help="seed of the search (default: derandomized)")
    check.set_defaults(run=cmd_check)

    listing = sub.add_parser("list", help="list rules with their origin, priority and doc")
    listing.add_argument("paths", nargs="*", metavar="PATH", help="rule files or directories (default: shipped)")
    listing.set_defaults(run=cmd_list)
    return parser


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    args = build_parser().parse_args(argv)
    try:
        return int(args.run(args, out))
    except FxRewriteError as exc:
        print(f"fxrewrite {args.command}: error: {exc}", file=sys.stderr)
        if isinstance(exc.__cause__, MetadataError):
            print("On the command line: add --shapes (shapes come from example_inputs() next to the target) "
                  "or --export.", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
