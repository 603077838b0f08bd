"""xformers' residual wrappers (``Residual``, ``PreNorm``, ``PostNorm``) with brickwork's norms."""

from __future__ import annotations

from collections import namedtuple
from enum import Enum
from typing import Any

import torch
from torch import nn

from brickwork.components.residual import LayerNorm
from brickwork.components.residual.deepnorm import deepnorm_coefficients
from brickwork.xformers._compat import require


class ResidualNormStyle(str, Enum):
    Pre = "pre"
    Post = "post"
    DeepNorm = "deepnorm"


class NormalizationType(str, Enum):
    LayerNorm = "layernorm"
    Skip = "skip"


class Skip(nn.Module):
    """No normalisation."""

    def __init__(self, *_: Any, **__: Any) -> None:
        super().__init__()

    def forward(self, x: torch.Tensor, **_: Any) -> torch.Tensor:
        return x


def get_normalization_layer(normalization_type: NormalizationType | str) -> type[nn.Module]:
    """brickwork's LayerNorm (its kernel picks Triton on CUDA), or :class:`Skip`."""
    return {NormalizationType.LayerNorm: LayerNorm, NormalizationType.Skip: Skip}[
        NormalizationType(normalization_type)
    ]


class RequiresWrappedInputs:
    """Marks modules taking their inputs as one list: ``forward(inputs=[...], **kwargs)``."""


def _call(
    layer: nn.Module, wrapped: bool, inputs: list[torch.Tensor], kwargs: dict[str, Any]
) -> torch.Tensor:
    return layer(inputs=inputs, **kwargs) if wrapped else layer(*inputs, **kwargs)


class Residual(nn.Module, RequiresWrappedInputs):
    """``inputs[0] * scale + layer(inputs)`` (DeepNet's scaled residual when ``scale`` is set)."""

    def __init__(self, layer: nn.Module, scale: float | None = None) -> None:
        super().__init__()
        self.layer, self.scale = layer, scale
        self.wrap_inputs = isinstance(layer, RequiresWrappedInputs)

    def forward(self, inputs: list[torch.Tensor], **kwargs: Any) -> torch.Tensor:
        residue = inputs[0] * self.scale if self.scale is not None else inputs[0]
        return residue + _call(self.layer, self.wrap_inputs, inputs, kwargs)


class _Normed(nn.Module, RequiresWrappedInputs):
    """A norm of ``d_norm`` beside ``sublayer``; PreNorm and PostNorm say where it runs."""

    def __init__(
        self, d_norm: int, sublayer: nn.Module, normalization: NormalizationType | str = "layernorm",
        use_triton: bool = True,
    ) -> None:  # fmt: skip
        super().__init__()
        self.norm = get_normalization_layer(normalization)(d_norm)
        self.sublayer = sublayer
        self.wrap_inputs = isinstance(sublayer, RequiresWrappedInputs)


class PreNorm(_Normed):
    """Normalises every input, then runs ``sublayer``; the same tensor passed several times is
    normalised once (and the results are the same object)."""

    def forward(self, inputs: list[torch.Tensor], **kwargs: Any) -> torch.Tensor:
        require(len(inputs) > 0, "PreNorm needs at least one input")
        if all(x is inputs[0] for x in inputs):
            normed = [self.norm(inputs[0])] * len(inputs)
        else:
            normed = [self.norm(x) for x in inputs]
        return _call(self.sublayer, self.wrap_inputs, normed, kwargs)


class PostNorm(_Normed):
    """Runs ``sublayer``, then normalises its output."""

    def forward(self, inputs: list[torch.Tensor], **kwargs: Any) -> torch.Tensor:
        return self.norm(_call(self.sublayer, self.wrap_inputs, inputs, kwargs))


DeepNormCoefficients = namedtuple("DeepNormCoefficients", ["alpha", "beta"])


def get_deepnorm_coefficients(
    encoder_layers: int, decoder_layers: int
) -> tuple[DeepNormCoefficients | None, DeepNormCoefficients | None]:
    """DeepNet's (alpha, beta) for the encoder and the decoder (None for a part with no layers)."""
    encoder = decoder = None
    if encoder_layers:
        encoder = DeepNormCoefficients(*deepnorm_coefficients(encoder_layers, decoder_layers, "encoder"))
    if decoder_layers:
        decoder = DeepNormCoefficients(*deepnorm_coefficients(encoder_layers, decoder_layers, "decoder"))
    return encoder, decoder
