"""Hypothesis strategies for property-testing rewrite rules.

:func:`tensors` draws tensors whose values include the ones that break rules (``0``, ``-0.0``,
``±inf``, ``nan``, the largest and smallest floats, negatives, integer extremes);
:func:`inputs_for` draws every argument of a rule's pattern at once — tensors of related
shapes (equal, broadcastable through size-1 and missing dimensions, different ranks) and
dtypes, literal captures of their declared type, and modules for module captures — keeping
only draws on which the pattern runs and the rule's ``where=`` guards hold.

>>> import torch
>>> from hypothesis import given
>>> @given(tensors(dtypes=torch.float32, shapes=(2, 3)))
... def test_shape(t):
...     assert t.shape == (2, 3) and t.dtype == torch.float32
>>> test_shape()

What :func:`inputs_for` draws is shaped by the rule's ``domain`` declaration, a dict whose
keys are listed in :data:`DOMAIN_KEYS` (see ``docs/testing.md``). Shrinking leads to small,
simple inputs: rank 0 or 1, size-1 dimensions, one dtype, values ``0``, ``1``, ``inf``...
"""

from __future__ import annotations

import functools
import math
import struct
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal, cast

import attrs
import hypothesis.strategies as st
import torch
import torch.fx as fx
from hypothesis import reject
from hypothesis.strategies import SearchStrategy
from torch import nn
from torch.fx.node import Node

from ..errors import FxRewriteError, RuleDefinitionError
from ..match import Match
from ..pattern import Param
from ..rule import Rule
from ..verify import fresh_copy

__all__ = [
    "DEFAULT_DTYPES",
    "DOMAIN_KEYS",
    "Domain",
    "GuardHarness",
    "GuardRaised",
    "InputPlan",
    "call_rule_function",
    "elements",
    "inputs_for",
    "match_for",
    "plan_inputs",
    "tensor_shapes",
    "tensors",
]

#: Tensor dtypes drawn when a rule's domain does not say (add float16/bfloat16 in ``domain``).
DEFAULT_DTYPES: tuple[torch.dtype, ...] = (
    torch.float32, torch.float64, torch.int64, torch.int32, torch.uint8, torch.bool,
)

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

#: The keys of a rule's ``domain`` declaration and what each one means.
DOMAIN_KEYS: Mapping[str, str] = {
    "dtypes": "tensor dtypes to draw, most important first (default: float32, float64, int64, int32, "
              "uint8, bool); dtypes the pattern rejects are left out automatically",
    "ranks": "(min, max) number of dimensions of the largest tensor (default (0, 4))",
    "sides": "(min, max) size of each dimension (default (1, 3))",
    "shapes": "'broadcast' (default): tensors may differ by size-1 and missing dimensions; "
              "'equal': all tensor arguments have one shape",
    "mixed_dtypes": "tensor arguments may have different dtypes (default True)",
    "non_contiguous": "also draw non-contiguous tensors (default True)",
    "min_value": "smallest finite value drawn (default: the dtype's smallest)",
    "max_value": "largest finite value drawn (default: the dtype's largest)",
    "special_values": "also draw nan, inf and -inf (default True)",
    "literals": "{name: sequence of values or a strategy} for literal captures",
    "modules": "{name: zero-argument factory or strategy} for module captures",
    "inputs": "{name: {dtypes, min_value, max_value, special_values, shape}} for one tensor argument",
}

_INPUT_KEYS = ("dtypes", "min_value", "max_value", "special_values", "shape")
ShapeMode = Literal["broadcast", "equal"]


class GuardRaised(FxRewriteError, RuntimeError):
    """A rule's ``where=`` guard raised on inputs the pattern accepts; a rewrite would fail there."""

    def __init__(self, message: str, inputs: Mapping[str, Any], error: BaseException) -> None:
        super().__init__(message)
        self.inputs = inputs
        self.error = error


# -- values ---------------------------------------------------------------------------------------


def _width(dtype: torch.dtype) -> int:
    return {torch.float64: 64, torch.float16: 16}.get(dtype, 32)


def _representable(value: float, width: int, *, up: bool) -> float:
    """The float of ``width`` bits nearest to ``value`` on the inside of a bound."""
    if width == 64 or math.isinf(value):
        return value
    fmt = "f" if width == 32 else "e"
    rounded = struct.unpack(fmt, struct.pack(fmt, value))[0]
    if (up and rounded < value) or (not up and rounded > value):
        dtype = torch.float32 if width == 32 else torch.float16
        t = torch.tensor(rounded, dtype=dtype)
        rounded = float(torch.nextafter(t, torch.tensor(math.inf if up else -math.inf, dtype=dtype)))
    return rounded


