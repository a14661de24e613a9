"""ExportedProgram in, ExportedProgram out.

``rewrite(program, rules)`` rewrites the program's *lifted* graph (``program.graph_module``:
parameters, buffers and constants are placeholders, every node carries a fake tensor in
``meta["val"]``) and builds a new :class:`torch.export.ExportedProgram` around it, the way
torch's own passes do: the same input and output specs (only the names of the values they
point at are brought up to date), the same state dict, constants, range constraints, module
call graph and verifiers. The result survives ``run_decompositions()``,
``torch.export.save``/``load`` and ``.module()``, so it can go on to AOTInductor or ExecuTorch.

>>> import torch, fxrewrite
>>> class Net(torch.nn.Module):
...     def forward(self, x):
...         return torch.sigmoid(x) * x
>>> silu = fxrewrite.Rule.from_functions(lambda x: torch.sigmoid(x) * x,
...                                      lambda x: torch.nn.functional.silu(x), name="silu")
>>> program = torch.export.export(Net(), (torch.randn(2, 3),))
>>> result = fxrewrite.rewrite(program, silu)
>>> [n.target for n in result.exported_program.graph.nodes if n.op == "call_function"]
[<OpOverload(op='aten.silu', overload='default')>]
>>> result.exported_program.graph_signature.user_outputs
('silu',)
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.fx as fx
from torch.export import ExportedProgram
from torch.export.graph_signature import (
    ConstantArgument,
    CustomObjArgument,
    ExportGraphSignature,
    InputKind,
    InputSpec,
    OutputSpec,
    TensorArgument,
)
from torch.fx.node import Node

from .errors import ArgumentError, RewriteError
from .meta import lend_constant, rule_of
from .report import RewriteResult
from .target import to_graph_module

__all__ = ["rebuild_program", "rewrite_program"]


def rewrite_program(program: ExportedProgram, run: Callable[[fx.GraphModule], RewriteResult], *,
                    inplace: bool = False, example_inputs: Sequence[Any] | None = None) -> RewriteResult:
    """Rewrite ``program``'s lifted graph with ``run``; the result's ``exported_program`` is the
    rewritten program and its ``module`` is ``exported_program.module()``.

    ``run(gm)`` rewrites a copy of the lifted graph (never the program's own) and returns the
    :class:`~fxrewrite.report.RewriteResult` of a ``GraphModule``: :func:`fxrewrite.rewrite` hands
    over its drive with the rules and options bound, so this module needs nothing of the front door.
    ``inplace`` and ``example_inputs`` are the caller's, refused here with what to do instead.
    """
    if inplace:
        raise ArgumentError(
            "inplace=True cannot rewrite an ExportedProgram: a program is immutable. Drop inplace=True; the "
            "result's .exported_program is the rewritten program and .module its runnable module."
        )
    if example_inputs is not None:
        raise ArgumentError(
            "example_inputs= is not needed for an ExportedProgram: every node of its graph already carries "
            "its shape and dtype (meta['val']). Drop example_inputs=."
        )
    lifted = to_graph_module(program.graph_module)  # a copy: the program is never modified
    _lend_scalar_constants(lifted, program)
    pinned = _pin_boundaries(lifted, program)
    result = run(lifted)
    renamed = _unpin_boundaries(result.module, pinned)
    rebuilt = rebuild_program(program, result.module, renamed=renamed)
    return RewriteResult(rebuilt.module(), result.report, exported_program=rebuilt)


def rebuild_program(program: ExportedProgram, gm: fx.GraphModule, *,
                    renamed: Mapping[str, str] | None = None) -> ExportedProgram:
    """A new ``ExportedProgram`` like ``program`` whose graph is ``gm``, a rewritten copy of
    ``program.graph_module`` (same placeholders, same number of outputs). ``renamed`` maps the
    names of values at preserved module boundaries to the nodes that now compute them."""
    _refuse_module_calls(gm)
    signature = _updated_signature(program.graph_signature, gm)
    constants = dict(program.constants)
    signature = _lift_new_tensors(gm, signature, constants)
    gm.recompile()
    try:
        rebuilt = ExportedProgram(
            root=gm,
            graph=gm.graph,
            graph_signature=signature,
            state_dict=program.state_dict,
            range_constraints=copy.deepcopy(program.range_constraints),
            module_call_graph=_copied_call_graph(program, renamed or {}),
            example_inputs=program.example_inputs,
            constants=constants,
            verifiers=program.verifiers,
        )
    except Exception as exc:
        raise RewriteError(
            f"the rewritten graph is not a valid ExportedProgram: {type(exc).__name__}: {exc}. A replacement "
            f"probably produced a call torch.export does not allow (write replacements with torch functions "
            f"or ATen ops); rewrite program.module() instead if you only need a runnable module."
        ) from exc
    rebuilt.graph_module.meta.update({k: v for k, v in program.graph_module.meta.items()
                                      if k not in rebuilt.graph_module.meta})
    return rebuilt


def _boundary_names(program: ExportedProgram) -> list[str]:
    """Names of the values at the boundaries of modules whose call signature the program
    preserves (``torch.export.export(..., preserve_module_call_signature=...)``)."""
    names: dict[str, None] = {}
    for entry in program.module_call_graph:
        if entry.signature is not None:
            for arg in (*entry.signature.inputs, *entry.signature.outputs):
                if isinstance(getattr(arg, "name", None), str):
                    names.setdefault(arg.name)
    return list(names)


def _lend_scalar_constants(gm: fx.GraphModule, program: ExportedProgram) -> None:
    """Give the placeholders of lifted one-element tensor constants (``torch.tensor(-1e9)`` in
    ``forward``) their value (:func:`fxrewrite.meta.lend_constant`), so a literal capture can bind the
    number (see :func:`fxrewrite.canon.constant_scalar`); the graph otherwise holds only their fake
    tensors."""
    signature = program.graph_signature
    names = {spec.arg.name: spec.target for spec in signature.input_specs
             if spec.kind == InputKind.CONSTANT_TENSOR and isinstance(spec.arg, TensorArgument)}
    for node in gm.graph.nodes:
        if node.op == "placeholder" and node.name in names:
            value = program.constants.get(names[node.name])
            if isinstance(value, torch.Tensor) and value.numel() == 1 and value.dim() == 0:
                lend_constant(node, value.detach().clone())


def _pin_boundaries(gm: fx.GraphModule, program: ExportedProgram) -> list[str]:
    """Make the values at preserved module boundaries extra graph outputs while rules run: a
    match can then not swallow one (it has a user outside the match), and a rewrite that
    replaces one rewires the extra output, which says what computes the value now."""
    by_name = {n.name: n for n in gm.graph.nodes}
    names = [name for name in _boundary_names(program) if name in by_name]
    if names:
        output = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
        output.args = ((*output.args[0], *(by_name[name] for name in names)),)
    return names


def _unpin_boundaries(gm: fx.GraphModule, names: Sequence[str]) -> dict[str, str]:
    """Drop the extra outputs of :func:`_pin_boundaries`; map each boundary name to the node
    that computes its value now."""
    if not names:
        return {}
    output = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    values = list(output.args[0])
    kept, pinned = values[:-len(names)], values[-len(names):]
    output.args = (tuple(kept),)
    renamed = {}
    for name, node in zip(names, pinned):
        if not node.users and node.target is torch.ops.aten.clone.default and rule_of(node) is None:
            gm.graph.erase_node(node)  # the driver's clone for an output that became an input: not needed
            node = node.args[0]
        if node.name != name:
            renamed[name] = node.name
    return renamed


def _copied_call_graph(program: ExportedProgram, renamed: Mapping[str, str]) -> list[Any]:
    """The module call graph, with fresh argument lists (the program's constructor may rename
    arguments in them) naming the nodes that now compute boundary values. ``copy.deepcopy``
    would also copy the pytree specs, which warns."""
    def fresh(arg: Any) -> Any:
        name = getattr(arg, "name", None)
        if isinstance(name, str) and name in renamed:
            return dataclasses.replace(arg, name=renamed[name])
        return copy.copy(arg)

    entries = []
    for entry in program.module_call_graph:
        signature = entry.signature
        if signature is not None:
            signature = dataclasses.replace(signature, inputs=[fresh(a) for a in signature.inputs],
                                            outputs=[fresh(a) for a in signature.outputs])
        entries.append(dataclasses.replace(entry, signature=signature))
    return entries


def _refuse_module_calls(gm: fx.GraphModule) -> None:
    for node in gm.graph.nodes:
        if node.op in ("call_module", "call_method"):
            rule = rule_of(node) or "a rule"
            raise RewriteError(
                f"{rule} put a {node.op} node ('{node.format_node()}') into an exported graph; an ExportedProgram "
                f"holds only calls of ATen ops and functions. Write the replacement with torch functions "
                f"(F.linear(x, m.weight, m.bias) rather than m(x)), or rewrite program.module() instead."
            )


def _updated_signature(old: ExportGraphSignature, gm: fx.GraphModule) -> ExportGraphSignature:
    """``old`` with every tensor argument renamed to the node now in its place: placeholders
    keep their names, but an output may now be computed by a node the rewrite created."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    outputs = _output_values(gm)
    if len(placeholders) != len(old.input_specs) or len(outputs) != len(old.output_specs):
        raise RewriteError(
            f"the rewrite changed the program's signature ({len(old.input_specs)} inputs and "
            f"{len(old.output_specs)} outputs became {len(placeholders)} and {len(outputs)}); this is a bug "
            f"in fxrewrite, please report it with the rule set."
        )
    inputs = [InputSpec(s.kind, _renamed(s.arg, n), s.target, s.persistent)
              for s, n in zip(old.input_specs, placeholders)]
    outs = [OutputSpec(s.kind, _renamed(s.arg, n), s.target) for s, n in zip(old.output_specs, outputs)]
    return ExportGraphSignature(input_specs=inputs, output_specs=outs)


def _output_values(gm: fx.GraphModule) -> list[Any]:
    output = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    values = output.args[0]
    return list(values) if isinstance(values, (tuple, list)) else [values]


def _renamed(arg: Any, value: Any) -> Any:
    if isinstance(arg, (ConstantArgument, CustomObjArgument)) or not isinstance(value, Node):
        return arg
    return type(arg)(name=value.name)


def _lift_new_tensors(gm: fx.GraphModule, signature: ExportGraphSignature,
                      constants: dict[str, Any]) -> ExportGraphSignature:
    """A replacement that creates a tensor (``x * torch.tensor(2.0)``) stores it on the module
    and reads it with ``get_attr``; an exported graph takes such tensors as lifted constants:
    a placeholder before the user inputs, an input spec of kind ``CONSTANT_TENSOR``."""
    reads = [n for n in gm.graph.nodes if n.op == "get_attr" and isinstance(_attr(gm, n.target), torch.Tensor)]
    if not reads:
        return signature
    specs = list(signature.input_specs)
    first_user = next((i for i, s in enumerate(specs) if s.kind == InputKind.USER_INPUT), len(specs))
    anchor = [n for n in gm.graph.nodes if n.op == "placeholder"][first_user] if first_user < len(specs) else None
    for i, node in enumerate(reads):
        name = f"c_fxrewrite_{node.target.replace('.', '_')}"
        tensor = _attr(gm, node.target)
        constants[node.target] = tensor
        with gm.graph.inserting_before(anchor) if anchor is not None else _before_first_op(gm):
            placeholder = gm.graph.placeholder(name)
        placeholder.meta.update(node.meta)
        node.replace_all_uses_with(placeholder)
        gm.graph.erase_node(node)
        specs.insert(first_user + i, InputSpec(InputKind.CONSTANT_TENSOR, TensorArgument(placeholder.name),
                                               node.target, None))
        _delete_attr(gm, node.target)
    return ExportGraphSignature(input_specs=specs, output_specs=list(signature.output_specs))


def _before_first_op(gm: fx.GraphModule) -> Any:
    first = next(n for n in gm.graph.nodes if n.op != "placeholder")
    return gm.graph.inserting_before(first)


def _attr(gm: fx.GraphModule, target: str) -> Any:
    owner: Any = gm
    for part in target.split("."):
        owner = getattr(owner, part, None)
    return owner


def _delete_attr(gm: fx.GraphModule, target: str) -> None:
    *path, last = target.split(".")
    owner: Any = gm
    for part in path:
        owner = getattr(owner, part)
    delattr(owner, last)
