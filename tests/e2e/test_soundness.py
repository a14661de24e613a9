"""No silent wrong result (issue 11): typed captures and hooks, subclasses that change meaning,
writes through aliases, outputs that would become inputs, rewrites from other threads, example
inputs that would touch real buffers, constants no op takes, and rules that reproduce their own
pattern; in-place ops and side effects next to a match. Each test checks the numbers and lints the
graph.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Annotated, Any

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from _helpers import assert_rewrite_sound, assert_same_outputs, standard_rules

import fxrewrite
from fxrewrite import RewriteError, Rule, RuleSet, explain, load_rules, rewrite

FUSION = load_rules()


def fold_conv_bn():
    return FUSION["conv_bn_fold"]


class ConvBn(nn.Module):
    def __init__(self, conv: nn.Module | None = None) -> None:
        super().__init__()
        self.conv = conv if conv is not None else nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)
        with torch.no_grad():
            self.bn.running_mean.uniform_(-1, 1)
            self.bn.running_var.uniform_(0.5, 2)

    def forward(self, x):
        return self.bn(self.conv(x))


class ConvLeaves(torch.fx.Tracer):
    """Keeps every convolution a call_module, subclasses defined outside torch.nn too (the
    default tracer inlines those)."""

    def is_leaf_module(self, m: nn.Module, qualified_name: str) -> bool:
        return isinstance(m, nn.Conv2d) or super().is_leaf_module(m, qualified_name)


def traced_with_conv_leaves(model: nn.Module) -> torch.fx.GraphModule:
    return torch.fx.GraphModule(model, ConvLeaves().trace(model))


def assert_equivalent(result, model, *inputs):
    assert_rewrite_sound(model, result, *inputs, rtol=1e-4, atol=1e-5)


X = torch.randn(2, 3, 8, 8)


# ---- 1. hooks and parametrizations --------------------------------------------------------------------------------

def _scale_output(module, args, output):
    return output * 3


HOOKS = {
    "forward hook": lambda m: m.conv.register_forward_hook(_scale_output),
    "forward pre-hook": lambda m: m.conv.register_forward_pre_hook(lambda mod, args: (args[0] * 2,)),
    "hook on the module folded into": lambda m: m.bn.register_forward_hook(_scale_output),
    "backward hook": lambda m: m.conv.register_full_backward_hook(lambda mod, gi, go: None),
    "parametrization": lambda m: torch.nn.utils.parametrize.register_parametrization(m.conv, "weight", _Double()),
    "weight_norm": lambda m: torch.nn.utils.parametrizations.weight_norm(m.conv),
}


class _Double(nn.Module):
    def forward(self, w):
        return w * 2


@pytest.mark.parametrize("hook", sorted(HOOKS))
def test_a_module_with_hooks_or_a_parametrization_is_never_folded_away(hook):
    model = ConvBn().eval()
    HOOKS[hook](model)
    result = rewrite(model, fold_conv_bn())
    assert result.report.applied["conv_bn_fold"] == 0
    assert_equivalent(result, model, X)
    text = str(explain(model, fold_conv_bn()))
    assert "folding it would drop their effect" in text


def test_a_global_module_hook_blocks_folding_while_it_is_registered():
    model = ConvBn().eval()
    handle = torch.nn.modules.module.register_module_forward_hook(lambda m, a, o: o)
    try:
        assert rewrite(model, fold_conv_bn()).report.applied["conv_bn_fold"] == 0
    finally:
        handle.remove()
    result = rewrite(model, fold_conv_bn())
    assert result.report.applied["conv_bn_fold"] == 1
    assert_equivalent(result, model, X)


def test_a_rule_that_accepts_hooks_says_so_in_its_annotation():
    def pattern(x, conv: Annotated[nn.Conv2d, fxrewrite.Accept(hooks=True)]):
        return torch.relu(conv(x))

    def replacement(x, conv: Annotated[nn.Conv2d, fxrewrite.Accept(hooks=True)]):
        return F.relu(conv(x))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3)
            self.conv.register_forward_hook(_scale_output)

        def forward(self, x):
            return torch.relu(self.conv(x))

    net = Net()
    result = rewrite(net, Rule.from_functions(pattern, replacement, name="r"))
    assert result.report.applied["r"] == 1  # the conv call (and its hook) stays: the rule keeps it
    assert_equivalent(result, net, X)


# ---- 2. subclasses that change meaning ---------------------------------------------------------------------------

def test_a_qat_convolution_is_not_folded_as_a_plain_convolution():
    qconfig = torch.ao.quantization.get_default_qat_qconfig("fbgemm")
    conv = torch.ao.nn.qat.Conv2d(3, 4, 3, qconfig=qconfig)
    model = ConvBn(conv).eval()
    model(X)  # observers see data
    gm = traced_with_conv_leaves(model)
    result = rewrite(gm, fold_conv_bn())
    assert result.report.applied["conv_bn_fold"] == 0
    assert "overrides forward" in str(explain(gm, fold_conv_bn()))
    assert_equivalent(result, model, X)


class LoggingConv(nn.Conv2d):
    """A subclass that overrides nothing: the same computation, so folding is right."""

    def extra_repr(self) -> str:
        return "logging " + super().extra_repr()


class ScaledConv(nn.Conv2d):
    def forward(self, x):
        return super().forward(x) * 0.5


def test_a_subclass_that_overrides_no_method_is_folded_and_one_that_does_is_not():
    plain = ConvBn(LoggingConv(3, 4, 3)).eval()
    folded = rewrite(traced_with_conv_leaves(plain), fold_conv_bn())
    assert folded.report.applied["conv_bn_fold"] == 1
    assert_equivalent(folded, plain, X)
    scaled = ConvBn(ScaledConv(3, 4, 3)).eval()
    result = rewrite(traced_with_conv_leaves(scaled), fold_conv_bn())
    assert result.report.applied["conv_bn_fold"] == 0
    assert_equivalent(result, scaled, X)


def test_a_rule_that_accepts_subclasses_says_so_in_its_annotation():
    def pattern(x, conv: Annotated[nn.Conv2d, fxrewrite.Accept(subclasses=True)]):
        return torch.neg(torch.neg(conv(x)))

    def replacement(x, conv: Annotated[nn.Conv2d, fxrewrite.Accept(subclasses=True)]):
        return conv(x)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = ScaledConv(3, 4, 3)

        def forward(self, x):
            return torch.neg(torch.neg(self.conv(x)))

    net = Net()
    result = rewrite(traced_with_conv_leaves(net), Rule.from_functions(pattern, replacement, name="r"))
    assert result.report.applied["r"] == 1
    assert_equivalent(result, net, X)


# ---- 3. writes through aliases ------------------------------------------------------------------------------------

NEG_NEG = Rule.from_functions(lambda x: torch.neg(torch.neg(x)), lambda x: x, name="neg_neg")

ALIASES = {
    "contiguous": lambda t: t.contiguous(),
    "float": lambda t: t.float(),
    "to same dtype": lambda t: t.to(torch.float32),
    "swapaxes": lambda t: t.swapaxes(0, 1),
    "moveaxis": lambda t: torch.moveaxis(t, 0, 1),
    "ravel": lambda t: t.ravel(),
    "unfold": lambda t: t.unfold(0, 2, 1),
    "positive": lambda t: torch.positive(t),
    "real": lambda t: t.real,
}


@pytest.mark.parametrize("alias", sorted(ALIASES))
def test_a_later_write_through_an_alias_blocks_a_rewrite_to_the_input_itself(alias):
    make_alias = ALIASES[alias]

    def fn(x):
        y = torch.neg(torch.neg(x))  # a new tensor: the later write must not change it
        make_alias(x).mul_(2)
        return y + 0

    result = rewrite(fn, NEG_NEG)
    assert result.report.applied["neg_neg"] == 0
    result.module.graph.lint()
    a, b = torch.randn(4, 4), None
    b = a.clone()
    torch.testing.assert_close(result.module(a), fn(b))


# ---- 5. outputs keep their aliasing contract -------------------------------------------------------------------------

@pytest.mark.parametrize("fn", [lambda a: torch.neg(torch.neg(a)), lambda a: torch.cat([torch.neg(torch.neg(a))])])
def test_an_output_that_was_a_new_tensor_is_never_the_input_itself(fn):
    result = rewrite(fn, NEG_NEG)
    result.module.graph.lint()
    x = torch.randn(3)
    out = result.module(x)
    assert out.data_ptr() != x.data_ptr()
    out.add_(1)  # the caller writes into the result ...
    torch.testing.assert_close(out - 1, fn(x))  # ... and its input is untouched


def test_an_output_that_was_the_input_stays_the_input():
    result = rewrite(lambda a: (torch.neg(torch.neg(a)), a), NEG_NEG)
    x = torch.randn(3)
    fresh, same = result.module(x)
    assert same is x and fresh.data_ptr() != x.data_ptr()
    assert_rewrite_sound(lambda a: (torch.neg(torch.neg(a)), a), result, x)


# ---- 7. example inputs never change real tensors ---------------------------------------------------------------------

class Counting(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("calls", torch.zeros(1))
        self.bn = nn.BatchNorm1d(3)

    def forward(self, x):
        self.calls.add_(1)
        return torch.neg(torch.neg(self.bn(x))) + self.calls


def test_propagating_example_inputs_leaves_the_callers_buffers_alone():
    model = Counting().train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    result = rewrite(model, NEG_NEG, example_inputs=(torch.randn(4, 3),))
    assert result.report.applied["neg_neg"] == 1
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name]), name
    assert "add_" in result.code  # the buffer update is part of the program, not run while tracing


# ---- 8. threads ------------------------------------------------------------------------------------------------------

class WithLinear(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(torch.neg(torch.neg(x)))


def test_concurrent_rewrites_and_forwards_in_other_threads_stay_correct():
    errors: list[BaseException] = []
    stop = threading.Event()
    bystander = WithLinear()
    x = torch.randn(2, 4)
    expected = bystander(x)

    def rewriting():
        try:
            for _ in range(10):
                model = WithLinear()
                result = rewrite(model, NEG_NEG)
                result.module.graph.lint()
                torch.testing.assert_close(result.module(x), model(x))
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    def forwarding():
        try:
            while not stop.is_set():
                torch.testing.assert_close(bystander(x), expected)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    workers = [threading.Thread(target=rewriting) for _ in range(4)]
    watcher = threading.Thread(target=forwarding)
    watcher.start()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    stop.set()
    watcher.join()
    assert not errors, errors[:2]
    assert nn.Module.__call__ is nn.Module._wrapped_call_impl  # nothing left behind


# ---- 10. constants no op can take ------------------------------------------------------------------------------------

@pytest.mark.parametrize("inplace", [False, True])
def test_a_replacement_computing_a_gigantic_int_is_refused_and_nothing_changes(inplace):
    import math

    rule = Rule.from_functions(lambda x: torch.neg(torch.neg(x)), lambda x: x * math.factorial(2000), name="huge")
    gm = torch.fx.symbolic_trace(lambda a: torch.neg(torch.neg(a)) + 1)
    code = gm.code
    with pytest.raises(RewriteError, match="beyond int64"):
        rewrite(gm, rule, inplace=inplace)
    gm.graph.lint()
    assert gm.code == code
    torch.testing.assert_close(gm(torch.ones(2)), torch.full((2,), 2.0))


# ---- issue 14's example: a product of sizes is not a tensor ----------------------------------------------------------

def test_a_tensor_rule_never_binds_a_product_of_sizes():
    rule = Rule.from_functions(lambda x, y: x * y, lambda x, y: torch.addcmul(torch.zeros_like(x), x, y), name="mul")

    def fn(a):
        return a.reshape(a.size(0) * a.size(1))

    result = rewrite(fn, rule)
    assert result.report.applied["mul"] == 0
    result.module.graph.lint()
    a = torch.randn(2, 3)
    torch.testing.assert_close(result.module(a), fn(a))


# ---- issue 13's run-time part: a rule that reproduces its own pattern ------------------------------------------------

def test_a_rule_that_rewrites_a_spelling_into_itself_fires_once_per_place_and_settles():
    rule = Rule.from_functions(lambda x: F.relu(x, inplace=False), lambda x: torch.relu(x), name="spelling")
    swap = Rule.from_functions(lambda x, y: x + y, lambda x, y: y + x, name="swap")

    def fn(a, b):
        return F.relu(a) + torch.relu(b)

    result = rewrite(fn, [rule, swap])
    assert result.report.applied == {"spelling": 2, "swap": 1}
    result.module.graph.lint()
    a, b = torch.randn(3), torch.randn(3)
    torch.testing.assert_close(result.module(a, b), fn(a, b))


def test_rules_that_undo_each_other_still_do_not_converge():
    double = Rule.from_functions(lambda x: x * 2, lambda x: x + x, name="double")
    halve = Rule.from_functions(lambda x: x + x, lambda x: x * 2, name="halve")
    with pytest.raises(fxrewrite.DidNotConverge, match=r"double|halve"):
        rewrite(lambda t: t * 2, [double, halve])


# ---- 11. a replacement's refusal is not the user's error -------------------------------------------------------------

def test_a_replacement_that_refuses_a_match_leaves_it_and_the_rewrite_goes_on():
    def replacement(x):
        if x.shape[-1] % 8:
            raise fxrewrite.Refuse("needs a multiple of 8 channels")
        return torch.relu(x) * 2

    rule = Rule.from_functions(lambda x: torch.relu(x) + torch.relu(x), replacement, name="fused")

    def fn(a, b):
        return (torch.relu(a) + torch.relu(a)).sum() + (torch.relu(b) + torch.relu(b)).sum()

    inputs = (torch.randn(2, 5), torch.randn(2, 16))
    result = rewrite(fn, rule, example_inputs=inputs)
    assert result.report.applied["fused"] == 1 and result.report.rejected["fused"] == 1
    assert "the replacement refused: needs a multiple of 8 channels" in result.report.reasons["fused"][0]
    result.module.graph.lint()
    torch.testing.assert_close(result.module(*inputs), fn(*inputs))


def test_folding_a_weight_normalised_convolution_is_skipped_and_the_rest_is_folded():
    class Two(nn.Module):
        def __init__(self):
            super().__init__()
            self.plain = ConvBn()
            self.normed = ConvBn()
            torch.nn.utils.parametrizations.weight_norm(self.normed.conv)

        def forward(self, x):
            return self.plain(x) + self.normed(x)

    model = Two().eval()
    result = rewrite(model, fold_conv_bn())
    assert result.report.applied["conv_bn_fold"] == 1
    assert_equivalent(result, model, X)


# ---- graphs with in-place ops and side effects ----------------------------------------------------------------
#
# Patterns are pure (refused otherwise, see tests/test_pattern.py), so an in-place op is never *inside* a match:
# it can only sit next to one. Each test checks outputs and the inputs' state: a rewrite must never
# move a read of a tensor across a write to it, nor make two values alias.

def assert_sound(fn: Callable[..., Any], rules: Any, *shapes: tuple[int, ...]) -> fxrewrite.RewriteResult:
    """Rewrite ``fn`` and check that the result computes the same outputs *and* leaves its inputs
    in the same state (in-place ops mutate them)."""
    result = rewrite(fn, rules)
    result.module.graph.lint()
    generator = torch.Generator().manual_seed(0)
    inputs = [torch.randn(*s, generator=generator) for s in shapes]
    before_inputs, after_inputs = [t.clone() for t in inputs], [t.clone() for t in inputs]
    expected = fn(*before_inputs)
    actual = result.module(*after_inputs)
    try:
        assert_same_outputs(actual, expected)
    except AssertionError as error:
        raise AssertionError(f"outputs differ:\n{result.code}\n{error}") from None
    for b, a in zip(before_inputs, after_inputs):
        torch.testing.assert_close(a, b, msg=lambda m: f"inputs mutated differently:\n{result.code}\n{m}")
    return result


def _functional_relu_inplace_inside(x):
    return torch.relu(torch.nn.functional.relu(x, inplace=True))


def _method_relu_inplace_inside(x):
    return torch.relu(x.relu_())


def _torch_relu_inplace_inside(x):
    return torch.relu(torch.relu_(x))


def _add_inplace_inside(x):
    return torch.neg(torch.neg(x).add_(1))


@pytest.mark.parametrize("fn", [_functional_relu_inplace_inside, _method_relu_inplace_inside,
                                _torch_relu_inplace_inside, _add_inplace_inside], ids=lambda f: f.__name__[1:])
def test_in_place_op_inside_a_would_be_match_is_not_matched(fn):
    result = assert_sound(fn, standard_rules(), (5,))
    assert result.report.rewrites == 0


def test_matched_inner_value_mutated_outside_the_match_blocks_the_rewrite():
    def fn(x):
        y = torch.relu(x)
        y.add_(1)
        return torch.relu(y)

    result = assert_sound(fn, standard_rules(), (5,))
    assert result.report.rewrites == 0


def test_input_mutated_before_the_match_is_read_once_after_the_mutation():
    def fn(x):
        x = x * 1.0
        x.mul_(-2)
        return torch.neg(torch.neg(x)) + x

    # the write happens before the match reads x: the replacement reads x after it too
    assert assert_sound(fn, standard_rules(), (5,)).report.applied["double_neg"] == 1


def test_input_mutated_inside_the_match_is_refused_and_the_report_says_why():
    def fn(x):
        x = x * 3.0
        y = torch.neg(x)
        x.mul_(-2)  # between the two negations: neg(neg(x)) would read the written x
        return torch.neg(y) + x

    result = assert_sound(fn, standard_rules(), (5,))
    assert result.report.applied["double_neg"] == 0
    assert result.report.rejected["double_neg"] == 1
    (reason,) = result.report.reasons["double_neg"]
    assert "is written in place by 'mul_'" in reason, reason


def test_single_op_rewrite_followed_by_a_mutation_of_its_input_is_sound():
    def fn(x):
        y = torch.clamp(x, min=0)  # relu_from_clamp: the replacement reads x where the pattern did
        x.add_(-5)
        return y + x

    # sound, but fxrewrite does not rewrite values that are written in place anywhere (conservative)
    assert assert_sound(fn, standard_rules(), (5,)).report.applied["relu_from_clamp"] == 0


def test_side_effect_nodes_next_to_a_match_are_kept():
    def fn(x):
        y = torch.neg(torch.neg(x))
        torch._assert(x.sum() > -1e9, "never fires")
        return y

    result = assert_sound(fn, standard_rules(), (5,))
    assert result.report.applied["double_neg"] == 1
    assert any(n.target is torch._assert for n in result.module.graph.nodes)


def _mutated_between_the_matched_reads(x):
    t = torch.relu(x)
    x.add_(-5)  # relu_relu's replacement relu(x) is inserted after this write
    return torch.relu(t)


def _mutated_between_neg_and_neg(x):
    t = torch.neg(x)
    x.mul_(2)
    return torch.neg(t)


def _input_mutated_after_a_rewrite_to_the_input_itself(x):
    y = torch.neg(torch.neg(x))  # double_neg makes y the same tensor as x
    x.add_(1)
    return y + x


def _output_mutated_after_a_rewrite_to_the_input_itself(x):
    x = x * 1.5
    y = torch.neg(torch.neg(x))  # y becomes x ...
    y.add_(1)  # ... so this now writes into x
    return x


def _mutated_through_a_view_after_the_match(x):
    y = torch.neg(torch.neg(x))
    x.t().add_(1)
    return y


@pytest.mark.parametrize("fn", [_mutated_between_the_matched_reads, _mutated_between_neg_and_neg,
                                _input_mutated_after_a_rewrite_to_the_input_itself,
                                _output_mutated_after_a_rewrite_to_the_input_itself,
                                _mutated_through_a_view_after_the_match], ids=lambda f: f.__name__[1:])
def test_rewrite_next_to_an_in_place_write_is_sound(fn):
    assert_sound(fn, standard_rules(), (3, 3))


def test_replacement_that_mutates_a_bound_input_is_refused():
    r = Rule.from_functions(lambda x: torch.clamp(x, min=0), lambda x: x.relu_(), name="clamp_to_relu_")
    with pytest.raises(RewriteError, match=r"writes in place into its input 'a'.*use the out-of-place op"):
        rewrite(lambda a: torch.clamp(a, min=0) + a, r)


def _writes_into_a_view_of_its_input(x):
    x.view(-1).add_(1.0)
    return torch.sin(x)


def _writes_into_a_constant(x):
    return torch.zeros(3).add_(x)  # the zeros are a tensor the module would hold, written at every run


@pytest.mark.parametrize(("replacement", "message"), [
    (_writes_into_a_view_of_its_input, r"writes in place into 'view'.*may share storage with 'a', a value the "
                                       r"replacement did not make.*write only into tensors the replacement made"),
    (_writes_into_a_constant, r"writes in place into 'writes_elsewhere_const_0'.*, which is a tensor the module "
                              r"holds \(written at every run\)"),
], ids=["a view of its input", "a constant"])
def test_replacement_that_writes_into_what_it_did_not_make_is_refused_and_nothing_changes(replacement, message):
    """A write into a view of an input reaches the input (which the program reads again, and which
    is the caller's tensor); a write into a constant changes the module at every run."""
    rule = Rule.from_functions(lambda x: torch.tanh(torch.cos(x)), replacement, name="writes_elsewhere")
    traced = torch.fx.symbolic_trace(lambda a: torch.tanh(torch.cos(a)) + a)
    before = traced.code
    with pytest.raises(RewriteError, match=message):
        rewrite(traced, rule, inplace=True)
    assert traced.code == before and len(traced.graph.nodes) == 5
    traced.graph.lint()


def test_replacement_that_writes_into_a_tensor_it_made_is_spliced():
    def replacement(x):
        y = torch.clone(x)
        y.mul_(2.0)
        return y + torch.neg(torch.neg(x))

    rule = Rule.from_functions(lambda x: x * 3.0, replacement, name="times_three_in_place")
    result = assert_sound(lambda a: torch.relu(a * 3.0), rule, (3, 3))
    assert result.report.applied["times_three_in_place"] == 1


def _one_through_a_write(x):
    y = torch.clone(x)
    z = torch.neg(y)  # read before the write
    y.add_(1.0)
    return z + y  # -x + (x + 1)


def test_a_write_a_replacement_adds_keeps_later_matches_from_moving_across_it():
    """A replacement may write into a tensor it made. Once it did, a later match that reads that
    tensor before and after the write (``neg(y) + y``) cannot be computed at one place: it is
    refused, as it would be had the program written there from the start."""
    adds_a_write = Rule.from_functions(lambda x: torch.neg(x) + (x + 1.0), _one_through_a_write,
                                       name="one_through_a_write")
    cancels = Rule.from_functions(lambda t: torch.neg(t) + t, lambda t: torch.zeros_like(t), name="neg_plus_self")
    result = assert_sound(lambda a: torch.neg(a) + (a + 1.0), RuleSet([adds_a_write, cancels]), (4,))
    assert result.report.applied == {"one_through_a_write": 1, "neg_plus_self": 0}
    assert "written in place" in " ".join(result.report.stats["neg_plus_self"].reasons)
