"""What :func:`~fxrewrite.testing.strategies.inputs_for` draws for one rule, and the drawing.

:class:`InputPlan` holds the rule's parameters, its parsed domain and the (dtype, rank)
configurations on which its pattern runs; :meth:`InputPlan.strategy` draws a dtype, module
captures, the sides of a base shape, the tensors (shapes related to the base shape, dtypes,
values) and the literal captures, in that order, and keeps the draws that :func:`accepts`
accepts (the pattern runs and every guard holds). The shrinker works on that order of draws: the
minimal counterexamples the tests pin depend on it, so change it knowingly.
"""

from __future__ import annotations

import functools
import itertools
import math
import weakref
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import attrs
import hypothesis.strategies as st
import torch
from hypothesis import HealthCheck, Phase, Verbosity, given, reject, settings
from hypothesis.strategies import SearchStrategy
from torch import nn

from ..domain import DependentFactory, build_order
from ..errors import RuleDefinitionError
from ..pattern import Param
from ..rule import Rule
from ._domain import Domain
from ._nn_modules import default_module, fit_input_shape
from ._reproducible import own_constants_only
from ._running import GuardHarness, GuardRaised, _guard_name, _seeded, call_rule_function
from ._sizes import SizedOp, fitting_sizes, sized_ops
from ._values import _as_strategy, _build_tensor, _non_contiguous, _unique, _value_lists

#: Dtypes a ``torch.dtype`` literal capture is drawn from.
_DTYPE_LITERALS: tuple[torch.dtype, ...] = (
    torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int8,
    torch.uint8, torch.bool,
)

#: Strings a ``str`` literal capture is drawn from unless the domain lists its values.
_STRING_LITERALS: tuple[str, ...] = (
    "none", "tanh", "mean", "sum", "floor", "trunc", "max", "min", "amax", "amin", "prod",
    "nearest", "linear", "bilinear", "constant", "reflect", "replicate", "circular", "zeros",
    "same", "valid", "fro", "nuc",
)


#: Pairs drawn together for two ``torch.dtype`` captures (``x.to(a).to(b)``), the pairs whose
#: conversions differ first: same size and another format, narrower in between, wider in between.
_DTYPE_PAIRS: tuple[tuple[torch.dtype, torch.dtype], ...] = (
    (torch.bfloat16, torch.float16), (torch.float16, torch.bfloat16), (torch.float32, torch.float16),
    (torch.float64, torch.float32), (torch.float64, torch.float16), (torch.float32, torch.bfloat16),
    (torch.float16, torch.float32), (torch.bfloat16, torch.float32), (torch.float32, torch.float64),
    (torch.int64, torch.int32), (torch.int32, torch.uint8), (torch.int64, torch.int8), (torch.uint8, torch.int8),
    (torch.float32, torch.int32), (torch.int64, torch.float32),
)

#: Type promotion categories: a 0-dim tensor of a higher category than the others sets the
#: result's category (``torch.tensor(2.0, dtype=torch.float64) / torch.tensor([3])`` is float64).
_CATEGORIES = {torch.bool: 0}


def _category(dtype: torch.dtype) -> int:
    return _CATEGORIES.get(dtype, 2 if dtype.is_floating_point else 1)


#: Strategies made once per plan and arguments (each composite's strategy object, sampled
#: values, literal strategies) instead of at every draw: a new strategy object is validated and
#: labelled when first drawn (~30 us each, several per layout try). The same strategies, drawn
#: alike; False is the slow twin, making each anew (tests/testing/test_draws_fast.py compares them).
REUSED_STRATEGIES = True


def _reused(factory: Any) -> Any:
    """``factory`` (a function returning a strategy, of hashable arguments), remembered by its
    arguments while :data:`REUSED_STRATEGIES` is on."""
    remembered = functools.lru_cache(maxsize=4096)(factory)

    @functools.wraps(factory)
    def make(*args: Any, **kwargs: Any) -> Any:
        return remembered(*args, **kwargs) if REUSED_STRATEGIES else factory(*args, **kwargs)

    make.uncached = factory  # type: ignore[attr-defined]
    return make


@_reused
def _sampled(values: tuple[Any, ...]) -> SearchStrategy[Any]:
    return st.sampled_from(values)


@attrs.frozen
class _Config:
    """The dtype of the tensor arguments and the rank of the largest one; ``overrides`` gives
    some arguments a dtype of their own (a bool mask beside float ``q``, ``k``, ``v``)."""

    dtype: torch.dtype
    rank: int
    overrides: tuple[tuple[str, torch.dtype], ...] = ()


@attrs.define
class PatternErrors:
    """Drawn inputs on which the pattern raises, tried on the replacement too (a few calls per
    check): a replacement that returns there would make a crashing program run after a rewrite.
    Reported with the verdict, never a counterexample (the rule cannot match a program that
    raises); the other direction, the replacement raising where the pattern returns, is one."""

    calls: int = 20
    found: tuple[Mapping[str, Any], str] | None = None

    def rejected(self, rule: Rule, inputs: Mapping[str, Any]) -> None:
        if self.found is not None or self.calls <= 0:
            return
        self.calls -= 1
        try:
            call_rule_function(rule.pattern, inputs)
        except Exception as exc:
            try:
                call_rule_function(rule.replacement, inputs)
            except Exception:
                return
            text = str(exc).strip()
            self.found = (inputs, f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}")


@attrs.define(eq=False)
class DrawCounts:
    """How many inputs the plans of one rule drew, and how many they kept (the pattern ran and
    every guard held): ``fxrewrite check -v`` shows the rejection rate. ``refused`` remembers
    which tensor layouts (and literals) a guard refuses."""

    drawn: int = 0
    kept: int = 0
    #: Layouts refused on stand-in tensors and drawn again before any value was drawn.
    layouts_refused: int = 0
    refused: dict[Any, bool] = attrs.field(factory=dict, repr=False)

    @property
    def rejected_percent(self) -> float:
        return 100.0 * (self.drawn - self.kept) / self.drawn if self.drawn else 0.0

    def describe(self) -> str:
        """``drawn 1598, kept 116, rejected 93%``."""
        return f"drawn {self.drawn}, kept {self.kept}, rejected {self.rejected_percent:.0f}%"


_COUNTS: weakref.WeakKeyDictionary[Rule, DrawCounts] = weakref.WeakKeyDictionary()


def draw_counts(rule: Rule) -> DrawCounts:
    """The draw counts of every input plan made for ``rule`` (this object) in this process;
    :func:`reset_draw_counts` starts them again."""
    return _COUNTS.setdefault(rule, DrawCounts())


def reset_draw_counts(rule: Rule) -> None:
    _COUNTS.pop(rule, None)


#: A focus that makes one tensor argument smaller (:meth:`InputPlan.with_smaller`) draws only
#: base shapes of the ranks at which a shape relation the plan accepts drops a dimension of
#: that tensor. At the other ranks (rank 2 of the attention rules: ``q`` of one dimension) its
#: draws were refused 40 times in 41 (1,764 of the library's 1,808), and each search begins
#: with the lowest rank. False is the slow twin: every rank the pattern runs on.
SMALLER_AT_ITS_RANKS = True


