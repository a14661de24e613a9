"""The ``fxrewrite`` command line: wiring only, the work is done by the library.

    fxrewrite apply TARGET [--rules PATH ...] [--add-rules PATH ...] [-o OUT] [--check] [--diff] [--show-code]
                           [--export] [--shapes] [--max-rewrites N] [--all]
    fxrewrite explain TARGET [--rules PATH ...] [--add-rules PATH ...] [--rule NAME ...] [--misses N] [--shapes]
                             [--export] [--after-others] [--stage STAGE]
    fxrewrite list [PATHS ...]
    fxrewrite check [PATHS ...] [--examples N] [--seed S] [-j N] [-k EXPR] [--rule NAME ...]

Exit status: 0 on success, 1 when ``--check`` finds a difference, 2 on an error (the message
says what failed and what to do).

torch is imported only by the commands that need it, so ``fxrewrite --help`` and
``fxrewrite --version`` answer at once.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from ._version import __version__
from .errors import DidNotConverge, FxRewriteError, MetadataError, TargetError

if TYPE_CHECKING:  # the commands import these when they run (they import torch)
    import torch

    from .report import Report, RewriteResult
    from .rule import RuleSet
    from .target import Target

__all__ = ["main"]

#: What the command line adds to a message about missing shapes/dtypes.
_METADATA_HINT = "add --shapes (shapes from example_inputs() next to the target) or --export"


def _load_rules(paths: Sequence[str] | None, added: Sequence[str] | None = None) -> RuleSet:
    """The rules of ``paths`` (default: the standard library) followed by those of ``added``
    (``--add-rules``); a file given twice loads once."""
    return _load_rules_and_added(paths, added)[0]


def _load_rules_and_added(paths: Sequence[str] | None,
                          added: Sequence[str] | None) -> tuple[RuleSet, tuple[str, ...]]:
    """:func:`_load_rules`, and the names of the rules that came from ``added`` only."""
    from .loader import load_rules, standard_rules_dir
    from .rule import RuleSet

    base = [*(paths or [str(standard_rules_dir())])]
    everything = [*base, *(added or [])]
    unique = {str(Path(p).resolve()): p for p in reversed(everything)}  # the same file given twice loads once
    in_base = {str(Path(p).resolve()) for p in base}
    rules = RuleSet(())
    names: list[str] = []
    for key, path in reversed(unique.items()):
        loaded = load_rules(path)
        rules = rules + loaded
        if key not in in_base:
            names.extend(loaded.names)
    return rules, tuple(names)


def _shapes(target: Target, wanted: bool) -> tuple[Any, ...] | None:
    if not wanted:
        return None
    if target.example_inputs is None:
        raise TargetError(f"--shapes needs example inputs: define example_inputs() next to '{target.spec}'.")
    return target.example_inputs


#: ``--check``'s tolerance: exact rewrites and those that only round differently pass.
CHECK_TOLERANCE = {"rtol": 1e-4, "atol": 1e-5}


def _check(target: Target, rewritten: torch.nn.Module, out: TextIO) -> bool:
    import torch

    from .errors import NotEquivalent
    from .verify import assert_equivalent

    if target.example_inputs is None:
        raise TargetError(f"--check needs example inputs: define example_inputs() next to '{target.spec}'.")
    try:
        with torch.no_grad():
            assert_equivalent(target.model, rewritten, target.example_inputs, **CHECK_TOLERANCE)
    except NotEquivalent as exc:
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


def _print_report(report: Report, out: TextIO, *, all_rows: bool) -> None:
    from .report import format_table

    print(format_table(report, all_rows=all_rows, metadata_hint=_METADATA_HINT, more="--all lists them"), file=out)


def cmd_apply(args: argparse.Namespace, out: TextIO) -> int:
    from .codegen import annotated_code, code_diff
    from .rewrite import rewrite
    from .rule import RuleSet
    from .target import load_target, traced_or_exported

    target = load_target(args.target)
    rules, added = _load_rules_and_added(args.rules, args.add_rules)
    if args.output:
        _check_output(args.output, export=args.export)  # before the work, not after it
    before = traced_or_exported(target, export=args.export)
    print(f"{target.spec}: {len(before.graph.nodes)} nodes, {len(rules)} rules", file=out)
    result = rewrite(before, rules, example_inputs=_shapes(target, args.shapes), max_rewrites=args.max_rewrites,
                     on_progress=_progress_display(len(before.graph.nodes)))
    unfired = [name for name in added if not (result.report.stats[name].applied or result.report.stats[name].rejected)]
    _print_report(_without(result.report, unfired), out, all_rows=args.all)
    if unfired:
        _print_unfired(args, RuleSet(tuple(rules[name] for name in unfired)), result, out)
    if args.diff:
        print(code_diff(before, result.module, fromfile=f"{args.target} (before)", tofile="after"), file=out)
    if args.show_code:
        print(annotated_code(result.module), file=out)
    if args.output and args.export:
        _save_program(_reexported(target, result.module), args.output, out)
    elif args.output:
        _save(result.module, args.output, out)
    if args.check and not _check(target, result.module, out):
        return 1
    return 0


def _without(report: Report, names: Sequence[str]) -> Report:
    """``report`` without the rows of ``names`` (shown on their own, not counted in its summary)."""
    import attrs

    return attrs.evolve(report, stats={k: v for k, v in report.stats.items() if k not in names})


def _print_unfired(args: argparse.Namespace, unfired: RuleSet, result: RewriteResult, out: TextIO) -> None:
    """Your rules (``--add-rules``) that did not fire, each with its closest miss on the graph as
    the rewrite left it, and the ``explain`` command that shows every miss."""
    from .explain import explain

    explained = explain(result.module, unfired, misses=1)
    for rule, why in zip(unfired, explained.rules):
        if why.misses:
            closest = f"closest {why.misses[0]}"  # "closest miss at 'node' (...): reason"
        elif not why.candidates:
            closest = f"no node of the graph computes {why.anchor}, the op its pattern ends with"
        else:
            closest = f"it matches at {', '.join(repr(m) for m in why.matches)} but was not applied"
        tried = result.report.stats[rule.name].attempts
        print(f"your rule {rule.name} ({_short(rule.origin)}) did not fire (tried at {tried} node(s)): {closest}",
              file=out)
    rules = " ".join(f"--rules {p}" for p in args.rules or ())
    added = " ".join(f"--add-rules {p}" for p in args.add_rules)
    names = " ".join(f"--rule {r.name}" for r in unfired)
    command = " ".join(part for part in ("fxrewrite explain", args.target, rules, added, names,
                                         "--export" if args.export else "", "--after-others") if part)
    print(f"(every miss: {command})", file=out)


def _short(origin: str) -> str:
    """``origin`` relative to the current directory when it lies below it."""
    here = str(Path.cwd()) + "/"
    return origin.removeprefix(here)


#: What ``-o OUT`` writes with ``--export``: the rewritten ExportedProgram, ``torch.export.save``d.
PROGRAM_SUFFIX = ".pt2"


def _program_file(output: str) -> Path:
    path = Path(output)
    return path if path.suffix == PROGRAM_SUFFIX else path.with_name(path.name + PROGRAM_SUFFIX)


def _check_output(output: str, *, export: bool) -> None:
    """Refuse an output the result cannot be written to, before anything is rewritten."""
    if export:
        if _program_file(output).is_dir():
            raise TargetError(f"-o {output}: '{_program_file(output)}' is a directory; the rewritten program is "
                              f"written to a file, name another one.")
        return
    from .codegen import check_folder

    check_folder(output)


def _reexported(target: Target, rewritten: torch.fx.GraphModule) -> torch.export.ExportedProgram:
    """The rewritten module (``--export`` rewrites the exported program's ``.module()``, where
    guards see its buffers as constants) exported again, as the program to save."""
    import torch

    assert target.example_inputs is not None  # --export needs them
    try:
        return torch.export.export(rewritten, target.example_inputs)
    except Exception as exc:
        raise TargetError(f"the rewritten module of '{target.spec}' could not be exported again to save it: "
                          f"{type(exc).__name__}: {exc}. Drop -o, or save result.module with torch.save.") from exc


def _save_program(program: torch.export.ExportedProgram, output: str, out: TextIO) -> None:
    """``torch.export.save`` the rewritten program to ``OUT.pt2`` (``OUT`` itself when it ends in .pt2)."""
    import torch

    path = _program_file(output).resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        torch.export.save(program, path)
    except Exception as exc:
        raise TargetError(f"could not save the rewritten program to {path}: {type(exc).__name__}: {exc}. An op a "
                          f"replacement calls must be registered (torch.library) where the program is saved and "
                          f"loaded.") from exc
    print(f"wrote the rewritten program to {path} (load it with: torch.export.load({str(path)!r}).module())",
          file=out)


def _save(module: torch.fx.GraphModule, output: str, out: TextIO) -> None:
    from .codegen import pickled_submodules, write_module

    folder = write_module(module, output)
    print(f"wrote the rewritten module to {folder}/ (import it with: from {folder.name} import RewrittenModule)",
          file=out)
    if pickled := pickled_submodules(folder):
        print(f"pickled whole (not torch.nn classes; importing the folder needs their classes importable): "
              f"{', '.join(pickled)}", file=out)


def cmd_list(args: argparse.Namespace, out: TextIO) -> int:
    from .rule import describe_numerics

    rules = _load_rules(args.paths)
    roots = _rule_roots(args.paths)
    for r in rules:
        print(f"{r.name}  [priority {r.priority}]  {_shown_origin(r.origin, roots)}\n    {r.doc or '(no doc)'}\n"
              f"    numerics: {describe_numerics(r)}", file=out)
    where = "" if args.paths else f" (the standard library, in {roots[0][0]})"
    print(f"{len(rules)} rule(s){where}", file=out)
    return 0


def _rule_roots(paths: Sequence[str] | None) -> list[tuple[Path, str]]:
    """Each rules directory (resolved) with the spelling to show it with: as the user wrote it,
    or nothing for the standard library (its files are shown by their names)."""
    from .loader import standard_rules_dir

    if not paths:
        return [(standard_rules_dir().resolve(), "")]
    roots = []
    for given in paths:
        path = Path(given)
        roots.append((path.resolve(), given) if path.is_dir() else (path.resolve().parent, str(path.parent)))
    return roots


def _shown_origin(origin: str, roots: Sequence[tuple[Path, str]]) -> str:
    """``file:line`` relative to the rules directory it was loaded from, for ``.py`` and ``.fxr``
    files alike (a ``.py`` rule's origin is the absolute path of its code)."""
    file, sep, line = origin.rpartition(":")
    if not sep:
        return origin
    resolved = Path(file).resolve()
    for root, shown in roots:
        if resolved.is_relative_to(root):
            relative = resolved.relative_to(root)
            return f"{(Path(shown) / relative).as_posix() if shown else relative.as_posix()}:{line}"
    return origin


def cmd_explain(args: argparse.Namespace, out: TextIO) -> int:
    from .explain import explain
    from .report import NO_METADATA
    from .rule import RuleSet
    from .target import load_target, traced_or_exported

    target = load_target(args.target)
    loaded = rules = _load_rules(args.rules, args.add_rules)
    if args.rule:
        missing = [name for name in args.rule if name not in rules]
        if missing:
            raise TargetError(f"no rule named {', '.join(missing)} in the loaded rules; see `fxrewrite list`.")
        rules = RuleSet(tuple(rules[name] for name in args.rule))
    if args.stage:
        return _explain_stage(args, target, rules, loaded, out)
    gm = traced_or_exported(target, export=args.export)
    if args.after_others:
        print(f"(explained against the graph after the other {len(loaded) - len(rules)} rule(s) ran)", file=out)
    explanation = explain(gm, rules, example_inputs=_shapes(target, args.shapes), misses=args.misses,
                          after=loaded if args.after_others else None)
    print(explanation, file=out)
    if NO_METADATA in str(explanation):
        print(f"Guards refused on a graph without shapes/dtypes: {_METADATA_HINT}.", file=out)
    return 0


def _explain_stage(args: argparse.Namespace, target: Target, rules: RuleSet, loaded: RuleSet, out: TextIO) -> int:
    """``explain --stage STAGE``: explain against each graph ``torch.compile`` hands a pass at
    that stage (captured with :func:`fxrewrite.inductor.stage_graphs`)."""
    from .explain import explain
    from .inductor import stage_graphs

    if args.export or args.shapes:
        raise TargetError("--stage explains the graphs torch.compile makes (they carry shapes and dtypes); drop "
                          "--export and --shapes.")
    if target.example_inputs is None:
        raise TargetError(f"--stage needs example inputs to compile with: define example_inputs() next to "
                          f"'{target.spec}'.")
    graphs = stage_graphs(target.model, target.example_inputs, stage=args.stage)
    if not graphs:
        raise TargetError(f"torch.compile handed no graph to a pass at stage '{args.stage}' for '{target.spec}' "
                          f"(nothing was compiled: is the model empty, or was every frame skipped?).")
    others = f", after the other {len(loaded) - len(rules)} rule(s) ran" if args.after_others else ""
    for i, gm in enumerate(graphs, 1):
        print(f"(explained against graph {i} of {len(graphs)} torch.compile hands a pass at stage '{args.stage}', "
              f"{len(gm.graph.nodes)} nodes{others})", file=out)
        print(explain(gm, rules, misses=args.misses, after=loaded if args.after_others else None), file=out)
    return 0


def cmd_check(args: argparse.Namespace, out: TextIO) -> int:
    from .testing.check_cli import default_jobs, run_check

    jobs = args.jobs if args.jobs is not None else default_jobs()
    paths = args.paths
    if args.add_rules:  # the given paths (default: the standard library) and the added ones
        from .loader import standard_rules_dir

        paths = [*(paths or [str(standard_rules_dir())]), *args.add_rules]
    return run_check(paths, examples=args.examples, seed=args.seed, out=out, jobs=jobs,
                     keyword=args.keyword, names=args.rule, verbose=args.verbose)


def cmd_lint(args: argparse.Namespace, out: TextIO) -> int:
    """Print what :func:`fxrewrite.analyze` finds; 1 when a finding makes rewrites fail (a loop)."""
    from .analysis import analyze, replacement_raises

    rules = _load_rules(args.paths)
    findings = sorted((replacement_raises(f, rules) for f in analyze(rules)),
                      key=lambda f: ("error", "warning", "note").index(f.severity))  # errors first, as analyze
    here = str(Path.cwd()) + "/"
    for finding in findings:
        print(f"{str(finding).replace(here, '')}\n", file=out)  # origins below the current directory: relative
    counts = {s: sum(f.severity == s for f in findings) for s in ("error", "warning", "note")}
    print(f"{len(rules)} rule(s): {counts['error']} error(s), {counts['warning']} warning(s), "
          f"{counts['note']} note(s)", file=out)
    return 1 if counts["error"] else 0


def build_parser() -> argparse.ArgumentParser:
    """The command line: one sub-command per job (``apply``, ``explain``, ``check``, ``list``,
    ``lint``), each built by its ``_add_<command>_command``."""
    parser = argparse.ArgumentParser(prog="fxrewrite", description="Pattern-rewriting rules for PyTorch programs.")
    parser.add_argument("--version", action="version", version=f"fxrewrite {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_apply_command(sub)
    _add_explain_command(sub)
    _add_check_command(sub)
    _add_list_command(sub)
    _add_lint_command(sub)
    return parser


def _add_apply_command(sub: Any) -> None:
    apply = sub.add_parser("apply", help="rewrite a model with a rule set and report what changed")
    apply.add_argument("target", help="path/to/file.py:NAME or package.module:NAME (module, class or factory)")
    apply.add_argument("--rules", action="append", metavar="PATH",
                       help="rule file or directory (repeatable; default: the shipped standard library)")
    _add_rules_option(apply)
    apply.add_argument("-o", "--output", metavar="OUT", help="write the rewritten module to this folder")
    apply.add_argument("--check", action="store_true", help="compare outputs on example_inputs() before and after")
    apply.add_argument("--diff", action="store_true", help="print a unified diff of the forward code")
    apply.add_argument("--show-code", action="store_true", help="print the rewritten code with provenance comments")
    apply.add_argument("--export", action="store_true", help="capture the model with torch.export instead of tracing")
    apply.add_argument("--shapes", action="store_true",
                       help="propagate shapes from example_inputs() so guards can read them")
    apply.add_argument("--max-rewrites", type=_count, default=None, metavar="N",
                       help="rewrite budget before giving up with DidNotConverge (default: 8 per graph node + 64)")
    apply.add_argument("--all", action="store_true",
                       help="show every rule in the report (default: those that fired or were refused by a guard)")
    apply.set_defaults(run=cmd_apply)


def _add_explain_command(sub: Any) -> None:
    explain = sub.add_parser("explain", help="say where each rule matches and why it does not elsewhere")
    explain.add_argument("target", help="path/to/file.py:NAME or package.module:NAME")
    explain.add_argument("--rules", action="append", metavar="PATH",
                         help="rule file or directory (repeatable; default: the shipped standard library)")
    _add_rules_option(explain)
    explain.add_argument("--rule", action="append", metavar="NAME", help="explain only this rule (repeatable)")
    explain.add_argument("--misses", type=_count, default=3, help="closest misses to show per rule (default 3)")
    explain.add_argument("--shapes", action="store_true",
                         help="propagate shapes from example_inputs() so guards can read them")
    explain.add_argument("--export", action="store_true", help="capture the model with torch.export")
    explain.add_argument("--after-others", action="store_true",
                         help="explain against the graph after the other loaded rules ran (as apply leaves it)")
    explain.add_argument("--stage", choices=_STAGE_NAMES, default=None,
                         help="explain against the graph(s) torch.compile hands a pass at this stage (needs "
                              "example_inputs(); 'dynamo' is what a backend receives)")
    explain.set_defaults(run=cmd_explain)


def _add_check_command(sub: Any) -> None:
    check = sub.add_parser("check",
                           help="property-test rules: does each replacement compute what its pattern computes?")
    check.add_argument("paths", nargs="*", metavar="PATH", help="rule files or directories (default: shipped)")
    check.add_argument("--examples", type=int, default=100, metavar="N", help="examples drawn per rule")
    check.add_argument("--seed", type=int, default=None, metavar="S", help="seed of the search (default: derandomized)")
    check.add_argument("-j", "--jobs", type=int, default=None, metavar="N",
                       help="check rules in N processes (default: the number of cores)")
    check.add_argument("-v", "--verbose", action="store_true",
                       help="under each rule's row: the inputs drawn, kept, and the share its guards rejected")
    check.add_argument("-k", dest="keyword", metavar="EXPR",
                       help="only rules whose name or file name matches EXPR, as pytest -k (e.g. 'relu and not gelu')")
    check.add_argument("--rule", action="append", metavar="NAME", help="only this rule (repeatable)")
    _add_rules_option(check)
    check.set_defaults(run=cmd_check)


def _add_list_command(sub: Any) -> None:
    listing = sub.add_parser("list", help="list rules with their origin, priority and doc")
    listing.add_argument("paths", nargs="*", metavar="PATH", help="rule files or directories (default: shipped)")
    listing.set_defaults(run=cmd_list)


def _add_lint_command(sub: Any) -> None:
    lint = sub.add_parser("lint", help="analyse rules before running them: loops, rules undoing each other, "
                                       "rules that never fire")
    lint.add_argument("paths", nargs="*", metavar="PATH", help="rule files or directories (default: shipped)")
    lint.set_defaults(run=cmd_lint)


#: ``explain --stage``: Inductor's pass stages (``fxrewrite.inductor.STAGES``) and ``dynamo``; spelt
#: out here so that ``fxrewrite --help`` does not import torch.
_STAGE_NAMES = ("dynamo", "pre_grad", "joint", "joint_post", "post_grad", "post_grad_post")


def _count(text: str) -> int:
    """An argument that counts something: an integer, 0 or more."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number, 0 or more, got {text!r}")
    return value


def _add_rules_option(command: argparse.ArgumentParser) -> None:
    command.add_argument("--add-rules", action="append", metavar="PATH",
                         help="rule file or directory to use in addition to --rules or the standard library "
                              "(repeatable)")


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    args = build_parser().parse_args(argv)
    try:
        return int(args.run(args, out))
    except BrokenPipeError:  # `fxrewrite list | head`: the reader has gone, nothing is wrong
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except FxRewriteError as exc:
        print(f"fxrewrite {args.command}: error: {_for_the_command_line(exc)}", file=sys.stderr)
        if isinstance(exc.__cause__, MetadataError):
            print(f"On the command line: {_METADATA_HINT}.", file=sys.stderr)
        return 2


#: The library's advice on the rewrite budget, and the same advice on the command line.
_BUDGET_ADVICE = ("Raise max_rewrites", "Raise the budget with --max-rewrites N")


def _for_the_command_line(exc: FxRewriteError) -> str:
    """The error's message, its advice spelt as command-line options (said once)."""
    text = str(exc)
    if isinstance(exc, DidNotConverge):
        library, command_line = _BUDGET_ADVICE
        if library in text:
            return text.replace(library, command_line)
        return f"{text} {command_line} if the graph needs more rewrites."
    return text


if __name__ == "__main__":
    sys.exit(main())
