"""Strategies for values: numbers of a dtype (:func:`elements`), shapes (:func:`tensor_shapes`)
and tensors (:func:`tensors`). They know nothing of rules; the input plan builds on them.

Floats lean on the values that break rules (``0``, ``-0.0``, ``±inf``, ``nan``, the extremes,
subnormals, one ulp around powers of two: :func:`ulp_neighbours`), integers on their extremes and
on small masks. A tensor's values are a short drawn list repeated to its size
(``_value_lists``), so that the shrinker can drop values and dimensions independently.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Sequence
from typing import Any, Literal, cast

import hypothesis.strategies as st
import torch
from hypothesis.strategies import SearchStrategy

from ..domain import DEFAULT_DTYPES


def _width(dtype: torch.dtype) -> int:
    return {torch.float64: 64, torch.float16: 16}.get(dtype, 32)


def _representable(value: float, dtype: torch.dtype, *, up: bool) -> float:
    """The ``dtype`` value nearest to ``value`` on the inside of a bound (above it if ``up``):
    a tensor of ``dtype`` rounds every value between two such bounds to a value between them."""
    if dtype == torch.float64 or math.isinf(value):
        return value
    rounded = float(torch.tensor(value, dtype=torch.float64).to(dtype))
    if (up and rounded < value) or (not up and rounded > value):
        rounded = _next_float(dtype, rounded, math.inf if up else -math.inf)
    return rounded


def _float_bounds(dtype: torch.dtype, lo: float | None, hi: float | None) -> tuple[float, float]:
    """The smallest and largest finite ``dtype`` values within ``lo`` and ``hi`` (either may be
    ``None``: unbounded)."""
    info = torch.finfo(dtype)
    low = -info.max if lo is None else max(float(lo), -info.max)
    high = info.max if hi is None else min(float(hi), info.max)
    if lo is not None and hi is not None and lo > hi:
        raise ValueError(f"min_value={lo!r} is larger than max_value={hi!r} for {dtype}; swap them.")
    if low > high:  # both beyond the same end of the dtype's finite range
        raise ValueError(f"no finite {dtype} value lies between min_value={lo!r} and max_value={hi!r}.")
    low, high = _representable(low, dtype, up=True), _representable(high, dtype, up=False)
    if low > high:
        raise ValueError(f"no {dtype} value lies between min_value={lo!r} and max_value={hi!r}; widen the bounds "
                         f"to hold {low!r} or {high!r}.")
    return low, high


def _unique(values: Iterable[Any]) -> list[Any]:
    seen: set[tuple[str, Any]] = set()
    out = []
    for v in values:
        key = (repr(v), type(v).__name__)  # keeps 0.0 and -0.0, and nan, apart
        if key not in seen:
            seen.add(key)
            out.append(v)
    return out


#: Values that tell floating dtypes apart when a tensor is converted through them (drawn for rules
#: with dtype captures): representable in float16 but not in bfloat16 (``1 + 2**-8`` is a
#: bfloat16 tie, ``2001``, ``32800``), finite in bfloat16 but not in float16 (``65520`` and up),
#: the float16 maximum (bfloat16 rounds it to 65536, then float16 to inf), float16 subnormals and
#: values it flushes to 0, float32 subnormals, and values that round twice differently (float64
#: to float16 through float32: ``1 + 2**-11 + 2**-40``; to bfloat16: ``1 + 2**-8 + 2**-30``).
DTYPE_SEPARATORS: tuple[float, ...] = (
    1.00390625, 2001.0, 32800.0, 65504.0, 65520.0, 1.0e5, 1 + 2**-11 + 2**-40, 1 + 2**-8 + 2**-30,
    2.0**-24, 1.0e-8, 1.0e-40, 1 + 2**-8 + 2**-11, 2.0**24 + 1, 1 + 2**-30,
)


def _float_elements(dtype: torch.dtype, lo: float | None, hi: float | None, special: bool,
                    separate: bool = False) -> SearchStrategy[float]:
    info = torch.finfo(dtype)
    low, high = _float_bounds(dtype, lo, hi)
    simple = [0.0, 1.0, -1.0, -0.0, 0.5, 2.0, -2.0, info.eps / 2, -info.eps / 2, low, high]
    subnormal = _next_float(dtype, 0.0, math.inf)  # one ulp above 0: the smallest subnormal
    extreme = [info.max, -info.max, info.tiny, -info.tiny, subnormal, -subnormal]
    non_finite = st.sampled_from([math.inf, -math.inf, math.nan]) if special else st.nothing()
    bits = cast(Literal[16, 32, 64], _width(dtype))
    moderate = st.floats(max(low, -10.0), min(high, 10.0), width=bits) if low <= 10 and high >= -10 else st.nothing()
    wide = st.floats(low, high, width=bits, allow_nan=False, allow_infinity=False)
    groups = [_one_of_values(simple, low, high), _one_of_values(extreme, low, high), non_finite,
              _small_floats(info, low, high), moderate, wide, _one_of_values(ulp_neighbours(dtype), low, high)]
    if separate:
        groups.append(_one_of_values([v for x in DTYPE_SEPARATORS for v in (x, -x)], low, high))
    return st.one_of(*groups)


#: Exponents ``k`` whose powers of two ``2**k`` get their one-ulp neighbours drawn (rounding,
#: ``floor``/``log2``/``frexp`` and exponent tricks go wrong exactly there); out-of-range ones
#: are left out per dtype.
_POWER_EXPONENTS = (0, 1, -1, 2, 4, 8, 11, 16, 24, 31, 53, 63, 64, 100, -8, -24, -53, -100)


@functools.cache
def ulp_neighbours(dtype: torch.dtype) -> tuple[float, ...]:
    """Values one ulp around powers of two and around 0 for a floating ``dtype``, smallest
    magnitude first (the order shrinking prefers): the smallest subnormal, the largest
    subnormal, then ``2**k`` one ulp below and above, each with both signs, then one ulp below
    the largest finite value.

    >>> ulp_neighbours(torch.float32)[:2]
    (1.401298464324817e-45, -1.401298464324817e-45)
    >>> 0.9999999403953552 in ulp_neighbours(torch.float32) and 1.0000001192092896 in ulp_neighbours(torch.float32)
    True
    """
    info = torch.finfo(dtype)
    step = functools.partial(_next_float, dtype)
    out = [step(0.0, math.inf), step(info.tiny, 0.0)]
    for k in sorted(_POWER_EXPONENTS, key=abs):
        power = 2.0 ** k
        if info.tiny <= power <= info.max:
            out += [step(power, 0.0), step(power, math.inf)]
    out.append(step(info.max, 0.0))
    finite = [v for v in out if math.isfinite(v)]
    return tuple(_unique(v for value in finite for v in (value, -value)))


def _next_float(dtype: torch.dtype, value: float, towards: float) -> float:
    """The ``dtype`` value next to ``value`` in the direction of ``towards``."""
    return float(torch.nextafter(torch.tensor(value, dtype=dtype), torch.tensor(towards, dtype=dtype)))


def _one_of_values(values: Sequence[Any], low: float, high: float) -> SearchStrategy[Any]:
    """One of ``values`` that lie in ``[low, high]``, in order of preference."""
    kept = [v for v in _unique(values) if low <= v <= high]
    return st.sampled_from(kept) if kept else st.nothing()


def _small_floats(info: torch.finfo, low: float, high: float) -> SearchStrategy[float]:
    """Values close to 0 but not 0, log-uniform in magnitude between the smallest normal and
    0.1, of either sign: where ``1 + x``, ``exp(x) - 1`` and friends lose digits. Only the signs
    and magnitudes that ``[low, high]`` holds are drawn (bounds away from 0 hold none: drawn
    and filtered out, a value made the whole draw invalid)."""
    magnitudes = {sign: (max(info.tiny, least), min(0.1, most))
                  for sign, least, most in ((1.0, low, high), (-1.0, -high, -low))}
    held = {sign: bounds for sign, bounds in magnitudes.items() if bounds[0] <= bounds[1]}
    if not held:
        return st.nothing()
    bottom, top = min(b[0] for b in held.values()), max(b[1] for b in held.values())
    exponents = st.floats(math.log10(bottom), math.log10(top))
    values = st.tuples(exponents, st.sampled_from(list(held))).map(lambda t: t[1] * 10.0 ** t[0])
    return values.filter(lambda v: low <= v <= high)


def _whole_bounds(lo: float | None, hi: float | None, least: int, most: int) -> tuple[int, int]:
    """The least and greatest whole numbers in ``[least, most]`` within ``lo`` and ``hi`` (``None``
    or an infinite bound: no bound on that side); the first is the greater when there is none."""
    low = least if lo is None or lo < least else math.ceil(min(lo, most + 1))
    high = most if hi is None or hi > most else math.floor(max(hi, least - 1))
    return low, high


def _int_elements(dtype: torch.dtype, lo: float | None, hi: float | None) -> SearchStrategy[int]:
    info = torch.iinfo(dtype)
    low, high = _whole_bounds(lo, hi, info.min, info.max)
    if low > high:
        raise ValueError(f"no {dtype} value lies between min_value={lo!r} and max_value={hi!r}.")
    # 2**24 + 1 and 2**53 + 1 are the first integers that float32 and float64 cannot hold
    extreme = [info.max, info.min, 2**24 + 1, -(2**24 + 1), 2**53 + 1, -(2**53 + 1)]
    moderate = st.integers(max(low, -10), min(high, 10)) if low <= 10 and high >= -10 else st.nothing()
    return st.one_of(_one_of_values([0, 1, -1, 2, -2, low, high], low, high), _one_of_values(extreme, low, high),
                     moderate, st.integers(low, high))


#: The values of a tensor are drawn from :func:`elements` flattened (:class:`_FlatOneOf`): the
#: same choices, one span per value instead of three or more (the one-of's choice of group, then
#: the group's own draw). Hypothesis' cost is per draw, and a tensor's values were most of the
#: draws of an input (``one_of`` 5.6 ms per 43 values, flattened 2.2 ms). False is the slow twin:
#: the one-of strategy itself.
FLAT_ELEMENTS = True


class _FlatOneOf(SearchStrategy[Any]):
    """``st.one_of(branches)`` drawn with the same choices (the branch's index, then the branch's
    own) but without a span of its own for each: the branch's ``do_draw`` is called directly,
    skipping what ``data.draw`` does per strategy (validation, emptiness, unwrapping, a span).
    The shrinker and the mutator see one span per value, the choices are the one-of's."""

    def __init__(self, wrapped: SearchStrategy[Any], branches: Sequence[SearchStrategy[Any]]) -> None:
        super().__init__()
        self.wrapped = wrapped
        self.choices = tuple(branches)

    def __repr__(self) -> str:
        return f"flat({self.wrapped!r})"

    def do_validate(self) -> None:
        self.wrapped.validate()

    def do_draw(self, data: Any) -> Any:
        return self.choices[data.draw_integer(0, len(self.choices) - 1)].do_draw(data)


