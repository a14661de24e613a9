"""Value metadata on graph nodes: fake tensors in ``meta["val"]``.

This module is the one reader and writer of what a node's value is: every other module asks it
(:func:`value_of`, :func:`tensor_value`, :func:`described`, :func:`has_value`) instead of reading
``node.meta`` keys, so the conventions of the graphs fxrewrite meets (export's ``val``, Dynamo's
``example_value``, ShapeProp's ``tensor_meta``) are known in one place.

Graphs from ``torch.export`` carry a fake tensor on every node; :func:`propagate_inputs` gives a
traced graph the same from example inputs, and :func:`propagate_values` computes it for nodes a
rewrite created, so guards can read shapes and dtypes everywhere and exported graphs stay
complete.

>>> import torch, torch.fx as fx
>>> gm = fx.symbolic_trace(lambda x: torch.relu(x).sum(-1))
>>> propagate_inputs(gm, (torch.randn(3, 5),))
>>> [tuple(n.meta["val"].shape) for n in gm.graph.nodes if n.op != "output"]
[(3, 5), (3, 5), (3,)]
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any

import torch
import torch.fx as fx
from torch.fx.node import Node, map_arg

from ._torch import FakeTensor, FakeTensorMode, detect_fake_mode, reparametrized
from .errors import RewriteError

__all__ = [
    "copy_value",
    "as_dynamo_value",
    "described",
    "forget_value",
    "has_value",
    "has_values",
    "is_dynamo_value",
    "lend_constant",
    "lent_constant",
    "propagate_inputs",
    "propagate_values",
    "record_values",
    "rule_metadata",
    "rule_of",
    "tensor_value",
    "value_of",
]

# The keys of ``node.meta`` this module is the one reader and writer of: a value computed under
# fake tensors (export, AOT, fxrewrite's own propagation) or by Dynamo, ShapeProp's description,
# a lifted scalar constant lent by :mod:`fxrewrite.exported`, and the rule that created a node.
_VALUE, _DYNAMO_VALUE, _TENSOR_META = "val", "example_value", "tensor_meta"
_CONSTANT, _RULE = "fxrewrite_constant", "fxrewrite_rule"

logger = logging.getLogger(__name__)


def has_values(nodes: Iterable[Any]) -> bool:
    """True when one of ``nodes`` carries a fake tensor value (the graph is annotated): ``any(
    isinstance(n, Node) and _is_fake(value_of(n)) for n in nodes)``, written out (asked at every
    splice)."""
    for n in nodes:
        if isinstance(n, Node):
            meta = n.meta
            if isinstance(meta[_VALUE] if _VALUE in meta else meta.get(_DYNAMO_VALUE), FakeTensor):
                return True
    return False


def value_of(node: Node) -> Any:
    """A node's fake value: ``meta["val"]`` (export, AOT graphs, example inputs), or
    ``meta["example_value"]`` where Dynamo keeps it (the graphs ``torch.compile`` captures);
    ``None`` when the node carries neither."""
    meta = node.meta
    return meta[_VALUE] if _VALUE in meta else meta.get(_DYNAMO_VALUE)


def has_value(node: Any) -> bool:
    """True when ``node`` carries a computed value (:func:`value_of`; ``None`` counts: an op that
    returns nothing has one).

    >>> gm = fx.symbolic_trace(lambda x: x.relu())
    >>> x, relu, output = gm.graph.nodes
    >>> has_value(relu)
    False
    >>> propagate_inputs(gm, (torch.ones(2),))
    >>> has_value(relu), has_value(x)
    (True, True)
    """
    return isinstance(node, Node) and (_VALUE in node.meta or _DYNAMO_VALUE in node.meta)


def described(node: Node) -> Any:
    """Whatever the graph says a node computes: its value (:func:`value_of`), else ShapeProp's
    ``tensor_meta`` (a ``TensorMetadata``, or a tuple of them), else ``None``."""
    return value_of(node) if has_value(node) else node.meta.get(_TENSOR_META)


def copy_value(source: Node, target: Node) -> None:
    """Give ``target`` what the graph says of ``source``'s value (its value under the key the
    graph uses, and ShapeProp's ``tensor_meta``) where ``target`` says nothing yet: a node that
    computes the value of another (a replacement's output, a clone) has its shape and dtype."""
    for key in (_VALUE, _DYNAMO_VALUE, _TENSOR_META):
        if key in source.meta and key not in target.meta:
            target.meta[key] = source.meta[key]


def is_dynamo_value(node: Node) -> bool:
    """True when ``node`` keeps its value where Dynamo does (``meta["example_value"]`` only)."""
    return _DYNAMO_VALUE in node.meta and _VALUE not in node.meta


def as_dynamo_value(node: Node) -> None:
    """Move the value fxrewrite gave ``node`` (``meta["val"]``) to where Dynamo keeps its own, for a
    node created in a Dynamo graph."""
    if _VALUE in node.meta:
        node.meta.setdefault(_DYNAMO_VALUE, node.meta.pop(_VALUE))


def forget_value(node: Node) -> None:
    """Drop the value fxrewrite recorded on ``node`` (``meta["val"]``), so it is computed again."""
    node.meta.pop(_VALUE, None)


def lend_constant(node: Node, value: torch.Tensor) -> None:
    """Record the value of a scalar tensor a placeholder stands for (a constant torch.export lifted
    to an input), so a literal capture can bind the number it holds (:func:`lent_constant`)."""
    node.meta[_CONSTANT] = value


def lent_constant(node: Node) -> Any:
    """The constant :func:`lend_constant` recorded on ``node``, or ``None``."""
    return node.meta.get(_CONSTANT)


def rule_of(node: Node) -> str | None:
    """The name of the rule whose replacement created ``node`` (``None`` for a node no rule made)."""
    return node.meta.get(_RULE)


def rule_metadata(rule_name: str | None, stack_trace: str) -> dict[str, Any]:
    """The metadata a replacement's node is created with: which rule made it, and the stack trace
    shown for it in generated code and in errors."""
    return {"stack_trace": stack_trace, _RULE: rule_name}


def tensor_value(node: Any) -> Any:
    """What a node's tensor is known to be (an object with ``shape``, ``dtype``, ``device`` and
    ``layout``): its fake value (:func:`value_of`), or ``ShapeProp``'s ``tensor_meta``; ``None``
    when the graph does not say (a traced graph without example inputs) or the node is no tensor.

    >>> gm = fx.symbolic_trace(lambda x: x.relu())
    >>> tensor_value(next(iter(gm.graph.nodes))) is None
    True
    """
    if not isinstance(node, Node):
        return None
    value = value_of(node)
    if isinstance(value, torch.Tensor):
        return value
    meta = node.meta.get(_TENSOR_META)
    return meta if meta is not None and hasattr(meta, "shape") and hasattr(meta, "dtype") else None


def _is_fake(value: Any) -> bool:
    return isinstance(value, FakeTensor)


def propagate_inputs(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> None:
    """Annotate every node of ``gm`` with ``meta["val"]`` by running it on fake copies of
    ``example_inputs`` (no real computation happens). Raises :class:`RewriteError` when the
    inputs do not fit the graph."""
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp


    mode = FakeTensorMode(allow_non_fake_inputs=True)
    try:
        fake_inputs = [mode.from_tensor(x) if isinstance(x, torch.Tensor) else x for x in example_inputs]
        # the module's own parameters and buffers are swapped for fake ones while it runs, so an
        # in-place update in forward (a counter, BatchNorm's statistics) changes nothing real
        fake_state = {name: mode.from_tensor(t) for name, t in _state(gm).items()}
        with reparametrized(gm, fake_state):
            FakeTensorProp(gm, mode).propagate_dont_convert_inputs(*fake_inputs)
    except Exception as exc:
        raise RewriteError(
            f"could not propagate shapes with the given example_inputs: {type(exc).__name__}: {exc}. "
            f"Pass one value per forward() argument, as you would call the model."
        ) from exc


def _state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {**dict(module.named_parameters(remove_duplicate=False)),
            **dict(module.named_buffers(remove_duplicate=False))}


def propagate_values(gm: fx.GraphModule, nodes: Iterable[Node]) -> None:
    """Compute ``meta["val"]`` for ``nodes`` (in graph order) from their inputs' values.

    Nodes whose inputs lack values, or whose computation fails under fake tensors, are left
    without; the rewrite copies the replaced output's value onto the new output anyway.
    """
    nodes = list(nodes)
    inputs = [value_of(a) for n in nodes for a in n.all_input_nodes]
    mode = detect_fake_mode([v for v in inputs if _is_fake(v)])
    if mode is None:
        return
    for node in nodes:
        if has_value(node) or node.op in ("placeholder", "output"):
            continue
        if not all(has_value(a) for a in node.all_input_nodes):
            continue
        args = map_arg(node.args, value_of)
        kwargs = map_arg(node.kwargs, value_of)
        try:
            with mode:
                node.meta[_VALUE] = _run(gm, node, args, kwargs, mode)
        except Exception as exc:  # a value we cannot compute is only a missing annotation
            logger.debug("could not compute meta['val'] of %s: %s", node.format_node(), exc)


def _run(gm: fx.GraphModule, node: Node, args: Any, kwargs: Any, mode: Any) -> Any:
    if node.op == "call_function":
        return node.target(*args, **kwargs)  # type: ignore[operator]
    if node.op == "call_method":
        return getattr(args[0], str(node.target))(*args[1:], **kwargs)
    if node.op == "call_module":
        return gm.get_submodule(str(node.target))(*args, **kwargs)
    if node.op == "get_attr":
        value: Any = gm
        for part in str(node.target).split("."):
            value = getattr(value, part)
        return mode.from_tensor(value) if isinstance(value, torch.Tensor) else value
    raise ValueError(f"no value for a {node.op} node")


def record_values(gm: fx.GraphModule, *args: Any) -> Any:
    """Run ``gm`` on real ``args``, leaving each node's value in ``meta["val"]`` (what guards and
    replacements read); returns the output. The property checker and the rule analysis run
    patterns this way on concrete inputs.

    >>> gm = fx.symbolic_trace(lambda a: a.relu() + 1)
    >>> _ = record_values(gm, torch.tensor([-1.0, 2.0]))
    >>> [n.meta["val"].tolist() for n in gm.graph.nodes if n.op == "call_function"]
    [[1.0, 3.0]]
    """
    return _ValueRecorder(gm).run(*args)


class _ValueRecorder(fx.Interpreter):
    def run_node(self, n: Node) -> Any:
        value = super().run_node(n)
        n.meta[_VALUE] = value
        return value
