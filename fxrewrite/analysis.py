"""Rule sets as objects to analyse, before they run: :func:`analyze` finds rules that loop, rules
that undo each other and rules that can never fire.

Each rule is tried on its own pattern: the pattern graph (literal captures replaced by
representative constants, shapes and dtypes propagated from probe inputs the guards accept) is
rewritten by the rule itself with the real splicing machinery, and the matcher is run on the
result. A rule whose pattern matches its own replacement (*self-loop*) fires again and again;
two or more rules whose rewrites lead back to a graph already seen (*cycle*) undo each other.
A rule whose pattern graph is always rewritten first by a rule the driver serves before it
(*shadowed*) never fires.

>>> import torch
>>> import torch.nn.functional as F
>>> from fxrewrite import Rule
>>> to_mul = Rule.from_functions(lambda x: x + x, lambda x: x * 2, name="add_self", origin="a.py:1")
>>> to_add = Rule.from_functions(lambda x: x * 2, lambda x: x + x, name="mul_two", origin="a.py:2")
>>> relu = Rule.from_functions(lambda x: F.relu(x, inplace=False), lambda x: torch.relu(x),
...                            name="relu_spelling", origin="a.py:3")
>>> for finding in analyze([to_mul, to_add, relu]):
...     print(finding.severity, finding.kind, finding.rules)
error cycle ('add_self', 'mul_two')
warning self-loop ('relu_spelling',)

Findings carry a ``message`` naming each rule's ``file:line`` and what to do. Guards are run on
the rewritten graphs (they see shapes and dtypes) when a probe input satisfies them; when they
cannot be decided, a loop is reported as a ``warning`` ("may loop") instead of an ``error``.
"""

from __future__ import annotations

import functools
import itertools
import logging
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal

import attrs
import torch
import torch.fx as fx
from torch import nn
from torch.fx.node import Node, map_aggregate

from ._logs import quieted
from .canon import attribute_at, canonical_arguments, is_commutative_call, op_key_of
from .domain import DependentFactory, Domain, build_order
from .errors import FxRewriteError
from .match import Match, match_at
from .meta import forget_value, propagate_inputs, record_values
from .pattern import Param
from .replace import Splicer
from .rule import Rule, RuleSet, RulesLike, as_ruleset

__all__ = ["Finding", "Severity", "analyze", "canonical_form", "order_dependence", "replacement_raises"]

logger = logging.getLogger(__name__)

Severity = Literal["error", "warning", "note"]
_SEVERITY_ORDER = {"error": 0, "warning": 1, "note": 2}

#: How many rewrites a path of the cycle search may take (a cycle of up to this many rules).
MAX_CYCLE_LENGTH = 3
#: Graphs visited per starting rule by the cycle search.
MAX_STATES = 40
#: Times a self-matching rule is applied to its own output before it is called a loop.
SELF_LOOP_STEPS = 4


@attrs.frozen
class Finding:
    """One problem :func:`analyze` found in a rule set.

    ``kind`` is ``"self-loop"``, ``"cycle"``, ``"shadowed"`` or ``"not-analysed"`` (from
    :func:`analyze`), or ``"order-dependent"`` (from :func:`order_dependence`); ``rules`` the
    names of the rules involved; ``severity`` is ``"error"`` when the rule set makes a rewrite
    fail (it never reaches a fixed point) or its result depend on the order of the rules,
    ``"warning"`` for a rule that is useless or may loop, ``"note"`` for a rule the analysis
    could not examine.
    """

    kind: str
    rules: tuple[str, ...]
    message: str
    severity: Severity

    def __str__(self) -> str:
        return f"{self.severity}: {self.kind}: {self.message}"


# -- canonical form ------------------------------------------------------------------------------


def canonical_form(graph: fx.Graph, owner: nn.Module | None = None) -> str:
    """The computation ``graph`` returns, as one string that is equal for graphs computing the
    same expression: ops by canonical key, arguments lined up by schema, commutative operands
    sorted, dead nodes left out.

    >>> import operator, torch, torch.nn.functional as F
    >>> a = fx.symbolic_trace(lambda x, y: F.relu(x + y, inplace=False)).graph
    >>> b = fx.symbolic_trace(lambda x, y: torch.relu(torch.add(y, x))).graph
    >>> canonical_form(a) == canonical_form(b)
    True
    """
    terms: dict[Node, str] = {}
    for node in graph.nodes:
        if node.op == "output":
            return _show(node.args[0], terms)
        terms[node] = _term(node, terms, owner)
    return ""


