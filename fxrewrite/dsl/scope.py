"""What a rule file can name: the scope, the allow-list, and the checks on every attribute step.

This module is the DSL's security boundary. A rule file reaches Python objects only through a
:class:`Scope`: the :data:`DEFAULT_NAMES`, the caller's ``names=`` (trusted) and the file's
``use`` aliases. Every attribute step from an untrusted name goes through :func:`step`, which
refuses private attributes, parts of torch that load files, import or run code, and functions
that change torch's global state (:func:`state_change`):

>>> scope = Scope.build(None, None)
>>> scope.lookup(("torch", "neg")) is torch.neg
True
>>> try:
...     scope.lookup(("torch", "set_default_device"))
... except PathError as error:
...     print(error)  # doctest: +ELLIPSIS
'torch.set_default_device' is out of bounds for rule files: it changes torch's global state ...

Nothing here evaluates a rule; :mod:`fxrewrite.dsl.compile` asks this module about names.
"""

from __future__ import annotations

import difflib
import keyword
import math
import operator
import re
import types
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import torch

from ..errors import RuleDefinitionError
from . import ast

__all__ = [
    "DEFAULT_NAMES",
    "DEFERRED",
    "RESERVED_WORDS",
    "PathError",
    "Scope",
    "check_attribute_name",
    "check_new_name",
    "located_error",
    "reachable",
    "shown",
    "state_change",
    "step",
]

#: The names every rule file sees.
DEFAULT_NAMES: Mapping[str, Any] = types.MappingProxyType({
    "torch": torch,
    "F": torch.nn.functional,
    "nn": torch.nn,
    "operator": operator,
    "math": math,
    "int": int,
    "float": float,
    "bool": bool,
    "str": str,
})

#: Words of the language; they cannot name variables, ``let`` bindings or aliases.
RESERVED_WORDS = frozenset({
    "rule", "use", "as", "let", "where", "priority", "and", "or", "not", "in", "is", "True", "False", "None",
})

#: Attribute names a rule file may not reach from torch, F, nn, operator or math: modules that
#: are not torch's own (``torch.os``), and what loads files, imports or runs code.
_REFUSED_ATTRIBUTES = frozenset({
    "builtins", "os", "sys", "subprocess", "ctypes", "importlib", "inspect", "glob", "platform", "threading",
    "textwrap", "warnings", "functools", "shutil", "pickle", "dataclasses", "np",
    "hub", "serialization", "package", "multiprocessing", "distributed", "jit", "library", "onnx", "export",
    "compiler", "utils", "testing", "fx", "classes", "cpp", "storage", "backends", "profiler",
    "load", "save", "load_library", "import_module", "from_file", "attrgetter", "methodcaller", "compile",
})

#: Modules whose functions a rule file may not call even when re-exported under another name.
_REFUSED_MODULES = frozenset({
    "hub", "serialization", "package", "multiprocessing", "distributed", "jit", "library", "onnx", "export",
    "compiler", "utils", "testing", "cpp_extension", "storage", "backends", "profiler",
})

#: Why a name changes torch's global state, by exact name and by prefix. Calling one while a
#: pattern is traced would change the whole process (every later ``torch.ones`` on the meta
#: device, a forward hook on every model), so rule files cannot reach them at all.
_STATE_NAMES: Mapping[str, str] = types.MappingProxyType({
    "manual_seed": "it reseeds the random number generator",
    "manual_seed_all": "it reseeds the random number generator",
    "seed": "it reseeds the random number generator",
    "fork_rng": "it forks the random number generator",
    "use_deterministic_algorithms": "it switches deterministic algorithms on or off for the whole process",
    "enable": "it switches a global check or mode on",
    "disable": "it switches a global check or mode off",
    "empty_cache": "it releases a device's cached memory",
    "synchronize": "it waits for a device and changes its streams",
    "init": "it initialises a device backend",
    "init_num_threads": "it initialises the thread pool",
    "clear_autocast_cache": "it clears autocast's process-wide cache",
    "prepare_multiprocessing_environment": "it prepares process-wide multiprocessing state",
    "profiler_allow_cudagraph_cupti_lazy_reinit_cuda12": "it changes the profiler's process-wide settings",
})
_STATE_PREFIXES: Mapping[str, str] = types.MappingProxyType({
    "set_": "set_* functions set process-wide state such as the default device or dtype, grad mode, "
            "anomaly mode, print options or the number of threads",
    "register_": "register_* functions install hooks or handlers that stay behind: a global forward hook "
                 "runs on every model",
    "enable_": "it switches a global mode on",
    "disable_": "it switches a global mode off",
    "enter_": "it enters a global mode and leaves it entered",
    "exit_": "it leaves a global mode",
    "reset_": "it resets process-wide state",
    "manual_seed": "it reseeds the random number generator",
})
#: Modules that manage devices, streams, global modes or event handlers, refused as a whole.
_STATE_MODULES: Mapping[str, str] = types.MappingProxyType({
    "cuda": "it manages CUDA devices, streams and memory",
    "mps": "it manages MPS devices and memory",
    "xpu": "it manages XPU devices, streams and memory",
    "mtia": "it manages MTIA devices and streams",
    "accelerator": "it selects the current accelerator device",
    "cpu": "it manages the CPU device's streams",
    "overrides": "it installs torch function modes",
    "monitor": "it emits events to process-wide handlers",
})

