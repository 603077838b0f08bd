"""Tiny HF models of each family with a plan (declared in its brickwork.factory.hf module), and the
rank functions."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor

from brickwork.factory.hf import from_hf, to_hf
from brickwork.parallel import full_state_dict, parallel_state, parallelize
from brickwork.train import TrainStep

VOCAB, DIM, SEQ, BATCH, STEPS = 64, 32, 8, 2, 3
# Causal LMs, trained on next tokens.
FAMILIES = ("gpt2", "llama", "gpt_neox", "mistral", "qwen2", "qwen3", "mixtral")
PLANNED = (*FAMILIES, "bert")
# Models converted by from_hf and laid out by brickwork's own plans: q/k/v biases and windows by layer
# (Qwen2), per-head q/k norms (Qwen3).
CONVERTED = ("qwen2", "qwen3")
MASK_ID = 3
# The Llama-shaped families: (config, LM class, base class, options beyond Llama's). Windows shorter
# than SEQ: Mistral's in both layers, Qwen2's in layer 1.
LLAMA_SHAPED = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", "LlamaModel", {}),
    "mistral": ("MistralConfig", "MistralForCausalLM", "MistralModel", dict(sliding_window=4)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", "Qwen2Model",
              dict(use_sliding_window=True, sliding_window=4, max_window_layers=1)),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", "Qwen3Model", dict(head_dim=8)),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", "MixtralModel", dict(num_local_experts=4)),
}  # fmt: skip


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
    if family == "bert":
        config = hf.BertConfig(
            **common, intermediate_size=64, max_position_embeddings=32,
            hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
        )  # fmt: skip
        return (hf.BertForMaskedLM if head else hf.BertModel)(config)
    if family in LLAMA_SHAPED:
        config_class, lm, base, options = LLAMA_SHAPED[family]
        config = getattr(hf, config_class)(
            **common, num_key_value_heads=2, intermediate_size=64, max_position_embeddings=32, **options
        )
        return getattr(hf, lm if head else base)(config)
    config = hf.GPTNeoXConfig(**common, intermediate_size=64, max_position_embeddings=32, rotary_pct=0.5)
    return (hf.GPTNeoXForCausalLM if head else hf.GPTNeoXModel)(config)


def data() -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids and their causal-LM labels (HF's: the ids; the loss shifts them)."""
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
    return ids, ids.clone()


def _full(x: torch.Tensor) -> torch.Tensor:
    return x.full_tensor() if isinstance(x, DTensor) else x


def train(model: nn.Module) -> tuple[list[float], torch.Tensor, dict[str, torch.Tensor]]:
    """A plain torch loop: STEPS SGD steps of next-token loss. Returns the losses, the first step's
    logits and the final weights, gathered whole with the single-process names and layout."""
    ids, labels = data()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    losses, first = [], None
    for _ in range(STEPS):
        out = model(ids)
        logits = _full(getattr(out, "logits", out))  # an HF output, or a brickwork model's logits
        loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        first = logits.detach() if first is None else first
    return losses, first, full_state_dict(model)


