"""The private torch APIs fxrewrite relies on (``fxrewrite/_torch.py``), checked against the
installed torch: when a release moves one, this file fails with its name."""

from __future__ import annotations

import torch
import torch.fx as fx
import torch.nn as nn

from fxrewrite import _torch


def test_node_positions_follow_graph_order_and_erasure_is_visible():
    graph = fx.Graph()
    a = graph.placeholder("a")
    b = graph.call_function(torch.neg, (a,))
    c = graph.call_function(torch.relu, (b,))
    graph.output(c)
    assert _torch.node_position(a) < _torch.node_position(b) < _torch.node_position(c)
    with graph.inserting_before(c):
        d = graph.call_function(torch.abs, (b,))
    assert _torch.node_position(b) < _torch.node_position(d) < _torch.node_position(c)
    assert not _torch.is_erased(d)
    graph.erase_node(d)
    assert _torch.is_erased(d)


def test_a_graph_module_gets_a_graph_without_compiling_it_and_attributes_by_path():
    source = nn.Sequential(nn.Linear(2, 2))
    target = fx.GraphModule(nn.Module(), fx.Graph())
    _torch.copy_attribute(source, target, "0.weight")
    assert target.get_submodule("0").weight is source[0].weight
    graph = fx.symbolic_trace(nn.ReLU()).graph
    _torch.set_graph_without_compiling(target, graph)
    assert target.graph is graph and graph.owning_module is target
    target.recompile()
    x = torch.randn(3)
    torch.testing.assert_close(target(x), torch.relu(x))


def test_fake_tensors_are_detected_and_modules_run_reparametrized():
    mode = _torch.FakeTensorMode()
    fake = mode.from_tensor(torch.randn(2))
    assert isinstance(fake, _torch.FakeTensor)
    assert _torch.detect_fake_mode([fake]) is mode
    assert _torch.detect_fake_mode([torch.randn(2)]) is None
    lin = nn.Linear(2, 2)
    zeros = {"weight": torch.zeros(2, 2), "bias": torch.zeros(2)}
    with _torch.reparametrized(lin, zeros):
        assert torch.equal(lin(torch.ones(2)), torch.zeros(2))
    assert not torch.equal(lin.weight, torch.zeros(2, 2))


def test_pytrees_flatten_and_rebuild_node_arguments():
    leaves, spec = _torch.tree_flatten(((1, [2, 3]), {"k": 4}))
    assert leaves == [1, 2, 3, 4] == _torch.tree_leaves(((1, [2, 3]), {"k": 4}))
    assert _torch.tree_unflatten([5, 6, 7, 8], spec) == ((5, [6, 7]), {"k": 8})


def test_replacement_attributes_are_copied_as_torch_fx_does():
    class WithConst(nn.Module):
        def __init__(self):
            super().__init__()
            self.c = torch.tensor([3.0])

        def forward(self, x):
            return x + self.c

    gm = fx.symbolic_trace(WithConst())  # its graph reads self.c ...
    delattr(gm, "c")  # ... which only the replacement module has
    _torch.copy_replacement_attributes(gm, fx.symbolic_trace(WithConst()))
    assert torch.equal(gm.c, torch.tensor([3.0]))


def test_nodes_are_added_under_fresh_names_at_the_insertion_point_as_create_node_adds_them():
    graph = fx.Graph()
    x = graph.placeholder("x")
    first = graph.call_function(torch.relu, (x,))
    out = graph.output(first)
    assert _torch.node_name_base(graph, torch.relu) == "relu"
    assert _torch.node_name_base(graph, "__add__") == "add"
    name = _torch.fresh_node_name(graph, "relu")
    assert name == "relu_1"
    with graph.inserting_before(out):
        added = _torch.add_node(graph, name, "call_function", torch.relu, (first,), {}, meta={"tag": 1})
    out.args = (added,)
    assert [n.name for n in graph.nodes] == ["x", "relu", "relu_1", "output"]
    assert added.meta == {"tag": 1} and added in graph.find_nodes(op="call_function", target=torch.relu)
    assert len(graph.nodes) == 4
    graph.lint()
    assert _torch.fresh_node_name(graph, "relu") == "relu_2"
    gm = fx.GraphModule(nn.Module(), graph)
    torch.testing.assert_close(gm(torch.tensor([-1.0, 2.0])), torch.tensor([0.0, 2.0]))