def _unique(values: Iterable[Any]) -> list[Any]:
    seen: set[tuple[str, Any]] = set()
    out = []
    for v in values:
        key = (repr(v), type(v).__name__)  # keeps 0.0 and -0.0, and nan, apart
        if key not in seen:
            seen.add(key)
            out.append(v)
    return out


def _float_elements(dtype: torch.dtype, lo: float | None, hi: float | None, special: bool) -> SearchStrategy[float]:
    info = torch.finfo(dtype)
    width = _width(dtype)
    low = -info.max if lo is None else max(float(lo), -info.max)
    high = info.max if hi is None else min(float(hi), info.max)
    if low > high:
        raise ValueError(f"min_value={lo!r} is larger than max_value={hi!r} for {dtype}; swap them.")
    simple = [0.0, 1.0, -1.0, -0.0, 0.5, 2.0, -2.0, info.eps / 2, -info.eps / 2, low, high]
    subnormal = _next_float(dtype, 0.0, math.inf)  # one ulp above 0: the smallest subnormal
    extreme = [info.max, -info.max, info.tiny, -info.tiny, subnormal, -subnormal]
    non_finite = st.sampled_from([math.inf, -math.inf, math.nan]) if special else st.nothing()
    low, high = _representable(low, width, up=True), _representable(high, width, up=False)
    bits = cast(Literal[16, 32, 64], width)
    moderate = st.floats(max(low, -10.0), min(high, 10.0), width=bits) if low <= 10 and high >= -10 else st.nothing()
    wide = st.floats(low, high, width=bits, allow_nan=False, allow_infinity=False)
    return st.one_of(_one_of_values(simple, low, high), _one_of_values(extreme, low, high), non_finite,
                     _small_floats(info, low, high), moderate, wide,
                     _one_of_values(ulp_neighbours(dtype), low, high))


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
    0.1, of either sign: where ``1 + x``, ``exp(x) - 1`` and friends lose digits."""
    top = min(0.1, max(abs(low), abs(high)))
    signs = [s for s in (1.0, -1.0) if (high >= info.tiny if s > 0 else low <= -info.tiny)]
    if top <= info.tiny or not signs:
        return st.nothing()
    exponents = st.floats(math.log10(info.tiny), math.log10(top))
    values = st.tuples(exponents, st.sampled_from(signs)).map(lambda t: t[1] * 10.0 ** t[0])
    return values.filter(lambda v: low <= v <= high)


def _int_elements(dtype: torch.dtype, lo: float | None, hi: float | None) -> SearchStrategy[int]:
    info = torch.iinfo(dtype)
    low = info.min if lo is None else max(info.min, math.ceil(lo))
    high = info.max if hi is None else min(info.max, math.floor(hi))
    if low > high:
        raise ValueError(f"no {dtype} value lies between min_value={lo!r} and max_value={hi!r}.")
    # 2**24 + 1 and 2**53 + 1 are the first integers that float32 and float64 cannot hold
    extreme = [info.max, info.min, 2**24 + 1, -(2**24 + 1), 2**53 + 1, -(2**53 + 1)]
    moderate = st.integers(max(low, -10), min(high, 10)) if low <= 10 and high >= -10 else st.nothing()
    return st.one_of(_one_of_values([0, 1, -1, 2, -2, low, high], low, high), _one_of_values(extreme, low, high),
                     moderate, st.integers(low, high))


def elements(dtype: torch.dtype, *, min_value: float | None = None, max_value: float | None = None,
             special_values: bool = True) -> SearchStrategy[Any]:
    """Python numbers that fit ``dtype``. Floats are drawn evenly from seven groups: simple values
    (``0``, ``±1``, ``-0.0``, ``0.5``, ``±2``, ``±eps/2`` (lost when added to 1), the bounds),
    extremes (``±max``, ``±`` the smallest normal, ``±`` the smallest subnormal), non-finite
    values, small values (smallest normal to ``0.1``, either sign), moderate values in
    ``[-10, 10]``, any value in range, and values one ulp around powers of two and around 0
    (:func:`ulp_neighbours`). Integers from four: simple values, extremes (``max``, ``min``,
    ``±(2**24 + 1)`` and ``±(2**53 + 1)``, which float32 and float64 cannot hold), ``[-10, 10]``
    and the range.
    ``min_value`` / ``max_value`` bound the finite values; ``special_values`` adds ``nan``,
    ``inf`` and ``-inf`` (floating dtypes only).

    >>> from hypothesis import find
    >>> find(elements(torch.float32), lambda v: v != v)
    nan
    """
    if dtype == torch.bool:
        return st.booleans()
    if dtype.is_floating_point:
        return _float_elements(dtype, min_value, max_value, special_values)
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


@functools.lru_cache(maxsize=1024)
def _value_lists(dtype: torch.dtype, size: int, lo: float | None, hi: float | None,
                 special: bool) -> SearchStrategy[list[Any]]:
    """``size`` values: a drawn list of values, repeated or cut to ``size``. Its length does not
    depend on the shape, so the shrinker can drop values and dimensions independently:
    ``[0.0, inf]`` shrinks to ``[inf, inf]`` and then, one dimension less, to ``inf``."""
    drawn = st.lists(elements(dtype, min_value=lo, max_value=hi, special_values=special),
                     min_size=1, max_size=MAX_DISTINCT_VALUES)
    if not dtype.is_floating_point and dtype != torch.bool:
        drawn = st.one_of(_mask_lists(dtype, lo, hi), drawn)
    elif dtype.is_floating_point:  # a third of float tensors hold small whole numbers only
        drawn = st.one_of(drawn, drawn, _tame_lists(lo, hi))
    if not (special and dtype.is_floating_point):
        return drawn.map(lambda values: _cycle(values, size))
    # one integer says whether and what to plant (with a boolean and a sampled value, or a
    # sampled value alone, the derandomized search went 100 examples without planting nan)
    planted = st.tuples(drawn, st.integers(0, 5), st.integers(0, MAX_DISTINCT_VALUES - 1))
    return planted.map(lambda t: _plant(_cycle(t[0], size), _PLANTED[t[1]], t[2]))


def _mask_lists(dtype: torch.dtype, lo: float | None, hi: float | None) -> SearchStrategy[list[int]]:
    """Integer tensors whose every value is small and not negative (0 to 3): masks, counts and
    indices, where ``x.bool()``, ``x * x == x`` or ``where(x, ...)`` tell 2 from 1."""
    info = torch.iinfo(dtype)
    low = max(0, info.min if lo is None else math.ceil(lo))
    high = min(3, info.max if hi is None else math.floor(hi))
    if low > high:
        return st.nothing()
    return st.lists(st.integers(low, high), min_size=1, max_size=MAX_DISTINCT_VALUES)


def _tame_lists(lo: float | None, hi: float | None) -> SearchStrategy[list[float]]:
    """Float tensors whose every value is a small whole number (-3 to 3): sums, broadcasts and
    reductions stay finite and exact, so a difference cannot hide behind an overflow to inf or
    a rounding error within the tolerance."""
    low = -3 if lo is None else max(-3, math.ceil(lo))
    high = 3 if hi is None else min(3, math.floor(hi))
    if low > high:
        return st.nothing()
    return st.lists(st.integers(low, high).map(float), min_size=1, max_size=MAX_DISTINCT_VALUES)


_PLANTED: tuple[float | None, ...] = (None, math.nan, None, math.inf, None, -math.inf)


def _plant(values: list[Any], special: float | None, index: int) -> list[Any]:
    """Put a non-finite value at one position (about every other float tensor gets one), so that
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