@attrs.frozen(eq=False, repr=False)
class InputPlan:
    """What :func:`inputs_for` draws for one rule: its parameters, the parsed domain, and the
    (dtype, rank) configurations on which probing found that the pattern runs."""

    rule: Rule
    domain: Domain
    tensors: tuple[Param, ...]
    literals: tuple[Param, ...]
    modules: tuple[Param, ...]
    consumers: Mapping[str, str]
    configs: tuple[_Config, ...] = ()
    probe_failure: str | None = None
    harness: GuardHarness | None = None
    #: A tensor argument that always broadcasts (one dimension or more fewer than the others).
    smaller: str | None = None
    #: A tensor argument that is 0-dim and of a higher promotion category than the others, and its dtypes.
    zero_dim: str | None = None
    zero_dim_dtypes: tuple[torch.dtype, ...] = ()
    #: Dtype captures always drawn as a pair, float tensors holding only values that tell dtypes apart.
    separating: bool = False
    #: A tensor argument always of another dtype than the others (which share one).
    own_dtype: str | None = None
    #: Where inputs the pattern raises on are tried on the replacement (``None``: they are not).
    pattern_errors: PatternErrors | None = None
    #: Shape relations the guards accept (:func:`accepted_relations`), drawn three times in four.
    relations: tuple[Mapping[str, int], ...] = ()
    #: The same relations by the rank of the base shape on which they were accepted
    #: (:func:`relations_by_rank`), drawn instead while :data:`RELATIONS_BY_RANK` is on.
    ranked_relations: Mapping[int, tuple[Mapping[str, int], ...]] = attrs.field(factory=dict, repr=False)
    #: A rule without guards or literals whose pattern refuses many layouts of a fixed grid
    #: (:func:`refuses_most_layouts`): its layouts are drawn first.
    refusing: bool = False
    #: What this plan and the plans made from it drew and kept (shared with :func:`draw_counts`).
    counts: DrawCounts = attrs.field(factory=DrawCounts, repr=False)

    @property
    def where(self) -> str:
        return f"rule '{self.rule.name}' ({self.rule.origin})"

    def __repr__(self) -> str:
        # short: Hypothesis shows the strategy's repr, with this plan in it, in its notes and
        # warns when it is large (the layouts DrawCounts remembers made it hundreds of kB)
        return f"InputPlan({self.where})"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        """What Hypothesis' pretty-printer shows (it prints an attrs class field by field)."""
        printer.text(repr(self))

    @property
    def dtypes(self) -> tuple[torch.dtype, ...]:
        """Dtypes on which the pattern was seen to run."""
        return tuple(_unique(c.dtype for c in self.configs))

    @property
    def broadcastable(self) -> tuple[str, ...]:
        """Tensor arguments whose shapes may differ from the others' (by broadcasting)."""
        names = tuple(p.name for p in self.tensors if _shape_varies(self, p))
        return names if len(names) > 1 else ()

    @property
    def promotable(self) -> tuple[str, ...]:
        """Tensor arguments that may be drawn 0-dim beside the others, with a dtype that wins
        the type promotion by its category (bool < integers < floats): only when the drawn
        dtypes span two categories."""
        categories = {_category(d) for name in self.broadcastable for d in self.param_dtypes(name)}
        return self.broadcastable if self.domain.mixed_dtypes and len(categories) > 1 else ()

    @property
    def separates_dtypes(self) -> bool:
        """A rule with ``torch.dtype`` captures: its float tensors also draw values that
        float16, bfloat16, float32 and float64 round differently."""
        return any(p.annotation is torch.dtype for p in self.literals)

    def param_dtypes(self, name: str) -> tuple[torch.dtype, ...]:
        """Dtypes on which the pattern was seen to run with tensor argument ``name`` of that dtype."""
        return tuple(_unique(dict(c.overrides).get(name, c.dtype) for c in self.configs))

    def config(self, dtype: torch.dtype, rank: int) -> _Config:
        return next((c for c in self.configs if c.dtype == dtype and c.rank == rank), _Config(dtype, rank))

    @property
    def deviants(self) -> tuple[str, ...]:
        """With three tensor arguments or more: those that can take a dtype of their own (a float32
        mask beside float16 ``q``, ``k``, ``v``)."""
        if len(self.tensors) < 3 or not self.domain.mixed_dtypes:
            return ()
        return tuple(p.name for p in self.tensors if len(self.param_dtypes(p.name)) > 1
                     and self.domain.tensor_domain(p.name).dtypes is None)

    def with_own_dtype(self, name: str) -> InputPlan:
        """This plan, where tensor argument ``name`` has another dtype than the others."""
        return attrs.evolve(self, own_dtype=name)

    def with_separation(self) -> InputPlan:
        """This plan, with its dtype captures drawn as pairs that convert differently and float
        tensors of values those conversions round differently (:data:`DTYPE_SEPARATORS`)."""
        return attrs.evolve(self, separating=True)

    def with_zero_dim(self, name: str) -> InputPlan:
        """This plan, where tensor argument ``name`` is 0-dim and of a higher promotion category
        than the others, which have one dimension or more (then the 0-dim one sets the result's
        category, and its dtype is not the result's)."""
        dtypes = self.param_dtypes(name)
        top = max(_category(d) for d in dtypes)
        configs = tuple(c for c in self.configs if _category(c.dtype) < top and c.rank >= 1)
        return attrs.evolve(self, zero_dim=name, configs=configs or self.configs,
                            zero_dim_dtypes=tuple(d for d in dtypes if _category(d) == top))

    def with_smaller(self, name: str) -> InputPlan:
        """This plan, where tensor argument ``name`` always has fewer dimensions than the others
        (when they have any); drawn only at the ranks where an accepted shape relation drops
        dimensions of ``name`` (:data:`SMALLER_AT_ITS_RANKS`), when there are such ranks."""
        ranks = {rank for rank, relations in self.ranked_relations.items()
                 if any(relation.get(name, 0) >= 1 for relation in relations)}
        configs = tuple(c for c in self.configs if c.rank in ranks) if SMALLER_AT_ITS_RANKS else ()
        return attrs.evolve(self, smaller=name, configs=configs or self.configs)

    def only(self, dtype: torch.dtype) -> InputPlan:
        """This plan, drawing tensors of ``dtype`` only (where the domain does not fix them)."""
        return attrs.evolve(self, configs=tuple(c for c in self.configs if c.dtype == dtype))

    def ranks(self, dtype: torch.dtype) -> tuple[int, ...]:
        """Ranks on which the pattern was seen to run for ``dtype``, ascending."""
        return tuple(c.rank for c in self.configs if c.dtype == dtype)

    def strategy(self) -> SearchStrategy[dict[str, Any]]:
        return _valid_inputs(self)


