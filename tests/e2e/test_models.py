"""The whole shipped library on real models: Hugging Face models from small configs with random
weights (exported), and modules whose hooks, fake quantisation or parametrizations must survive
(traced). The rewritten model computes what the original computes."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn as nn
from _helpers import assert_rewrite_sound

import fxrewrite

LIBRARY = fxrewrite.load_rules()
TOLERANCE = {"rtol": 1e-4, "atol": 1e-5}  # the library's widest declared tolerance (reassociations)


def _hf(kind: str) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    transformers = pytest.importorskip("transformers")
    logging.getLogger("transformers").setLevel(logging.ERROR)
    torch.manual_seed(0)
    small = dict(vocab_size=128, bos_token_id=0, eos_token_id=0, pad_token_id=0, attn_implementation="eager")
    if kind == "gpt2":
        config = transformers.GPT2Config(n_layer=2, n_head=4, n_embd=64, n_positions=64, use_cache=False, **small)
        model = transformers.GPT2Model(config)
    elif kind == "bert":
        config = transformers.BertConfig(num_hidden_layers=2, num_attention_heads=4, hidden_size=64,
                                         intermediate_size=128, max_position_embeddings=64, **small)
        model = transformers.BertModel(config)
    else:
        config = transformers.LlamaConfig(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                          hidden_size=64, intermediate_size=128, max_position_embeddings=64,
                                          use_cache=False, **small)
        model = transformers.LlamaModel(config)

    class Hidden(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model.eval()

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.model(ids).last_hidden_state

    ids = torch.randint(1, 128, (2, 12), generator=torch.Generator().manual_seed(0))
    return Hidden().eval(), (ids,)


@pytest.mark.slow  # an export of a Hugging Face model takes one to two seconds of CPU
@pytest.mark.parametrize("kind", ["gpt2", "bert", "llama"])
def test_the_library_leaves_a_hugging_face_model_equivalent(kind):
    model, inputs = _hf(kind)
    program = torch.export.export(model, inputs)
    result = fxrewrite.rewrite(program, LIBRARY)
    assert_rewrite_sound(model, result, *inputs, **TOLERANCE)


class Guarded(nn.Module):
    """Convolutions and batch norms the library would fold, each with something folding would lose."""

    def __init__(self) -> None:
        super().__init__()
        qconfig = torch.ao.quantization.get_default_qat_qconfig("fbgemm")
        self.hooked = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4))
        self.hooked[0].register_forward_hook(lambda module, args, out: out * 2)
        self.qat = nn.Sequential(torch.ao.nn.qat.Conv2d(4, 4, 3, padding=1, qconfig=qconfig), nn.BatchNorm2d(4))
        self.normed = nn.Sequential(nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4))
        torch.nn.utils.parametrizations.weight_norm(self.normed[0])
        self.plain = nn.Sequential(nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4))
        self.drop = nn.Dropout(0.1)

    def forward(self, x):
        x = torch.relu(self.hooked(x))
        x = torch.relu(self.qat(x))
        x = torch.relu(self.normed(x))
        return self.drop(torch.relu(torch.relu(self.plain(x))))


class Leaves(torch.fx.Tracer):
    def is_leaf_module(self, m: nn.Module, qualified_name: str) -> bool:
        return isinstance(m, nn.Conv2d) or super().is_leaf_module(m, qualified_name)


def test_the_library_keeps_hooks_fake_quantisation_and_parametrizations():
    torch.manual_seed(0)
    model = Guarded().eval()
    for bn in (model.hooked[1], model.qat[1], model.normed[1], model.plain[1]):
        with torch.no_grad():
            bn.running_mean.uniform_(-1, 1)
            bn.running_var.uniform_(0.5, 2)
    x = torch.randn(2, 3, 8, 8)
    model(x)  # the QAT observers see data
    gm = torch.fx.GraphModule(model, Leaves().trace(model))
    result = fxrewrite.rewrite(gm, LIBRARY)
    assert result.report.applied["conv_bn_fold"] == 1  # the plain pair only
    assert result.report.applied["dropout_layer_inactive"] == 1
    assert_rewrite_sound(model, result, x, **TOLERANCE)
