"""Weight init schemes, chosen by the spec's ``init`` key and applied after a model is built
(:func:`init_model`).

Each scheme walks the modules in their registration order and draws from torch's global RNG, so
``torch.manual_seed(s)`` before ``build_model`` gives the same weights every time. Shared (tied)
parameters are initialised once, by their first owner. A padded vocabulary (``vocab_multiple``) draws
for its real rows only, so it gets the weights of the unpadded model, and zero padding rows.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from brickwork.checks import Flag, PositiveFloat
from brickwork.components.residual import NORM_REGISTRY, DeepNormResidual, deepnorm_init_
from brickwork.layout.vocab_padding import PADDED_ATTR
from brickwork.registry import Registry


class InitScheme:
    """Base of the init schemes: ``apply(model, num_layers)`` overwrites the model's parameters.

    A scheme's options are its typed ``__init__`` parameters, checked through the dataclass the
    factory derives from them (components/configurable.py).
    """

    def weight_std(self, module_name: str, weight: torch.Tensor) -> float:
        raise NotImplementedError

    def apply(self, model: nn.Module, num_layers: int) -> None:
        """Initialise every parameter of ``model``; ``num_layers`` is the depth of its deepest stack."""
        self.num_layers = max(num_layers, 1)
        self.residual_outputs = residual_outputs(model)
        seen: set[int] = set()
        with torch.no_grad():
            for name, module in model.named_modules():
                paddings = getattr(module, PADDED_ATTR, {})
                for param_name, param in module.named_parameters(recurse=False):
                    if id(param) in seen:
                        continue
                    seen.add(id(param))
                    padding = paddings.get(param_name)
                    if padding is None:
                        self._init_parameter(name, module, param_name, param)
                        continue
                    # A padded vocabulary's real rows take the draws of an unpadded one; the padding is 0.
                    real = param.new_empty((padding.vocab, *param.shape[1:]))
                    self._init_parameter(name, module, param_name, real)
                    param.copy_(padding.pad(real))

    def _init_parameter(self, name: str, module: nn.Module, param_name: str, param: torch.Tensor) -> None:
        if is_norm(module):
            # Norm gains start at one and shifts at zero, whatever the scheme.
            param.fill_(1.0 if param_name == "weight" else 0.0)
        elif param.dim() == 1:
            if param_name == "bias":
                param.zero_()
        else:
            param.normal_(0.0, self.weight_std(name, param))


def init_model(model: nn.Module, scheme: InitScheme, num_layers: int) -> None:
    """Initialise ``model`` by ``scheme`` (``num_layers``: the depth of its deepest stack), then
    down-scale the branches of its deepnorm blocks by their ``beta``, as DeepNet does whatever the
    scheme."""
    scheme.apply(model, num_layers)
    for module in model.modules():
        residual = getattr(module, "residual", None)
        if isinstance(residual, DeepNormResidual) and residual.beta != 1.0:
            deepnorm_init_(module, residual.beta)


def is_norm(module: nn.Module) -> bool:
    """Whether ``module`` is a normalisation layer (a registered norm or one of torch's)."""
    registered = tuple(NORM_REGISTRY.get(n) for n in NORM_REGISTRY.names())
    return isinstance(module, (*registered, nn.LayerNorm, nn.RMSNorm, nn.GroupNorm))


def fans(weight: torch.Tensor) -> tuple[int, int]:
    """(fan_in, fan_out) of a weight laid out [out, in, *kernel], as torch.nn.init counts them."""
    receptive = weight[0][0].numel() if weight.dim() > 2 else 1
    return weight.shape[1] * receptive, weight.shape[0] * receptive


def residual_outputs(model: nn.Module) -> set[str]:
    """Names of the layers whose output is added straight back onto the residual stream, as each
    attention layer and feedforward declares them (``residual_projections()``)."""
    found = set()
    for name, module in model.named_modules():
        declare = getattr(module, "residual_projections", None)
        if callable(declare):
            found.update(f"{name}.{child}" if name else child for child in declare())
    return found


INIT_REGISTRY: Registry[InitScheme] = Registry("init scheme", InitScheme)


def register_init(name: str):
    """Decorator registering an :class:`InitScheme` subclass under ``name``."""
    return INIT_REGISTRY.register(name)


@register_init("normal")
class NormalInit(InitScheme):
    """Every weight N(0, std), biases zero (GPT-2, BERT).

    With ``scaled_residual`` the projections that write back onto the residual stream use
    ``std / sqrt(2 * num_layers)``, as GPT-2 does, so the stream's variance does not grow with depth.
    """

    def __init__(self, std: PositiveFloat = 0.02, scaled_residual: Flag = False) -> None:
        self.std = std
        self.scaled_residual = scaled_residual

    def weight_std(self, module_name: str, weight: torch.Tensor) -> float:
        if self.scaled_residual and module_name in self.residual_outputs:
            return self.std / math.sqrt(2 * self.num_layers)
        return self.std


@register_init("small_init")
class SmallInit(InitScheme):
    """N(0, sqrt(2 / (5 d))) (Nguyen & Salazar 2019, "Transformers without Tears").

    With ``scaled_residual`` the residual outputs use 2 / (num_layers * sqrt(d)) (Wang 2021, as in
    GPT-NeoX), ``d`` being the input width of the weight.
    """

    def __init__(self, scaled_residual: Flag = False) -> None:
        self.scaled_residual = scaled_residual

    def weight_std(self, module_name: str, weight: torch.Tensor) -> float:
        dim = fans(weight)[0]
        if self.scaled_residual and module_name in self.residual_outputs:
            return 2.0 / (self.num_layers * math.sqrt(dim))
        return math.sqrt(2.0 / (5.0 * dim))


@register_init("xavier")
class XavierInit(InitScheme):
    """Weights N(0, gain * sqrt(2 / (fan_in + fan_out))) (Glorot & Bengio 2010); embeddings N(0, d^-1/2)."""

    def __init__(self, gain: PositiveFloat = 1.0) -> None:
        self.gain = gain

    def _init_parameter(self, name: str, module: nn.Module, param_name: str, param: torch.Tensor) -> None:
        if isinstance(module, nn.Embedding):
            param.normal_(0.0, module.embedding_dim**-0.5)
        else:
            super()._init_parameter(name, module, param_name, param)

    def weight_std(self, module_name: str, weight: torch.Tensor) -> float:
        fan_in, fan_out = fans(weight)
        return self.gain * math.sqrt(2.0 / (fan_in + fan_out))


@register_init("none")
class NoInit(InitScheme):
    """Keep each module's own PyTorch default init."""

    def apply(self, model: nn.Module, num_layers: int) -> None:
        return None