@_reused
@st.composite
def _modules(draw: Any, plan: InputPlan) -> dict[str, nn.Module]:
    if not plan.modules:
        return {}
    width = draw(st.integers(*plan.domain.sides), label="module width")
    out: dict[str, nn.Module] = {}
    for param in _module_order(plan):
        source = plan.domain.modules.get(param.name)
        if isinstance(source, SearchStrategy):
            module = draw(source)
        else:
            kernel = draw(st.integers(1, min(3, max(1, width))))
            bias = draw(st.booleans())
            seed = draw(st.integers(0, 2**16 - 1))
            attributes = draw(_module_attributes(param.annotation, width)) if source is None else {}
            make = source if source is not None else functools.partial(
                default_module, param.annotation, width=width, kernel=kernel, bias=bias, attributes=attributes)
            if isinstance(source, DependentFactory):  # the modules it names, drawn before it
                make = functools.partial(source, **out)
            module = _seeded(seed, make)
        if not isinstance(module, param.annotation):
            raise RuleDefinitionError(
                f"{plan.where}: the module drawn for '{param.name}' is a {type(module).__name__}, "
                f"not a {param.annotation.__name__}; fix domain['modules']['{param.name}'].")
        out[param.name] = module
    return {p.name: out[p.name] for p in plan.modules}


def _module_order(plan: InputPlan) -> list[Param]:
    """The module captures in the order they are drawn (:func:`~fxrewrite.domain.build_order`)."""
    by_name = {p.name: p for p in plan.modules}
    return [by_name[name] for name in build_order(list(by_name), plan.domain.modules)]


@_reused
@st.composite
def _module_attributes(draw: Any, cls: type[nn.Module], width: int) -> dict[str, Any]:
    """Constructor attributes of a default module, each shrinking to the constructor's default:
    ``groups`` (a divisor of the width), ``stride``, ``padding``, ``dilation`` and, for a transposed
    conv, ``output_padding`` for convolutions; ``eps`` for normalizations (``momentum`` does not
    matter in eval mode)."""
    if issubclass(cls, nn.modules.conv._ConvNd):
        out = {"groups": draw(st.sampled_from([g for g in range(1, width + 1) if width % g == 0]), label="groups"),
               "stride": draw(st.sampled_from([1, 2])), "padding": draw(st.sampled_from([0, 1])),
               "dilation": draw(st.sampled_from([1, 2]))}
        if issubclass(cls, nn.modules.conv._ConvTransposeNd):
            extra = draw(st.sampled_from([0, 1]))
            out["output_padding"] = extra if extra < max(out["stride"], out["dilation"]) else 0
        return out
    if issubclass(cls, (nn.modules.batchnorm._NormBase, nn.LayerNorm, nn.GroupNorm)):
        return {"eps": draw(st.sampled_from([1e-5, 1e-3, 0.1]), label="eps")}
    return {}


def _base_shape(plan: InputPlan, shape: Sequence[int], modules: Mapping[str, nn.Module]) -> tuple[int, ...]:
    module = next(iter(plan.consumers.values()), None)
    return fit_input_shape(modules[module], shape) if module is not None else tuple(shape)


#: Which dimensions of a broadcast shape are 1, drawn as one integer (a bit per dimension): one
#: choice instead of one per dimension, and shapes with size-1 dimensions beside equal ranks are
#: drawn more often (the list drew them in 2 to 7 of 300 inputs of two tensors, the integer in ~20); False is
#: the slow twin, a list of booleans.
ONES_AS_BITS = True


def _ones(draw: Any, max_rank: int) -> list[bool]:
    if ONES_AS_BITS:
        bits = draw(st.integers(0, 2**max_rank - 1))
        return [bool(bits >> i & 1) for i in range(max_rank)]
    return list(draw(st.lists(st.booleans(), min_size=max_rank, max_size=max_rank)))


@_reused
@st.composite
def _related_shape(draw: Any, base: tuple[int, ...], max_rank: int, smaller: bool) -> tuple[int, ...]:
    """``base``, or (shrinking towards ``base``) a shape that broadcasts to it: leading
    dimensions dropped, some dimensions set to 1 (``smaller``: always at least one dimension
    dropped). The draws do not depend on ``base``'s rank, so the shrinker can remove a dimension
    without disturbing what is drawn after."""
    broadcast = draw(st.booleans(), label="broadcast")
    drop = draw(st.integers(0, max_rank))
    ones = _ones(draw, max_rank)
    if smaller:
        broadcast, drop = True, max(drop, 1)
    if not broadcast:
        return base
    kept = base[min(drop, len(base)):]
    return tuple(1 if one else side for one, side in zip(ones, kept, strict=False))


@_reused
@st.composite
def _lean_related_shape(draw: Any, base: tuple[int, ...], max_rank: int, smaller: bool) -> tuple[int, ...]:
    """:func:`_related_shape` with fewer choices when the shape is ``base``: how it broadcasts is
    drawn only when it does (a third of the choices of a layout, drawn up to
    :data:`MAX_LAYOUT_TRIES` times per input). For layouts drawn before values, whose pinned
    shrinks do not depend on the order of each tensor's draws."""
    broadcast = smaller or draw(st.booleans(), label="broadcast")
    if not broadcast:
        return base
    drop = draw(st.integers(0, max_rank))
    ones = _ones(draw, max_rank)
    kept = base[min(max(drop, 1) if smaller else drop, len(base)):]
    return tuple(1 if one else side for one, side in zip(ones, kept, strict=False))


def _tensor_dtypes(plan: InputPlan, param: Param) -> tuple[torch.dtype, ...]:
    own = plan.domain.tensor_domain(param.name).dtypes
    return own if own is not None else (plan.param_dtypes(param.name) or plan.domain.dtypes)


def _argument_dtype(draw: Any, plan: InputPlan, config: _Config, param: Param, mixed: bool) -> torch.dtype:
    own = plan.domain.tensor_domain(param.name).dtypes
    if own is not None:
        return draw(_sampled(own))
    if param.name == plan.zero_dim:
        return draw(_sampled(plan.zero_dim_dtypes))
    if param.name == plan.own_dtype:
        others = [d for d in _tensor_dtypes(plan, param) if d != config.dtype]
        return draw(_sampled(tuple(others))) if others else config.dtype
    if mixed:
        return draw(_sampled(_tensor_dtypes(plan, param)))
    return dict(config.overrides).get(param.name, config.dtype)


