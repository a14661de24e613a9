"""Pause Python's cyclic garbage collector while a rewrite runs: :func:`collections_paused`.

A rewrite of a large graph allocates hundreds of thousands of small objects (nodes, argument
tuples, metadata dictionaries) and keeps most of them. CPython starts a full collection whenever
enough new objects survived, and a full collection walks every live object of the process: on a
64k-node graph these collections cost more than the rewrite itself (measured in
``benchmarks/bench_rewrite.py``). Reference counting still frees all acyclic garbage at once;
only cycles wait until the collector runs again after the block.

The collector is process-wide, so the pause is shared: the first thread to enter turns the
collector off (if it was on), the last one to leave turns it back on. A collector the caller
disabled stays disabled.

>>> import gc
>>> with collections_paused():
...     gc.isenabled()
False
>>> gc.isenabled()
True
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

__all__ = ["collections_paused"]

_lock = threading.Lock()
_users = 0
_was_enabled = False


@contextlib.contextmanager
def collections_paused() -> Iterator[None]:
    """No cyclic garbage collection inside the block (reference counting goes on)."""
    global _users, _was_enabled
    with _lock:
        if _users == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _users += 1
    try:
        yield
    finally:
        with _lock:
            _users -= 1
            if _users == 0 and _was_enabled:
                gc.enable()
