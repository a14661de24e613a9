"""Why did my rule (not) fire? Matching without rewriting.

:func:`find_matches` yields every place a rule set matches (sound matches that pass the
guards), without changing anything. :func:`explain` says, rule by rule, where it matched and,
for its closest misses, the pattern node, the graph node and the first reason the match failed:

>>> import torch, fxrewrite
>>> rule = fxrewrite.Rule.from_functions(lambda x: torch.neg(torch.neg(x)), lambda x: x, name="neg_neg",
...                                      origin="<doc>:1")
>>> def f(a):
...     inner = torch.neg(a)
...     return torch.neg(inner) + inner + torch.neg(a * 2)
>>> print(explain(f, rule))
rule neg_neg (<doc>:1): 0 match(es) among 3 candidate(s) computing aten.neg
  miss at 'neg_1' (neg_1 = torch.neg(neg)): 'neg' is also used by 'add' outside the match
  miss at 'neg' (neg = torch.neg(a)): at pattern node 'neg': op differs: pattern has neg, graph has placeholder a
  miss at 'neg_2' (neg_2 = torch.neg(mul)): at pattern node 'neg': op differs: pattern has neg, graph has mul
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import attrs
import torch
import torch.fx as fx
from torch.fx.node import Node

from .index import OpIndex
from .match import Match, Rejection, match_at
from .meta import propagate_inputs
from .replace import placement_refusal
from .rule import Rule, RuleSet, RulesLike, as_ruleset
from .target import to_graph_module

__all__ = ["Explanation", "Miss", "RuleExplanation", "explain", "find_matches"]


@attrs.frozen
class Miss:
    """A candidate node where a rule did not match, and the reason where it got furthest."""

    graph_node: str
    code: str
    pattern_node: str
    reason: str
    progress: int

    def __str__(self) -> str:
        where = f"at pattern node '{self.pattern_node}': " if self.progress < _FULL else ""
        return f"miss at '{self.graph_node}' ({self.code}): {where}{self.reason}"


_FULL = 1 << 30  # progress of a match refused after it was found (containment, cycle, guard)


@attrs.frozen
class RuleExplanation:
    """What one rule did on a graph: matches (anchor node names) and closest misses."""

    rule: str
    origin: str
    anchor: str
    candidates: int
    matches: tuple[str, ...]
    misses: tuple[Miss, ...]

    def __str__(self) -> str:
        head = (f"rule {self.rule} ({self.origin}): {len(self.matches)} match(es) among {self.candidates} "
                f"candidate(s) computing {self.anchor}")
        lines = [head]
        lines += [f"  match at '{name}'" for name in self.matches]
        lines += [f"  {miss}" for miss in self.misses]
        if not self.candidates:
            lines.append(f"  no node of the graph computes {self.anchor}, the op the pattern ends with")
        return "\n".join(lines)


@attrs.frozen
class Explanation:
    """The explanation of a rule set on one graph; ``str()`` is the report."""

    rules: tuple[RuleExplanation, ...]

    def __getitem__(self, name: str) -> RuleExplanation:
        for r in self.rules:
            if r.rule == name:
                return r
        raise KeyError(f"no rule named '{name}' was explained; rules: {[r.rule for r in self.rules]}")

    def __str__(self) -> str:
        return "\n".join(str(r) for r in self.rules)


def _check_order(function: str, target: Any, rules: Any) -> None:
    """0.2 put the target first, as in ``rewrite(target, rules)``: a call written for 0.1
    (``explain(rules, target)``) gets an error that says so, not a confusing failure."""
    from .errors import ArgumentError
    from .rule import RuleBuilder

    if isinstance(target, (Rule, RuleSet, RuleBuilder)) and not isinstance(rules, (Rule, RuleSet, RuleBuilder)):
        raise ArgumentError(f"{function}(target, rules): the target comes first (as in rewrite(target, rules)); "
                            f"got a rule set first. Swap the arguments (the order changed in fxrewrite 0.2).")


def _graph_module(target: Any, example_inputs: Sequence[Any] | None) -> fx.GraphModule:
    gm = to_graph_module(target)
    if example_inputs is not None:
        propagate_inputs(gm, example_inputs)
    return gm


def find_matches(target: Any, rules: RulesLike, *,
                 example_inputs: Sequence[Any] | None = None) -> Iterator[tuple[Rule, Match]]:
    """Every (rule, match) of ``rules`` in ``target``, in rule order then graph order, without
    rewriting. Matches of different rules (or of one rule at different nodes) may overlap.
    The arguments come in ``rewrite``'s order: ``find_matches(target, rules)``."""
    _check_order("find_matches", target, rules)
    gm = _graph_module(target, example_inputs)
    modules = dict(gm.named_modules())
    index = OpIndex(gm.graph)
    for rule in as_ruleset(rules):
        for node in index.nodes(rule.anchor_key):
            for match in match_at(rule.compiled, node, gm, modules=modules, candidates=index):
                if placement_refusal(match) is None and rule.refusal(match) is None:
                    yield rule, match
                    break