def _term(node: Node, terms: Mapping[Node, str], owner: nn.Module | None) -> str:
    if node.op == "placeholder":
        return f"%{node.target}"
    if node.op == "get_attr":
        return f"get_attr({node.target})"
    if node.op == "call_module":
        module = owner.get_submodule(str(node.target)) if owner is not None else None
        kind = type(module).__name__ if module is not None else "module"
        return f"{kind}@{node.target}({_show((node.args, node.kwargs), terms)})"
    key = op_key_of(node.op, node.target)
    named = canonical_arguments(node.op, node.target, node.args, node.kwargs)
    if named is None:
        shown = [_show(a, terms) for a in node.args] + [f"{k}={_show(v, terms)}" for k, v in node.kwargs.items()]
    else:
        shown = [f"{k}={_show(v, terms)}" for k, v in named.items()]
    if is_commutative_call(node.op, node.target, node.args, node.kwargs) and len(shown) >= 2:
        shown[:2] = sorted(s.partition("=")[2] if named is not None else s for s in shown[:2])
    return f"{key}({', '.join(shown)})"


def _show(value: Any, terms: Mapping[Node, str]) -> str:
    def one(v: Any) -> Any:
        return terms[v] if isinstance(v, Node) else v

    return repr(map_aggregate(value, one)).replace("'", "")


# -- readable expressions (for messages) ---------------------------------------------------------


def _expression(graph: fx.Graph) -> str:
    """What ``graph`` returns, as a short Python-like expression."""
    shown: dict[Node, str] = {}
    for node in graph.nodes:
        if node.op == "output":
            return _plain(node.args[0], shown)
        shown[node] = _readable(node, shown)
    return ""


def _readable(node: Node, shown: Mapping[Node, str]) -> str:
    if node.op in ("placeholder", "get_attr"):
        return str(node.target)
    args = [_plain(a, shown) for a in node.args] + [f"{k}={_plain(v, shown)}" for k, v in node.kwargs.items()]
    if node.op == "call_method":
        return f"{args[0]}.{node.target}({', '.join(args[1:])})"
    if node.op == "call_module":
        return f"{node.target}({', '.join(args)})"
    target = node.target
    module = getattr(target, "__module__", "") or ""
    name = getattr(target, "__name__", str(target))
    prefix = {"_operator": "operator.", "torch": "torch.", "torch.nn.functional": "F."}.get(module, "")
    return f"{prefix}{name}({', '.join(args)})"


def _plain(value: Any, shown: Mapping[Node, str]) -> str:
    if isinstance(value, Node):
        return shown[value]
    if isinstance(value, (tuple, list)):
        inner = ", ".join(_plain(v, shown) for v in value)
        return f"({inner})" if isinstance(value, tuple) else f"[{inner}]"
    return repr(value)


# -- probing: a start graph per rule -------------------------------------------------------------

_PROBE_DTYPES = (torch.float32, torch.int64, torch.bool, torch.float64)
_PROBE_RANKS = (2, 3, 4, 1, 0)
_PROBE_LITERALS: Mapping[Any, tuple[Any, ...]] = {
    int: (2, 1, 0, -1), float: (0.5, 2.0, 1.0, 0.0), bool: (False, True),
    str: ("none", "mean", "sum", "tanh"), torch.dtype: (torch.float32, torch.float64, torch.int64, torch.bool),
}


@attrs.frozen(eq=False)
class _Start:
    """A rule's own pattern as a graph to rewrite: ``gm`` computes the pattern on placeholders
    named after its variables, ``match`` is the rule's match of it; ``typed`` says whether the
    graph carries shapes and dtypes (so guards can be decided)."""

    rule: Rule
    gm: fx.GraphModule
    match: Match
    typed: bool


def _start_graph(rule: Rule, literals: Mapping[str, Any],
                 modules: Mapping[str, nn.Module]) -> tuple[fx.GraphModule, Node]:
    """The pattern graph with literal captures replaced by ``literals`` and module captures
    registered as submodules named after their parameters; and the copy of its anchor."""
    pattern = rule.compiled
    graph = fx.Graph()
    env: dict[Node, Any] = {}
    for param in pattern.params:
        if param.kind != "tensor":
            env[pattern.placeholders[param.name]] = literals.get(param.name)
    graph.output(graph.graph_copy(pattern.graph, env))
    root = nn.Module()
    for name, module in modules.items():
        root.add_module(name, module)
    return fx.GraphModule(root, graph), env[pattern.anchor]


def _domain(rule: Rule) -> Domain:
    """The rule's declared domain, or the default one (the checker's defaults: one authority)."""
    return rule.domain if rule.domain is not None else _DEFAULT_DOMAIN


_DEFAULT_DOMAIN = Domain()


