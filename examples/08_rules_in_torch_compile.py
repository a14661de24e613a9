"""A rules directory inside ``torch.compile``: as a backend, and as an Inductor graph pass.

``examples/08_rules/`` holds a user's rules: ``activations.fxr`` (``silu``, and ``gelu_tanh``
for GPT-2's gelu written out) and ``attention.py`` (``masked_attention``: softmax attention
with an additive mask, as one ``F.scaled_dot_product_attention`` call; its guard reads dtypes
and ranks). The model is a small GPT-style decoder written the way such models are written by
hand: attention spelled out with a causal mask buffer, and GPT-2's gelu spelled out.

1. ``fxrewrite.backend(rules, then=...)`` rewrites the graph Dynamo captures and hands it to
   the next backend (here a function that keeps the graph's code, then runs it eagerly).
2. ``fxrewrite.inductor_pass(rules, stage="pre_grad")`` runs the same rules inside Inductor,
   on Dynamo's torch-level graph, before autograd. Its ``uuid()`` hashes the rules' content, so
   Inductor's FX graph cache stays on: compiling again with the same rules is a cache hit.

Both print which rules fired (``.report``), and the compiled model is compared with eager.
Rules that turn written-out math into fused torch ops belong at ``pre_grad`` (or in a
backend): after autograd, Inductor has decomposed ``softmax``, ``gelu`` and ``silu`` into
the primitive ops these patterns are written over (docs/torch-compile.md, "Which stage").

Run:  python examples/08_rules_in_torch_compile.py
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from torch import nn

import fxrewrite

RULES_DIR = Path(__file__).resolve().parent / "08_rules"


# ---- the model ---------------------------------------------------------------------------------


class Block(nn.Module):
    """Pre-norm causal self-attention and an MLP with GPT-2's gelu, both written out."""

    def __init__(self, d_model: int, heads: int, seq: int) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, d_model // heads
        self.scale = 1.0 / math.sqrt(self.head_dim)
        self.ln1, self.ln2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.fc, self.out = nn.Linear(d_model, 4 * d_model), nn.Linear(4 * d_model, d_model)
        self.register_buffer("mask", torch.full((seq, seq), float("-inf")).triu(1))

    def attention(self, x):
        b, t, d = x.shape
        q, k, v = (z.view(b, t, self.heads, self.head_dim).transpose(1, 2) for z in self.qkv(x).split(d, dim=-1))
        weights = torch.softmax(q @ k.transpose(-2, -1) * self.scale + self.mask, dim=-1)
        return self.proj((weights @ v).transpose(1, 2).reshape(b, t, d))

    def mlp(self, x):
        h = self.fc(x)
        h = 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * torch.pow(h, 3.0))))
        return self.out(h)

    def forward(self, x):
        x = x + self.attention(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self, vocab: int = 128, d_model: int = 32, heads: int = 4, layers: int = 2, seq: int = 16) -> None:
        super().__init__()
        self.vocab, self.seq = vocab, seq
        self.tok, self.pos = nn.Embedding(vocab, d_model), nn.Embedding(seq, d_model)
        self.blocks = nn.Sequential(*(Block(d_model, heads, seq) for _ in range(layers)))
        self.head = nn.Linear(d_model, vocab, bias=False)

    def forward(self, tokens):
        x = self.tok(tokens) + self.pos(torch.arange(tokens.shape[1], device=tokens.device))
        return self.head(self.blocks(x))


def model(seed: int = 0) -> TinyGPT:
    torch.manual_seed(seed)
    return TinyGPT().eval()


def tokens_for(net: TinyGPT, batch: int = 2) -> torch.Tensor:
    return torch.randint(0, net.vocab, (batch, net.seq), generator=torch.Generator().manual_seed(1))


# ---- compiling with the rules ------------------------------------------------------------------


def keep_code(codes: list[str]):
    """A backend that keeps the code of each graph it is handed, then runs it eagerly."""

    def backend(gm: torch.fx.GraphModule, example_inputs):
        codes.append(gm.code)
        return gm.forward

    return backend


def interesting(code: str) -> str:
    """The lines of a graph's code that the rules are about."""
    words = ("softmax", "scaled_dot_product", "tanh", "gelu", "sigmoid", "silu")
    return "\n".join(line for line in code.splitlines() if any(w in line for w in words))


def with_backend(rules: fxrewrite.RuleSet, net: TinyGPT, tokens: torch.Tensor) -> dict[str, object]:
    torch._dynamo.reset()
    before: list[str] = []
    with torch.no_grad():
        torch.compile(net, backend=keep_code(before))(tokens)
    torch._dynamo.reset()
    after: list[str] = []
    rules_backend = fxrewrite.backend(rules, then=keep_code(after))
    with torch.no_grad():
        out = torch.compile(net, backend=rules_backend)(tokens)
    return {"out": out, "before": before[0], "after": after[0], "report": rules_backend.report}


def with_inductor_pass(rules: fxrewrite.RuleSet, net: TinyGPT, tokens: torch.Tensor) -> dict[str, object]:
    torch._dynamo.reset()
    rules_pass = fxrewrite.inductor_pass(rules, stage="pre_grad")
    with torch.no_grad():
        out = torch.compile(net, options=rules_pass.options)(tokens)
    return {"out": out, "report": rules_pass.report, "uuid": rules_pass.uuid()}


def main() -> dict[str, object]:
    rules = fxrewrite.load_rules(RULES_DIR)
    print(f"loaded {len(rules)} rules from {RULES_DIR.name}/: {', '.join(rules.names)}")
    net = model()
    tokens = tokens_for(net)
    with torch.no_grad():
        expected = net(tokens)

    by_backend = with_backend(rules, net, tokens)
    print("\nbefore: (the graph Dynamo captures; lines the rules are about)")
    print(interesting(by_backend["before"]))
    print("\nafter: (the same graph, rewritten by fxrewrite.backend)")
    print(interesting(by_backend["after"]))
    print("\nfxrewrite.backend:")
    print(by_backend["report"])
    torch.testing.assert_close(by_backend["out"], expected, rtol=1e-4, atol=1e-5)
    print("outputs match eager")

    by_pass = with_inductor_pass(rules, net, tokens)
    print(f"\nfxrewrite.inductor_pass(stage='pre_grad'), uuid {by_pass['uuid'][:16]}...:")
    print(by_pass["report"])
    torch.testing.assert_close(by_pass["out"], expected, rtol=1e-4, atol=1e-5)
    print("Inductor's outputs match eager")
    return {"rules": rules, "backend": by_backend, "inductor_pass": by_pass}


if __name__ == "__main__":
    main()
