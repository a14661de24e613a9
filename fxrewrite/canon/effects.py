"""Effects read from the ATen schemas: which arguments a call writes, which inputs its result
may alias, and which nodes write a value.
"""

from __future__ import annotations

import inspect
import operator
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch.fx.node import Node
from torch.nn.utils import parametrize

from .._torch import tree_leaves
from .ops import FUNCTIONALS, VIEW_ATTRIBUTES, dtype_conversion, is_check
from .schema import _bind, aten_overload, result_kind

__all__ = [
    "AUTOGRAD_ONLY_WRITES",
    "alias_class",
    "aliased_inputs",
    "is_parametrized",
    "is_written",
    "mutation",
    "writers_of",
    "writes_in_place",
    "written_arguments",
]


# -- effects: mutation and aliasing, from the ATen schemas ------------------------------------

def mutation(node: Node) -> str | None:
    """How ``node`` writes into an argument, in words, or ``None`` when it does not.

    >>> g = torch.fx.Graph(); x = g.placeholder("x")
    >>> mutation(g.call_method("add_", (x, 1)))
    "calls the in-place method '.add_()'"
    >>> mutation(g.call_function(torch.ops.aten.relu.default, (x,))) is None
    True
    """
    kwargs = node.kwargs
    if not kwargs and node.op == "call_module":  # (neither out= nor inplace=: the module decides)
        return _module_mutation(node)
    if not kwargs and FAST_MUTATION:
        try:  # the driver asks this of every node of the graph before it rewrites
            filed = _call_mutation_cache.get((node.op, node.target), _UNFILED)
        except TypeError:  # an unhashable target
            filed = _UNFILED
        if filed is not _UNFILED:
            return filed
    if "out" in kwargs:
        return "writes into an out= argument"
    if _inplace_flag(node):
        return "passes inplace=True"
    if node.op == "call_module":
        return _module_mutation(node)
    if node.op not in ("call_method", "call_function"):
        return None
    key = (node.op, node.target)
    try:
        return _target_mutation_cache[key]
    except (KeyError, TypeError):
        pass
    found = _target_mutation(node.op, node.target)
    try:
        _target_mutation_cache[key] = found
        if not _is_functional(node.target):
            _call_mutation_cache[key] = found
    except TypeError:  # an unhashable target
        pass
    return found


def _module_mutation(node: Node, classes: dict[type, frozenset[str] | None] | None = None) -> str | None:
    """:func:`mutation` of a ``call_module`` node called without ``out=`` or ``inplace=True``
    (``classes``: :func:`plain_attribute`'s memo of class names, within one pass)."""
    module = _submodule(node, classes)
    return f"calls the in-place module '{node.target}'" if _inplace_attribute(module, classes) is True else None


_target_mutation_cache: dict[tuple[str, Any], str | None] = {}
#: Read :data:`_call_mutation_cache` for calls without keywords; ``False`` (the slow twin): work
#: the answer out at every call (``tests/canon/test_effects.py`` checks both agree).
FAST_MUTATION = True
#: ``(op, target) -> mutation`` of a call without keyword arguments of a target that is no
#: functional with an ``inplace`` parameter: then neither ``out=`` nor ``inplace=True`` can be
#: given, and the answer is the target's (:func:`_target_mutation`), whatever the arguments.
_call_mutation_cache: dict[tuple[str, Any], str | None] = {}


def writes_in_place(nodes: Iterable[Node]) -> bool:
    """True when one of ``nodes`` writes into an argument (``any(mutation(n) is not None for n
    in nodes)``, which the driver asks of every node of a graph before it rewrites). A call
    without keywords whose target :data:`_call_mutation_cache` files as pure is passed over
    without calling :func:`mutation`; every other node is asked. The slow twin is that ``any``
    (``FAST_MUTATION`` off; ``tests/canon/test_effects.py`` checks both agree). 8k nodes: 2.2 ->
    0.6 ms."""
    if not FAST_MUTATION:
        return any(mutation(n) is not None for n in nodes)
    filed = _call_mutation_cache.get
    classes: dict[type, frozenset[str] | None] | None = None
    calls = 0  # module calls met
    for node in nodes:
        try:  # (node._kwargs: fx's field behind the kwargs property, read without the property's frame)
            pure = not node._kwargs and filed((node.op, node.target), _UNFILED) is None
        except TypeError:  # an unhashable target
            pure = False
        if pure:
            continue
        if node.op == "call_module" and not node._kwargs:
            calls += 1
            if calls == _NAMES_FROM and CLASS_NAMES_ONCE:
                classes = {}
            if _module_mutation(node, classes) is not None:  # (mutation's own path for it)
                return True
        elif mutation(node) is not None:
            return True
    return False


