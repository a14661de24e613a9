"""Invalid rules fail when they are loaded, with a RuleDefinitionError that names the file, line
and column, shows the line with a caret and says what to do."""

from __future__ import annotations

import pytest
import torch
from _helpers import assert_same_state, graph_state, traced_net, write_source

import fxrewrite
from fxrewrite import RewriteError, RuleDefinitionError, rewrite
from fxrewrite.dsl import parse_rules


def definition_error(text: str, **kwargs) -> str:
    with pytest.raises(RuleDefinitionError) as info:
        parse_rules(text, source="rules.fxr", **kwargs)
    return str(info.value)


@pytest.mark.parametrize("text, where, fragments", [
    # names
    ("rule a:\n    eval(x) => x\n", "2:5", ["unknown function 'eval'", "names="]),
    ("rule a:\n    torch.relu(x) => Relu(x)\n", "2:22", ["unknown function 'Relu'"]),
    ("rule a:\n    x @ W => x\n", "2:9", ["unknown name 'W'", "lower-case letter are variables"]),
    ("rule a:\n    torch.relu(x) => Torch.relu(x)\n", "2:22", ["unknown name 'Torch'", "Did you mean 'torch'?"]),
    ("rule a:\n    torch.rleu(x) => x\n", "2:11", ["'torch.rleu' does not exist", "did you mean 'relu'"]),
    ("rule a:\n    nn.Conv3x3(x) => x\n", "2:8", ["'nn.Conv3x3' does not exist"]),
    ("rule a:\n    torch.relu(x) => lambda\n", "2:22", ["'lambda' is a Python keyword"]),
    ("rule a:\n    torch.relu(x) => (where)\n", "2:23", ["'where' is a word of the language"]),
    ("rule a:\n    torch.relu(_x) => _x\n", "2:16", ["'_x' starts with '_'", "reserved"]),
    ("rule a:\n    os.system(x) => x\n", "2:8", ["'os' is a tensor variable", "no attribute 'system'"]),
    # variables and the replacement
    ("rule a:\n    torch.relu(x) => y\n", "2:22", ["the replacement uses 'y', which the pattern does not bind",
                                                "the pattern's variables: x"]),
    ("rule a:\n    torch.relu(x) => _\n", "2:22", ["'_' matches anything, so it can only be used in the pattern"]),
    ("rule a:\n    torch.relu(x) => x\n    where z.dim() == 1\n", "3:11",
     ["the where condition uses 'z', which the pattern does not bind"]),
    ("rule a:\n    torch.relu(x) => x\n    where x.stride() == 1\n", "3:13",
     ["where condition sees tensor 'x' through its shape, dtype and device"]),
    ("rule a:\n    torch.relu(x) => x.vanish()\n", "2:24", ["torch.Tensor has no attribute 'vanish'"]),
    ("rule a:\n    (torch.relu(x), x * 2) => (x, x, x)\n", "2:31",
     ["the pattern has 2 result(s) but the replacement has 3"]),
    ("rule a:\n    torch.relu(x) => (x, x)\n", "2:22", ["the pattern has 1 result(s) but the replacement has 2"]),
    ("rule a:\n    () => ()\n", "2:5", ["the pattern is an empty tuple"]),
    # let
    ("rule a:\n    let t = x\n    let t = x\n    torch.relu(t) => x\n", "3:9",
     ["'t' is defined by let twice (lines 2 and 3)"]),
    ("rule a:\n    let t = u * 2\n    let u = x\n    torch.relu(t) => x\n", "2:13",
     ["let 't' (line 2) uses 'u', which is defined by a later let (line 3)", "move 'let u' above"]),
    ("rule a:\n    let t = x * 2\n    torch.relu(x) => x\n", "2:9", ["let 't' is never used"]),
    ("rule a:\n    let torch = x\n    torch.relu(x) => x\n", "2:9", ["'torch' is already a name in scope"]),
    ("rule a:\n    let t = x * 2\n    torch.relu(t) => x\n    where t.dim() == 2\n", "4:11",
     ["'t' is a let name; a where condition can read only the pattern's variables"]),
    # captures
    ("rule a:\n    torch.relu(x) => x\n    where s: float\n", "3:11",
     ["'s' is declared as a capture, but the pattern has no variable 's'"]),
    ("rule a:\n    torch.relu(x) * s => x\n    where s: list\n", "3:14", ["unknown type 'list' for 's'"]),
    ("rule a:\n    torch.relu(x) * s => x\n    where s: torch.relu\n", "3:14", ["'torch.relu' is not a capture type"]),
    ("rule a:\n    torch.relu(x) * s => x\n    where s: float, s: int\n", "3:21",
     ["the type of 's' is declared twice"]),
    ("rule a:\n    conv.weight + x => x\n    where conv: nn.Conv2d\n", "2:10",
     ["a module capture cannot be inspected in the pattern"]),
    ("rule a:\n    s(x) * 2 => x\n    where s: float\n", "2:5", ["'s' is a literal capture and cannot be called"]),
    # expressions that only make sense elsewhere
    ("rule a:\n    (x and y) + 1 => x\n", "2:6", ["'and' can only be used in where conditions",
                                                "torch.logical_and"]),
    ("rule a:\n    torch.relu(x) => not x\n", "2:22", ["'not' can only be used in where conditions"]),
    ("rule a:\n    torch.relu(x in y) => x\n", "2:16", ["'in' can only be used in where conditions"]),
    ("rule a:\n    torch.relu(0 < x < 1) => x\n", "2:16", ["chained comparisons can only be used in where"]),
    ("rule a:\n    x + torch.tensor(1.0) => x\n", "2:9", ["a pattern can only call functions on its variables"]),
    ("rule a:\n    torch.relu(x) => x * 'a'.upper()\n", "2:30", ["attributes of a literal"]),
    ("rule a:\n    torch.relu(x) * 1(x) => x\n", "2:21", ["1 is not a function"]),
    # rules and use lines
    ("rule a:\n    torch.relu(x) => x\nrule a:\n    torch.neg(x) => x\n", "3:6",
     ["rule 'a' is defined twice: at rules.fxr:1 and at rules.fxr:3"]),
    ("use foo.bar as baz\n", "1:5", ["'foo' is not a name in scope"]),
    ("use F as torch\n", "1:1", ["'torch' is already a name in scope"]),
    ("use torch.nn as F\n", "1:1", ["'F' is already a name in scope (torch.nn.functional)"]),
    ("use torch.nope as nope\n", "1:5", ["'torch.nope' does not exist"]),
    ("use torch.ops.mylib as m\nuse torch.ops.mylib as m\n", "2:1", ["'m' is already a name in scope"]),
])
def test_invalid_rules_are_refused_at_load_time(text, where, fragments):
    message = definition_error(text)
    assert message.startswith(f"rules.fxr:{where}: ")
    for fragment in fragments:
        assert fragment in message
    line, column = (int(n) for n in where.split(":"))
    excerpt_line, caret_line = message.splitlines()[-2:]
    assert caret_line.strip() == "^"
    source_line = text.splitlines()[line - 1]
    assert excerpt_line.strip() == source_line.strip()
    # the caret stands under the character the position names
    assert excerpt_line[caret_line.index("^")] == source_line[column - 1]


