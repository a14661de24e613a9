"""Compare what two programs compute, and say readably how they differ.

:func:`compare` compares two results (tensors, or tuples, lists and dicts of them) and returns
``None`` when they are equal, else one line saying where and how they differ.
:func:`assert_equivalent` runs a model before and after a rewrite on the same inputs and raises
:class:`~fxrewrite.errors.NotEquivalent`, with the inputs and both outputs, when they differ.
:func:`format_value` prints a value the way reports show it: small tensors in full, as a
``torch.tensor(...)`` call with their dtype and shape.

Equality is ``torch.testing.assert_close``'s with ``equal_nan=True``: same type and structure,
same shape, same dtype, and values within a tolerance (by default the per-dtype tolerance of
``assert_close``; exact for integers and bools). ``nan`` equals ``nan``; ``inf`` and ``-inf``
equal only themselves; ``0.0`` equals ``-0.0``.

>>> import torch
>>> compare(torch.tensor([1.0, float("nan")]), torch.tensor([1.0, float("nan")])) is None
True
>>> print(compare(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.5])))  # doctest: +NORMALIZE_WHITESPACE
values differ at 1 of 2 elements (rtol=1.3e-06, atol=1e-05):
at index (1,) expected 2.0, actual 2.5 (absolute difference 0.5)
>>> print(compare((torch.zeros(2),), (torch.zeros(3),)))
[0]: shapes differ: expected (2,), actual (3,)
>>> format_value(torch.tensor([0.0, -0.0, float("inf")]))
'torch.tensor([0.0, -0.0, inf], dtype=torch.float32)  # shape (3,)'

This module imports neither pytest nor hypothesis: ``rewrite`` may use it on every call.
"""

from __future__ import annotations

import copy
import inspect
import math
import struct
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from .errors import NotEquivalent

__all__ = [
    "Inputs",
    "assert_equivalent",
    "compare",
    "default_tolerance",
    "format_value",
    "fresh_copy",
]

#: One call's positional arguments, or a list of such tuples (a lone tensor is a 1-tuple).
Inputs = Any

#: ``torch.testing.assert_close``'s default ``(rtol, atol)`` per dtype; other dtypes are exact.
_DEFAULT_TOLERANCES: Mapping[torch.dtype, tuple[float, float]] = {
    torch.float16: (1e-3, 1e-5),
    torch.bfloat16: (1.6e-2, 1e-5),
    torch.float32: (1.3e-6, 1e-5),
    torch.float64: (1e-7, 1e-7),
    torch.complex32: (1e-3, 1e-5),
    torch.complex64: (1.3e-6, 1e-5),
    torch.complex128: (1e-7, 1e-7),
}

#: Tensors with at most this many elements are printed in full.
FULL_PRINT_LIMIT = 32


def default_tolerance(dtype: torch.dtype) -> tuple[float, float]:
    """``(rtol, atol)`` that ``torch.testing.assert_close`` uses for ``dtype`` by default.

    >>> default_tolerance(torch.float32), default_tolerance(torch.int64)
    ((1.3e-06, 1e-05), (0.0, 0.0))
    """
    return _DEFAULT_TOLERANCES.get(dtype, (0.0, 0.0))


def _tolerance(dtype: torch.dtype, rtol: float | None, atol: float | None) -> tuple[float, float]:
    default_rtol, default_atol = default_tolerance(dtype)
    return (default_rtol if rtol is None else rtol, default_atol if atol is None else atol)


# -- comparing -----------------------------------------------------------------------------------


def compare(
    expected: Any,
    actual: Any,
    *,
    rtol: float | None = None,
    atol: float | None = None,
    names: tuple[str, str] = ("expected", "actual"),
) -> str | None:
    """``None`` if ``actual`` equals ``expected``, else a one-line description of the first
    difference, prefixed by where it is (``[0]``, ``['key']``) in nested results.

    ``rtol`` / ``atol`` override the per-dtype defaults of ``torch.testing.assert_close``
    (either may be given alone). ``names`` label the two sides in the description.

    >>> print(compare(torch.ones(2, dtype=torch.int64), torch.ones(2), names=("pattern", "replacement")))
    dtypes differ: pattern torch.int64, replacement torch.float32
    >>> compare(torch.tensor(float("inf")), torch.tensor(float("inf"))) is None
    True
    """
    return _compare(expected, actual, rtol, atol, names, "")