# -- domain ---------------------------------------------------------------------------------------


def _pair(value: Any, key: str, where: str) -> tuple[int, int]:
    ok = (isinstance(value, (tuple, list)) and len(value) == 2
          and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value) and value[0] <= value[1])
    if not ok:
        raise RuleDefinitionError(f"{where}: domain['{key}'] must be a (min, max) pair of integers >= 0, "
                                  f"min <= max; got {value!r}.")
    return (value[0], value[1])


def _dtypes(value: Any, key: str, where: str) -> tuple[torch.dtype, ...]:
    values = (value,) if isinstance(value, torch.dtype) else tuple(value)
    if not values or not all(isinstance(v, torch.dtype) for v in values):
        raise RuleDefinitionError(f"{where}: {key} must be a non-empty sequence of torch dtypes, e.g. "
                                  f"(torch.float32, torch.float64); got {value!r}.")
    return values


def _check_keys(declared: Mapping[str, Any], allowed: Iterable[str], what: str, where: str) -> None:
    unknown = sorted(set(declared) - set(allowed))
    if unknown:
        raise RuleDefinitionError(f"{where}: unknown {what} key(s) {unknown}; the keys are {sorted(allowed)} "
                                  f"(see fxrewrite.testing.DOMAIN_KEYS).")


@attrs.frozen
class TensorDomain:
    """How one tensor argument's values are drawn."""

    dtypes: tuple[torch.dtype, ...] | None
    min_value: float | None
    max_value: float | None
    special_values: bool
    shape: tuple[int, ...] | None = None