def _literal_choices(rule: Rule) -> list[dict[str, Any]]:
    """A few assignments of the literal captures: the i-th declared value of each (declared
    values often go together), the probe values otherwise (the j-th capture starting j values
    later, so that two captures of one type differ)."""
    declared = _domain(rule).literals
    choices: dict[str, tuple[Any, ...]] = {}
    shift: dict[str, int] = {}
    for param in rule.compiled.params:
        if param.kind != "literal":
            continue
        values = declared.get(param.name)
        if isinstance(values, (list, tuple)) and values:
            choices[param.name], shift[param.name] = tuple(values), 0
        elif values is not None and isinstance(values, param.annotation):
            choices[param.name], shift[param.name] = (values,), 0
        else:
            choices[param.name], shift[param.name] = _PROBE_LITERALS[param.annotation], len(shift)
    count = max((len(c) for c in choices.values()), default=1)
    return [{name: c[(i + shift[name]) % len(c)] for name, c in choices.items()} for i in range(min(count, 4))]


def _modules_for(rule: Rule, width: int) -> dict[str, nn.Module] | None:
    """Representative modules for the module captures (from ``domain['modules']`` factories or
    the checker's defaults); ``None`` when one cannot be built."""
    captures = rule.compiled.module_captures
    if not captures:
        return {}
    from .testing._nn_modules import default_module  # imported lazily: builds torch.nn modules for captures

    declared = _domain(rule).modules
    by_name = {param.name: param for param in captures}
    out: dict[str, nn.Module] = {}
    for param in (by_name[name] for name in build_order(list(by_name), declared)):
        source = declared.get(param.name)
        try:
            if isinstance(source, DependentFactory):  # fitted to the modules built for the captures it names
                module = source(**out)
            elif callable(source):
                module = source()
            else:
                module = default_module(param.annotation, width=width, kernel=1, bias=True)
        except Exception:
            module = None
        if not isinstance(module, param.annotation):
            return None
        out[param.name] = module
    return {param.name: out[param.name] for param in captures}


def _probe_shape(rule: Rule, param: Param, rank: int, side: int, modules: Mapping[str, nn.Module]) -> tuple[int, ...]:
    own = _domain(rule).tensor_domain(param.name).shape
    if own is not None:
        return own
    shape: tuple[int, ...] = (side,) * rank
    placeholder = rule.compiled.placeholders[param.name]
    consumers = [u for u in placeholder.users if u.op == "call_module" and u.args and u.args[0] is placeholder]
    if consumers and str(consumers[0].target) in modules:
        from .testing._nn_modules import fit_input_shape

        shape = fit_input_shape(modules[str(consumers[0].target)], shape)
    return shape


def _probe_dtypes(rule: Rule) -> tuple[torch.dtype, ...]:
    domain = _domain(rule)
    return domain.dtypes if "dtypes" in domain else _PROBE_DTYPES


def _probe_inputs(rule: Rule, dtype: torch.dtype, ranks: Mapping[str, int],
                  modules: Mapping[str, nn.Module]) -> dict[str, Any]:
    low, high = _domain(rule).sides
    side = min(max(2, low), high)
    out = {}
    for param in rule.compiled.params:
        if param.kind == "tensor":
            rank = ranks[param.name]
            own = _domain(rule).tensor_domain(param.name).dtypes
            own_dtype = own[0] if own else dtype
            out[param.name] = torch.ones(_probe_shape(rule, param, rank, side, modules), dtype=own_dtype)
    return out


def _probe_ranks(rule: Rule) -> list[dict[str, int]]:
    """Ranks of the tensor arguments to probe: all equal first; then, for up to three tensors,
    some of them vectors (a bias, a scale)."""
    low, high = _domain(rule).ranks
    names = [p.name for p in rule.compiled.params if p.kind == "tensor"]
    ranks = [r for r in _PROBE_RANKS if low <= r <= high]
    out = [{name: r for name in names} for r in ranks]
    if 1 < len(names) <= 3:
        for r in ranks:
            for mask in itertools.product((r, 1), repeat=len(names)):
                if len(set(mask)) > 1:
                    out.append(dict(zip(names, mask)))
    return out


def _start_for(rule: Rule) -> _Start | str:
    """The rule's start graph, typed from the first probe input the pattern and its guards
    accept (untyped when none is); a string saying why when the rule cannot be examined."""
    modules = _modules_for(rule, width=2)
    if modules is None:
        return "no representative module could be built for its module capture(s)"
    untyped: _Start | None = None
    for literals in _literal_choices(rule):
        gm, anchor = _start_graph(rule, literals, modules)
        match = _own_match(rule, gm, anchor)
        if match is None:
            continue
        if untyped is None and _verdict(rule, match) is not False:
            untyped = _Start(rule, *_fresh(rule, literals, modules), False)
        for ranks, dtype in itertools.product(_probe_ranks(rule), _probe_dtypes(rule)):
            inputs = _probe_inputs(rule, dtype, ranks, modules)
            # real values first (fast), fake ones (what rewriting keeps up to date) once they fit
            if _ran(gm, inputs) and _verdict(rule, match) is True and _typed(gm, inputs):
                return _Start(rule, gm, match, True)
    if untyped is None:
        return "no probe input satisfies its pattern and guards"
    return untyped


