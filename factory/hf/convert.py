"""``from_hf`` and ``to_hf``: HF model <-> spec-built brickwork model with the same weights."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from brickwork.errors import ConfigError
from brickwork.layout.vocab_padding import unpadded_state_dict

from .bert import Bert
from .config import HFConfig, config_dict
from .family import Family, Variant, complete_state, to_brickwork_state, to_hf_state
from .gpt2 import GPT2
from .gpt_neox import GPTNeoX
from .llama import Llama
from .mistral import Mistral
from .mixtral import Mixtral
from .qwen2 import Qwen2
from .qwen3 import Qwen3

# to_hf asks the families in this order: of the Llama-shaped ones, the more particular first (a MoE,
# q/k norms, q/k/v biases, a sliding window), Llama last.
FAMILIES: dict[str, Family] = {
    f.model_type: f for f in (GPT2(), Bert(), Mixtral(), Qwen3(), Qwen2(), Mistral(), Llama(), GPTNeoX())
}


def family_of_config(config: Mapping[str, Any]) -> Family:
    model_type = config.get("model_type")
    if model_type not in FAMILIES:
        raise ConfigError(
            f"HF model type {model_type!r} is not supported", "hf_config.model_type", FAMILIES, model_type
        )
    return FAMILIES[model_type]


def hf_to_spec(config: Any, architecture: str, keys: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The brickwork spec of an HF config (object or config.json dict) for HF class ``architecture``.

    ``keys`` are the state-dict keys where the head depends on them (a BertModel's pooler).
    Every config option is translated, known not to change the outputs, or refused.
    """
    return _translate(config_dict(config), architecture, keys or {})[2]


def _translate(
    data: dict[str, Any], architecture: str, keys: Mapping[str, Any]
) -> tuple[Family, Variant, dict[str, Any]]:
    family = family_of_config(data)
    variant = family.variant(architecture, keys)
    cfg = HFConfig(data, family.name)
    spec = family.spec(cfg, variant)
    cfg.finish()
    return family, variant, spec


def hf_state_to_brickwork(
    config: Any, architecture: str, state: Mapping[str, torch.Tensor]
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(spec, brickwork state dict) from an HF config and state dict (a live model's or a checkpoint's)."""
    data = config_dict(config)
    family, variant, spec = _translate(data, architecture, state)
    tied = bool(data.get("tie_word_embeddings", family.tie_default))
    state = complete_state(family, variant, state, tied)
    return spec, to_brickwork_state(family, variant, spec, state)


def build_from_hf(
    config: Any, architecture: str, state: Mapping[str, torch.Tensor], vocab_multiple: int = 1
) -> nn.Module:
    """Build the spec's model (its vocabulary padded to a multiple of ``vocab_multiple``) and load the
    converted weights strictly."""
    from brickwork.factory.build import build_model

    spec, bw_state = hf_state_to_brickwork(config, architecture, state)
    model = build_model({**spec, "vocab_multiple": vocab_multiple})
    model.load_state_dict(bw_state, strict=True)  # the real rows: the model pads them
    return model


def from_hf(hf_model: nn.Module, *, vocab_multiple: int = 1) -> nn.Module:
    """A brickwork model with the weights and outputs of a transformers model; ``.spec`` is its spec.

    Supports ``GPT2LMHeadModel``, ``BertModel`` (with or without pooler), ``BertForMaskedLM``,
    ``LlamaForCausalLM``, ``GPTNeoXForCausalLM``, ``MistralForCausalLM``, ``Qwen2ForCausalLM``,
    ``Qwen3ForCausalLM`` and ``MixtralForCausalLM``. The result has the HF model's dtype, device and
    train/eval mode. An HF option brickwork cannot express raises ConfigError naming it.
    ``vocab_multiple`` (the spec key) pads the vocabulary inside the model, e.g. 64 for GPT-2's 50257:
    the outputs stay the HF model's.
    """
    config = getattr(hf_model, "config", None)
    if config is None or not isinstance(hf_model, nn.Module):
        raise TypeError(f"from_hf expects a transformers model, got {type(hf_model).__name__}")
    model = build_from_hf(config, type(hf_model).__name__, hf_model.state_dict(), vocab_multiple)
    if hasattr(hf_model, "loss_type"):
        # HF's Trainer counts num_items_in_batch by it (after the causal shift only for "ForCausalLM";
        # a GPT2LMHeadModel's is None), so the copy is trained on the very losses of the original.
        model.loss_type = hf_model.loss_type
    reference = next(hf_model.parameters())
    return model.to(device=reference.device, dtype=reference.dtype).train(hf_model.training)


def family_of_spec(spec: Mapping[str, Any]) -> Family:
    for family in FAMILIES.values():
        if family.matches(spec):
            return family
    shapes = "; ".join(f"{family.name}: {family.shape}" for family in FAMILIES.values())
    raise ConfigError(
        f"this model's architecture matches no HF family brickwork can export ({shapes})", "spec"
    )


def to_hf(model: nn.Module) -> nn.Module:
    """The transformers model with ``model``'s weights; ``model`` must carry its ``.spec``.

    Needs ``transformers``. The HF model has ``model``'s dtype, device and train/eval mode, and the
    real vocabulary (``vocab_size`` rows) of a model that pads its own.
    """
    spec = getattr(model, "spec", None)
    if not isinstance(spec, Mapping):
        raise TypeError("to_hf needs a model built by brickwork.factory (its .spec is missing)")
    import transformers

    family = family_of_spec(spec)
    key, kwargs = family.hf_config(spec)
    variant = family.variants[key]
    hf_class = getattr(transformers, variant.architecture)
    hf_model = hf_class(hf_class.config_class(**kwargs), **variant.init)
    state = to_hf_state(family, variant, spec, unpadded_state_dict(model))  # HF's rows: the real ones
    hf_model.load_state_dict(state, strict=True)
    reference = next(model.parameters())
    return hf_model.to(device=reference.device, dtype=reference.dtype).train(model.training)
