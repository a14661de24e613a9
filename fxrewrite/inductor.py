"""Rule sets inside ``torch.compile``: an Inductor custom graph pass, and a backend.

:func:`inductor_pass` wraps a rule set as a
``torch._inductor.custom_graph_pass.CustomGraphPass``, to install at one of Inductor's stages
(``pre_grad``: Dynamo's torch-level graph; ``joint``: the functionalized ATen graph of forward
and backward; ``post_grad``: the ATen graph Inductor lowers). Its ``uuid()`` is a content hash
of the rules (sources, closed-over constants, names, priorities, declarations) and of the
fxrewrite and torch versions, so Inductor's FX graph cache stays on and honest: a second
compile with the same rules hits it, a changed rule misses it. :func:`backend` is a
``torch.compile`` backend that rewrites Dynamo's graph, then hands it to another backend.

Both keep a cumulative :class:`~fxrewrite.Report` over every graph they rewrote.

>>> import torch, fxrewrite
>>> neg_neg = fxrewrite.Rule.from_functions(lambda x: torch.neg(torch.neg(x)), lambda x: x, name="neg_neg")
>>> rules_backend = fxrewrite.backend(neg_neg, then="eager")
>>> f = torch.compile(lambda a: torch.relu(-(-a)), backend=rules_backend)
>>> f(torch.tensor([-1.0, 2.0]))
tensor([0., 2.])
>>> rules_backend.report.applied
{'neg_neg': 1}
>>> len(fxrewrite.inductor_pass(neg_neg).uuid())
64
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import functools
import hashlib
import inspect
import logging
import operator
import os
import re
import time
import types
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import torch
import torch.fx as fx
from torch._inductor.custom_graph_pass import CustomGraphPass
from torch.fx.node import Node

from ._logs import quieted
from ._torch import FakeTensor, detect_fake_mode, is_erased, tree_flatten, tree_unflatten
from .errors import ArgumentError, RewriteError
from .meta import as_dynamo_value, is_dynamo_value, rule_of, tensor_value
from .report import Report, RuleStats
from .rule import Rule, RuleSet, RulesLike, as_ruleset

__all__ = ["STAGES", "RuleBackend", "RulePass", "backend", "compile_options", "fingerprint", "inductor_pass",
           "stage_graphs"]

logger = logging.getLogger(__name__)

#: Where a pass can be installed: stage name -> ``torch._inductor.config`` option.
STAGES: Mapping[str, str] = types.MappingProxyType({
    "pre_grad": "pre_grad_custom_pass",
    "joint": "joint_custom_pre_pass",
    "joint_post": "joint_custom_post_pass",
    "post_grad": "post_grad_custom_pre_pass",
    "post_grad_post": "post_grad_custom_post_pass",
})
_ATEN_STAGES = frozenset({"joint", "joint_post", "post_grad", "post_grad_post"})


# ---- the cumulative report --------------------------------------------------------------------


class _Tally:
    """A :class:`Report` summed over several rewrites (one per graph a pass is handed)."""

    def __init__(self, ruleset: RuleSet) -> None:
        self.report = Report({r.name: RuleStats() for r in ruleset}, 0, 0.0)
        self.graphs = 0

    def add(self, report: Report) -> None:
        self.report = self.report + report
        self.graphs += 1


class _Cumulative:
    """``report`` and ``graphs`` of a pass or backend that tallies the graphs it rewrote."""

    _tally: _Tally

    @property
    def report(self) -> Report:
        """What it did, summed over every graph it was handed."""
        return self._tally.report

    @property
    def graphs(self) -> int:
        """How many graphs it has rewritten."""
        return self._tally.graphs


# ---- the Inductor pass ------------------------------------------------------------------------


class RulePass(_Cumulative, CustomGraphPass):
    """A rule set as an Inductor custom graph pass; build it with :func:`inductor_pass`.

    ``pass_(graph)`` rewrites ``graph`` in place. At the ATen stages (``joint``, ``post_grad``)
    the nodes a replacement created are then traced through Inductor's decomposition table,
    as Inductor's own pattern replacements are, so the graph stays in the IR Inductor lowers.
    """

    def __init__(self, rules: RuleSet, stage: str, max_rewrites: int | None) -> None:
        self.rules = rules
        self.stage = stage
        self.max_rewrites = max_rewrites
        self._tally = _Tally(rules)
        self._uuid: str | None = None
        self._seconds = 0.0

    @property
    def config_name(self) -> str:
        """The ``torch._inductor.config`` option this pass belongs in."""
        return STAGES[self.stage]

    @property
    def options(self) -> dict[str, Any]:
        """``torch.compile(model, options=pass_.options)`` installs this pass."""
        return {self.config_name: self}

    @property
    def seconds(self) -> float:
        """Wall time spent in the pass over all graphs: the rewrite (``report.seconds``) and the
        preparation and lowering around it."""
        return self._seconds

    def __call__(self, graph: fx.Graph) -> None:
        started = time.perf_counter()
        try:
            self._run(graph)
        finally:
            self._seconds += time.perf_counter() - started

    def _run(self, graph: fx.Graph) -> None:
        from .rewrite import rewrite_graph

        before = set(graph.nodes) if self.stage in _ATEN_STAGES else None
        with _dynamo_values(graph):
            report = rewrite_graph(graph, self.rules, max_rewrites=self.max_rewrites)
        if before is not None and report.rewrites:
            _lower_created(graph, [n for n in graph.nodes if n not in before])
        self._tally.add(report)
        logger.debug("fxrewrite pass at %s: %d rewrite(s) in %.2f ms", self.stage, report.rewrites,
                     report.seconds * 1e3)

    def __deepcopy__(self, memo: dict[int, Any]) -> RulePass:
        """The pass itself: AOTInductor deep-copies its config (``compile_fx_aot``), and the copy
        must add to this pass's report."""
        return self

    def uuid(self) -> str:
        """A stable content hash of everything that decides what this pass does (see
        :func:`fingerprint`); computed once, when first asked."""
        if self._uuid is None:
            self._uuid = fingerprint(self.rules, extra=(self.stage, self.max_rewrites))
        return self._uuid

    def __repr__(self) -> str:
        return f"<fxrewrite pass {self.stage} rules={list(self.rules.names)}>"


