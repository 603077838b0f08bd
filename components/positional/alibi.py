"""Attention with linear biases (Press et al. 2022, "Train Short, Test Long")."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from brickwork.checks import Flag, PositiveInt

from .base import PositionalEncoding, register_positional


def alibi_slopes(num_heads: int) -> list[float]:
    """Head slopes from the paper: ``2^(-8/n)``, its square, ... for ``n`` a power of two. Otherwise the
    slopes of the largest power of two below ``num_heads``, then every other slope of twice that."""

    def geometric(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]

    closest = 2 ** math.floor(math.log2(num_heads))
    if closest == num_heads:
        return geometric(num_heads)
    return geometric(closest) + geometric(2 * closest)[0::2][: num_heads - closest]


@register_positional("alibi")
class ALiBi(PositionalEncoding):
    """``forward(tq, tk, device) -> bias [H, tq, tk]`` (fp32) with ``bias[h, i, j] = -slope_h * (p_i - j)``.

    Query ``i`` sits at absolute position ``p_i = tk - tq + i`` (bottom-right aligned, like causal masks,
    so a cached decode step is placed after its keys). Future keys are left to the causal mask; with
    ``symmetric=True`` (bidirectional encoders) the distance is ``|p_i - j|`` instead.

    Tensor parallel: :meth:`tp_divide` names ``num_heads``. The bias is built from the ``slopes`` buffer
    ``[H]``, not from ``num_heads``, so a parallel layer shards heads by replacing ``slopes`` with this
    rank's contiguous slice (dim 0), matching the head split of the attention projections.
    """

    position_kind = "bias"

    def __init__(self, num_heads: PositiveInt, symmetric: Flag = False) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.symmetric = symmetric
        # Distances per (tq, tk, device), built once: every layer asks for the same shapes each step.
        self._distances: dict[tuple[int, int, str], torch.Tensor] = {}
        # Derived from num_heads, so kept out of checkpoints.
        self.register_buffer(
            "slopes", torch.tensor(alibi_slopes(num_heads), dtype=torch.float32), persistent=False
        )

    def tp_divide(self) -> tuple[str, ...]:
        return ("num_heads",)

    def forward(self, tq: int, tk: int, device: torch.device | str | None = None) -> torch.Tensor:
        for name, value in (("tq", tq), ("tk", tk)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        device = self.slopes.device if device is None else device
        key = (tq, tk, str(device))
        if key not in self._distances:
            query_pos = torch.arange(tk - tq, tk, device=device, dtype=torch.float32)
            key_pos = torch.arange(tk, device=device, dtype=torch.float32)
            distance = query_pos[:, None] - key_pos[None, :]
            self._distances[key] = distance.abs() if self.symmetric else distance
            while len(self._distances) > 8:
                self._distances.pop(next(iter(self._distances)))
        return -self.slopes.to(device=device, dtype=torch.float32)[:, None, None] * self._distances[key]

    def score_mod(self) -> Callable[..., torch.Tensor]:
        """The bias as a FlexAttention ``score_mod`` for queries and keys of one sequence (tq == tk):
        ``score - slope[h] * (q_idx - kv_idx)``; ``h`` indexes this rank's ``slopes``."""
        slopes, symmetric = self.slopes, self.symmetric

        def mod(
            score: torch.Tensor, b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor
        ) -> torch.Tensor:
            distance = q_idx - kv_idx
            return score - slopes[h] * (distance.abs() if symmetric else distance)

        return mod

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, symmetric={self.symmetric}"