def test_a_copied_namespace_hands_out_the_names_the_original_would():
    graph = fx.symbolic_trace(lambda a: torch.relu(torch.relu(a))).graph
    copy = fx.Graph()
    for node in graph.find_nodes(op="placeholder"):
        _torch.add_node(copy, node.name, node.op, node.target, (), {})
    _torch.copy_namespace(graph, copy)
    assert _torch.fresh_node_name(copy, "relu") == _torch.fresh_node_name(graph, "relu") == "relu_2"


def test_the_code_generator_s_parts_are_where_fxrewrite_codegen_reads_them():
    assert ("torch", torch) in _torch.fx_codegen_builtins()
    assert _torch.fx_qualified_name(torch.relu) == "torch.relu" and _torch.fx_is_from_torch(torch.relu)
    assert _torch.fx_format_target("self", "layers.0") == 'getattr(self.layers, "0")'
    assert _torch.fx_magic_methods["add"] == "{} + {}" and _torch.fx_inplace_methods["iadd"] == "{} += {}"
    assert _torch.fx_type_repr(torch.Tensor) == "torch.Tensor" and not _torch.is_opaque_value_type(int)
    namespace = _torch.FxNamespace()
    assert [namespace.create_name("input", None), namespace.create_name("x", None)] == ["input_1", "x"]
    assert issubclass(_torch.FxPythonCode, object) and hasattr(_torch.FxCodeGen, "_gen_python_code")
    gm = fx.symbolic_trace(nn.ReLU())
    calls = []

    def generate(root_module, **options):
        calls.append(root_module)
        return fx.Graph.python_code(gm.graph, root_module, **options)

    with _torch.python_code_replaced(gm.graph, generate):
        gm.recompile()
    assert calls == ["self"] and "python_code" not in vars(gm.graph)


def test_a_graph_that_refuses_the_replacement_keeps_its_own_python_code():
    class Guarded(fx.Graph):
        def __setattr__(self, name, value):
            if name == "python_code":
                raise AttributeError("read-only")
            super().__setattr__(name, value)

    graph = Guarded()
    graph.output(graph.placeholder("x"))
    gm = fx.GraphModule(nn.Module(), graph)
    with _torch.python_code_replaced(gm.graph, lambda *a, **k: None):
        gm.recompile()
    assert "return x" in gm.code


_CANDIDATES = ["add", "add", "add_1", "add_1", "add_01", "add_0", "a__1", "a_1_", "a_1_2", "_", "_1", "__1",
               "_unnamed", "x", "x_1", "x", "list", "list_1", "getattr", "if", "torch", "mul_99", "mul", "mul",
               "9lives", "\u03b1\u03b2", "a-b", "a b_2", "", "add_\u0661", "name_2\n", "\u03a9_3", "add_2", "add"]


def test_the_fast_namespace_names_as_fx_s_and_keeps_the_same_state():
    objects = [object() for _ in _CANDIDATES]
    for associate in (False, True):
        slow, fast = _torch.FxNamespace(), _torch.FastNamespace()
        for candidate, obj in zip(_CANDIDATES, objects):
            obj_or_none = obj if associate else None
            assert fast.create_name(candidate, obj_or_none) == slow.create_name(candidate, obj_or_none), candidate
        assert fast.create_name("again", objects[0] if associate else None) == \
            slow.create_name("again", objects[0] if associate else None)
        assert fast._used_names == slow._used_names and fast._base_count == slow._base_count
        assert fast._obj_to_name == slow._obj_to_name


def test_naming_once_names_as_fx_s_namespace_names_a_new_object_each_time():
    """``FastNamespace.name_once`` (what the code generator names its nodes with) gives the names
    fx's namespace gives fresh objects, non-identifiers and builtin names included, and keeps the
    same used names and counts; with globals named in between (filed by object, as fx does)."""
    slow, fast = _torch.FxNamespace(), _torch.FastNamespace()
    for i, candidate in enumerate(_CANDIDATES):
        assert fast.name_once(candidate) == slow.create_name(candidate, object()), candidate
        if i % 5 == 0:
            assert fast.create_name("add", getattr) == slow.create_name("add", getattr)
    assert fast._used_names == slow._used_names and fast._base_count == slow._base_count
    assert fast.create_name("list", list) == slow.create_name("list", list) == "list"  # a builtin, for itself