_ALLOWED_ORIGINS = frozenset({"torch", "math", "operator", "_operator"})
_PLAIN_DATA = (int, float, complex, str, bytes, bool, type(None))
_BUILTIN_OP_NAMESPACES = frozenset({"aten", "prims"})
_OP_NAMESPACE = type(torch.ops.aten)  # torch.ops.<namespace>, without naming a private class


def state_change(name: str) -> str | None:
    """Why calling a function named ``name`` changes torch's global state, or ``None``.

    >>> state_change("set_grad_enabled")  # doctest: +ELLIPSIS
    'set_* functions set process-wide state such as ...'
    >>> state_change("graphsafe_set_state")
    "it changes the random number generator's state"
    >>> state_change("neg") is None and state_change("is_grad_enabled") is None and state_change("initial_seed") is None
    True
    """
    if name in _STATE_NAMES:
        return _STATE_NAMES[name]
    if name in _STATE_MODULES:
        return _STATE_MODULES[name]
    for prefix, why in _STATE_PREFIXES.items():
        if name.startswith(prefix):
            return why
    if "set_state" in name or ("seed" in name and name != "initial_seed"):
        return "it changes the random number generator's state"
    if any(_registers(part) for part in _name_parts(name)):
        return "it registers something process-wide (a hook, a handler, a type) that stays behind"
    if name.endswith("Guard"):
        return "a guard object changes thread-local dispatch state while it lives"
    return None


#: The words of a name: runs of letters, split where a lower-case letter meets a capital.
_NAME_PART = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+")
#: Forms of the verb "register" a name part may start with: registering and undoing it.
_REGISTER_STEMS = ("register", "unregister", "deregister", "reregister")


def _name_parts(name: str) -> tuple[str, ...]:
    """The lower-case words of ``name``: split on ``_``, ``.``, digits and camel-case humps.

    >>> _name_parts("_register_forward_hook"), _name_parts("registerOp2"), _name_parts("preregistered_gemm")
    (('register', 'forward', 'hook'), ('register', 'op'), ('preregistered', 'gemm'))
    """
    return tuple(part.lower() for part in _NAME_PART.findall(name))


def _registers(part: str) -> bool:
    """Whether the word ``part`` is a form of "register" or of undoing it (``registered``,
    ``unregister``, ``preregister``), so that a name holding it may register something.
    ``preregistered`` (what a custom op's name may say of itself) is not."""
    return part.startswith(_REGISTER_STEMS) or part.endswith("register")


def located_error(src: ast.SourceText, span: ast.Span, message: str) -> RuleDefinitionError:
    """``file:line:col: message`` and the line with a caret under ``span``."""
    return RuleDefinitionError(f"{src.where(span)}: {message}\n{src.excerpt(span)}")


# ---- paths ---------------------------------------------------------------------------------------


class PathError(Exception):
    """A dotted path cannot be followed: step ``index`` is refused, or missing (``missing``)."""

    def __init__(self, index: int, message: str, *, missing: bool = False) -> None:
        super().__init__(message)
        self.index = index
        self.missing = missing


#: What :meth:`Scope.check` returns for an op of a custom ``torch.ops`` namespace that is not
#: registered yet (it may be registered before the rule is applied).
DEFERRED = object()


@attrs.frozen(eq=False)
class _Root:
    """A name in scope: its value, whether it came from the caller (trusted), how to show it."""

    value: Any
    trusted: bool
    spelled: str


