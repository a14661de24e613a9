"""The checker's draws depend on the rule and the seed, not on what else the process imported.

Hypothesis (6.131 and later) now and then draws a literal found in the source of a module the
process imported from outside site-packages and the standard library: the user's model code,
their rule files, a notebook's helpers, fxrewrite itself when installed editable. So a
derandomized check drew other inputs in a process that had imported one more module, and
``check_rule``'s promise, "the same examples every run", held only for the same imports (a
verdict found in CI could then change on the user's machine). The checker's searches run inside
:func:`own_constants_only`: Hypothesis draws from its own constants, never the process's.

The switch reaches into Hypothesis internals (``providers._get_local_constants`` and the cache
of constants each kind of draw may take). On a Hypothesis without them there is nothing to
switch: its draws did not depend on the imports in the first place.

>>> with own_constants_only():
...     pass
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["OWN_CONSTANTS_ONLY", "own_constants_only"]

#: Whether the checker's searches ignore the constants of the modules the process imported.
#: False is the slow twin in behaviour only (Hypothesis's default: draws that depend on the
#: imports); tests set it to show the difference the switch makes.
OWN_CONSTANTS_ONLY = True

_lock = threading.Lock()
_depth = 0
_saved_lookup: Callable[[], Any] | None = None
#: Per thread, the caches set aside by the enclosing entries (Hypothesis keeps one per thread).
_set_aside = threading.local()


def _internals() -> tuple[Any, Any] | None:
    """Hypothesis's providers module and its ``Constants`` class, or None when this Hypothesis
    has no local constants to switch off."""
    try:
        from hypothesis.internal.conjecture import providers
        from hypothesis.internal.constants_ast import Constants
    except ImportError:
        return None
    cache = getattr(providers, "CONSTANTS_CACHE", None)
    if not hasattr(providers, "_get_local_constants") or not isinstance(getattr(cache, "cache", None), dict):
        return None
    return providers, Constants


@contextlib.contextmanager
def own_constants_only() -> Iterator[None]:
    """Draw with Hypothesis's own constants only while inside; nestable and shared by threads
    (the first to enter switches the lookup, the last to leave restores it). Each thread's cache
    of permitted constants is set aside on entry, since it may hold the process's constants,
    and put back on exit, so the caller's own Hypothesis tests draw afterwards as before."""
    internals = _internals() if OWN_CONSTANTS_ONLY else None
    if internals is None:
        yield
        return
    providers, constants_type = internals
    _switch_lookup(providers, constants_type)
    cache = providers.CONSTANTS_CACHE.cache  # this thread's
    stack = _set_aside.__dict__.setdefault("stack", [])
    stack.append(dict(cache))
    cache.clear()
    try:
        yield
    finally:
        cache = providers.CONSTANTS_CACHE.cache
        cache.clear()
        cache.update(stack.pop())
        _restore_lookup(providers)


def _switch_lookup(providers: Any, constants_type: Any) -> None:
    global _depth, _saved_lookup
    with _lock:
        if _depth == 0:
            none = constants_type()
            _saved_lookup = providers._get_local_constants
            providers._get_local_constants = lambda: none
        _depth += 1


def _restore_lookup(providers: Any) -> None:
    global _depth, _saved_lookup
    with _lock:
        _depth -= 1
        if _depth == 0 and _saved_lookup is not None:
            providers._get_local_constants, _saved_lookup = _saved_lookup, None