def mlm_batch(rows: int = 4) -> dict[str, torch.Tensor]:
    """A masked-LM batch with HF's keys: 40% of positions masked and scored, two segments, and padding
    at the end of row 1 (not scored)."""
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(4, VOCAB, (rows, SEQ), generator=g)
    masked = torch.rand(ids.shape, generator=g) < 0.4
    attention_mask = torch.ones_like(ids)
    attention_mask[1, SEQ - 2 :] = 0
    masked &= attention_mask.bool()
    labels = torch.where(masked, ids, torch.full_like(ids, -100))
    token_type_ids = torch.zeros_like(ids)
    token_type_ids[:, SEQ // 2 :] = 1
    return {
        "input_ids": ids.masked_fill(masked, MASK_ID),
        "attention_mask": attention_mask,
        "token_type_ids": token_type_ids,
        "labels": labels,
    }


def mlm_reference() -> tuple[list[float], dict[str, torch.Tensor]]:
    """HF BertForMaskedLM in one process, its own loss (mean over the masked positions), STEPS SGD steps."""
    model = build("bert")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    losses = []
    for _ in range(STEPS):
        loss = model(**mlm_batch()).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses, full_state_dict(model)


def mlm_rank(layout: dict) -> tuple[list[float], dict[str, torch.Tensor], bool]:
    """BertForMaskedLM under ``layout`` through TrainStep (task masked_lm), each data-parallel rank on its
    rows: the losses, the final full weights, and whether the tied biases are still one Parameter."""
    model = parallelize(build("bert"), layout)
    step = TrainStep(model, torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9), "masked_lm")
    dp = parallel_state(model).mesh["dp"]
    rows = {k: v.chunk(dp.size())[dp.get_local_rank()] for k, v in mlm_batch().items()}
    losses = [step(rows) for _ in range(STEPS)]
    predictions = model.cls.predictions
    return losses, full_state_dict(model), predictions.bias is predictions.decoder.bias


def classifier_logits(model: nn.Module) -> torch.Tensor:
    batch = mlm_batch()
    with torch.no_grad():
        logits = model(batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    return _full(logits).detach()


def build_classifier() -> nn.Module:
    """HF BertForSequenceClassification (pooler and classifier on top of the encoder), 3 labels."""
    import transformers as hf

    torch.manual_seed(0)
    config = hf.BertConfig(
        vocab_size=VOCAB, hidden_size=DIM, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=32, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, num_labels=3,
    )  # fmt: skip
    return hf.BertForSequenceClassification(config)


def hf_weights(family: str, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A converted model's full weights under the HF model's names (through a one-process copy)."""
    model = from_hf(build(family))
    model.load_state_dict(state, strict=True)
    return to_hf(model).state_dict()


def train_converted(family: str) -> tuple[list[float], torch.Tensor, dict[str, torch.Tensor]]:
    """:func:`train` on ``from_hf`` of the family's model at tp=2; its weights under HF's names."""
    losses, first, state = train(parallelize(from_hf(build(family)), {"tensor_parallel_size": 2}))
    return losses, first, hf_weights(family, state)


def mixtral_ep2() -> tuple[list[float], dict[str, torch.Tensor], list[list[int]]]:
    """``from_hf`` of Mixtral at dp2 × ep2 through TrainStep (each rank its row), plain SGD as
    :func:`train`: the losses, the full weights under HF's names, and each layer's experts here."""
    model = parallelize(from_hf(build("mixtral")), {"data_parallel_size": 2, "expert_parallel_size": 2})
    step = TrainStep(model, torch.optim.SGD(model.parameters(), lr=0.5), "causal_lm")
    dp = parallel_state(model).mesh["dp"]
    ids, labels = data()
    rows = {"input_ids": ids.chunk(2)[dp.get_local_rank()], "labels": labels.chunk(2)[dp.get_local_rank()]}
    losses = [step(rows) for _ in range(STEPS)]
    held = [layer.feedforward.experts.indices() for layer in model.layers]
    return losses, hf_weights("mixtral", full_state_dict(model)), held


def tp2_rank() -> dict[str, Any]:
    """Every family at tp=2 with the plan parallelize picks itself, in one process group (one spawn
    for all: process start-up dominates): the causal LMs, BERT's masked LM, BERT's classifier; the
    CONVERTED models at tp=2 and Mixtral's at dp2 × ep2 (the two ranks as two data-parallel ones)."""
    tp2 = {"tensor_parallel_size": 2}
    results: dict[str, Any] = {family: train(parallelize(build(family), tp2)) for family in FAMILIES}
    results["bert"] = mlm_rank(tp2)
    results["bert-classifier"] = classifier_logits(parallelize(build_classifier(), tp2))
    results["converted"] = {family: train_converted(family) for family in CONVERTED}
    results["mixtral-ep2"] = mixtral_ep2()
    return results
