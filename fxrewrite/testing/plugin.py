"""pytest plugin: ``pytest rules/`` property-tests every rule of every rule file.

Each rule becomes one test item, ``rules/algebra.fxr::double_neg``, that runs
:func:`fxrewrite.testing.check_rule` and, when the rule is unsound, fails with the
counterexample report. Registered as the ``pytest11`` entry point ``fxrewrite``; disable it with
``-p no:fxrewrite``.

Which files are collected:

* ``*.fxr`` files, wherever pytest collects (a ``.fxr`` file is data; loading it runs no code).
* ``*.py`` rule modules only under a path named on the command line (``pytest rules/``), never
  on a bare ``pytest`` run, and only if the file imports fxrewrite at module level (a line
  starting ``import fxrewrite`` or ``from fxrewrite``), is not a test file (``python_files``
  patterns, ``conftest.py``, ``__init__.py``) and its name does not start with ``_`` or ``.``
  (helpers, as the loader skips them). A module that defines no rule yields no item. Importing a
  rule module runs it, so ordinary modules are never imported by surprise, and the modules of a
  package that merely mention fxrewrite (fxrewrite's own, run by ``pytest --doctest-modules
  fxrewrite``) are left to the other collectors.

Options (group "fxrewrite"): ``--fxrewrite-examples N`` (default: the Hypothesis profile's
``max_examples``) and ``--fxrewrite-seed S`` (default: derandomized, the same examples every
run).

The plugin imports fxrewrite and Hypothesis only inside its hooks, so merely having it
installed costs nothing.
"""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from fxrewrite.rule import Rule
    from fxrewrite.testing.equivalence import CheckResult

GROUP = "fxrewrite"
OPTION_EXAMPLES = "--fxrewrite-examples"
OPTION_SEED = "--fxrewrite-seed"
MARKER = "fxrewrite_rule"

_SKIPPED_NAMES = ("conftest.py", "__init__.py", "setup.py")
_IMPORTS_FXREWRITE = re.compile(r"^(?:import|from)[ \t]+fxrewrite\b", re.MULTILINE)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup(GROUP, "fxrewrite: property-test rewrite rules")
    group.addoption(
        OPTION_EXAMPLES, dest="fxrewrite_examples", type=int, default=None, metavar="N",
        help="examples drawn per rule (default: the Hypothesis profile's max_examples).",
    )
    group.addoption(
        OPTION_SEED, dest="fxrewrite_seed", type=int, default=None, metavar="S",
        help="seed of the search (default: derandomized, the same examples every run).",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{MARKER}: a rewrite rule property-tested by the fxrewrite plugin")
    examples = config.getoption("fxrewrite_examples", None)
    if examples is not None and examples < 1:
        raise pytest.UsageError(f"{OPTION_EXAMPLES} must be at least 1, got {examples}.")


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    if file_path.suffix == ".fxr" or (file_path.suffix == ".py" and is_rule_module(file_path, parent.config)):
        return RuleFile.from_parent(parent, path=file_path)
    return None


def _named_paths(config: pytest.Config) -> list[Path]:
    """Paths given on the command line (not from ``testpaths`` or the current directory)."""
    if config.args_source != pytest.Config.ArgsSource.ARGS:
        return []
    root = config.invocation_params.dir
    return [(root / arg.split("::")[0]).resolve() for arg in config.args]


def is_rule_module(path: Path, config: pytest.Config) -> bool:
    """Whether the plugin collects the Python file ``path`` as a rule module (see above)."""
    name = path.name
    if name in _SKIPPED_NAMES or name.startswith(("_", ".")):
        return False
    if any(fnmatch.fnmatch(name, pattern) for pattern in config.getini("python_files")):
        return False
    resolved = path.resolve()
    if not any(resolved == named or named in resolved.parents for named in _named_paths(config)):
        return False
    try:
        return _IMPORTS_FXREWRITE.search(path.read_text(encoding="utf-8")) is not None
    except (OSError, UnicodeDecodeError):
        return False


class RuleFile(pytest.File):
    """A rule file; its rules are its items, in file order."""

    def collect(self) -> list[RuleItem]:
        from fxrewrite.errors import FxRewriteError
        from fxrewrite.loader import load_rules

        try:
            rules = load_rules(self.path)
        except FxRewriteError as exc:
            raise self.CollectError(f"fxrewrite could not load the rules of {self.path}:\n{exc}") from None
        return [RuleItem.from_parent(self, name=rule.name, rule=rule) for rule in rules]


class RuleCheckFailed(Exception):
    """Raised by a rule item whose rule is not sound; carries the :class:`CheckResult`."""

    def __init__(self, result: CheckResult) -> None:
        super().__init__(result.message)
        self.result = result


class RuleItem(pytest.Item):
    """One rule, property-tested with :func:`fxrewrite.testing.check_rule`."""

    def __init__(self, *, rule: Rule, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.rule = rule
        self.add_marker(MARKER)

    def setup(self) -> None:
        from fxrewrite.testing.check_cli import setup_error

        problem = setup_error(self.rule)
        if problem is not None:  # the rule cannot run: an error at set-up, not a failed check
            pytest.fail(problem, pytrace=False)

    def runtest(self) -> None:
        from fxrewrite.testing.check_cli import checked

        seed = self.config.getoption("fxrewrite_seed")
        result = checked(self.rule, examples=_examples(self.config), seed=seed)
        self.user_properties.append(("fxrewrite", f"{result.verdict}: {result.examples_run} examples"))
        if not result.ok:
            raise RuleCheckFailed(result)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        if isinstance(excinfo.value, RuleCheckFailed):
            return excinfo.value.result.message
        return str(super().repr_failure(excinfo, style=style))

    def reportinfo(self) -> tuple[Path, int | None, str]:
        _, _, line = self.rule.origin.rpartition(":")
        return self.path, int(line) - 1 if line.isdigit() else None, f"rule {self.rule.name}"


def _examples(config: pytest.Config) -> int:
    examples = config.getoption("fxrewrite_examples")
    if examples is not None:
        return int(examples)
    from hypothesis import settings

    return int(settings.default.max_examples) if settings.default is not None else 100
