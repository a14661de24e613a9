"""Every private torch API fxrewrite relies on, in one place.

torch.fx's public surface does not say whether a node was erased, where it stands in its graph
in O(1), or how to give a GraphModule a graph without compiling it; fake tensors, pytrees and
module reparametrization live in private modules. Each such use goes through a name here, and
``tests/test_torch_compat.py`` checks each one against the installed torch, so a torch release
that moves one fails that test loudly, with the name, instead of failing somewhere deep inside a
rewrite.

>>> import torch.fx as fx
>>> graph = fx.Graph()
>>> a, b = graph.placeholder("a"), graph.placeholder("b")
>>> node_position(a) < node_position(b), is_erased(a)
(True, False)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

import torch
import torch.fx as fx
import torch.utils._pytree as pytree
from torch._guards import detect_fake_mode as _detect_fake_mode
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.fx.graph_module import _copy_attr
from torch.fx.node import Node
from torch.fx.subgraph_rewriter import _replace_attributes

__all__ = [
    "FakeTensor",
    "FakeTensorMode",
    "copy_attribute",
    "copy_replacement_attributes",
    "detect_fake_mode",
    "is_erased",
    "node_position",
    "reparametrized",
    "set_graph_without_compiling",
    "tree_flatten",
    "tree_leaves",
    "tree_unflatten",
]

tree_leaves = pytree.tree_leaves
tree_flatten = pytree.tree_flatten
tree_unflatten = pytree.tree_unflatten


def node_position(node: Node) -> Any:
    """A key that orders the nodes of one graph topologically (graph order), in O(1)."""
    return node._sort_key


def is_erased(node: Node) -> bool:
    """True once ``graph.erase_node(node)`` removed it."""
    return bool(node._erased)


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
