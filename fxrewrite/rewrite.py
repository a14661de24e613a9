"""``rewrite``: the front door. Apply a rule set to a program until nothing matches.

This module takes what users hand over and gives back what they expect: it checks the options,
turns a module or function into a ``GraphModule`` (:mod:`fxrewrite.target`), sends an
``ExportedProgram`` to :mod:`fxrewrite.exported` (which calls back into the drive given to
it), runs the :class:`~fxrewrite.driver.Driver` to a fixed point, then lints, drops what nothing
reads any more, recompiles once (:func:`fxrewrite.codegen.recompile`: fx's code, generated
cheaper) and returns the :class:`~fxrewrite.report.Report`. How the
drive orders its work and why it stops is :mod:`fxrewrite.driver`'s docstring.

>>> import torch
>>> from fxrewrite import Rule, rewrite
>>> relu_relu = Rule.from_functions(lambda x: torch.relu(torch.relu(x)), lambda x: torch.relu(x),
...                                 name="relu_relu")
>>> class Net(torch.nn.Module):
...     def forward(self, x):
...         for _ in range(5):
...             x = torch.relu(x)
...         return x
>>> result = rewrite(Net(), relu_relu)
>>> result.report.applied["relu_relu"], sum(n.target is torch.relu for n in result.module.graph.nodes)
(4, 1)
"""

from __future__ import annotations

import functools
import itertools
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx as fx
from torch.fx.node import Node

from ._gc import collections_paused
from ._torch import side_table_buckets
from .canon import effects
from .codegen import recompile
from .driver import Driver
from .errors import ArgumentError, FxRewriteError, NotEquivalent, RewriteError
from .exported import rewrite_program
from .meta import propagate_inputs
from .report import Report, RewriteResult
from .rule import RuleSet, RulesLike, as_ruleset
from .target import to_graph_module
from .verify import assert_equivalent

__all__ = ["rewrite", "rewrite_graph"]


def rewrite(
    target: torch.nn.Module | Callable[..., Any],
    rules: RulesLike,
    *,
    inplace: bool = False,
    max_rewrites: int | None = None,
    example_inputs: Sequence[Any] | None = None,
    debug: bool | None = None,
    on_progress: Callable[[int, int], None] | None = None,
    check_inputs: Sequence[Any] | None = None,
    _stop_after: int | None = None,
) -> RewriteResult:
    """Rewrite ``target`` with ``rules`` to a fixed point.

    >>> import torch, fxrewrite
    >>> neg_neg = fxrewrite.Rule.from_functions(lambda x: torch.neg(torch.neg(x)), lambda x: x, name="neg_neg")
    >>> result = fxrewrite.rewrite(lambda a: torch.relu(torch.neg(torch.neg(a))), neg_neg)
    >>> result.report.applied, "neg" in result.code
    ({'neg_neg': 1}, False)

    ``target`` is an ``nn.Module`` or a function (traced with ``torch.fx.symbolic_trace``), a
    ``GraphModule`` (copied unless ``inplace=True``) or a ``torch.export.ExportedProgram`` (its
    lifted graph is rewritten; the result's ``exported_program`` is the rewritten program, with
    the same signature and state dict, and ``module`` its ``.module()``); the caller's module is
    never modified unless ``inplace=True``.

    ``max_rewrites`` bounds the number of rewrites (default: eight per graph node, plus 64).
    ``example_inputs`` gives a graph without metadata the shapes and dtypes guards and
    replacements read (fake tensors are propagated, see :mod:`fxrewrite.meta`; the rewrite is then
    specialised to them). ``debug`` (or ``FXREWRITE_DEBUG=1``) lints the graph after every
    rewrite and names the rule after which a check failed. ``on_progress(rewrites, queued)`` is
    called now and then (for progress displays). ``check_inputs`` (a tuple of arguments, or a list
    of such tuples) verifies the result against the original on them; when they differ, the
    rewrites are bisected and :class:`NotEquivalent` names the first rewrite that changed the
    result. A bad option is an :class:`ArgumentError` naming it.
    """
    _check_arguments(inplace=inplace, max_rewrites=max_rewrites, example_inputs=example_inputs, debug=debug,
                     on_progress=on_progress, check_inputs=check_inputs)
    ruleset = as_ruleset(rules)
    with collections_paused():  # a big rewrite would otherwise spend most of its time in full collections
        if check_inputs is not None:
            return _checked_rewrite(target, ruleset, check_inputs, inplace=inplace, max_rewrites=max_rewrites,
                                    example_inputs=example_inputs, debug=debug, on_progress=on_progress)
        if isinstance(target, torch.export.ExportedProgram):  # rewrite the lifted graph, build a program again
            run = functools.partial(_rewrite_module, ruleset=ruleset, inplace=False, max_rewrites=max_rewrites,
                                    example_inputs=None, debug=debug, on_progress=on_progress,
                                    stop_after=_stop_after)
            return rewrite_program(target, run, inplace=inplace, example_inputs=example_inputs)
        return _rewrite_module(target, ruleset, inplace=inplace, max_rewrites=max_rewrites,
                               example_inputs=example_inputs, debug=debug, on_progress=on_progress,
                               stop_after=_stop_after)


