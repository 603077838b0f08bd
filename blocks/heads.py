"""Output heads for encoders: the masked-LM head and the [CLS] pooler."""

from __future__ import annotations

import torch
from torch import nn

from brickwork.components.feedforward.activations import ActivationSpec, create_activation


class MaskedLMHead(nn.Module):
    """dense -> activation -> norm -> decoder (weight usually tied). [B, T, d] -> [B, T, V]."""

    def __init__(
        self, dim: int, vocab_size: int, norm: nn.Module, activation: ActivationSpec = "gelu"
    ) -> None:
        super().__init__()
        self.dense = nn.Linear(dim, dim)
        self.activation = create_activation(activation)
        self.norm = norm
        self.decoder = nn.Linear(dim, vocab_size)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.norm(self.activation(self.dense(h))))


class Pooler(nn.Module):
    """tanh(dense(h[:, 0])): the first token's summary. [B, T, d] -> [B, d]."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dense = nn.Linear(dim, dim)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.dense(h[:, 0]))
