"""A content-addressed cache of parsed rule files, so a process that loads an unchanged ``.fxr``
file neither imports lark nor parses the file, nor traces its patterns.

What is cached is the *parse*, the :class:`~fxrewrite.dsl.ast.RuleFile` of a text, and the traced
graphs of its patterns (see below). Every rule is still built from them as it would be from a
fresh parse: names resolved, every check of a rule and of its pattern's graph run, errors
carrying ``file:line``. A text that does not parse is never cached, so its syntax error is found
again, by the parser; a file with a bad rule has no traces cached, so every load traces it again.

An entry is trusted only as far as its key reaches: the key is the SHA-256 of the text, of the
parser's own sources (``grammar.lark``, ``parse.py``, ``_syntax.py``, ``_to_ast.py``, ``ast.py``:
an edited grammar never meets an old parse), and of the versions of fxrewrite, torch, lark and
Python. An entry is a pickle read back by an unpickler that builds only the classes of
:mod:`fxrewrite.dsl.ast` (loading it runs no code, as loading a ``.fxr`` file runs none), and it
must hold the very text being loaded. Whatever is wrong with an entry (missing, truncated, another
key, another text, another type) makes the load a miss: the text is parsed, a debug message
says why, and the entry is rewritten. ``tests/test_cache.py`` checks that every entry equals a
fresh parse.

The traces of a file's patterns are cached beside (:func:`load_traces`, :func:`store_traces`):
the graph of each pattern the DSL generated, as plain data (:func:`fxrewrite.pattern.graph_record`),
under a key that adds to the parse key the sources that turn a parse into traced functions
(``dsl/compile.py``, ``dsl/scope.py``, ``dsl/__init__.py``, ``pattern.py``, ``_torch.py``) and the
functions registered with ``torch.fx.wrap``. The Python rule files of the *shipped library* get
the same (:func:`fxrewrite.loader.load_rules`), keyed also by the text of the file and of the
helper files beside it (``_*.py``); a user's Python rule file is always traced (what it imports
is not known, and no test compares its traces). An entry is plain data (its unpickler builds no class
at all); a replayed graph names its functions by module and name, each looked up again and
refused when it is no longer what it was (then the pattern is traced). Every other check of a
rule runs on a replayed graph; ``tests/test_cache.py`` checks that every replayed graph of the
library equals a fresh trace.

Where: ``$XDG_CACHE_HOME/fxrewrite`` (``~/.cache/fxrewrite`` when it is unset or not an absolute
path, as the XDG specification says), never in the package
directory; ``FXREWRITE_CACHE=0`` turns the cache off. A directory that cannot be written makes
the cache silently read-only.

>>> import os, tempfile
>>> saved = os.environ.get("XDG_CACHE_HOME")
>>> os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp()
>>> text = "rule double_neg:\\n    torch.neg(torch.neg(x)) => x\\n"
>>> load_rule_file(text, "a.fxr") is None  # nothing cached yet
True
>>> from fxrewrite.dsl.parse import parse
>>> store_rule_file(parse(text, source="a.fxr"))
>>> load_rule_file(text, "b.fxr").source.name  # keyed by the text; the name is the caller's
'b.fxr'
>>> _ = os.environ.pop("XDG_CACHE_HOME") if saved is None else os.environ.update(XDG_CACHE_HOME=saved)
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import io
import logging
import os
import pickle
import re
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .dsl.ast import RuleFile

__all__ = ["ENABLE_VARIABLE", "MAX_ENTRIES", "directory", "entries", "load_rule_file", "load_traces", "read_entry",
           "rule_file_key", "store_rule_file", "store_traces", "trace_key"]

logger = logging.getLogger(__name__)

#: The environment variable that turns the cache off when set to ``0`` (or ``false``, ``no``, ``off``).
ENABLE_VARIABLE = "FXREWRITE_CACHE"

#: Entries kept; beyond it, writing an entry removes the least recently written ones.
MAX_ENTRIES = 512

_FORMAT = b"fxrewrite-ast-2\n"  # 2: AST nodes pickle as their __dict__ (dsl.ast.Node)
_SUFFIX = ".ast"
_PARSER_SOURCES = ("dsl/grammar.lark", "dsl/parse.py", "dsl/_syntax.py", "dsl/_to_ast.py", "dsl/ast.py")


def directory() -> Path | None:
    """The cache directory, or ``None`` when ``FXREWRITE_CACHE=0`` turns the cache off."""
    if os.environ.get(ENABLE_VARIABLE, "1").strip().lower() in ("0", "false", "no", "off"):
        return None
    base = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):  # unset, empty or relative: the XDG default
        base = os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "fxrewrite"


def rule_file_key(text: str) -> str:
    """The key of the parse of ``text``: see the module docstring."""
    digest = hashlib.sha256(_environment_fingerprint().encode())
    digest.update(text.encode("utf-8", "surrogatepass"))
    return digest.hexdigest()


def load_rule_file(text: str, source: str) -> RuleFile | None:
    """The cached parse of ``text``, named ``source``; ``None`` when there is none to trust (the
    reason is logged at debug level)."""
    folder = directory()
    if folder is None:
        return None
    key = rule_file_key(text)
    path = folder / f"{key}{_SUFFIX}"
    try:
        entry = read_entry(path)
    except FileNotFoundError:
        return None
    except Exception as exc:
        logger.debug("ignoring the cached parse %s (%s: %s); parsing %s", path, type(exc).__name__, exc, source)
        return None
    problem = _mismatch(entry, key, text)
    if problem:
        logger.debug("ignoring the cached parse %s (%s); parsing %s", path, problem, source)
        return None
    from .dsl.ast import SourceText

    return entry[1].replace(source=SourceText(source, text))


def store_rule_file(rule_file: RuleFile) -> None:
    """Cache the parse ``rule_file`` of its text (no-op when the cache is off or not writable)."""
    folder = directory()
    if folder is None:
        return
    key = rule_file_key(rule_file.source.text)
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        data = _FORMAT + pickle.dumps((key, rule_file), protocol=pickle.HIGHEST_PROTOCOL)
        _write_atomically(folder, f"{key}{_SUFFIX}", data)
        _prune(folder)
    except OSError as exc:
        logger.debug("cannot write the parse of %s to the cache %s: %s", rule_file.source.name, folder, exc)


def _write_atomically(folder: Path, name: str, data: bytes) -> None:
    """Write ``folder/name`` so that a reader sees the old file or the whole new one."""
    handle, temporary = tempfile.mkstemp(dir=folder, prefix=".", suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as file:
            file.write(data)
        os.replace(temporary, folder / name)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def entries() -> list[Path]:
    """The cache's entry files, sorted (empty when the cache is off or empty)."""
    folder = directory()
    if folder is None or not folder.is_dir():
        return []
    return sorted(folder.glob(f"*{_SUFFIX}"))


