"""Every private torch API fxrewrite relies on, in one place.

torch.fx's public surface does not say whether a node was erased, where it stands in its graph
in O(1), or how to give a GraphModule a graph without compiling it; fake tensors, pytrees and
module reparametrization live in private modules. Each such use goes through a name here, and
``tests/test_torch.py`` checks each one against the installed torch, so a torch release
that moves one fails that test loudly, with the name, instead of failing somewhere deep inside a
rewrite.

>>> import torch.fx as fx
>>> graph = fx.Graph()
>>> a, b = graph.placeholder("a"), graph.placeholder("b")
>>> node_position(a) < node_position(b), is_erased(a)
(True, False)
"""

from __future__ import annotations

import builtins
import contextlib
import math
import operator
from collections.abc import Callable, Collection, Iterator, Mapping
from types import ModuleType
from typing import Any

import torch
import torch.fx as fx
import torch.fx._symbolic_trace as _symbolic_trace
import torch.fx.graph as _fx_graph
import torch.fx.node as _fx_node
import torch.nn.modules.module as _module_globals
import torch.utils._pytree as pytree
from torch._guards import detect_fake_mode as _detect_fake_mode
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.fx.graph_module import _copy_attr
from torch.fx.node import Node
from torch.fx.subgraph_rewriter import _replace_attributes

__all__ = [
    "FX_CODEGEN_RESPELLED",
    "FakeTensor",
    "FakeTensorMode",
    "FxCodeGen",
    "FastNamespace",
    "FxNamespace",
    "FxPythonCode",
    "add_fresh_submodule",
    "add_node",
    "autowrap_function_ids",
    "autowrap_patches",
    "copy_namespace",
    "copy_attribute",
    "copy_replacement_attributes",
    "detect_fake_mode",
    "fresh_node_name",
    "fx_codegen_builtins",
    "fx_format_target",
    "fx_inplace_methods",
    "fx_is_from_torch",
    "fx_magic_methods",
    "fx_qualified_name",
    "fx_type_repr",
    "fx_tracing",
    "global_forward_pre_hooks",
    "is_fx_tracing",
    "is_erased",
    "is_opaque_value_type",
    "node_name_base",
    "node_position",
    "nodes_side_table",
    "python_code_replaced",
    "reparametrized",
    "set_code_fields",
    "set_graph_without_compiling",
    "side_table_buckets",
    "torch_version",
    "tree_flatten",
    "tree_leaves",
    "tree_unflatten",
]

tree_leaves = pytree.tree_leaves
tree_flatten = pytree.tree_flatten
tree_unflatten = pytree.tree_unflatten


#: ``node_position(node)``: a key that orders the nodes of one graph topologically (graph order),
#: in O(1). An attribute getter, not a function: asked ~20k times in a rewrite of 8k nodes, it
#: costs no Python frame.
node_position: Callable[[Node], Any] = operator.attrgetter("_sort_key")
#: ``is_erased(node)``: True once ``graph.erase_node(node)`` removed it (fx keeps a bool; an
#: attribute getter, as :data:`node_position`).
is_erased: Callable[[Node], bool] = operator.attrgetter("_erased")


def nodes_side_table(graph: fx.Graph) -> Collection[Node]:
    """The side table ``graph.find_nodes`` looks nodes up in (``node in table``: is it filed there)."""
    return graph._find_nodes_lookup_table  # type: ignore[return-value]


def side_table_buckets(graph: fx.Graph) -> Mapping[tuple[str, Any], Collection[Node]]:
    """The buckets of ``graph``'s side table (``nodes_side_table``), by key: a node is filed in the
    bucket ``(node.op, node.target if node.op == "call_function" else None)``, so ``node in
    buckets.get(key, ())`` is ``node in nodes_side_table(graph)`` without two method calls."""
    return graph._find_nodes_lookup_table.table


