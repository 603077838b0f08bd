"""Tiny random HF models of each family, and the checks every interop test shares."""

from __future__ import annotations

import math

import torch
import transformers
from torch import nn

VOCAB = 61
# Small odd sizes: 3 layers, head dims that are not powers of two, an MLP width unrelated to dim.
CONFIGS = {
    "gpt2": (
        transformers.GPT2Config,
        transformers.GPT2LMHeadModel,
        dict(vocab_size=VOCAB, n_embd=36, n_layer=3, n_head=3, n_inner=52, n_positions=48, bos_token_id=0,
             eos_token_id=0),
    ),
    "bert": (
        transformers.BertConfig,
        transformers.BertForMaskedLM,
        dict(vocab_size=VOCAB, hidden_size=36, num_hidden_layers=3, num_attention_heads=3,
             intermediate_size=52, max_position_embeddings=40, type_vocab_size=3),
    ),
    "llama": (
        transformers.LlamaConfig,
        transformers.LlamaForCausalLM,
        dict(vocab_size=VOCAB, hidden_size=36, num_hidden_layers=3, num_attention_heads=6,
             num_key_value_heads=2, intermediate_size=52, max_position_embeddings=64,
             rope_parameters={"rope_type": "default", "rope_theta": 500.0}, bos_token_id=0, eos_token_id=0),
    ),
    "gpt_neox": (
        transformers.GPTNeoXConfig,
        transformers.GPTNeoXForCausalLM,
        dict(vocab_size=VOCAB, hidden_size=36, num_hidden_layers=3, num_attention_heads=3,
             intermediate_size=52, max_position_embeddings=48, rotary_pct=0.5, rotary_emb_base=1000,
             bos_token_id=0, eos_token_id=0),
    ),
    # Windows shorter than the test sequences: Mistral's in every layer, Qwen2's from layer 1 on.
    "mistral": (
        transformers.MistralConfig,
        transformers.MistralForCausalLM,
        dict(vocab_size=VOCAB, hidden_size=36, num_hidden_layers=3, num_attention_heads=6,
             num_key_value_heads=2, intermediate_size=52, max_position_embeddings=64, sliding_window=5,
             rope_parameters={"rope_type": "default", "rope_theta": 500.0}, bos_token_id=0, eos_token_id=0),
    ),
    "qwen2": (
        transformers.Qwen2Config,
        transformers.Qwen2ForCausalLM,
        dict(vocab_size=VOCAB, hidden_size=36, num_hidden_layers=3, num_attention_heads=6,
             num_key_value_heads=2, intermediate_size=52, max_position_embeddings=64,
             use_sliding_window=True, sliding_window=4, max_window_layers=1,
             rope_parameters={"rope_type": "default", "rope_theta": 500.0}, bos_token_id=0, eos_token_id=0),
    ),
    "qwen3": (
        transformers.Qwen3Config,
        transformers.Qwen3ForCausalLM,
        dict(vocab_size=VOCAB, hidden_size=36, num_hidden_layers=3, num_attention_heads=6,
             num_key_value_heads=2, head_dim=8, intermediate_size=52, max_position_embeddings=64,
             rope_parameters={"rope_type": "default", "rope_theta": 500.0}, bos_token_id=0, eos_token_id=0),
    ),
    "mixtral": (
        transformers.MixtralConfig,
        transformers.MixtralForCausalLM,
        # HF's grouped_mm experts need rows of a multiple of 16 bytes, in bf16 too.
        dict(vocab_size=VOCAB, hidden_size=40, num_hidden_layers=3, num_attention_heads=4,
             num_key_value_heads=2, intermediate_size=24, num_local_experts=4, num_experts_per_tok=2,
             max_position_embeddings=64, rope_parameters={"rope_type": "default", "rope_theta": 500.0},
             bos_token_id=0, eos_token_id=0),
    ),
}  # fmt: skip

ZERO_DROPOUT = {
    "gpt2": dict(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0),
    "bert": dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0),
    "llama": dict(attention_dropout=0.0),
    "gpt_neox": dict(attention_dropout=0.0, hidden_dropout=0.0),
    "mistral": dict(attention_dropout=0.0),
    "qwen2": dict(attention_dropout=0.0),
    "qwen3": dict(attention_dropout=0.0),
    "mixtral": dict(attention_dropout=0.0),
}


def hf_model(family: str, seed: int = 0, model_class: type | None = None, **overrides) -> nn.Module:
    """A tiny HF model of ``family`` in eval mode, every weight re-randomised (see :func:`randomize`)."""
    config_class, default_class, options = CONFIGS[family]
    config = config_class(**{**options, **ZERO_DROPOUT[family], **overrides})
    torch.manual_seed(seed)
    model = (model_class or default_class)(config).eval()
    randomize(model, seed)
    return model


@torch.no_grad()
def randomize(model: nn.Module, seed: int) -> None:
    """Overwrite every parameter: HF starts norm gains at 1 and biases at 0, which hides mapping bugs.

    Matrices get std 1/sqrt(fan_in), so activations keep their scale through the layers; norm gains
    are 1 +- 0.3 and every other vector 0.2 * N(0, 1).
    """
    g = torch.Generator().manual_seed(seed + 1)
    for name, p in model.named_parameters():
        noise = torch.randn(p.shape, generator=g, dtype=torch.float32)
        if p.dim() >= 2:
            value = noise / math.sqrt(p.shape[-1])
        elif name.endswith("weight"):
            value = 1.0 + 0.3 * noise
        else:
            value = 0.2 * noise
        p.copy_(value.to(p.dtype))


@torch.no_grad()
def fill_nan(model: nn.Module) -> None:
    """Every parameter NaN, so anything a conversion leaves unloaded shows up in the outputs."""
    for p in model.parameters():
        p.fill_(float("nan"))


def assert_close(ours: torch.Tensor, ref: torch.Tensor, atol: float = 1e-4, rtol: float = 1e-5) -> None:
    """max |ours - ref| <= atol and <= rtol * max |ref| (the output scale); NaN never passes."""
    assert ours.shape == ref.shape, (ours.shape, ref.shape)
    ours, ref = ours.double(), ref.double()
    assert torch.isfinite(ours).all(), "non-finite values in the brickwork output"
    err = (ours - ref).abs().max().item()
    scale = ref.abs().max().item()
    assert err <= atol, f"max abs difference {err:.3g} > {atol:g} (output scale {scale:.3g})"
    assert err <= rtol * scale, f"max abs difference {err:.3g} > {rtol:g} x output scale {scale:.3g}"


def logits_of(hf: nn.Module, **inputs) -> torch.Tensor:
    """The main output of an HF model: logits for LM heads, the last hidden state otherwise."""
    out = hf(**inputs)
    return out.logits if hasattr(out, "logits") and out.logits is not None else out.last_hidden_state