#: In :func:`writes_in_place`, read what a module's class defines once per class and call
#: (:func:`_class_names`: a set of the names its classes' dicts hold, for :func:`plain_attribute`),
#: not by a walk of its MRO at each module call (nothing runs between two nodes that could change a
#: class); ``False`` (the slow twin): the walk at each read (``tests/canon/test_effects.py`` checks
#: both read the same). From the :data:`_NAMES_FROM`-th module call of a pass on (a set of a class's
#: names costs ~10 us; the driver asks this of each rewrite's few created nodes too). modules row,
#: 8k nodes, 796 module calls: 2.75 -> 2.07 ms (timeit).
CLASS_NAMES_ONCE = True
_NAMES_FROM = 32


_UNFILED = "unfiled"  # (a mutation is None or a sentence; this one is never filed)


def _target_mutation(op: str, target: Any) -> str | None:
    """How calling ``target`` writes into an argument, whatever the arguments (see :func:`mutation`)."""
    if op == "call_method":
        if isinstance(target, str) and target.endswith("_") and not target.endswith("__"):
            return f"calls the in-place method '.{target}()'"
        return None
    if isinstance(target, torch._ops.OpOverload):
        return f"calls the mutating op {target}" if target._schema.is_mutable else None
    name = getattr(target, "__name__", "")
    if target is operator.setitem or target in _INPLACE_OPERATORS or (name.endswith("_") and not name.endswith("__")):
        return f"calls the in-place function {name}"
    return None


_INPLACE_OPERATORS = frozenset({
    operator.iadd, operator.isub, operator.imul, operator.itruediv, operator.ifloordiv, operator.imod,
    operator.ipow, operator.imatmul, operator.iand, operator.ior, operator.ixor, operator.ilshift, operator.irshift,
})


def written_arguments(node: Node) -> tuple[Node, ...]:
    """The graph values ``node`` writes into (empty for a pure call)."""
    if mutation(node) is None:
        return ()
    if "out" in node.kwargs:
        return tuple(v for v in tree_leaves(node.kwargs["out"]) if isinstance(v, Node))
    if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload) and not _inplace_flag(node):
        named = _bind(node.target._schema, node.args, node.kwargs) or {}
        written = [a.name for a in node.target._schema.arguments if a.alias_info is not None and a.alias_info.is_write]
        return tuple(v for name in written for v in tree_leaves(named.get(name))
                     if isinstance(v, Node))
    first = node.args[0] if node.args else None
    return (first,) if isinstance(first, Node) else ()


def _inplace_flag(node: Node) -> bool:
    if node.kwargs.get("inplace") is True:
        return True
    if node.op == "call_function" and _is_functional(node.target):
        try:
            bound = inspect.signature(node.target).bind(*node.args, **node.kwargs)  # type: ignore[arg-type]
        except TypeError:
            return False
        return bound.arguments.get("inplace") is True
    return False


def _is_functional(target: Any) -> bool:
    return _held_in(target, FUNCTIONALS)


def _held_in(target: Any, table: Any) -> bool:
    """``target in table``, false for an unhashable target (a call_function may call anything)."""
    try:
        return target in table
    except TypeError:
        return False


def _submodule(node: Node, classes: dict[type, frozenset[str] | None] | None = None) -> Any:
    """The module a ``call_module`` node calls (``get_submodule``), ``None`` when there is none."""
    owner = node.graph.owning_module
    return None if owner is None else submodule(owner, str(node.target), classes)