def test_message_names_the_rule():
    assert "rule 'my_rule':" in definition_error("rule my_rule:\n    torch.relu(x) => y\n")


def test_errors_found_while_tracing_name_the_rule_and_its_origin():
    message = definition_error("\nrule same:\n    x * 1 => torch.neg(x)\nrule ident:\n    x => x\n")
    assert message.startswith("rule 'ident' (rules.fxr:4): the pattern returns its parameter 'x' unchanged")


def test_unused_module_capture_is_reported_by_the_engine():
    message = definition_error("rule a:\n    conv(x) * 2 => x\n    where conv: nn.Conv2d, bn: nn.BatchNorm2d\n")
    assert "'bn' is declared as a capture, but the pattern has no variable 'bn'" in message


def test_runtime_path_errors_point_at_the_rule_file():
    from fxrewrite import RewriteError, rewrite

    (rule,) = parse_rules("rule a:\n    torch.neg(torch.neg(x)) => torch.ops.nowhere_lib.f(x)\n", source="rules.fxr")
    with pytest.raises(RewriteError) as info:
        rewrite(lambda t: torch.neg(torch.neg(t)), rule)
    assert "rules.fxr:2:54: 'torch.ops.nowhere_lib.f' does not exist" in str(info.value)


@pytest.mark.parametrize("names", [
    {"_private": 1},
    {"where": 1},
    {"not an identifier": 1},
    {3: 1},
])
def test_names_must_be_usable_identifiers(names):
    assert "names= has the key" in definition_error("rule a:\n    torch.relu(x) => x\n", names=names)


def test_names_must_be_a_mapping():
    assert "names= must be a mapping" in definition_error("", names=["torch"])


def test_text_must_be_a_string():
    with pytest.raises(RuleDefinitionError, match="takes the text of a rule file"):
        parse_rules(b"rule a:\n")


# ---- unknown names in a rule file on disk --------------------------------------------------------------


@pytest.mark.parametrize("text, position, fragments", [
    ("rule a:\n    torch.relu(x) => F.rleu(x)\n", "2:24", ["'F.rleu' does not exist", "did you mean 'relu'"]),
    ("rule a:\n    torch.relu(x) => numpy.abs(x)\n", "2:22", ["the replacement uses 'numpy', which the pattern "
                                                             "does not bind"]),
    ("rule a:\n    Relu(x) => x\n", "2:5", ["unknown function 'Relu'", "names="]),
    ("rule a:\n    torch.relu(x) => x\n    where isfinite(x)\n", "3:11", ["unknown function 'isfinite'",
                                                                         "a called name must be in scope"]),
    ("rule a:\n    torch.relu(x) => x\n    where x.dtype == torch.float33\n", "3:28",
     ["'torch.float33' does not exist", "did you mean 'float32'"]),
    ("rule a:\n    torch.relu(x) => x\n    where x: Tensor\n", "3:14", ["unknown type 'Tensor' for 'x'"]),
])
def test_unknown_names_in_a_rule_file_are_definition_errors_at_load_time(tmp_path, text, position, fragments):
    path = write_source(tmp_path / "names.fxr", text)
    with pytest.raises(RuleDefinitionError) as info:
        fxrewrite.load_rules(path)
    message = str(info.value)
    assert message.startswith(f"{path}:{position}: ")
    for fragment in fragments:
        assert fragment in message


def test_unknown_op_reached_only_at_rewrite_time_is_a_rewrite_error_naming_the_rule_file(tmp_path):
    path = write_source(tmp_path / "late.fxr",
                        "rule late:\n    torch.neg(torch.neg(x)) => torch.ops.nowhere_lib.f(x)\n")
    rules = fxrewrite.load_rules(path)
    _, gm = traced_net()
    before = graph_state(gm)
    with pytest.raises(RewriteError) as info:
        rewrite(gm, rules)
    assert f"{path}:2:" in str(info.value) and "'torch.ops.nowhere_lib.f' does not exist" in str(info.value)
    assert_same_state(before, graph_state(gm))
