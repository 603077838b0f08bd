"""FAVOR+: softmax attention approximated with positive orthogonal random features, in linear time.

Choromanski et al., "Rethinking Attention with Performers" (2020), https://arxiv.org/abs/2009.14794
"""

from __future__ import annotations

import math
from typing import Annotated, Any

import torch
import torch.nn.functional as F

from brickwork.checks import Flag, OneOf, PositiveInt, Probability
from brickwork.components.attention.base import AttentionMechanism, register_attention
from brickwork.components.attention.masks import key_padding_keep
from brickwork.errors import ConfigError

FEATURE_MAPS = ("sm_orf", "sm_reg", "sm_hyp")


def orthogonal_features(
    num_rows: int, dim: int, feature_map_type: str, generator: torch.Generator | None = None
) -> torch.Tensor:
    """``[num_rows, dim]`` projections: blocks of orthogonal rows. ``sm_reg`` and ``sm_hyp`` give each row
    the norm of a Gaussian draw, so rows are marginally N(0, I) and the kernel estimate is unbiased;
    ``sm_orf`` fixes every norm at √dim, which lowers the variance at the cost of a small bias."""
    blocks = []
    for _ in range(math.ceil(num_rows / dim)):
        gaussian = torch.randn(dim, dim, generator=generator, dtype=torch.float64)
        orthonormal, upper = torch.linalg.qr(gaussian)
        # Fixing the signs by R's diagonal makes Q Haar-distributed, i.e. its rows isotropic; without it
        # the estimate of exp(q·k) is biased.
        blocks.append((orthonormal * upper.diagonal().sign()).T)
    rows = torch.cat(blocks)[:num_rows]
    if feature_map_type == "sm_orf":
        norms = torch.full((num_rows, 1), math.sqrt(dim), dtype=torch.float64)
    else:
        norms = torch.randn(num_rows, dim, generator=generator, dtype=torch.float64).norm(
            dim=-1, keepdim=True
        )
    return (rows * norms).float()