def node_name_base(graph: fx.Graph, target: Any) -> str:
    """The name ``graph.create_node`` gives a node calling ``target`` before making it unique
    (``operator.mul`` gives ``mul``, ``"__add__"`` gives ``add``). A string with no uppercase
    letter that is no magic name is its own base (fx's snake-casing changes nothing in it), read
    without fx's regex; ``tests/test_torch.py`` checks both agree.

    >>> g = fx.Graph()
    >>> node_name_base(g, operator.mul), node_name_base(g, "__add__"), node_name_base(g, "convBn_fold_0")
    ('mul', 'add', 'conv_bn_fold_0')
    """
    if (type(target) is str and target == target.lower() and not (target[:2] == "__" and target[-2:] == "__")
            and type(graph)._target_to_str is _FX_TARGET_TO_STR):
        return target
    return graph._target_to_str(target)


_FX_TARGET_TO_STR = fx.Graph._target_to_str


def add_fresh_submodule(gm: fx.GraphModule, name: str, module: torch.nn.Module) -> None:
    """``gm.add_submodule(name, module)`` for a ``name`` that is no attribute of ``gm`` yet (the
    caller made it fresh) and holds no dot: filed in ``gm``'s module table directly, without
    ``add_module``'s failed ``hasattr``, where ``add_module`` would do just that (``gm``'s class
    keeps torch's ``add_module`` and no global module-registration hook is registered). The slow
    twin is ``add_submodule`` (``replace.DIRECT_MODULE_CALLS``; ``tests/test_module_calls.py``
    checks both make the same module).

    >>> gm = fx.symbolic_trace(lambda x: x + 1)
    >>> add_fresh_submodule(gm, "act", torch.nn.ReLU())
    >>> gm.act
    ReLU()
    """
    if ("." in name or not name or type(gm).add_module is not _MODULE_ADD_MODULE
            or not isinstance(module, torch.nn.Module) or _module_globals._global_module_registration_hooks):
        gm.add_submodule(name, module)
        return
    gm._modules[name] = module


_MODULE_ADD_MODULE = torch.nn.Module.add_module


def global_forward_pre_hooks() -> dict[Any, Callable[..., Any]]:
    """torch's table of the forward pre-hooks every module call runs, what
    ``register_module_forward_pre_hook`` files into under its handles' ids: a hook filed under a
    key of the caller's own (no handle id) runs until the caller pops it, without the
    ``RemovableHandle`` registering makes.

    >>> hooks, seen = global_forward_pre_hooks(), []
    >>> key = object()
    >>> hooks[key] = lambda module, inputs: seen.append(type(module).__name__)
    >>> _ = torch.nn.ReLU()(torch.zeros(1)); _ = hooks.pop(key)
    >>> _ = torch.nn.ReLU()(torch.zeros(1)); seen
    ['ReLU']
    """
    return _module_globals._global_forward_pre_hooks


def fresh_node_name(graph: fx.Graph, base: str) -> str:
    """A name no node of ``graph`` has, from ``base`` (``mul``, ``mul_1``, ...), reserved: what
    the graph's namespace's ``create_name`` hands out, by :class:`FastNamespace`'s steps when it
    is fx's own namespace and ``base`` a plain ASCII identifier (without fx's regex;
    ``tests/test_torch.py`` checks both give the same names and state)."""
    namespace = graph._graph_namespace
    if type(namespace) is FxNamespace and base.isascii() and base.isidentifier():
        return FastNamespace._fresh(namespace, base, None)  # type: ignore[arg-type]
    return namespace.create_name(base, None)


