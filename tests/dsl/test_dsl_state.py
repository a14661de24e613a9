"""Loading a rule file changes no global state: functions that change torch's global state are
refused at load time, with an error naming the function and why, wherever they are written
(pattern, replacement, where condition, use line, under another name), and the process is left
exactly as it was."""

from __future__ import annotations

import re

import pytest
import torch

from fxrewrite import RuleDefinitionError
from fxrewrite.dsl import parse_rules
from fxrewrite.dsl.scope import state_change
from fxrewrite.isolation import _items


def global_state() -> list:
    """Everything torch_state_preserved knows how to read."""
    return [(item, item.get()) for item in _items()]


def assert_unchanged(before: list) -> None:
    changed = [item.name for item, value in before if not item.same(item.get(), value)]
    assert not changed, f"loading changed global torch state: {changed}"


#: (path, arguments): calls that change global state, as a hostile rule file would write them.
STATE_CHANGING_CALLS = [
    ("torch.set_default_device", "'meta'"),
    ("torch.set_default_dtype", "torch.float64"),
    ("torch.set_default_tensor_type", "torch.float64"),
    ("torch.set_grad_enabled", "False"),
    ("torch.autograd.set_grad_enabled", "False"),
    ("torch.autograd.grad_mode.set_grad_enabled", "False"),
    ("torch.set_printoptions", "precision=12"),
    ("torch.set_num_threads", "1"),
    ("torch.set_num_interop_threads", "1"),
    ("torch.set_flush_denormal", "True"),
    ("torch.set_anomaly_enabled", "True"),
    ("torch.autograd.set_detect_anomaly", "True"),
    ("torch.use_deterministic_algorithms", "True"),
    ("torch.set_deterministic_debug_mode", "2"),
    ("torch.set_float32_matmul_precision", "'medium'"),
    ("torch.set_warn_always", "True"),
    ("torch.set_autocast_enabled", "'cpu', True"),
    ("torch.manual_seed", "0"),
    ("torch.seed", ""),
    ("torch.random.manual_seed", "0"),
    ("torch.random.fork_rng", ""),
    ("torch.set_rng_state", "torch.ones(2)"),
    ("torch.default_generator.manual_seed", "0"),
    ("torch.default_generator.graphsafe_set_state", "torch.default_generator"),
    ("torch.Generator.set_state", "torch.default_generator, torch.ones(2)"),
    ("nn.modules.module.register_module_forward_hook", "torch.neg"),
    ("nn.modules.module.register_module_forward_pre_hook", "torch.neg"),
    ("nn.modules.module.register_module_full_backward_hook", "torch.neg"),
    ("torch.nn.modules.module.register_module_buffer_registration_hook", "torch.neg"),
    ("nn.Module.register_forward_hook", "x, torch.neg"),
    ("torch.Tensor.register_hook", "x, torch.neg"),
    ("torch.autograd.forward_ad.enter_dual_level", ""),
    ("torch.sparse.check_sparse_tensor_invariants.enable", ""),
    ("torch.return_types.pytree_register_structseq", "x"),
    ("torch.cuda.set_device", "0"),
    ("torch.cpu.set_device", "'cpu'"),
    ("torch.overrides.TorchFunctionMode", ""),
    ("torch.init_num_threads", ""),
    ("torch.clear_autocast_cache", ""),
]


def in_every_position(call: str) -> list[str]:
    return [
        f"rule r:\n    torch.neg({call}) + x => x\n",
        f"rule r:\n    torch.neg(x) => torch.neg(x) + {call}\n",
        f"rule r:\n    torch.neg(x) => x\n    where {call}\n",
    ]


def exists(path: str) -> bool:
    value = torch if path.startswith("torch.") else torch.nn
    for attr in path.split(".")[1:]:
        if not hasattr(value, attr):
            return False
        value = getattr(value, attr)
    return True


@pytest.mark.parametrize("path, arguments", [c for c in STATE_CHANGING_CALLS if exists(c[0])],
                         ids=[c[0] for c in STATE_CHANGING_CALLS if exists(c[0])])
def test_state_changing_functions_are_refused_at_load_naming_the_function_and_why(path, arguments):
    before = global_state()
    for text in in_every_position(f"{path}({arguments})"):
        with pytest.raises(RuleDefinitionError) as info:
            parse_rules(text, source="hostile.fxr")
        message = str(info.value)
        assert message.startswith("hostile.fxr:2:") or message.startswith("hostile.fxr:3:")
        refused = re.search(r"'([\w.]+)'( \(that is '\w+'\))? is out of bounds for rule files", message).group(1)
        assert path.startswith(refused), message
        assert "changes torch's global state" in message
        assert "Remove the call" in message
    assert_unchanged(before)


@pytest.mark.parametrize("text", [
    "use torch.set_default_device as device\n",
    "use torch.autograd as ag\n\nrule r:\n    torch.neg(x) => ag.set_grad_enabled(False)\n",
    "use nn.modules.module as m\n\nrule r:\n    torch.neg(x) => m.register_module_forward_hook(torch.neg)\n",
    "use torch.random as rnd\n\nrule r:\n    torch.neg(x) => x + rnd.manual_seed(3)\n",
])
def test_state_changing_functions_cannot_be_reached_through_use_lines(text):
    before = global_state()
    with pytest.raises(RuleDefinitionError, match="changes torch's global state"):
        parse_rules(text, source="hostile.fxr")
    assert_unchanged(before)


def test_a_function_is_refused_by_what_it_is_not_only_by_the_name_it_was_reached_under(monkeypatch):
    monkeypatch.setattr(torch.nn.functional, "innocent_name", torch.set_grad_enabled, raising=False)
    with pytest.raises(RuleDefinitionError) as info:
        parse_rules("rule r:\n    torch.neg(x) => F.innocent_name(False)\n")
    assert "'F.innocent_name' (that is 'set_grad_enabled') is out of bounds" in str(info.value)


def test_the_error_says_why_for_each_kind_of_state():
    assert "default device" in state_change("set_default_device")
    assert "hooks" in state_change("register_module_forward_hook")
    assert "random number generator" in state_change("manual_seed")
    assert "CUDA" in state_change("cuda")
    assert state_change("neg") is None and state_change("get_default_dtype") is None


def test_functions_a_rule_needs_stay_reachable():
    (rule,) = parse_rules("rule r:\n    torch.neg(x) => torch.zeros_like(x) - x\n"
                          "    where x.dtype == torch.get_default_dtype()\n"
                          "    where torch.is_grad_enabled() in (True, False)\n")
    assert rule.name == "r"


def test_state_changing_functions_given_with_names_are_trusted():
    calls = []
    (rule,) = parse_rules("rule r:\n    torch.neg(x) => hook(x)\n", names={"hook": lambda t: calls.append(t) or t})
    assert rule.name == "r" and calls == []


def test_tracing_a_dsl_pattern_is_guarded_too(monkeypatch):
    """Even a function the allow-list misses cannot leak: tracing runs under torch_state_preserved."""
    before = global_state()

    def leaky(t):
        torch.set_default_device("meta")
        torch.nn.modules.module.register_module_forward_hook(lambda m, i, o: None)
        return torch.neg(t)

    (rule,) = parse_rules("rule r:\n    leaky(x) + 1 => x\n", names={"leaky": leaky})
    assert rule.name == "r"
    assert_unchanged(before)
    assert torch.ones(2).device.type == "cpu"