def _rewrite_module(target: torch.nn.Module | Callable[..., Any], ruleset: RuleSet, *, inplace: bool,
                    max_rewrites: int | None, example_inputs: Sequence[Any] | None, debug: bool | None,
                    on_progress: Callable[[int, int], None] | None, stop_after: int | None) -> RewriteResult:
    """``rewrite`` of a module or function (arguments checked)."""
    gm = to_graph_module(target, inplace=inplace)
    if example_inputs is not None:
        propagate_inputs(gm, example_inputs)
    started = time.perf_counter()
    driver = Driver(gm, ruleset, budget=_budget(gm.graph, max_rewrites), debug=_debug(debug), on_progress=on_progress,
                    stop_after=stop_after)
    try:
        driver.run()
    except FxRewriteError as exc:
        if inplace and driver.rewrites:
            recompile(gm)
            _add_note(exc, f"inplace=True: the module keeps the {driver.rewrites} rewrite(s) applied before this "
                           f"error.")
        raise
    _check_lint(gm.graph, driver, how="rerun with debug=True (or FXREWRITE_DEBUG=1)")
    if driver.rewrites:
        _drop_dead_attributes(gm, owned=not inplace)
    _recompile(gm, driver, inplace=inplace)
    return RewriteResult(gm, driver.report(time.perf_counter() - started))


def _budget(graph: fx.Graph, max_rewrites: int | None) -> int:
    """The rewrite budget: ``max_rewrites``, or eight rewrites per graph node plus 64."""
    return max_rewrites if max_rewrites is not None else 8 * len(graph.nodes) + 64


def _debug(debug: bool | None) -> bool:
    """``debug``, or when it is ``None`` the environment variable ``FXREWRITE_DEBUG``."""
    return debug if debug is not None else os.environ.get("FXREWRITE_DEBUG", "") not in ("", "0")


def _check_lint(graph: fx.Graph, driver: Driver, *, how: str) -> None:
    """The rewritten graph lints, else a :class:`RewriteError` naming the rules applied and
    ``how`` to find the one after which it broke."""
    try:
        if not (FAST_LINT and _lint_passes(graph)):
            graph.lint()  # raises fx's own error (or passes: the fast check is the stricter)
    except Exception as exc:
        raise RewriteError(
            f"the rewritten graph is invalid ({exc}); {how} to find the rule after which it broke. Rules applied: "
            f"{driver.applied_rules()}."
        ) from exc


#: Check the rewritten graph with :func:`_lint_passes` first; ``False``: fx's ``Graph.lint()`` only
#: (the slow twin; ``tests/test_rewrite.py`` checks that every graph fx rejects fails the fast check).
FAST_LINT = True
_LEGAL_OPS = frozenset({"placeholder", "call_method", "call_module", "call_function", "get_attr", "output"})


