"""DeepNorm (Wang et al. 2022, "DeepNet: Scaling Transformers to 1,000 Layers").

Post-norm with the residual up-weighted by ``alpha`` and the branch weights initialised down by
``beta``, both set from the depth so that updates stay bounded in very deep stacks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from brickwork.checks import InRange, PositiveFloat
from brickwork.errors import ConfigError

from .base import Branch, ResidualStyle, apply_norm, register_residual

PARTS = ("encoder", "decoder")


def _check_layers(value: object, option: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"must be a non-negative integer, got {value!r}", option)


def deepnorm_coefficients(
    num_encoder_layers: int, num_decoder_layers: int, part: str | None = None
) -> tuple[float, float]:
    """(alpha, beta) for the ``part`` ("encoder" or "decoder") of a model with N encoder and M decoder layers.

    Encoder-only: ``(2N)^(1/4), (8N)^(-1/4)``; decoder-only: ``(2M)^(1/4), (8M)^(-1/4)``; encoder of an
    encoder-decoder: ``0.81 (N^4 M)^(1/16), 0.87 (N^4 M)^(-1/16)``; its decoder: ``(3M)^(1/4), (12M)^(-1/4)``.
    ``part`` may be left out when only one of the counts is non-zero.
    """
    n, m = num_encoder_layers, num_decoder_layers
    _check_layers(n, "num_encoder_layers")
    _check_layers(m, "num_decoder_layers")
    if n == 0 and m == 0:
        raise ConfigError("deepnorm needs num_encoder_layers or num_decoder_layers > 0", "num_encoder_layers")
    if part is None:
        if n and m:
            raise ConfigError("an encoder-decoder needs part set", "part", PARTS)
        part = "encoder" if n else "decoder"
    if part not in PARTS:
        raise ConfigError(f"unknown part {part!r}", "part", PARTS, part)
    if (part == "encoder" and n == 0) or (part == "decoder" and m == 0):
        raise ConfigError(f"part {part!r} has no layers ({n} encoder, {m} decoder)", "part")
    if n and m:
        if part == "encoder":
            return 0.81 * (n**4 * m) ** (1 / 16), 0.87 * (n**4 * m) ** (-1 / 16)
        return (3 * m) ** 0.25, (12 * m) ** -0.25
    layers = n or m
    return (2 * layers) ** 0.25, (8 * layers) ** -0.25


@register_residual("deepnorm")
class DeepNormResidual(ResidualStyle):
    """``x = norm(alpha * x + fn(x))`` for each branch.

    Give ``alpha`` (and ``beta``, default 1) directly, or the layer counts (and ``part`` for an
    encoder-decoder) to take both from :func:`deepnorm_coefficients`. ``beta`` is kept for
    :func:`deepnorm_init_`, which must be applied to the model once after initialisation.
    """

    def __init__(
        self,
        alpha: PositiveFloat | None = None,
        beta: PositiveFloat | None = None,
        num_encoder_layers: int = 0,
        num_decoder_layers: int = 0,
        part: str | None = None,
    ) -> None:
        super().__init__()
        if alpha is None:
            alpha, beta = deepnorm_coefficients(num_encoder_layers, num_decoder_layers, part)
        self.alpha = float(alpha)
        self.beta = 1.0 if beta is None else float(beta)

    @staticmethod
    def check_options(options: Any) -> None:
        n, m, part = options.num_encoder_layers, options.num_decoder_layers, options.part
        if n != 0 or m != 0 or part is not None:
            if options.alpha is not None or options.beta is not None:
                raise ConfigError("give alpha/beta or the layer counts, not both", "alpha")
            deepnorm_coefficients(n, m, part)
        elif options.alpha is None:
            raise ConfigError("deepnorm needs alpha, or num_encoder_layers / num_decoder_layers to derive it",
                              "alpha")  # fmt: skip

    def forward(self, x: torch.Tensor, branches: Sequence[Branch]) -> torch.Tensor:
        for norm, fn in branches:
            x = apply_norm(norm, self.alpha * x + fn(x))
        return x

    def extra_repr(self) -> str:
        return f"alpha={self.alpha:.4g}, beta={self.beta:.4g}"


@torch.no_grad()
def deepnorm_init_(model: nn.Module, beta: float) -> list[str]:
    """Multiply by ``beta``, in place, the weights DeepNet down-scales: in every attention layer its
    value projection (the value rows of a fused ``qkv_proj``) and its residual output, and in every
    feedforward each of its ``projections()``. Query/key projections, routers, embeddings and norms
    are left alone. Returns the scaled names.

    Layers say what they hold through ``value_projection()``, ``residual_projections()`` and
    ``projections()`` (:class:`MultiHeadAttention`, the feedforwards), never through their names.
    """
    InRange(0, open_low=True)(beta, "beta")
    scaled = []
    for name, module in model.named_modules():
        prefix = f"{name}." if name else ""
        children: tuple[str, ...] = ()
        if callable(getattr(module, "value_projection", None)):
            values = module.value_projection()
            if values is not None:
                linear, layout = values
                child = next(n for n, c in module.named_children() if c is linear)
                if layout is None:
                    linear.weight.mul_(beta)
                    scaled.append(prefix + child)
                else:
                    layout.value_rows(linear.weight).mul_(beta)
                    scaled.append(f"{prefix}{child} (value rows)")
            children = module.residual_projections()
        elif callable(getattr(module, "projections", None)):
            children = module.projections()
        for child in children:
            getattr(module, child).weight.mul_(beta)
            scaled.append(prefix + child)
    return scaled