@register_attention("favor")
class FavorAttention(AttentionMechanism):
    """Performer attention: φ(q) (φ(k)ᵀ v) / φ(q) (φ(k)ᵀ 1), with φ(x) = exp(Wx - ‖x‖²/2) / √m on x scaled by
    D^-1/4, an unbiased estimate of softmax(q kᵀ / √D) v. ``sm_hyp`` uses [exp(Wx), exp(-Wx)] halves.

    ``causal`` uses prefix sums over keys (bottom-right aligned when Tk > Tq), memory ``B·H·Tk·m·D``.
    ``iter_before_redraw``: in training, draw fresh features after this many forward calls (None: never).
    ``seed``: draw features from a generator seeded with ``seed`` and the draw count, so that every copy
    of the module (e.g. one per rank) holds the same features; None uses the global RNG.
    """

    causal_safe = True
    mask_support = "key_padding"
    needs = ("dim_head",)

    def __init__(
        self,
        dim_head: PositiveInt | None = None,
        dim_features: PositiveInt | None = None,
        iter_before_redraw: PositiveInt | None = None,
        feature_map_type: Annotated[str, OneOf(FEATURE_MAPS)] = "sm_reg",
        causal: Flag = False,
        dropout: Probability = 0.0,
        seed: int | None = None,
    ) -> None:
        super().__init__()
        if dim_head is None:
            raise ConfigError("is required (MultiHeadAttention passes it in)", "dim_head")
        self.iter_before_redraw, self.feature_map_type = iter_before_redraw, feature_map_type
        self.dropout, self.seed = dropout, seed
        if dim_features is None:
            # xformers' default: D (1 + log2 D), rounded down to an even number.
            dim_features = 2 * (math.ceil(dim_head * (1 + math.log2(dim_head))) // 2)
        self.dim_head, self.dim_features, self.causal = dim_head, dim_features, causal
        self.draws = 0
        self.calls_since_draw = 0
        self.register_buffer("features", self._draw())

    @staticmethod
    def check_options(options: Any) -> None:
        features = options.dim_features
        if options.feature_map_type == "sm_hyp" and features is not None and features % 2:
            raise ConfigError(f"must be even for sm_hyp, got {features}", "dim_features")

    def _draw(self) -> torch.Tensor:
        generator = None if self.seed is None else torch.Generator().manual_seed(self.seed + self.draws)
        self.draws += 1
        hyperbolic = self.feature_map_type == "sm_hyp"
        rows = self.dim_features // 2 if hyperbolic else self.dim_features
        return orthogonal_features(rows, self.dim_head, self.feature_map_type, generator)

    @torch.no_grad()
    def redraw_features(self) -> None:
        """Replace the random features with a fresh draw."""
        self.features.copy_(self._draw())
        self.calls_since_draw = 0

    def feature_map(self, x: torch.Tensor, is_query: bool, keep: torch.Tensor | None = None) -> torch.Tensor:
        """φ(x) ``[B, H, T, m]`` for x ``[B, H, T, D]``, up to a positive factor that is constant per row
        (queries) or per (batch, head) (keys) and so cancels in the normalization. Rows where ``keep``
        ``[B|1, H|1, T, 1]`` is False get zero features."""
        x = x * self.dim_head**-0.25
        proj = x @ self.features.to(x.dtype).T  # (B, H, T, m')
        if self.feature_map_type == "sm_hyp":
            proj = torch.cat([proj, -proj], dim=-1)
        logits = proj - x.square().sum(dim=-1, keepdim=True) / 2
        # Subtracting a max keeps exp() finite. It is detached because it cancels exactly, and for keys
        # it is one constant per (batch, head), taken over the kept rows only.
        if is_query:
            shift = logits.amax(dim=-1, keepdim=True)
        else:
            visible = logits if keep is None else logits.masked_fill(~keep, float("-inf"))
            shift = visible.amax(dim=(-2, -1), keepdim=True)
            shift = torch.where(torch.isfinite(shift), shift, torch.zeros_like(shift))
        features = torch.exp(logits - shift.detach()) / math.sqrt(self.dim_features)
        return features if keep is None else features.masked_fill(~keep, 0.0)

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """q ``[B, H, Tq, D]``, k/v ``[B, H, Tk, D]`` -> ``[B, H, Tq, D]``."""
        self.check_inputs(q, k, v, attn_mask)
        if q.shape[-1] != self.dim_head:
            raise ValueError(f"FavorAttention: head dim {q.shape[-1]} differs from dim_head={self.dim_head}")
        if self.training and self.iter_before_redraw is not None:
            if self.calls_since_draw >= self.iter_before_redraw:
                self.redraw_features()
            self.calls_since_draw += 1
        # exp() of the features needs at least fp32 range and precision.
        dtype = torch.promote_types(q.dtype, torch.float32)
        keep = None if attn_mask is None else key_padding_keep(attn_mask)
        q_feat = self.feature_map(q.to(dtype), is_query=True)
        k_feat = self.feature_map(k.to(dtype), is_query=False, keep=keep)
        attend = self._causal if self.causal else self._full
        out = attend(q_feat, k_feat, v.to(dtype))
        return F.dropout(out.to(v.dtype), self.dropout, self.training)

    @staticmethod
    def _full(q_feat: torch.Tensor, k_feat: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        context = k_feat.transpose(-2, -1) @ v  # (B, H, m, D)
        norm = q_feat @ k_feat.sum(dim=-2).unsqueeze(-1)  # (B, H, Tq, 1)
        return (q_feat @ context) / norm.clamp_min(torch.finfo(norm.dtype).tiny)

    @staticmethod
    def _causal(q_feat: torch.Tensor, k_feat: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        tq, tk = q_feat.shape[-2], k_feat.shape[-2]
        context = torch.cumsum(k_feat.unsqueeze(-1) * v.unsqueeze(-2), dim=-3)  # (B, H, Tk, m, D)
        sums = torch.cumsum(k_feat, dim=-2)  # (B, H, Tk, m)
        # Query i sees keys up to i + tk - tq; rows before the first key (tq > tk) see none.
        last = torch.arange(tq, device=q_feat.device) + (tk - tq)
        seen = (last >= 0).to(q_feat.dtype)[:, None]
        last = last.clamp_min(0)
        num = torch.einsum("bhtm,bhtmd->bhtd", q_feat, context[:, :, last])
        norm = torch.einsum("bhtm,bhtm->bht", q_feat, sums[:, :, last]).unsqueeze(-1)
        return num / norm.clamp_min(torch.finfo(norm.dtype).tiny) * seen