def _fresh(rule: Rule, literals: Mapping[str, Any], modules: Mapping[str, nn.Module]) -> tuple[fx.GraphModule, Match]:
    gm, anchor = _start_graph(rule, literals, modules)
    match = _own_match(rule, gm, anchor)
    assert match is not None  # it matched an identical graph a moment ago
    return gm, match


def _own_match(rule: Rule, gm: fx.GraphModule, anchor: Node) -> Match | None:
    modules = dict(gm.named_modules())
    matches = match_at(rule.compiled, anchor, gm, modules=modules,
                       candidates=lambda key: _nodes_with_key(gm.graph, key))
    return next(iter(matches), None)


def _ran(gm: fx.GraphModule, inputs: Mapping[str, Any]) -> bool:
    """Run ``gm`` on ``inputs``, recording real values on its nodes; False when it raises."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    try:
        with torch.no_grad():
            record_values(gm, *(inputs[str(p.target)] for p in placeholders))
    except Exception:
        for n in gm.graph.nodes:
            forget_value(n)
        return False
    return True


def _typed(gm: fx.GraphModule, inputs: Mapping[str, Any]) -> bool:
    """Annotate ``gm`` with shapes and dtypes from ``inputs``; False when they do not fit."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    try:
        with quieted("torch._subclasses.fake_tensor"):  # it logs every input that does not fit an op
            propagate_inputs(gm, [inputs[str(p.target)] for p in placeholders])
    except FxRewriteError:
        for n in gm.graph.nodes:
            forget_value(n)
        return False
    return True




def _verdict(rule: Rule, match: Match) -> bool | None:
    """Whether the rule's guards accept ``match``: ``None`` when a guard cannot be decided (it
    raises, e.g. for lack of shapes)."""
    for guard in rule.where:
        try:
            if not guard(match):
                return False
        except Exception:
            return None
    return True


# -- rewriting small graphs ----------------------------------------------------------------------


def _nodes_with_key(graph: fx.Graph, key: Any) -> list[Node]:
    """The nodes of a (small) graph whose canonical op key is ``key``, in graph order."""
    return [n for n in graph.nodes if op_key_of(n.op, n.target) == key]


def _copy(gm: fx.GraphModule) -> tuple[fx.GraphModule, dict[Node, Node]]:
    graph = fx.Graph()
    env: dict[Node, Node] = {}
    graph.output(graph.graph_copy(gm.graph, env))
    root = nn.Module()
    for name, module in gm.named_children():
        root.add_module(name, module)
    for name, buffer in gm.named_buffers(recurse=False):
        root.register_buffer(name, buffer)
    for name, param in gm.named_parameters(recurse=False):
        root.register_parameter(name, param)
    return fx.GraphModule(root, graph), env


def _translate(match: Match, env: Mapping[Node, Node]) -> Match:
    def one(v: Any) -> Any:
        return env.get(v, v) if isinstance(v, Node) else v

    return attrs.evolve(
        match, bindings={k: one(v) for k, v in match.bindings.items()}, nodes=tuple(one(n) for n in match.nodes),
        outputs=tuple(one(n) for n in match.outputs), anchor=one(match.anchor),
        node_map={k: one(v) for k, v in match.node_map.items()},
    )


def _apply(gm: fx.GraphModule, rule: Rule, match: Match) -> fx.GraphModule | None:
    """A copy of ``gm`` rewritten by ``rule`` at ``match``; ``None`` when the replacement fails."""
    new, env = _copy(gm)
    try:
        with Splicer(new, dict(new.named_modules())) as splicer:
            splicer.splice(_translate(match, env), rule)
    except FxRewriteError as exc:
        logger.debug("analysis: rule %s could not be applied: %s", rule.name, exc)
        return None
    new.graph.eliminate_dead_code()
    return new


def _matches(gm: fx.GraphModule, rule: Rule) -> Iterator[tuple[Match, bool | None]]:
    """Per anchor node, the first match of ``rule`` in ``gm`` its guards do not refuse, with the
    guards' verdict (``None``: undecided)."""
    modules = dict(gm.named_modules()) if rule.compiled.module_captures else {}
    for node in _nodes_with_key(gm.graph, rule.anchor_key):
        found = _first_match(gm, rule, node, modules)
        if found is not None:
            yield found


# -- the analysis --------------------------------------------------------------------------------


