"""Load rules from files: ``*.fxr`` rule files and ``*.py`` rule modules, one file or a whole
directory, in a deterministic order.

>>> import pathlib, tempfile
>>> folder = pathlib.Path(tempfile.mkdtemp())
>>> _ = (folder / "algebra.fxr").write_text("rule mul_one:\\n    x * 1 => x\\n")
>>> rules = load_rules(folder)
>>> [(r.name, r.origin.endswith("algebra.fxr:1")) for r in rules]
[('mul_one', True)]

A ``.fxr`` file is data: loading it runs no code from it (see docs/dsl.md, "Trust model"). A
``.py`` rule file is code, like a ``conftest.py``: it is imported, so it runs. It contributes
every :class:`~fxrewrite.rule.Rule` and :class:`~fxrewrite.rule.RuleSet` bound at module level
(in definition order, rule sets flattened, each rule once), and a rule ``NAME`` for every pair
of module-level functions ``NAME_pattern`` / ``NAME_replacement`` defined in the file.
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import logging
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from ._gc import collections_paused
from .dsl import parse_rules
from .errors import RuleDefinitionError, RuleLoadError
from .rule import Rule, RuleBuilder, RuleSet

__all__ = ["OPS_FILE", "RULE_SUFFIXES", "import_file", "import_ops", "load_rules", "parse_rules",
           "standard_rules_dir"]

logger = logging.getLogger(__name__)

#: File name endings of rule files.
RULE_SUFFIXES = (".fxr", ".py")

_SKIPPED_FILES = frozenset({"__init__.py", "conftest.py"})

#: The file of a rules directory that registers the ops its rules call (``torch.library``
#: custom ops): imported before any rule file of that directory is loaded, once per process, by
#: everything that loads rules (``load_rules``, ``fxrewrite check``/``apply``/``lint``, the pytest
#: plugin, ``inductor_pass``). Its leading ``_`` keeps it from being read as a rule file.
OPS_FILE = "_ops.py"


def load_rules(path: str | Path | None = None, *, names: Mapping[str, Any] | None = None,
               with_standard: bool = False) -> RuleSet:
    """The rules of a rule file, or of every rule file under a directory.

    A directory is walked recursively in sorted order (by relative path); ``*.fxr`` and ``*.py``
    files are loaded, except ``__init__.py``, ``conftest.py`` and anything whose name starts
    with ``.`` or ``_``. Without ``path``, the standard rule library shipped with fxrewrite is
    loaded. ``with_standard=True`` loads the standard library *and* ``path`` (standard rules
    first): your rules added to the shipped ones. ``names`` is handed to every ``.fxr`` file
    (see :func:`parse_rules`).

    Raises :class:`RuleLoadError` for a missing path, a directory without rule files or a Python
    rule file that fails to import; :class:`RuleSyntaxError` / :class:`RuleDefinitionError` for a
    bad rule, and :class:`RuleDefinitionError` when two rules share a name (also a rule of yours
    named like a standard one, with ``with_standard=True``).

    >>> import pathlib, tempfile
    >>> mine = pathlib.Path(tempfile.mkdtemp()) / "mine.fxr"
    >>> _ = mine.write_text("rule exp_log:\\n    torch.exp(torch.log(x)) => x\\n")
    >>> both = load_rules(mine, with_standard=True)
    >>> both.names[-1], len(both) == len(load_rules()) + 1
    ('exp_log', True)

    Python's cyclic garbage collector is paused while the rules load (:mod:`fxrewrite._gc`): a
    load allocates many objects and keeps most, and the full collections it would trigger walk
    every object of the process, torch's included (about a third of loading the library).
    """
    with collections_paused():
        return _load_rules(path, names, with_standard)


def _load_rules(path: str | Path | None, names: Mapping[str, Any] | None, with_standard: bool) -> RuleSet:
    if with_standard and path is not None:
        return RuleSet(_unique([load_rules(names=names), load_rules(path, names=names)]))
    root = standard_rules_dir() if path is None else Path(path)
    if not root.exists():
        raise RuleLoadError(f"no such rule file or directory: '{root}'. Pass the path of a .fxr or .py file or "
                            f"of a directory containing them.")
    files = rule_files(root) if root.is_dir() else [_single_file(root)]
    if not files:
        raise RuleLoadError(f"no rule files (*.fxr, *.py) found under '{root}'; put rules in .fxr or .py files "
                            f"there, or pass another directory.")
    rules = _unique(_load_file(f, names) for f in files)
    logger.debug("loaded %d rule(s) from %d file(s) under %s", len(rules), len(files), root)
    return RuleSet(rules)


def rule_files(root: Path) -> list[Path]:
    """The rule files under directory ``root``, sorted by their path relative to ``root``."""
    found = [p for p in root.rglob("*") if p.is_file() and _is_rule_file(p.relative_to(root))]
    return sorted(found, key=lambda p: p.relative_to(root).parts)


def _is_rule_file(relative: Path) -> bool:
    if relative.suffix not in RULE_SUFFIXES or relative.name in _SKIPPED_FILES:
        return False
    return not any(part.startswith((".", "_")) for part in relative.parts)


def _single_file(path: Path) -> Path:
    if path.suffix not in RULE_SUFFIXES:
        raise RuleLoadError(f"'{path}' is not a rule file: rule files end in .fxr (rule language) or .py (Python).")
    return path


def standard_rules_dir(package: Path | None = None) -> Path:
    """Where the standard rule library is: ``fxrewrite/_rules`` in an installed package, else the
    ``rules/`` directory of the source checkout (next to ``pyproject.toml``) the package was
    imported from. ``package`` is the package directory (default: this package's)."""
    package = Path(__file__).resolve().parent if package is None else package
    installed = package / "_rules"
    if installed.is_dir():
        return installed
    checkout = package.parent
    if (checkout / "rules").is_dir() and (checkout / "pyproject.toml").is_file():
        return checkout / "rules"
    raise RuleLoadError(f"the standard rule library is missing: neither '{installed}' nor '{checkout / 'rules'}' "
                        f"exists. Reinstall fxrewrite, or pass the path of your rules to load_rules().")


def import_ops(directory: str | Path) -> ModuleType | None:
    """Import the ops file (:data:`OPS_FILE`, ``_ops.py``) of a rules directory, once per process,
    and return it; ``None`` when the directory has none. :func:`load_rules` calls it for the
    directory of every rule file before loading the file, so the ``torch.library`` ops a rule
    calls (``=> torch.ops.mylib.linear_relu(x, w, b)``) exist wherever the rules are loaded.

    Raises :class:`RuleLoadError` when the file fails to import.

    >>> import pathlib, tempfile
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (folder / "_ops.py").write_text("import torch\\nLOADED = True\\n")
    >>> import_ops(folder).LOADED, import_ops(folder) is import_ops(folder)
    (True, True)
    """
    path = Path(directory) / OPS_FILE
    if not path.is_file():
        return None
    name = _module_name(path, _OPS_PREFIX)
    if name in sys.modules:  # registering an op twice is an error: import the file once
        return sys.modules[name]
    try:
        module = import_file(path, prefix=_OPS_PREFIX)
    except (Exception, SystemExit) as exc:
        raise RuleLoadError(
            f"the ops file '{path}' of the rules next to it failed to import: {type(exc).__name__}: "
            f"{str(exc).rstrip('.')}. Fix it (it registers the ops those rules call, and runs like any Python module)."
        ) from exc
    logger.debug("imported the ops of the rules in %s from %s", path.parent, path)
    return module


_OPS_PREFIX = "fxrewrite_ops_"


def _load_file(path: Path, names: Mapping[str, Any] | None) -> Iterable[Rule]:
    import_ops(path.parent)  # the ops its rules call, before the file is read
    if path.suffix == ".fxr":
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise RuleLoadError(f"cannot read rule file '{path}': {exc}") from exc
        return parse_rules(text, source=str(path), names=names, cached=True)
    if CACHED_LIBRARY_TRACES and path.parent.resolve() == standard_rules_dir().resolve():
        return _library_rules_with_cached_traces(path)
    return _rules_of_module(_import(path), path)


#: The shipped library's Python rule files take their patterns' traces from the cache
#: (:mod:`fxrewrite._cache`; keyed by the file's text and its helpers' beside it). Its slow twin,
#: ``False``, traces every pattern; ``tests/test_cache.py`` checks that both give the same graphs.
CACHED_LIBRARY_TRACES = True


def _library_rules_with_cached_traces(path: Path) -> list[Rule]:
    """The rules of a Python file of the shipped library, its patterns' graphs replayed from the
    cache where it has them (every other check run); the traces cached when it had none."""
    from . import _cache
    from .pattern import recorded_traces

    try:
        text = path.read_text(encoding="utf-8")
        beside = b"".join(p.name.encode() + b"\0" + p.read_bytes() for p in sorted(path.parent.glob("_*.py")))
    except (OSError, UnicodeDecodeError):
        return list(_rules_of_module(_import(path), path))
    known = _cache.load_traces(text, str(path), beside)
    with recorded_traces(known) as traced:
        rules = list(_rules_of_module(_import(path), path))
    if known is None:
        _cache.store_traces(text, traced, beside)
    return rules


def _unique(groups: Iterable[Iterable[Rule]]) -> list[Rule]:
    """Concatenate, keeping each rule once: the same object, or the same definition (name and
    origin: a rule module imported by another rule file runs twice). Two different rules with
    one name are an error naming both places."""
    rules: list[Rule] = []
    seen_ids: set[int] = set()
    by_name: dict[str, Rule] = {}
    for rule in (r for group in groups for r in group):
        if id(rule) in seen_ids or (rule.name in by_name and by_name[rule.name].origin == rule.origin):
            continue
        if rule.name in by_name:
            raise RuleDefinitionError(
                f"two rules are named '{rule.name}': one at {by_name[rule.name].origin}, one at {rule.origin}; "
                f"rule names must be unique across the files loaded together, rename one of them."
            )
        seen_ids.add(id(rule))
        by_name[rule.name] = rule
        rules.append(rule)
    return rules


# ---- Python rule files -------------------------------------------------------------------------


def import_file(path: Path, *, prefix: str) -> ModuleType:
    """Import the Python file ``path`` under a module name of its own (``prefix`` + its stem +
    a hash of its absolute path, so two ``rules.py`` in different folders never collide), and
    return the module. Rule files and command-line targets are both imported this way.

    The file's directory is on ``sys.path`` only while it runs (so it can import the modules
    next to it). The module stays in ``sys.modules`` (dataclasses and pickling look modules up
    by name), unless running it raised: then the exception (``SystemExit`` too: a script that
    parses ``sys.argv`` when imported) propagates for the caller to explain, and nothing is left.

    >>> import pathlib, tempfile
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "numbers.py"
    >>> _ = path.write_text("ANSWER = 42\\n")
    >>> module = import_file(path, prefix="example_")
    >>> module.ANSWER, module.__name__.startswith("example_numbers_")
    (42, True)
    """
    name = _module_name(path, prefix)
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"'{path}' cannot be imported as a Python module (is it a .py file?).")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    directory = str(path.resolve().parent)
    sys.path.insert(0, directory)
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    finally:
        _remove_first(sys.path, directory)
    return module