@attrs.frozen(eq=False)
class Scope:
    """The names a rule file can see: :data:`DEFAULT_NAMES`, the caller's ``names`` and the
    file's ``use`` aliases, and the only way to reach anything from a rule file.

    >>> scope = Scope.build(None, {"fold": print})
    >>> scope.lookup(("torch", "float32")), "fold" in scope
    (torch.float32, True)
    """

    roots: Mapping[str, _Root]

    @classmethod
    def build(cls, file: ast.RuleFile | None, names: Mapping[str, Any] | None) -> Scope:
        roots = {name: _Root(value, False, getattr(value, "__name__", name)) for name, value in DEFAULT_NAMES.items()}
        for name, value in _checked_names(names).items():
            roots[name] = _Root(value, True, f"names[{name!r}]")
        scope = cls(roots)
        if file is not None:
            for use in file.uses:  # each alias is added to the one dict: linear in the number of use lines
                roots[use.alias] = scope._use(use, file.source)
        return cls(types.MappingProxyType(roots))

    def __contains__(self, name: object) -> bool:
        return name in self.roots

    def spelled(self, name: str) -> str:
        """How the name ``name`` in scope is shown in messages (``torch``, ``names['fold']``)."""
        return self.roots[name].spelled

    def lookup(self, path: Sequence[str]) -> Any:
        """The value of a dotted path whose first name is in scope (raises :class:`PathError`)."""
        root = self.roots[path[0]]
        value = root.value
        for i, attr in enumerate(path[1:], start=1):
            value = step(value, attr, path[:i], root.trusted, i)
        return value

    def check(self, path: Sequence[str], *, defer_ops: bool = True) -> Any:
        """Like :meth:`lookup`, at load time: a missing op of a custom ``torch.ops`` namespace
        (perhaps registered later) gives :data:`DEFERRED` instead of an error if ``defer_ops``."""
        root = self.roots[path[0]]
        value = root.value
        for i, attr in enumerate(path[1:], start=1):
            if (defer_ops and isinstance(value, _OP_NAMESPACE)
                    and value.name not in _BUILTIN_OP_NAMESPACES):
                try:
                    value = step(value, attr, path[:i], root.trusted, i)
                except PathError as exc:
                    if exc.missing:
                        return DEFERRED
                    raise
                continue
            value = step(value, attr, path[:i], root.trusted, i)
        return value

    def _use(self, use: ast.Use, src: ast.SourceText) -> _Root:
        """What the alias of a use line stands for, checked like any path from a rule file."""
        where = f"use line 'use {'.'.join(use.path)} as {use.alias}'"
        check_new_name(src, use.span, use.alias, what="an alias", scope=self, context=where)
        if use.path[0] not in self.roots:
            raise located_error(src, use.path_span, f"{where}: '{use.path[0]}' is not a name in scope; a use "
                                                    f"line starts at one of {shown(self.roots)}.")
        for attr in use.path[1:]:
            check_attribute_name(src, use.path_span, attr, where)
        try:
            value = self.check(use.path)
        except PathError as exc:
            raise located_error(src, use.path_span, f"{where}: {exc}") from None
        if value is DEFERRED:
            raise located_error(src, use.path_span, f"{where}: '{'.'.join(use.path)}' does not exist; register "
                                                    f"the op before loading the file, or call it by its full path.")
        return _Root(value, self.roots[use.path[0]].trusted, ".".join(use.path))


def _checked_names(names: Mapping[str, Any] | None) -> Mapping[str, Any]:
    if names is None:
        return {}
    if not isinstance(names, Mapping):
        raise RuleDefinitionError(f"names= must be a mapping from names to objects, got {type(names).__name__}; "
                                  f"pass a dict such as names={{'fold': fold}}.")
    for name in names:
        if not isinstance(name, str) or not name.isidentifier() or name.startswith("_") or name in RESERVED_WORDS:
            raise RuleDefinitionError(
                f"names= has the key {name!r}; keys must be identifiers that do not start with '_' and are not "
                f"words of the language ({', '.join(sorted(RESERVED_WORDS))}); rename the key."
            )
    return names


def shown(names: Mapping[str, Any]) -> str:
    """The names of a mapping, sorted and comma-separated, for messages."""
    return ", ".join(sorted(names))


def step(value: Any, attr: str, prefix: Sequence[str], trusted: bool, index: int) -> Any:
    """``getattr(value, attr)`` for a path in scope, refusing what rule files may not reach."""
    dotted = ".".join((*prefix, attr))
    if not trusted:
        _refuse_name(attr, dotted, index)
    try:
        result = getattr(value, attr)
    except Exception:
        raise PathError(index, _missing(value, attr, dotted, prefix), missing=True) from None
    if not trusted:
        _refuse_value(result, dotted, index)
    return result