def inductor_pass(rules: RulesLike | str | os.PathLike[str], *, stage: str = "post_grad",
                  max_rewrites: int | None = None) -> RulePass:
    """The rule set as a ``CustomGraphPass`` for Inductor's ``stage`` (see :data:`STAGES`).
    ``rules`` is a rule, a rule set, or the path of a rules file or directory.

    Install it with ``torch.compile(model, options=pass_.options)`` or
    ``torch._inductor.config.patch(pass_.options)``; two passes at one stage go in a list
    (:func:`compile_options` builds it). ``pass_.report`` sums up every graph it rewrote.
    """
    if stage not in STAGES:
        raise ArgumentError(
            f"inductor_pass(stage={stage!r}): unknown stage; use one of {', '.join(map(repr, STAGES))} "
            f"('post_grad' is the ATen graph Inductor lowers, 'pre_grad' Dynamo's torch-level graph)."
        )
    return RulePass(_ruleset(rules), stage, max_rewrites)


def _ruleset(rules: RulesLike | str | os.PathLike[str]) -> RuleSet:
    """Rules, or the path of a rules file or directory to load them from."""
    if isinstance(rules, (str, os.PathLike)):
        from .loader import load_rules

        return load_rules(Path(rules))
    return as_ruleset(rules)


def compile_options(*passes: CustomGraphPass | Callable[[fx.Graph], None], stage: str | None = None) -> dict[str, Any]:
    """Inductor options installing several passes side by side: fxrewrite passes go to their
    stage, other passes (someone else's ``CustomGraphPass``) to ``stage``. Passes of one stage
    run in the order given.

    >>> import torch, fxrewrite
    >>> r = fxrewrite.Rule.from_functions(lambda x: torch.neg(torch.neg(x)), lambda x: x, name="neg_neg")
    >>> a, b = fxrewrite.inductor_pass(r), fxrewrite.inductor_pass(r, stage="pre_grad")
    >>> {name: len(p) for name, p in compile_options(a, b).items()}
    {'post_grad_custom_pre_pass': 1, 'pre_grad_custom_pass': 1}
    """
    options: dict[str, list[Any]] = {}
    for p in passes:
        where = p.stage if isinstance(p, RulePass) else stage
        if where is None or where not in STAGES:
            raise ArgumentError(
                f"compile_options: {p!r} is not an fxrewrite pass; say at which stage it runs with stage= "
                f"(one of {', '.join(map(repr, STAGES))})."
            )
        options.setdefault(STAGES[where], []).append(p)
    return options


