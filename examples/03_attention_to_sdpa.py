"""Hand-written causal attention in a GPT-style decoder, rewritten to
``F.scaled_dot_product_attention``.

The decoder below is written the way small GPT implementations are: token and position
embeddings, blocks of pre-norm causal self-attention (q/k/v projections, scores
``q @ k.transpose(-2, -1) * scale``, a causal mask, softmax, ``@ v``) and an MLP with GPT-2's
tanh GELU written out, and residual connections. The causal mask is a buffer spelled one of two
ways (``spelling=``):

* ``"additive"``: ``softmax(scores + mask)`` with ``mask`` 0 on and below the diagonal and
  ``-inf`` above. The shipped rule ``attention_masked`` matches it (it needs shapes: pass
  ``example_inputs=``) and passes the mask as ``attn_mask``.
* ``"masked_fill"``: ``scores.masked_fill(future, -inf).softmax(-1)`` with a bool buffer
  ``future``. The shipped rule ``attention_masked_fill_to_additive`` turns the fill into an
  additive mask (exact for ``-inf``), which ``attention_masked`` then takes (both need shapes).

The rules of this file go one step further for both spellings: when the mask is a constant
tensor of the model and it *is* the causal mask, the replacement drops the mask tensor and asks
for ``is_causal=True`` instead. Priority 11 puts them before the shipped attention rules (10).

The context length is fixed (the model always sees ``seq`` tokens, like an encoder of fixed
length): slicing the mask buffer by a traced size (``mask[:t, :t]``) cannot be symbolically
traced, because ``torch.fx`` does not turn buffers into Proxies.

The end of ``main()`` runs the shipped rules on ``nn.TransformerEncoder``: its attention runs
inside ``nn.MultiheadAttention``, which is a leaf of the symbolic trace and already calls
``scaled_dot_product_attention`` in the exported graph, so no attention rule fires there; what
the default rules do is remove the six dropouts, which are inactive in eval mode.

Run:  python examples/03_attention_to_sdpa.py
CLI:  fxrewrite apply examples/03_attention_to_sdpa.py:gpt --check
"""

from __future__ import annotations

import math
import warnings
from unittest import mock

import torch
import torch.nn.functional as F
from torch import fx, nn
from torch.nn.modules import transformer

import fxrewrite

# ---- the model ---------------------------------------------------------------------------------