def _flat(strategy: SearchStrategy[Any]) -> SearchStrategy[Any]:
    """``strategy`` flattened (:class:`_FlatOneOf`) when it is a one-of of several non-empty
    branches, :data:`FLAT_ELEMENTS` is on, and this Hypothesis exposes what the flattening
    needs; else ``strategy`` itself."""
    if not FLAT_ELEMENTS:
        return strategy
    try:
        from hypothesis.strategies._internal.lazy import unwrap_strategies
        from hypothesis.strategies._internal.strategies import OneOfStrategy
    except ImportError:  # another Hypothesis: its internals moved
        return strategy
    unwrapped = unwrap_strategies(strategy)
    if not isinstance(unwrapped, OneOfStrategy):
        return strategy
    branches = [unwrap_strategies(b) for b in unwrapped.element_strategies]
    return _FlatOneOf(strategy, branches) if len(branches) > 1 else strategy


def elements(dtype: torch.dtype, *, min_value: float | None = None, max_value: float | None = None,
             special_values: bool = True, separate_dtypes: bool = False) -> SearchStrategy[Any]:
    """Python numbers that fit ``dtype``. Floats are drawn evenly from seven groups: simple values
    (``0``, ``±1``, ``-0.0``, ``0.5``, ``±2``, ``±eps/2`` (lost when added to 1), the bounds),
    extremes (``±max``, ``±`` the smallest normal, ``±`` the smallest subnormal), non-finite
    values, small values (smallest normal to ``0.1``, either sign), moderate values in
    ``[-10, 10]``, any value in range, and values one ulp around powers of two and around 0
    (:func:`ulp_neighbours`). Integers from four: simple values, extremes (``max``, ``min``,
    ``±(2**24 + 1)`` and ``±(2**53 + 1)``, which float32 and float64 cannot hold), ``[-10, 10]``
    and the range.
    ``min_value`` / ``max_value`` bound the finite values; ``special_values`` adds ``nan``,
    ``inf`` and ``-inf`` (floating dtypes only); ``separate_dtypes`` adds an eighth group of
    floats, :data:`DTYPE_SEPARATORS` (values that float16, bfloat16, float32 and float64 round
    differently).

    >>> from hypothesis import find
    >>> find(elements(torch.float32), lambda v: v != v)
    nan
    """
    if dtype == torch.bool:
        return st.booleans()
    if dtype.is_floating_point:
        return _float_elements(dtype, min_value, max_value, special_values, separate_dtypes)
    if dtype.is_complex:
        raise ValueError(f"{dtype}: complex tensors are not drawn yet; pass real dtypes.")
    return _int_elements(dtype, min_value, max_value)