def test_the_fast_namespace_names_builtins_for_their_own_object_as_fx_does():
    slow, fast = _torch.FxNamespace(), _torch.FastNamespace()
    for candidate, obj in [("getattr", getattr), ("list", list), ("getattr", None), ("len", object())]:
        assert fast.create_name(candidate, obj) == slow.create_name(candidate, obj)
    assert fast._used_names == slow._used_names and fast._base_count == slow._base_count


def test_a_node_name_base_is_what_fx_makes_of_the_target():
    """The fast path (a string with no uppercase letter, no magic name) and fx's own
    ``_target_to_str`` give the same base for every kind of target."""
    import operator

    graph = fx.Graph()
    targets = ["conv_bn_fold_conv2d_0", "relu", "layer1.0.conv", "__add__", "__my_op__", "_private", "a__b__",
               "convBn", "ALL_CAPS", "mixedCaseName_1", "été", "x2y", "", operator.mul, torch.relu, abs]
    for target in targets:
        assert _torch.node_name_base(graph, target) == fx.Graph._target_to_str(graph, target), target

    class Spelled(fx.Graph):  # a graph spelling targets its own way keeps its spelling
        def _target_to_str(self, target):
            return "custom"

    assert _torch.node_name_base(Spelled(), "relu") == "custom"


def test_a_fresh_submodule_is_filed_as_add_submodule_files_it_and_the_hooks_still_run():
    relu = nn.ReLU()
    fast, slow = fx.symbolic_trace(lambda x: x + 1), fx.symbolic_trace(lambda x: x + 1)
    _torch.add_fresh_submodule(fast, "act", relu)
    slow.add_submodule("act", relu)
    assert dict(fast.named_children()) == dict(slow.named_children()) == {"act": relu}
    _torch.add_fresh_submodule(fast, "outer.inner", nn.Tanh())  # a path: add_submodule makes the parents
    assert isinstance(fast.outer.inner, nn.Tanh)

    seen = []
    handle = nn.modules.module.register_module_module_registration_hook(
        lambda module, name, submodule: seen.append(name))
    try:
        _torch.add_fresh_submodule(fast, "hooked", nn.Sigmoid())  # a global hook: torch's own path runs it
    finally:
        handle.remove()
    assert seen == ["hooked"] and isinstance(fast.hooked, nn.Sigmoid)

    class Keeping(fx.GraphModule):
        def add_module(self, name, module):
            seen.append(f"kept {name}")
            super().add_module(name, module)

    keeping = Keeping(fast, fast.graph)
    _torch.add_fresh_submodule(keeping, "more", nn.ReLU())  # a class with its own add_module: called
    assert seen[-1] == "kept more" and isinstance(keeping.more, nn.ReLU)


def test_fresh_node_names_are_what_the_graph_s_namespace_hands_out():
    """``fresh_node_name`` (fx's namespace, named by the fast namespace's steps where the base is a
    plain identifier) gives the names and leaves the state fx's ``create_name`` does, also while
    the counts are journaled (as during a replacement's call)."""
    from fxrewrite.replace import _CountJournal

    for journaled in (False, True):
        fast, slow = fx.Graph(), fx.Graph()
        if journaled:
            fast._graph_namespace._base_count = _CountJournal(fast._graph_namespace._base_count)
        for candidate in [*_CANDIDATES, "add", "add", "add_1", "getattr", "list", "x y", "1abc", "été"]:
            assert _torch.fresh_node_name(fast, candidate) == slow._graph_namespace.create_name(candidate, None), \
                candidate
        counts = fast._graph_namespace._base_count
        assert fast._graph_namespace._used_names == slow._graph_namespace._used_names
        assert dict(counts.counts if journaled else counts) == slow._graph_namespace._base_count


def test_a_hook_filed_in_the_global_pre_hook_table_runs_at_module_calls_until_popped():
    """What ``ModuleCallSeen`` files: a key of its own beside torch's handle ids, no clash."""
    hooks, seen = _torch.global_forward_pre_hooks(), []
    handle = nn.modules.module.register_module_forward_pre_hook(lambda module, inputs: seen.append("torch's"))
    key = object()
    hooks[key] = lambda module, inputs: seen.append("ours")
    try:
        nn.ReLU()(torch.zeros(1))
    finally:
        hooks.pop(key)
        handle.remove()
    nn.ReLU()(torch.zeros(1))
    assert seen == ["torch's", "ours"] and key not in hooks and handle.id not in hooks