def add_node(graph: fx.Graph, name: str, op: str, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
             type_expr: Any = None, meta: Mapping[str, Any] | None = None) -> Node:
    """Insert a node named ``name`` (reserved with :func:`fresh_node_name`, or copied from a graph
    with the same namespace) at ``graph``'s insertion point, as ``graph.create_node`` does, without
    its per-argument pytree walk (which only warns about raw symbolic values) and its name search.
    Node-creation hooks of the graph's module run, as they do for ``create_node``. ``meta`` is
    copied into the node's ``meta`` first (assigning ``node.meta`` later re-indexes the node).

    >>> graph = fx.Graph()
    >>> x = graph.placeholder("x")
    >>> y = add_node(graph, fresh_node_name(graph, node_name_base(graph, abs)), "call_function", abs, (x,), {})
    >>> _ = graph.output(y)
    >>> print(graph.python_code("self").src.strip().splitlines()[1].strip())
    abs_1 = abs(x);  x = None
    """
    node = Node(graph, name, op, target, args, kwargs, type_expr)
    if meta:
        node.meta.update(meta)
    owner = graph.owning_module
    for hook in getattr(owner, "_create_node_hooks", None) or ():
        hook(node)
    graph._graph_namespace.associate_name_with_obj(name, node)
    graph._insert(node)
    graph._find_nodes_lookup_table.insert(node)
    graph._len += 1
    return node


def copy_namespace(source: fx.Graph, target: fx.Graph) -> None:
    """Give ``target`` the names ``source`` has used, so names created later in ``target`` are
    those ``source`` would create (its nodes must already be associated with their names)."""
    old, new = source._graph_namespace, target._graph_namespace
    new._used_names = set(old._used_names)
    new._base_count = dict(old._base_count)


def copy_attribute(source: torch.nn.Module, target: torch.nn.Module, path: str) -> None:
    """Copy the submodule, parameter or buffer at dotted ``path`` (creating parents), as the
    GraphModule constructor does."""
    _copy_attr(source, target, path)


def set_graph_without_compiling(gm: fx.GraphModule, graph: fx.Graph) -> None:
    """Give ``gm`` its graph without generating code (the ``graph`` setter recompiles; fxrewrite
    recompiles once, after rewriting)."""
    gm._graph = graph
    graph.owning_module = gm


def copy_replacement_attributes(gm: fx.GraphModule, replacement: Any) -> None:
    """What ``torch.fx.replace_pattern`` does with a replacement module's attributes."""
    _replace_attributes(gm, replacement)


def detect_fake_mode(values: Any) -> FakeTensorMode | None:
    """The fake-tensor mode the fake tensors among ``values`` belong to, if any."""
    return _detect_fake_mode(values)


@contextlib.contextmanager
def reparametrized(module: torch.nn.Module, state: Mapping[str, torch.Tensor]) -> Iterator[None]:
    """Run ``module`` with its parameters and buffers swapped for ``state`` (by name)."""
    from torch.nn.utils.stateless import _reparametrize_module

    with _reparametrize_module(module, dict(state), tie_weights=True, strict=False):
        yield


# ---- torch.fx's code generator, for fxrewrite.codegen's python_code ------------------------------
# The slow twin is fx's own Graph.python_code; tests/test_codegen.py checks that both give the same code.

try:
    from torch._library.opaque_object import is_opaque_value_type
except ImportError:  # a torch without opaque value types: no argument is one
    def is_opaque_value_type(kind: type) -> bool:  # type: ignore[misc]
        """No type is an opaque value type (this torch has none)."""
        return False

#: The torch versions (major, minor) whose fx code generator ``fxrewrite.codegen`` re-spells, each
#: checked against fx's own by tests/test_codegen.py; on any other version fx's generator runs.
FX_CODEGEN_RESPELLED = frozenset({(2, 13)})


def torch_version() -> tuple[int, int]:
    """The installed torch's (major, minor) version.

    >>> torch_version() >= (2, 4)
    True
    """
    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    return int(major), int(minor)


FxCodeGen = _fx_graph.CodeGen
FxNamespace = _fx_graph._Namespace
FxPythonCode = _fx_graph.PythonCode
_fx_illegal_names = _fx_graph._illegal_names  # keywords and builtins (fx adds its custom builtins to it)