def _lint_passes(graph: fx.Graph) -> bool:
    """True when ``graph`` passes every check of fx's ``Graph.lint()`` (each node legal, owned by
    the graph and filed in its side table, its arguments defined before it in this graph, its name
    unique, its target callable or a string naming an attribute of the owning module); False
    when one fails, and fx's lint then says which. It checks what fx's lint checks, without the
    per-argument message fx formats before checking, and in one pass: a side-table bucket read
    per node (not two method calls), the arguments by one set comparison, the names counted."""
    seen: set[Node] = set()  # nodes of this graph only, each once it is defined
    defined, add = seen.issuperset, seen.add  # (bound once: asked of every node)
    buckets = side_table_buckets(graph)
    by_target: dict[Any, Any] = {}  # per call_function target, its bucket (no key tuple built per call)
    by_op = {op: buckets.get((op, None), ()) for op in _LEGAL_OPS}  # the other opcodes' buckets
    owner = graph.owning_module
    paths: list[Node] = []  # get_attr and call_module nodes: their targets are paths in the owner
    names: list[str] = []
    for node in graph.nodes:
        op, target = node.op, node.target
        if op == "call_function":
            bucket = by_target.get(target)
            if bucket is None:
                bucket = by_target[target] = buckets.get((op, target), ())
            if owner and not callable(target):
                return False
        else:
            bucket = by_op.get(op)
            if bucket is None:  # an illegal opcode
                return False
            if owner:
                if not isinstance(target, str):
                    return False
                if op == "get_attr" or op == "call_module":
                    paths.append(node)
        if node not in bucket or node.graph is not graph or not defined(node._input_nodes):
            return False
        add(node)
        names.append(node.name)
    return len(set(names)) == len(names) and _targets_exist(owner, paths)  # type: ignore[arg-type]


def _targets_exist(owner: torch.nn.Module, paths: list[Node]) -> bool:
    """:func:`_target_exists` for each of ``paths``; a ``call_module`` target read with
    :func:`~fxrewrite.canon.effects.plain_submodule` (``FAST_MODULE_ATTRIBUTES``), what each module's
    class defines read once per class (its memo, dropped after a read it could not tell: ``getattr``
    may then run a class's own code)."""
    classes: dict[type, frozenset[str] | None] | None = {} if effects.FAST_MODULE_ATTRIBUTES else None
    for node in paths:
        if classes is not None and node.op == "call_module" and isinstance(node.target, str) and node.target:
            found = effects.plain_submodule(owner, node.target, classes)
            if found is not effects.UNSURE:
                if found is None:
                    return False
                continue
            classes.clear()
        if not _target_exists(owner, node):
            return False
    return True


def _target_exists(owner: torch.nn.Module, node: Node) -> bool:
    """fx's lint on a node's target: callable for ``call_function``, else a string; for
    ``get_attr`` and ``call_module`` an attribute path of ``owner`` (a module for ``call_module``)."""
    if node.op == "call_function":
        return callable(node.target)
    if not isinstance(node.target, str):
        return False
    if node.op in ("get_attr", "call_module"):
        item: Any = owner
        for atom in node.target.split("."):
            item = getattr(item, atom, None)
            if item is None or (node.op == "call_module" and not isinstance(item, torch.nn.Module)):
                return False
    return True


def _recompile(gm: fx.GraphModule, driver: Driver, *, inplace: bool) -> None:
    """Generate the rewritten module's code; a graph Python cannot be generated from is a
    :class:`RewriteError` naming the rules applied, never a raw error from code generation."""
    try:
        recompile(gm)
    except Exception as exc:
        kept = (" With inplace=True the module's graph holds the rewrites but its code is the old one: rebuild it "
                "from a fresh trace." if inplace else " The caller's module is untouched.")
        raise RewriteError(
            f"the rewritten graph could not be turned into Python code ({type(exc).__name__}: {exc}). Rules "
            f"applied: {driver.applied_rules()}.{kept}") from exc


def _add_note(exc: BaseException, note: str) -> None:
    """``exc.add_note(note)`` (Python 3.11+); on 3.10 the note joins the message."""
    if hasattr(exc, "add_note"):
        exc.add_note(note)
    else:
        exc.args = (f"{exc.args[0] if exc.args else ''}\n{note}", *exc.args[1:])