def read_entry(path: Path) -> tuple[str, Any]:
    """``(key, value)`` of an entry file, read by an unpickler that builds AST classes only.
    Raises ``OSError`` when it cannot be read and ``ValueError``/``pickle.UnpicklingError``
    (or whatever a damaged pickle raises) when it is not an entry."""
    data = path.read_bytes()
    if not data.startswith(_FORMAT):
        raise ValueError("not an fxrewrite cache entry of this format")
    entry = _AstUnpickler(io.BytesIO(data[len(_FORMAT):])).load()
    if not (isinstance(entry, tuple) and len(entry) == 2 and isinstance(entry[0], str)):
        raise ValueError("not a (key, value) pair")
    return entry


def _mismatch(entry: tuple[str, Any], key: str, text: str) -> str | None:
    from .dsl.ast import RuleFile

    stored_key, value = entry
    if stored_key != key:
        return "it was stored under another key"
    if not isinstance(value, RuleFile):
        return f"it holds a {type(value).__name__}, not a RuleFile"
    if value.source.text != text:
        return "it is the parse of another text"
    return None


class _AstUnpickler(pickle.Unpickler):
    """Builds the classes of :mod:`fxrewrite.dsl.ast` (and ``...``), nothing else: a cache entry
    cannot run code."""

    def find_class(self, module: str, name: str) -> Any:
        from .dsl.ast import CLASSES

        if module == "fxrewrite.dsl.ast" and name in CLASSES:
            return CLASSES[name]
        if (module, name) == ("builtins", "Ellipsis"):
            return Ellipsis
        raise pickle.UnpicklingError(f"a cache entry may hold AST nodes only, not {module}.{name}")


@functools.cache
def _environment_fingerprint() -> str:
    """What a parse depends on besides the text: the parser's sources and the versions around it."""
    from ._version import __version__

    torch = sys.modules.get("torch")
    versions = (__version__, getattr(torch, "__version__", "-"), _lark_version(), sys.version)
    return _sources_digest(_PARSER_SOURCES) + "|" + "|".join(str(v) for v in versions)