def analyze(rules: RulesLike) -> list[Finding]:
    """Analyse a rule set before running it; returns the findings, errors first.

    * ``self-loop``: the rule's pattern matches its own replacement, so the rule fires on its
      own output again and again (an error), unless the replacement computes exactly what the
      pattern does (``F.relu(x, inplace=False) => torch.relu(x)``: one op; ``x + y => y + x``:
      the matcher knows ``add`` commutes), which the driver applies once per match and stops:
      then the rule is merely useless (a warning).
    * ``cycle`` (error): rewriting one rule's pattern with it and then with other rules leads
      back to a graph already seen (``x * 2 => x + x`` and ``x + x => x * 2``); cycles of up to
      :data:`MAX_CYCLE_LENGTH` rules are searched.
    * ``shadowed`` (warning): a rule the driver serves first (higher priority, or the same
      priority and earlier in the set at the same node) matches wherever this rule does and
      has no guard, so this rule never fires.
    * ``not-analysed`` (note): the rule could not be examined (no probe input satisfies its
      pattern and guards, or its replacement cannot be applied to its own pattern graph).

    A loop that depends on a guard the analysis cannot decide is reported as a warning.
    """
    ruleset = as_ruleset(rules)
    findings: list[Finding] = []
    starts: dict[str, _Start] = {}
    for rule in ruleset:
        start = _start_for(rule)
        if not isinstance(start, str) and _rewritten(start) is None:
            start = "its replacement raises when applied to its own pattern graph"
        if isinstance(start, str):
            findings.append(_not_analysed(rule, start))
        else:
            starts[rule.name] = start
    looping = set()
    for name, start in starts.items():
        finding = _self_loop(start)
        if finding is not None:
            findings.append(finding)
            looping.add(name)
    findings += _cycles(ruleset, starts, looping)
    findings += _shadowed(ruleset, starts)
    return sorted(findings, key=lambda f: (_SEVERITY_ORDER[f.severity], f.kind, f.rules))


def _origin(rule: Rule) -> str:
    return f"'{rule.name}' ({rule.origin})"


def _not_analysed(rule: Rule, why: str) -> Finding:
    return Finding("not-analysed", (rule.name,), f"rule {_origin(rule)} was not analysed: {why}.", "note")


@functools.lru_cache(maxsize=256)
def replacement_raises(finding: Finding, rules: RuleSet) -> Finding:
    """``finding``, or, for a ``not-analysed`` note on a rule whose replacement raises on its own
    pattern, an error saying what it raised: such a rule fails every rewrite where it matches (a
    call that does not fit the op's schema, a name that does not exist), which ``fxrewrite lint``
    is there to say before anything is rewritten."""
    from .rewrite import rewrite

    if finding.kind != "not-analysed" or "replacement raises" not in finding.message:
        return finding
    rule = rules[finding.rules[0]]
    start = _start_for(rule)
    if isinstance(start, str):
        return finding
    try:
        rewrite(start.gm, rule)
    except FxRewriteError as exc:
        return Finding("replacement-raises", finding.rules,
                       f"rule '{rule.name}' ({rule.origin}): its replacement raises when applied to its own pattern "
                       f"graph, so every rewrite where it matches fails: {exc}", "error")
    return finding


def _rewritten(start: _Start) -> fx.GraphModule | None:
    """The start graph rewritten once by its own rule (cached: several analyses read it; no
    one modifies it, :func:`_apply` works on a copy)."""
    return _apply(start.gm, start.rule, start.match)


def _self_loop(start: _Start) -> Finding | None:
    """Apply the rule to its own output until it stops matching, a graph repeats, or
    :data:`SELF_LOOP_STEPS` rewrites were made (then it is a loop)."""
    rule = start.rule
    gm = _rewritten(start)
    if gm is None:
        return None
    forms = [canonical_form(start.gm.graph, start.gm), canonical_form(gm.graph, gm)]
    certain = True
    for _ in range(SELF_LOOP_STEPS):
        found = next(_matches(gm, rule), None)
        if found is None:
            return None
        certain = certain and found[1] is True
        gm = _apply(gm, rule, found[0])
        if gm is None:
            return None
        form = canonical_form(gm.graph, gm)
        if form in forms:
            break
        forms.append(form)
    return _self_loop_finding(start, certain)


def _self_loop_finding(start: _Start, certain: bool) -> Finding:
    rule = start.rule
    before = _expression(start.gm.graph)
    after_gm = _rewritten(start)
    after = _expression(after_gm.graph) if after_gm is not None else "?"
    noop = after_gm is not None and canonical_form(after_gm.graph, after_gm) == canonical_form(start.gm.graph, start.gm)
    if noop and not _loops_when_run(start):
        message = (f"rule {_origin(rule)} rewrites {before} into {after}: its replacement computes what its "
                   f"pattern computes (the same ops once spellings, default arguments and the order of commutative "
                   f"operands are normalised), so its pattern matches its own result. The driver sees that such a "
                   f"rewrite changes nothing and applies it once per match, so rewrites still end, but the rule "
                   f"does nothing useful: remove it, or make the replacement a different computation.")
        return Finding("self-loop", (rule.name,), message, "warning")
    what = ("its replacement computes what its pattern computes (the same ops once spellings, default arguments "
            "and the order of commutative operands are normalised), so the rule changes nothing and matches again"
            if noop else "its pattern matches its own replacement, so it fires again on every result")
    may = "" if certain else " unless its guard refuses the rewritten graph (the analysis could not decide it)"
    message = (f"rule {_origin(rule)} rewrites {before} into {after}: {what}{may}. A rewrite with it does not "
               f"reach a fixed point. Remove the rule, or make the replacement a different computation, or add "
               f"a where= guard that refuses its own output.")
    return Finding("self-loop", (rule.name,), message, "error" if certain else "warning")