@attrs.frozen
class Domain:
    """A rule's ``domain`` declaration, validated, with defaults filled in."""

    declared: Mapping[str, Any]
    dtypes: tuple[torch.dtype, ...] = DEFAULT_DTYPES
    ranks: tuple[int, int] = (0, 4)
    sides: tuple[int, int] = (1, 3)
    shapes: ShapeMode = "broadcast"
    mixed_dtypes: bool = True
    non_contiguous: bool = True
    min_value: float | None = None
    max_value: float | None = None
    special_values: bool = True
    literals: Mapping[str, Any] = attrs.field(factory=dict)
    modules: Mapping[str, Any] = attrs.field(factory=dict)
    inputs: Mapping[str, Mapping[str, Any]] = attrs.field(factory=dict)

    @classmethod
    def parse(cls, declared: Mapping[str, Any] | None, *, where: str) -> Domain:
        """Validate a ``domain`` declaration; errors name the rule and the fix."""
        declared = dict(declared or {})
        _check_keys(declared, DOMAIN_KEYS, "domain", where)
        options: dict[str, Any] = {"declared": declared}
        for key, value in declared.items():
            options[key] = _parse_option(key, value, where)
        return cls(**options)

    def tensor_domain(self, name: str) -> TensorDomain:
        own = self.inputs.get(name, {})
        return TensorDomain(
            dtypes=_dtypes(own["dtypes"], "dtypes", name) if "dtypes" in own else None,
            min_value=own.get("min_value", self.min_value),
            max_value=own.get("max_value", self.max_value),
            special_values=own.get("special_values", self.special_values),
            shape=tuple(own["shape"]) if "shape" in own else None,
        )

    def describe(self) -> str:
        """One line: what was declared, and what is drawn."""
        dtypes = ", ".join(str(d).replace("torch.", "") for d in self.dtypes)
        values = "any finite value" if self.min_value is None and self.max_value is None else (
            f"finite values in [{self.min_value}, {self.max_value}]")
        values += ", nan, ±inf" if self.special_values else " (no nan or inf)"
        drawn = (f"dtypes {dtypes}{' (mixable)' if self.mixed_dtypes else ''}; ranks {self.ranks[0]}..{self.ranks[1]}; "
                 f"sides {self.sides[0]}..{self.sides[1]}; shapes {self.shapes}; values {values}")
        declared = f"declared {_show_declaration(self.declared)}" if self.declared else "default"
        return f"{declared} -> {drawn}"


def _show_declaration(declared: Mapping[str, Any]) -> str:
    def show(v: Any) -> str:
        if isinstance(v, Mapping):
            return "{" + ", ".join(f"{k!r}: {show(x)}" for k, x in v.items()) + "}"
        if isinstance(v, (tuple, list)):
            inner = ", ".join(show(x) for x in v)
            if isinstance(v, list):
                return f"[{inner}]"
            return f"({inner},)" if len(v) == 1 else f"({inner})"
        if callable(v) and not isinstance(v, (torch.dtype, SearchStrategy)):
            return getattr(v, "__qualname__", repr(v))
        return repr(v)
    return show(declared)


def _parse_option(key: str, value: Any, where: str) -> Any:
    if key == "dtypes":
        return _dtypes(value, "domain['dtypes']", where)
    if key in ("ranks", "sides"):
        pair = _pair(value, key, where)
        if key == "sides" and pair[0] == 0:
            raise RuleDefinitionError(f"{where}: domain['sides'] must start at 1 or more; got {value!r}.")
        return pair
    if key == "shapes":
        if value not in ("broadcast", "equal"):
            raise RuleDefinitionError(f"{where}: domain['shapes'] is 'broadcast' or 'equal', got {value!r}.")
        return value
    if key in ("mixed_dtypes", "non_contiguous", "special_values"):
        if not isinstance(value, bool):
            raise RuleDefinitionError(f"{where}: domain['{key}'] must be True or False, got {value!r}.")
        return value
    if key in ("min_value", "max_value"):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise RuleDefinitionError(f"{where}: domain['{key}'] must be a number or None, got {value!r}.")
        return value
    return _parse_mapping_option(key, value, where)


def _is_shape(value: Any) -> bool:
    return isinstance(value, (tuple, list)) and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
                                                    for v in value)


