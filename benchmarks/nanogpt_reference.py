"""The plain-torch reference for the training-loop benchmark: a GPT and its loop in nanoGPT's structure.

The model is the one brickwork's ``gpt-tiny`` preset builds (learned positions, pre-norm blocks with
biased LayerNorms and projections, a fused qkv projection, SDPA, a tanh-GELU MLP of 4x width, a final
norm and an LM head tied to the token embedding), written the way nanoGPT writes its ``model.py``:
one class per part, the block as two residual lines, no brickwork import. The loop is nanoGPT's
``train.py`` reduced to one process in float32: random windows of a token stream, the learning rate
set per iteration, forward to logits and cross-entropy, backward, gradient clipping, AdamW with weight
decay on matrices only, ``zero_grad(set_to_none=True)``, the loss read back every iteration.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class GPTConfig:
    vocab_size: int = 256
    block_size: int = 64
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.n_head = config.n_head
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, T, C] -> [B, T, C]."""
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (
            t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v)
        )  # (B, nh, T, hs)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).reshape(B, T, C))


class MLP(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd)
        self.gelu = nn.GELU(approximate="tanh")
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.block_size, config.n_embd)
        self.h = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.wte.weight = self.lm_head.weight
        self.apply(self._init_weights)
        # GPT-2's scaled init of the projections into the residual stream.
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """idx [B, T] -> (logits [B, T, vocab], mean cross-entropy against targets [B, T] or None)."""
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        if targets is None:
            return logits, None
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1)

    def configure_optimizers(
        self, weight_decay: float, learning_rate: float, betas: tuple[float, float]
    ) -> torch.optim.AdamW:
        params = [p for p in self.parameters() if p.requires_grad]
        groups = [
            {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ]
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas)


@dataclass
class Recipe:
    """nanoGPT's CPU recipe for character-level Shakespeare (its ``train_shakespeare_char`` config with
    the command line its README gives for a CPU), at 4 layers of 128."""

    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    block_size: int = 64
    batch_size: int = 12
    max_iters: int = 2000
    learning_rate: float = 1e-3
    min_lr: float = 1e-4
    warmup_iters: int = 100
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.99
    grad_clip: float = 1.0
    seed: int = 1337


def get_lr(it: int, r: Recipe) -> float:
    """Linear warmup, then cosine decay to ``min_lr`` at ``max_iters`` (the 0-based iteration ``it``)."""
    if it < r.warmup_iters:
        return r.learning_rate * (it + 1) / (r.warmup_iters + 1)
    ratio = min(1.0, (it - r.warmup_iters) / max(1, r.max_iters - r.warmup_iters))
    return r.min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (r.learning_rate - r.min_lr)


def batch_getter(data: torch.Tensor, r: Recipe, generator: torch.Generator) -> Callable[[], tuple]:
    """A ``get_batch()`` of random windows of the token stream ``data``: (x [B, T], y [B, T] shifted)."""

    def get_batch() -> tuple[torch.Tensor, torch.Tensor]:
        ix = torch.randint(len(data) - r.block_size, (r.batch_size,), generator=generator)
        x = torch.stack([data[i : i + r.block_size] for i in ix.tolist()])
        y = torch.stack([data[i + 1 : i + 1 + r.block_size] for i in ix.tolist()])
        return x, y

    return get_batch


def build(r: Recipe, vocab_size: int) -> tuple[GPT, torch.optim.AdamW]:
    torch.manual_seed(r.seed)
    config = GPTConfig(vocab_size, r.block_size, r.n_layer, r.n_head, r.n_embd)
    model = GPT(config)
    return model, model.configure_optimizers(r.weight_decay, r.learning_rate, (r.beta1, r.beta2))


def train(model: GPT, optimizer: torch.optim.AdamW, data: torch.Tensor, r: Recipe, iters: int) -> float:
    """``iters`` iterations of nanoGPT's loop on ``data`` (LongTensor[N]); returns the last loss."""
    get_batch = batch_getter(data, r, torch.Generator().manual_seed(r.seed))
    model.train()
    X, Y = get_batch()
    lossf = math.nan
    for iter_num in range(iters):
        lr = get_lr(iter_num, r)
        for group in optimizer.param_groups:
            group["lr"] = lr
        _, loss = model(X, Y)
        X, Y = get_batch()  # the next batch is drawn while, on a GPU, this one still computes
        loss.backward()
        if r.grad_clip != 0.0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), r.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        lossf = loss.item()
    return lossf


@torch.no_grad()
def evaluate(model: GPT, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> float:
    """The mean cross-entropy over every position of ``batches`` [(x [B, T], y [B, T]), ...]."""
    model.eval()
    total, count = 0.0, 0
    for x, y in batches:
        _, loss = model(x, y)
        total += float(loss) * y.numel()
        count += y.numel()
    model.train()
    return total / count
