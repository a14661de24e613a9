"""Hand-written activation functions fused into the torch function that computes them.

Each pattern is the formula as models write it (GPT-2's tanh GELU, BERT's erf GELU, MobileNet's
hardswish, ...); the torch function computes the same value in one kernel, rounded differently
(declared tolerance). The constants of a formula are literal captures checked by a guard, so
``1`` and ``1.0``, or ``math.sqrt(2 / math.pi)`` and ``0.7978845608``, all match.

The fused functions reject integer tensors (``F.silu`` on int64 raises) where the formula
promotes them to float, so every rule here is restricted to floating-point inputs: a soft
guard when the graph has dtypes, the declared domain otherwise (see _fxrewrite_stdlib.py).

transformers' activations: ``gelu_new`` (NewGELUActivation), GELUTanh's Python form and
AccurateGELUActivation are the formula ``gelu_tanh`` matches; FastGELUActivation
(``x * 0.7978845608 * (1 + 0.044715 * x * x)`` inside the tanh) is ``gelu_tanh_fast`` (activations.fxr);
``gelu_pytorch_tanh``, ``gelu`` and ``silu`` call the torch function already.

No rule, on purpose:

* ``quick_gelu`` (``x * sigmoid(1.702 * x)``, CLIP) has no fused torch op. ``silu(1.702 * x) / 1.702``
  computes it with as many elementwise ops, rounded differently, so a rule would gain nothing.
* SiLU-gated MLPs (Llama's ``down(silu(gate(x)) * up(x))``) already call ``F.silu``; core torch has
  no fused gated-MLP op (no ``swiglu``) to rewrite the product into.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

import fxrewrite
from _fxrewrite_stdlib import FLOATS, finite, floating, literal_equals

_FLOAT = {"dtypes": FLOATS}
_FUSED = {"rtol": 1e-5, "atol": 1e-6}
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


@fxrewrite.rule(where=floating("x"), tolerance=_FUSED, domain=_FLOAT)
def silu_from_sigmoid(x):
    "Replaces x * sigmoid(x) by silu(x)."
    return x * torch.sigmoid(x)


@silu_from_sigmoid.replacement
def silu_from_sigmoid(x):
    return F.silu(x)


# 1 / y is reciprocal(y) to the matcher (however the 1 is written, and as export writes it); the
# 1 added to exp(-x) is a literal capture, so that 1 and 1.0 both match
@fxrewrite.rule(where=(literal_equals("b", 1), floating("x")), tolerance=_FUSED,
                domain={**_FLOAT, "literals": {"b": (1, 1.0)}})
def sigmoid_from_exp(x, b: float):
    "Replaces 1 / (1 + exp(-x)) by sigmoid(x)."
    return 1 / (b + torch.exp(torch.neg(x)))


@sigmoid_from_exp.replacement
def sigmoid_from_exp(x, b: float):
    return torch.sigmoid(x)


_GELU_TANH_GUARDS = (
    literal_equals("half", 0.5), literal_equals("one", 1), literal_equals("c", _SQRT_2_OVER_PI, rel=1e-6),
    literal_equals("k", 0.044715, rel=1e-6), literal_equals("p", 3), floating("x"),
)


@fxrewrite.rule(where=_GELU_TANH_GUARDS, tolerance={"rtol": 1e-5, "atol": 1e-5},
                domain={**_FLOAT, "min_value": -1e3, "max_value": 1e3,
                        "literals": {"half": (0.5,), "one": (1, 1.0), "c": (_SQRT_2_OVER_PI,), "k": (0.044715,),
                                     "p": (3, 3.0)}})
def gelu_tanh(x, half: float, one: float, c: float, k: float, p: float):
    "Replaces 0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x ** 3))) by gelu(x, approximate='tanh')."
    return half * x * (one + torch.tanh(c * (x + k * torch.pow(x, p))))


@gelu_tanh.replacement
def gelu_tanh(x, half: float, one: float, c: float, k: float, p: float):
    return F.gelu(x, approximate="tanh")


# F.gelu(inf) is nan where the formula gives inf, and F.gelu overflows near the largest float:
# finite inputs of moderate size only.
_GELU_ERF_DOMAIN = {**_FLOAT, "special_values": False, "min_value": -1e30, "max_value": 1e30,
                    "literals": {"half": (0.5,), "one": (1, 1.0), "r": (math.sqrt(2.0),), "s": (1 / math.sqrt(2.0),)}}


@fxrewrite.rule(where=(literal_equals("half", 0.5), literal_equals("one", 1),
                       literal_equals("r", math.sqrt(2.0), rel=1e-6), floating("x")),
                tolerance=_FUSED, domain=_GELU_ERF_DOMAIN)
def gelu_erf(x, half: float, one: float, r: float):
    "Replaces x * 0.5 * (1 + erf(x / sqrt(2))) by gelu(x)."
    return x * half * (one + torch.erf(x / r))


@gelu_erf.replacement
def gelu_erf(x, half: float, one: float, r: float):
    return F.gelu(x)


@fxrewrite.rule(where=(literal_equals("half", 0.5), literal_equals("one", 1),
                       literal_equals("s", 1 / math.sqrt(2.0), rel=1e-6), floating("x")),
                tolerance=_FUSED, domain=_GELU_ERF_DOMAIN)
def gelu_erf_scaled(x, half: float, one: float, s: float):
    "Replaces x * 0.5 * (1 + erf(x * (1 / sqrt(2)))) by gelu(x)."
    return x * half * (one + torch.erf(x * s))


@gelu_erf_scaled.replacement
def gelu_erf_scaled(x, half: float, one: float, s: float):
    return F.gelu(x)


_HARD_DOMAIN = {**_FLOAT, "literals": {"three": (3, 3.0), "six": (6, 6.0)}}
_HARD_GUARDS = (literal_equals("three", 3), literal_equals("six", 6), floating("x"))


@fxrewrite.rule(where=_HARD_GUARDS, tolerance=_FUSED, domain=_HARD_DOMAIN)
def hardswish_from_relu6(x, three: float, six: float):
    "Replaces x * relu6(x + 3) / 6 by hardswish(x)."
    return x * F.relu6(x + three) / six


@hardswish_from_relu6.replacement
def hardswish_from_relu6(x, three: float, six: float):
    return F.hardswish(x)


@fxrewrite.rule(where=_HARD_GUARDS, tolerance=_FUSED, domain=_HARD_DOMAIN)
def hardsigmoid_from_relu6(x, three: float, six: float):
    "Replaces relu6(x + 3) / 6 by hardsigmoid(x)."
    return F.relu6(x + three) / six


@hardsigmoid_from_relu6.replacement
def hardsigmoid_from_relu6(x, three: float, six: float):
    return F.hardsigmoid(x)


# F.hardswish computes x * (x + 3) ... / 6, which overflows for |x| > 5e37 where x * 1 does not.
@fxrewrite.rule(where=floating("x"), tolerance=_FUSED, domain={**_FLOAT, "min_value": -1e30, "max_value": 1e30})
def hardswish_from_hardsigmoid(x):
    "Replaces x * hardsigmoid(x) by hardswish(x)."
    return x * F.hardsigmoid(x)


@hardswish_from_hardsigmoid.replacement
def hardswish_from_hardsigmoid(x):
    return F.hardswish(x)


@fxrewrite.rule(where=floating("x"), tolerance=_FUSED, domain=_FLOAT)
def mish_from_softplus(x):
    "Replaces x * tanh(softplus(x)) by mish(x)."
    return x * torch.tanh(F.softplus(x))


@mish_from_softplus.replacement
def mish_from_softplus(x):
    return F.mish(x)


# The clamps below are exact; only the dtype needs a guard (relu on bool raises, and a float
# bound promotes an integer tensor where relu6 keeps its dtype).


@fxrewrite.rule(where=(literal_equals("low", 0), literal_equals("high", 6), floating("x")),
                domain={**_FLOAT, "literals": {"low": (0, 0.0), "high": (6, 6.0)}})
def relu6_from_clamp(x, low: float, high: float):
    "Replaces clamp(x, 0, 6) by relu6(x)."
    return torch.clamp(x, low, high)


@relu6_from_clamp.replacement
def relu6_from_clamp(x, low: float, high: float):
    return F.relu6(x)


@fxrewrite.rule(where=(literal_equals("low", 0), floating("x")),
                domain={**_FLOAT, "literals": {"low": (0, 0.0)}})
def relu_from_clamp(x, low: float):
    "Replaces clamp(x, min=0) by relu(x)."
    return torch.clamp(x, min=low)


@relu_from_clamp.replacement
def relu_from_clamp(x, low: float):
    return torch.relu(x)


@fxrewrite.rule(where=(literal_equals("zero", 0), finite("slope"), floating("x")),
                domain={**_FLOAT, "literals": {"zero": (0, 0.0)}})
def leaky_relu_from_where(x, zero: float, slope: float):
    "Replaces where(x > 0, x, x * slope) by leaky_relu(x, slope)."
    return torch.where(x > zero, x, x * slope)


@leaky_relu_from_where.replacement
def leaky_relu_from_where(x, zero: float, slope: float):
    return F.leaky_relu(x, slope)
