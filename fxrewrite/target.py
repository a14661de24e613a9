"""Targets: anything a user hands us (module, function, GraphModule, ExportedProgram) as a
GraphModule to rewrite, and the model a command line names.

A command line names a model as ``path/to/file.py:NAME`` or ``package.module:NAME``.

``NAME`` is an ``nn.Module`` instance, an ``nn.Module`` class (built with no arguments) or a
factory function returning a module. The same file may define ``example_inputs()`` returning
the tuple of inputs to call the model with (used by ``--check``, ``--shapes`` and ``--export``).
"""

from __future__ import annotations

import copy
import importlib
import inspect
from pathlib import Path
from types import ModuleType
from typing import Any

import attrs
import torch
import torch.fx as fx

from ._torch import add_node, copy_attribute, copy_namespace, set_graph_without_compiling
from .errors import RewriteError, TargetError
from .pattern import TRACING, ThreadConfinedTracer

__all__ = ["Target", "exported_program", "load_target", "to_graph_module", "traced_or_exported"]


@attrs.frozen
class Target:
    """A model ready to rewrite, with its example inputs when the file provides them."""

    spec: str
    model: torch.nn.Module
    example_inputs: tuple[Any, ...] | None


def load_target(spec: str) -> Target:
    """Import and build the model named by ``spec``. A file is imported under a name of its own,
    with its directory on ``sys.path`` while it runs (:func:`fxrewrite.loader.import_file`).

    >>> target = load_target("torch.nn:ReLU")
    >>> type(target.model).__name__, target.example_inputs
    ('ReLU', None)
    """
    location, sep, name = spec.rpartition(":")
    if not sep or not location or not name:
        raise TargetError(
            f"cannot read the target '{spec}': write it as path/to/file.py:NAME or package.module:NAME, "
            f"where NAME is an nn.Module instance, class or factory."
        )
    module = _import(location, spec)
    if not hasattr(module, name):
        public = sorted(n for n in vars(module) if not n.startswith("_"))
        raise TargetError(f"'{location}' defines no '{name}' (it defines: {', '.join(public) or 'nothing'}).")
    model = _build(getattr(module, name), spec)
    return Target(spec, model, _example_inputs(module, spec))


def _import(location: str, spec: str) -> ModuleType:
    try:
        if location.endswith(".py") or "/" in location or "\\" in location:
            return _import_file(Path(location))
        return importlib.import_module(location)
    except TargetError:
        raise
    except (Exception, SystemExit) as exc:  # SystemExit: a script that runs argparse when imported
        raise TargetError(
            f"cannot import '{location}' for target '{spec}': {type(exc).__name__}: {exc}. Check the path "
            f"(relative to the current directory) or that the package is installed."
        ) from exc


def _import_file(path: Path) -> ModuleType:
    from .loader import import_file  # the one way fxrewrite imports a .py file by path

    if not path.is_file():
        raise TargetError(f"no such file: '{path}' (the current directory is {Path.cwd()}).")
    return import_file(path, prefix="fxrewrite_target_")


def _build(obj: Any, spec: str) -> torch.nn.Module:
    if isinstance(obj, torch.nn.Module):
        return obj
    if not callable(obj):
        raise TargetError(f"'{spec}' is a {type(obj).__name__}; it must be an nn.Module, a module class or a factory.")
    what = "class" if inspect.isclass(obj) else "factory"
    try:
        model = obj()
    except Exception as exc:
        raise TargetError(
            f"calling the {what} '{spec}' with no arguments failed: {type(exc).__name__}: {exc}. Point the target "
            f"at a module instance or a factory that takes no arguments."
        ) from exc
    if not isinstance(model, torch.nn.Module):
        raise TargetError(f"the {what} '{spec}' returned a {type(model).__name__}, not an nn.Module.")
    return model


def _example_inputs(module: ModuleType, spec: str) -> tuple[Any, ...] | None:
    factory = getattr(module, "example_inputs", None)
    if factory is None:
        return None
    try:
        inputs = factory() if callable(factory) else factory
    except Exception as exc:
        raise TargetError(f"example_inputs() next to '{spec}' failed: {type(exc).__name__}: {exc}") from exc
    return tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)


def to_graph_module(target: Any, *, inplace: bool = False) -> fx.GraphModule:
    """The ``GraphModule`` to rewrite: ``target`` itself (``inplace=True``), a copy of it, or
    ``target`` traced with ``torch.fx.symbolic_trace``."""
    if isinstance(target, torch.export.ExportedProgram):
        if inplace:
            raise RewriteError(
                "inplace=True cannot rewrite an ExportedProgram (its graph signature would go stale); rewrite "
                "it without inplace and re-export the result if you need an ExportedProgram again."
            )
        return target.module()
    if isinstance(target, fx.GraphModule):
        return target if inplace else _copy_graph_module(target)
    if inplace:
        raise RewriteError(
            f"inplace=True needs a torch.fx.GraphModule, got {type(target).__name__}; trace it first "
            f"(gm = torch.fx.symbolic_trace(model)) or drop inplace=True."
        )
    if not isinstance(target, torch.nn.Module) and not callable(target):
        raise RewriteError(
            f"cannot rewrite {target!r} ({type(target).__name__}): pass an nn.Module, a torch.fx.GraphModule "
            f"or a function of tensors."
        )
    try:
        return _traced(target)
    except Exception as exc:
        raise RewriteError(
            f"torch.fx.symbolic_trace could not trace {type(target).__name__}: {type(exc).__name__}: {exc}. "
            f"Make the model traceable (see torch.fx's limitations: no control flow on tensor values), or "
            f"trace it yourself (e.g. with concrete_args or torch.export) and pass the GraphModule."
        ) from exc