@contextlib.contextmanager
def _dynamo_values(graph: fx.Graph) -> Iterator[None]:
    """Dynamo's graphs (what a backend and the ``pre_grad`` stage see) carry their fake tensors in
    ``meta["example_value"]``, which guards and replacements read like any value (every reader
    asks :mod:`fxrewrite.meta`); the nodes the rules create get theirs as ``meta["val"]`` and are
    given Dynamo's convention back here."""
    if not any(is_dynamo_value(n) for n in graph.nodes):
        yield
        return
    before = set(graph.nodes)
    try:
        yield
    finally:
        for n in graph.nodes:
            if n not in before:
                as_dynamo_value(n)


def _lower_created(graph: fx.Graph, created: list[Node]) -> None:
    """Trace each created call through Inductor's decompositions (``fwd_only``, as Inductor's own
    replacements are) and splice the decomposed calls in its place. A call Inductor lowers as it
    is stays; an op Inductor decomposes (``aten.silu``) comes back decomposed."""
    from torch._inductor.decomposition import select_decomp_table

    table = select_decomp_table()
    for node in created:
        if node.op == "call_function" and not is_erased(node) and _needs_lowering(node, table):
            _decompose(graph, node)


def _needs_lowering(node: Node, table: Mapping[Any, Any]) -> bool:
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        composite = target.has_kernel_for_dispatch_key(torch._C.DispatchKey.CompositeImplicitAutograd)
        return target in table or composite
    return getattr(target, "__module__", None) not in ("_operator", "operator", "math", "builtins")


def _decompose(graph: fx.Graph, node: Node) -> None:
    from torch._inductor.pattern_matcher import fwd_only

    target = node.target
    assert callable(target), node.format_node()  # a call_function node
    leaves, spec = tree_flatten((node.args, node.kwargs))
    inputs = [leaf for leaf in leaves if isinstance(leaf, Node)]
    values = [tensor_value(i) for i in inputs]
    if any(not isinstance(v, torch.Tensor) for v in values):
        return  # a Python value or no metadata: leave the call to Inductor as it is

    def call(*tensors: Any) -> Any:
        it = iter(tensors)
        filled = [next(it) if isinstance(a, Node) else a for a in leaves]
        args, kwargs = tree_unflatten(filled, spec)
        return target(*args, **kwargs)

    try:
        with detect_fake_mode(values) or contextlib.nullcontext():
            traced = fwd_only(call, values)
    except Exception as exc:
        rule = rule_of(node) or "a rule"
        raise RewriteError(
            f"rule '{rule}' created '{node.format_node()}', which could not be traced through Inductor's "
            f"decompositions ({type(exc).__name__}: {exc}). Install the rule at stage='pre_grad', or write the "
            f"replacement with ops Inductor supports."
        ) from exc
    calls = [n for n in traced.graph.nodes if n.op == "call_function"]
    if len(calls) == 1 and calls[0].target is node.target:
        return
    _inline(graph, node, traced.graph, inputs)


def _inline(graph: fx.Graph, node: Node, sub: fx.Graph, inputs: Sequence[Node]) -> None:
    env: dict[Node, Any] = dict(zip([n for n in sub.nodes if n.op == "placeholder"], inputs))
    result: Any = None
    with graph.inserting_before(node):
        for n in sub.nodes:
            if n.op == "placeholder":
                continue
            if n.op == "output":
                result = fx.node.map_arg(n.args[0], env.__getitem__)
                continue
            env[n] = copied = graph.node_copy(n, env.__getitem__)
            for key in ("stack_trace", "fxrewrite_rule"):
                if key in node.meta:
                    copied.meta[key] = node.meta[key]
    if isinstance(result, Node):
        node.replace_all_uses_with(result)
    else:
        for user in list(node.users):
            user.replace_all_uses_with(result[user.args[1]])  # getitem(node, i) users of a tuple result
            graph.erase_node(user)
    graph.erase_node(node)


# ---- the graphs a stage is handed --------------------------------------------------------------


class _Captured(Exception):
    """Raised by the capturing pass once it has copied its graph: the rest of the compile (and its
    C++ code generation) is not needed to look at a stage's graph."""