def _parse_mapping_option(key: str, value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise RuleDefinitionError(f"{where}: domain['{key}'] must be a dict keyed by parameter name, got {value!r}.")
    if key == "inputs":
        for name, own in value.items():
            if not isinstance(own, Mapping):
                raise RuleDefinitionError(f"{where}: domain['inputs']['{name}'] must be a dict, got {own!r}.")
            _check_keys(own, _INPUT_KEYS, f"domain['inputs']['{name}']", where)
            if "dtypes" in own:
                _dtypes(own["dtypes"], f"domain['inputs']['{name}']['dtypes']", where)
            if "shape" in own and not _is_shape(own["shape"]):
                raise RuleDefinitionError(f"{where}: domain['inputs']['{name}']['shape'] must be a tuple of sizes, "
                                          f"e.g. () or (2, 3); got {own['shape']!r}.")
    return dict(value)


# -- modules --------------------------------------------------------------------------------------

_ACTIVATIONS_WITH_DIM = (nn.Softmax, nn.LogSoftmax, nn.Softmin)


def _randomize_norm(module: Any) -> None:  # Any: its statistics are read by name
    with torch.no_grad():
        if getattr(module, "running_mean", None) is not None:
            module.running_mean.uniform_(-1.0, 1.0)
            module.running_var.uniform_(0.5, 2.0)
        if getattr(module, "weight", None) is not None:
            module.weight.uniform_(0.5, 1.5)
        if getattr(module, "bias", None) is not None:
            module.bias.uniform_(-0.5, 0.5)


def default_module(cls: type[nn.Module], *, width: int, kernel: int, bias: bool) -> nn.Module | None:
    """A small instance of a common module class (``width`` channels/features), in eval mode
    with random parameters and statistics; ``None`` for a class that needs a factory.

    >>> default_module(nn.Conv2d, width=2, kernel=3, bias=False)
    Conv2d(2, 2, kernel_size=(3, 3), stride=(1, 1), bias=False)
    """
    module: nn.Module | None
    make: Any = cls  # module classes take different constructor arguments; checked by _try
    if issubclass(cls, (nn.Linear, nn.modules.conv._ConvNd)) and make is not nn.Bilinear:
        args = (width, width) if issubclass(cls, nn.Linear) else (width, width, kernel)
        module = _try(lambda: make(*args, bias=bias))
    elif issubclass(cls, (nn.modules.batchnorm._NormBase, nn.LayerNorm)):
        module = _try(lambda: cls(width))
    elif issubclass(cls, nn.GroupNorm):
        module = _try(lambda: cls(1, width))
    elif issubclass(cls, _ACTIVATIONS_WITH_DIM):
        module = _try(lambda: cls(dim=-1))
    else:
        module = _try(cls)
    if module is None:
        return None
    _randomize_norm(module)
    return module.eval()


def _try(make: Callable[[], nn.Module]) -> nn.Module | None:
    try:
        return make()
    except Exception:  # a constructor that needs arguments we cannot guess
        return None


def fit_input_shape(module: nn.Module, shape: Sequence[int]) -> tuple[int, ...]:
    """``shape`` changed so that ``module`` accepts a tensor of it: channels or features taken
    from the module, spatial sizes at least the kernel's extent. Ranks the module does not
    accept are left alone (the draw is then rejected).

    >>> fit_input_shape(nn.Conv2d(3, 4, 3), (1, 1, 2, 5))
    (1, 3, 3, 5)
    """
    out = list(shape)
    rank = len(out)
    if isinstance(module, nn.Linear) and rank >= 1:
        out[-1] = module.in_features
    elif isinstance(module, nn.modules.conv._ConvNd):
        _fit_conv(module, out)
    elif isinstance(module, nn.modules.batchnorm._BatchNorm) and rank >= 2:
        out[1] = module.num_features
    elif isinstance(module, nn.modules.instancenorm._InstanceNorm) and rank >= 2:
        out[-len(out) + (1 if rank > 2 else 0)] = module.num_features
    elif isinstance(module, nn.LayerNorm) and rank >= len(module.normalized_shape):
        out[rank - len(module.normalized_shape):] = list(module.normalized_shape)
    elif isinstance(module, nn.GroupNorm) and rank >= 2:
        out[1] = module.num_channels
    return tuple(out)


def _fit_conv(module: nn.modules.conv._ConvNd, out: list[int]) -> None:
    d = len(module.kernel_size)
    if len(out) not in (d + 1, d + 2):
        return
    out[-(d + 1)] = module.in_channels
    padding = module.padding if isinstance(module.padding, tuple) else (0,) * d
    for i in range(d):
        need = 1 if module.transposed else module.dilation[i] * (module.kernel_size[i] - 1) + 1 - 2 * padding[i]
        out[len(out) - d + i] = max(out[len(out) - d + i], need)


# -- the plan for one rule ------------------------------------------------------------------------


@attrs.frozen
class _Config:
    """The dtype of the tensor arguments and the rank of the largest one."""

    dtype: torch.dtype
    rank: int


@attrs.frozen(eq=False)
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

    @property
    def where(self) -> str:
        return f"rule '{self.rule.name}' ({self.rule.origin})"

    @property
    def dtypes(self) -> tuple[torch.dtype, ...]:
        """Dtypes on which the pattern was seen to run."""
        return tuple(_unique(c.dtype for c in self.configs))

    @property
    def broadcastable(self) -> tuple[str, ...]:
        """Tensor arguments whose shapes may differ from the others' (by broadcasting)."""
        names = tuple(p.name for p in self.tensors if _shape_varies(self, p))
        return names if len(names) > 1 else ()

    def with_smaller(self, name: str) -> InputPlan:
        """This plan, where tensor argument ``name`` always has fewer dimensions than the others
        (when they have any)."""
        return attrs.evolve(self, smaller=name)

    def only(self, dtype: torch.dtype) -> InputPlan:
        """This plan, drawing tensors of ``dtype`` only (where the domain does not fix them)."""
        return attrs.evolve(self, configs=tuple(c for c in self.configs if c.dtype == dtype))

    def ranks(self, dtype: torch.dtype) -> tuple[int, ...]:
        """Ranks on which the pattern was seen to run for ``dtype``, ascending."""
        return tuple(c.rank for c in self.configs if c.dtype == dtype)

    def strategy(self) -> SearchStrategy[dict[str, Any]]:
        return _valid_inputs(self)


def _module_consumers(rule: Rule) -> dict[str, str]:
    """Tensor parameters that a module capture is called on directly: ``{tensor: module}``."""
    pattern = rule.compiled
    kinds = {p.name: p.kind for p in pattern.params}
    consumers: dict[str, str] = {}
    for node in pattern.graph.nodes:
        if node.op == "call_module" and node.args and isinstance(node.args[0], Node):
            arg = node.args[0]
            if arg.op == "placeholder" and kinds.get(str(arg.target)) == "tensor":
                consumers.setdefault(str(arg.target), str(node.target))
    return consumers


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
    )
    _check_declared_names(plan)
    for param in plan.modules:
        _check_module_source(plan, param)
    configs, failure = _probe(plan)
    return attrs.evolve(plan, configs=configs, probe_failure=failure)


