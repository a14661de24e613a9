"""Fold BatchNorm into the convolution before it, on a small ResNet-style network.

The pattern captures the two modules by type (``conv: nn.Conv2d``, ``bn: nn.BatchNorm2d``); the
replacement computes the folded weights from them and calls a new ``nn.Conv2d``, which
fxrewrite registers in the rewritten module. Valid in eval mode only, so a guard checks it.

Run:  python examples/02_conv_bn_folding.py
"""

from __future__ import annotations

import torch
from torch import nn

import fxrewrite


def conv_bn_pattern(x, conv: nn.Conv2d, bn: nn.BatchNorm2d):
    return bn(conv(x))


def fold_conv_bn(conv: nn.Conv2d, bn: nn.BatchNorm2d) -> nn.Conv2d:
    """A Conv2d computing bn(conv(x)) for a BatchNorm in eval mode."""
    scale = bn.weight / torch.sqrt(bn.running_var + bn.eps)
    conv_bias = conv.bias if conv.bias is not None else torch.zeros_like(bn.running_mean)
    fused = nn.Conv2d(conv.in_channels, conv.out_channels, conv.kernel_size, conv.stride, conv.padding,
                      conv.dilation, conv.groups, bias=True, padding_mode=conv.padding_mode)
    with torch.no_grad():
        fused.weight.copy_(conv.weight * scale.reshape(-1, 1, 1, 1))
        fused.bias.copy_((conv_bias - bn.running_mean) * scale + bn.bias)
    return fused


def conv_bn_replacement(x, conv: nn.Conv2d, bn: nn.BatchNorm2d):
    return fold_conv_bn(conv, bn)(x)


def in_eval_mode(m: fxrewrite.Match) -> bool:
    return not m["bn"].training and m["bn"].track_running_stats and m["bn"].affine


conv_bn = fxrewrite.Rule.from_functions(
    conv_bn_pattern, conv_bn_replacement, name="conv_bn", where=in_eval_mode,
    doc="Replaces bn(conv(x)) by one convolution with folded weights (eval mode).",
)


class Block(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x):
        h = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(x + self.bn2(self.conv2(h)))


class SmallResNet(nn.Module):
    def __init__(self, channels: int = 8, blocks: int = 2, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, channels, 3, padding=1)
        self.stem_bn = nn.BatchNorm2d(channels)
        self.blocks = nn.Sequential(*(Block(channels) for _ in range(blocks)))
        self.head = nn.Linear(channels, classes)

    def forward(self, x):
        x = torch.relu(self.stem_bn(self.stem(x)))
        x = self.blocks(x)
        return self.head(x.mean(dim=(2, 3)))


def trained_model(seed: int = 0) -> SmallResNet:
    """A model whose BatchNorm statistics are not the defaults, in eval mode."""
    torch.manual_seed(seed)
    model = SmallResNet()
    for module in model.modules():
        if isinstance(module, nn.BatchNorm2d):
            module.running_mean.uniform_(-0.5, 0.5)
            module.running_var.uniform_(0.5, 2.0)
            nn.init.uniform_(module.weight, 0.5, 1.5)
            nn.init.uniform_(module.bias, -0.2, 0.2)
    return model.eval()


def example_inputs() -> tuple[torch.Tensor]:
    """Inputs for `fxrewrite apply examples/02_conv_bn_folding.py:trained_model --check`."""
    return (torch.randn(2, 3, 16, 16),)


def main() -> fxrewrite.RewriteResult:
    model = trained_model()
    x = torch.randn(2, 3, 16, 16)
    result = fxrewrite.rewrite(model, conv_bn)
    print("before:", torch.fx.symbolic_trace(model).code)
    print("after:", result.code)
    print(result.report)
    torch.testing.assert_close(result.module(x), model(x), rtol=1e-4, atol=1e-5)
    print("outputs match (eval mode)")
    return result


if __name__ == "__main__":
    main()