def _sources_digest(names: tuple[str, ...]) -> str:
    """A digest of the package's source files ``names`` (paths inside the package), each with its name."""
    package = Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for name in names:
        digest.update(name.encode() + b"\0" + (package / name).read_bytes() + b"\0")
    return digest.hexdigest()


def _lark_version() -> str:
    """lark's ``__version__``, read from its source so that lark is not imported."""
    spec = importlib.util.find_spec("lark")
    if spec is None or spec.origin is None:
        return "-"
    found = re.search(r"__version__\s*(?::\s*str\s*)?=\s*['\"]([^'\"]+)", Path(spec.origin).read_text(encoding="utf-8"))
    return found.group(1) if found else hashlib.sha256(Path(spec.origin).read_bytes()).hexdigest()


def _prune(folder: Path, suffix: str = _SUFFIX) -> None:
    """Keep the :data:`MAX_ENTRIES` most recently written entries (of one kind)."""
    found = sorted(folder.glob(f"*{suffix}"), key=lambda p: p.stat().st_mtime, reverse=True)
    for stale in found[MAX_ENTRIES:]:
        stale.unlink(missing_ok=True)


# ---- traces of the patterns of a rule file ----------------------------------------------------------

_TRACE_FORMAT = b"fxrewrite-traces-2\n"
_TRACE_SUFFIX = ".traces"
_TRACER_SOURCES = ("dsl/__init__.py", "dsl/compile.py", "dsl/scope.py", "pattern.py", "_torch.py")


def trace_key(text: str, beside: bytes = b"") -> str:
    """The key of the traces of the patterns of ``text`` (and of the files ``beside`` it holds:
    a Python rule file's helpers): see the module docstring."""
    from .pattern import tracing_state

    digest = hashlib.sha256(_environment_fingerprint().encode() + b"\0" + _tracer_fingerprint().encode())
    digest.update(b"\0" + tracing_state().encode() + b"\0" + hashlib.sha256(beside).digest())
    digest.update(text.encode("utf-8", "surrogatepass"))
    return digest.hexdigest()


def load_traces(text: str, source: str, beside: bytes = b"") -> dict[str, Any] | None:
    """The recorded traces of the patterns of ``text`` (see :func:`fxrewrite.pattern.recorded_traces`),
    or ``None`` when there are none to trust (the reason is logged at debug level)."""
    folder = directory()
    if folder is None:
        return None
    key = trace_key(text, beside)
    path = folder / f"{key}{_TRACE_SUFFIX}"
    try:
        data = path.read_bytes()
        if not data.startswith(_TRACE_FORMAT):
            raise ValueError("not an fxrewrite trace entry of this format")
        entry = _PlainUnpickler(io.BytesIO(data[len(_TRACE_FORMAT):])).load()
    except FileNotFoundError:
        return None
    except Exception as exc:
        logger.debug("ignoring the cached traces %s (%s: %s); tracing %s", path, type(exc).__name__, exc, source)
        return None
    if not (isinstance(entry, tuple) and len(entry) == 3 and entry[:2] == (key, text) and isinstance(entry[2], dict)):
        logger.debug("ignoring the cached traces %s (another key, text or layout); tracing %s", path, source)
        return None
    return entry[2]


def store_traces(text: str, traces: dict[str, Any], beside: bytes = b"") -> None:
    """Cache the recorded traces of the patterns of ``text`` (no-op when the cache is off or
    not writable, or when a trace could not be recorded)."""
    folder = directory()
    if folder is None or not traces or any(record is None for record in traces.values()):
        return
    key = trace_key(text, beside)
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        data = _TRACE_FORMAT + pickle.dumps((key, text, traces), protocol=pickle.HIGHEST_PROTOCOL)
        _write_atomically(folder, f"{key}{_TRACE_SUFFIX}", data)
        _prune(folder, _TRACE_SUFFIX)
    except OSError as exc:
        logger.debug("cannot write traces to the cache %s: %s", folder, exc)


class _PlainUnpickler(pickle.Unpickler):
    """Builds tuples, lists, dicts, strings and numbers only: no class at all."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"a trace entry holds plain data only, not {module}.{name}")


@functools.cache
def _tracer_fingerprint() -> str:
    """What a trace depends on besides the rule's text and the parse: the tracer's sources."""
    return _sources_digest(_TRACER_SOURCES)
