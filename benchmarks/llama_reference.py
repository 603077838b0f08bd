"""A plain-torch Llama for the GPU training benchmark, written the way nanoGPT writes its GPT.

The layout of brickwork's ``llama`` preset: RMSNorm before attention and before the MLP, rotary
positions on q and k, grouped-query attention (fewer key/value heads than query heads) through SDPA,
a SwiGLU MLP, no biases, a final RMSNorm and an untied LM head. One class per part, the block as two
residual lines, no brickwork import: it is the plain code brickwork's model is measured against
(benchmarks/train_gpu.py). ``forward(idx, targets)`` returns ``(logits, loss)`` as nanoGPT's does.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class LlamaConfig:
    vocab_size: int = 32000
    block_size: int = 1024
    n_layer: int = 12
    n_head: int = 12
    n_kv_head: int = 4
    n_embd: int = 768
    hidden_dim: int = 2048
    rope_base: float = 10000.0
    norm_eps: float = 1e-5


def rotary_tables(config: LlamaConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin) [block_size, head_size] of each position's rotation, each frequency twice: the
    first half of a head's channels pairs with the second half."""
    head_size = config.n_embd // config.n_head
    inv_freq = 1.0 / config.rope_base ** (torch.arange(0, head_size, 2).float() / head_size)
    angles = torch.outer(torch.arange(config.block_size).float(), inv_freq)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, T, nh, hs] rotated by position; cos, sin [T, hs] (float32, taken to x's dtype, so that
    under autocast q and k stay in bf16)."""
    first, second = x.chunk(2, dim=-1)
    turned = torch.cat([-second, first], dim=-1)
    return x * cos.to(x.dtype)[:, None, :] + turned * sin.to(x.dtype)[:, None, :]


class Attention(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.n_head, self.n_kv_head = config.n_head, config.n_kv_head
        self.head_size = config.n_embd // config.n_head
        self.wq = nn.Linear(config.n_embd, config.n_head * self.head_size, bias=False)
        self.wk = nn.Linear(config.n_embd, config.n_kv_head * self.head_size, bias=False)
        self.wv = nn.Linear(config.n_embd, config.n_kv_head * self.head_size, bias=False)
        self.wo = nn.Linear(config.n_head * self.head_size, config.n_embd, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x [B, T, C] -> [B, T, C]."""
        B, T, C = x.shape
        q = rotate(self.wq(x).view(B, T, self.n_head, self.head_size), cos, sin)
        k = rotate(self.wk(x).view(B, T, self.n_kv_head, self.head_size), cos, sin)
        v = self.wv(x).view(B, T, self.n_kv_head, self.head_size)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, nh, T, hs); k, v with n_kv_head
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.wo(y.transpose(1, 2).reshape(B, T, C))


class SwiGLU(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.w1 = nn.Linear(config.n_embd, config.hidden_dim, bias=False)
        self.w3 = nn.Linear(config.n_embd, config.hidden_dim, bias=False)
        self.w2 = nn.Linear(config.hidden_dim, config.n_embd, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.attention_norm = nn.RMSNorm(config.n_embd, eps=config.norm_eps)
        self.attention = Attention(config)
        self.ffn_norm = nn.RMSNorm(config.n_embd, eps=config.norm_eps)
        self.feed_forward = SwiGLU(config)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), cos, sin)
        return x + self.feed_forward(self.ffn_norm(x))


class Llama(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.config = config
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.n_embd)
        self.layers = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.norm = nn.RMSNorm(config.n_embd, eps=config.norm_eps)
        self.output = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        cos, sin = rotary_tables(config)
        # Not weights: left out of the state dict, moved with the model.
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear | nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """idx [B, T] -> (logits [B, T, vocab], mean cross-entropy against targets [B, T] or None)."""
        T = idx.shape[1]
        cos, sin = self.cos[:T], self.sin[:T]
        x = self.tok_embeddings(idx)
        for layer in self.layers:
            x = layer(x, cos, sin)
        logits = self.output(self.norm(x))
        if targets is None:
            return logits, None
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))