# -- shapes and tensors ---------------------------------------------------------------------------


def tensor_shapes(*, min_rank: int = 0, max_rank: int = 4, min_side: int = 1,
                  max_side: int = 3) -> SearchStrategy[tuple[int, ...]]:
    """Shapes with ``min_rank..max_rank`` dimensions of ``min_side..max_side`` elements each;
    they shrink towards fewer and smaller dimensions.

    >>> from hypothesis import find
    >>> find(tensor_shapes(min_rank=2), lambda s: True)
    (1, 1)
    """
    return st.lists(st.integers(min_side, max_side), min_size=min_rank, max_size=max_rank).map(tuple)


def _as_strategy(value: Any, *, name: str, kind: type | tuple[type, ...]) -> SearchStrategy[Any]:
    if isinstance(value, SearchStrategy):
        return value
    if isinstance(value, kind):
        return st.just(value)
    values = tuple(value)
    if not values:
        raise ValueError(f"{name}: give at least one value.")
    return st.sampled_from(values)


def _build_tensor(values: list[Any], shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype).reshape(shape)


@st.composite
def _tensors(draw: Any, dtypes: SearchStrategy[torch.dtype], shapes: SearchStrategy[tuple[int, ...]],
             bounds: tuple[float | None, float | None], special_values: bool) -> torch.Tensor:
    dtype = draw(dtypes)
    shape = tuple(draw(shapes))
    size = math.prod(shape)
    lo, hi = bounds
    values = draw(_value_lists(dtype, size, lo, hi, special_values))
    return _build_tensor(values, shape, dtype)


