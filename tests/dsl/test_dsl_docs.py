"""docs/dsl.md is true: every ```fxr block is a complete rule file that loads, every
```fxr-error block fails with exactly the message in the ```text block after it, and every
```python block runs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from torch.nn.utils.fusion import fuse_conv_bn_eval

from fxrewrite import FxRewriteError, RuleSet
from fxrewrite.dsl import parse_rules

PAGE = Path(__file__).resolve().parents[2] / "docs" / "dsl.md"
TEXT = PAGE.read_text(encoding="utf-8")

#: The names the page says its blocks are loaded with.
DOC_NAMES = {"fold": fuse_conv_bn_eval}


def blocks(kind: str) -> list[str]:
    return re.findall(rf"^```{re.escape(kind)}\n(.*?)^```", TEXT, re.MULTILINE | re.DOTALL)


ERROR_BLOCKS = re.findall(r"^```fxr-error\n(.*?)^```\s*^```text\n(.*?)^```", TEXT, re.MULTILINE | re.DOTALL)


def test_the_page_has_examples_of_every_kind():
    assert len(blocks("fxr")) >= 8 and len(ERROR_BLOCKS) >= 3 and len(blocks("python")) >= 2
    assert len(ERROR_BLOCKS) == len(blocks("fxr-error")), "every fxr-error block needs a text block after it"


@pytest.mark.parametrize("block", blocks("fxr"), ids=lambda b: b.split("\n")[0][:40])
def test_fxr_blocks_load(block):
    rules = parse_rules(block, source="docs.fxr", names=DOC_NAMES)
    assert isinstance(rules, RuleSet) and len(rules) >= 1


@pytest.mark.parametrize("block, message", ERROR_BLOCKS, ids=lambda b: b.split("\n")[0][:40])
def test_fxr_error_blocks_fail_with_the_message_shown(block, message):
    with pytest.raises(FxRewriteError) as info:
        parse_rules(block, source="rules.fxr", names=DOC_NAMES)
    error = info.value
    shown = error.msg if isinstance(error, SyntaxError) else str(error)
    assert shown == message.rstrip("\n")


@pytest.mark.parametrize("index", range(len(blocks("python"))))
def test_python_blocks_run(index):
    code = compile(blocks("python")[index], f"dsl.md[python {index}]", "exec", dont_inherit=True)
    exec(code, {"__name__": "docs_dsl"})
