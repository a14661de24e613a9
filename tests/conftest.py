"""Shared test configuration: Hypothesis profiles, and the one-second rule.

``ci`` (selected when CI=true, or with --hypothesis-profile=ci) is deterministic and bounded;
``dev`` is the everyday profile; ``slow`` searches long and is meant for ``-m slow`` runs.

The one-second rule (CONTRIBUTING.md): a test that is not marked ``@pytest.mark.slow`` fails when
its call takes :data:`SLOW_SECONDS` of CPU time or more. CPU time (this process's and that of the
child processes it waited for), not wall time, so a machine loaded by other work does not make the
check flaky (torch runs on one intra-op thread in the tests, and so do the child processes they
start: idle pool threads spin and bill CPU time that grows with the machine's load, up to 2.5x on
a 2-core machine; the tests' tensors are too small to gain from threads); fixtures' set-up is
not counted (a module-scoped fixture is shared by its tests).
A call that imported modules is not judged: it paid the process's one-time cost of importing
torch's parts (``torch.export``, Inductor), which falls on whichever test comes first in a file
run alone or in an xdist worker, and on no test of a full run's later files.
Full (generation 2) garbage collections are not counted either: each walks every object the
process keeps alive, 0.3 to 0.7 s of CPU once a full run has loaded the rules, the test data and
the caches (800,000 objects and more), and falls on whichever test allocates past Python's
threshold, so a test of 0.3 s failed in a full serial run and passed alone
(``test_guards_get_literal_and_module_captures``; 51 full collections, 9 s of the 63 s of CPU
of a full serial run). Young collections, the cost of the test's own garbage, are counted.
"""

from __future__ import annotations

import gc
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    deadline=None,
    max_examples=60,
    derandomize=True,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile("dev", deadline=None, max_examples=100)
settings.register_profile("slow", deadline=None, max_examples=2000)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))


def _no_local_constants() -> None:
    """Hypothesis (6.131 and later) mixes into its draws the literals of the project's modules
    imported so far (fxrewrite, rules/, examples/, benchmarks/; tests/ is skipped). Which are
    imported depends on the test order and on xdist's split, so the ``ci`` profile's derandomized
    searches drew differently from run to run: a CI failure passed alone in the same clone. The
    tests draw with Hypothesis's own constants only. (A private hook: on a Hypothesis without it
    there is nothing to pin.)"""
    try:
        from hypothesis.internal.conjecture import providers
        from hypothesis.internal.constants_ast import Constants
    except ImportError:
        return
    if hasattr(providers, "_get_local_constants"):
        empty = Constants()
        providers._get_local_constants = lambda: empty


_no_local_constants()

# The scenario suites' data is imported by name, as tests/_helpers is (pytest puts tests/ on
# sys.path for this conftest): test_match and test_replace run every shipped rule's case of
# e2e/test_stdlib.py, test_dispatch the random programs of e2e/test_fuzz_rewrite.py.
sys.path.insert(1, str(Path(__file__).resolve().parent / "e2e"))



def pytest_configure(config: pytest.Config) -> None:
    """The parse cache of ``.fxr`` files (``fxrewrite._cache``) writes into a temporary
    directory for the session, never into the developer's ``~/.cache``; child processes the tests
    start inherit it."""
    config._fxrewrite_cache_home = os.environ.get("XDG_CACHE_HOME")  # type: ignore[attr-defined]
    config._fxrewrite_test_cache = tempfile.mkdtemp(prefix="fxrewrite-test-cache-")  # type: ignore[attr-defined]
    os.environ["XDG_CACHE_HOME"] = config._fxrewrite_test_cache  # type: ignore[attr-defined]
    _one_torch_thread()
    gc.callbacks.append(_FULL_COLLECTIONS.observe)


def _one_torch_thread() -> None:
    """One intra-op thread for torch here and in the processes the tests start (see the module's
    docstring: the one-second rule measures CPU time, which spinning pool threads inflate)."""
    import torch

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)


def pytest_unconfigure(config: pytest.Config) -> None:
    if _FULL_COLLECTIONS.observe in gc.callbacks:
        gc.callbacks.remove(_FULL_COLLECTIONS.observe)
    shutil.rmtree(getattr(config, "_fxrewrite_test_cache", ""), ignore_errors=True)
    saved = getattr(config, "_fxrewrite_cache_home", None)
    if saved is None:
        os.environ.pop("XDG_CACHE_HOME", None)
    else:
        os.environ["XDG_CACHE_HOME"] = saved


#: CPU seconds from which a test's call must be marked ``slow``.
SLOW_SECONDS = 1.0

def cpu_seconds() -> float:
    """CPU time of this process and of the child processes it has waited for (subprocess tests)."""
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


class _FullCollectionTime:
    """CPU seconds this process has spent in full (generation 2) garbage collections, kept by a
    ``gc.callbacks`` entry (:meth:`observe`, installed by ``pytest_configure``)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._started: float | None = None

    def observe(self, phase: str, info: dict[str, Any]) -> None:
        if info.get("generation") != 2:
            return
        if phase == "start":
            self._started = time.process_time()
        elif self._started is not None:
            self.seconds += time.process_time() - self._started
            self._started = None


_FULL_COLLECTIONS = _FullCollectionTime()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    """Fails a test that is not marked ``slow`` and whose call took :data:`SLOW_SECONDS` of CPU
    time or more, full garbage collections left out (a test that failed on its own keeps its own
    failure)."""
    start, modules, collecting = cpu_seconds(), len(sys.modules), _FULL_COLLECTIONS.seconds
    result = yield
    spent = cpu_seconds() - start - (_FULL_COLLECTIONS.seconds - collecting)
    first_use = len(sys.modules) > modules  # it imported what the process had not needed yet
    if spent >= SLOW_SECONDS and item.get_closest_marker("slow") is None and not first_use:
        pytest.fail(f"{item.nodeid} took {spent:.2f} s of CPU time (the limit for an unmarked test is "
                    f"{SLOW_SECONDS:g} s): mark it @pytest.mark.slow or make it faster", pytrace=False)
    return result
