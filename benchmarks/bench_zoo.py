"""The model zoo: the shipped rule library on Hugging Face architectures, side by side with
Inductor's own pattern passes (issue 20).

Usage::

    python benchmarks/bench_zoo.py                      # every architecture, with torch.compile (minutes)
    python benchmarks/bench_zoo.py --quick              # a handful of small architectures
    python benchmarks/bench_zoo.py --no-inductor        # fxrewrite only (no torch.compile)
    python benchmarks/bench_zoo.py --models gpt2,t5,vit --json zoo.json
    python benchmarks/bench_zoo.py --invariant          # adding rules never lowers a rule's fire count
    python benchmarks/bench_zoo.py --baseline zoo.json  # what changed since an earlier --json run

Needs ``transformers`` (a test extra of fxrewrite). Every model is built offline from a tiny
random config (no ``from_pretrained``, no download) with ``attn_implementation="eager"``, in eval
mode, from fixed seeds, and called on a small batch (2 sequences of 8 tokens, or 2 images of
32 x 32). An architecture that fails to build or export in the installed transformers is
listed as skipped with the error, not fatal.

For each architecture the script

1. exports the model (``torch.export.export(model, args, kwargs, strict=False)``) and counts its
   *attention blocks*: the softmax nodes of the exported graph whose result reaches a matmul
   (through casts, dropout and views) -- one per eager attention call, whatever the model names
   its attention module;
2. rewrites the ``ExportedProgram`` with the shipped library (``fxrewrite.load_rules()``) and
   counts what changed in the graph: SDPA nodes (``scaled_dot_product_attention`` and the
   ``_scaled_dot_product_*`` kernels) after minus before, normalisation nodes (``layer_norm``,
   ``rms_norm``, ...) and activation nodes (``gelu``, ``silu``, ...) after minus before; the
   rules that fired (the report); the wall time of ``fxrewrite.rewrite``;
3. checks numerics: the exported program's module before and after, on the same inputs,
   ``torch.testing.assert_close`` at its float32 defaults (pass/fail and the max abs diff; a
   rewritten program that raises is reported as such);
4. for every attention block the rewrite left, names the reason: ``fxrewrite.explain`` with the
   library's attention rules at the matmul that consumes the softmax, the closest miss (and the
   next two for other reasons), and shows the block's graph nodes;
5. unless ``--no-inductor``: ``torch.compile(model, backend="inductor")`` on the same model and
   inputs, FX graph cache off, and reads ``torch._dynamo.utils.counters["inductor"]``:
   ``fuse_attention`` (one per attention pattern Inductor replaced with SDPA,
   ``torch/_inductor/fx_passes/fuse_attention.py``) and ``pattern_matcher_count`` (all its
   pattern replacements), beside the SDPA nodes a custom post-grad pass counts in the graphs
   Inductor compiles (the details line says MISMATCH when the two differ), and the compiled
   output against eager (max abs diff).

``fire_counts(rules, samples)`` is the per-rule fire count over the zoo for any rule set, and
``invariant_violations`` compares each rule alone with the rule plus the library
(``tests/e2e/test_bench_zoo.py`` uses both).

The exit code is 1 when a rewrite raises, a rewritten program raises or its numbers differ, or
(``--invariant``) a rule is starved; attention blocks left unconverted and Inductor's counts are
reported, not failed.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
import traceback
import warnings
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

import torch  # noqa: E402 - after the NumPy warning filter
from torch import fx, nn  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
try:
    import fxrewrite
except ImportError:  # running from a checkout without the package installed
    sys.path.insert(0, str(ROOT))
    import fxrewrite

EXAMPLE_RULES = tuple(sorted(p for p in (ROOT / "examples").glob("*_rules") if p.is_dir()))

BATCH, SEQ, VOCAB, IMAGE = 2, 8, 128, 32

# ----------------------------------------------------------------------------------------------
# the zoo
# ----------------------------------------------------------------------------------------------


@dataclass
class Sample:
    """A built model with the inputs it is called on (``model(*args, **kwargs)`` is a tensor)."""

    name: str
    family: str
    model: nn.Module
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    _program: torch.export.ExportedProgram | None = None

    def program(self) -> torch.export.ExportedProgram:
        """The exported program, made once (every rewrite copies it)."""
        if self._program is None:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self._program = torch.export.export(self.model, self.args, self.kwargs, strict=False)
        return self._program


class LastHidden(nn.Module):
    """A Hugging Face model's ``last_hidden_state`` (export and compile want tensors out)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        out = self.model(*args, **kwargs)
        return out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]


@dataclass(frozen=True)
class Arch:
    """One architecture of the zoo: how to build it tiny, and what it exercises."""

    name: str
    family: str
    config: str
    model: str
    options: dict[str, Any]
    inputs: str  # "causal", "padded", "seq2seq", "image"
    note: str = ""