def submodule(owner: torch.nn.Module, target: str, classes: dict[type, frozenset[str] | None] | None = None) -> Any:
    """``owner.get_submodule(target)``, ``None`` where it raises ``AttributeError``; read with
    :func:`plain_submodule` where that can tell (its slow twin, :data:`FAST_MODULE_ATTRIBUTES`
    off: ``get_submodule``; ``classes``: :func:`plain_attribute`'s memo)."""
    if FAST_MODULE_ATTRIBUTES:
        found = plain_submodule(owner, target, classes)
        if found is not UNSURE:
            return found
    try:
        return owner.get_submodule(target)
    except AttributeError:
        return None


def _inplace_attribute(module: Any, classes: dict[type, frozenset[str] | None] | None = None) -> Any:
    """``getattr(module, "inplace", False)``."""
    if FAST_MODULE_ATTRIBUTES and module is not None:
        found = plain_attribute(module, "inplace", classes)
        if found is not UNSURE:
            return False if found is ABSENT else found
    return getattr(module, "inplace", False)


# -- module attributes read without a failed lookup -------------------------------------------

#: Read a module's attribute from its own tables where that is all ``getattr`` would read
#: (:func:`plain_attribute`); ``False`` (the slow twin): ``getattr``, ``hasattr`` and
#: ``get_submodule``, whose failed lookups raise an ``AttributeError`` inside ``nn.Module.__getattr__``
#: (``mutation`` of a ``call_module`` node asked one per node; ``tests/canon/test_effects.py``
#: checks both agree on modules whose classes look attributes up otherwise).
FAST_MODULE_ATTRIBUTES = True
#: What :func:`plain_attribute` answers for a module that has no such attribute.
ABSENT: Any = object()
#: What :func:`plain_attribute` answers when it cannot tell: ask ``getattr``.
UNSURE: Any = object()
_MODULE_GETATTR = torch.nn.Module.__getattr__
_OBJECT_GETATTRIBUTE: Any = object.__getattribute__
_GET_SUBMODULE = torch.nn.Module.get_submodule


def plain_attribute(module: Any, name: str, classes: dict[type, frozenset[str] | None] | None = None) -> Any:
    """``getattr(module, name)`` for a module whose class looks attributes up as ``nn.Module``
    does and defines nothing called ``name`` (no class attribute, property or slot anywhere in
    its MRO): its instance dict, then its parameter, buffer and submodule tables, read as
    ``nn.Module.__getattr__`` reads them. :data:`ABSENT` when none holds ``name`` (``getattr``
    would raise ``AttributeError``); :data:`UNSURE` for every other module (a class overriding
    ``__getattr__`` or ``__getattribute__``, or naming ``name``): ask ``getattr``.

    >>> conv = torch.nn.Conv2d(1, 1, 1)
    >>> plain_attribute(conv, "inplace") is ABSENT, plain_attribute(conv, "weight") is conv.weight
    (True, True)
    >>> plain_attribute(conv, "forward") is UNSURE  # a method: a class attribute
    True

    ``classes``: a memo of :func:`_class_names` per class, for a caller asking many modules in one
    pass during which no class changes (:data:`CLASS_NAMES_ONCE`).
    """
    cls = type(module)
    if classes is not None:
        names = classes[cls] if cls in classes else classes.setdefault(cls, _class_names(cls))
        if names is None or name in names:
            return UNSURE
    else:
        if (getattr(cls, "__getattr__", None) is not _MODULE_GETATTR
                or cls.__getattribute__ is not _OBJECT_GETATTRIBUTE):
            return UNSURE
        for klass in cls.__mro__:
            if name in klass.__dict__:
                return UNSURE
    own = module.__dict__
    if name in own:
        return own[name]
    for table in ("_parameters", "_buffers", "_modules"):  # nn.Module.__getattr__, in its order
        if table in own:
            held = own[table]
            if name in held:
                return held[name]
    return ABSENT