#: At most this many distinct values are drawn per tensor; larger tensors repeat them.
MAX_DISTINCT_VALUES = 32

#: A tensor of ``n < 32`` elements whose values are drawn after its layout (the input plan's
#: layouts-first draw) draws at most ``n`` values: the values past the ``n``-th were drawn (3 to
#: 4 choices each, ~6 values per tensor on average) and never used. The plain draw keeps up to 32
#: (its derandomized searches, which tests pin, stay as they were; drawn capped, the historical
#: ``div_reciprocal`` bug's derandomized search found another counterexample first, though over
#: 30 seeds it found the bug as often: 17 vs 16). False is the slow twin: up to
#: :data:`MAX_DISTINCT_VALUES` whatever the size.
CAPPED_VALUE_LISTS = True


def _value_lists(dtype: torch.dtype, size: int, lo: float | None, hi: float | None, special: bool,
                 separate: bool = False, only_separating: bool = False,
                 capped: bool = False) -> SearchStrategy[list[Any]]:
    """``size`` values: a drawn list of values, repeated or cut to ``size``. Its length does not
    depend on the shape, so the shrinker can drop values and dimensions independently:
    ``[0.0, inf]`` shrinks to ``[inf, inf]`` and then, one dimension less, to ``inf``. When
    ``capped`` (and :data:`CAPPED_VALUE_LISTS`), at most ``size`` values are drawn.

    Made once per arguments and switches: the switches :data:`CAPPED_VALUE_LISTS` and
    :data:`FLAT_ELEMENTS` are part of the key, so turning one off gives its slow twin at once."""
    return _made_value_lists(dtype, size, lo, hi, special, separate, only_separating,
                             capped and CAPPED_VALUE_LISTS, FLAT_ELEMENTS)