def explain(target: Any, rules: RulesLike, *, example_inputs: Sequence[Any] | None = None,
            misses: int = 3, after: RulesLike | None = None) -> Explanation:
    """For each rule: where it matches, and its ``misses`` closest misses with the reason. The
    arguments come in ``rewrite``'s order: ``explain(target, rules)``.

    ``after`` explains against the graph as ``rewrite`` would leave it for these rules: the
    target is first rewritten with the rules of ``after`` (all but the ones explained, by name),
    so nodes that the rest of a rule set removes or changes anyway are seen as they end up
    (``fxrewrite explain --after-others``). Here the dropout is gone before ``relu_relu`` is
    explained:

    >>> import torch, fxrewrite
    >>> relu_relu = fxrewrite.Rule.from_functions(lambda x: torch.relu(torch.relu(x)), lambda x: torch.relu(x),
    ...                                           name="relu_relu")
    >>> drop = fxrewrite.Rule.from_functions(lambda x: torch.nn.functional.dropout(x, 0.1, True), lambda x: x,
    ...                                      name="no_dropout")
    >>> def f(a):  # an active dropout (an inactive one the matcher would look through)
    ...     return torch.relu(torch.nn.functional.dropout(torch.relu(a), 0.1, True))
    >>> explain(f, relu_relu)["relu_relu"].matches
    ()
    >>> explain(f, relu_relu, after=[relu_relu, drop])["relu_relu"].matches
    ('relu_1',)
    """
    _check_order("explain", target, rules)
    explained = as_ruleset(rules)
    if after is not None:
        target = _rewritten_by_others(target, explained, after, example_inputs)
    gm = _graph_module(target, example_inputs)
    modules = dict(gm.named_modules())
    index = OpIndex(gm.graph)
    return Explanation(tuple(_explain_rule(rule, gm, modules, index, misses) for rule in explained))


def _rewritten_by_others(target: Any, explained: RuleSet, others: RulesLike,
                         example_inputs: Sequence[Any] | None) -> fx.GraphModule:
    from .rewrite import rewrite  # explaining after a rewrite is the one use of the driver here

    names = set(explained.names)
    rest = RuleSet(tuple(r for r in as_ruleset(others) if r.name not in names))
    return rewrite(target, rest, example_inputs=example_inputs).module


def _explain_rule(rule: Rule, gm: fx.GraphModule, modules: dict[str, torch.nn.Module], index: OpIndex,
                  limit: int) -> RuleExplanation:
    matches: list[str] = []
    found: list[Miss] = []
    candidates = index.nodes(rule.anchor_key)
    for node in candidates:
        rejections: list[Rejection] = []
        matched = False
        for match in match_at(rule.compiled, node, gm, modules=modules, on_reject=rejections.append,
                              candidates=index):
            refusal = placement_refusal(match) or rule.refusal(match)
            if refusal is None:
                matches.append(node.name)
                matched = True
                break
            rejections.append(Rejection(rule.compiled.anchor, node, refusal, _FULL + 1))
        if not matched and rejections:
            best = max(rejections, key=lambda r: r.progress)
            found.append(_miss(node, best, rule))
    found.sort(key=lambda m: -m.progress)
    anchor = rule.anchor_key
    return RuleExplanation(rule.name, rule.origin, _describe_key(anchor), len(candidates), tuple(matches),
                           tuple(found[:limit]))


def _miss(node: Node, rejection: Rejection, rule: Rule) -> Miss:
    complete = rejection.progress >= len(rule.compiled.inner_nodes) + len(rule.compiled.params)
    progress = _FULL if complete else rejection.progress
    where = rejection.pattern_node
    pattern_node = where.name if isinstance(where, Node) else f"the constant {where!r}"
    return Miss(node.name, _short(node), pattern_node, rejection.reason, progress)


def _short(node: Node) -> str:
    text = node.format_node()
    # "%neg_1 : [num_users=1] = call_function[target=torch.neg](args = (%neg,), kwargs = {})" is long;
    # show it as Python instead
    args = ", ".join(_arg(a) for a in node.args)
    kwargs = ", ".join(f"{k}={_arg(v)}" for k, v in node.kwargs.items())
    inner = ", ".join(p for p in (args, kwargs) if p)
    if node.op == "call_function":
        return f"{node.name} = {_callable_name(node.target)}({inner})"
    if node.op == "call_method":
        return f"{node.name} = {inner.split(', ')[0]}.{node.target}({', '.join(inner.split(', ')[1:])})"
    if node.op == "call_module":
        return f"{node.name} = self.{node.target}({inner})"
    return text or node.name


def _arg(a: Any) -> str:
    return a.name if isinstance(a, Node) else repr(a)


def _callable_name(target: Any) -> str:
    if isinstance(target, torch._ops.OpOverload):
        return str(target)
    module = getattr(target, "__module__", None)
    name = getattr(target, "__name__", repr(target))
    if module in ("_operator", "operator"):
        return f"operator.{name}"
    if module == "torch":
        return f"torch.{name}"
    return f"{module}.{name}" if module else name


def _describe_key(key: Any) -> str:
    if key[0] == "aten":
        return f"aten.{key[1]}" if "::" not in key[1] else key[1]
    if key[0] == "call_module":
        return "a call_module"
    return f"{key[0]} {key[1]}"