def _class_names(cls: type) -> frozenset[str] | None:
    """The names the dicts of ``cls`` and its bases hold (what :func:`plain_attribute` looks for in
    each), or ``None`` for a class that looks attributes up otherwise than ``nn.Module``."""
    if getattr(cls, "__getattr__", None) is not _MODULE_GETATTR or cls.__getattribute__ is not _OBJECT_GETATTRIBUTE:
        return None
    return frozenset().union(*(klass.__dict__ for klass in cls.__mro__))


def is_parametrized(module: Any) -> bool:
    """``torch.nn.utils.parametrize.is_parametrized(module)``; a module without a ``parametrizations``
    attribute (:func:`plain_attribute` finds none: ``getattr`` would raise inside
    ``nn.Module.__getattr__``) is answered ``False`` without the failed lookup (:data:`FAST_MODULE_ATTRIBUTES`;
    the matcher asks this of every module a capture binds)."""
    if FAST_MODULE_ATTRIBUTES and plain_attribute(module, "parametrizations") is ABSENT:
        return False
    return parametrize.is_parametrized(module)


def plain_submodule(owner: Any, target: str, classes: dict[type, frozenset[str] | None] | None = None) -> Any:
    """``owner.get_submodule(target)`` read with :func:`plain_attribute` (``None`` where it raises
    ``AttributeError``), or :data:`UNSURE` when a module on the path is not plain or ``owner``'s
    class has a ``get_submodule`` of its own (``classes``: :func:`plain_attribute`'s memo)."""
    if getattr(type(owner), "get_submodule", None) is not _GET_SUBMODULE:
        return UNSURE
    if target == "":
        return owner
    module = owner
    for item in target.split("."):
        found = plain_attribute(module, item, classes)
        if found is UNSURE:
            return UNSURE
        if found is ABSENT or not isinstance(found, torch.nn.Module):
            return None
        module = found
    return module