def _check_arguments(*, inplace: Any, max_rewrites: Any, example_inputs: Any, debug: Any, on_progress: Any,
                     check_inputs: Any) -> None:
    """``rewrite``'s options, checked before anything is traced: an :class:`ArgumentError` names
    the argument, what it got and what it takes."""
    def refuse(name: str, got: Any, takes: str) -> ArgumentError:
        return ArgumentError(f"rewrite(): {name}= takes {takes}, got {got!r} ({type(got).__name__}).")

    if not isinstance(inplace, bool):
        raise refuse("inplace", inplace, "True or False")
    if debug is not None and not isinstance(debug, bool):
        raise refuse("debug", debug, "True, False or None")
    if max_rewrites is not None and (not isinstance(max_rewrites, int) or isinstance(max_rewrites, bool)
                                     or max_rewrites < 0):
        raise refuse("max_rewrites", max_rewrites, "a number of rewrites >= 0, or None for the default")
    if on_progress is not None and not callable(on_progress):
        raise refuse("on_progress", on_progress, "a function on_progress(rewrites, queued), or None")
    if example_inputs is not None and not isinstance(example_inputs, (tuple, list)):
        raise refuse("example_inputs", example_inputs, "a tuple of the forward() arguments, e.g. (x,)")
    if check_inputs is not None:
        cases = check_inputs if isinstance(check_inputs, list) else [check_inputs]
        for case in cases:
            if not isinstance(case, tuple) or not any(isinstance(v, torch.Tensor) for v in case):
                raise refuse("check_inputs", check_inputs, "a tuple of forward() arguments with at least one tensor, "
                                                           "e.g. (torch.randn(2, 3),), or a list of such tuples")


def _checked_rewrite(target: Any, ruleset: RuleSet, check_inputs: Sequence[Any], *, inplace: bool,
                     **options: Any) -> RewriteResult:
    """``rewrite`` followed by a comparison with the original on ``check_inputs``; on a
    difference, bisect the (deterministic) sequence of rewrites for the first culprit."""
    reference = to_graph_module(target)  # an untouched copy: inplace may change ``target``
    reference.recompile()  # a copy of a GraphModule is not compiled yet (rewrite() compiles its own result)

    def differs(module: torch.nn.Module) -> str | None:
        try:
            assert_equivalent(reference, module, check_inputs)
        except NotEquivalent as exc:
            return str(exc)
        return None

    result = rewrite(target, ruleset, inplace=inplace, **options)
    problem = differs(result.module)
    if problem is None:
        return result
    low, high = 0, result.report.rewrites  # the first `high` rewrites differ, the first `low` do not
    while high - low > 1:
        middle = (low + high) // 2
        partial = rewrite(reference, ruleset, _stop_after=middle, **options)
        low, high = (low, middle) if differs(partial.module) else (middle, high)
    culprit = rewrite(reference, ruleset, _stop_after=high, **options).report.last_rewrite
    raise NotEquivalent(
        f"the rewritten module differs from the original on check_inputs: {problem}. The first rewrite that "
        f"changes the result is #{high} of {result.report.rewrites}: {culprit}. Restrict that rule with a "
        f"guard or a declared domain (fxrewrite.testing.check_rule finds its counterexamples), or remove it."
    )


def _drop_dead_attributes(gm: fx.GraphModule, *, owned: bool) -> None:
    """After rewriting: erase ``get_attr`` nodes nothing reads any more, and the submodules no
    node calls (the conv and bn a folding rule replaced); in a module fxrewrite made itself
    (``owned``), also its own parameters and buffers no node reads. Attributes inside
    submodules are never touched: those modules are shared with the caller's model."""
    for node in gm.graph.find_nodes(op="get_attr"):
        if not node.users:
            gm.graph.erase_node(node)
    if FAST_SUBMODULE_SWEEP:
        _delete_unused_submodules(gm)
    else:
        gm.delete_all_unused_submodules()
    if not owned:
        return
    read = {n.target for n in gm.graph.find_nodes(op="get_attr")}
    for name, _ in [*gm.named_parameters(recurse=False), *gm.named_buffers(recurse=False)]:
        if name not in read:  # only gm's own attributes: submodules may be shared with the caller
            delattr(gm, name)