def _edge_rows(draw: Any, t: torch.Tensor, low: float | None, high: float | None, special: bool) -> torch.Tensor:
    """Masks go wrong on rows that mask everything: sometimes one row (or, for a vector, all
    of it) of a bool tensor is all False, or a float tensor's row all its most negative value
    (``finfo.min``, as additive masks write, or ``-inf``); sometimes the whole tensor is.
    Drawn with the tensor's own ``draw``, not as a strategy of its own: a strategy made for
    each tensor cost ~85 µs to make ready, 7% of the attention rules' checks."""
    if t.dim() == 0 or t.numel() == 0 or not (t.dtype == torch.bool or t.dtype.is_floating_point):
        return t
    edge = draw(st.integers(0, 5), label="edge rows")
    if edge not in (1, 2):
        return t
    if t.dtype == torch.bool:
        value: Any = False
    else:
        options = [torch.finfo(t.dtype).min, *([-math.inf] if special else [])]
        kept = [v for v in options if (low is None or v >= low) and (high is None or v <= high)]
        if not kept:
            return t
        value = draw(_sampled(tuple(kept)))
    t = t.clone()
    if edge == 2 or t.dim() == 1:
        t.fill_(value)
    else:
        t[..., draw(st.integers(0, t.shape[-2] - 1)), :] = value
    return t


@attrs.frozen
class _Layout:
    """What a tensor argument's metadata will be, drawn before its values: shape, dtype and
    whether it is laid out transposed. Guards see only this (and literals and modules)."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    transposed: bool


def _tensor_choices(draw: Any, plan: InputPlan) -> tuple[bool, str | None]:
    """Whether the tensor arguments mix dtypes, and which one takes a dtype of its own."""
    mixed = plan.domain.mixed_dtypes and len(plan.tensors) > 1 and draw(st.booleans(), label="mixed dtypes")
    mixed = mixed and plan.zero_dim is None
    # with three tensor arguments or more, one of them takes a dtype of its own (q, k, v stay alike)
    names = [p.name for p in plan.tensors]
    deviant = draw(_sampled(tuple(names)), label="own dtype") if mixed and len(names) > 2 else None
    if plan.own_dtype is not None:
        mixed, deviant = False, plan.own_dtype
    return mixed, deviant


def _tensor_shape(draw: Any, plan: InputPlan, param: Param, base: tuple[int, ...], *,
                  lean: bool = False) -> tuple[int, ...]:
    own = plan.domain.tensor_domain(param.name)
    fixed = own.shape if own.shape is not None else base
    smaller = param.name == plan.smaller
    related = _lean_related_shape if lean else _related_shape
    shape = draw(related(base, plan.domain.ranks[1], smaller)) if param.name in plan.broadcastable else fixed
    return () if param.name == plan.zero_dim else shape


def _tensor_values(draw: Any, plan: InputPlan, param: Param, layout: _Layout,
                   drawn_values: dict[Any, list[Any]], capped: bool = False) -> torch.Tensor:
    """The tensor of ``layout`` for ``param``: its values drawn (sometimes those of an earlier
    tensor of its dtype; ``capped``: no more than it holds), a mask's edge rows, then its layout."""
    own = plan.domain.tensor_domain(param.name)
    shape, dtype = layout.shape, layout.dtype
    values = draw(_value_lists(dtype, math.prod(shape), own.min_value, own.max_value, own.special_values,
                               plan.separates_dtypes, plan.separating, capped))
    # only between tensors whose values are drawn alike (another's bounds would be broken)
    kind = (dtype, own.min_value, own.max_value, own.special_values)
    earlier = drawn_values.get(kind)
    if earlier and draw(st.integers(0, 3), label="same values") == 1:  # x / x, x - x: one value twice
        values = [earlier[i % len(earlier)] for i in range(len(values))]
    drawn_values.setdefault(kind, values)
    t = _build_tensor(values, shape, dtype)
    if len(plan.tensors) > 1:  # a mask masks something else
        t = _edge_rows(draw, t, own.min_value, own.max_value, own.special_values)
    return _laid_out(t, layout.transposed)


def _laid_out(t: torch.Tensor, transposed: bool) -> torch.Tensor:
    return _non_contiguous(t) if transposed and t.dim() >= 2 and min(t.shape[-2:]) > 1 else t


@_reused
@st.composite
def _tensor_inputs(draw: Any, plan: InputPlan, config: _Config, base: tuple[int, ...]) -> dict[str, torch.Tensor]:
    """The tensor arguments: by default all of ``base``'s shape and ``config``'s dtype; shrinking
    leads there from shapes that broadcast to ``base`` and from mixed dtypes. Each tensor's
    layout and values are drawn together (the order the pinned shrinks of unguarded rules
    depend on); :func:`_tensor_layouts` draws the layouts alone, for guarded rules."""
    mixed, deviant = _tensor_choices(draw, plan)
    out = {}
    drawn_values: dict[Any, list[Any]] = {}
    for param in plan.tensors:
        shape = _tensor_shape(draw, plan, param, base)
        dtype = _argument_dtype(draw, plan, config, param, mixed and deviant in (None, param.name))
        layout = _Layout(shape, dtype, False)
        t = _tensor_values(draw, plan, param, layout, drawn_values)
        transposed = plan.domain.non_contiguous and draw(st.booleans(), label="non-contiguous")
        out[param.name] = _laid_out(t, transposed)
    return out


@_reused
@st.composite
def _tensor_layouts(draw: Any, plan: InputPlan, config: _Config, base: tuple[int, ...]) -> dict[str, _Layout]:
    """The tensor arguments' layouts (shape, dtype, transposed), drawn as :func:`_tensor_inputs`
    draws them, without their values."""
    mixed, deviant = _tensor_choices(draw, plan)
    # three draws in four: how the shapes relate, one of the relations the guards accept
    relations = [r for r in _relations_for(plan, len(base)) if plan.smaller is None or r.get(plan.smaller, 1) >= 1]
    drops = relations[draw(st.integers(0, len(relations) - 1))] if relations and draw(
        st.integers(0, 3), label="accepted relation") else None
    transposed = _transposed_bits(draw, plan) if TRANSPOSED_AS_BITS else None
    out = {}
    for i, param in enumerate(plan.tensors):
        if drops is not None and param.name in drops:
            drop = drops[param.name]
            shape = () if param.name == plan.zero_dim else base[min(drop, len(base)):]
        else:
            shape = _tensor_shape(draw, plan, param, base, lean=True)
        dtype = _argument_dtype(draw, plan, config, param, mixed and deviant in (None, param.name))
        if transposed is None:
            laid_out = plan.domain.non_contiguous and draw(st.booleans(), label="non-contiguous")
        else:
            laid_out = bool(transposed >> i & 1)
        out[param.name] = _Layout(shape, dtype, laid_out)
    return out


#: Which tensor arguments of a layout are laid out transposed, drawn as one integer (a bit per
#: tensor) before their shapes: one choice per try instead of one per tensor (9% of the choices
#: of the attention rules' checks, whose five tensors are drawn up to :data:`MAX_LAYOUT_TRIES`
#: times per input). False is the slow twin: a boolean after each tensor's shape and dtype.
TRANSPOSED_AS_BITS = True


def _transposed_bits(draw: Any, plan: InputPlan) -> int:
    if not plan.domain.non_contiguous:
        return 0
    return draw(st.integers(0, 2 ** len(plan.tensors) - 1), label="non-contiguous")


#: At most this many shape relations are tried per rule when its plan is made.
MAX_RELATIONS_TRIED = 128


