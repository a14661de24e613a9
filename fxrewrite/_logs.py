"""A logger silenced for the length of a ``with`` block (fxrewrite's probes run torch code whose
loggers report, at length, things fxrewrite expects: inputs a fake tensor does not fit, a pass
that bypasses Inductor's cache)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

__all__ = ["quieted"]


@contextlib.contextmanager
def quieted(name: str, level: int = logging.CRITICAL) -> Iterator[None]:
    """Raise logger ``name``'s level to ``level`` inside the block, and restore it after.

    >>> with quieted("torch._inductor.codecache", logging.ERROR):
    ...     logging.getLogger("torch._inductor.codecache").level
    40
    """
    log = logging.getLogger(name)
    previous = log.level
    log.setLevel(level)
    try:
        yield
    finally:
        log.setLevel(previous)
