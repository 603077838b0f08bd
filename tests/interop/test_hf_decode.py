"""Padded batches and KV-cache greedy decoding of converted models against HF."""

import pytest
import torch
import transformers
from hf_models import VOCAB, assert_close, hf_model

from brickwork.factory.hf import from_hf


def _left_padded(batch: int = 3, length: int = 12) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(11)
    ids = torch.randint(1, VOCAB, (batch, length), generator=g)
    mask = torch.ones_like(ids)
    for row, pad in enumerate((0, 4, 7)[:batch]):
        ids[row, :pad] = 0
        mask[row, :pad] = 0
    return ids, mask


@pytest.mark.parametrize("model_class", [transformers.BertModel, transformers.BertForMaskedLM])
def test_bert_padded_batch(model_class: type) -> None:
    hf = hf_model("bert", model_class=model_class)
    model = from_hf(hf)
    ids, mask = _left_padded()
    types = (torch.arange(ids.shape[1]) >= 6).long().expand_as(ids)
    with torch.no_grad():
        out = hf(ids, attention_mask=mask, token_type_ids=types)
        ref = out.logits if hasattr(out, "logits") else out.last_hidden_state
        ours = model(ids, attention_mask=mask, token_type_ids=types)
    assert_close(ours, ref)
    real = mask.bool()
    assert torch.equal(ours.argmax(-1)[real], ref.argmax(-1)[real])


def test_llama_left_padded_batch() -> None:
    """The padding mask goes to every layer through the model's embed / layers / head parts."""
    hf = hf_model("llama")
    model = from_hf(hf)
    ids, mask = _left_padded()
    with torch.no_grad():
        ref = hf(ids, attention_mask=mask).logits
        h = model.embed(ids)
        keep = mask.bool()[:, None, None, :]  # (B, 1, 1, T): True = may attend
        for layer in model.layers:
            h = layer(h, attn_mask=keep)
        ours = model.head(h)
    real = mask.bool()
    # A left pad query sees no real key (it is causal and its keys are pads): compare real tokens.
    assert_close(ours[real], ref[real])
    assert torch.equal(ours.argmax(-1)[real], ref.argmax(-1)[real])


# 25 tokens: past Mistral's and Qwen2's sliding windows, which HF's cache trims and brickwork's masks.
@pytest.mark.parametrize("family", ["llama", "gpt2", "mistral", "qwen2", "qwen3", "mixtral"])
def test_greedy_decode_matches_hf_generate(family: str) -> None:
    hf = hf_model(family, seed=9)
    # Decode all 20 tokens: without an end-of-sequence token HF never stops early.
    hf.generation_config.eos_token_id = None
    hf.generation_config.pad_token_id = 0
    model = from_hf(hf)
    prompt = torch.randint(0, VOCAB, (2, 5), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ref = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=20, do_sample=False)
    ours = model.generate(prompt, max_new_tokens=20)
    assert ref.shape == (2, 25)
    assert torch.equal(ours, ref)