def _check_declared_names(plan: InputPlan) -> None:
    """A name in ``literals``, ``modules`` or ``inputs`` that is a parameter must be one of that
    kind. Other names are ignored, so that one domain dict can serve several rules."""
    kinds = {p.name: p.kind for p in plan.rule.compiled.params}
    for key, kind in (("literals", "literal"), ("modules", "module"), ("inputs", "tensor")):
        wrong = sorted(name for name in getattr(plan.domain, key) if kinds.get(name, kind) != kind)
        if wrong:
            found = ", ".join(f"'{name}' is a {kinds[name]} parameter" for name in wrong)
            raise RuleDefinitionError(
                f"{plan.where}: domain['{key}'] is for {kind} parameters, but {found}; move it to "
                f"domain['{_DOMAIN_KEY_OF_KIND[kinds[wrong[0]]]}'].")


_DOMAIN_KEY_OF_KIND = {"literal": "literals", "module": "modules", "tensor": "inputs"}


def _check_module_source(plan: InputPlan, param: Param) -> None:
    source = plan.domain.modules.get(param.name)
    if source is not None:
        if not (callable(source) or isinstance(source, SearchStrategy)):
            raise RuleDefinitionError(
                f"{plan.where}: domain['modules']['{param.name}'] must be a zero-argument factory "
                f"(e.g. lambda: nn.Conv2d(3, 4, 3)) or a strategy of modules, got {source!r}.")
        return
    if default_module(param.annotation, width=2, kernel=1, bias=True) is None:
        cls = param.annotation.__name__
        raise RuleDefinitionError(
            f"{plan.where}: cannot build a '{cls}' for module capture '{param.name}' to test the rule; "
            f"declare a factory: domain={{'modules': {{'{param.name}': lambda: {cls}(...)}}}}.")


# -- drawing --------------------------------------------------------------------------------------


@st.composite
def _modules(draw: Any, plan: InputPlan) -> dict[str, nn.Module]:
    if not plan.modules:
        return {}
    width = draw(st.integers(*plan.domain.sides), label="module width")
    out = {}
    for param in plan.modules:
        source = plan.domain.modules.get(param.name)
        if isinstance(source, SearchStrategy):
            module = draw(source)
        else:
            kernel = draw(st.integers(1, min(3, max(1, width))))
            bias = draw(st.booleans())
            seed = draw(st.integers(0, 2**16 - 1))
            make = source if source is not None else functools.partial(
                default_module, param.annotation, width=width, kernel=kernel, bias=bias)
            module = _seeded(seed, make)
        if not isinstance(module, param.annotation):
            raise RuleDefinitionError(
                f"{plan.where}: the module drawn for '{param.name}' is a {type(module).__name__}, "
                f"not a {param.annotation.__name__}; fix domain['modules']['{param.name}'].")
        out[param.name] = module
    return out


@functools.lru_cache(maxsize=64)
def _generator_state(seed: int) -> torch.Tensor:
    return torch.Generator().manual_seed(seed).get_state()


def _seeded(seed: int, make: Callable[[], Any]) -> Any:
    """``make()`` with torch's global generator seeded with ``seed``, restored afterwards."""
    saved = torch.default_generator.get_state()
    torch.default_generator.set_state(_generator_state(seed))
    try:
        return make()
    finally:
        torch.default_generator.set_state(saved)


def _base_shape(plan: InputPlan, shape: Sequence[int], modules: Mapping[str, nn.Module]) -> tuple[int, ...]:
    module = next(iter(plan.consumers.values()), None)
    return fit_input_shape(modules[module], shape) if module is not None else tuple(shape)


