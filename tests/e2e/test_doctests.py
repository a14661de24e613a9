"""Every example in the package's docstrings runs (``>>>`` lines), module by module."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import fxrewrite

MODULES = sorted(
    info.name for info in pkgutil.walk_packages(fxrewrite.__path__, prefix="fxrewrite.")
    if "._rules" not in info.name and not info.name.endswith("__main__")
)


#: Modules whose examples run property searches, torch.compile or load the library (a second or
#: more of CPU): in the slow set (CI runs it).
SLOW_MODULES = {"fxrewrite.inductor", "fxrewrite.loader", "fxrewrite.testing", "fxrewrite.testing._inputs",
                "fxrewrite.testing._values", "fxrewrite.testing.equivalence", "fxrewrite.testing.repair"}


@pytest.mark.parametrize("name", [pytest.param(m, marks=pytest.mark.slow) if m in SLOW_MODULES else m for m in MODULES])
def test_docstring_examples_run(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE, verbose=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} docstring example(s) of {name} failed"


def test_the_public_functions_show_an_example():
    for name in ("rewrite", "explain", "load_rules"):
        assert ">>>" in (getattr(fxrewrite, name).__doc__ or ""), name


def test_the_package_has_a_good_number_of_examples():
    finder = doctest.DocTestFinder()
    total = sum(len(t.examples) for name in MODULES for t in finder.find(importlib.import_module(name)))
    assert total >= 39
