"""A small language model written outside brickwork that declares its own tensor-parallel plans.

It stands for a user's component: nothing here imports torch.distributed, and parallel/ knows it
only through ``tp_plan()`` and ``tp_divide``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class ToyAttention(nn.Module):
    tp_divide = ("num_heads",)

    def __init__(self, dim: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.q_proj, self.k_proj, self.v_proj = (nn.Linear(dim, dim) for _ in range(3))
        self.out_proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = (
            p(x).view(b, t, self.num_heads, -1).transpose(1, 2)
            for p in (self.q_proj, self.k_proj, self.v_proj)
        )
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out_proj(y.transpose(1, 2).reshape(b, t, -1))

    def tp_plan(self) -> dict[str, str]:
        return {"q_proj": "colwise", "k_proj": "colwise", "v_proj": "colwise", "out_proj": "rowwise"}


class ToyMLP(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.up_proj, self.down_proj = nn.Linear(dim, hidden), nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.gelu(self.up_proj(x)))

    def tp_plan(self) -> dict[str, str]:
        return {"up_proj": "colwise", "down_proj": "rowwise"}


class ToyBlock(nn.Module):
    def __init__(self, dim: int, num_heads: int) -> None:
        super().__init__()
        self.attention_norm, self.attention = nn.LayerNorm(dim), ToyAttention(dim, num_heads)
        self.feedforward_norm, self.feedforward = nn.LayerNorm(dim), ToyMLP(dim, 4 * dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x))
        return x + self.feedforward(self.feedforward_norm(x))

    def tp_plan(self) -> dict[str, str]:
        return {"attention_norm": "sequence_parallel", "feedforward_norm": "sequence_parallel"}


class ToyLM(nn.Module):
    def __init__(
        self, vocab: int = 64, dim: int = 32, num_heads: int = 4, num_layers: int = 2, seq: int = 16
    ):
        super().__init__()
        self.token_embedding = nn.Embedding(vocab, dim)
        self.position = nn.Parameter(torch.randn(seq, dim) * 0.02)
        self.layers = nn.ModuleList(ToyBlock(dim, num_heads) for _ in range(num_layers))
        self.final_norm = nn.LayerNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.lm_head.weight = self.token_embedding.weight

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        h = self.token_embedding(input_ids) + self.position[: input_ids.shape[1]]
        for layer in self.layers:
            h = layer(h)
        return self.lm_head(self.final_norm(h))

    def tp_plan(self) -> dict[str, str]:
        return {"token_embedding": "vocab", "final_norm": "sequence_parallel", "lm_head": "colwise"}
