"""Small specs shared by the factory and blocks tests (each builds in milliseconds), and a forward helper."""

from typing import Any

import torch
from torch import nn


def tiny_decoder() -> dict[str, Any]:
    return {
        "model": "decoder_lm",
        "vocab_size": 50,
        "dim_model": 16,
        "max_seq_len": 12,
        "position": {"name": "learned"},
        "decoder": {
            "num_layers": 3,
            "block": {
                "attention": {"num_heads": 4, "num_kv_heads": 2, "fused_qkv": True},
                "feedforward": {"name": "mlp", "hidden_dim": 32, "activation": "gelu_tanh"},
                "norm": {"name": "layernorm", "eps": 1.0e-5},
                "residual": {"name": "pre"},
            },
            "layers": {1: {"attention": {"mechanism": {"name": "local", "window_size": 3}}}},
        },
    }


def tiny_encoder() -> dict[str, Any]:
    return {
        "model": "encoder",
        "vocab_size": 40,
        "dim_model": 16,
        "max_seq_len": 10,
        "position": {"name": "learned"},
        "type_vocab_size": 2,
        "embedding_norm": True,
        "final_norm": False,
        "head": "mlm",
        "encoder": {
            "num_layers": 2,
            "block": {
                "attention": {"num_heads": 2},
                "feedforward": {"name": "mlp", "hidden_dim": 24},
                "residual": {"name": "post"},
            },
        },
    }


def tiny_encoder_decoder() -> dict[str, Any]:
    return {
        "model": "encoder_decoder",
        "vocab_size": 30,
        "dim_model": 16,
        "position": {"name": "rotary"},
        "encoder": {
            "num_layers": 2,
            "block": {"attention": {"num_heads": 4, "bias": False}, "norm": "rmsnorm",
                      "feedforward": {"name": "swiglu", "hidden_dim": 24}},
        },
        "decoder": {
            "num_layers": 2,
            "block": {"attention": {"num_heads": 4, "bias": False}, "norm": "rmsnorm",
                      "feedforward": {"name": "swiglu", "hidden_dim": 24}},
        },
    }  # fmt: skip


def tiny_image_encoder() -> dict[str, Any]:
    return {
        "model": "image_encoder",
        "dim_model": 16,
        "image_size": 8,
        "patch_size": 4,
        "channels": 3,
        "num_classes": 5,
        "position": {"name": "learned"},
        "encoder": {"num_layers": 2, "block": {"attention": {"num_heads": 2}}},
    }


TINY_SPECS = {
    "decoder_lm": tiny_decoder,
    "encoder": tiny_encoder,
    "encoder_decoder": tiny_encoder_decoder,
    "image_encoder": tiny_image_encoder,
}


def run(model: nn.Module, kind: str, batch: int = 2, length: int = 6) -> torch.Tensor:
    """One forward pass on random inputs of the right kind."""
    spec = model.spec
    if kind == "image_encoder":
        size = spec["image_size"]
        return model(torch.randn(batch, spec["channels"], size, size))
    ids = torch.randint(0, spec["vocab_size"], (batch, length))
    if kind == "encoder_decoder":
        return model(ids, torch.randint(0, spec["vocab_size"], (batch, length - 1)))
    return model(ids)
