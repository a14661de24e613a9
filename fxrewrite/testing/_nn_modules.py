"""Modules for module captures: :func:`default_module` builds a small instance of a common
``nn.Module`` class (eval mode, random parameters and statistics), :func:`fit_input_shape`
changes a tensor shape so that a module accepts it. Plain torch, no Hypothesis:
:mod:`fxrewrite.analysis` builds its probes with them too.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

_ACTIVATIONS_WITH_DIM = (nn.Softmax, nn.LogSoftmax, nn.Softmin)


def _randomize_norm(module: Any) -> None:  # Any: its statistics are read by name
    with torch.no_grad():
        if getattr(module, "running_mean", None) is not None:
            module.running_mean.uniform_(-1.0, 1.0)
            module.running_var.uniform_(0.5, 2.0)
        if getattr(module, "weight", None) is not None:
            module.weight.uniform_(0.5, 1.5)
        if getattr(module, "bias", None) is not None:
            module.bias.uniform_(-0.5, 0.5)


def default_module(cls: type[nn.Module], *, width: int, kernel: int, bias: bool,
                   attributes: Mapping[str, Any] | None = None) -> nn.Module | None:
    """A small instance of a common module class (``width`` channels/features), in eval mode
    with random parameters and statistics; ``None`` for a class that needs a factory.
    ``attributes`` are further constructor arguments (``groups``, ``stride``, ``eps``...).

    >>> default_module(nn.Conv2d, width=2, kernel=3, bias=False)
    Conv2d(2, 2, kernel_size=(3, 3), stride=(1, 1), bias=False)
    >>> default_module(nn.ConvTranspose2d, width=2, kernel=1, bias=True, attributes={"groups": 2, "stride": 2})
    ConvTranspose2d(2, 2, kernel_size=(1, 1), stride=(2, 2), groups=2)
    """
    module: nn.Module | None
    make: Any = cls  # module classes take different constructor arguments; checked by _try
    extra = dict(attributes or {})
    if issubclass(cls, (nn.Linear, nn.modules.conv._ConvNd)) and make is not nn.Bilinear:
        args = (width, width) if issubclass(cls, nn.Linear) else (width, width, kernel)
        module = _try(lambda: make(*args, bias=bias, **extra))
    elif issubclass(cls, (nn.modules.batchnorm._NormBase, nn.LayerNorm)):
        module = _try(lambda: cls(width, **extra))
    elif issubclass(cls, nn.GroupNorm):
        module = _try(lambda: cls(1, width, **extra))
    elif issubclass(cls, _ACTIVATIONS_WITH_DIM):
        module = _try(lambda: cls(dim=-1))
    else:
        module = _try(cls)
    if module is None:
        return None
    _randomize_norm(module)
    return module.eval()


def _try(make: Callable[[], nn.Module]) -> nn.Module | None:
    try:
        return make()
    except Exception:  # a constructor that needs arguments we cannot guess
        return None


def fit_input_shape(module: nn.Module, shape: Sequence[int]) -> tuple[int, ...]:
    """``shape`` changed so that ``module`` accepts a tensor of it: channels or features taken
    from the module, spatial sizes at least the kernel's extent. Ranks the module does not
    accept are left alone (the draw is then rejected).

    >>> fit_input_shape(nn.Conv2d(3, 4, 3), (1, 1, 2, 5))
    (1, 3, 3, 5)
    """
    out = list(shape)
    rank = len(out)
    if isinstance(module, nn.Linear) and rank >= 1:
        out[-1] = module.in_features
    elif isinstance(module, nn.modules.conv._ConvNd):
        _fit_conv(module, out)
    elif isinstance(module, nn.modules.batchnorm._BatchNorm) and rank >= 2:
        out[1] = module.num_features
    elif isinstance(module, nn.modules.instancenorm._InstanceNorm):
        _fit_instance_norm(module, out)
    elif isinstance(module, nn.LayerNorm) and rank >= len(module.normalized_shape):
        out[rank - len(module.normalized_shape):] = list(module.normalized_shape)
    elif isinstance(module, nn.GroupNorm) and rank >= 2:
        out[1] = module.num_channels
    return tuple(out)


def _fit_instance_norm(module: nn.modules.instancenorm._InstanceNorm, out: list[int]) -> None:
    """Channels at 1 of a batched input (N, C, *spatial), at 0 of an unbatched one; normalized
    over its own elements (no running statistics), an instance needs more than one of them."""
    unbatched = module._get_no_batch_dim()  # C and the spatial dimensions
    if len(out) not in (unbatched, unbatched + 1):
        return
    out[len(out) - unbatched] = module.num_features
    if not module.track_running_stats:
        out[-1] = max(out[-1], 2)


def _fit_conv(module: nn.modules.conv._ConvNd, out: list[int]) -> None:
    d = len(module.kernel_size)
    if len(out) not in (d + 1, d + 2):
        return
    out[-(d + 1)] = module.in_channels
    padding = module.padding if isinstance(module.padding, tuple) else (0,) * d
    for i in range(d):
        need = 1 if module.transposed else module.dilation[i] * (module.kernel_size[i] - 1) + 1 - 2 * padding[i]
        out[len(out) - d + i] = max(out[len(out) - d + i], need)