def _fixed_shape(plan: InputPlan, param: Param, base: tuple[int, ...]) -> tuple[int, ...]:
    own = plan.domain.tensor_domain(param.name).shape
    return own if own is not None else base


def _stand_in_dtype(plan: InputPlan, config: _Config, param: Param) -> torch.dtype:
    own = plan.domain.tensor_domain(param.name).dtypes
    return own[0] if own else dict(config.overrides).get(param.name, config.dtype)


#: Relations are drawn among those accepted on a base shape of the drawn rank
#: (:attr:`InputPlan.ranked_relations`): drawn among those of every rank, a relation accepted at
#: rank 4 (``c`` and ``x`` two dimensions dropped) dropped ``x``'s only two at rank 2 and the
#: guard refused it (``attention_where_mask_to_additive``: most relations of a rank-2 draw).
#: False is the slow twin: the relations of every rank, at any rank.
RELATIONS_BY_RANK = True


def _relations_for(plan: InputPlan, rank: int) -> tuple[Mapping[str, int], ...]:
    """The relations drawn on a base shape of ``rank`` dimensions."""
    if RELATIONS_BY_RANK and plan.ranked_relations:
        return plan.ranked_relations.get(rank, ())
    return plan.relations


def accepted_relations(plan: InputPlan) -> tuple[Mapping[str, int], ...]:
    """How the shapes of the broadcastable tensor arguments may relate to the base shape so
    that the pattern runs and the guards hold, for a rule with guards and no literal or module
    captures: each a ``{name: leading dimensions dropped}``, tried on stand-in tensors of a
    square base shape of each rank the pattern runs on, fewest dropped first (what shrinking prefers). The drawing
    then takes one of them three times in four, so a guard such as "``b`` is a vector of
    ``w.shape[0]`` elements" holds by construction instead of by luck (``linear_add_bias``
    rejected 93% of its draws); the fourth draw relates the shapes freely, as before."""
    return relations_of_every_rank(relations_by_rank(plan))


def relations_of_every_rank(ranked: Mapping[int, tuple[Mapping[str, int], ...]]) -> tuple[Mapping[str, int], ...]:
    """The relations of ``ranked`` (:func:`relations_by_rank`), each once, fewest dropped first."""
    combos = {tuple(r.values()): r for relations in ranked.values() for r in relations}
    return tuple(combos[c] for c in sorted(combos, key=lambda c: (sum(c), c)))


def relations_by_rank(plan: InputPlan) -> dict[int, tuple[Mapping[str, int], ...]]:
    """:func:`accepted_relations` by the rank of the base shape on which each was accepted
    (on stand-ins of any of the plan's dtypes at that rank), fewest dropped first."""
    names = plan.broadcastable
    literals = _stand_in_literals(plan)
    if (plan.harness is None and not plan.refusing) or literals is None or not names or plan.modules:
        return {}
    found: dict[int, dict[tuple[int, ...], None]] = {}
    for config in plan.configs:
        base = (2,) * config.rank
        combos = sorted(itertools.product(range(config.rank + 1), repeat=len(names)), key=lambda c: (sum(c), c))
        accepted = found.setdefault(config.rank, {})
        for combo in combos[:MAX_RELATIONS_TRIED]:
            if combo in accepted:  # accepted on another dtype: one is enough
                continue
            layouts = {p.name: _Layout(_fixed_shape(plan, p, base), _stand_in_dtype(plan, config, p), False)
                       for p in plan.tensors}
            layouts.update({n: attrs.evolve(layouts[n], shape=base[d:]) for n, d in zip(names, combo)})
            if not _layouts_refused(plan, layouts, literals, {}):
                accepted.setdefault(combo)
    return {rank: tuple(dict(zip(names, c)) for c in sorted(combos, key=lambda c: (sum(c), c)))
            for rank, combos in sorted(found.items()) if combos}


#: Relations are also found for rules whose literal captures all have values listed in the
#: domain (the attention rules' scale ``s``), tried with the first listed value of each; False
#: is the slow twin: only rules without literal captures.
RELATIONS_WITH_LITERALS = True


def _stand_in_literals(plan: InputPlan) -> dict[str, Any] | None:
    """The literal captures :func:`accepted_relations` tries shapes with (none for a rule
    without), or None when some literal's values are not listed in the domain."""
    if not plan.literals:
        return {}
    if not RELATIONS_WITH_LITERALS:
        return None
    declared = {p.name: plan.domain.literals.get(p.name) for p in plan.literals}
    firsts = {name: values[0] for name, values in declared.items() if isinstance(values, (tuple, list)) and values}
    return firsts if len(firsts) == len(declared) else None


def _shape_varies(plan: InputPlan, param: Param) -> bool:
    """Whether ``param``'s shape may differ from the base shape (else it is the base shape, or
    the shape its domain fixes)."""
    return (plan.domain.shapes == "broadcast" and param.name not in plan.consumers
            and plan.domain.tensor_domain(param.name).shape is None)


@_reused
def _literal_strategy(plan: InputPlan, param: Param) -> SearchStrategy[Any]:
    declared = plan.domain.literals.get(param.name)
    if declared is not None:
        return _as_strategy(declared, name=f"{plan.where}: domain['literals']['{param.name}']", kind=(str, bytes))
    if param.optional:  # an absent optional argument is a value to try too
        return st.one_of(st.none(), _literal_strategy(plan, attrs.evolve(param, optional=False)))
    ann = param.annotation
    if ann is bool:
        return st.booleans()
    if ann is int:
        return st.integers(-4, 4)
    if ann is float:
        non_finite = st.sampled_from([math.inf, -math.inf, math.nan]) if plan.domain.special_values else st.nothing()
        return st.one_of(st.sampled_from([0.0, 1.0, -1.0, 0.5, 2.0, -0.0]), non_finite, st.floats(-10.0, 10.0))
    if ann is str:
        return st.sampled_from(_STRING_LITERALS)
    return st.sampled_from(_DTYPE_LITERALS)


def _index_literals(plan: InputPlan) -> list[str]:
    """The ``int`` literal captures whose values the domain does not declare: when there are
    several, they are often the dims of one op (``permute``, ``transpose``, ``movedim``)."""
    return [p.name for p in plan.literals if p.annotation is int and p.name not in plan.domain.literals]


def _index_groups(plan: InputPlan, fitted: Mapping[str, Any] = {}) -> list[list[str]]:
    """:func:`_index_literals` not in ``fitted`` grouped by the op of the pattern that takes them
    (the dims of one ``permute``), in the order of the captures; one group when a single op
    takes them all."""
    group = [name for name in _index_literals(plan) if name not in fitted]
    placeholders = plan.rule.compiled.placeholders
    owner: dict[str, Any] = {}
    for name in group:
        users = list(placeholders[name].users) if name in placeholders else []
        owner[name] = users[0] if users else name
    groups: dict[Any, list[str]] = {}
    for name in group:
        groups.setdefault(owner[name], []).append(name)
    return list(groups.values())


