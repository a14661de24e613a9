"""A rule's ``domain`` declaration: its keys (:data:`DOMAIN_KEYS`), their validation, with errors
that name the rule and the fix (:meth:`Domain.parse`), and the defaults filled in (:class:`Domain`,
and :class:`TensorDomain` for one tensor argument). Parsing only: the input plan decides what is
drawn from it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Literal

import attrs
import torch
from hypothesis.strategies import SearchStrategy

from ..errors import RuleDefinitionError
from ._values import DEFAULT_DTYPES

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