def new_gelu(x: torch.Tensor) -> torch.Tensor:
    """GPT-2's GELU, written out (the shipped rule ``gelu_tanh`` turns it into one call)."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class CausalSelfAttention(nn.Module):
    def __init__(self, d_model: int, heads: int, seq: int, spelling: str = "additive") -> None:
        super().__init__()
        if spelling not in ("additive", "masked_fill"):
            raise ValueError(f"spelling must be 'additive' or 'masked_fill', not {spelling!r}")
        self.heads, self.head_dim, self.spelling = heads, d_model // heads, spelling
        self.scale = 1.0 / math.sqrt(self.head_dim)
        self.q = nn.Linear(d_model, d_model)
        self.k = nn.Linear(d_model, d_model)
        self.v = nn.Linear(d_model, d_model)
        self.proj = nn.Linear(d_model, d_model)
        if spelling == "additive":
            self.register_buffer("mask", torch.full((seq, seq), float("-inf")).triu(1))
        else:
            self.register_buffer("future", torch.ones(seq, seq, dtype=torch.bool).triu(1))

    def forward(self, x):
        b, t, d = x.shape
        q = self.q(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.k(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        v = self.v(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        scores = q @ k.transpose(-2, -1) * self.scale
        if self.spelling == "additive":
            weights = torch.softmax(scores + self.mask, dim=-1)
        else:
            weights = scores.masked_fill(self.future, float("-inf")).softmax(-1)
        y = (weights @ v).transpose(1, 2).reshape(b, t, d)
        return self.proj(y)


class Block(nn.Module):
    def __init__(self, d_model: int, heads: int, seq: int, spelling: str) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, heads, seq, spelling)
        self.ln2 = nn.LayerNorm(d_model)
        self.fc = nn.Linear(d_model, 4 * d_model)
        self.out = nn.Linear(4 * d_model, d_model)
        self.drop = nn.Dropout(0.1)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.drop(self.out(new_gelu(self.fc(self.ln2(x)))))


class GPT(nn.Module):
    """A decoder-only transformer over a fixed context of ``seq`` tokens."""

    def __init__(self, vocab: int = 256, d_model: int = 64, heads: int = 4, layers: int = 2, seq: int = 32,
                 spelling: str = "additive") -> None:
        super().__init__()
        self.seq, self.vocab = seq, vocab
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(seq, d_model)
        self.register_buffer("positions", torch.arange(seq))
        self.blocks = nn.Sequential(*(Block(d_model, heads, seq, spelling) for _ in range(layers)))
        self.ln = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)

    def forward(self, tokens):
        x = self.tok(tokens) + self.pos(self.positions)
        return self.head(self.ln(self.blocks(x)))


def gpt(spelling: str = "additive", seed: int = 0, **sizes: int) -> GPT:
    """A GPT in eval mode with reproducible weights (the ``fxrewrite apply`` target)."""
    torch.manual_seed(seed)
    return GPT(spelling=spelling, **sizes).eval()


def gpt_masked_fill() -> GPT:
    """The same decoder with the masked_fill spelling of the causal mask."""
    return gpt("masked_fill")


def tokens_for(model: GPT, batch: int = 2, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, model.vocab, (batch, model.seq), generator=torch.Generator().manual_seed(seed))


def example_inputs() -> tuple[torch.Tensor]:
    """Inputs for `fxrewrite apply examples/03_attention_to_sdpa.py:gpt --check`."""
    return (tokens_for(gpt()),)


# ---- the rules ---------------------------------------------------------------------------------


def _constant(m: fxrewrite.Match, name: str) -> torch.Tensor | None:
    """The tensor ``name`` bound when it is an attribute of the model (a ``get_attr`` node), else None."""
    node = m.node(name)
    if node.op != "get_attr":
        return None
    value = node.graph.owning_module
    for part in str(node.target).split("."):
        value = getattr(value, part, None)
    return value if isinstance(value, torch.Tensor) else None


def _causal_shapes(m: fxrewrite.Match, n: int) -> bool:
    """Strict (needs shapes): scores are (..., n, n), so an (n, n) mask neither broadcasts
    the scores to a larger shape nor is broadcast itself; q, k, v have at least 2 dimensions."""
    q, k, v = m["q"], m["k"], m["v"]
    try:
        ranks_ok = min(q.dim(), k.dim(), v.dim()) >= 2
        return ranks_ok and q.shape[-2] == n and k.shape[-2] == n and k.shape[-2] == v.shape[-2]
    except fxrewrite.MetadataError:
        return False


def additive_causal_mask(m: fxrewrite.Match) -> bool:
    """``mask`` is a square constant with 0 on and below the diagonal and -inf above, of q's dtype."""
    mask = _constant(m, "mask")
    if mask is None or mask.dim() != 2 or mask.shape[0] != mask.shape[1] or not mask.dtype.is_floating_point:
        return False
    n = mask.shape[0]
    if not _causal_shapes(m, n) or m["q"].dtype != mask.dtype:
        return False
    return torch.equal(mask, torch.full((n, n), float("-inf"), dtype=mask.dtype, device=mask.device).triu(1))


def bool_causal_mask(m: fxrewrite.Match) -> bool:
    """``mask`` is a square bool constant, True strictly above the diagonal; the fill is -inf."""
    mask = _constant(m, "mask")
    if mask is None or mask.dtype != torch.bool or mask.dim() != 2 or mask.shape[0] != mask.shape[1]:
        return False
    n = mask.shape[0]
    if m["fill"] != float("-inf") or not _causal_shapes(m, n):
        return False
    return torch.equal(mask, torch.ones(n, n, dtype=torch.bool, device=mask.device).triu(1))