#: Literal captures whose values the domain lists, several to one op, are drawn half the time
#: as one column of those lists (the i-th value of each): a rule lists each position's values
#: in the permutations it means (``permute_permute_5d`` lists two per dim, and independent draws
#: gave a valid pair of permutations in under a fifth of its inputs). False is the slow twin:
#: each drawn on its own, always.
DECLARED_COLUMNS = True


@functools.lru_cache(maxsize=256)
def _declared_columns(plan: InputPlan) -> tuple[tuple[tuple[str, ...], int], ...]:
    """Groups of literal captures taken by one op of the pattern whose domain lists the same
    number (2 or more) of values for each, with that number."""
    listed = {p.name: len(values) for p in plan.literals
              if isinstance(values := plan.domain.literals.get(p.name), (tuple, list)) and len(values) > 1}
    placeholders = plan.rule.compiled.placeholders
    groups: dict[Any, list[str]] = {}
    for name, size in listed.items():
        users = list(placeholders[name].users) if name in placeholders else []
        groups.setdefault((users[0] if users else name, size), []).append(name)
    return tuple((tuple(names), size) for (_, size), names in groups.items() if len(names) > 1)


def _column_values(draw: Any, plan: InputPlan, columns: tuple[tuple[tuple[str, ...], int], ...],
                   fitted: Mapping[str, Any]) -> dict[str, Any]:
    """The literal captures, each group of ``columns`` one column of its declared values, those
    of ``fitted`` as given, the others drawn on their own."""
    chosen: dict[str, Any] = dict(fitted)
    for names, size in columns:
        index = draw(st.integers(0, size - 1), label="declared column")
        chosen.update({name: plan.domain.literals[name][index] for name in names})
    return {p.name: chosen[p.name] if p.name in chosen else draw(_literal_strategy(plan, p)) for p in plan.literals}


#: The sizes of a ``view``/``reshape`` whose sizes are all ``int`` literal captures are drawn
#: three times in four among the size tuples that fit its input's number of elements
#: (:func:`~fxrewrite.testing._sizes.fitting_sizes`): drawn one by one, ``reshape4_reshape4``'s
#: layouts were refused 5 times in 6. False is the slow twin: the sizes drawn as other literals.
FITTED_SIZES = True

#: Values an undeclared ``int`` size is fitted from (its own draws are -4 to 4: below -1 never fits).
_UNDECLARED_SIZES = (-1, 0, 1, 2, 3, 4)


@functools.lru_cache(maxsize=256)
def _sized_ops(plan: InputPlan) -> tuple[tuple[SizedOp, tuple[tuple[int, ...], ...]], ...]:
    """The plan's sized ops (:func:`~fxrewrite.testing._sizes.sized_ops`) whose sizes have
    listed values (or none declared), each with the candidates of each size."""
    ints = [p.name for p in plan.literals if p.annotation is int and not p.optional]
    out = []
    for op in sized_ops(plan.rule, ints, [p.name for p in plan.tensors]):
        declared = [plan.domain.literals.get(name, _UNDECLARED_SIZES) for name in op.names]
        if all(isinstance(d, (tuple, list)) and all(type(v) is int for v in d) for d in declared):
            out.append((op, tuple(tuple(d) for d in declared)))
    return tuple(out)


def _fitted_sizes(draw: Any, plan: InputPlan, numels: Sequence[int]) -> dict[str, int]:
    """The sizes of the plan's sized ops, fitted to ``numels`` (each op's input's number of
    elements) three times in four; nothing the fourth time, or for a plan without sized ops."""
    sized = _sized_ops(plan) if FITTED_SIZES and numels else ()
    if not sized or not draw(st.integers(0, 3), label="fitted sizes"):
        return {}
    fitted: dict[str, int] = {}
    for (op, candidates), numel in zip(sized, numels):
        fits = fitting_sizes(candidates, numel)
        if fits:
            fitted.update(zip(op.names, draw(_sampled(fits))))
    return fitted


def _numels(plan: InputPlan, layouts: Mapping[str, _Layout]) -> tuple[int, ...]:
    """The number of elements of each sized op's input, by ``layouts``."""
    return tuple(math.prod(layouts[op.source].shape) for op, _ in _sized_ops(plan)) if FITTED_SIZES else ()


@_reused
@st.composite
def _literal_values(draw: Any, plan: InputPlan, base: Sequence[int] = (),
                    numels: tuple[int, ...] = ()) -> dict[str, Any]:
    """The literal captures: each drawn on its own, or (when there are several undeclared
    ``int`` captures) as a permutation of ``range(n)``, each index possibly counted from the
    end: every permutation of a small rank is drawn, which independent draws hardly hit; or as
    sizes that add up to one of the ``base`` shape's sides (split sizes, narrow's start and
    length), which independent draws hit as rarely. The sizes of a view or reshape are first
    fitted to ``numels`` (:func:`_fitted_sizes`)."""
    fitted = _fitted_sizes(draw, plan, numels)
    columns = _declared_columns(plan) if DECLARED_COLUMNS else ()
    columns = tuple(c for c in columns if not set(c[0]) & fitted.keys())
    if columns and draw(st.booleans(), label="declared columns"):
        values = _column_values(draw, plan, columns, fitted)
    else:
        values = {p.name: fitted[p.name] if p.name in fitted else draw(_literal_strategy(plan, p))
                  for p in plan.literals}
    dtypes = [p.name for p in plan.literals if p.annotation is torch.dtype and p.name not in plan.domain.literals]
    if len(dtypes) > 1 and (plan.separating or draw(st.booleans(), label="dtype pair")):
        values.update(zip(dtypes, draw(st.sampled_from(_DTYPE_PAIRS))))
    group = [name for name in _index_literals(plan) if name not in fitted]
    if len(group) > 1 and draw(st.booleans(), label="permutation"):
        for dims in _index_groups(plan, fitted):  # the dims of each op: permute(p).permute(q) is two permutations
            order = draw(st.permutations(range(len(dims))))
            from_end = draw(st.lists(st.booleans(), min_size=len(dims), max_size=len(dims)))
            values.update({name: i - len(dims) if neg else i for name, i, neg in zip(dims, order, from_end)})
    elif len(group) > 1 and base and draw(st.integers(0, 3), label="sizes of a side") == 1:
        side = draw(st.sampled_from(list(base)))
        cuts = sorted(draw(st.lists(st.integers(0, side), min_size=len(group) - 1, max_size=len(group) - 1)))
        values.update(zip(group, (end - start for start, end in zip([0, *cuts], [*cuts, side]))))
    return values


@_reused
@st.composite
def _skeleton(draw: Any, plan: InputPlan) -> tuple[_Config, tuple[int, ...], dict[str, nn.Module]]:
    """The configuration (dtype, rank), the base shape and the module captures of one draw."""
    drawn = draw(_skeleton_or_none(plan))
    if drawn is None:
        reject()
    return drawn


