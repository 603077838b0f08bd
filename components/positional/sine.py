"""Fixed sinusoidal positions (Vaswani et al. 2017), added to token embeddings."""

from __future__ import annotations

import torch

from brickwork.checks import PositiveFloat, PositiveInt

from .base import PositionalEncoding, check_offset, check_positions, register_positional


def sinusoidal_table(positions: torch.Tensor, dim_model: int, base: float = 10000.0) -> torch.Tensor:
    """positions ``[T]`` -> ``[T, dim_model]`` float64: ``sin(p / base^(2i/d))`` at even columns ``2i``,
    ``cos`` of the same angle at odd columns ``2i+1``."""
    exponents = torch.arange(0, dim_model, 2, dtype=torch.float64, device=positions.device) / dim_model
    inv_freq = base**-exponents
    angles = positions.to(torch.float64)[:, None] * inv_freq[None, :]
    table = torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(-2)
    return table[:, :dim_model]


@register_positional("sine")
class SinePositionalEncoding(PositionalEncoding):
    """``x + PE[offset : offset + T]`` (``x + PE[positions]`` given ``positions`` [B, T]); x
    ``[B, T, dim_model]`` (any leading dims). No parameters, no length limit: the table is computed for
    the positions asked."""

    def __init__(self, dim_model: PositiveInt, base: PositiveFloat = 10000.0) -> None:
        super().__init__()
        self.dim_model = dim_model
        self.base = float(base)

    def forward(
        self, x: torch.Tensor, offset: int = 0, positions: torch.Tensor | None = None
    ) -> torch.Tensor:
        if x.dim() < 2 or x.shape[-1] != self.dim_model:
            raise ValueError(f"expected x of shape [B, T, {self.dim_model}], got {tuple(x.shape)}")
        if positions is not None:
            check_positions(positions, x.shape[-2])
            table = sinusoidal_table(positions.to(x.device).flatten(), self.dim_model, self.base)
            return x + table.view(*positions.shape, self.dim_model).to(x.dtype)
        start = check_offset(offset)
        positions = torch.arange(start, start + x.shape[-2], device=x.device)
        return x + sinusoidal_table(positions, self.dim_model, self.base).to(x.dtype)

    def extra_repr(self) -> str:
        return f"dim_model={self.dim_model}, base={self.base}"
