"""brickwork's HF classes (brickwork.hf): outputs as HF's models give them (checked against HF GPT-2,
Llama and BERT with the same weights), and folders that round-trip through HF's Auto classes and
brickwork's from_pretrained, for a hybrid spec no HF family expresses."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers
from hf_models import VOCAB, assert_close, hf_model
from safetensors.torch import load_file

from brickwork.errors import ConfigError
from brickwork.factory import build_model, from_pretrained, get_preset, load_spec, save_pretrained
from brickwork.factory.hf import from_hf
from brickwork.hf import BrickworkForCausalLM, to_hf_class

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models: threads only add synchronisation on a busy CPU."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def hybrid_spec() -> dict:
    """configs/llama-hybrid.yaml (local attention on odd layers, a mixture of experts in the last),
    small, with a vocabulary padded inside the model (61 real rows of 64) and an untied head."""
    spec = load_spec(ROOT / "configs" / "llama-hybrid.yaml")
    decoder = spec["decoder"]
    block = {**decoder["block"], "attention": {"num_heads": 4, "num_kv_heads": 2, "bias": False}}
    block["feedforward"] = {"name": "swiglu", "hidden_dim": 40}
    moe = {"name": "moe", "num_experts": 4, "top_k": 2, "expert": "swiglu", "hidden_dim": 24, "bias": False}
    local = {"attention": {"mechanism": {"name": "local", "window_size": 6}}}
    layers = {1: local, 3: {**local, "feedforward": moe}}
    return spec | {"vocab_size": VOCAB, "dim_model": 32, "max_seq_len": 40, "vocab_multiple": 16,
                   "decoder": {**decoder, "block": block, "layers": layers}}  # fmt: skip


def tied_spec() -> dict:
    """gpt-tiny, small: learned positions, a tied head, the vocabulary padded to 64 rows."""
    spec = get_preset("gpt-tiny") | {"vocab_size": VOCAB, "dim_model": 32, "max_seq_len": 40}
    block = {**spec["decoder"]["block"], "attention": {"num_heads": 2, "fused_qkv": True}}
    return spec | {"decoder": {**spec["decoder"], "num_layers": 2, "block": block}}


def ids(batch: int = 2, length: int = 9) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("make_spec", [hybrid_spec, tied_spec])
def test_a_folder_round_trips_through_hf_auto_classes_and_from_pretrained(make_spec, tmp_path: Path) -> None:
    torch.manual_seed(0)
    plain = build_model(make_spec()).eval()
    tokens = ids()
    with torch.no_grad():
        ref = plain(tokens)
    to_hf_class(plain).save_pretrained(tmp_path / "hf")
    save_pretrained(plain, tmp_path / "brickwork")
    for folder in (tmp_path / "hf", tmp_path / "brickwork"):
        loaded, info = transformers.AutoModelForCausalLM.from_pretrained(folder, output_loading_info=True)
        assert isinstance(loaded, BrickworkForCausalLM)
        assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
        head = loaded.model.lm_head.weight
        assert head.shape[0] == 64 and torch.equal(head[VOCAB:], torch.zeros_like(head[VOCAB:]))
        tied = plain.lm_head.weight is plain.token_embedding.weight
        assert (head is loaded.model.token_embedding.weight) == tied
        with torch.no_grad():
            assert torch.equal(loaded(tokens).logits, ref)
        again = from_pretrained(folder).eval()
        assert again.spec == plain.spec
        with torch.no_grad():
            assert torch.equal(again(tokens), ref)
    greedy = loaded.generate(tokens, max_new_tokens=5, do_sample=False)  # on HF's cache, local layers too
    assert torch.equal(greedy, plain.generate(tokens, 5))
    # HF's folder holds the real vocabulary rows, under the HF class's prefix
    saved = load_file(tmp_path / "hf" / "model.safetensors")
    assert saved["model.token_embedding.weight"].shape[0] == VOCAB


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_causal_lm_outputs_are_hf_s(family: str) -> None:
    hf = hf_model(family)
    plain = from_hf(hf)
    ours = to_hf_class(plain)
    tokens = ids()
    with torch.no_grad():
        ref = hf(tokens, labels=tokens, output_hidden_states=True)
        out = ours(tokens, labels=tokens, output_hidden_states=True)
    assert_close(out.logits, ref.logits)
    assert_close(out.loss, ref.loss)
    assert len(out.hidden_states) == len(ref.hidden_states) == len(plain.layers) + 1
    for mine, theirs in zip(out.hidden_states, ref.hidden_states):
        assert_close(mine, theirs)
    with torch.no_grad():
        assert isinstance(ours(tokens, return_dict=False, use_cache=False), tuple)
        cache = ours(tokens, use_cache=True).to_tuple()[-1]
        assert isinstance(cache, transformers.DynamicCache) and cache.get_seq_length() == tokens.shape[1]
        assert len(ours(tokens, use_cache=False).to_tuple()) == 1  # the logits alone
        # the plain model too gives its logits with a loss, in eval mode (HF's compute_metrics reads them)
        plain_out = plain(tokens, labels=tokens)
        assert_close(plain_out.logits, ref.logits) and assert_close(plain_out.loss, ref.loss)
    training = ours.train()(tokens, labels=tokens)  # while training the head's loss is fused: no logits
    assert training.logits is None and plain.training
    assert_close(training.loss.detach(), ref.loss)
    assert ours.config.spec == plain.spec and ours.device == torch.device("cpu")
    assert ours.num_parameters() == sum(p.numel() for p in plain.parameters())


def test_masked_lm_outputs_are_hf_bert_s_and_round_trip(tmp_path: Path) -> None:
    hf = hf_model("bert", model_class=transformers.BertForMaskedLM)
    ours = to_hf_class(from_hf(hf))
    tokens = ids()
    labels = torch.full_like(tokens, -100)
    labels[:, 2::3] = tokens[:, 2::3]
    with torch.no_grad():
        ref = hf(tokens, labels=labels, output_hidden_states=True)
        out = ours(tokens, labels=labels, output_hidden_states=True)
    assert_close(out.logits, ref.logits)
    assert_close(out.loss, ref.loss)
    for mine, theirs in zip(out.hidden_states, ref.hidden_states, strict=True):
        assert_close(mine, theirs)
    ours.save_pretrained(tmp_path)
    loaded = transformers.AutoModelForMaskedLM.from_pretrained(tmp_path)
    with torch.no_grad():
        assert torch.equal(loaded(tokens).logits, out.logits)
    with pytest.raises(ValueError, match="BrickworkForMaskedLM, not BrickworkForCausalLM"):
        transformers.AutoModelForCausalLM.from_pretrained(tmp_path)


def test_an_image_classifier_round_trips_with_its_classes(tmp_path: Path) -> None:
    spec = get_preset("vit") | {"dim_model": 32, "image_size": 16, "patch_size": 8, "num_classes": 5}
    spec["encoder"] = {**spec["encoder"], "num_layers": 2}
    spec["encoder"]["block"] = {**spec["encoder"]["block"], "attention": {"num_heads": 2}}
    plain = build_model(spec).eval()
    ours = to_hf_class(plain)
    assert ours.config.num_labels == 5
    images = torch.randn(3, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    labels = torch.tensor([0, 4, 2])
    with torch.no_grad():
        out = ours(images, labels=labels, output_hidden_states=True)
        ref = plain(images, labels=labels)
    assert torch.equal(out.logits, ref.logits) and torch.equal(out.loss, ref.loss)
    assert len(out.hidden_states) == 3
    ours.save_pretrained(tmp_path)
    loaded = transformers.AutoModelForImageClassification.from_pretrained(tmp_path)
    with torch.no_grad():
        assert torch.equal(loaded(images).logits, ref.logits)


def test_a_model_without_a_head_hf_has_is_refused() -> None:
    spec = get_preset("bert-base") | {"vocab_size": VOCAB, "dim_model": 32, "head": "none"}
    spec["encoder"] = {**spec["encoder"], "num_layers": 1}
    spec["encoder"]["block"] = {**spec["encoder"]["block"], "attention": {"num_heads": 2}}
    with pytest.raises(ConfigError, match="head: mlm"):
        to_hf_class(build_model(spec))


def seq2seq_spec() -> dict:
    """t5-small, small: rotary positions, a padded vocabulary, cross-attention in every decoder layer."""
    spec = get_preset("t5-small") | {"vocab_size": VOCAB, "dim_model": 32, "max_seq_len": 32, "dropout": 0.0}
    feedforward = {"name": "mlp", "hidden_dim": 48, "bias": False, "activation": "relu"}
    for stack in ("encoder", "decoder"):
        block = {
            **spec[stack]["block"],
            "attention": {"num_heads": 2, "bias": False},
            "feedforward": feedforward,
        }
        if stack == "decoder":
            block["cross_attention"] = {"num_heads": 2, "bias": False}
        spec[stack] = {**spec[stack], "num_layers": 2, "block": block}
    return spec


def test_a_seq2seq_model_generates_on_hf_s_cache_and_round_trips(tmp_path: Path) -> None:
    torch.manual_seed(0)
    plain = build_model(seq2seq_spec()).eval()
    ours = to_hf_class(plain)
    ours.config.decoder_start_token_id = ours.config.pad_token_id = 0
    ours.generation_config.decoder_start_token_id = ours.generation_config.pad_token_id = 0
    source, mask = ids(length=7), torch.ones(2, 7, dtype=torch.long)
    mask[0, :3] = 0
    labels = ids(length=5)
    with torch.no_grad():
        out = ours(source, attention_mask=mask, labels=labels, output_hidden_states=True)
        shifted = torch.cat([torch.zeros_like(labels[:, :1]), labels[:, :-1]], dim=1)  # HF's shift right
        ref = plain(source, shifted, mask, labels=labels)
    assert torch.equal(out.logits, ref.logits) and torch.equal(out.loss, ref.loss)
    assert len(out.decoder_hidden_states) == 3
    targets = torch.zeros_like(labels[:, :1])  # greedy decoding without a cache: the whole target each step
    with torch.no_grad():
        for _ in range(6):
            targets = torch.cat([targets, plain(source, targets, mask)[:, -1:].argmax(-1)], dim=1)
    assert torch.equal(ours.generate(source, attention_mask=mask, max_new_tokens=6, do_sample=False), targets)
    ours.save_pretrained(tmp_path)
    loaded = transformers.AutoModelForSeq2SeqLM.from_pretrained(tmp_path)
    with torch.no_grad():
        assert torch.equal(loaded(source, attention_mask=mask, decoder_input_ids=shifted).logits, ref.logits)
