"""fxrewrite.canon.effects: What a node computes, which inputs it aliases and which it writes: one row
per op family."""

from __future__ import annotations

import operator

import pytest
import torch
import torch.fx as fx
import torch.nn.functional as F

from fxrewrite.canon import (
    aliased_inputs,
    is_check,
    is_written,
    mutation,
    result_kind,
    written_arguments,
)

X = torch.randn(3, 4)
Y = torch.randn(3, 4)


# ---- what a node means: one row per op family ----------------------------------------------------------------------
#
# Each row builds one node in a small graph and states what canon answers about it. These answers
# drive matching (result kind), the driver's in-place check (mutation, aliasing) and recording on


def _node(build):
    """The last node ``build(graph, x, y)`` makes, in a graph with tensor placeholders x, y."""
    graph = fx.Graph()
    x, y = graph.placeholder("x"), graph.placeholder("y")
    node = build(graph, x, y)
    graph.output(node)
    return node, x, y


FAMILIES = {
    # name: (build, result kind, aliases x?, written argument or None)
    "pointwise op": (lambda g, x, y: g.call_function(torch.add, (x, y)), "tensor", False, None),
    "python operator on graph inputs": (lambda g, x, y: g.call_function(operator.mul, (x, y)), "unknown", False, None),
    "python operator on a tensor": (lambda g, x, y: g.call_function(operator.mul, (g.call_method("neg", (x,)), 2)),
                                    "tensor", False, None),
    "aten overload": (lambda g, x, y: g.call_function(torch.ops.aten.neg.default, (x,)), "tensor", False, None),
    "view method": (lambda g, x, y: g.call_method("transpose", (x, 0, 1)), "tensor", True, None),
    "view aten": (lambda g, x, y: g.call_function(torch.ops.aten.view.default, (x, [4])), "tensor", True, None),
    "contiguous may alias": (lambda g, x, y: g.call_method("contiguous", (x,)), "tensor", True, None),
    "float() may alias": (lambda g, x, y: g.call_method("float", (x,)), "tensor", True, None),
    "to(dtype) may alias": (lambda g, x, y: g.call_method("to", (x, torch.float32)), "tensor", True, None),
    "_to_copy copies": (lambda g, x, y: g.call_function(torch.ops.aten._to_copy.default, (x,),
                                                        {"dtype": torch.float16}),
                        "tensor", False, None),
    "swapaxes": (lambda g, x, y: g.call_method("swapaxes", (x, 0, 1)), "tensor", True, None),
    "moveaxis": (lambda g, x, y: g.call_function(torch.moveaxis, (x, 0, 1)), "tensor", True, None),
    "ravel": (lambda g, x, y: g.call_method("ravel", (x,)), "tensor", True, None),
    "unfold": (lambda g, x, y: g.call_method("unfold", (x, 0, 2, 1)), "tensor", True, None),
    "positive": (lambda g, x, y: g.call_function(torch.positive, (x,)), "tensor", True, None),
    ".real": (lambda g, x, y: g.call_function(getattr, (x, "real")), "tensor", True, None),
    ".mT": (lambda g, x, y: g.call_function(getattr, (x, "mT")), "tensor", True, None),
    "indexing": (lambda g, x, y: g.call_function(operator.getitem, (x, 0)), "unknown", True, None),
    "split tuple": (lambda g, x, y: g.call_method("split", (x, 2)), "sequence", True, None),
    "in-place method": (lambda g, x, y: g.call_method("add_", (x, y)), "unknown", True, "x"),
    "in-place aten": (lambda g, x, y: g.call_function(torch.ops.aten.mul_.Tensor, (x, y)), "tensor", True, "x"),
    "inplace=True keyword": (lambda g, x, y: g.call_function(F.relu, (x,), {"inplace": True}), "unknown", True, "x"),
    "inplace=True positional": (lambda g, x, y: g.call_function(F.relu, (x, True)), "unknown", True, "x"),
    "out= argument": (lambda g, x, y: g.call_function(torch.add, (x, 1), {"out": y}), "unknown", True, "y"),
    "setitem": (lambda g, x, y: g.call_function(operator.setitem, (x, 0, y)), "unknown", True, "x"),
    "size method": (lambda g, x, y: g.call_method("size", (x, -1)), "value", False, None),
    ".shape": (lambda g, x, y: g.call_function(getattr, (x, "shape")), "value", False, None),
    ".dtype": (lambda g, x, y: g.call_function(getattr, (x, "dtype")), "value", False, None),
    "dim method": (lambda g, x, y: g.call_method("dim", (x,)), "value", False, None),
    "sym_size": (lambda g, x, y: g.call_function(torch.ops.aten.sym_size.int, (x, 0)), "value", False, None),
    "size arithmetic": (lambda g, x, y: g.call_function(operator.mul, (g.call_method("size", (x, 0)),
                                                                         g.call_method("size", (x, 1)))),
                        "value", False, None),
    "math on sizes": (lambda g, x, y: g.call_function(__import__("math").sqrt, (g.call_method("size", (x, -1)),)),
                      "value", False, None),
    "max.dim tuple": (lambda g, x, y: g.call_function(torch.ops.aten.max.dim, (x, 0)), "sequence", False, None),
    "check node": (lambda g, x, y: g.call_function(torch.ops.aten._assert_tensor_metadata.default, (x,),
                                                   {"dtype": torch.float32}), "none", False, None),
    "unknown user function": (lambda g, x, y: g.call_function(lambda a, b: a, (x, y)), "unknown", True, None),
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_what_a_node_computes_aliases_and_writes(family):
    build, kind, aliases_x, written = FAMILIES[family]
    node, x, y = _node(build)
    assert result_kind(node) == kind
    assert (x in aliased_inputs(node)) is aliases_x
    expected_written = {"x": (x,), "y": (y,), None: ()}[written]
    assert written_arguments(node) == expected_written
    assert (mutation(node) is not None) is (written is not None)


def test_writes_are_found_through_every_alias_and_base():
    gm = fx.symbolic_trace(lambda a: (a.contiguous().float().swapaxes(0, 1).add_(1), a.neg()))
    a = next(n for n in gm.graph.nodes if n.op == "placeholder")
    neg = next(n for n in gm.graph.nodes if n.target == "neg")
    assert is_written(a)  # written through a chain of (possible) views
    assert not is_written(neg)


def test_a_check_node_is_recognised_only_without_users():
    graph = fx.Graph()
    x = graph.placeholder("x")
    check = graph.call_function(torch.ops.aten._assert_scalar.default, (x, "msg"))
    relu = graph.call_function(torch.ops.aten.relu.default, (x,))
    graph.output(relu)
    assert is_check(check)
    assert not is_check(relu)


def test_mutation_from_the_table_of_calls_without_keywords_is_the_mutation_worked_out_anew():
    from fxrewrite.canon import effects

    def program(x, y):
        a = F.relu(x, True) + F.relu(x) + F.relu(x, inplace=True) + F.dropout(x, 0.1, False, True)
        b = x.clone().add_(1) + torch.add(x, y) + torch.sigmoid_(x.clone()) + operator.iadd(x.clone(), 1)
        c = torch.add(x, 1, out=y.clone()) + torch.ops.aten.add_.Tensor(x.clone(), y) + torch.ops.aten.neg.default(x)
        return a, b, c, x.relu_()

    gm = fx.symbolic_trace(program)
    for n in gm.graph.nodes:
        effects.FAST_MUTATION = False
        try:
            slow = mutation(n)
        finally:
            effects.FAST_MUTATION = True
        assert [mutation(n), mutation(n)] == [slow, slow], n.format_node()  # filled, then read
    assert sum(mutation(n) is not None for n in gm.graph.nodes) >= 8


def test_writes_in_place_says_what_asking_mutation_of_every_node_says():
    """``writes_in_place`` (pure calls without keywords passed over from the table) against its
    slow twin, ``any(mutation(n) is not None ...)``: on a program that writes nowhere, and on it
    with each node of a program that writes (in-place methods and functions, ``inplace=`` given
    by position and by keyword, ``out=``, an ATen overload) put after it, the write deciding."""
    from fxrewrite.canon import effects, writes_in_place

    def program(x, y):
        a = torch.sigmoid(x) + F.relu(x) + torch.neg(x)
        b = F.relu(a, True) + x.clone().add_(1) + F.relu(a, inplace=True)
        c = torch.add(x, 1, out=y.clone()) + torch.ops.aten.add_.Tensor(x.clone(), y) + operator.iadd(a, 1)
        return b, c, x.relu_()

    pure = list(fx.symbolic_trace(lambda x: (torch.relu(x).neg() + F.relu(x), torch.add(x, 1, alpha=2))).graph.nodes)
    graph = fx.Graph()  # what tracing spells otherwise: inplace= by position, an in-place operator
    x = graph.placeholder("x")
    by_hand = [graph.call_function(F.relu, (x, True)), graph.call_function(operator.iadd, (x, 1)),
               graph.call_function(F.relu, (x, False))]
    writes = 0
    for node in [None, *fx.symbolic_trace(program).graph.nodes, *by_hand]:
        nodes = pure + ([node] if node is not None else [])
        effects.FAST_MUTATION = False
        try:
            slow = writes_in_place(nodes)
        finally:
            effects.FAST_MUTATION = True
        assert slow == (node is not None and mutation(node) is not None)
        assert [writes_in_place(nodes), writes_in_place(nodes)] == [slow, slow], nodes[-1]  # filled, then read
        writes += slow
    assert writes >= 8


# ---- module attributes read from the module's tables (FAST_MODULE_ATTRIBUTES) ----------------------------------------


class _ClassFlag(torch.nn.Identity):
    inplace = True


class _PropertyFlag(torch.nn.Identity):
    @property
    def inplace(self):
        return True


class _SlottedFlag(torch.nn.Identity):
    __slots__ = ("inplace",)


class _OwnGetattr(torch.nn.Identity):
    def __getattr__(self, name):
        return True if name == "inplace" else super().__getattr__(name)


class _OwnGetattribute(torch.nn.Identity):
    def __getattribute__(self, name):
        return True if name == "inplace" else super().__getattribute__(name)


class _OwnGetSubmodule(fx.GraphModule):
    def get_submodule(self, target):
        return torch.nn.ReLU(inplace=True)


def _holding(kind):
    """A module whose ``inplace`` is held in its ``kind`` table (parameter, buffer, submodule)."""
    module = torch.nn.Identity()
    if kind == "parameter":
        module.register_parameter("inplace", torch.nn.Parameter(torch.ones(1)))
    elif kind == "buffer":
        module.register_buffer("inplace", torch.ones(1))
    else:
        module.add_module("inplace", torch.nn.ReLU())
    return module


def _slotted_set():
    module = _SlottedFlag()
    object.__setattr__(module, "inplace", True)
    return module


def _instance_true_by_dict():
    module = torch.nn.Identity()
    module.__dict__["inplace"] = True
    return module


MODULES_NAMING_INPLACE = {
    # name: (make the module, does calling it write in place?)
    "in-place ReLU": (lambda: torch.nn.ReLU(inplace=True), True),
    "out-of-place ReLU": (lambda: torch.nn.ReLU(), False),
    "no such attribute": (lambda: torch.nn.Conv2d(1, 1, 1), False),
    "inplace=1, not True": (lambda: torch.nn.Hardtanh(inplace=1), False),
    "instance dict": (_instance_true_by_dict, True),
    "class attribute": (_ClassFlag, True),
    "property": (_PropertyFlag, True),
    "slot, set": (_slotted_set, True),
    "slot, unset": (_SlottedFlag, False),
    "parameter named inplace": (lambda: _holding("parameter"), False),
    "buffer named inplace": (lambda: _holding("buffer"), False),
    "submodule named inplace": (lambda: _holding("submodule"), False),
    "own __getattr__": (_OwnGetattr, True),
    "own __getattribute__": (_OwnGetattribute, True),
}


def _calling(modules, target, owner_class=fx.GraphModule):
    """A ``call_module`` node of ``target`` in an ``owner_class`` GraphModule holding ``modules``
    (dotted paths; the first is called while the module is built)."""
    root = torch.nn.Module()
    for path, module in modules.items():
        parent = root
        *parents, last = path.split(".")
        for part in parents:
            if part not in parent._modules:
                parent.add_module(part, torch.nn.Module())
            parent = parent._modules[part]
        parent.add_module(last, module)
    graph = fx.Graph()
    node = graph.call_module(next(iter(modules)), (graph.placeholder("x"),))
    graph.output(node)
    gm = owner_class(root, graph)
    node.target = target
    return gm, node


def _mutation_both_ways(node):
    from fxrewrite.canon import effects

    effects.FAST_MODULE_ATTRIBUTES = False
    try:
        slow = mutation(node)
    finally:
        effects.FAST_MODULE_ATTRIBUTES = True
    return slow, mutation(node)


@pytest.mark.parametrize("name", sorted(MODULES_NAMING_INPLACE))
def test_mutation_of_a_module_call_reads_inplace_as_getattr_does(name):
    """The fast read of a called module's ``inplace`` against ``getattr``: class attributes,
    properties, slots, parameters, buffers and submodules named ``inplace``, classes with a
    ``__getattr__`` or ``__getattribute__`` of their own (one module per row, at a nested path)."""
    make, writes = MODULES_NAMING_INPLACE[name]
    gm, node = _calling({"block.layer": make()}, "block.layer")
    gm.graph.lint()
    slow, fast = _mutation_both_ways(node)
    assert slow == fast
    assert (fast is not None) is writes


def test_mutation_of_a_module_call_finds_the_module_as_get_submodule_does():
    """Paths that do not lead to a module (missing, through a parameter, a submodule set to
    ``None``) and an owner with a ``get_submodule`` of its own: fast and slow agree."""
    relu = torch.nn.ReLU(inplace=True)
    plain = fx.GraphModule
    cases = [({"a.relu": relu}, "a.relu", plain, True),
             ({"a.relu": relu}, "a.missing", plain, False),
             ({"a.relu": relu}, "b.relu", plain, False),
             ({"a.relu": relu}, "a.relu.weight", plain, False),
             ({"lin": torch.nn.Linear(1, 1)}, "lin.weight", plain, False),
             ({"a.relu": relu}, "a.relu", _OwnGetSubmodule, True),
             ({"a.relu": torch.nn.ReLU()}, "a.relu", _OwnGetSubmodule, True),
             ({"a.relu": relu}, "a", plain, False),
             ({"a.relu": relu}, "", plain, False)]
    for modules, target, owner_class, writes in cases:
        gm, node = _calling(modules, target, owner_class)
        slow, fast = _mutation_both_ways(node)
        assert slow == fast, (target, owner_class)
        assert (fast is not None) is writes, (target, owner_class)
    lin = torch.nn.Linear(1, 1)
    lin.weight.inplace = True  # a tensor is not a module, whatever it says
    gm, node = _calling({"lin": lin}, "lin.weight")
    assert _mutation_both_ways(node) == (None, None)
    gm, node = _calling({"a.relu": relu}, "a.relu")
    gm.get_submodule("a").register_module("relu", None)
    assert _mutation_both_ways(node) == (None, None)


def test_plain_attribute_answers_what_getattr_answers_or_declines():
    from fxrewrite.canon.effects import ABSENT, UNSURE, plain_attribute

    for name, (make, _) in sorted(MODULES_NAMING_INPLACE.items()):
        module = make()
        found = plain_attribute(module, "inplace")
        if found is ABSENT:
            assert not hasattr(module, "inplace"), name
        elif found is not UNSURE:
            assert found is module.inplace, name
    assert plain_attribute(_ClassFlag(), "inplace") is UNSURE  # the class names it
    assert plain_attribute(_OwnGetattr(), "anything") is UNSURE
    assert plain_attribute(torch.nn.ReLU(inplace=True), "inplace") is True


class _ParametrizationsProperty(torch.nn.Linear):
    @property
    def parametrizations(self):
        return torch.nn.ModuleDict({"weight": torch.nn.Identity()})


class _OwnGetattrParametrized(torch.nn.Linear):
    def __getattr__(self, name):
        if name == "parametrizations":
            return torch.nn.ModuleDict({"weight": torch.nn.Identity()})
        return super().__getattr__(name)


class _Double(torch.nn.Module):
    def forward(self, w):
        return 2 * w


def _parametrized_linear():
    from torch.nn.utils import parametrize

    module = torch.nn.Linear(2, 2)
    parametrize.register_parametrization(module, "weight", _Double())
    return module


def _parametrizations_submodule(held):
    module = torch.nn.Linear(2, 2)
    module.add_module("parametrizations", held)
    return module


@pytest.mark.parametrize("make, parametrized", [
    (lambda: torch.nn.Linear(2, 2), False),
    (_parametrized_linear, True),
    (lambda: _parametrizations_submodule(torch.nn.ModuleDict()), False),  # empty
    (lambda: _parametrizations_submodule(torch.nn.ModuleDict({"w": torch.nn.Identity()})), True),
    (lambda: _parametrizations_submodule(torch.nn.Identity()), False),  # not a ModuleDict
    (lambda: _ParametrizationsProperty(2, 2), True),
    (lambda: _OwnGetattrParametrized(2, 2), True),
], ids=["plain", "registered", "empty table", "table", "not a table", "property", "own __getattr__"])
def test_is_parametrized_answers_as_torch_with_either_attribute_read(make, parametrized):
    from torch.nn.utils import parametrize

    from fxrewrite.canon import effects

    module = make()
    assert parametrize.is_parametrized(module) is parametrized
    assert effects.is_parametrized(module) is parametrized
    effects.FAST_MODULE_ATTRIBUTES = False
    try:
        assert effects.is_parametrized(module) is parametrized
    finally:
        effects.FAST_MODULE_ATTRIBUTES = True


class _OwnNamedModules(torch.nn.Module):
    """A container listing one child under a name of its own choosing."""

    def __init__(self, child):
        super().__init__()
        self.child = child

    def named_modules(self, memo=None, prefix="", remove_duplicate=True):
        yield prefix, self
        yield f"{prefix}.renamed" if prefix else "renamed", self.child


class _AllEqual(torch.nn.Linear):
    """Modules equal to one another: the walk's memo keeps only the first."""

    def __eq__(self, other):
        return isinstance(other, _AllEqual)

    def __hash__(self):
        return 0


def _module_trees():
    shared = torch.nn.Linear(2, 2)
    nested = torch.nn.Sequential(torch.nn.Sequential(shared, torch.nn.ReLU()), shared, torch.nn.Conv2d(1, 1, 1))
    holes = torch.nn.Module()
    holes.register_module("gone", None)
    holes.add_module("kept", torch.nn.Sequential(torch.nn.Identity(), shared))
    root = torch.nn.Module()
    root.add_module("a", nested)
    root.add_module("b", holes)
    root.add_module("own", _OwnNamedModules(torch.nn.Sequential(shared, torch.nn.Tanh())))
    root.add_module("equal", torch.nn.Sequential(_AllEqual(1, 1), _AllEqual(2, 2)))
    root.add_module("again", nested)  # the whole subtree met before: listed once
    return {"tree": root, "graph module": fx.symbolic_trace(nested), "leaf": torch.nn.ReLU(),
            "own root": _OwnNamedModules(shared)}


@pytest.mark.parametrize("name", sorted(_module_trees()))
def test_named_modules_walks_the_tree_as_torch_does(name):
    """``FAST_NAMED_MODULES``: the same paths and the same modules in the same order as
    ``dict(root.named_modules())`` (its slow twin): a module under two paths, a subtree met twice,
    a ``None`` child, a class listing its children itself, modules equal to one another, a root
    with its own ``named_modules``."""
    from fxrewrite.canon import effects

    root = _module_trees()[name]
    expected = [(path, id(module)) for path, module in dict(root.named_modules()).items()]
    for fast in (True, False):
        effects.FAST_NAMED_MODULES = fast
        try:
            assert [(path, id(module)) for path, module in effects.named_modules(root).items()] == expected, fast
        finally:
            effects.FAST_NAMED_MODULES = True
    if name == "tree":
        assert "own.renamed" in dict(expected) and "equal.1" not in dict(expected) and "again" not in dict(expected)


@pytest.mark.parametrize("name", sorted(MODULES_NAMING_INPLACE))
def test_writes_in_place_reads_module_classes_once_as_each_read_does(name):
    """``CLASS_NAMES_ONCE``: in one pass of ``writes_in_place``, what a module's class defines is
    read once per class (a set of its classes' names) and gives what the walk of its MRO at each
    read gives (its slow twin): two modules of each row's class at nested paths, each node's
    answer and the pass's."""
    from fxrewrite.canon import effects, writes_in_place

    make, writes = MODULES_NAMING_INPLACE[name]
    root = torch.nn.Module()
    for parent in ("block", "other"):
        root.add_module(parent, torch.nn.Module())
        root.get_submodule(parent).add_module("layer", make())
    graph = fx.Graph()
    first = graph.call_module("block.layer", (graph.placeholder("x"),))
    second = graph.call_module("other.layer", (first,))
    graph.output(second)
    gm = fx.GraphModule(root, graph)
    gm.graph.lint()
    classes: dict = {}
    for node in (first, second):
        assert (effects._module_mutation(node, classes) is not None) is writes
        assert effects._module_mutation(node, classes) == mutation(node)
    assert classes  # the memo was filled (the owner's class at least)
    for once in (False, True):
        effects.CLASS_NAMES_ONCE = once
        try:
            assert writes_in_place(gm.graph.nodes) is writes, once
            assert writes_in_place([first, second] * effects._NAMES_FROM) is writes, once  # read once per class
        finally:
            effects.CLASS_NAMES_ONCE = True