@functools.lru_cache(maxsize=1024)
def _made_value_lists(dtype: torch.dtype, size: int, lo: float | None, hi: float | None, special: bool,
                      separate: bool, only_separating: bool, capped: bool, flat: bool) -> SearchStrategy[list[Any]]:
    """:func:`_value_lists`, with the switches it read as arguments (``flat`` is
    :data:`FLAT_ELEMENTS`, read again by :func:`_flat`)."""
    most = max(1, min(size, MAX_DISTINCT_VALUES)) if capped else MAX_DISTINCT_VALUES
    drawn = st.lists(_flat(elements(dtype, min_value=lo, max_value=hi, special_values=special,
                                    separate_dtypes=separate)), min_size=1, max_size=most)
    if not dtype.is_floating_point and dtype != torch.bool:
        drawn = st.one_of(_mask_lists(dtype, lo, hi, most), drawn)
    elif dtype.is_floating_point:  # a third of float tensors hold small whole numbers only
        drawn = st.one_of(drawn, drawn, _tame_lists(lo, hi, most))
        if only_separating:
            drawn = _separating_lists(dtype, lo, hi, most)
        elif separate:  # and, for rules with dtype captures, a quarter only values that tell dtypes apart
            drawn = st.one_of(drawn, drawn, drawn, _separating_lists(dtype, lo, hi, most))
    if not (special and dtype.is_floating_point):
        return drawn.map(lambda values: _cycle(values, size))
    # one integer says whether and what to plant (with a boolean and a sampled value, or a
    # sampled value alone, the derandomized search went 100 examples without planting nan)
    plants = _planted(dtype, lo, hi)
    planted = st.tuples(drawn, st.integers(0, len(plants) - 1), st.integers(0, MAX_DISTINCT_VALUES - 1))
    return planted.map(lambda t: _plant(_cycle(t[0], size), plants[t[1]], t[2]))


_value_lists.cache_clear = _made_value_lists.cache_clear  # type: ignore[attr-defined]


def _mask_lists(dtype: torch.dtype, lo: float | None, hi: float | None,
                most: int = MAX_DISTINCT_VALUES) -> SearchStrategy[list[int]]:
    """Integer tensors whose every value is small and not negative (0 to 3): masks, counts and
    indices, where ``x.bool()``, ``x * x == x`` or ``where(x, ...)`` tell 2 from 1."""
    low, high = _whole_bounds(lo, hi, max(0, torch.iinfo(dtype).min), 3)
    if low > high:
        return st.nothing()
    return st.lists(st.integers(low, high), min_size=1, max_size=most)