def _compare(expected: Any, actual: Any, rtol: float | None, atol: float | None,
             names: tuple[str, str], path: str) -> str | None:
    if isinstance(expected, torch.Tensor) or isinstance(actual, torch.Tensor):
        return _compare_tensors(expected, actual, rtol, atol, names, path)
    if isinstance(expected, Mapping) and isinstance(actual, Mapping):
        return _compare_mappings(expected, actual, rtol, atol, names, path)
    if _is_sequence(expected) and _is_sequence(actual):
        return _compare_sequences(expected, actual, rtol, atol, names, path)
    return _compare_scalars(expected, actual, rtol, atol, names, path)


def _is_sequence(value: Any) -> bool:
    return isinstance(value, (tuple, list))


def _where(path: str) -> str:
    return f"{path}: " if path else ""


def _kind(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    if _is_sequence(value):
        return f"a {type(value).__name__} of {len(value)} values"
    return f"{value!r} ({type(value).__name__})"


def _compare_mappings(expected: Mapping[Any, Any], actual: Mapping[Any, Any], rtol: float | None,
                      atol: float | None, names: tuple[str, str], path: str) -> str | None:
    if set(expected) != set(actual):
        return (f"{_where(path)}keys differ: {names[0]} has {sorted(map(repr, expected))}, "
                f"{names[1]} has {sorted(map(repr, actual))}")
    for key in expected:
        problem = _compare(expected[key], actual[key], rtol, atol, names, f"{path}[{key!r}]")
        if problem:
            return problem
    return None


def _compare_sequences(expected: Sequence[Any], actual: Sequence[Any], rtol: float | None,
                       atol: float | None, names: tuple[str, str], path: str) -> str | None:
    if len(expected) != len(actual):
        return f"{_where(path)}lengths differ: {names[0]} is {_kind(expected)}, {names[1]} is {_kind(actual)}"
    for i, (e, a) in enumerate(zip(expected, actual, strict=True)):
        problem = _compare(e, a, rtol, atol, names, f"{path}[{i}]")
        if problem:
            return problem
    return None


def _compare_scalars(expected: Any, actual: Any, rtol: float | None, atol: float | None,
                     names: tuple[str, str], path: str) -> str | None:
    if type(expected) is type(actual):
        if isinstance(expected, (float, complex)):
            equal = _close_floats(complex(expected), complex(actual), rtol, atol)
        else:
            equal = _safe_equal(expected, actual)
        if equal:
            return None
    return f"{_where(path)}{names[0]} is {_kind(expected)}, {names[1]} is {_kind(actual)}"


def _close_floats(e: complex, a: complex, rtol: float | None, atol: float | None) -> bool:
    rtol, atol = _tolerance(torch.float64, rtol, atol)
    parts = ((e.real, a.real), (e.imag, a.imag))
    for x, y in parts:
        if math.isnan(x) or math.isnan(y):
            if not (math.isnan(x) and math.isnan(y)):
                return False
        elif math.isinf(x) or math.isinf(y):
            if x != y:
                return False
        elif abs(x - y) > atol + rtol * abs(x):
            return False
    return True


def _safe_equal(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:  # an == that does not return a bool never counts as equal
        return False


def _compare_tensors(expected: Any, actual: Any, rtol: float | None, atol: float | None,
                     names: tuple[str, str], path: str) -> str | None:
    where = _where(path)
    if not (isinstance(expected, torch.Tensor) and isinstance(actual, torch.Tensor)):
        return f"{where}{names[0]} is {_kind(expected)}, {names[1]} is {_kind(actual)}"
    if expected.shape != actual.shape:
        return f"{where}shapes differ: {names[0]} {tuple(expected.shape)}, {names[1]} {tuple(actual.shape)}"
    if expected.dtype != actual.dtype:
        return f"{where}dtypes differ: {names[0]} {expected.dtype}, {names[1]} {actual.dtype}"
    if expected.device != actual.device:
        return f"{where}devices differ: {names[0]} {expected.device}, {names[1]} {actual.device}"
    return _compare_values(expected.detach(), actual.detach(), rtol, atol, names, where)


def _compare_values(expected: torch.Tensor, actual: torch.Tensor, rtol: float | None, atol: float | None,
                    names: tuple[str, str], where: str) -> str | None:
    if expected.numel() == 0:
        return None
    exact = not (expected.dtype.is_floating_point or expected.dtype.is_complex)
    if exact:
        mismatch = expected != actual
        tolerance = "exactly"
    else:
        r, a = _tolerance(expected.dtype, rtol, atol)
        wide = torch.complex128 if expected.dtype.is_complex else torch.float64
        mismatch = ~torch.isclose(actual.to(wide), expected.to(wide), rtol=r, atol=a, equal_nan=True)
        tolerance = f"rtol={r:g}, atol={a:g}"
    count = int(mismatch.sum())
    if count == 0:
        return None
    return where + _describe_mismatch(expected, actual, mismatch, count, tolerance, names)


def _describe_mismatch(expected: torch.Tensor, actual: torch.Tensor, mismatch: torch.Tensor, count: int,
                       tolerance: str, names: tuple[str, str]) -> str:
    flat = int(mismatch.reshape(-1).nonzero()[0])
    index = _unravel(flat, tuple(expected.shape))
    e = expected.reshape(-1)[flat].item()
    a = actual.reshape(-1)[flat].item()
    text = (f"values differ at {count} of {expected.numel()} elements ({tolerance}): at index {index} "
            f"{names[0]} {_scalar(e, expected.dtype)}, {names[1]} {_scalar(a, actual.dtype)}")
    if isinstance(e, (int, float)) and isinstance(a, (int, float)) and not isinstance(e, bool):
        difference = abs(float(e) - float(a))
        if math.isfinite(difference):
            text += f" (absolute difference {difference:.3g})"
    return text


def _unravel(flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    index = []
    for size in reversed(shape):
        index.append(flat % size)
        flat //= size
    return tuple(reversed(index))


# -- printing ------------------------------------------------------------------------------------

_PACK_FORMAT = {torch.float32: "f", torch.float16: "e"}


def _round_trips(text: str, value: float, dtype: torch.dtype) -> bool:
    candidate = float(text)
    if dtype in _PACK_FORMAT:
        fmt = _PACK_FORMAT[dtype]
        try:
            return struct.unpack(fmt, struct.pack(fmt, candidate))[0] == value
        except OverflowError:
            return False
    if dtype == torch.bfloat16:
        return torch.tensor(candidate, dtype=dtype).item() == value
    return candidate == value


def _scalar(value: Any, dtype: torch.dtype) -> str:
    """The shortest text that reads back as ``value`` in ``dtype`` (floats), else ``repr``."""
    if isinstance(value, bool) or not isinstance(value, float):
        return repr(value)
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if dtype == torch.float64:
        return repr(value)
    for digits in range(1, 18):
        text = f"{value:.{digits}g}"
        if _round_trips(text, value, dtype):
            break
    if "e" not in text and "." not in text:
        text += ".0"
    return text.replace("e+", "e")


def _nested(values: Any, dtype: torch.dtype) -> str:
    if isinstance(values, list):
        return "[" + ", ".join(_nested(v, dtype) for v in values) + "]"
    return _scalar(values, dtype)


def format_tensor(t: torch.Tensor) -> str:
    """A tensor as a readable, copy-pastable ``torch.tensor(...)`` call with its shape (needs
    ``from math import inf, nan`` to paste), or a summary when it has many elements.

    >>> format_tensor(torch.tensor([[1, 2]], dtype=torch.int32))
    'torch.tensor([[1, 2]], dtype=torch.int32)  # shape (1, 2)'
    """
    t = t.detach()
    shape = tuple(t.shape)
    layout = "" if t.is_contiguous() or t.numel() <= 1 else f", non-contiguous (strides {t.stride()})"
    if t.numel() == 0:
        return f"torch.empty({shape}, dtype={t.dtype})  # shape {shape}{layout}"
    if t.numel() > FULL_PRINT_LIMIT:
        return f"<tensor of shape {shape}, dtype={t.dtype}: {_summary(t)}>{layout}"
    values = t.cpu().tolist()
    return f"torch.tensor({_nested(values, t.dtype)}, dtype={t.dtype})  # shape {shape}{layout}"


def _summary(t: torch.Tensor) -> str:
    if t.dtype == torch.bool:
        return f"{int(t.sum())} True of {t.numel()}"
    if t.dtype.is_complex:
        return f"{t.numel()} complex values"
    wide = t.double()
    finite = wide[torch.isfinite(wide)]
    parts = []
    if finite.numel():
        low, high = (_scalar(float(v), torch.float64) for v in (finite.min(), finite.max()))
        parts.append(f"min {low}, max {high}")
    for name, count in (("nan", int(torch.isnan(wide).sum())), ("inf", int(torch.isinf(wide).sum()))):
        if count:
            parts.append(f"{count} {name}")
    return ", ".join(parts)


def format_value(value: Any) -> str:
    """A value (tensor, module, literal, or nested tuple/list/dict of them) as reports show it.

    >>> format_value((torch.tensor(1.5), 2))
    '(torch.tensor(1.5, dtype=torch.float32)  # shape (), 2)'
    """
    if isinstance(value, torch.Tensor):
        return format_tensor(value)
    if isinstance(value, torch.nn.Module):
        return " ".join(repr(value).split())
    if isinstance(value, tuple):
        inner = ", ".join(format_value(v) for v in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    if isinstance(value, list):
        return "[" + ", ".join(format_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k!r}: {format_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, float):
        return _scalar(value, torch.float64)
    return repr(value)


# -- whole programs ------------------------------------------------------------------------------


def fresh_copy(value: Any) -> Any:
    """A copy of an input that a call may modify freely: tensors cloned (strides kept), modules
    deep-copied, containers copied recursively, everything else shared."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone(memory_format=torch.preserve_format)
    if isinstance(value, torch.nn.Module):
        return copy.deepcopy(value)
    if isinstance(value, (tuple, list)):
        return type(value)(fresh_copy(v) for v in value)
    if isinstance(value, dict):
        return {k: fresh_copy(v) for k, v in value.items()}
    return value


def _calls(inputs: Inputs) -> list[tuple[Any, ...]]:
    if isinstance(inputs, list):
        return [args if isinstance(args, tuple) else (args,) for args in inputs]
    return [inputs if isinstance(inputs, tuple) else (inputs,)]


def _argument_names(fn: Callable[..., Any], count: int) -> list[str]:
    target = fn.forward if isinstance(fn, torch.nn.Module) else fn
    try:
        params = [p for p in inspect.signature(target).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        params = []
    names = [p.name for p in params[:count]]
    return names + [f"arg{i}" for i in range(len(names), count)]


def _program_report(headline: str, fn: Callable[..., Any], args: tuple[Any, ...], expected: Any,
                    actual: str) -> str:
    lines = [headline, "  inputs:"]
    for name, value in zip(_argument_names(fn, len(args)), args, strict=True):
        lines.append(f"    {name} = {format_value(value)}")
    lines.append(f"  before -> {format_value(expected)}")
    lines.append(f"  after  -> {actual}")
    return "\n".join(lines)


def assert_equivalent(before: Callable[..., Any], after: Callable[..., Any], inputs: Inputs, *,
                      rtol: float | None = None, atol: float | None = None) -> None:
    """Raise :class:`~fxrewrite.errors.NotEquivalent` unless ``after`` computes what ``before``
    computes on every call in ``inputs`` (a tuple of positional arguments, or a list of them).

    Each side gets its own copy of the inputs, so in-place operations cannot leak between them.

    >>> import torch, fxrewrite
    >>> def model(x):
    ...     return torch.neg(torch.neg(x)) * 2
    >>> rule = fxrewrite.Rule.from_functions(lambda x: torch.neg(torch.neg(x)), lambda x: x, name="double_neg")
    >>> after = fxrewrite.rewrite(model, rule).module
    >>> assert_equivalent(model, after, [(torch.randn(3),), (torch.tensor([float("nan")]),)])
    >>> assert_equivalent(model, lambda x: x * 3, (torch.ones(1),))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    fxrewrite.errors.NotEquivalent: the program after the rewrite differs from the one before on call 1 of 1: ...
      inputs:
        x = torch.tensor([1.0], dtype=torch.float32)  # shape (1,)
      before -> torch.tensor([2.0], dtype=torch.float32)  # shape (1,)
      after  -> torch.tensor([3.0], dtype=torch.float32)  # shape (1,)
    """
    calls = _calls(inputs)
    for number, args in enumerate(calls, 1):
        where = f"call {number} of {len(calls)}"
        expected = before(*fresh_copy(args))
        try:
            actual = after(*fresh_copy(args))
        except Exception as exc:
            headline = f"the program after the rewrite raises on {where} (the one before does not)"
            raise NotEquivalent(_program_report(
                headline, before, args, expected, f"raised {type(exc).__name__}: {exc}")) from exc
        problem = compare(expected, actual, rtol=rtol, atol=atol, names=("before", "after"))
        if problem:
            headline = f"the program after the rewrite differs from the one before on {where}: {problem}"
            raise NotEquivalent(_program_report(headline, before, args, expected, format_value(actual)))
