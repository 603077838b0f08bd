"""Tiny HF models of each family with a plan in brickwork.parallel.plans, and the tp=2 rank function."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor

from brickwork.parallel import full_state_dict, parallelize

VOCAB, DIM, SEQ, BATCH, STEPS = 64, 32, 8, 2, 3
FAMILIES = ("gpt2", "llama", "gpt_neox")


def build(family: str, head: bool = True, seed: int = 0) -> nn.Module:
    import transformers as hf

    torch.manual_seed(seed)
    common = dict(vocab_size=VOCAB, hidden_size=DIM, num_hidden_layers=2, num_attention_heads=4)
    if family == "gpt2":
        config = hf.GPT2Config(
            vocab_size=VOCAB, n_positions=2 * SEQ, n_embd=DIM, n_layer=2, n_head=4,
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        )  # fmt: skip
        return (hf.GPT2LMHeadModel if head else hf.GPT2Model)(config)
    if family == "llama":
        config = hf.LlamaConfig(
            **common, num_key_value_heads=2, intermediate_size=64, max_position_embeddings=32
        )
        return (hf.LlamaForCausalLM if head else hf.LlamaModel)(config)
    config = hf.GPTNeoXConfig(**common, intermediate_size=64, max_position_embeddings=32, rotary_pct=0.5)
    return (hf.GPTNeoXForCausalLM if head else hf.GPTNeoXModel)(config)


def data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
    return ids, torch.roll(ids, -1, dims=1)


def _full(x: torch.Tensor) -> torch.Tensor:
    return x.full_tensor() if isinstance(x, DTensor) else x


def train(model: nn.Module) -> tuple[list[float], torch.Tensor, dict[str, torch.Tensor]]:
    """A plain torch loop: STEPS SGD steps of next-token loss. Returns the losses, the first step's
    logits and the final weights, gathered whole with the single-process names and layout."""
    ids, labels = data()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    losses, first = [], None
    for _ in range(STEPS):
        logits = _full(model(ids).logits)
        loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        first = logits.detach() if first is None else first
    return losses, first, full_state_dict(model)


def tp2_rank() -> dict[str, tuple[list[float], torch.Tensor, dict[str, torch.Tensor]]]:
    """Every family at tp=2 with the plan parallelize picks itself, in one process group (one spawn
    for all: process start-up dominates)."""
    results = {}
    for family in FAMILIES:
        results[family] = train(parallelize(build(family), {"tensor_parallel_size": 2}))
    return results