def named_modules(root: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """``dict(root.named_modules())``: each module once, under the first path met, in the order
    ``nn.Module.named_modules`` walks them, read from the ``_modules`` tables by one function
    (:data:`FAST_NAMED_MODULES`) instead of a generator per module; a module whose class has a
    ``named_modules`` of its own is asked it, with the walk's memo, as torch's does."""
    if not FAST_NAMED_MODULES or type(root).named_modules is not _NAMED_MODULES:
        return dict(root.named_modules())
    found: dict[str, torch.nn.Module] = {}
    memo: set[torch.nn.Module] = set()
    _walk_modules(root, "", memo, found)
    return found


def _walk_modules(module: torch.nn.Module, prefix: str, memo: set[torch.nn.Module],
                  found: dict[str, torch.nn.Module]) -> None:
    """``nn.Module.named_modules(memo, prefix)`` of ``module`` into ``found`` (a class's own
    ``named_modules`` asked)."""
    if type(module).named_modules is not _NAMED_MODULES:
        for name, held in module.named_modules(memo, prefix):
            found[name] = held
        return
    if module in memo:
        return
    memo.add(module)
    found[prefix] = module
    for name, child in module._modules.items():
        if child is None:
            continue
        path = f"{prefix}.{name}" if prefix else name
        if type(child).named_modules is _NAMED_MODULES and not child._modules:  # a leaf, without a call
            if child not in memo:
                memo.add(child)
                found[path] = child
        else:
            _walk_modules(child, path, memo, found)


#: Walk the module tree with :func:`named_modules`; ``False`` (the slow twin): ``dict(root.named_modules())``
#: (``tests/canon/test_effects.py`` checks both give the same paths and modules in the same order).
#: 8k modules row: 797 modules in 0.35 ms, 1,195 in 0.6 ms.
FAST_NAMED_MODULES = True
_NAMED_MODULES = torch.nn.Module.named_modules


def aliased_inputs(node: Node) -> tuple[Node, ...]:
    """The input nodes whose storage ``node``'s result may share: from the alias annotations of
    the ATen schema (``Tensor(a) self -> Tensor(a)``), for every spelling of the call. Calls
    fxrewrite knows nothing about (modules, user functions) may alias any of their inputs.

    >>> g = torch.fx.Graph(); x = g.placeholder("x")
    >>> [n.name for n in aliased_inputs(g.call_method("contiguous", (x,)))]
    ['x']
    >>> aliased_inputs(g.call_function(torch.neg, (x,)))
    ()
    """
    if node.op in ("placeholder", "get_attr", "output"):
        return ()
    if node.op == "call_function" and node.target is operator.getitem:
        return (node.args[0],) if isinstance(node.args[0], Node) else ()
    if node.op == "call_function" and node.target is getattr:
        source = node.args[0]
        return (source,) if node.args[1] in VIEW_ATTRIBUTES and isinstance(source, Node) else ()
    if result_kind(node) == "value" or is_check(node):
        return ()
    if node.op in ("call_function", "call_method"):
        conversion = dtype_conversion(node.op, node.target, node.args, node.kwargs)
        if conversion is not None:  # `to` returns its input when the dtype already fits
            source = node.args[0]
            return (source,) if isinstance(source, Node) and not _always_copies(node) else ()
        found = aten_overload(node.op, node.target, node.args, node.kwargs)
        if found is not None:
            return _schema_aliases(*found)
    return tuple(node.all_input_nodes)


def _always_copies(node: Node) -> bool:
    return node.target in (torch.ops.aten._to_copy.default, torch.ops.prims.convert_element_type.default)


def _schema_aliases(overload: torch._ops.OpOverload, named: Mapping[str, Any]) -> tuple[Node, ...]:
    sets = set()
    for ret in overload._schema.returns:
        if ret.alias_info is not None:
            sets |= set(ret.alias_info.before_set) | set(ret.alias_info.after_set)
            if isinstance(ret.type, torch.ListType) and not sets:  # Tensor(a)[]: the elements alias
                sets |= {s for a in overload._schema.arguments if a.alias_info is not None
                         for s in a.alias_info.before_set}
    if not sets:
        return ()
    found = []
    for argument in overload._schema.arguments:
        info = argument.alias_info
        if info is not None and (set(info.before_set) | set(info.after_set)) & sets:
            found += [v for v in tree_leaves(named.get(argument.name)) if isinstance(v, Node)]
    return tuple(found)


def alias_class(node: Node, limit: int = 256) -> list[Node] | None:
    """``node`` and every value that may share its storage: what it views (its bases), and what
    views them, transitively; ``None`` when there are more than ``limit`` (treat as unknown)."""
    found, stack = {node: None}, [node]
    while stack:
        n = stack.pop()
        related = [*aliased_inputs(n), *(u for u in n.users if n in aliased_inputs(u))]
        for other in related:
            if other not in found:
                found[other] = None
                stack.append(other)
                if len(found) > limit:
                    return None
    return list(found)


def is_written(node: Node) -> bool:
    """True when ``node``'s value, or any value sharing its storage, is written in place
    somewhere in the graph (conservatively True when the alias class is too large to walk)."""
    return writers_of(node) != ()


#: In-place ops that change no value, only autograd's view of it.
AUTOGRAD_ONLY_WRITES = frozenset({"detach_", "requires_grad_"})


def writers_of(node: Node) -> tuple[Node, ...] | None:
    """The nodes writing in place into ``node``'s value or a value sharing its storage, in graph
    order; ``None`` when the alias class is too large to walk (treat as written). ``detach_``
    and ``requires_grad_`` write no value and are not counted.

    >>> g = torch.fx.Graph(); x = g.placeholder("x"); y = g.call_method("relu", (x,))
    >>> w = g.call_method("add_", (y, 1)); d = g.call_method("detach_", (x,))
    >>> [n.name for n in writers_of(y)], writers_of(x)
    (['add_'], ())
    """
    members = alias_class(node)
    if members is None:
        return None
    member_set = set(members)
    found = {user: None for member in members for user in member.users
             if mutation(user) is not None and not _autograd_only(user)
             and member_set.intersection(written_arguments(user))}
    return tuple(found)


def _autograd_only(node: Node) -> bool:
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        target = target._schema.name.partition("::")[2]
    return isinstance(target, str) and target in AUTOGRAD_ONLY_WRITES