def _loops_when_run(start: _Start) -> bool:
    """Whether rewriting the rule's own pattern graph with it alone fails to reach a fixed point
    (the driver may recognise rewrites that change nothing and stop)."""
    from .errors import DidNotConverge
    from .rewrite import rewrite

    try:
        rewrite(start.gm, start.rule, max_rewrites=32)
    except DidNotConverge:
        return True
    except FxRewriteError:  # another failure: not this analysis' business, keep the stricter verdict
        return True
    return False


@attrs.frozen
class _Path:
    gm: fx.GraphModule
    forms: tuple[str, ...]
    rules: tuple[str, ...]
    certain: bool


def _cycles(ruleset: Any, starts: Mapping[str, _Start], looping: set[str]) -> list[Finding]:
    found: dict[frozenset[str], Finding] = {}
    active = _by_anchor_key([r for r in ruleset if r.name not in looping])
    for name, start in starts.items():
        if name in looping:
            continue
        for path in _cycle_paths(start, active):
            key = frozenset(path.rules)
            if key not in found and len(key) > 1:
                found[key] = _cycle_finding(ruleset, start, path)
    return list(found.values())


def _by_anchor_key(rules: Sequence[Rule]) -> dict[Any, list[Rule]]:
    """Rules by the op key of their anchor, highest priority first (rule-set order within a
    level): the order in which the driver tries them at a node."""
    by_key: dict[Any, list[Rule]] = {}
    for rule in sorted(rules, key=lambda r: -r.priority):  # stable
        by_key.setdefault(rule.anchor_key, []).append(rule)
    return by_key


def _cycle_paths(start: _Start, rules: Mapping[Any, Sequence[Rule]]) -> Iterator[_Path]:
    """Rewrite paths from ``start`` (the first step by its own rule) that reach a graph seen
    before on the path: the rules between the two sightings undo each other."""
    first = _rewritten(start)
    if first is None:
        return
    origin = canonical_form(start.gm.graph, start.gm)
    frontier = [_Path(first, (origin, canonical_form(first.graph, first)), (start.rule.name,), True)]
    visited = 0
    while frontier and visited < MAX_STATES:
        path = frontier.pop(0)
        visited += 1
        for rule, match, verdict in _driver_choices(path.gm, rules):
            new = _apply(path.gm, rule, match)
            if new is None:
                continue
            form = canonical_form(new.graph, new)
            step = _Path(new, (*path.forms, form), (*path.rules, rule.name), path.certain and verdict is True)
            if form in path.forms:
                index = path.forms.index(form)
                yield attrs.evolve(step, rules=step.rules[index:])
            elif len(step.rules) < MAX_CYCLE_LENGTH:
                frontier.append(step)


def _driver_choices(gm: fx.GraphModule,
                    by_key: Mapping[Any, Sequence[Rule]]) -> list[tuple[Rule, Match, bool | None]]:
    """What the driver could apply next in ``gm``: at each node, the first matching rule of the
    highest priority level that matches anywhere in the graph (rule-set order within a level)."""
    modules = dict(gm.named_modules())
    choices = []
    for node in gm.graph.nodes:
        for rule in by_key.get(op_key_of(node.op, node.target), ()):
            found = _first_match(gm, rule, node, modules)
            if found is not None:
                choices.append((rule, *found))
                break
    top = max((rule.priority for rule, _, _ in choices), default=0)
    return [choice for choice in choices if choice[0].priority == top]


def _first_match(gm: fx.GraphModule, rule: Rule, node: Node,
                 modules: Mapping[str, nn.Module]) -> tuple[Match, bool | None] | None:
    for match in match_at(rule.compiled, node, gm, modules=modules,
                          candidates=lambda key: _nodes_with_key(gm.graph, key)):
        verdict = _verdict(rule, match)
        if verdict is not False:
            return match, verdict
    return None


def _cycle_finding(ruleset: Any, start: _Start, path: _Path) -> Finding:
    names = tuple(dict.fromkeys(path.rules))
    steps = " -> ".join(f"'{n}'" for n in path.rules)
    origins = "; ".join(_origin(ruleset[n]) for n in names)
    may = "" if path.certain else " unless a guard refuses one of these rewrites (the analysis could not decide it)"
    message = (f"rules {', '.join(repr(n) for n in names)} undo each other: starting from "
               f"{_expression(start.gm.graph)}, the rewrites {steps} lead back to a graph seen before{may}, so a "
               f"rewrite with them never reaches a fixed point ({origins}). Remove one of them, or add a where= "
               f"guard so that only one direction applies.")
    return Finding("cycle", tuple(sorted(names)), message, "error" if path.certain else "warning")


