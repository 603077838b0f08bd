"""Named model specs, looked up by exact name. docs/spec.md lists each with its parameter count."""

from __future__ import annotations

import copy
from typing import Any

from brickwork.errors import ConfigError

Spec = dict[str, Any]


def _attention(heads: int, dropout: float = 0.0, **options: Any) -> dict[str, Any]:
    mechanism = {"name": "scaled_dot_product", "dropout": dropout}
    return {"num_heads": heads, "dropout": dropout, "mechanism": mechanism, **options}


def _mlp(hidden: int, activation: str, dropout: float = 0.0, bias: bool = True) -> dict[str, Any]:
    return {"name": "mlp", "hidden_dim": hidden, "activation": activation, "dropout": dropout, "bias": bias}


def _block(attention: Spec, feedforward: Spec, norm: Spec, residual: str = "pre", **cross: Spec) -> Spec:
    """A block's spec (``cross``: its ``cross_attention``), keys in the order the presets list them."""
    sublayers = {"attention": attention, **cross, "feedforward": feedforward}
    return {**sublayers, "norm": norm, "residual": {"name": residual}}


def _llama(dim: int, layers: int, heads: int, hidden: int, kv_heads: int = 8) -> Spec:
    """A Llama 3 shape as published (Meta's Llama 3 paper, Table 3): SwiGLU, RMSNorm, rotary positions
    with base 500,000, 8192 positions, a 128,256-token vocabulary, an untied head; 8 kv heads unless
    ``kv_heads`` says otherwise."""
    return {
        "model": "decoder_lm",
        "vocab_size": 128256,
        "dim_model": dim,
        "max_seq_len": 8192,
        "position": {"name": "rotary", "base": 500000.0},
        "tie_embeddings": False,
        "vocab_multiple": 64,
        "init": {"name": "normal", "std": 0.02},
        "decoder": {
            "num_layers": layers,
            "block": _block(
                _attention(heads, num_kv_heads=kv_heads, bias=False),
                {"name": "swiglu", "hidden_dim": hidden, "bias": False},
                {"name": "rmsnorm", "eps": 1e-5},
            ),
        },
    }


def _t5_block(**cross: Spec) -> Spec:
    """T5-small's block: bias-free attention and ReLU MLP, RMSNorm."""
    mlp = _mlp(2048, "relu", 0.1, bias=False)
    return _block(_attention(8, bias=False), mlp, {"name": "rmsnorm", "eps": 1e-6}, **cross)


_GPT2_BLOCK = _block(
    _attention(12, 0.1, fused_qkv=True), _mlp(3072, "gelu_tanh", 0.1), {"name": "layernorm", "eps": 1e-5}
)

# Every preset with a vocabulary pads it to a multiple of 64 inside the model (vocab_multiple): the
# head's GEMMs keep cuBLAS's aligned kernels; the logits and loss keep the real vocabulary.
PRESETS: dict[str, dict[str, Any]] = {
    # GPT-2 small (Radford et al. 2019): 124,439,808 parameters with the tied LM head.
    "gpt2": {
        "model": "decoder_lm",
        "vocab_size": 50257,
        "dim_model": 768,
        "max_seq_len": 1024,
        "position": {"name": "learned"},
        "dropout": 0.1,
        "tie_embeddings": True,
        "vocab_multiple": 64,
        "init": {"name": "normal", "std": 0.02, "scaled_residual": True},
        "decoder": {"num_layers": 12, "block": _GPT2_BLOCK},
    },
    # A GPT-2-shaped byte-level model small enough to train on a CPU in about a minute.
    "gpt-tiny": {
        "model": "decoder_lm",
        "vocab_size": 256,
        "dim_model": 128,
        "max_seq_len": 256,
        "vocab_multiple": 64,
        "position": {"name": "learned"},
        "init": {"name": "normal", "std": 0.02, "scaled_residual": True},
        "decoder": {
            "num_layers": 4,
            "block": _block(_attention(4, fused_qkv=True), _mlp(512, "gelu_tanh"), {"name": "layernorm"}),
        },
    },
    # BERT-base with its masked-LM head (Devlin et al. 2019): post-norm, embedding LayerNorm.
    "bert-base": {
        "model": "encoder",
        "vocab_size": 30522,
        "dim_model": 768,
        "max_seq_len": 512,
        "position": {"name": "learned"},
        "dropout": 0.1,
        "type_vocab_size": 2,
        "embedding_norm": True,
        "final_norm": False,
        "head": "mlm",
        "tie_embeddings": True,
        "vocab_multiple": 64,
        "init": {"name": "normal", "std": 0.02},
        "encoder": {
            "num_layers": 12,
            "block": _block(
                _attention(12, 0.1), _mlp(3072, "gelu", 0.1), {"name": "layernorm", "eps": 1e-12}, "post"
            ),
        },
    },
    # A small Llama-style decoder (Touvron et al. 2023): RMSNorm, SwiGLU, RoPE, grouped-query attention.
    "llama": _llama(512, 8, 8, 1376, kv_heads=2)
    | {"vocab_size": 32000, "max_seq_len": 2048, "position": {"name": "rotary", "base": 10000.0}},
    # Llama 3 8B, 70B and 405B at their published shapes, for planning layouts (brickwork plan) and
    # for from-scratch runs on many GPUs; from_hf reads the released weights.
    "llama3-8b": _llama(4096, 32, 32, 14336),
    "llama3-70b": _llama(8192, 80, 64, 28672),
    "llama3-405b": _llama(16384, 126, 128, 53248),
    # T5-small's shape (Raffel et al. 2020): 6 + 6 layers, RMSNorm, bias-free ReLU MLP, shared tied
    # embeddings. Rotary positions stand in for T5's relative position buckets.
    "t5-small": {
        "model": "encoder_decoder",
        "vocab_size": 32128,
        "dim_model": 512,
        "max_seq_len": 512,
        "position": {"name": "rotary"},
        "dropout": 0.1,
        "tie_embeddings": True,
        "vocab_multiple": 64,
        "init": {"name": "normal", "std": 0.02},
        "encoder": {"num_layers": 6, "block": _t5_block()},
        "decoder": {"num_layers": 6, "block": _t5_block(cross_attention=_attention(8, bias=False))},
    },
    # ViT-B/16 (Dosovitskiy et al. 2021): 224x224 images, 16x16 patches, class token, 1000 classes.
    "vit": {
        "model": "image_encoder",
        "dim_model": 768,
        "image_size": 224,
        "patch_size": 16,
        "channels": 3,
        "num_classes": 1000,
        "class_token": True,
        "pool": "cls",
        "position": {"name": "learned"},
        "init": {"name": "normal", "std": 0.02},
        "encoder": {
            "num_layers": 12,
            "block": _block(_attention(12), _mlp(3072, "gelu"), {"name": "layernorm", "eps": 1e-6}),
        },
    },
}


def list_presets() -> list[str]:
    """The preset names, sorted."""
    return sorted(PRESETS)


def get_preset(name: str) -> dict[str, Any]:
    """A fresh copy of the spec named ``name`` (exact match; ConfigError lists the names otherwise)."""
    if not isinstance(name, str) or name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}", "preset", choices=PRESETS, got=name)
    return copy.deepcopy(PRESETS[name])
