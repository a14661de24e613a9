"""Probing a rule before any search: the (dtype, rank) configurations on which its pattern (and
its guards) run, found by calling it on simple inputs (tensors of ones, a few values of each
literal capture, default modules); when none runs, the first error says why.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import attrs
import torch
from hypothesis.strategies import SearchStrategy
from torch import nn

from ..domain import DependentFactory
from ..pattern import Param
from ._nn_modules import default_module
from ._plan import _STRING_LITERALS, InputPlan, _base_shape, _Config, _index_literals, _module_order, accepts
from ._running import _seeded, call_rule_function
from ._values import _unique

_PROBE_LITERALS: Mapping[Any, tuple[Any, ...]] = {
    int: (1, 0, -1, 2), float: (1.0, 0.5, 2.0, 0.0), bool: (False, True),
    str: _STRING_LITERALS, torch.dtype: (torch.float32, torch.float64, torch.int64, torch.bool),
}


def _probe_literals(plan: InputPlan) -> list[dict[str, Any]]:
    """A few assignments of the literal captures to try while probing."""
    choices = {}
    for param in plan.literals:
        declared = plan.domain.literals.get(param.name)
        if declared is not None and not isinstance(declared, SearchStrategy):
            single = isinstance(declared, (str, bytes)) or not isinstance(declared, Iterable)
            choices[param.name] = (declared,) if single else tuple(declared)
        else:
            choices[param.name] = _PROBE_LITERALS[param.annotation]
    count = max((len(c) for c in choices.values()), default=1)
    probes = [{name: c[i % len(c)] for name, c in choices.items()} for i in range(min(count, 24))]
    group = _index_literals(plan)
    if len(group) > 1:  # dims of permute(x, a, b, c) and friends: the identity and its reverse
        order = list(range(len(group)))
        probes += [{**probes[0], **dict(zip(group, o))} for o in (order, order[::-1])]
    return probes


def _probe_tensor(dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    return torch.ones(shape, dtype=dtype)


def _probe_modules(plan: InputPlan, width: int) -> dict[str, nn.Module]:
    """One module per module capture, built in :func:`_module_order` (a factory that names other
    captures receives the modules built for them); ``{}`` when one is drawn from a strategy."""
    out: dict[str, nn.Module] = {}
    for param in _module_order(plan):
        source = plan.domain.modules.get(param.name)
        if isinstance(source, SearchStrategy):
            return {}
        make: Callable[[], Any] = source if source is not None else functools.partial(
            default_module, param.annotation, width=width, kernel=1, bias=True)
        if isinstance(source, DependentFactory):
            make = functools.partial(source, **out)
        out[param.name] = _seeded(0, make)
    return {p.name: out[p.name] for p in plan.modules}


def _probe(plan: InputPlan) -> tuple[tuple[_Config, ...], str | None]:
    """The (dtype, rank) configurations on which the pattern runs for some simple input, in
    order of preference; all of them (and the first error) when none does."""
    low_rank, high_rank = plan.domain.ranks
    candidates = [_Config(d, r) for d in plan.domain.dtypes for r in range(low_rank, high_rank + 1)]
    low, high = plan.domain.sides
    sides = _unique([min(max(2, low), high), low, high])
    modules = _probe_modules(plan, sides[0])
    if plan.modules and not modules:
        return tuple(candidates), None
    literal_choices = _probe_literals(plan)
    accepted, first_error = [], None
    for config in candidates:
        for side in sides:
            base = _base_shape(plan, [side] * config.rank, modules)
            tensors_ = {p.name: _probe_tensor(_probe_dtype(plan, p, config), _probe_shape(plan, p, base))
                        for p in plan.tensors}
            ok, error = _probe_once(plan, tensors_, modules, literal_choices)
            first_error = first_error or error
            if ok:
                accepted.append(config)
                break
    accepted += _probe_own_dtypes(plan, accepted, modules, literal_choices, sides[0])
    if accepted:
        return tuple(accepted), None
    return tuple(candidates), first_error


def _probe_own_dtypes(plan: InputPlan, accepted: list[_Config], modules: Mapping[str, nn.Module],
                      literal_choices: list[dict[str, Any]], side: int) -> list[_Config]:
    """For each dtype on which the pattern runs at no rank with every tensor argument of it: the
    configurations where one argument has a dtype of its own (a bool mask beside float
    ``q``, ``k``, ``v``: on all-bool and on all-float inputs such a pattern raises)."""
    if len(plan.tensors) < 2:
        return []
    low_rank, high_rank = plan.domain.ranks
    ranks = sorted({c.rank for c in accepted}) or list(range(low_rank, high_rank + 1))
    found = []
    for dtype in plan.domain.dtypes:
        if any(c.dtype == dtype for c in accepted):
            continue
        for rank in ranks:
            config = _own_dtype_config(plan, _Config(dtype, rank), modules, literal_choices, side)
            if config is not None:
                found.append(config)
    return found


def _own_dtype_config(plan: InputPlan, config: _Config, modules: Mapping[str, nn.Module],
                      literal_choices: list[dict[str, Any]], side: int) -> _Config | None:
    base = _base_shape(plan, [side] * config.rank, modules)
    for param in plan.tensors:
        if plan.domain.tensor_domain(param.name).dtypes is not None:
            continue
        for other in plan.domain.dtypes:
            if other == config.dtype:
                continue
            candidate = attrs.evolve(config, overrides=((param.name, other),))
            tensors_ = {p.name: _probe_tensor(_probe_dtype(plan, p, candidate), _probe_shape(plan, p, base))
                        for p in plan.tensors}
            if _probe_once(plan, tensors_, modules, literal_choices)[0]:
                return candidate
    return None


def _probe_shape(plan: InputPlan, param: Param, base: tuple[int, ...]) -> tuple[int, ...]:
    own = plan.domain.tensor_domain(param.name).shape
    return base if own is None else own


def _probe_dtype(plan: InputPlan, param: Param, config: _Config) -> torch.dtype:
    own = plan.domain.tensor_domain(param.name).dtypes
    return own[0] if own else dict(config.overrides).get(param.name, config.dtype)


def _probe_once(plan: InputPlan, tensors_: Mapping[str, torch.Tensor], modules: Mapping[str, nn.Module],
                literal_choices: list[dict[str, Any]]) -> tuple[bool, str | None]:
    error = None
    for literals in literal_choices:
        inputs = {**tensors_, **literals, **modules}
        if accepts(plan, inputs, guard_errors="accept"):  # a crashing guard is reported later
            return True, None
        if error is None:
            try:
                call_rule_function(plan.rule.pattern, inputs)
                error = "the guards reject every probed input"
            except Exception as exc:
                error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
    return False, error