def _refuse_name(attr: str, dotted: str, index: int) -> None:
    if attr in _REFUSED_ATTRIBUTES:
        raise PathError(index, _out_of_bounds(dotted))
    why = state_change(attr)
    if why is not None:
        raise PathError(index, _changes_state(dotted, why))


def _refuse_value(value: Any, dotted: str, index: int) -> None:
    """Refuse a value by what it is, whatever name it was reached under."""
    if not reachable(value):
        raise PathError(index, _out_of_bounds(dotted))
    if callable(value) and not isinstance(value, (types.ModuleType, _OP_NAMESPACE)):
        name = getattr(value, "__name__", None)
        why = state_change(name) if isinstance(name, str) and name not in _STATE_MODULES else None
        if why is not None:
            raise PathError(index, _changes_state(dotted, why, alias_of=name))


def reachable(value: Any) -> bool:
    """Whether a value reached from torch, F, nn, operator or math is one a rule may use.

    >>> reachable(torch.relu), reachable(torch.load), reachable(torch.os)
    (True, False, False)
    """
    if isinstance(value, types.ModuleType):
        parts = value.__name__.split(".")
        return (parts[0] in _ALLOWED_ORIGINS and not _REFUSED_ATTRIBUTES.intersection(parts)
                and not set(_STATE_MODULES).intersection(parts[1:]))
    if isinstance(value, _PLAIN_DATA):
        return True
    origin = getattr(value, "__module__", None)
    if not isinstance(origin, str):
        origin = type(value).__module__
    parts = origin.split(".")
    return (parts[0] in _ALLOWED_ORIGINS and not _REFUSED_MODULES.intersection(parts)
            and not set(_STATE_MODULES).intersection(parts[1:]))


def _out_of_bounds(dotted: str) -> str:
    return (f"'{dotted}' is out of bounds for rule files: they may use torch operations, nn, F, operator and "
            f"math, but nothing that loads files, imports or runs code, or changes torch's global state (see "
            f"'Trust model' in docs/dsl.md); pass what you need with names= if you trust it.")


def _changes_state(dotted: str, why: str, *, alias_of: str | None = None) -> str:
    shown_as = f"'{dotted}' (that is '{alias_of}')" if alias_of is not None else f"'{dotted}'"
    return (f"{shown_as} is out of bounds for rule files: it changes torch's global state ({why}), and "
            f"loading or applying a rule must leave the process as it was (see 'Trust model' in docs/dsl.md). "
            f"Remove the call; if a rule really needs it, pass a function you trust with names=.")


def _missing(value: Any, attr: str, dotted: str, prefix: Sequence[str]) -> str:
    try:
        candidates = [n for n in dir(value) if not n.startswith("_")]
    except Exception:
        candidates = []
    close = difflib.get_close_matches(attr, candidates, n=3)
    hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else "; check the spelling."
    return f"'{dotted}' does not exist ({'.'.join(prefix)} has no attribute '{attr}'){hint}"


# ---- names a file defines ------------------------------------------------------------------------


def check_attribute_name(src: ast.SourceText, span: ast.Span, attr: str, context: str) -> None:
    """Refuse an attribute starting with ``_``: no private or special attribute is readable."""
    if attr.startswith("_"):
        raise located_error(src, span, f"{context}: the attribute '{attr}' starts with '_'; rule files cannot "
                                       f"read private or special attributes (see 'Trust model' in docs/dsl.md).")


def check_new_name(src: ast.SourceText, span: ast.Span, name: str, *, what: str, scope: Scope | None,
                   context: str) -> None:
    """A name about to be defined (alias, let name, capture, variable) must be a usable name."""
    problem = None
    if name in RESERVED_WORDS:
        problem = f"'{name}' is a word of the language and cannot be {what}; choose another name"
    elif name.startswith("_"):
        problem = f"'{name}' starts with '_'; such names are reserved (a lone '_' is the wildcard)"
    elif keyword.iskeyword(name):
        problem = f"'{name}' is a Python keyword and cannot be {what}; choose another name"
    elif scope is not None and name in scope:
        problem = f"'{name}' is already a name in scope ({scope.spelled(name)}); choose another name"
    if problem:
        raise located_error(src, span, f"{context}: {problem}.")
