"""The entry points of the input plan: :func:`plan_inputs` makes a rule's
:class:`~fxrewrite.testing._plan.InputPlan` (its domain parsed and checked against its
parameters, its module captures checked buildable, the configurations its pattern runs on
probed), and :func:`inputs_for` is that plan's strategy.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import attrs
from hypothesis.strategies import SearchStrategy
from torch import nn
from torch.fx.node import Node

from ..errors import RuleDefinitionError
from ..pattern import Param
from ..rule import Rule
from ._domain import Domain
from ._nn_modules import default_module
from ._plan import InputPlan, draw_counts, refuses_most_layouts, relations_by_rank, relations_of_every_rank
from ._probing import _probe
from ._running import GuardHarness


def _module_consumers(rule: Rule) -> dict[str, str]:
    """Tensor parameters that a module capture is called on directly, as its first argument
    (positional or by keyword, ``lin(input=x)``): ``{tensor: module}``, the first module's for a
    tensor several are called on."""
    pattern = rule.compiled
    kinds = {p.name: p.kind for p in pattern.params}
    classes = {p.name: p.annotation for p in pattern.params if p.kind == "module"}
    consumers: dict[str, str] = {}
    for node in pattern.graph.nodes:
        if node.op != "call_module":
            continue
        arg = _first_argument(node, classes.get(str(node.target)))
        if isinstance(arg, Node) and arg.op == "placeholder" and kinds.get(str(arg.target)) == "tensor":
            consumers.setdefault(str(arg.target), str(node.target))
    return consumers


def _first_argument(node: Node, cls: type[nn.Module] | None) -> Any:
    """The first argument of a ``call_module`` node: its first positional one, else the keyword
    one named as the first parameter of ``cls.forward`` (``None`` if there is neither)."""
    if node.args:
        return node.args[0]
    if cls is None or not node.kwargs:
        return None
    try:
        names = [name for name in inspect.signature(cls.forward).parameters if name != "self"]
    except (TypeError, ValueError):  # a forward without a signature Python can read
        return None
    return node.kwargs.get(names[0]) if names else None


def plan_inputs(rule: Rule, *, domain: Mapping[str, Any] | None = None) -> InputPlan:
    """Parse the rule's domain (or ``domain``), check that every module capture can be built and
    probe which dtypes and ranks the pattern accepts.

    Raises :class:`~fxrewrite.errors.RuleDefinitionError` for a malformed domain or a module
    capture that needs a factory.
    """
    where = f"rule '{rule.name}' ({rule.origin})"
    parsed = Domain.parse(rule.domain if domain is None else domain, where=where)
    params = rule.compiled.params
    plan = InputPlan(
        rule=rule, domain=parsed,
        tensors=tuple(p for p in params if p.kind == "tensor"),
        literals=tuple(p for p in params if p.kind == "literal"),
        modules=tuple(p for p in params if p.kind == "module"),
        consumers=_module_consumers(rule),
        harness=GuardHarness(rule) if rule.where else None,
        counts=draw_counts(rule),
    )
    parsed.check_names({p.name: p.kind for p in params}, where)
    for param in plan.modules:
        _check_module_source(plan, param)
    configs, failure = _probe(plan)
    plan = attrs.evolve(plan, configs=configs, probe_failure=failure)
    plan = attrs.evolve(plan, refusing=refuses_most_layouts(plan))
    ranked = relations_by_rank(plan)
    return attrs.evolve(plan, relations=relations_of_every_rank(ranked), ranked_relations=ranked)


def _check_module_source(plan: InputPlan, param: Param) -> None:
    if plan.domain.modules.get(param.name) is not None:  # a factory or a strategy: Domain.parse checked it
        return
    if default_module(param.annotation, width=2, kernel=1, bias=True) is None:
        cls = param.annotation.__name__
        raise RuleDefinitionError(
            f"{plan.where}: cannot build a '{cls}' for module capture '{param.name}' to test the rule; "
            f"declare a factory: domain={{'modules': {{'{param.name}': lambda: {cls}(...)}}}}.")


def inputs_for(rule: Rule, *, domain: Mapping[str, Any] | None = None) -> SearchStrategy[dict[str, Any]]:
    """Every argument of ``rule``'s pattern, as ``{parameter name: value}``: tensors for
    variables, values of their annotated type for literal captures, modules for module
    captures. Only draws on which the pattern runs and every guard holds are kept.
    A ``rule`` that is not a :class:`~fxrewrite.Rule` is an ``ArgumentError``.

    ``domain`` replaces the rule's own declaration. Raises
    :class:`~fxrewrite.errors.RuleDefinitionError` if the domain is malformed or a module
    capture needs a factory.

    >>> import torch
    >>> from hypothesis import find
    >>> from fxrewrite import Rule
    >>> rule = Rule.from_functions(lambda x, y: x + y, lambda x, y: y + x, name="add_commutes")
    >>> inputs = find(inputs_for(rule), lambda d: d["x"].shape != d["y"].shape)
    >>> sorted(inputs), torch.broadcast_shapes(inputs["x"].shape, inputs["y"].shape) == inputs["x"].shape
    (['x', 'y'], True)
    """
    if not isinstance(rule, Rule):
        from ..errors import ArgumentError

        raise ArgumentError(f"inputs_for(): rule takes a fxrewrite.Rule, got {rule!r} ({type(rule).__name__}).")
    return plan_inputs(rule, domain=domain).strategy()