class FastNamespace(FxNamespace):
    """fx's namespace (torch 2.13's ``_Namespace``) whose ``create_name`` splits a plain ASCII
    identifier (what graph node names are) into base and numeric suffix with ``rpartition``, not
    fx's regex ``^([a-zA-Z_][0-9a-zA-Z_]*?)(?:_(\\d+))?$``: its lazy base ends at the last ``_``
    followed by digits only, if one has a character before it; then the same steps as fx. Any
    other candidate goes to fx's own ``create_name``. ``tests/test_torch.py`` checks both give
    the same names and state (the slow twin is ``FxNamespace``)."""

    def create_name(self, candidate: str, obj: object | None) -> str:
        if obj is not None:
            known = self._obj_to_name.get(obj)
            if known is not None:
                return known
        if not (candidate.isascii() and candidate.isidentifier()):
            return FxNamespace.create_name(self, candidate, obj)
        candidate = self._fresh(candidate, obj)
        if obj is not None:
            self._obj_to_name[obj] = candidate
        return candidate

    def name_once(self, candidate: str) -> str:
        """``create_name(candidate, obj)`` for an ``obj`` named here once only, that is no builtin
        (a graph node: the code generator keeps its name itself): the same name and the same
        used names and counts, without filing ``obj`` (``tests/test_torch.py`` checks both agree)."""
        if not (candidate.isascii() and candidate.isidentifier()):
            return FxNamespace.create_name(self, candidate, object())  # (an object of its own: filed, never asked)
        return self._fresh(candidate, _NAMED_ONCE)

    def _fresh(self, candidate: str, obj: object | None) -> str:
        """fx's steps for a plain ASCII identifier (see the class docstring)."""
        head, _, tail = candidate.rpartition("_")
        suffixed = bool(head) and tail.isdigit()
        base = head if suffixed else candidate
        used = self._used_names
        if not suffixed or candidate in used:
            num = self._base_count.get(base, 0)
            if _fx_illegal_names.get(candidate, obj) is not obj:
                num += 1
                candidate = f"{base}_{num}"
        else:
            num = int(tail)
        while candidate in used:
            num += 1
            candidate = f"{base}_{num}"
        used.add(candidate)
        self._base_count[base] = num
        return candidate


_NAMED_ONCE = object()  # what :meth:`FastNamespace.name_once` names: no builtin, never filed

fx_format_target = _fx_graph._format_target  # "self" + "a.b" -> "self.a.b" (getattr(...) for non-identifiers)
fx_is_from_torch = _fx_graph._is_from_torch
fx_magic_methods = _fx_graph.magic_methods  # operator.add -> "{} + {}"
fx_inplace_methods = _fx_graph.inplace_methods  # operator.iadd -> "{} += {}"
fx_qualified_name = _fx_node._get_qualified_name
fx_type_repr = _fx_node._type_repr


def fx_codegen_builtins() -> list[tuple[str, Any]]:
    """The globals every graph's generated code gets first (``inf``, ``torch``, ...), in order."""
    return [(name, builtin.obj) for name, builtin in _fx_graph._custom_builtins.items()]


@contextlib.contextmanager
def python_code_replaced(graph: fx.Graph, python_code: Callable[..., Any]) -> Iterator[None]:
    """``graph.python_code`` is ``python_code`` inside the block: ``GraphModule.recompile()``
    then generates the code with it and does the rest (compile, ``forward``, ``__call__``) itself.
    A graph that takes no instance attributes (a subclass with ``__slots__``) keeps its own."""
    try:
        graph.python_code = python_code  # type: ignore[method-assign]  # an instance attribute shadows the method
    except (AttributeError, TypeError):
        yield
        return
    try:
        yield
    finally:
        del graph.python_code


# ---- tracing a function the way fx.Tracer.trace does, without its per-trace costs -------------
# Used by fxrewrite.pattern's quick pattern tracer; its slow twin is torch.fx.Tracer.trace.


def is_fx_tracing() -> bool:
    """True inside a ``torch.fx`` trace (``symbolic_trace``, and ``torch.export``'s), read
    without ``torch.fx._symbolic_trace.is_fx_tracing()``'s deprecation warning."""
    return bool(_symbolic_trace._is_fx_tracing_flag)