# -- shadowing -----------------------------------------------------------------------------------


def _served_before(high: Rule, low: Rule, order: Mapping[str, int], same_node: bool) -> bool:
    """Whether the driver tries ``high`` before ``low``: a higher priority level is served first
    everywhere; within a level, nodes in graph order (an inner node first) and, at one node,
    rules in rule-set order."""
    if high.priority != low.priority:
        return high.priority > low.priority
    return not same_node or order[high.name] < order[low.name]


def _shadowed(ruleset: Any, starts: Mapping[str, _Start]) -> list[Finding]:
    order = {r.name: i for i, r in enumerate(ruleset)}
    findings = []
    for low in ruleset:
        start = starts.get(low.name)
        if start is None:
            continue
        for high in ruleset:
            if high is low or high.where or high.name not in starts:
                continue
            match = _shadowing_match(high, low, start, order)
            if match is not None:
                findings.append(_shadow_finding(high, low, start, match))
                break
    return findings


def _shadowing_match(high: Rule, low: Rule, start: _Start, order: Mapping[str, int]) -> Match | None:
    """A match of ``high`` inside ``low``'s pattern graph that the driver applies before ``low``
    could fire, after which ``low`` no longer matches."""
    inner = set(start.match.nodes)
    for match, _ in _matches(start.gm, high):
        if not set(match.nodes) <= inner:
            continue
        if not _served_before(high, low, order, same_node=match.anchor is start.match.anchor):
            continue
        after = _apply(start.gm, high, match)
        if after is None or next(_matches(after, low), None) is not None:
            continue
        if _matches_any_literals(high, low, start):
            return match
    return None


#: Literal values no rule is likely to spell out: ``high`` matching ``low``'s pattern with these
#: in place of ``low``'s literal captures matches it whatever they are.
_ODD_LITERALS: Mapping[Any, tuple[Any, ...]] = {
    int: (7919, 7907, 7901), float: (0.3771, 0.3779, 0.3787), bool: (True, False), str: ("zz-odd", "zz-odd-2"),
    torch.dtype: (torch.float16, torch.bfloat16, torch.int16),
}


def _matches_any_literals(high: Rule, low: Rule, start: _Start) -> bool:
    """Whether ``high`` still matches ``low``'s pattern graph when ``low``'s literal captures are
    given unusual values (it does not depend on them being the probed ones)."""
    captures = [p for p in low.compiled.params if p.kind == "literal"]
    literals = {p.name: _ODD_LITERALS[p.annotation][j % len(_ODD_LITERALS[p.annotation])]
                for j, p in enumerate(captures)}
    if not literals:
        return True
    modules = {name: module for name, module in start.gm.named_children()}
    gm, _ = _start_graph(low, literals, modules)
    inner = {n for n in gm.graph.nodes if n.op not in ("placeholder", "output")}
    return any(set(m.nodes) <= inner for m, _ in _matches(gm, high))


def _shadow_finding(high: Rule, low: Rule, start: _Start, match: Match) -> Finding:
    why = (f"priority {high.priority} > {low.priority}" if high.priority != low.priority else
           f"same priority, and '{high.name}' comes first in the rule set" if match.anchor is start.match.anchor
           else f"same priority, and '{high.name}' matches an earlier node of the pattern")
    message = (f"rule {_origin(low)} never fires: wherever its pattern {_expression(start.gm.graph)} occurs, rule "
               f"{_origin(high)} matches first ({why}) and has no guard. Raise '{low.name}''s priority above "
               f"{high.priority}, or give '{high.name}' a where= guard, or remove '{low.name}'.")
    return Finding("shadowed", (low.name, high.name), message, "warning")


# -- order independence (needs a target) ---------------------------------------------------------


@attrs.frozen(eq=False)
class _Outcome:
    """What one rewrite of a target produced: the canonical form of its graph, its outputs on
    the check inputs, the rules that fired, or the error it raised."""

    form: str
    outputs: Any
    fired: tuple[str, ...]
    error: str | None = None


def _outcome(target: Any, order: Sequence[Rule], example_inputs: Sequence[Any] | None,
             check_inputs: Sequence[Any] | None) -> _Outcome:
    from .rewrite import rewrite
    from .rule import RuleSet

    try:
        result = rewrite(target, RuleSet(tuple(order)), example_inputs=example_inputs)
    except FxRewriteError as exc:
        return _Outcome("", None, (), f"{type(exc).__name__}: {str(exc).splitlines()[0]}")
    module = result.module
    with torch.no_grad():
        outputs = module(*check_inputs) if check_inputs is not None else None
    fired = tuple(name for name, count in result.report.applied.items() if count)
    return _Outcome(_structure(module), outputs, fired)


