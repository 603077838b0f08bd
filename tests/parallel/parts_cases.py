"""The tiny untied Llama-style model, a user's model annotated with ``part`` blocks, and the rank
functions of the per-part strategy tests."""

from __future__ import annotations

import copy

import torch
from torch import nn
from torch.distributed.tensor import DTensor
from toy_lm import ToyBlock

from brickwork.errors import ConfigError
from brickwork.factory import build_model, get_preset
from brickwork.parallel import full_state_dict, parallelize, part
from brickwork.train import TrainStep

VOCAB, STEPS = 64, 3
# Replicate the embedding and the first block, split the second block and the LM head's vocabulary.
PARTS = {"token_embedding": "replicate", "layers.0": "replicate", "lm_head": "split"}


def build() -> nn.Module:
    spec = copy.deepcopy(get_preset("llama"))
    spec.update(vocab_size=VOCAB, dim_model=32, max_seq_len=16)
    spec["decoder"]["num_layers"] = 2
    spec["decoder"]["block"]["attention"].update(num_heads=4, num_kv_heads=2)
    spec["decoder"]["block"]["feedforward"]["hidden_dim"] = 64
    torch.manual_seed(0)
    return build_model(spec)


def build_vit() -> nn.Module:
    """A small ViT with a wide classifier (1000 classes on a 32-wide body): the head is most weights."""
    spec = copy.deepcopy(get_preset("vit"))
    spec.update(dim_model=32, image_size=8, patch_size=4, num_classes=1000)
    spec["encoder"]["num_layers"] = 2
    spec["encoder"]["block"]["attention"]["num_heads"] = 4
    spec["encoder"]["block"]["feedforward"]["hidden_dim"] = 64
    torch.manual_seed(0)
    return build_model(spec)


def _batch(g: torch.Generator, image: bool) -> dict[str, torch.Tensor]:
    if image:
        return {
            "pixel_values": torch.randn(4, 3, 8, 8, generator=g),
            "labels": torch.randint(0, 1000, (4,), generator=g),
        }
    ids = torch.randint(0, VOCAB, (4, 8), generator=g)
    return {"input_ids": ids, "labels": ids.clone()}  # HF's causal-LM labels: the model shifts them


def train(model: nn.Module, task: str = "causal_lm") -> tuple[list[float], dict[str, torch.Tensor]]:
    """A few SGD steps on fixed data: the losses and the final full weights."""
    step = TrainStep(model, torch.optim.SGD(model.parameters(), lr=0.5), task)
    g = torch.Generator().manual_seed(5)
    losses = [step(_batch(g, task == "image_classification")) for _ in range(STEPS)]
    return losses, full_state_dict(model)


def vit_split_head() -> tuple[list[float], dict[str, torch.Tensor], bool]:
    """Whale's example: the body whole on both ranks (data-parallel only), the wide classifier split."""
    model = parallelize(
        build_vit(),
        {"tensor_parallel_size": 2, "parts": {"layers.*": "replicate"}},
        plan={"classifier": "colwise"},
    )
    split = isinstance(model.classifier.weight, DTensor) and not isinstance(
        model.layers[0].attention.q_proj.weight, DTensor
    )
    return (*train(model, "image_classification"), split)


def tp2_with_parts() -> tuple[list[float], dict[str, torch.Tensor], dict[str, bool]]:
    model = parallelize(build(), {"tensor_parallel_size": 2, "parts": PARTS})
    sharded = {name: isinstance(p, DTensor) for name, p in model.named_parameters()}
    heads = (model.layers[0].attention.num_heads, model.layers[1].attention.num_heads)
    losses, state = train(model)
    return losses, state, {**sharded, "heads": heads}


class AnnotatedLM(nn.Module):
    """A user's untied LM whose code says what PARTS says: the embedding and the first block whole on
    every tensor-parallel rank, the rest (and the LM head's vocabulary) split."""

    def __init__(self, dim: int = 32, heads: int = 4) -> None:
        super().__init__()
        torch.manual_seed(0)
        with part("replicate"):
            self.token_embedding = nn.Embedding(VOCAB, dim)
            first = ToyBlock(dim, heads)  # its children are assigned inside the block
        self.layers = nn.ModuleList([first, ToyBlock(dim, heads)])
        self.final_norm = nn.LayerNorm(dim)
        with part("split"):
            self.lm_head = nn.Linear(dim, VOCAB, bias=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        h = self.token_embedding(input_ids)
        for layer in self.layers:
            h = layer(h)
        return self.lm_head(self.final_norm(h))

    def tp_plan(self) -> dict[str, str]:
        return {"token_embedding": "vocab", "lm_head": "colwise"}


def _refusal(layout: dict) -> str:
    try:
        parallelize(AnnotatedLM(), layout)
    except ConfigError as error:
        return str(error)
    return ""


def annotated_rank() -> dict:
    """AnnotatedLM at tp=2: losses, weights, what is sharded; and the refusals under sequence
    parallel and under a pipeline."""
    model = parallelize(AnnotatedLM(), {"tensor_parallel_size": 2})
    sharded = {name: isinstance(p, DTensor) for name, p in model.named_parameters()}
    heads = (model.layers[0].attention.num_heads, model.layers[1].attention.num_heads)
    losses, state = train(model)
    return {
        "losses": losses,
        "state": state,
        "sharded": sharded,
        "heads": heads,
        "sequence_parallel": _refusal({"tensor_parallel_size": 2, "sequence_parallel": True}),
        "pipeline": _refusal({"pipeline_parallel_size": 2}),
    }