@st.composite
def _related_shape(draw: Any, base: tuple[int, ...], max_rank: int, smaller: bool) -> tuple[int, ...]:
    """``base``, or (shrinking towards ``base``) a shape that broadcasts to it: leading
    dimensions dropped, some dimensions set to 1 (``smaller``: always at least one dimension
    dropped). The draws do not depend on ``base``'s rank, so the shrinker can remove a dimension
    without disturbing what is drawn after."""
    broadcast = draw(st.booleans(), label="broadcast")
    drop = draw(st.integers(0, max_rank))
    ones = draw(st.lists(st.booleans(), min_size=max_rank, max_size=max_rank))
    if smaller:
        broadcast, drop = True, max(drop, 1)
    if not broadcast:
        return base
    kept = base[min(drop, len(base)):]
    return tuple(1 if one else side for one, side in zip(ones, kept, strict=False))


def _tensor_dtypes(plan: InputPlan, param: Param) -> tuple[torch.dtype, ...]:
    own = plan.domain.tensor_domain(param.name).dtypes
    return own if own is not None else (plan.dtypes or plan.domain.dtypes)


@st.composite
def _tensor_inputs(draw: Any, plan: InputPlan, config: _Config, base: tuple[int, ...]) -> dict[str, torch.Tensor]:
    """The tensor arguments: by default all of ``base``'s shape and ``config``'s dtype; shrinking
    leads there from shapes that broadcast to ``base`` and from mixed dtypes."""
    mixed = plan.domain.mixed_dtypes and len(plan.tensors) > 1 and draw(st.booleans(), label="mixed dtypes")
    related = plan.broadcastable
    out = {}
    for param in plan.tensors:
        own = plan.domain.tensor_domain(param.name)
        fixed = own.shape if own.shape is not None else base
        smaller = param.name == plan.smaller
        shape = draw(_related_shape(base, plan.domain.ranks[1], smaller)) if param.name in related else fixed
        if own.dtypes is not None:
            dtype = draw(st.sampled_from(own.dtypes))
        else:
            dtype = draw(st.sampled_from(_tensor_dtypes(plan, param))) if mixed else config.dtype
        values = draw(_value_lists(dtype, math.prod(shape), own.min_value, own.max_value, own.special_values))
        t = _build_tensor(values, shape, dtype)
        transposed = plan.domain.non_contiguous and draw(st.booleans(), label="non-contiguous")
        if transposed and t.dim() >= 2 and min(t.shape[-2:]) > 1:
            t = _non_contiguous(t)
        out[param.name] = t
    return out


def _shape_varies(plan: InputPlan, param: Param) -> bool:
    """Whether ``param``'s shape may differ from the base shape (else it is the base shape, or
    the shape its domain fixes)."""
    return (plan.domain.shapes == "broadcast" and param.name not in plan.consumers
            and plan.domain.tensor_domain(param.name).shape is None)


def _literal_strategy(plan: InputPlan, param: Param) -> SearchStrategy[Any]:
    declared = plan.domain.literals.get(param.name)
    if declared is not None:
        return _as_strategy(declared, name=f"{plan.where}: domain['literals']['{param.name}']", kind=(str, bytes))
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


@st.composite
def _literal_values(draw: Any, plan: InputPlan) -> dict[str, Any]:
    """The literal captures: each drawn on its own, or (when there are several undeclared
    ``int`` captures) as a permutation of ``range(n)``, each index possibly counted from the
    end: every permutation of a small rank is drawn, which independent draws hardly hit."""
    values = {p.name: draw(_literal_strategy(plan, p)) for p in plan.literals}
    group = _index_literals(plan)
    if len(group) > 1 and draw(st.booleans(), label="permutation"):
        order = draw(st.permutations(range(len(group))))
        from_end = draw(st.lists(st.booleans(), min_size=len(group), max_size=len(group)))
        values.update({name: i - len(group) if neg else i for name, i, neg in zip(group, order, from_end)})
    return values


@st.composite
def _raw_inputs(draw: Any, plan: InputPlan) -> dict[str, Any]:
    dtype = draw(st.sampled_from(plan.dtypes))
    ranks = plan.ranks(dtype)
    modules = draw(_modules(plan))
    sides = draw(st.lists(st.integers(*plan.domain.sides), min_size=ranks[0], max_size=ranks[-1]))
    if len(sides) not in ranks:
        reject()
    if draw(st.booleans(), label="square") and sides:
        sides = [sides[0]] * len(sides)  # matmul-like patterns need equal sizes
    config = _Config(dtype, len(sides))
    base = _base_shape(plan, sides, modules)
    values = draw(_tensor_inputs(plan, config, base))
    literals = draw(_literal_values(plan))
    merged = {**values, **literals, **modules}
    return {p.name: merged[p.name] for p in plan.rule.compiled.params}