def _copy_graph_module(gm: fx.GraphModule) -> fx.GraphModule:
    """A new GraphModule with a copy of ``gm``'s graph, sharing parameters and submodules with it.

    The copy is not compiled here: ``rewrite`` compiles once, after rewriting.
    """
    new = _module_without_code(gm, _copy_graph(gm.graph), type(gm).__name__)
    new.meta = copy.copy(getattr(gm, "meta", {}))
    return new


def _traced(target: torch.nn.Module | Any) -> fx.GraphModule:
    """``torch.fx.symbolic_trace(target)``, without compiling the traced graph's code: ``rewrite``
    compiles once, after rewriting."""
    tracer = ThreadConfinedTracer()
    # buffers are read as graph values: forward's writes to them are recorded, not run
    tracer.proxy_buffer_attributes = True
    with TRACING:  # torch.fx's tracing patches nn.Module.__call__ process-wide
        graph = tracer.trace(target)
    name = type(target).__name__ if isinstance(target, torch.nn.Module) else target.__name__
    return _module_without_code(tracer.root, graph, name)


def _module_without_code(root: torch.nn.Module, graph: fx.Graph, class_name: str) -> fx.GraphModule:
    """``fx.GraphModule(root, graph, class_name)`` whose code is not generated yet: call
    ``recompile()`` before running it. (The GraphModule constructor compiles the graph it is given;
    here that is a one-node placeholder graph, and ``graph`` is set afterwards.)"""
    placeholder_graph = fx.Graph()
    placeholder_graph.output(None)
    new = fx.GraphModule(torch.nn.Module(), placeholder_graph, class_name=class_name)
    for node in graph.nodes:
        if node.op in ("get_attr", "call_module"):
            copy_attribute(root, new, node.target)
    set_graph_without_compiling(new, graph)
    new.training = root.training
    tracer_cls = graph._tracer_cls
    new._tracer_cls = tracer_cls if tracer_cls and "<locals>" not in tracer_cls.__qualname__ else None
    new._tracer_extras = graph._tracer_extras or {}
    return new


def _copy_graph(graph: fx.Graph) -> fx.Graph:
    """A copy of ``graph``: the same nodes (names, ops, targets, arguments, types, shallow copies
    of ``meta``) in a new graph, built in one pass.

    It is what ``copy.deepcopy(graph)`` builds, made cheaply: the names are already unique, so
    each node is built directly under its name instead of through ``Graph.create_node`` (whose
    name regeneration and per-argument pytree walk cost as much as a ``recompile()``), and the
    namespace is copied whole, so names created later in the copy are those the original would
    create. The code generator is shallow-copied: ``Graph.__deepcopy__`` deep-copies it, which
    for an exported module rebuilds pytree specs and prints ``FutureWarning: isinstance(treespec,
    LeafSpec) is deprecated`` (torch 2.10+); rewrites never mutate it.

    >>> import torch
    >>> gm = fx.symbolic_trace(lambda x: torch.relu(x) + torch.relu(x))
    >>> copied = _copy_graph(gm.graph)
    >>> [n.name for n in copied.nodes] == [n.name for n in gm.graph.nodes], copied.python_code("self").src == gm.code
    (True, True)
    """
    new = fx.Graph(tracer_cls=graph._tracer_cls)
    env: dict[fx.Node, fx.Node] = {}
    for node in graph.nodes:
        args = fx.node.map_arg(node.args, env.__getitem__)
        kwargs = fx.node.map_arg(node.kwargs, env.__getitem__)
        env[node] = add_node(new, node.name, node.op, node.target, args, kwargs, node.type, node.meta)
    copy_namespace(graph, new)
    new._codegen = copy.copy(graph._codegen)
    return new


def exported_program(target: Target) -> torch.export.ExportedProgram:
    """``torch.export.export(model, example_inputs)`` of a command-line target."""
    if target.example_inputs is None:
        raise TargetError(f"--export needs example inputs: define example_inputs() next to '{target.spec}'.")
    try:
        return torch.export.export(target.model, target.example_inputs)
    except Exception as exc:
        raise TargetError(
            f"torch.export.export failed on '{target.spec}': {type(exc).__name__}: {exc}. Drop --export to use "
            f"symbolic tracing, or fix what torch.export reports."
        ) from exc


def traced_or_exported(target: Target, *, export: bool) -> fx.GraphModule:
    """The graph of a command-line target: symbolically traced, or captured with torch.export."""
    if not export:
        try:
            return fx.symbolic_trace(target.model)
        except Exception as exc:
            raise TargetError(
                f"torch.fx.symbolic_trace failed on '{target.spec}': {type(exc).__name__}: {exc}. Try --export "
                f"(torch.export handles data-dependent Python better), or make the model traceable."
            ) from exc
    module = exported_program(target).module()
    if not isinstance(module, fx.GraphModule):
        raise TargetError(f"torch.export returned a {type(module).__name__}, not a GraphModule; cannot rewrite it.")
    return module