_TOLERANCE = {"rtol": 1e-4, "atol": 1e-5}

# The replacements ignore the mask tensor on purpose (is_causal=True says what it said), so the
# RuleWarning "the replacement ignores 'mask'" is silenced here: the guards check that the mask
# changes neither the result's shape (broadcasting) nor its dtype (promotion).
with warnings.catch_warnings():
    warnings.simplefilter("ignore", fxrewrite.RuleWarning)

    @fxrewrite.rule(priority=11, where=additive_causal_mask, tolerance=_TOLERANCE)
    def causal_attention(q, k, v, mask, s: float):
        "Replaces softmax(q @ k^T * s + causal_mask) @ v by sdpa(q, k, v, is_causal=True, scale=s) (needs shapes)."
        return torch.softmax(q @ k.transpose(-2, -1) * s + mask, -1) @ v

    @causal_attention.replacement
    def causal_attention(q, k, v, mask, s: float):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=float(s))

    @fxrewrite.rule(priority=11, where=bool_causal_mask, tolerance=_TOLERANCE)
    def causal_attention_masked_fill(q, k, v, mask, s: float, fill: float):
        "Replaces softmax((q @ k^T * s).masked_fill(future, -inf)) @ v by sdpa(..., is_causal=True) (needs shapes)."
        return torch.softmax((q @ k.transpose(-2, -1) * s).masked_fill(mask, fill), -1) @ v

    @causal_attention_masked_fill.replacement
    def causal_attention_masked_fill(q, k, v, mask, s: float, fill: float):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=float(s))


#: The rules of this example (``fxrewrite apply ... --rules examples/03_attention_to_sdpa.py``).
CAUSAL_RULES = fxrewrite.RuleSet([causal_attention, causal_attention_masked_fill])


def all_rules() -> fxrewrite.RuleSet:
    """The shipped standard library plus this example's causal rules."""
    return fxrewrite.load_rules() + CAUSAL_RULES


# ---- nn.TransformerEncoder ------------------------------------------------------------------


class EncoderTracer(fx.Tracer):
    """Symbolically traces ``nn.TransformerEncoder`` (``torch.fx.symbolic_trace`` cannot): traces
    through the layers, keeps ``MultiheadAttention`` a leaf, disables the fast path while tracing
    and makes ``transformer._get_seq_len`` a leaf function (tests/test_export.py explains why)."""

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        if isinstance(m, (nn.TransformerEncoder, nn.TransformerEncoderLayer)):
            return False
        return super().is_leaf_module(m, module_qualified_name)

    def trace(self, root, concrete_args=None):
        seq_len = transformer._get_seq_len

        def seq_len_leaf(src, batch_first):
            if isinstance(src, fx.Proxy):
                return src.tracer.create_proxy("call_function", seq_len, (src, batch_first), {})
            return seq_len(src, batch_first)

        fastpath = torch.backends.mha.get_fastpath_enabled()
        torch.backends.mha.set_fastpath_enabled(False)
        try:
            with mock.patch.object(transformer, "_get_seq_len", seq_len_leaf):
                return super().trace(root, concrete_args)
        finally:
            torch.backends.mha.set_fastpath_enabled(fastpath)


def transformer_encoder(seed: int = 0) -> nn.TransformerEncoder:
    torch.manual_seed(seed)
    layer = nn.TransformerEncoderLayer(d_model=32, nhead=4, dim_feedforward=64, batch_first=True)
    return nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False).eval()


def trace_encoder(encoder: nn.TransformerEncoder) -> fx.GraphModule:
    graph = EncoderTracer().trace(encoder, concrete_args={"mask": None, "src_key_padding_mask": None,
                                                          "is_causal": None})
    return fx.GraphModule(encoder, graph, class_name="TracedTransformerEncoder")