@contextlib.contextmanager
def fx_tracing() -> Iterator[None]:
    """``torch.fx._symbolic_trace.is_fx_tracing()`` is true inside, as during ``Tracer.trace``."""
    previous = _symbolic_trace._is_fx_tracing_flag
    _symbolic_trace._is_fx_tracing_flag = True
    try:
        yield
    finally:
        _symbolic_trace._is_fx_tracing_flag = previous


def set_code_fields(graph: fx.Graph, fn: Callable[..., Any]) -> None:
    """Record the name, file and first line of ``fn``'s code on ``graph``, as ``Tracer.trace`` does."""
    code = getattr(fn, "__code__", None)
    if code is not None:
        graph._co_fields = {"co_name": code.co_name, "co_filename": code.co_filename,
                            "co_firstlineno": code.co_firstlineno}


_MATH_FUNCTION_IDS: frozenset[int] | None = None


def autowrap_function_ids() -> frozenset[int]:
    """The ids of the functions ``fx.Tracer()`` wraps by default (its ``autowrap_modules=(math,)``),
    computed once instead of at every ``Tracer()``; same rule as its ``__init__``.

    >>> id(math.sqrt) in autowrap_function_ids(), id(math.pi) in autowrap_function_ids()
    (True, False)
    """
    global _MATH_FUNCTION_IDS
    if _MATH_FUNCTION_IDS is None:
        _MATH_FUNCTION_IDS = frozenset(id(value) for name, value in math.__dict__.items()
                                       if not name.startswith("_") and callable(value))
    return _MATH_FUNCTION_IDS


#: ``_create_wrapped_func(fn)`` for each function fx patched: a wrapper is a pure closure over
#: ``fn``, so one per function serves every trace (fx builds ~50 per trace, 70% of a pattern's).
_WRAPPERS: dict[int, tuple[Callable[..., Any], Callable[..., Any]]] = {}


def _wrapper_of(fn: Callable[..., Any]) -> Callable[..., Any]:
    cached = _WRAPPERS.get(id(fn))
    if cached is None or cached[0] is not fn:
        if len(_WRAPPERS) > 4096:  # functions that came and went (fx.wrap of redefined functions)
            _WRAPPERS.clear()
        cached = _WRAPPERS[id(fn)] = (fn, _symbolic_trace._create_wrapped_func(fn))
    return cached[1]


@contextlib.contextmanager
def autowrap_patches(fn_globals: dict[str, Any], function_ids: frozenset[int] | set[int],
                     modules: list[ModuleType]) -> Iterator[None]:
    """The function patches ``Tracer.trace`` makes for a traced function (and undoes after):
    ``torch.fx.wrap``-ed functions, and the autowrapped functions (``math.sqrt`` ...) found in
    ``fn_globals`` and in ``modules``, each replaced by a wrapper that records a call on a
    ``Proxy``. Same patches, in the same order, through fx's own patcher
    (``_patch_wrapped_functions`` and ``_autowrap_check``, re-spelt here to reuse wrappers)."""
    with _symbolic_trace._new_patcher() as patcher:
        for (_, name), frame_dict in _symbolic_trace._wrapped_fns_to_patch.copy().items():
            builtin = name not in frame_dict and hasattr(builtins, name)
            original = getattr(builtins, name) if builtin else frame_dict[name]
            patcher.patch(frame_dict, name, _wrapper_of(original))
        for cls, name in _symbolic_trace._wrapped_methods_to_patch:
            patcher.patch_method(cls, name, _symbolic_trace._create_wrapped_method(cls, name))
        for frame_dict in (fn_globals, *(m.__dict__ for m in modules)):
            if patcher.visit_once(frame_dict):
                for name, value in list(frame_dict.items()):
                    if not name.startswith("_") and callable(value) and id(value) in function_ids:
                        patcher.patch(frame_dict, name, _wrapper_of(value))
        yield