def _structure(module: fx.GraphModule) -> str:
    """The canonical form of a rewritten module, with constants and submodules named by what
    they are rather than by the fresh names a rewrite gives them."""
    form = canonical_form(module.graph, module)
    for node in module.graph.nodes:
        if node.op == "get_attr":
            value = attribute_at(module, str(node.target))
            kind = f"{tuple(value.shape)}:{value.dtype}" if isinstance(value, torch.Tensor) else type(value).__name__
            form = form.replace(f"get_attr({node.target})", f"get_attr({kind})")
    return form


def _difference(base: _Outcome, other: _Outcome) -> str | None:
    """How ``other`` differs from ``base``: ``"raises"``, ``"numeric"``, ``"structural"`` or not."""
    if (base.error is None) != (other.error is None):
        return "raises"
    if base.error is not None:
        return None
    if base.outputs is not None:
        try:
            torch.testing.assert_close(other.outputs, base.outputs, equal_nan=True)
        except AssertionError:
            return "numeric"
    return "structural" if other.form != base.form else None


def order_dependence(target: Any, rules: RulesLike, *, orders: int = 8, seed: int = 0,
                     example_inputs: Sequence[Any] | None = None,
                     check_inputs: Sequence[Any] | None = None) -> list[Finding]:
    """Rewrite ``target`` with ``rules`` in their own order and in ``orders`` random orders (as
    MLIR's randomised pattern driver does) and report the pairs of rules whose relative order
    changes the result: ``numeric`` (outputs on ``check_inputs`` differ), ``structural`` (the
    final graphs differ) or ``raises`` (one order makes the rewrite fail). Only the order within
    a priority level matters to the driver, so only that is shuffled in effect.

    >>> import torch
    >>> from fxrewrite import Rule
    >>> to_add = Rule.from_functions(lambda x: x * 2, lambda x: x + x, name="to_add")
    >>> to_float = Rule.from_functions(lambda x: x * 2, lambda x: x * 2.0, name="to_float")
    >>> [(f.kind, f.rules) for f in order_dependence(lambda a: a * 2, [to_add, to_float], orders=4)]
    [('order-dependent', ('to_add', 'to_float'))]
    """
    import random

    ruleset = as_ruleset(rules)
    base = _outcome(target, ruleset.rules, example_inputs, check_inputs)
    rng = random.Random(seed)
    findings: dict[tuple[str, ...], Finding] = {}
    for _ in range(orders):
        order = list(ruleset.rules)
        rng.shuffle(order)
        outcome = _outcome(target, order, example_inputs, check_inputs)
        kind = _difference(base, outcome)
        if kind is None:
            continue
        names, how = _culprits(target, ruleset.rules, order, base, outcome, example_inputs, check_inputs)
        if names not in findings:
            findings[names] = _order_finding(ruleset, names, how or kind, base, outcome)
    return sorted(findings.values(), key=lambda f: f.rules)


def _culprits(target: Any, base_order: Sequence[Rule], order: Sequence[Rule], base: _Outcome, outcome: _Outcome,
              example_inputs: Sequence[Any] | None, check_inputs: Sequence[Any] | None,
              limit: int = 24) -> tuple[tuple[str, ...], str | None]:
    """A pair of rules of one priority, both fired in one of the two runs and ordered
    differently in them, whose swap alone changes the result; else all such rules."""
    position = {r.name: i for i, r in enumerate(order)}
    fired = set(base.fired) | set(outcome.fired)
    suspects = [r for r in base_order if r.name in fired]
    pairs = [(a, b) for a, b in itertools.combinations(suspects, 2)
             if a.priority == b.priority and position[a.name] > position[b.name]]
    for a, b in pairs[:limit]:
        swapped = [b if r is a else a if r is b else r for r in base_order]
        how = _difference(base, _outcome(target, swapped, example_inputs, check_inputs))
        if how is not None:
            return tuple(sorted((a.name, b.name))), how
    return tuple(sorted(fired)), None


def _order_finding(ruleset: Any, names: tuple[str, ...], how: str, base: _Outcome, outcome: _Outcome) -> Finding:
    what = {"numeric": "computes different outputs", "structural": "ends in a different graph",
            "raises": f"fails in one order ({base.error or outcome.error})"}[how]
    origins = "; ".join(_origin(ruleset[n]) for n in names)
    message = (f"rules {', '.join(repr(n) for n in names)} depend on their order: the rewrite {what} when their "
               f"relative order changes ({origins}). Give the one that should win a higher priority, or guard "
               f"them so that they do not match the same graph.")
    return Finding("order-dependent", names, message, "error" if how == "numeric" else "warning")