def _tokens(seed: int = 0) -> torch.Tensor:
    return torch.randint(3, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(seed))


def _padding_mask() -> torch.Tensor:
    """Ones, with the last two tokens of the second sequence padded."""
    mask = torch.ones(BATCH, SEQ, dtype=torch.long)
    mask[1, -2:] = 0
    return mask


def _inputs(kind: str) -> tuple[tuple[Any, ...], dict[str, Any]]:
    if kind == "causal":
        return (_tokens(),), {}
    if kind == "padded":
        return (_tokens(),), {"attention_mask": _padding_mask()}
    if kind == "seq2seq":
        return (_tokens(),), {"attention_mask": _padding_mask(), "decoder_input_ids": _tokens(1)}
    if kind == "image":
        return (torch.randn(BATCH, 3, IMAGE, IMAGE, generator=torch.Generator().manual_seed(0)),), {}
    raise ValueError(f"unknown input kind {kind!r}")


_DEC = {"vocab_size": VOCAB, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "max_position_embeddings": 64}
_ENC = {"vocab_size": VOCAB, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "max_position_embeddings": 64}
_BART = {"vocab_size": VOCAB, "d_model": 32, "encoder_layers": 2, "decoder_layers": 2, "encoder_attention_heads": 4,
         "decoder_attention_heads": 4, "encoder_ffn_dim": 64, "decoder_ffn_dim": 64, "max_position_embeddings": 64,
         "pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2, "decoder_start_token_id": 2}
_VIT = {"image_size": IMAGE, "patch_size": 8, "num_channels": 3, "hidden_size": 32, "num_hidden_layers": 2,
        "num_attention_heads": 4, "intermediate_size": 64}

ZOO: tuple[Arch, ...] = (
    # decoders
    Arch("gpt2", "decoder", "GPT2Config", "GPT2Model",
         {"n_layer": 2, "n_embd": 32, "n_head": 4, "vocab_size": VOCAB, "n_positions": 64}, "causal",
         "Conv1D projections, tanh GELU"),
    Arch("gpt_neo", "decoder", "GPTNeoConfig", "GPTNeoModel",
         {"num_layers": 2, "attention_types": [[["global", "local"], 1]], "hidden_size": 32, "num_heads": 4,
          "window_size": 4, "vocab_size": VOCAB, "max_position_embeddings": 64}, "causal",
         "boolean causal mask through torch.where, unscaled scores"),
    Arch("gptj", "decoder", "GPTJConfig", "GPTJModel",
         {"n_layer": 2, "n_embd": 32, "n_head": 4, "rotary_dim": 4, "vocab_size": VOCAB, "n_positions": 64},
         "causal", "rotary, float32 scores, division by sqrt(head_dim)"),
    Arch("gpt_neox", "decoder", "GPTNeoXConfig", "GPTNeoXModel", dict(_DEC), "causal", "rotary, parallel residual"),
    Arch("opt", "decoder", "OPTConfig", "OPTModel",
         {"num_hidden_layers": 2, "hidden_size": 32, "num_attention_heads": 4, "ffn_dim": 64,
          "word_embed_proj_dim": 32, "vocab_size": VOCAB, "max_position_embeddings": 64}, "padded",
         "padding mask"),
    Arch("bloom", "decoder", "BloomConfig", "BloomModel",
         {"n_layer": 2, "hidden_size": 32, "n_head": 4, "vocab_size": VOCAB}, "padded", "ALiBi via baddbmm"),
    Arch("llama", "decoder-gqa", "LlamaConfig", "LlamaModel", {**_DEC, "num_key_value_heads": 2}, "causal",
         "grouped-query (repeat_kv), RMSNorm, SiLU"),
    Arch("mistral", "decoder-gqa", "MistralConfig", "MistralModel",
         {**_DEC, "num_key_value_heads": 2, "sliding_window": 4}, "causal", "sliding-window mask"),
    Arch("qwen2", "decoder-gqa", "Qwen2Config", "Qwen2Model", {**_DEC, "num_key_value_heads": 2}, "causal",
         "q/k/v biases"),
    Arch("qwen3", "decoder-gqa", "Qwen3Config", "Qwen3Model", {**_DEC, "num_key_value_heads": 2, "head_dim": 8},
         "causal", "q/k RMSNorm"),
    Arch("phi", "decoder", "PhiConfig", "PhiModel", {**_DEC, "partial_rotary_factor": 0.5}, "causal",
         "partial rotary, gelu_new"),
    Arch("phi3", "decoder-gqa", "Phi3Config", "Phi3Model", {**_DEC, "num_key_value_heads": 2, "pad_token_id": 0},
         "causal", "fused qkv"),
    Arch("gemma", "decoder-mqa", "GemmaConfig", "GemmaModel", {**_DEC, "num_key_value_heads": 1, "head_dim": 8},
         "causal", "multi-query, RMSNorm (1 + w), tanh GELU"),
    Arch("falcon", "decoder-mqa", "FalconConfig", "FalconModel",
         {"vocab_size": VOCAB, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
          "multi_query": True, "new_decoder_architecture": False, "alibi": False, "parallel_attn": True},
         "causal", "multi-query"),
    Arch("gpt_bigcode", "decoder-mqa", "GPTBigCodeConfig", "GPTBigCodeModel",
         {"n_layer": 2, "n_embd": 32, "n_head": 4, "vocab_size": VOCAB, "n_positions": 64, "multi_query": True},
         "causal", "multi-query"),
    # encoders
    Arch("bert", "encoder", "BertConfig", "BertModel", dict(_ENC), "padded", "padding mask"),
    Arch("roberta", "encoder", "RobertaConfig", "RobertaModel", {**_ENC, "pad_token_id": 1}, "padded",
         "padding mask"),
    Arch("distilbert", "encoder", "DistilBertConfig", "DistilBertModel",
         {"vocab_size": VOCAB, "dim": 32, "hidden_dim": 64, "n_layers": 2, "n_heads": 4,
          "max_position_embeddings": 64}, "padded", "padding mask"),
    Arch("albert", "encoder", "AlbertConfig", "AlbertModel", {**_ENC, "embedding_size": 16}, "padded",
         "shared layers, padding mask"),
    Arch("electra", "encoder", "ElectraConfig", "ElectraModel", {**_ENC, "embedding_size": 16}, "padded",
         "padding mask"),
    # encoder-decoders
    Arch("t5", "encoder-decoder", "T5Config", "T5Model",
         {"vocab_size": VOCAB, "d_model": 32, "d_kv": 8, "d_ff": 64, "num_layers": 2, "num_decoder_layers": 2,
          "num_heads": 4, "relative_attention_num_buckets": 8, "decoder_start_token_id": 0, "pad_token_id": 0},
         "seq2seq", "relative position bias + padding mask, unscaled"),
    Arch("bart", "encoder-decoder", "BartConfig", "BartModel", dict(_BART), "seq2seq", "padding mask, cross-attention"),
    Arch("marian", "encoder-decoder", "MarianConfig", "MarianModel", {**_BART, "pad_token_id": 0}, "seq2seq",
         "padding mask, cross-attention"),
    # vision
    Arch("vit", "vision", "ViTConfig", "ViTModel", dict(_VIT), "image", "no mask"),
    Arch("deit", "vision", "DeiTConfig", "DeiTModel", dict(_VIT), "image", "no mask"),
    Arch("swin", "vision", "SwinConfig", "SwinModel",
         {"image_size": IMAGE, "patch_size": 4, "embed_dim": 16, "depths": [2, 2], "num_heads": [2, 4],
          "window_size": 4}, "image", "window attention, relative position bias, shifted-window mask"),
)

ARCHS: dict[str, Arch] = {a.name: a for a in ZOO}
QUICK = ("gpt2", "llama", "gemma", "bert", "t5", "vit")


def build(arch: Arch) -> Sample:
    """The tiny random model of ``arch`` (eval mode, eager attention, seed 0) with its inputs."""
    import transformers

    logging.getLogger("transformers").setLevel(logging.ERROR)
    config = getattr(transformers, arch.config)(**arch.options, use_cache=False)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = LastHidden(getattr(transformers, arch.model)(config)).eval()
    args, kwargs = _inputs(arch.inputs)
    return Sample(arch.name, arch.family, model, args, kwargs)


def build_zoo(names: Iterable[str]) -> tuple[list[Sample], dict[str, str]]:
    """The samples of ``names`` that build and export, and {name: error} for the others."""
    samples, skipped = [], {}
    for name in names:
        try:
            sample = build(ARCHS[name])
            sample.program()
            samples.append(sample)
        except Exception as exc:  # an architecture this transformers cannot build is skipped
            skipped[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:200]
    return samples, skipped


# ----------------------------------------------------------------------------------------------
# reading graphs
# ----------------------------------------------------------------------------------------------


def _op_name(node: fx.Node) -> str:
    """``softmax`` for ``aten._softmax.default``, ``torch.softmax``, ``Tensor.softmax``; '' for non-calls."""
    if node.op == "call_function":
        target = node.target
        if isinstance(target, torch._ops.OpOverload):
            return target._opname
        if isinstance(target, torch._ops.OpOverloadPacket):
            return target.__name__
        return getattr(target, "__name__", str(target))
    if node.op == "call_method":
        return str(node.target)
    return ""


SOFTMAX_OPS = frozenset({"softmax", "_softmax", "_safe_softmax"})
SDPA_OPS = frozenset({"scaled_dot_product_attention", "_scaled_dot_product_attention_math",
                      "_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_for_cpu",
                      "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
                      "_scaled_dot_product_fused_attention_overrideable"})
MATMUL_OPS = frozenset({"matmul", "bmm", "mm", "einsum", "baddbmm"})
NORM_OPS = frozenset({"layer_norm", "native_layer_norm", "rms_norm", "_fused_rms_norm", "group_norm",
                      "native_group_norm", "batch_norm", "instance_norm"})
ACTIVATION_OPS = frozenset({"gelu", "silu", "mish", "hardswish", "hardsigmoid", "relu6", "leaky_relu", "softplus"})
# ops that carry the attention weights on to the matmul unchanged in value (or only recast)
_PASS_THROUGH = frozenset({"to", "_to_copy", "type_as", "type", "float", "dropout", "native_dropout", "clone",
                           "contiguous", "alias", "detach", "view", "reshape", "_unsafe_view", "expand",
                           "getitem", "masked_fill", "where"})


def count_ops(gm: fx.GraphModule, names: frozenset[str]) -> Counter[str]:
    return Counter(op for op in map(_op_name, gm.graph.nodes) if op in names)


def _forward_path(softmax: fx.Node, depth: int = 6) -> list[fx.Node] | None:
    """The nodes from ``softmax`` to the matmul its weights reach as an operand (through casts,
    dropout, views), both included; None when they reach none."""
    frontier: list[list[fx.Node]] = [[softmax]]
    for _ in range(depth):
        following = []
        for path in frontier:
            for user in path[-1].users:
                op = _op_name(user)
                if op in MATMUL_OPS:
                    return [*path, user]
                if op in _PASS_THROUGH:
                    following.append([*path, user])
        frontier = following
    return None


def consuming_matmul(softmax: fx.Node) -> fx.Node | None:
    """The matmul the softmax's weights reach as an operand (through casts, dropout, views), or None."""
    path = _forward_path(softmax)
    return path[-1] if path else None


def _scores_path(softmax: fx.Node, depth: int = 5) -> list[fx.Node]:
    """The nodes from the scores' matmul to ``softmax`` (the first path found, graph order)."""
    def search(node: fx.Node, left: int) -> list[fx.Node] | None:
        if node is not softmax and _op_name(node) in MATMUL_OPS:
            return [node]
        if left == 0:
            return None
        for source in node.all_input_nodes:
            if source.op == "call_function":
                found = search(source, left - 1)
                if found:
                    return [*found, node]
        return None

    return search(softmax, depth) or [softmax]


def _arg(value: Any) -> str:
    if isinstance(value, fx.Node):
        return value.name
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(map(_arg, value)) + "]"
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def node_code(node: fx.Node) -> str:
    """``add = aten.add.Tensor(mul, mask)``: one graph node, short."""
    target = node.target
    op = str(target).removeprefix("aten.") if isinstance(target, torch._ops.OpOverload) else _op_name(node)
    args = [_arg(a) for a in node.args] + [f"{k}={_arg(v)}" for k, v in node.kwargs.items()]
    return f"{node.name} = {op}({', '.join(args)})"


def block_code(softmax: fx.Node) -> list[str]:
    """The attention block around ``softmax`` as graph nodes: from the scores' matmul through the
    softmax to the matmul with the values."""
    forward = _forward_path(softmax) or [softmax]
    return [node_code(n) for n in [*_scores_path(softmax), *forward[1:]]]


def attention_softmaxes(gm: fx.GraphModule) -> list[fx.Node]:
    """The softmax nodes whose result reaches a matmul: one per eager attention block."""
    return [n for n in gm.graph.nodes if _op_name(n) in SOFTMAX_OPS and consuming_matmul(n) is not None]


def attention_rules(rules: fxrewrite.RuleSet) -> fxrewrite.RuleSet:
    """The rules of ``rules`` that turn attention into SDPA: those of the library's attention
    topic (``rules/attention.*``) and any other whose name says attention."""
    def is_attention(rule: fxrewrite.Rule) -> bool:
        return Path(rule.origin.rpartition(":")[0]).stem == "attention" or "attention" in rule.name

    return fxrewrite.RuleSet([r for r in rules if is_attention(r)])


@dataclass
class Left:
    """An attention block the rewrite left, and why: the closest miss of the attention rules at
    the matmul that consumes its softmax (``also``: the next closest misses, for other reasons)."""

    softmax: str
    matmul: str
    rule: str
    reason: str
    block: list[str]
    also: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        return f"{self.softmax} -> {self.matmul}: {self.rule}: {self.reason}"


def _closest_misses(explained: fxrewrite.Explanation) -> dict[str, list[tuple[str, str]]]:
    """{graph node: [(rule, miss)]}: the misses at each node, furthest first (rule order among
    equals), one per distinct reason."""
    found: dict[str, list[tuple[int, int, str, str]]] = {}
    for order, explanation in enumerate(explained.rules):
        for miss in explanation.misses:
            found.setdefault(miss.graph_node, []).append((-miss.progress, order, explanation.rule, str(miss)))
    closest = {}
    for node, misses in found.items():
        reasons: dict[str, tuple[str, str]] = {}
        for _, _, rule, text in sorted(misses):
            reasons.setdefault(_reason(text), (rule, text))
        closest[node] = list(reasons.values())
    return closest


def _reason(miss: str) -> str:
    """A miss's reason without the graph node's code (the same spelling in every layer reads alike)."""
    return miss.partition("): ")[2] or miss


def why_left(gm: fx.GraphModule, softmaxes: Sequence[fx.Node], rules: fxrewrite.RuleSet) -> list[Left]:
    """For each attention softmax left in ``gm``: the closest miss of the attention ``rules`` at
    the matmul that consumes it (``fxrewrite.explain``, the miss that got furthest)."""
    if not softmaxes:
        return []
    closest = _closest_misses(fxrewrite.explain(gm, rules, misses=1 << 20))
    left = []
    for softmax in softmaxes:
        matmul = consuming_matmul(softmax)
        assert matmul is not None
        found = closest.get(matmul.name) or [("-", f"no attention rule is tried at '{matmul.name}' "
                                                    f"({_op_name(matmul)})")]
        also = [f"{rule}: {_reason(miss)}" for rule, miss in found[1:3]]
        left.append(Left(softmax.name, matmul.name, found[0][0], found[0][1], block_code(softmax), also))
    return left


# ----------------------------------------------------------------------------------------------
# measuring
# ----------------------------------------------------------------------------------------------


@dataclass
class Row:
    arch: str
    family: str
    note: str = ""
    nodes: int = 0
    attention: int = 0
    converted: int = 0
    left: list[Left] = field(default_factory=list)
    norms: int = 0
    norms_before: int = 0
    activations: int = 0
    activations_before: int = 0
    fired: dict[str, int] = field(default_factory=dict)
    rewrite_ms: float = float("nan")
    exact: bool = False
    max_diff: float = float("nan")
    inductor_attention: int | None = None
    inductor_patterns: int | None = None
    inductor_sdpa_nodes: int | None = None
    inductor_max_diff: float = float("nan")
    error: str = ""


def _run(module: Callable[..., torch.Tensor], sample: Sample) -> torch.Tensor:
    with torch.no_grad():
        return module(*sample.args, **sample.kwargs)


def measure_rewrite(sample: Sample, library: fxrewrite.RuleSet, row: Row) -> fxrewrite.RewriteResult:
    """Fill the fxrewrite side of ``row``; return the rewrite result."""
    program = sample.program()
    before = program.module()
    started = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = fxrewrite.rewrite(program, library)
    row.rewrite_ms = (time.perf_counter() - started) * 1e3
    after = result.module
    after.graph.lint()
    row.nodes = len(before.graph.nodes)
    row.attention = len(attention_softmaxes(before))
    left = attention_softmaxes(after)
    row.converted = sum(count_ops(after, SDPA_OPS).values()) - sum(count_ops(before, SDPA_OPS).values())
    row.norms_before = sum(count_ops(before, NORM_OPS).values())
    row.norms = sum(count_ops(after, NORM_OPS).values()) - row.norms_before
    row.activations_before = sum(count_ops(before, ACTIVATION_OPS).values())
    row.activations = sum(count_ops(after, ACTIVATION_OPS).values()) - row.activations_before
    row.fired = {name: n for name, n in result.report.applied.items() if n}
    expected = _run(before, sample)
    try:
        actual = _run(result.exported_program.module(), sample)
    except Exception as exc:  # the rewrite made a program that does not run: reported, exit code 1
        row.error = f"the rewritten program raised {type(exc).__name__}: {str(exc).splitlines()[0]}"
    else:
        row.max_diff = float((actual - expected).abs().max())
        try:
            torch.testing.assert_close(actual, expected)
            row.exact = True
        except AssertionError as exc:
            row.error = f"numerics: {str(exc).splitlines()[0]}"
    if row.converted + len(left) != row.attention:
        row.error += f" attention count: {row.converted} converted + {len(left)} left != {row.attention}"
    row.left = why_left(after, left, attention_rules(library))
    return result


class _SdpaCounter:
    """A post-grad custom pass that counts SDPA nodes of the graphs Inductor compiles."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, graph: fx.Graph) -> None:
        self.count += sum(1 for n in graph.nodes if _op_name(n) in SDPA_OPS)

    def uuid(self) -> str:
        return "bench_zoo_sdpa_counter"


def measure_inductor(sample: Sample, row: Row) -> None:
    """Fill the Inductor side of ``row``: torch.compile the model on CPU, read the counters."""
    import torch._dynamo
    import torch._inductor.config as inductor_config
    from torch._dynamo.utils import counters

    counter = _SdpaCounter()
    torch._dynamo.reset()
    counters.clear()
    with inductor_config.patch(fx_graph_cache=False, post_grad_custom_post_pass=counter), \
            torch._functorch.config.patch(enable_autograd_cache=False), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compiled = torch.compile(sample.model, backend="inductor")
        actual = _run(compiled, sample)
    row.inductor_attention = int(counters["inductor"]["fuse_attention"])
    row.inductor_patterns = int(counters["inductor"]["pattern_matcher_count"])
    row.inductor_sdpa_nodes = counter.count
    row.inductor_max_diff = float((actual - _run(sample.model, sample)).abs().max())
    torch._dynamo.reset()


def measure(sample: Sample, library: fxrewrite.RuleSet, inductor: bool) -> Row:
    arch = ARCHS.get(sample.name)
    row = Row(sample.name, sample.family, arch.note if arch else "")
    try:
        measure_rewrite(sample, library, row)
    except Exception as exc:  # reported in the table, exit code 1
        row.error = f"rewrite raised {type(exc).__name__}: {exc}"
        traceback.print_exc()
    if inductor:
        try:
            measure_inductor(sample, row)
        except Exception as exc:  # reported, not fatal: Inductor is the comparison
            row.error += f" inductor raised {type(exc).__name__}: {str(exc).splitlines()[0]}"
    return row


# ----------------------------------------------------------------------------------------------
# fire counts and the invariant
# ----------------------------------------------------------------------------------------------


def _rewritten(rules: fxrewrite.RuleSet, sample: Sample) -> fxrewrite.RewriteResult:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fxrewrite.rewrite(sample.program(), rules)


def fire_counts(rules: fxrewrite.RulesLike, samples: Sequence[Sample]) -> dict[str, int]:
    """How often each rule of ``rules`` fires over ``samples`` (each exported program rewritten
    with the whole rule set), summed; every rule of the set has an entry."""
    ruleset = rules if isinstance(rules, fxrewrite.RuleSet) else fxrewrite.RuleSet(list(rules))
    total: Counter[str] = Counter({name: 0 for name in ruleset.names})
    for sample in samples:
        total.update(_rewritten(ruleset, sample).report.applied)
    return dict(total)


def with_rule(library: fxrewrite.RuleSet, rule: fxrewrite.Rule) -> fxrewrite.RuleSet:
    """``library`` with ``rule`` in it: the library itself when the rule is one of it, else the
    library with the rule added (replacing the library's rule of that name, if any)."""
    if rule.name in library.names and library[rule.name] is rule:
        return library
    return fxrewrite.RuleSet([*(r for r in library if r.name != rule.name), rule])


def _matching(rules: Sequence[fxrewrite.Rule], samples: Sequence[Sample]) -> set[int]:
    """The ``id`` of each rule of ``rules`` that matches some sample's exported program as it
    is (a rule alone can fire only there first): one ``find_matches`` per sample and group of
    rules with distinct names."""
    groups: list[dict[str, fxrewrite.Rule]] = []
    for rule in rules:
        group = next((g for g in groups if rule.name not in g), None)
        if group is None:
            groups.append(group := {})
        group[rule.name] = rule
    found = set()
    for sample in samples:
        for group in groups:
            ruleset = fxrewrite.RuleSet(list(group.values()))
            found |= {id(group[r.name]) for r, _ in fxrewrite.find_matches(sample.program(), ruleset)}
    return found


@dataclass(frozen=True)
class Lowered:
    """A rule that fires less often with the library loaded than alone.

    ``starved`` are the places (``arch:node``) where the rule alone matches the exported program
    and which the rewrite with the library leaves in the graph: nobody rewrote that computation
    (the library re-spelt its neighbourhood, or a guard now refuses). The rest of the difference
    is *subsumed*: another rule of the library (higher priority, or larger) rewrote those nodes
    itself (the attention rules take the inactive dropout inside the block; the affine RMSNorm
    rule takes the plain one's nodes). Subsumed is judged by the match's anchor node being gone
    from the rewritten graph: a rule that only re-spells that node (replaces it by an equal node
    the rule does not match) would starve the rule and still count as subsuming it."""

    alone: int
    together: int
    starved: tuple[str, ...]


def invariant_violations(rules: Iterable[fxrewrite.Rule], library: fxrewrite.RuleSet,
                         samples: Sequence[Sample]) -> dict[str, Lowered]:
    """{rule: Lowered} for each rule of ``rules`` that fires less often over ``samples`` with the
    whole library loaded than alone (empty: the invariant holds as the issue states it)."""
    rules = list(rules)
    matching = _matching(rules, samples)
    base: dict[str, fxrewrite.RewriteResult] = {}  # the library's own rewrite, made once per sample
    lowered = {}
    for rule in rules:
        if id(rule) not in matching:
            continue
        alone = fire_counts(fxrewrite.RuleSet([rule]), samples)[rule.name]
        if alone == 0:
            continue  # nothing to lower
        together, starved = 0, []
        ruleset = with_rule(library, rule)
        for sample in samples:
            if ruleset is not library:
                result = _rewritten(ruleset, sample)
            elif sample.name in base:
                result = base[sample.name]
            else:
                result = base[sample.name] = _rewritten(library, sample)
            together += result.report.applied.get(rule.name, 0)
            left = {n.name for n in result.module.graph.nodes}
            starved += [f"{sample.name}:{m.anchor.name}" for _, m in fxrewrite.find_matches(sample.program(), rule)
                        if m.anchor.name in left]
        if together < alone:
            lowered[rule.name] = Lowered(alone, together, tuple(starved))
    return lowered


def every_rule(library: fxrewrite.RuleSet) -> list[fxrewrite.Rule]:
    """The library's rules and those of ``examples/*_rules``."""
    rules = list(library)
    for directory in EXAMPLE_RULES:
        rules.extend(fxrewrite.load_rules(directory))
    return rules


# ----------------------------------------------------------------------------------------------
# report
# ----------------------------------------------------------------------------------------------

_HEADER = ("arch", "family", "nodes", "attn->SDPA", "inductor", "norms", "acts", "rules fired", "rewrite ms",
           "numerics")


def _opt(value: int | None) -> str:
    return "-" if value is None else str(value)


def table(rows: Sequence[Row], skipped: dict[str, str]) -> str:
    cells = [_HEADER]
    for r in rows:
        numerics = ("RAISED" if r.error.startswith("the rewritten program raised") else
                    f"{'exact' if r.exact else 'DIFF'} {r.max_diff:.1e}")
        cells.append((r.arch, r.family, str(r.nodes), f"{r.converted}/{r.attention}", _opt(r.inductor_attention),
                      f"+{r.norms}", f"+{r.activations}", str(sum(r.fired.values())), f"{r.rewrite_ms:.0f}",
                      numerics))
    measured = [r for r in rows if not r.error.startswith("rewrite raised")]
    inductor = [r.inductor_attention for r in rows if r.inductor_attention is not None]
    cells.append(("total", f"{len(rows)} archs", str(sum(r.nodes for r in rows)),
                  f"{sum(r.converted for r in rows)}/{sum(r.attention for r in rows)}",
                  str(sum(inductor)) if inductor else "-", f"+{sum(r.norms for r in rows)}",
                  f"+{sum(r.activations for r in rows)}", str(sum(sum(r.fired.values()) for r in rows)),
                  f"{sum(r.rewrite_ms for r in measured):.0f}",
                  f"{sum(r.exact for r in rows)}/{len(rows)} exact"))
    widths = [max(len(c[i]) for c in cells) for i in range(len(_HEADER))]
    right = {2, 3, 4, 5, 6, 7, 8}
    lines = ["  ".join(c[i].rjust(widths[i]) if i in right else c[i].ljust(widths[i]) for i in range(len(c)))
             for c in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines.insert(len(lines) - 1, lines[1])
    for name, error in skipped.items():
        lines.append(f"skipped {name}: {error}")
    return "\n".join(line.rstrip() for line in lines)


def details(rows: Sequence[Row]) -> str:
    """Per architecture: the rules that fired, Inductor's counters, and each block left with
    the reason (and the block's graph nodes, once per distinct reason)."""
    lines = []
    for r in rows:
        fired = ", ".join(f"{name} x{n}" for name, n in sorted(r.fired.items())) or "(none)"
        inductor = ("" if r.inductor_attention is None else
                    f"; inductor: fuse_attention {r.inductor_attention}, {r.inductor_sdpa_nodes} SDPA node(s) "
                    f"post-grad{'' if r.inductor_sdpa_nodes == r.inductor_attention else ' (MISMATCH)'}, "
                    f"{r.inductor_patterns} pattern replacement(s), max diff {r.inductor_max_diff:.1e}")
        lines.append(f"{r.arch} ({r.family}; {r.note}): {fired}{inductor}")
        for i, left in enumerate(r.left):
            lines.append(f"    left {left}")
            if i == 0 or (left.rule, _reason(left.reason)) != (r.left[i - 1].rule, _reason(r.left[i - 1].reason)):
                lines += [f"        also {also}" for also in left.also]
                lines += [f"        {code}" for code in left.block]
        if r.error:
            lines.append(f"    ERROR:{r.error}")
    return "\n".join(lines)


def compare(rows: Sequence[Row]) -> str:
    """The done-when of issue 20, row by row: at least Inductor's count, exact numerics."""
    behind = [f"{r.arch} ({r.converted} < {r.inductor_attention})" for r in rows
              if r.inductor_attention is not None and r.converted < r.inductor_attention]
    inexact = [r.arch for r in rows if not r.exact]
    return "\n".join([
        f"attention converted, fxrewrite: {sum(r.converted for r in rows)} of {sum(r.attention for r in rows)} "
        f"block(s) on {len(rows)} architecture(s)",
        "behind Inductor on: " + (", ".join(behind) or "none"),
        "numerics not exact at float32 defaults on: " + (", ".join(inexact) or "none"),
    ])


# ----------------------------------------------------------------------------------------------
# command line
# ----------------------------------------------------------------------------------------------


def against(rows: Sequence[Row], baseline: dict[str, Any]) -> str:
    """What changed since a ``--json`` file of an earlier run: per architecture, the attention
    blocks converted, norms, activations and rules fired, old -> new, and the numerics verdict."""
    old = {r["arch"]: r for r in baseline["rows"]}
    lines = []
    for r in rows:
        before = old.get(r.arch)
        if before is None:
            lines.append(f"  {r.arch}: new in this run")
            continue
        pairs = {"attention": (before["converted"], r.converted), "norms": (before["norms"], r.norms),
                 "acts": (before["activations"], r.activations),
                 "rules fired": (sum(before["fired"].values()), sum(r.fired.values())),
                 "exact": (before["exact"], r.exact)}
        changes = [f"{what} {old_value} -> {new_value}" for what, (old_value, new_value) in pairs.items()
                   if old_value != new_value]
        if changes:
            lines.append(f"  {r.arch}: {'; '.join(changes)}")
    converted = (sum(r["converted"] for r in baseline["rows"] if r["arch"] in {x.arch for x in rows}),
                 sum(r.converted for r in rows))
    head = f"against the baseline: attention converted {converted[0]} -> {converted[1]}"
    return "\n".join([head, *(lines or ["  no change"])])


def invariant_report(violations: dict[str, Lowered]) -> str:
    """The invariant's verdict: rules starved by the library (a failure), rules subsumed (a note)."""
    if not violations:
        return "invariant (every rule fires at least as often with the library as alone): holds"
    lines = ["invariant (every rule fires at least as often with the library as alone): lowered for "
             f"{len(violations)} rule(s)"]
    for name, v in violations.items():
        verdict = f"STARVED at {', '.join(v.starved)}" if v.starved else "subsumed (other rules rewrote those nodes)"
        lines.append(f"  {name}: alone {v.alone}, with the library {v.together}; {verdict}")
    return "\n".join(lines)


def _names(text: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in ARCHS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown architecture(s) {', '.join(unknown)}; choose from "
                                         f"{', '.join(ARCHS)}")
    return names


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench_zoo.py", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help=f"only {','.join(QUICK)}")
    parser.add_argument("--models", type=_names, default=None, help=f"comma-separated subset of {','.join(ARCHS)}")
    parser.add_argument("--no-inductor", action="store_true", help="skip torch.compile (fxrewrite only)")
    parser.add_argument("--invariant", action="store_true",
                        help="also check every rule (library and examples/*_rules): fires as often with the "
                             "library as alone")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows as JSON")
    parser.add_argument("--baseline", type=Path, default=None,
                        help="a --json file of an earlier run: also print what changed since")
    args = parser.parse_args(argv)
    args.models = args.models or (QUICK if args.quick else tuple(ARCHS))
    return args


def main(argv: Sequence[str] | None = None, out: Any = None) -> int:
    """Run the benchmark and print the report; returns 0, or 1 when a rewrite raised or changed numbers."""
    out = out if out is not None else sys.stdout
    args = parse_args(argv)
    started = time.perf_counter()
    import transformers

    library = fxrewrite.load_rules()
    print(f"fxrewrite {fxrewrite.__version__}, torch {torch.__version__}, transformers {transformers.__version__}, "
          f"{len(library)} library rules, {len(args.models)} architecture(s), "
          f"inductor {'off' if args.no_inductor else 'on'}", file=out, flush=True)
    samples, skipped = build_zoo(args.models)
    rows = []
    for sample in samples:
        rows.append(measure(sample, library, inductor=not args.no_inductor))
        print(f"  {sample.name}: done", file=out, flush=True)
    print(f"\n{table(rows, skipped)}\n\n{details(rows)}\n\n{compare(rows)}", file=out)
    if args.baseline is not None:
        print(f"\n{against(rows, json.loads(args.baseline.read_text()))}", file=out)
    violations: dict[str, Lowered] = {}
    if args.invariant:
        violations = invariant_violations(every_rule(library), library, samples)
        print(f"\n{invariant_report(violations)}", file=out)
    print(f"\ntotal benchmark time {time.perf_counter() - started:.1f} s", file=out)
    if args.json is not None:
        args.json.write_text(json.dumps({"rows": [asdict(r) for r in rows], "skipped": skipped,
                                         "invariant_violations": {n: asdict(v) for n, v in violations.items()}},
                                        indent=1))
    starved = any(v.starved for v in violations.values())
    return 0 if all(r.exact and not r.error for r in rows) and not starved else 1


if __name__ == "__main__":
    sys.exit(main())