#: Sweep unused submodules with :func:`_delete_unused_submodules`; ``False``: with fx's
#: ``GraphModule.delete_all_unused_submodules`` (the slow twin, quadratic: it looks each submodule up in a
#: list of the used names; 208 ms for the 6k submodules of bench_rewrite's modules row at 64k nodes).
FAST_SUBMODULE_SWEEP = True


def _delete_unused_submodules(gm: fx.GraphModule) -> None:
    """What ``gm.delete_all_unused_submodules()`` does, with the used names in a set: a submodule
    is used when a ``call_module`` or ``get_attr`` node's target is it, lies below it, or (for a
    ``call_module``) lies above it; the others are deleted, in ``named_modules()`` order. A module
    without children has nothing below it to list; each unused one is deleted from the parent
    ``named_modules()`` found it in, unless an unused ancestor went first (fx's
    ``delete_submodule`` then finds no path to it and deletes nothing)."""
    used: set[str] = set()
    graph = gm.graph
    for node in [*graph.find_nodes(op="call_module"), *graph.find_nodes(op="get_attr")]:
        target = node.target
        if not isinstance(target, str):
            continue
        if "." in target:
            used.update(itertools.accumulate(target.split("."), _join_path))  # "a.b.c": "a", "a.b", "a.b.c"
        else:
            used.add(target)
        if node.op == "call_module":
            submodule = effects.submodule(gm, target)
            if submodule is None:  # a node naming a module that does not exist: nothing to keep below it
                continue
            if submodule._modules or type(submodule).named_modules is not torch.nn.Module.named_modules:
                used.update(f"{target}.{name}" for name, _ in submodule.named_modules() if name != "")
    listed = effects.named_modules(gm)
    gone: set[str] = set()
    for name in listed:
        if name in used or not name:  # "" is gm itself: fx finds no attribute of that name
            continue
        parent, _, atom = name.rpartition(".")
        if parent and any(path in gone for path in itertools.accumulate(parent.split("."), _join_path)):
            continue  # below a deleted module: out of gm's reach already
        delattr(listed[parent], atom)
        gone.add(name)


def _join_path(prefix: str, atom: str) -> str:
    """fx's ``join_fn`` in ``delete_all_unused_submodules`` (an empty atom adds nothing)."""
    return ".".join([prefix, atom] if atom else [prefix])


def rewrite_graph(graph: fx.Graph, rules: RulesLike, *, max_rewrites: int | None = None) -> Report:
    """Rewrite a bare ``torch.fx.Graph`` in place with ``rules`` to a fixed point; return the
    :class:`Report`.

    For passes that are handed a graph rather than a module (Inductor's custom graph passes,
    see :func:`fxrewrite.inductor_pass`). Tensors and modules a replacement creates are
    registered on ``graph.owning_module``; a graph without an owning module gets a new
    ``GraphModule`` as its owner. The owning module is recompiled when something changed.

    >>> import torch, torch.fx as fx
    >>> from fxrewrite import Rule
    >>> graph = fx.symbolic_trace(lambda a: torch.neg(torch.neg(a)) + 1).graph
    >>> report = rewrite_graph(graph, Rule.from_functions(lambda x: torch.neg(torch.neg(x)), lambda x: x,
    ...                                                   name="neg_neg"))
    >>> report.applied, [n.op for n in graph.nodes]
    ({'neg_neg': 1}, ['placeholder', 'call_function', 'output'])
    """
    if not isinstance(graph, fx.Graph):
        raise ArgumentError(
            f"rewrite_graph takes a torch.fx.Graph, got {type(graph).__name__}; pass gm.graph, or use "
            f"fxrewrite.rewrite for modules, functions and ExportedPrograms."
        )
    ruleset = as_ruleset(rules)
    owner = graph.owning_module
    gm = owner if isinstance(owner, fx.GraphModule) else fx.GraphModule(owner or torch.nn.Module(), graph)
    started = time.perf_counter()
    driver = Driver(gm, ruleset, budget=_budget(graph, max_rewrites), debug=_debug(None))
    with collections_paused():
        driver.run()
        if driver.rewrites:
            _check_lint(graph, driver, how="set FXREWRITE_DEBUG=1")
            _drop_dead_attributes(gm, owned=False)
            recompile(gm)
    return driver.report(time.perf_counter() - started)