@_reused
@st.composite
def _skeleton_or_none(draw: Any, plan: InputPlan) -> tuple[_Config, tuple[int, ...], dict[str, nn.Module]] | None:
    """:func:`_skeleton`, or ``None`` when the drawn rank is one the pattern does not run on."""
    dtype = draw(_sampled(plan.dtypes))
    ranks = plan.ranks(dtype)
    modules = draw(_modules(plan))
    sides = draw(st.lists(st.integers(*plan.domain.sides), min_size=ranks[0], max_size=ranks[-1]))
    if len(sides) not in ranks:
        return None
    if draw(st.booleans(), label="square") and sides:
        sides = [sides[0]] * len(sides)  # matmul-like patterns need equal sizes
    return plan.config(dtype, len(sides)), _base_shape(plan, sides, modules), modules


@_reused
@st.composite
def _raw_inputs(draw: Any, plan: InputPlan) -> dict[str, Any]:
    config, base, modules = draw(_skeleton(plan))
    values = draw(_tensor_inputs(plan, config, base))
    literals = draw(_literal_values(plan, base))
    merged = {**values, **literals, **modules}
    return {p.name: merged[p.name] for p in plan.rule.compiled.params}


#: The layouts, literals and modules of one input, drawn before its values.
_Skeleton = tuple[dict[str, _Layout], dict[str, Any], dict[str, nn.Module]]

#: Layouts (with the literals and modules) drawn per input before it is rejected, when the
#: pattern or a guard refuses them on stand-in tensors (:func:`_layouts_first`).
MAX_LAYOUT_TRIES = 8


@_reused
@st.composite
def _layouts_first(draw: Any, plan: InputPlan) -> dict[str, Any]:
    """The layouts of the tensors and the literals first, then the pattern and the guards tried
    on stand-in tensors of those layouts (:func:`_layouts_refused`), and only if they may
    accept them, the values. A refused draw is drawn again (up to :data:`MAX_LAYOUT_TRIES`
    times) inside the same input, so that Hypothesis neither pays for values nor starts a new
    test case for it: what is drawn is the same as rejecting and drawing anew (the accepted
    layouts, in the same proportions), at the cost of a few choices per refusal. Values were
    70% of the checker's time, and ``linear_add_bias``'s guard refused 93% of its draws,
    ``reshape4_reshape4``'s pattern 93% of its literals. A try that repeats the refused try
    before it rejects the input (:data:`REPEATED_REFUSAL_REJECTS`). :func:`_raw_inputs` is the
    same draw, each tensor's values with its layout."""
    refused: _Refused | None = None
    for _ in range(MAX_LAYOUT_TRIES):
        drawn = draw(_accepted_layouts(plan))
        if not isinstance(drawn, _Refused):
            break
        plan.counts.layouts_refused += 1
        if REPEATED_REFUSAL_REJECTS and drawn.key is not None and refused is not None and drawn.key == refused.key:
            reject()
        refused = drawn
    else:
        reject()
    layouts, literals, modules = drawn
    drawn_values: dict[Any, list[Any]] = {}
    values = {p.name: _tensor_values(draw, plan, p, layouts[p.name], drawn_values, capped=True) for p in plan.tensors}
    merged = {**values, **literals, **modules}
    return {p.name: merged[p.name] for p in plan.rule.compiled.params}


#: An input whose try draws the very layouts and literals its previous try drew, and had refused,
#: is rejected at once: Hypothesis is then filling the input's choices with their simplest
#: values (it starts each search with such inputs, up to six of them), and every further try
#: would draw them again. A third of the checker's refused tries were such repeats, eight per
#: input (``view4_view3``: 184 of its 252). False is the slow twin: all
#: :data:`MAX_LAYOUT_TRIES` tries are drawn.
REPEATED_REFUSAL_REJECTS = True


@attrs.frozen
class _Refused:
    """A try of :func:`_layouts_first` the pattern or a guard refused: ``key`` tells the layouts
    and literals apart (``None`` when the try has module captures, or no layouts were drawn)."""

    key: Any = None


@_reused
@st.composite
def _accepted_layouts(draw: Any, plan: InputPlan) -> _Skeleton | _Refused:
    """One try of :func:`_layouts_first`: the layouts, literals and modules, or :class:`_Refused`
    when the pattern or a guard refuses them whatever the values (its own span, so the shrinker
    can drop a refused try whole)."""
    skeleton = draw(_skeleton_or_none(plan))
    if skeleton is None:
        return _Refused()
    config, base, modules = skeleton
    layouts = draw(_tensor_layouts(plan, config, base))
    literals = draw(_literal_values(plan, base, _numels(plan, layouts)))
    if not _layouts_refused(plan, layouts, literals, modules):
        return layouts, literals, modules
    return _Refused(None if modules else _refusal_key(layouts, literals))


class _Admitted(Exception):
    """Ends :func:`admits_inputs`' search at the first accepted layout."""


def admits_inputs(plan: InputPlan, tries: int = 2 * MAX_LAYOUT_TRIES) -> bool:
    """Whether any of ``tries`` drawn layouts (with literals and modules) is accepted on stand-in
    tensors: a focused search whose focus the pattern cannot run on (``q`` of another dtype than
    ``k``) is skipped instead of drawing :data:`MAX_LAYOUT_TRIES` refused layouts for each of the
    inputs Hypothesis tries before it gives up. Stops at the first accepted layout; always True
    for a plan that does not draw layouts first."""
    if not _draws_layouts_first(plan) or _admitted_by_relations(plan):
        return True

    def body(drawn: Any) -> None:
        if not isinstance(drawn, _Refused):
            raise _Admitted

    test = settings(max_examples=tries, database=None, derandomize=True, deadline=None,
                    phases=(Phase.generate,), suppress_health_check=list(HealthCheck),
                    verbosity=Verbosity.quiet)(given(_accepted_layouts(plan))(body))
    try:
        with own_constants_only():
            test()
    except _Admitted:
        return True
    return False


#: A focus that only makes one tensor argument smaller (:meth:`InputPlan.with_smaller`) admits
#: inputs when a shape relation the plan accepts drops a dimension of that tensor: the relation
#: was accepted on stand-ins, and is drawn three times in four. Skips :func:`admits_inputs`' search
#: (a Hypothesis run each, ~2% of the checker's time). False is the slow twin: always the search.
ADMITTED_BY_RELATIONS = True


def _admitted_by_relations(plan: InputPlan) -> bool:
    if not ADMITTED_BY_RELATIONS or plan.smaller is None or plan.zero_dim or plan.own_dtype or plan.separating:
        return False
    return any(relation.get(plan.smaller, 0) >= 1 for relations in plan.ranked_relations.values()
               for relation in relations)


def _stand_in(layout: _Layout, fill: float) -> torch.Tensor:
    return _laid_out(torch.full(layout.shape, fill, dtype=layout.dtype), layout.transposed)