class _CapturingPass(CustomGraphPass):
    """Copies every graph it is handed, then stops that compile."""

    def __init__(self) -> None:
        self.graphs: list[fx.GraphModule] = []

    def __call__(self, graph: fx.Graph) -> None:
        self.graphs.append(_copied(graph))
        raise _Captured

    def uuid(self) -> None:  # no uuid: Inductor bypasses its FX graph cache, so the pass always runs
        return None


def _copied(graph: fx.Graph) -> fx.GraphModule:
    """A GraphModule over a copy of ``graph`` (node metadata shared: fake values stay readable),
    its attributes taken from the module owning ``graph``."""
    new = fx.Graph()
    env: dict[Node, Node] = {}
    new.output(new.graph_copy(graph, env))
    owner = graph.owning_module if graph.owning_module is not None else torch.nn.Module()
    return fx.GraphModule(owner, new)


def stage_graphs(model: Callable[..., Any], example_inputs: Sequence[Any], *, stage: str = "pre_grad") -> list[
        fx.GraphModule]:
    """The graphs ``torch.compile(model)`` hands a custom pass at Inductor's ``stage`` (see
    :data:`STAGES`; ``"dynamo"``: the graph a backend receives), captured while compiling
    ``model(*example_inputs)``, one per graph (a graph break makes several). Hand one to
    :func:`fxrewrite.explain` to see why a rule does or does not fire where a pass would run it.

    Each graph's compile stops once the graph is copied (nothing is code-generated) and the graph
    runs eagerly; nothing is left installed. Dynamo's caches are reset before and after, so the
    graphs are always captured afresh. Pre-grad and ``dynamo`` graphs keep Dynamo's fake values
    (``meta["example_value"]``), ATen-stage graphs theirs (``meta["val"]``), so guards can read
    shapes and dtypes.

    >>> import torch, fxrewrite
    >>> (gm,) = stage_graphs(lambda x: x * torch.sigmoid(x), (torch.randn(4),), stage="pre_grad")
    >>> [n.target for n in gm.graph.nodes if n.op == "call_function"]
    [<built-in method sigmoid of type object at ...>, <built-in function mul>]
    """
    if stage != "dynamo" and stage not in STAGES:
        raise ArgumentError(f"stage_graphs(stage={stage!r}): unknown stage; use 'dynamo' or one of "
                            f"{', '.join(map(repr, STAGES))}.")
    capture = _CapturingPass()
    torch._dynamo.reset()
    try:
        # Inductor warns that a pass without a uuid bypasses its cache: that is what is wanted here
        with quieted("torch._inductor.codecache", logging.ERROR):
            torch.compile(model, backend=_capturing_backend(capture, stage))(*example_inputs)
    finally:
        torch._dynamo.reset()
    return capture.graphs


def _capturing_backend(capture: _CapturingPass, stage: str) -> Callable[..., Any]:
    """A backend that compiles each graph with Inductor, the capturing pass installed at
    ``stage``, until the pass has its copy; then runs that graph eagerly, so that Dynamo goes on
    to the next graph (after a graph break) as usual."""
    def compiler(gm: fx.GraphModule, inputs: Sequence[Any]) -> Any:
        if stage == "dynamo":
            capture.graphs.append(_copied(gm.graph))
            return gm.forward
        from torch._inductor.compile_fx import compile_fx

        before = len(capture.graphs)
        try:
            with torch._inductor.config.patch({STAGES[stage]: capture, "fx_graph_cache": False}):
                return compile_fx(gm, inputs)
        except Exception:
            if len(capture.graphs) > before:  # stopped by the pass, its graph copied
                return gm.forward
            raise

    return compiler




# ---- the backend ------------------------------------------------------------------------------


