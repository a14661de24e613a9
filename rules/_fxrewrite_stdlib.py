"""Helpers shared by the Python files of the standard rule library.

Not a rule file: the loader skips files whose name starts with ``_``; the rule files import it
as ``_fxrewrite_stdlib`` (the loader puts this directory on ``sys.path`` while it imports them).

Guards come in two strengths:

* *strict* guards need shape/dtype metadata and return False without it, so the rule only
  fires when the caller passed ``example_inputs=`` to :func:`fxrewrite.rewrite` (or rewrites a
  ``torch.export`` graph). Used where the pattern is common and the rewrite is wrong for
  ordinary inputs (``F.linear(x, w) + b`` where ``b`` is a residual, not a bias).
* *soft* guards check metadata when the graph has it and let the rule fire when it does not;
  the rule then also declares the same restriction as its ``domain`` (ranks >= 2, ...) for the
  property checker. Used where the excluded inputs are unusual in practice.
* ``floating`` is neither: it reads the dtype from the metadata or infers it from the graph
  (see ``TensorView.is_floating_point``) and refuses when it cannot tell.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.fx as fx

from fxrewrite import MetadataError

if TYPE_CHECKING:  # the guards only name them: fxrewrite.match is imported by a rewrite, not by loading rules
    from fxrewrite import Match, TensorView

Guard = Callable[["Match"], bool]

#: Floating-point dtypes the property checker draws for rules restricted to them.
FLOATS: tuple[torch.dtype, ...] = (torch.float32, torch.float64)

#: Domain of rules that are exact only on floating-point tensors.
FLOAT_DOMAIN: dict[str, Any] = {"dtypes": FLOATS}

#: Tolerance of rules that trade one floating-point evaluation order for another.
REASSOCIATED = {"rtol": 1e-4, "atol": 1e-5}


def view(m: Match, name: str) -> TensorView | None:
    """``m[name]`` when the graph carries shape/dtype metadata for it, else ``None``."""
    tensor = m[name]
    try:
        _ = tensor.dtype  # raises MetadataError when the graph carries no metadata
    except MetadataError:
        return None
    return tensor


def _named(guard: Guard, name: str) -> Guard:
    guard.__name__ = guard.__qualname__ = name
    return guard


def floating(*names: str) -> Guard:
    """The tensors ``names`` are floating point: read from the metadata, or, without it, known
    from how the graph computes them (a module's floating weights, softmax, ...). When neither
    tells, the guard refuses (``MetadataError``): integer tensors are not unusual enough to guess
    (masks, indices), and these rules are wrong on them."""

    def guard(m: Match) -> bool:
        return all(m[n].is_floating_point() for n in names)

    return _named(guard, f"floating({', '.join(names)})")


def rank_at_least(rank: int, *names: str) -> Guard:
    """Soft guard: the tensors ``names`` have at least ``rank`` dimensions (or an unknown rank)."""

    def guard(m: Match) -> bool:
        return all((t := view(m, n)) is None or t.dim() >= rank for n in names)

    return _named(guard, f"rank_at_least({rank}, {', '.join(names)})")


def literal_equals(name: str, value: float, *, rel: float = 0.0) -> Guard:
    """The literal capture ``name`` is ``value`` (within a relative ``rel``, for constants
    such as sqrt(2/pi) that code spells with more or fewer digits)."""

    def guard(m: Match) -> bool:
        got = m[name]
        return got == value if rel == 0.0 else math.isclose(got, value, rel_tol=rel)

    return _named(guard, f"{name} == {value!r}")


def finite(*names: str) -> Guard:
    """The literal captures ``names`` are finite numbers."""

    def guard(m: Match) -> bool:
        return all(math.isfinite(m[n]) for n in names)

    return _named(guard, f"finite({', '.join(names)})")


def positive(*names: str) -> Guard:
    """The literal captures ``names`` are finite and > 0."""

    def guard(m: Match) -> bool:
        return all(math.isfinite(m[n]) and m[n] > 0 for n in names)

    return _named(guard, f"positive({', '.join(names)})")


def feature_vector(vector: str, of: str, *, dim: int = -1) -> Guard:
    """Strict guard: ``vector`` is 1-D, as long as dimension ``dim`` of ``of``, and of ``of``'s
    dtype: it broadcasts along ``dim`` only, and never changes the result's shape or dtype."""

    def guard(m: Match) -> bool:
        v, t = view(m, vector), view(m, of)
        if v is None or t is None or t.dim() == 0:
            return False
        return v.dim() == 1 and v.shape[0] == t.shape[dim] and v.dtype == t.dtype

    return _named(guard, f"feature_vector({vector}, of={of}, dim={dim})")


def dtype_in(name: str, dtypes: tuple[torch.dtype, ...]) -> Guard:
    """Strict guard: the tensor ``name`` has one of ``dtypes`` (refuses when the graph has no dtypes)."""

    def guard(m: Match) -> bool:
        t = view(m, name)
        return t is not None and t.dtype in dtypes

    return _named(guard, f"dtype_in({name}, {', '.join(str(d).replace('torch.', '') for d in dtypes)})")


def sqrt(d: Any) -> Any:
    """``math.sqrt(d)``, recorded as a graph node when ``d`` is a Proxy (a replacement runs on
    Proxies when it is spliced in, and on real values when a rule is property-tested)."""
    if isinstance(d, fx.Proxy):
        return d.tracer.create_proxy("call_function", math.sqrt, (d,), {})
    return math.sqrt(d)


def broadcast_shape(*shapes: Any) -> tuple[Any, ...]:
    """The shape ``shapes`` broadcast to, as ``torch.broadcast_shapes`` gives it (a
    ``RuntimeError`` when they do not broadcast), in plain Python when every size is an ``int``:
    torch 2.13 routes ``broadcast_shapes`` through its reference implementations, ~100-700 us a
    call, paid by the attention guards at every match and every example the checker draws.
    Symbolic sizes go to torch, which knows how to compare them.

    >>> broadcast_shape((2, 1, 4), (3, 1)), broadcast_shape((5,), ())
    ((2, 3, 4), (5,))
    """
    if not all(type(size) is int for shape in shapes for size in shape):
        return tuple(torch.broadcast_shapes(*shapes))
    result: list[int] = []
    rank = max((len(shape) for shape in shapes), default=0)
    for position in range(1, rank + 1):
        size = 1
        for shape in shapes:
            if position <= len(shape):
                own = shape[-position]
                if own < 0:
                    raise RuntimeError(f"broadcast_shape: negative size {own} in {tuple(shape)}")
                if own != 1:
                    if size not in (1, own):
                        raise RuntimeError(f"broadcast_shape: {tuple(shapes)} do not broadcast (size {size} "
                                           f"against {own} at dimension {-position})")
                    size = own
        result.append(size)
    return tuple(reversed(result))