def _module_name(path: Path, prefix: str) -> str:
    digest = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:12]
    stem = re.sub(r"\W", "_", path.stem)
    return f"{prefix}{stem}_{digest}"


def _import(path: Path) -> ModuleType:
    """Import a Python rule file (see :func:`import_file`); a failure is a :class:`RuleLoadError`."""
    try:
        return import_file(path, prefix="fxrewrite_rules_")
    except (Exception, SystemExit) as exc:  # SystemExit: a script that parses sys.argv when imported
        raise RuleLoadError(
            f"Python rule file '{path}' failed to import: {type(exc).__name__}: {str(exc).rstrip('.')}. Fix the file "
            f"(it runs like "
            f"any Python module when it is loaded)."
        ) from exc


def _remove_first(items: list[str], value: str) -> None:
    try:
        items.remove(value)
    except ValueError:
        pass


def _rules_of_module(module: ModuleType, path: Path) -> Iterator[Rule]:
    """The rules a module defines at module level, in definition order. A
    ``<name>_pattern``/``<name>_replacement`` pair already used by a module-level ``Rule`` (with
    its guards and priority) is not turned into a second, plain rule."""
    namespace = vars(module)
    used = {id(r.pattern) for r in _module_level_rules(namespace)}
    for name, value in list(namespace.items()):
        if isinstance(value, Rule):
            yield value
        elif isinstance(value, RuleSet):
            yield from value
        elif isinstance(value, RuleBuilder):
            raise RuleDefinitionError(value.unfinished_message(name, str(path)))
        elif name.endswith("_pattern") and _defined_in(value, module) and id(value) not in used:
            rule = _function_pair(name.removesuffix("_pattern"), value, namespace, module, path)
            if rule is not None:
                yield rule


def _module_level_rules(namespace: Mapping[str, Any]) -> Iterator[Rule]:
    for value in list(namespace.values()):
        if isinstance(value, Rule):
            yield value
        elif isinstance(value, RuleSet):
            yield from value


def _defined_in(value: Any, module: ModuleType) -> bool:
    return inspect.isfunction(value) and value.__module__ == module.__name__


def _function_pair(base: str, pattern: Callable[..., Any], namespace: Mapping[str, Any], module: ModuleType,
                   path: Path) -> Rule | None:
    replacement = namespace.get(f"{base}_replacement")
    if replacement is None or not _defined_in(replacement, module):
        logger.debug("%s: %s_pattern has no %s_replacement; skipped", path, base, base)
        return None
    return Rule.from_functions(pattern, replacement, name=base)