def _layouts_refused(plan: InputPlan, layouts: Mapping[str, _Layout], literals: Mapping[str, Any],
                     modules: Mapping[str, nn.Module]) -> bool:
    """True when no values of ``layouts`` can be accepted: the pattern raises on stand-in
    tensors of ones and of zeros alike (a shape the op refuses, not a value: an index out of
    range or an integer division by zero raises on one of them only), or it runs on ones and a
    guard returns False there (guards read shapes, dtypes and layouts, never values). A guard
    that raises concludes nothing: the values are drawn and :func:`accepts` decides.
    Remembered per layouts and literals (draws with module captures are not remembered)."""
    key = None
    if not modules:
        key = _refusal_key(layouts, literals)
        known = plan.counts.refused.get(key)
        if known is not None:
            return known
    refused = _refused_on_stand_ins(plan, layouts, {**literals, **modules})
    if key is not None:
        plan.counts.refused[key] = refused
    return refused


def _refusal_key(layouts: Mapping[str, _Layout], literals: Mapping[str, Any]) -> Any:
    """What tells tries apart for :func:`_layouts_refused`'s memo (the literals by ``repr``: a
    ``nan`` is equal to itself there, ``0.0`` and ``-0.0`` are not)."""
    return tuple(sorted(layouts.items())), repr(sorted(literals.items()))


def _refused_on_stand_ins(plan: InputPlan, layouts: Mapping[str, _Layout], others: Mapping[str, Any]) -> bool:
    ones = {**{name: _stand_in(layout, 1) for name, layout in layouts.items()}, **others}
    try:
        if plan.harness is None:
            call_rule_function(plan.rule.pattern, ones)
            return False
        failed = plan.rule.failing_guard(plan.harness.match(ones))
        return failed is not None and failed[1] is None
    except Exception:
        zeros = {**{name: _stand_in(layout, 0) for name, layout in layouts.items()}, **others}
        try:
            call_rule_function(plan.rule.pattern, zeros)
        except Exception:
            if plan.pattern_errors is not None:
                plan.pattern_errors.rejected(plan.rule, zeros)
            return True
        return False


def _draws_layouts_first(plan: InputPlan) -> bool:
    """Rules with guards, ``int`` literal captures or module captures draw layouts first: their
    guards read the tensors' shapes, dtypes and layouts, and their patterns refuse shapes that do
    not fit the literals (``reshape``, ``permute``, ``sum(x, d)``) or the modules. Rules whose
    literals are numbers the values meet (``(x * a) * b``) keep the plain draw: drawn after the
    literals, the extreme values their counterexamples need (an overflow at ``a = 2``) were no
    longer found in 300 examples. A refused layout is
    drawn again inside the input (:func:`_layouts_first`); rejecting the input instead made
    Hypothesis draw several times more (cheap refusals, Hypothesis' limit counts inputs). Rules
    with tensor arguments only and no guard keep the plain draw, each tensor's values with its
    layout: their patterns refuse few draws, and the pinned shrinks of their counterexamples
    depend on that order."""
    return (plan.harness is not None or bool(plan.modules) or any(p.annotation is int for p in plan.literals)
            or plan.refusing)


#: Rules without guards, modules or ``int`` literals whose patterns refuse a third or more of a
#: fixed grid of layouts on stand-ins (:func:`refuses_most_layouts`: ``x @ y`` 81%,
#: ``linear(x, w, b)`` 93%, ``x.view_as(y).view_as(z)`` 45%; elementwise patterns none) draw
#: layouts first, with the shape relations their patterns accept, as guarded rules do: their values
#: were drawn for 1.5 to 7 inputs per input kept (``contiguous_linear_bias`` kept 15% of its draws,
#: ``view_as_view_as`` 65%). False is the slow twin: they keep the plain draw.
LAYOUTS_FIRST_WHEN_REFUSED = True


def refuses_most_layouts(plan: InputPlan) -> bool:
    """Whether the pattern of a rule with two tensor arguments or more, drawn plainly
    (:func:`_draws_layouts_first`), refuses at least a third of a grid of layouts on stand-in
    tensors: at each rank it runs on for its first dtype, a square base shape and one of
    unequal sides, each with every tensor of that shape and then each broadcastable one 0-dim;
    and each tensor of another dtype than the others, on the square base shape. Elementwise
    patterns refuse none of them; ``x @ y`` refuses unequal inner sides, 0-dim operands and
    mixed dtypes."""
    if not LAYOUTS_FIRST_WHEN_REFUSED or len(plan.tensors) < 2 or _draws_layouts_first(plan) or not plan.configs:
        return False
    dtype = plan.dtypes[0]
    other = next((d for d in plan.dtypes if d != dtype), None)
    literals = _stand_in_literals(plan)
    if literals is None:
        return False
    refused = tried = 0
    for config in plan.configs:
        if config.dtype != dtype:
            continue
        for base in _unique([(2,) * config.rank, tuple(range(2, 2 + config.rank))]):
            layouts = {p.name: _Layout(_fixed_shape(plan, p, base), _stand_in_dtype(plan, config, p), False)
                       for p in plan.tensors}
            variants = [layouts, *({**layouts, n: attrs.evolve(layouts[n], shape=())} for n in plan.broadcastable)]
            if other is not None and plan.domain.mixed_dtypes and base == (2,) * config.rank:
                variants += [{**layouts, n: attrs.evolve(layouts[n], dtype=other)} for n in layouts
                             if plan.domain.tensor_domain(n).dtypes is None]
            refused += sum(_layouts_refused(plan, variant, literals, {}) for variant in variants)
            tried += len(variants)
    return 3 * refused >= tried > 0


@st.composite
def _valid_inputs(draw: Any, plan: InputPlan) -> dict[str, Any]:
    plan.counts.drawn += 1
    inputs = draw(_layouts_first(plan) if _draws_layouts_first(plan) else _raw_inputs(plan))
    if not accepts(plan, inputs, guard_errors="raise"):
        if plan.pattern_errors is not None:
            plan.pattern_errors.rejected(plan.rule, inputs)
        reject()
    plan.counts.kept += 1
    return inputs


def accepts(plan: InputPlan, inputs: Mapping[str, Any], *,
            guard_errors: Literal["raise", "reject", "accept"] = "reject") -> bool:
    """True when the pattern runs on ``inputs`` and every guard of the rule holds there.

    A guard that raises is a bug in the rule (a rewrite would fail on such a graph): with
    ``guard_errors="raise"`` it raises :class:`GuardRaised`; ``"reject"`` and ``"accept"`` say
    what such inputs count as.
    """
    rule = plan.rule
    if plan.harness is None:
        try:
            call_rule_function(rule.pattern, inputs)
        except Exception:
            return False
        return True
    try:
        match = plan.harness.match(inputs)
    except Exception:
        return False
    failed = rule.failing_guard(match)
    if failed is None:
        return True
    guard, exc = failed
    if exc is None:
        return False
    if guard_errors != "raise":
        return guard_errors == "accept"
    raise GuardRaised(
        f"rule '{rule.name}' ({rule.origin}): guard {_guard_name(guard)} raised "
        f"{type(exc).__name__}: {exc}", inputs, exc) from exc