def rewrite_transformer_encoder(rules: fxrewrite.RuleSet | None = None) -> dict[str, fxrewrite.RewriteResult]:
    """The shipped rules on ``nn.TransformerEncoder``, traced symbolically and exported."""
    rules = rules if rules is not None else fxrewrite.load_rules()
    encoder = transformer_encoder()
    src = torch.randn(2, 10, 32, generator=torch.Generator().manual_seed(2))
    results = {
        "symbolic_trace": fxrewrite.rewrite(trace_encoder(encoder), rules, example_inputs=(src,)),
        "torch.export": fxrewrite.rewrite(torch.export.export(encoder, (src,)).module(), rules),
    }
    with torch.no_grad():
        for result in results.values():
            result.module.graph.lint()
            torch.testing.assert_close(result.module(src), encoder(src), rtol=1e-4, atol=1e-5)
    return results


# ---- the script --------------------------------------------------------------------------------


def fired(report: fxrewrite.Report) -> dict[str, int]:
    """The rules that fired, with how often."""
    return {name: n for name, n in report.applied.items() if n}


def count_calls(gm: fx.GraphModule, name: str) -> int:
    """How many nodes call a function or ATen op called ``name``."""
    def called(n: fx.Node) -> str:
        target = n.target
        if isinstance(target, torch._ops.OpOverload):
            return target.overloadpacket.__name__
        return getattr(target, "__name__", str(target))

    return sum(1 for n in gm.graph.nodes if n.op == "call_function" and called(n) == name)


def rewrite_gpt(model: GPT, rules: fxrewrite.RuleSet, *, export: bool = False) -> fxrewrite.RewriteResult:
    """``model`` rewritten with ``rules``, traced symbolically (shapes from example tokens) or exported."""
    tokens = tokens_for(model)
    if export:
        return fxrewrite.rewrite(torch.export.export(model, (tokens,)).module(), rules)
    return fxrewrite.rewrite(model, rules, example_inputs=(tokens,))


def main() -> dict[str, fxrewrite.RewriteResult]:
    rules = all_rules()
    model = gpt(layers=1, seq=16)
    tokens = tokens_for(model)
    result = rewrite_gpt(model, rules)
    print("before:", fx.symbolic_trace(model).code)
    print("after:", result.code)
    print("fired:", fired(result.report))
    with torch.no_grad():
        torch.testing.assert_close(result.module(tokens), model(tokens), rtol=1e-4, atol=1e-5)
    print("outputs match")

    shipped_only = rewrite_gpt(model, fxrewrite.load_rules())
    print("shipped rules only:", fired(shipped_only.report), "(the additive mask becomes attn_mask=)")

    masked = gpt("masked_fill", layers=1, seq=16)
    print("\nmasked_fill spelling, shipped rules only:", fired(rewrite_gpt(masked, fxrewrite.load_rules()).report))
    masked_result = rewrite_gpt(masked, rules)
    print("with this example's rules:", fired(masked_result.report))
    with torch.no_grad():
        torch.testing.assert_close(masked_result.module(tokens), masked(tokens), rtol=1e-4, atol=1e-5)

    exported = rewrite_gpt(model, rules, export=True)
    print("\ntorch.export graph:", fired(exported.report))
    with torch.no_grad():
        torch.testing.assert_close(exported.module(tokens), model(tokens), rtol=1e-4, atol=1e-5)

    print("\nnn.TransformerEncoder with the shipped rules (attention is already SDPA or a leaf module):")
    encoder = rewrite_transformer_encoder(rules)
    for level, encoder_result in encoder.items():
        print(f"  {level}: {fired(encoder_result.report)}")
    print("outputs match")
    return {"gpt": result, "gpt_shipped_only": shipped_only, "gpt_masked_fill": masked_result,
            "gpt_export": exported, **{f"encoder_{k}": v for k, v in encoder.items()}}


if __name__ == "__main__":
    main()