def _tame_lists(lo: float | None, hi: float | None, most: int = MAX_DISTINCT_VALUES) -> SearchStrategy[list[float]]:
    """Float tensors whose every value is a small whole number (-3 to 3): sums, broadcasts and
    reductions stay finite and exact, so a difference cannot hide behind an overflow to inf or
    a rounding error within the tolerance."""
    low, high = _whole_bounds(lo, hi, -3, 3)
    if low > high:
        return st.nothing()
    return st.lists(st.integers(low, high).map(float), min_size=1, max_size=most)


def _separating_lists(dtype: torch.dtype, lo: float | None, hi: float | None,
                      most: int = MAX_DISTINCT_VALUES) -> SearchStrategy[list[float]]:
    """Lists of :data:`DTYPE_SEPARATORS` that a ``dtype`` tensor holds finite and within the
    bounds (``65520`` is no float16 value: float16 makes it ``inf``)."""
    low, high = _float_bounds(dtype, lo, hi)
    values = _one_of_values([v for x in DTYPE_SEPARATORS for v in (x, -x)], low, high)
    return st.lists(values, min_size=1, max_size=most)


_PLANTED: tuple[float | None, ...] = (None, math.nan, None, math.inf, None, -math.inf)


@functools.cache
def _planted(dtype: torch.dtype, lo: float | None, hi: float | None) -> tuple[float | None, ...]:
    """What :func:`_plant` may put into a float tensor: ``nan``, ``±inf`` and, within the bounds,
    ``-0.0`` and the smallest subnormal of either sign (sign-of-zero and ``1 / x`` overflow bugs);
    ``None`` (no planting) every other time."""
    subnormal = _next_float(dtype, 0.0, math.inf)
    extra = [v for v in (-0.0, subnormal, -subnormal) if (lo is None or v >= lo) and (hi is None or v <= hi)]
    return (*_PLANTED, *(p for v in extra for p in (None, v)))


def _plant(values: list[Any], special: float | None, index: int) -> list[Any]:
    """Put a special value at one position (about every other float tensor gets one), so that
    nan and inf reach every rule early, whatever else the search does; shrinks to no planting."""
    if special is not None and values:
        values[index % len(values)] = special
    return values


def _cycle(values: list[Any], size: int) -> list[Any]:
    return [values[i % len(values)] for i in range(size)] if values else []


def tensors(*, dtypes: torch.dtype | Sequence[torch.dtype] | SearchStrategy[torch.dtype] = DEFAULT_DTYPES,
            shapes: Sequence[int] | SearchStrategy[tuple[int, ...]] | None = None,
            min_value: float | None = None, max_value: float | None = None,
            special_values: bool = True) -> SearchStrategy[torch.Tensor]:
    """Contiguous CPU tensors, each element drawn by :func:`elements`.

    ``dtypes`` is a dtype, a sequence (the first is the one shrinking prefers) or a strategy;
    ``shapes`` a fixed shape, a strategy of shapes, or ``None`` for :func:`tensor_shapes`.

    >>> from hypothesis import find
    >>> t = find(tensors(dtypes=[torch.float32, torch.int64]), lambda t: t.numel() > 1 and bool(t.isinf().any()))
    >>> t.shape, t.dtype, bool(t.isinf().any())
    (torch.Size([2]), torch.float32, True)
    """
    dtype_strategy = _as_strategy(dtypes, name="dtypes", kind=torch.dtype)
    if shapes is None:
        shape_strategy = tensor_shapes()
    elif isinstance(shapes, SearchStrategy):
        shape_strategy = shapes
    else:
        shape_strategy = st.just(tuple(shapes))
    return _tensors(dtype_strategy, shape_strategy, (min_value, max_value), special_values)


def _non_contiguous(t: torch.Tensor) -> torch.Tensor:
    """The same values in a transposed memory layout."""
    return t.transpose(-1, -2).contiguous().transpose(-1, -2)
