"""Hand-written activation functions fused into the torch function that computes each, with the
shipped rule library, on a small MobileNet-style network.

Models copied from papers often spell activations out: hardswish as ``x * relu6(x + 3) / 6``,
SiLU as ``x * sigmoid(x)``, BERT's GELU with ``erf``, Mish with ``softplus``, ReLU6 as a
``clamp``, leaky ReLU with ``where``. Each spelling runs several kernels and allocates a tensor
per step; the fused function runs one. The shipped rules (``rules/activations.py``) recognise
these formulas, with their constants as literal captures checked by guards, and the shipped
``conv_bn_fold`` folds each BatchNorm into the convolution before it (eval mode). One more rule
is defined here, for a spelling the library does not have: ``x / (1 + exp(-x))`` is SiLU too.

On a ``torch.export`` graph the same rules run on ATen ops. BatchNorm modules are inlined there
(``aten.batch_norm``), so the module-capturing ``conv_bn_fold`` does not apply; ``main()``
prints the rules that fired on the traced graph only, with ``fxrewrite.explain``'s reason.

Run:  python examples/04_activation_fusions.py
CLI:  fxrewrite apply examples/04_activation_fusions.py:mobile_net --check
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

import fxrewrite

# ---- activations as the papers write them ------------------------------------------------------


def hard_swish(x):
    return x * F.relu6(x + 3.0) / 6.0


def hard_sigmoid(x):
    return F.relu6(x + 3.0) / 6.0


def swish(x):
    return x * torch.sigmoid(x)


def swish_exp(x):
    return x / (1.0 + torch.exp(-x))


def gelu_erf(x):
    return x * 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0)))


def mish(x):
    return x * torch.tanh(F.softplus(x))


# ---- the model ---------------------------------------------------------------------------------


class SqueezeExcite(nn.Module):
    def __init__(self, channels: int, reduction: int = 4) -> None:
        super().__init__()
        self.reduce = nn.Conv2d(channels, channels // reduction, 1)
        self.expand = nn.Conv2d(channels // reduction, channels, 1)

    def forward(self, x):
        w = x.mean((2, 3), keepdim=True)
        return x * hard_sigmoid(self.expand(torch.relu(self.reduce(w))))


class InvertedResidual(nn.Module):
    """MobileNetV3's block: expand (1x1), depthwise (3x3), squeeze-excite, project (1x1)."""

    def __init__(self, channels: int, expansion: int = 2) -> None:
        super().__init__()
        hidden = channels * expansion
        self.expand = nn.Conv2d(channels, hidden, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(hidden)
        self.depthwise = nn.Conv2d(hidden, hidden, 3, padding=1, groups=hidden, bias=False)
        self.bn2 = nn.BatchNorm2d(hidden)
        self.se = SqueezeExcite(hidden)
        self.project = nn.Conv2d(hidden, channels, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(channels)

    def forward(self, x):
        h = hard_swish(self.bn1(self.expand(x)))
        h = swish(self.bn2(self.depthwise(h)))
        h = self.se(h)
        return x + self.bn3(self.project(h))


class MobileNet(nn.Module):
    def __init__(self, channels: int = 16, blocks: int = 2, hidden: int = 64, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, channels, 3, stride=2, padding=1, bias=False)
        self.stem_bn = nn.BatchNorm2d(channels)
        self.blocks = nn.Sequential(*(InvertedResidual(channels) for _ in range(blocks)))
        self.fc1 = nn.Linear(channels, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.fc3 = nn.Linear(hidden, classes)

    def forward(self, x):
        x = torch.clamp(self.stem_bn(self.stem(x)), 0.0, 6.0)  # ReLU6
        x = self.blocks(x).mean((2, 3))
        x = gelu_erf(self.fc1(x))
        x = mish(self.fc2(x))
        x = torch.where(x > 0, x, x * 0.01)  # leaky ReLU
        return swish_exp(self.fc3(x))


def mobile_net(seed: int = 0, **sizes: int) -> MobileNet:
    """A MobileNet in eval mode with non-default BatchNorm statistics (the ``fxrewrite apply`` target)."""
    torch.manual_seed(seed)
    model = MobileNet(**sizes)
    for module in model.modules():
        if isinstance(module, nn.BatchNorm2d):
            module.running_mean.uniform_(-0.5, 0.5)
            module.running_var.uniform_(0.5, 2.0)
            nn.init.uniform_(module.weight, 0.5, 1.5)
            nn.init.uniform_(module.bias, -0.2, 0.2)
    return model.eval()


def example_inputs(size: int = 32) -> tuple[torch.Tensor]:
    """Inputs for `fxrewrite apply examples/04_activation_fusions.py:mobile_net --check`."""
    return (torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(1)),)


# ---- this example's own rule -------------------------------------------------------------------


def one_and_floating(m: fxrewrite.Match) -> bool:
    """The constant is 1 and x is floating point (F.silu refuses integer tensors)."""
    if m["one"] != 1:
        return False
    try:
        return m["x"].dtype.is_floating_point
    except fxrewrite.MetadataError:
        return True  # soft guard: declared in the domain for the property checker


@fxrewrite.rule(where=one_and_floating, tolerance={"rtol": 1e-5, "atol": 1e-6},
                domain={"dtypes": (torch.float32, torch.float64), "literals": {"one": (1, 1.0)}})
def silu_from_exp(x, one: float):
    "Replaces x / (1 + exp(-x)) by silu(x)."
    return x / (one + torch.exp(-x))


@silu_from_exp.replacement
def silu_from_exp(x, one: float):
    return F.silu(x)


def all_rules() -> fxrewrite.RuleSet:
    """The shipped standard library plus ``silu_from_exp``."""
    return fxrewrite.load_rules() + fxrewrite.RuleSet([silu_from_exp])


#: The rules that fire on the traced `mobile_net()` (two blocks), with how often: library rules and silu_from_exp.
EXPECTED_TRACED = {"conv_bn_fold": 7, "hardswish_from_relu6": 2, "silu_from_sigmoid": 2, "hardsigmoid_from_relu6": 2,
                   "relu6_from_clamp": 1, "gelu_erf": 1, "mish_from_softplus": 1, "leaky_relu_from_where": 1,
                   "silu_from_exp": 1}


# ---- the script --------------------------------------------------------------------------------


def fired(report: fxrewrite.Report) -> dict[str, int]:
    return {name: n for name, n in report.applied.items() if n}


def main() -> dict[str, fxrewrite.RewriteResult]:
    rules = all_rules()
    model = mobile_net(blocks=1)
    (x,) = example_inputs()
    result = fxrewrite.rewrite(model, rules, example_inputs=(x,))
    print("before:", torch.fx.symbolic_trace(model).code)
    print("after:", result.code)
    print("fired:", fired(result.report))
    with torch.no_grad():
        torch.testing.assert_close(result.module(x), model(x), rtol=1e-4, atol=1e-5)
    print("outputs match (eval mode)")

    program = torch.export.export(model, (x,))
    exported = fxrewrite.rewrite(program.module(), rules)
    print("\ntorch.export graph:", fired(exported.report))
    with torch.no_grad():
        torch.testing.assert_close(exported.module(x), model(x), rtol=1e-4, atol=1e-5)
    print("outputs match")
    traced_only = [name for name in fired(result.report) if name not in fired(exported.report)]
    print("fired on the traced graph only:", ", ".join(traced_only) or "none")
    if traced_only:
        print(fxrewrite.explain(program.module(), fxrewrite.RuleSet([rules[name] for name in traced_only]),
                                misses=1))
    return {"traced": result, "export": exported}


if __name__ == "__main__":
    main()
