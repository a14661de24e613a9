"""Hugging Face GPT-2's eager attention rewritten to ``scaled_dot_product_attention`` through
``torch.export``: an ExportedProgram goes in, an ExportedProgram comes out.

A small GPT-2 (random weights, ``attn_implementation="eager"``) is exported; one rule from
``examples/07_rules`` (written at the torch level, the way the eager code reads) matches every
layer of the exported ATen graph, although export folded the scale to a constant, turned
``.type(value.dtype)`` into ``aten.to.dtype`` behind a check node and eval dropout into
``aten.dropout(x, 0.0, False)``. The result's ``exported_program`` runs, re-exports, saves and
loads like any program.

Needs ``transformers`` (``pip install transformers``; it is a test extra of fxrewrite).

Run:  python examples/07_gpt2_attention_export.py
CLI:  fxrewrite apply examples/07_gpt2_attention_export.py:model --export --rules examples/07_rules --check
"""

from __future__ import annotations

import io
import logging
from pathlib import Path

import torch

import fxrewrite

RULES = Path(__file__).resolve().parent / "07_rules"


class GPT2Hidden(torch.nn.Module):
    """GPT-2's last hidden state (the model returns a dataclass; torch.export wants tensors)."""

    def __init__(self) -> None:
        super().__init__()
        from transformers import GPT2Config, GPT2Model

        logging.getLogger("transformers").setLevel(logging.ERROR)
        config = GPT2Config(n_layer=2, n_head=4, n_embd=64, vocab_size=128, n_positions=64, use_cache=False,
                            bos_token_id=0, eos_token_id=0, attn_implementation="eager")
        torch.manual_seed(0)
        self.gpt = GPT2Model(config).eval()

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.gpt(input_ids).last_hidden_state


def model() -> torch.nn.Module:
    return GPT2Hidden().eval()


def example_inputs() -> tuple[torch.Tensor]:
    return (torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(0)),)


def attention_lines(code: str) -> str:
    """The lines of the first layer's attention in a program's code."""
    lines = code.splitlines()
    first = next(i for i, line in enumerate(lines) if "matmul" in line or "scaled_dot_product" in line)
    last = next(i for i, line in enumerate(lines) if i > first and "transpose" in line)
    return "\n".join(line.split(";")[0] for line in lines[first - 1:last + 1])


def main() -> fxrewrite.RewriteResult:
    gpt2, inputs = model(), example_inputs()
    program = torch.export.export(gpt2, inputs)
    rules = fxrewrite.load_rules(RULES)
    result = fxrewrite.rewrite(program, rules)
    print("before:\n" + attention_lines(program.graph_module.code))
    print("after:\n" + attention_lines(result.exported_program.graph_module.code))
    print(result.report)

    rewritten = result.exported_program
    calls = [n.target for n in rewritten.graph.nodes if n.op == "call_function"]
    print("scaled_dot_product_attention calls:",
          sum("scaled_dot_product_attention" in str(t) for t in calls), "of", gpt2.gpt.config.n_layer, "layers")
    with torch.no_grad():
        torch.testing.assert_close(rewritten.module()(*inputs), gpt2(*inputs), rtol=1e-4, atol=1e-5)

    buffer = io.BytesIO()  # the program saves and loads like any other
    torch.export.save(rewritten, buffer)
    buffer.seek(0)
    loaded = torch.export.load(buffer)
    with torch.no_grad():
        torch.testing.assert_close(loaded.module()(*inputs), gpt2(*inputs), rtol=1e-4, atol=1e-5)
    print("the rewritten ExportedProgram matches the original, and survives save/load")
    return result


if __name__ == "__main__":
    main()
