"""A rule's ``tolerance`` declaration, parsed and described: :class:`Tolerance`. The checker
compares the two sides' outputs with it (:mod:`fxrewrite.testing._evaluation`) and the report
shows it (:mod:`fxrewrite.testing._report`). No Hypothesis here.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs
import torch

from ..errors import RuleDefinitionError
from ..verify import default_tolerance

__all__ = ["Tolerance"]

_TOLERANCE_KEYS = ("rtol", "atol")


@attrs.frozen
class Tolerance:
    """A rule's ``tolerance`` declaration: ``{"rtol": ..., "atol": ...}``; a missing key keeps
    ``torch.testing.assert_close``'s default for the output's dtype.

    >>> Tolerance.parse({"atol": 1e-3}, where="rule 'r'").describe(torch.float32)
    "declared {'atol': 0.001} (for torch.float32: rtol=1.3e-06, atol=0.001)"
    """

    rtol: float | None = None
    atol: float | None = None

    @classmethod
    def parse(cls, declared: Mapping[str, float] | None, *, where: str) -> Tolerance:
        declared = dict(declared or {})
        unknown = sorted(set(declared) - set(_TOLERANCE_KEYS))
        if unknown:
            raise RuleDefinitionError(
                f"{where}: unknown tolerance key(s) {unknown}; declare tolerance={{'rtol': ..., 'atol': ...}} "
                f"(either may be left out).")
        for key, value in declared.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise RuleDefinitionError(f"{where}: tolerance['{key}'] must be a number >= 0, got {value!r}.")
        return cls(**{k: float(v) for k, v in declared.items()})

    @property
    def declared(self) -> bool:
        return self.rtol is not None or self.atol is not None

    def describe(self, dtype: torch.dtype | None = None) -> str:
        """One line for reports, with the values in effect for ``dtype`` (default float32)."""
        dtype = torch.float32 if dtype is None else dtype
        default_rtol, default_atol = default_tolerance(dtype)
        rtol = default_rtol if self.rtol is None else self.rtol
        atol = default_atol if self.atol is None else self.atol
        exact = not (dtype.is_floating_point or dtype.is_complex)
        effective = "exact" if exact else f"rtol={rtol:g}, atol={atol:g}"
        if not self.declared:
            return f"default (as torch.testing.assert_close; for {dtype}: {effective})"
        declared = {k: v for k, v in (("rtol", self.rtol), ("atol", self.atol)) if v is not None}
        return f"declared {declared} (for {dtype}: {effective})"