class RuleBackend(_Cumulative):
    """A ``torch.compile`` backend: rewrite Dynamo's graph with the rules, then hand it on.
    Build it with :func:`backend`."""

    def __init__(self, rules: RuleSet, then: Callable[..., Any], name: str, max_rewrites: int | None) -> None:
        self.rules = rules
        self.then = then
        self.then_name = name
        self.max_rewrites = max_rewrites
        self._tally = _Tally(rules)

    def __call__(self, gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
        from .rewrite import rewrite_graph

        with _dynamo_values(gm.graph):
            self._tally.add(rewrite_graph(gm.graph, self.rules, max_rewrites=self.max_rewrites))
        return self.then(gm, example_inputs)

    def __repr__(self) -> str:
        return f"<fxrewrite backend rules={list(self.rules.names)} then={self.then_name}>"


def backend(rules: RulesLike | str | os.PathLike[str], *, then: str | Callable[..., Any] = "inductor",
            max_rewrites: int | None = None) -> RuleBackend:
    """A ``torch.compile`` backend that rewrites each graph Dynamo captures with ``rules`` and
    then hands it to ``then``: ``"inductor"``, ``"eager"``, another registered backend name, or
    a backend callable ``(gm, example_inputs) -> callable``. ``rules`` is a rule, a rule set, or
    the path of a rules file or directory.

    ``torch.compile(model, backend=fxrewrite.backend(rules))``; ``.report`` sums up every graph.
    """
    if isinstance(then, str):
        from torch._dynamo import lookup_backend

        try:
            compiler = lookup_backend(then)
        except Exception as exc:
            raise ArgumentError(
                f"backend(then={then!r}): torch.compile knows no backend of that name "
                f"({type(exc).__name__}); use 'inductor', 'eager', one of torch._dynamo.list_backends(), or "
                f"pass a backend function."
            ) from exc
        return RuleBackend(_ruleset(rules), compiler, then, max_rewrites)
    if not callable(then):
        raise ArgumentError(
            f"backend(then={then!r}): expected a backend name or a callable (gm, example_inputs) -> callable, "
            f"got a {type(then).__name__}."
        )
    return RuleBackend(_ruleset(rules), then, getattr(then, "__name__", repr(then)), max_rewrites)


# ---- the content hash -------------------------------------------------------------------------


def fingerprint(rules: RulesLike, *, extra: Any = ()) -> str:
    """A hex SHA-256 of everything that decides what ``rules`` do to a graph.

    Per rule, in order: name, priority, doc, tolerance, domain, and the pattern, replacement and
    guard functions: their source text (``inspect.getsource``, when there is one) and bytecode
    with its constants (all there is for DSL rules, whose closures then carry the rule text), their defaults,
    the values of their closure cells and of the globals they read, recursively. Then the
    fxrewrite version and the content of its own source files, and the torch version.
    Objects are hashed by value, never by ``id`` or address, so the hash is the same in another
    process; file paths and line numbers do not enter it.

    >>> import torch
    >>> r = Rule.from_functions(lambda x: torch.neg(torch.neg(x)), lambda x: x, name="neg_neg")
    >>> fingerprint(r) == fingerprint([r]) and fingerprint(r) != fingerprint(r, extra="post_grad")
    True
    """
    from ._version import __version__

    ruleset = as_ruleset(rules)
    h = _Hasher(_rule_files(ruleset))
    parts = [b"fxrewrite", __version__.encode(), _package_digest(), torch.__version__.encode(), h.of(extra)]
    parts.extend(h.of(r) for r in ruleset)
    return hashlib.sha256(b"".join(_framed(p) for p in parts)).hexdigest()


@functools.lru_cache(maxsize=1)
def _package_digest() -> bytes:
    """The engine's own code: its fixes change what a rule set does without a version bump."""
    root = Path(__file__).resolve().parent
    h = hashlib.sha256()
    for path in sorted([*root.rglob("*.py"), *root.rglob("*.lark")]):
        if "__pycache__" not in path.parts:
            h.update(path.relative_to(root).as_posix().encode())
            h.update(path.read_bytes())
    return h.digest()


def _rule_files(rules: RuleSet) -> dict[str, str]:
    """Each rule file's path, as its rules spell it and resolved, -> the file's name: where the
    rules live is no part of what they do (a CI clone, a shared cache, a copied folder)."""
    files: dict[str, str] = {}
    for r in rules:
        file = r.origin.rpartition(":")[0]
        if file:
            files[file] = files[str(Path(file).resolve())] = Path(file).name
    return dict(sorted(files.items(), key=lambda item: -len(item[0])))  # the longest first


#: A module the loader imported by path is named after the file plus a hash of its absolute path
#: (:func:`fxrewrite.loader.import_file`); the hash says where the file is, so it is dropped.
_PLACED_MODULE = re.compile(r"\b(fxrewrite_(?:rules|ops|target)_\w+?)_[0-9a-f]{12}\b")


def _placeless(text: str) -> str:
    """``text`` without the path hash of modules the loader imported."""
    return _PLACED_MODULE.sub(r"\1", text)


def _framed(part: bytes) -> bytes:
    return len(part).to_bytes(8, "little") + part


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
_OPAQUE_MODULES = ("logging", "threading", "_thread", "asyncio", "concurrent", "multiprocessing", "socket", "io",
                   "_io", "weakref", "torch._", "torch.fx", "torch.utils", "torch.distributed", "torch.cuda")
_MAX_DEPTH = 24


class _Hasher:
    """Digests of Python values by content. Shared sub-objects are hashed once; a cycle or a
    structure deeper than ``_MAX_DEPTH`` contributes a marker instead of recursing forever."""

    def __init__(self, files: Mapping[str, str] | None = None) -> None:
        self._files = files or {}
        self._memo: dict[int, bytes] = {}
        self._active: set[int] = set()
        self._alive: list[Any] = []  # keeps hashed objects alive, so their ids are not reused

    def of(self, obj: Any, depth: int = 0) -> bytes:
        if isinstance(obj, str):
            return _digest(b"str", repr(self._unplaced(obj)).encode())
        if isinstance(obj, (type(None), bool, int, float, complex, bytes)):
            return _digest(type(obj).__name__.encode(), repr(obj).encode())
        key = id(obj)
        if key in self._memo:
            return self._memo[key]
        if key in self._active or depth > _MAX_DEPTH:
            return _digest(b"<cycle>", _type_name(type(obj)).encode())
        self._active.add(key)
        try:
            digest = _digest(_type_name(type(obj)).encode(), *self._parts(obj, depth + 1))
        finally:
            self._active.discard(key)
        self._memo[key] = digest
        self._alive.append(obj)
        return digest

    def _unplaced(self, text: str) -> str:
        """``text`` with the rule files' paths replaced by their names (a DSL rule's closures
        carry its file's path) and loaded modules' path hashes dropped."""
        for path, name in self._files.items():
            if path in text:
                text = text.replace(path, name)
        return _placeless(text)

    def _all(self, items: Iterable[Any], depth: int) -> list[bytes]:
        return [self.of(i, depth) for i in items]

    def _parts(self, obj: Any, depth: int) -> list[bytes]:  # one branch per kind of value
        if isinstance(obj, Rule):
            return self._rule(obj, depth)
        if isinstance(obj, RuleSet):
            return self._all(obj, depth)
        if isinstance(obj, (torch.dtype, torch.device, torch.layout, torch.memory_format, enum.Enum)):
            return [repr(obj).encode()]
        if isinstance(obj, torch.Tensor):
            return _tensor_parts(obj)
        if type(obj).__module__ == "numpy" and hasattr(obj, "tobytes") and hasattr(obj, "dtype"):
            return [repr((str(obj.dtype), getattr(obj, "shape", ()))).encode(), hashlib.sha256(obj.tobytes()).digest()]
        if isinstance(obj, (tuple, list)):
            return self._all(obj, depth)
        if isinstance(obj, (set, frozenset)):
            return sorted(self._all(obj, depth))
        if isinstance(obj, Mapping):
            return [d for k, v in obj.items() for d in (self.of(k, depth), self.of(v, depth))]
        if isinstance(obj, types.ModuleType):
            return [_placeless(obj.__name__).encode()]
        if isinstance(obj, types.FunctionType):
            return self._function(obj, depth)
        if isinstance(obj, types.MethodType):
            return [self.of(obj.__self__, depth), self.of(obj.__func__, depth)]
        if isinstance(obj, types.CodeType):
            return [self._code(obj, depth)]
        if isinstance(obj, functools.partial):
            return [self.of(obj.func, depth), self.of(obj.args, depth), self.of(obj.keywords, depth)]
        if isinstance(obj, type):
            return [_type_name(obj).encode(), _class_source(obj)]
        if isinstance(obj, (fx.Graph, fx.Node)):
            return [str(obj).encode()]
        if isinstance(obj, torch.nn.Module):
            return [obj.extra_repr().encode(), self.of(obj.training, depth), self.of(obj.state_dict(), depth)]
        if _is_named_callable(obj) or _opaque(type(obj)):
            return [_stable_repr(obj).encode()]
        return self._object(obj, depth)

    def _rule(self, r: Rule, depth: int) -> list[bytes]:
        values = (r.name, r.priority, r.doc, r.tolerance, r.domain, r.pattern, r.replacement, r.where)
        return self._all(values, depth)

    def _function(self, fn: types.FunctionType, depth: int) -> list[bytes]:
        name = _placeless(f"{fn.__module__}.{fn.__qualname__}")
        parts = [name.encode(), _source(fn) or b"", self._code(fn.__code__, depth),
                 self.of(fn.__defaults__, depth), self.of(fn.__kwdefaults__, depth)]
        for cell in fn.__closure__ or ():
            try:
                parts.append(self.of(cell.cell_contents, depth))
            except ValueError:  # an empty cell
                parts.append(b"<empty cell>")
        for name in sorted(_global_names(fn.__code__)):
            if name in fn.__globals__:
                parts.extend((name.encode(), self.of(fn.__globals__[name], depth)))
        wrapped = getattr(fn, "__wrapped__", None)
        if wrapped is not None:
            parts.append(self.of(wrapped, depth))
        return parts

    def _code(self, code: types.CodeType, depth: int) -> bytes:
        consts = [self._code(c, depth) if isinstance(c, types.CodeType) else self.of(c, depth) for c in code.co_consts]
        return _digest(code.co_code, *consts, *(n.encode() for n in (*code.co_names, *code.co_varnames,
                                                                      *code.co_freevars, *code.co_cellvars)),
                       repr((code.co_argcount, code.co_kwonlyargcount, code.co_flags)).encode())

    def _object(self, obj: Any, depth: int) -> list[bytes]:
        if attrs.has(type(obj)):
            fields = [(f.name, getattr(obj, f.name)) for f in attrs.fields(type(obj))]
        elif dataclasses.is_dataclass(obj):
            fields = [(f.name, getattr(obj, f.name)) for f in dataclasses.fields(obj)]
        elif hasattr(obj, "__dict__"):
            fields = list(vars(obj).items())
        elif hasattr(type(obj), "__slots__"):
            fields = [(s, getattr(obj, s, None)) for s in _slots(type(obj))]
        else:
            return [_stable_repr(obj).encode()]
        return [d for name, value in fields for d in (name.encode(), self.of(value, depth))]


def _digest(*parts: bytes) -> bytes:
    return hashlib.sha256(b"".join(_framed(p) for p in parts)).digest()


def _type_name(cls: type) -> str:
    return _placeless(f"{cls.__module__}.{cls.__qualname__}")


def _tensor_parts(t: torch.Tensor) -> list[bytes]:
    head = repr((t.dtype, tuple(t.shape), t.device.type, t.layout)).encode()
    if t.is_meta or isinstance(t, FakeTensor) or t.layout != torch.strided:
        return [head]
    data = t.detach().cpu().contiguous().reshape(-1).view(torch.uint8) if t.numel() else torch.empty(0)
    return [head, hashlib.sha256(data.numpy().tobytes() if data.numel() else b"").digest()]


def _source(fn: types.FunctionType) -> bytes | None:
    try:
        return inspect.getsource(fn).encode()
    except (OSError, TypeError):
        return None


def _class_source(cls: type) -> bytes:
    if cls.__module__ in ("builtins",) or cls.__module__.startswith(("torch", "fxrewrite", "typing", "collections")):
        return b""
    try:
        return inspect.getsource(cls).encode()
    except (OSError, TypeError):
        return b""


def _global_names(code: types.CodeType) -> Iterator[str]:
    yield from code.co_names
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _global_names(const)


def _is_named_callable(obj: Any) -> bool:
    """Builtins, C functions, OpOverloads: identified by their qualified name."""
    kinds = (types.BuiltinFunctionType, types.BuiltinMethodType, types.WrapperDescriptorType,
             types.MethodDescriptorType, types.MethodWrapperType, types.ClassMethodDescriptorType,
             torch._ops.OpOverload, torch._ops.OpOverloadPacket, torch._ops.HigherOrderOperator)
    return isinstance(obj, kinds) or obj is operator


def _opaque(cls: type) -> bool:
    return cls.__module__.startswith(_OPAQUE_MODULES)


def _stable_repr(obj: Any) -> str:
    if isinstance(obj, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return str(obj)
    name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None)
    module = getattr(obj, "__module__", None)
    if isinstance(name, str):
        return _placeless(f"{module}.{name}")
    return _ADDRESS.sub("", f"{_type_name(type(obj))}:{obj!r}")


def _slots(cls: type) -> list[str]:
    names: list[str] = []
    for klass in cls.__mro__:
        slots = getattr(klass, "__slots__", ())
        names.extend([slots] if isinstance(slots, str) else slots)
    return [n for n in names if n not in ("__dict__", "__weakref__")]
