"""A rule's ``domain`` declaration, as the input plan reads it: :class:`Domain`,
:class:`TensorDomain` and :data:`DOMAIN_KEYS` live in :mod:`fxrewrite.domain` (where a rule is
validated when it is built, and :mod:`fxrewrite.analysis` reads them too); this module keeps
the names the testing package has always imported from here.
"""

from __future__ import annotations

from ..domain import DOMAIN_KEYS, INPUT_KEYS, Domain, ShapeMode, TensorDomain

_INPUT_KEYS = INPUT_KEYS  # the name fxrewrite.testing.strategies imports

__all__ = ["DOMAIN_KEYS", "INPUT_KEYS", "Domain", "ShapeMode", "TensorDomain"]
