"""Swap every ``nn.Linear`` for an int8 weight-quantised linear layer, through a typed capture.

The pattern is one call, ``lin(x)``, whose parameter is annotated ``lin: nn.Linear``: it matches
every submodule call whose module is an instance of ``nn.Linear`` and hands the module to the
replacement. The replacement runs at rewrite time: it quantises the module's weight and calls a
new :class:`QuantizedLinear`, which fxrewrite registers in the rewritten module in place of the
Linear it no longer uses.

Quantisation is symmetric and per output channel: row ``j`` of the weight gets the scale
``s_j = max_i |w_ji| / 127`` and is stored as ``q_ji = round(w_ji / s_j)`` in int8 (4x less
memory than float32); ``forward`` dequantises (``q * s``) and calls ``F.linear``.

**Tolerance.** Rounding moves each weight by at most ``s_j / 2``, so for one layer and any input
``x`` every output obeys ``|y_q - y|_j <= s_j / 2 * sum_i |x_i|`` (plus float32 round-off):
:func:`error_bound`, checked layer by layer. That is the worst case, all rounding errors
aligned. Independent rounding errors, uniform in ``[-s_j/2, s_j/2]``, give output ``j`` an error
of standard deviation ``s_j / sqrt(12) * ||x||_2``, against an output of typical size
``rms(w_j) * ||x||_2``: a relative error ``r = s_j / (sqrt(12) * rms(w_j))`` per layer, about
0.4% for these weights (:func:`relative_error_per_layer`). An error entering a layer is carried
along with the signal, so the layers' errors add in quadrature: ``sqrt(sum r_l^2)`` of the output's
RMS, 0.7% for three layers (:func:`predicted_error`; measured: 0.6% to 0.8% over seeds and
sizes). The end-to-end check allows :data:`SIGMAS` = 8 times that per element (about 5.5% of the
output RMS): far beyond rounding, yet tight enough to catch real mistakes (measured on this
model, a scale along the wrong axis, a lost bias and int8 overflow are RMS errors of 9%, 18%
and 100%, and their largest errors several times that).

On a ``torch.export`` graph modules are inlined (``aten.linear``), so the module capture has
nothing to match; :data:`quantize_linear_functional` matches ``F.linear(x, w, b)`` where ``w``
and ``b`` are constant attributes of the model and builds the same module from their values.

Run:  python examples/05_quantized_linear.py
CLI:  fxrewrite apply examples/05_quantized_linear.py:mlp --rules examples/05_quantized_linear.py --check
      (exits 1: --check compares with rtol=1e-4, and quantisation is approximate by design)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import fx, nn

import fxrewrite

#: End-to-end tolerance, in standard deviations of the predicted rounding error (see above).
SIGMAS = 8.0


class QuantizedLinear(nn.Module):
    """A linear layer with an int8 weight, symmetric per output channel, dequantised in forward."""

    def __init__(self, qweight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.out_features, self.in_features = qweight.shape
        self.register_buffer("qweight", qweight)
        self.register_buffer("scale", scale)
        self.register_buffer("bias", bias)

    @classmethod
    def from_float(cls, weight: torch.Tensor, bias: torch.Tensor | None = None) -> QuantizedLinear:
        weight = weight.detach()
        scale = weight.abs().amax(dim=1).clamp_min(torch.finfo(weight.dtype).tiny) / 127.0
        qweight = torch.round(weight / scale[:, None]).clamp(-127, 127).to(torch.int8)
        return cls(qweight, scale, None if bias is None else bias.detach().clone())

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> QuantizedLinear:
        return cls.from_float(linear.weight, linear.bias)

    def dequantized_weight(self) -> torch.Tensor:
        return self.qweight.to(self.scale.dtype) * self.scale[:, None]

    def forward(self, x):
        return F.linear(x, self.dequantized_weight(), self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, int8"


def error_bound(layer: QuantizedLinear, x: torch.Tensor) -> torch.Tensor:
    """Worst-case |QuantizedLinear(x) - Linear(x)| for each output element: s_j / 2 * sum_i |x_i|."""
    return x.abs().sum(-1, keepdim=True) * (layer.scale / 2)


def relative_error_per_layer(weight: torch.Tensor) -> float:
    """RMS over output channels of s_j / (sqrt(12) * rms(w_j)): the relative output error that
    independent rounding errors give one layer."""
    weight = weight.detach()
    scale = weight.abs().amax(dim=1) / 127.0
    rms = weight.pow(2).mean(dim=1).sqrt().clamp_min(torch.finfo(weight.dtype).tiny)
    return float((scale / (12 ** 0.5 * rms)).pow(2).mean().sqrt())


def predicted_error(model: nn.Module) -> float:
    """The relative RMS output error of quantising every Linear of ``model``: the layers' errors
    added in quadrature."""
    return sum(relative_error_per_layer(m.weight) ** 2 for m in model.modules() if isinstance(m, nn.Linear)) ** 0.5


# ---- the rules ---------------------------------------------------------------------------------


def floating_weight(m: fxrewrite.Match) -> bool:
    """A materialised (not lazy) floating-point weight."""
    lin = m["lin"]
    return not nn.parameter.is_lazy(lin.weight) and lin.weight.dtype.is_floating_point


@fxrewrite.rule(where=floating_weight)
def quantize_linear(x, lin: nn.Linear):
    "Replaces an nn.Linear by a QuantizedLinear (int8 weight, per-channel symmetric scales)."
    return lin(x)


@quantize_linear.replacement
def quantize_linear(x, lin: nn.Linear):
    return QuantizedLinear.from_linear(lin)(x)


def _attribute(node: fx.Node) -> torch.Tensor | None:
    """The tensor a ``get_attr`` node reads, else None."""
    if node.op != "get_attr":
        return None
    value = node.graph.owning_module
    for part in str(node.target).split("."):
        value = getattr(value, part, None)
    return value if isinstance(value, torch.Tensor) else None


def constant_float_weights(m: fxrewrite.Match) -> bool:
    """``w`` (and ``b``) are floating-point tensors stored in the model, not computed."""
    names = [n for n in ("w", "b") if n in m]
    values = [_attribute(m.node(n)) for n in names]
    return all(v is not None and v.dtype.is_floating_point for v in values) and values[0].dim() == 2


@fxrewrite.rule(where=constant_float_weights)
def quantize_linear_functional(x, w, b):
    "Replaces F.linear(x, w, b) with constant w, b (exported graphs) by a QuantizedLinear."
    return F.linear(x, w, b)


@quantize_linear_functional.replacement
def quantize_linear_functional(x, w, b):
    return QuantizedLinear.from_float(_attribute(w.node), _attribute(b.node))(x)


@fxrewrite.rule(where=constant_float_weights)
def quantize_linear_functional_no_bias(x, w):
    "Replaces F.linear(x, w) with a constant w (exported graphs) by a QuantizedLinear."
    return F.linear(x, w)


@quantize_linear_functional_no_bias.replacement
def quantize_linear_functional_no_bias(x, w):
    return QuantizedLinear.from_float(_attribute(w.node))(x)


RULES = fxrewrite.RuleSet([quantize_linear, quantize_linear_functional, quantize_linear_functional_no_bias])


# ---- the model ---------------------------------------------------------------------------------


class MLP(nn.Module):
    def __init__(self, features: int = 64, hidden: int = 256, classes: int = 10) -> None:
        super().__init__()
        self.fc1 = nn.Linear(features, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.head = nn.Linear(hidden, classes, bias=False)

    def forward(self, x):
        return self.head(F.gelu(self.fc2(F.gelu(self.fc1(x)))))


def mlp(seed: int = 0, **sizes: int) -> MLP:
    """The ``fxrewrite apply`` target."""
    torch.manual_seed(seed)
    return MLP(**sizes).eval()


def example_inputs(batch: int = 8, features: int = 64) -> tuple[torch.Tensor]:
    return (torch.randn(batch, features, generator=torch.Generator().manual_seed(1)),)


# ---- checks ----------------------------------------------------------------------------------------


def linear_layers(module: nn.Module) -> list[str]:
    return [name for name, m in module.named_modules() if isinstance(m, nn.Linear)]


def check_layer_bounds(model: MLP, rewritten: fx.GraphModule, x: torch.Tensor) -> float:
    """Each quantised layer, fed the input the original layer sees, is within :func:`error_bound`;
    returns the largest fraction of the bound used."""
    inputs: dict[str, torch.Tensor] = {}
    hooks = [getattr(model, name).register_forward_pre_hook(
                 lambda mod, args, name=name: inputs.__setitem__(name, args[0]))
             for name in ("fc1", "fc2", "head")]
    try:
        with torch.no_grad():
            model(x)
    finally:
        for hook in hooks:
            hook.remove()
    quantized = [m for m in rewritten.modules() if isinstance(m, QuantizedLinear)]
    used = 0.0
    with torch.no_grad():
        for name, layer in zip(("fc1", "fc2", "head"), quantized):
            error = (layer(inputs[name]) - getattr(model, name)(inputs[name])).abs()
            bound = error_bound(layer, inputs[name]) + 1e-5
            assert bool((error <= bound).all()), f"{name}: error exceeds the rounding bound"
            used = max(used, float((error / bound).max()))
    return used


def assert_end_to_end(actual: torch.Tensor, expected: torch.Tensor, model: nn.Module) -> float:
    """Every output is within SIGMAS predicted standard deviations of the reference; returns the
    measured relative RMS error."""
    rms = float(expected.pow(2).mean().sqrt())
    torch.testing.assert_close(actual, expected, rtol=0.0, atol=SIGMAS * predicted_error(model) * rms)
    return float((actual - expected).pow(2).mean().sqrt()) / rms


# ---- the script --------------------------------------------------------------------------------


def main() -> dict[str, fxrewrite.RewriteResult]:
    model = mlp()
    (x,) = example_inputs()
    result = fxrewrite.rewrite(model, RULES)
    print("before:", fx.symbolic_trace(model).code)
    print("after:", result.code)
    print(result.report)
    result.module.graph.lint()
    assert linear_layers(result.module) == [], linear_layers(result.module)
    print("modules:", {name: type(m).__name__ for name, m in result.module.named_children()})

    used = check_layer_bounds(model, result.module, x)
    print(f"each layer within its worst-case rounding bound (at most {used:.0%} of it used)")
    with torch.no_grad():
        relative = assert_end_to_end(result.module(x), model(x), model)
    print(f"relative RMS error {relative:.2%} (predicted {predicted_error(model):.2%}); every output within "
          f"{SIGMAS:.0f} predicted standard deviations")
    weights = sum(m.weight.numel() * 4 for m in model.modules() if isinstance(m, nn.Linear))
    quantized = sum(m.qweight.numel() + m.scale.numel() * 4 for m in result.module.modules()
                    if isinstance(m, QuantizedLinear))
    print(f"weight bytes: {weights} float32 -> {quantized} int8 + scales")

    exported = fxrewrite.rewrite(torch.export.export(model, (x,)).module(), RULES)
    print("\ntorch.export graph:", {name: n for name, n in exported.report.applied.items() if n})
    with torch.no_grad():
        assert_end_to_end(exported.module(x), model(x), model)
    print("outputs match")
    return {"traced": result, "export": exported}


if __name__ == "__main__":
    main()
