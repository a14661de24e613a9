"""Recording the ``nn.Module`` calls a replacement makes on Proxies as ``call_module`` nodes.

A replacement function is called with ``torch.fx.Proxy`` objects; when it calls a module on
them, the module's ``forward`` must not be traced through: the call is recorded as one
``call_module`` node (as torch.fx's Tracer records it). That takes replacing a method of
``nn.Module`` while the replacement runs; :func:`recording` does it one of three ways, the
**mode** the splicer picks per replacement:

* :data:`WATCH`: nothing is replaced; a global forward pre-hook stops any module call this
  thread makes (:class:`ModuleCallSeen`), so a replacement that turns out to call a module is
  rolled back and called again in the next mode. For replacements whose code names no module
  (:func:`may_call_modules`).
* :data:`IMPL`: ``nn.Module._call_impl`` is replaced. ``nn.Module.__call__`` calls it for every
  module that was not ``compile()``-d; the hook of :data:`WATCH` stops the calls that get past
  it anyway (a compiled module, or a class with a ``__call__`` of its own that runs the hooks, on
  Proxies), and the replacement is called again in :data:`DUNDER` mode. Assigning
  ``_call_impl`` changes no type slot, so it costs about what assigning any class attribute
  does.
* :data:`DUNDER`: ``nn.Module.__call__`` is replaced (what torch.fx's Tracer does). ``__call__``
  is a type slot: each assignment updates the slot of every subclass of ``nn.Module`` (every
  ``GraphModule`` alive has a class of its own), 60-170 µs per pair of assignments in a
  rewrite's process. The slow twin of :data:`IMPL` (:data:`PATCH_DUNDER_CALL`).

Whichever is replaced is replaced while a replacement function runs: when the first such call in
the process starts, and put back when the last one ends (under a lock, counting users), in a
``finally``. A drive (the splicer used as a context manager) also holds the slot from its first
replacement that records module calls to its end (:class:`Holds`, :data:`HOLD_FOR_THE_DRIVE`):
assigning a class attribute of ``nn.Module`` invalidates the attribute caches of every module
class, which cost a conv-bn fold ~18 µs when done around each call. While held, outside a
replacement's own calls on Proxies the replaced method calls torch's own: guards, matching and
other threads' forwards see torch's behaviour, through one more call. Which tracer records is
per thread, so concurrent rewrites of different models, and forwards run by other threads
meanwhile, each see the right behaviour (in other threads the replaced method calls torch's
own); a replacement that itself calls ``rewrite`` nests (the outer tracer is put back when the
inner call ends).
"""

from __future__ import annotations

import inspect
import threading
from typing import Any, ClassVar, Protocol

import torch
import torch.fx as fx

from ._torch import global_forward_pre_hooks, tree_leaves
from .rule import Rule

__all__ = ["DUNDER", "HOLD_FOR_THE_DRIVE", "IMPL", "PATCH_ALWAYS", "PATCH_DUNDER_CALL", "WATCH", "Holds",
           "ModuleCallSeen", "first_mode", "may_call_modules", "next_mode", "recording"]

#: Call every replacement with module calls recorded from the start (the slow twin of :data:`WATCH`).
PATCH_ALWAYS = False
#: Record module calls by replacing ``nn.Module.__call__`` (the slow twin of :data:`IMPL`).
PATCH_DUNDER_CALL = False

#: A drive's :class:`Holds` keep a slot replaced from its first use to the drive's end; ``False``:
#: replaced and put back around each replacement call only (the slow twin;
#: ``tests/test_module_calls.py`` checks both record the same graphs and put everything back).
HOLD_FOR_THE_DRIVE = True

#: The modes of :func:`recording` (see the module's docstring).
WATCH, IMPL, DUNDER = "watch", "impl", "dunder"


def _slot(mode: str) -> str | None:
    """The method of ``nn.Module`` ``mode`` replaces (``None``: nothing is replaced)."""
    return "__call__" if mode == DUNDER else "_call_impl" if mode == IMPL else None