@st.composite
def _valid_inputs(draw: Any, plan: InputPlan) -> dict[str, Any]:
    inputs = draw(_raw_inputs(plan))
    if not accepts(plan, inputs, guard_errors="raise"):
        reject()
    return inputs


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


# -- running the pattern and the guards -----------------------------------------------------------


def call_rule_function(fn: Callable[..., Any], inputs: Mapping[str, Any], *,
                       rng_seed: int = 0) -> tuple[Any, dict[str, Any]]:
    """Call a pattern or replacement eagerly on fresh copies of ``inputs`` (so in-place
    operations cannot leak), with the random generator seeded, without autograd. Returns the
    result and the copies (to see what the call modified)."""
    args = {name: fresh_copy(value) for name, value in inputs.items()}
    with torch.no_grad():
        return _seeded(rng_seed, lambda: fn(**args)), args


class GuardHarness:
    """The rule's pattern graph, copied into a ``GraphModule`` once, on which guards are
    evaluated for concrete inputs: the graph is run with an interpreter that records each
    node's value in ``meta["val"]``, and a :class:`~fxrewrite.match.Match` of the pattern
    against this copy of itself is built, so ``m["x"].shape``, ``.dtype`` and ``.dim()`` work as
    in a real rewrite."""

    def __init__(self, rule: Rule) -> None:
        pattern = rule.compiled
        graph = fx.Graph()
        self.env: dict[Node, Node] = {}
        graph.output(graph.graph_copy(pattern.graph, self.env))
        self.rule = rule
        self.module_names = tuple(p.name for p in pattern.params if p.kind == "module")
        root = nn.Module()
        for name in self.module_names:
            root.add_module(name, nn.Identity())
        self.gm = fx.GraphModule(root, graph)
        self.placeholders = tuple(str(n.target) for n in pattern.placeholders.values())

    def match(self, inputs: Mapping[str, Any]) -> Match:
        """Run the pattern graph on copies of ``inputs`` (raising what it raises) and return
        the match the guards would see."""
        for name in self.module_names:
            setattr(self.gm, name, fresh_copy(inputs[name]))
        with torch.no_grad():
            _RecordingInterpreter(self.gm).run(*(fresh_copy(inputs[name]) for name in self.placeholders))
        pattern, env = self.rule.compiled, self.env
        bindings = {p.name: env[pattern.placeholders[p.name]] if p.kind == "tensor" else inputs[p.name]
                    for p in pattern.params}
        return Match(
            pattern=pattern, bindings=bindings, nodes=tuple(env[n] for n in pattern.inner_nodes),
            outputs=tuple(env[n] for n in pattern.outputs), anchor=env[pattern.anchor],
            module_paths={name: name for name in self.module_names}, node_map=dict(env),
        )


class _RecordingInterpreter(fx.Interpreter):
    """Runs a graph and records every node's value in ``node.meta["val"]`` (what guards read)."""

    def run_node(self, n: Node) -> Any:
        value = super().run_node(n)
        n.meta["val"] = value
        return value


def match_for(rule: Rule, inputs: Mapping[str, Any]) -> Match:
    """A :class:`~fxrewrite.match.Match` of ``rule``'s pattern against a copy of its own graph
    evaluated on ``inputs``: what the rule's guards would see in a graph computing the pattern
    on these values. Raises whatever the pattern raises on them.

    >>> import torch
    >>> from fxrewrite import Rule
    >>> rule = Rule.from_functions(lambda x: torch.relu(torch.relu(x)), lambda x: torch.relu(x), name="r")
    >>> m = match_for(rule, {"x": torch.zeros(2, 3, dtype=torch.float64)})
    >>> m["x"].shape, m["x"].dtype, m["x"].dim()
    (torch.Size([2, 3]), torch.float64, 2)
    """
    return GuardHarness(rule).match(inputs)


def _guard_name(guard: Callable[..., Any]) -> str:
    return getattr(guard, "__qualname__", None) or repr(guard)


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


# -- probing --------------------------------------------------------------------------------------

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
    out = {}
    for param in plan.modules:
        source = plan.domain.modules.get(param.name)
        if isinstance(source, SearchStrategy):
            return {}
        make: Callable[[], Any] = source if source is not None else functools.partial(
            default_module, param.annotation, width=width, kernel=1, bias=True)
        out[param.name] = _seeded(0, make)
    return out


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
    if accepted:
        return tuple(accepted), None
    return tuple(candidates), first_error


def _probe_shape(plan: InputPlan, param: Param, base: tuple[int, ...]) -> tuple[int, ...]:
    own = plan.domain.tensor_domain(param.name).shape
    return base if own is None else own


def _probe_dtype(plan: InputPlan, param: Param, config: _Config) -> torch.dtype:
    own = plan.domain.tensor_domain(param.name).dtypes
    return own[0] if own else config.dtype


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