class Recorder(Protocol):
    """What records a module call (the splicer's tracer)."""

    def module_call(self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> fx.Proxy: ...


def contains_proxy(values: Any) -> bool:
    return any(isinstance(v, fx.Proxy) for v in tree_leaves(values))


def _called_on_proxies(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """:func:`contains_proxy` of a call's arguments, a Proxy among the positional ones first (a
    Proxy is a leaf of the pytree: found there, it is found without flattening the rest)."""
    return any(isinstance(a, fx.Proxy) for a in args) or contains_proxy((args, kwargs))


def first_mode(rule: Rule) -> str:
    """The mode ``rule``'s replacement is called in first."""
    if not may_call_modules(rule):
        return WATCH
    return DUNDER if PATCH_DUNDER_CALL else IMPL


def next_mode(mode: str) -> str:
    """The mode to call a replacement in again after :class:`ModuleCallSeen` stopped a module call."""
    return IMPL if mode == WATCH and not PATCH_DUNDER_CALL else DUNDER


def recording(tracer: Recorder, mode: str) -> _Recording:
    """While the block runs, module calls on Proxies in this thread record into ``tracer`` (in
    :data:`WATCH` mode: are stopped). Yields the watcher whose ``called`` says a module call was
    stopped (then what the block did must be undone and done again in :func:`next_mode`), or
    ``None`` in :data:`DUNDER` mode, where nothing gets past."""
    return _Recording(tracer, mode)


class _Recording:
    """The block of :func:`recording`: on entry the slot of its mode is replaced
    (:class:`_ModuleCalls`) and then its watcher registered; on exit the watcher goes first, then
    the slot is put back, also when the block raised (as two nested ``with`` blocks would, without
    a generator per replacement call)."""

    __slots__ = ("previous", "slot", "tracer", "watch")

    def __init__(self, tracer: Recorder, mode: str) -> None:
        self.tracer = tracer
        self.slot = _slot(mode)
        self.watch = None if mode == DUNDER else ModuleCallSeen(escapes_only=mode == IMPL)
        self.previous: Recorder | None = None

    def __enter__(self) -> ModuleCallSeen | None:
        if self.slot is not None:
            self.previous = _ModuleCalls.enter(self.tracer, self.slot)
        if self.watch is not None:
            try:
                self.watch.__enter__()
            except BaseException:
                if self.slot is not None:
                    _ModuleCalls.exit(self.slot, self.previous)
                raise
        return self.watch

    def __exit__(self, *exc: object) -> None:
        try:
            if self.watch is not None:
                self.watch.__exit__(*exc)
        finally:
            if self.slot is not None:
                _ModuleCalls.exit(self.slot, self.previous)


class _ModuleCalls:
    """Replaces ``nn.Module.__call__`` or ``nn.Module._call_impl`` (the *slot*) while replacement
    functions run, counting its users per slot; which tracer records is per thread."""

    _lock = threading.Lock()
    _users: ClassVar[dict[str, int]] = {"__call__": 0, "_call_impl": 0}
    _original: ClassVar[dict[str, Any]] = {}
    _local = threading.local()

    @classmethod
    def enter(cls, tracer: Recorder, slot: str) -> Recorder | None:
        """From now on, module calls on Proxies in this thread record into ``tracer``; returns
        the tracer that recorded before (hand it to :meth:`exit`)."""
        cls.hold(slot)
        previous = getattr(cls._local, "tracer", None)
        cls._local.tracer = tracer
        return previous

    @classmethod
    def exit(cls, slot: str, previous: Recorder | None) -> None:
        """Undo :meth:`enter`: ``previous`` records again, and the slot is torch's own once its
        last user exits."""
        cls._local.tracer = previous
        cls.release(slot)

    @classmethod
    def hold(cls, slot: str) -> None:
        """One more user of the replaced ``slot`` (replaced now if it had none)."""
        with cls._lock:
            if cls._users[slot] == 0:
                cls._original[slot] = vars(torch.nn.Module)[slot]
                setattr(torch.nn.Module, slot, _REPLACEMENTS[slot])
            cls._users[slot] += 1

    @classmethod
    def release(cls, slot: str) -> None:
        """One user of ``slot`` fewer; torch's own method is put back when none is left."""
        with cls._lock:
            cls._users[slot] -= 1
            if cls._users[slot] == 0 and vars(torch.nn.Module).get(slot) is _REPLACEMENTS[slot]:
                setattr(torch.nn.Module, slot, cls._original[slot])

    @classmethod
    def active_tracer(cls) -> Recorder | None:
        return getattr(cls._local, "tracer", None)


def _module_call(module: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
    """``nn.Module.__call__`` while replaced (:data:`DUNDER`)."""
    tracer = _ModuleCalls.active_tracer()
    if tracer is not None and _called_on_proxies(args, kwargs):
        return tracer.module_call(module, args, kwargs)
    return _ModuleCalls._original["__call__"](module, *args, **kwargs)


def _module_call_impl(module: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
    """``nn.Module._call_impl`` while replaced (:data:`IMPL`)."""
    tracer = _ModuleCalls.active_tracer()
    if tracer is not None and _called_on_proxies(args, kwargs):
        return tracer.module_call(module, args, kwargs)
    return _ModuleCalls._original["_call_impl"](module, *args, **kwargs)


_REPLACEMENTS = {"__call__": _module_call, "_call_impl": _module_call_impl}


class Holds:
    """The slots one drive keeps replaced from their first use to its end (:data:`HOLD_FOR_THE_DRIVE`):
    :meth:`keep` before recording in a mode, :meth:`release` once the drive ends (in a ``finally``)."""

    def __init__(self) -> None:
        self.slots: set[str] = set()

    def keep(self, mode: str) -> None:
        """Hold the slot ``mode`` replaces, if :data:`HOLD_FOR_THE_DRIVE` and not held yet."""
        slot = _slot(mode)
        if slot is not None and HOLD_FOR_THE_DRIVE and slot not in self.slots:
            _ModuleCalls.hold(slot)
            self.slots.add(slot)

    def release(self) -> None:
        """Give every held slot back (torch's own method is put back when no one else uses it)."""
        while self.slots:
            _ModuleCalls.release(self.slots.pop())


class _ModuleCalled(Exception):
    """Raised by :class:`ModuleCallSeen`'s hook to stop a module call at its start."""


class ModuleCallSeen:
    """While the block runs, a module called by this thread is stopped before its ``forward``
    runs (a global forward pre-hook raising :class:`_ModuleCalled`; other threads' module calls
    pass it unchanged) and :attr:`called` is set, even if the caller catches the exception. With
    ``escapes_only``, only the calls :data:`IMPL` mode did not record are stopped: on Proxies, or
    of a ``compile()``-d module (which bypasses ``_call_impl``). Only the innermost watcher of a
    thread acts (a replacement calling ``rewrite`` nests). Filing and removing the hook costs
    under a microsecond and changes no class."""

    _local = threading.local()

    def __init__(self, *, escapes_only: bool = False) -> None:
        self.called = False
        self.escapes_only = escapes_only
        self._thread = threading.get_ident()
        self._hooks: Any = None  # torch's global pre-hook table (_torch.global_forward_pre_hooks), once entered
        self._outer: ModuleCallSeen | None = None

    def _hook(self, module: torch.nn.Module, inputs: Any) -> None:
        if threading.get_ident() != self._thread or getattr(self._local, "innermost", None) is not self:
            return
        if self.escapes_only and getattr(module, "_compiled_call_impl", None) is None and not contains_proxy(inputs):
            return
        self.called = True
        raise _ModuleCalled(f"{type(module).__name__} called by a replacement where its call is not recorded")

    def __enter__(self) -> ModuleCallSeen:
        self._outer = getattr(self._local, "innermost", None)
        self._local.innermost = self
        # filed under this watcher (torch's handles key by counter: no clash), without a
        # RemovableHandle: 2.3 -> 0.6 us a block
        self._hooks = global_forward_pre_hooks()
        self._hooks[self] = self._hook
        return self

    def __exit__(self, *exc: object) -> None:
        self._hooks.pop(self, None)
        self._local.innermost = self._outer


def may_call_modules(rule: Rule) -> bool:
    """Can ``rule``'s replacement call an ``nn.Module``, as far as its code tells without calling
    it? When it has a module capture, or its code (or a function it names, two levels deep) names
    a module, a module class, or reads an attribute named like a ``torch.nn`` module class
    (``torch.nn.Linear``). :class:`ModuleCallSeen` catches the others (a class looked up at run
    time): those replacements are called twice at their first module call, which only a
    replacement keeping state between calls can tell."""
    return PATCH_ALWAYS or bool(rule.compiled.module_captures) or _names_modules(rule.replacement, 2)


def _names_modules(fn: Any, depth: int) -> bool:
    fn = inspect.unwrap(fn)
    code = getattr(fn, "__code__", None)
    if code is None:
        return True  # not a plain function (a callable object): assume it may
    names = _code_names(code)
    if not names.isdisjoint(_nn_module_class_names()):
        return True
    named = [cell.cell_contents for cell in (getattr(fn, "__closure__", None) or ()) if _filled(cell)]
    fn_globals = getattr(fn, "__globals__", {})
    named += [fn_globals[name] for name in names if name in fn_globals]
    for value in named:
        if isinstance(value, torch.nn.Module) or (isinstance(value, type) and issubclass(value, torch.nn.Module)):
            return True
        if depth and inspect.isfunction(value) and value is not fn and _names_modules(value, depth - 1):
            return True
    return False


def _code_names(code: Any) -> set[str]:
    """The global and attribute names ``code`` and the code objects nested in it read."""
    names = set(code.co_names)
    for const in code.co_consts:
        if inspect.iscode(const):
            names |= _code_names(const)
    return names


_NN_CLASS_NAMES: frozenset[str] | None = None


def _nn_module_class_names() -> frozenset[str]:
    global _NN_CLASS_NAMES
    if _NN_CLASS_NAMES is None:
        _NN_CLASS_NAMES = frozenset(
            name for name, value in vars(torch.nn).items()
            if isinstance(value, type) and issubclass(value, torch.nn.Module))
    return _NN_CLASS_NAMES


def _filled(cell: Any) -> bool:
    try:
        _ = cell.cell_contents
    except ValueError:  # a cell not assigned yet
        return False
    return True
