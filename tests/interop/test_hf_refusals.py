"""HF options brickwork cannot express are refused with a ConfigError naming them, never dropped."""

import copy

import pytest
import torch
from hf_models import CONFIGS, VOCAB, hf_model

from brickwork.errors import ConfigError
from brickwork.factory import build_model, from_hf, to_hf
from brickwork.factory.hf import hf_to_spec

ARCHITECTURE = {"gpt2": "GPT2LMHeadModel", "bert": "BertForMaskedLM", "llama": "LlamaForCausalLM",
                "gpt_neox": "GPTNeoXForCausalLM", "mistral": "MistralForCausalLM",
                "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
                "mixtral": "MixtralForCausalLM"}  # fmt: skip


def _config(family: str, **changes) -> dict:
    """The config.json form of a tiny config, with ``changes`` written over it."""
    config_class, _, options = CONFIGS[family]
    return {**config_class(**options).to_dict(), **changes}


@pytest.mark.parametrize(
    "family,changes,named",
    [
        ("gpt2", {"add_cross_attention": True}, "add_cross_attention"),
        ("gpt2", {"activation_function": "quick_gelu"}, "activation_function"),
        ("bert", {"is_decoder": True}, "is_decoder"),
        ("bert", {"position_embedding_type": "relative_key"}, "position_embedding_type"),
        ("bert", {"hidden_act": "tanh"}, "hidden_act"),
        ("llama", {"rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}},
         "rope_type"),
        ("llama", {"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4}}, "rope_type"),
        ("llama", {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4, "spin": 1}},
         "rope_parameters.spin"),
        ("llama", {"hidden_act": "tanh"}, "hidden_act"),
        ("llama", {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4,
                                       "partial_rotary_factor": 0.5}}, "factor=0.5 is not supported"),
        ("gpt_neox", {"brand_new_option": 3}, "brand_new_option"),
        ("gpt_neox", {"attn_dropout_typo": 0.1}, "attn_dropout_typo"),
        ("mistral", {"attention_bias": True}, "attention_bias"),  # HF's Mistral has none, whatever this says
        ("qwen2", {"layer_types": ["full_attention", "chunked_attention", "full_attention"]}, "layer_types"),
        ("qwen2", {"use_sliding_window": False, "layer_types": ["sliding_attention"] * 3}, "layer_types"),
        ("mixtral", {"output_router_logits": True}, "output_router_logits"),
        ("mixtral", {"router_jitter_noise": 0.1}, "router_jitter_noise"),
    ],
)  # fmt: skip
def test_unsupported_options_are_named(family: str, changes: dict, named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        hf_to_spec(_config(family, **changes), ARCHITECTURE[family])


def test_unknown_family_and_class_list_the_choices() -> None:
    allowed = "bert, gpt2, gpt_neox, llama, mistral, mixtral, qwen2, qwen3"
    with pytest.raises(ConfigError, match=rf"model_type.*allowed: {allowed}"):
        hf_to_spec({"model_type": "t5"}, "T5Model")
    with pytest.raises(ConfigError, match=r"architectures.*GPT2LMHeadModel"):
        hf_to_spec(_config("gpt2"), "GPT2ForSequenceClassification")


def test_inert_options_are_accepted_and_the_input_is_not_changed() -> None:
    """Token ids, init ranges and generation defaults do not change the outputs; they are allowed."""
    config = _config("gpt2", pad_token_id=3, initializer_range=0.5, num_beams=4)
    before = dict(config)
    spec = hf_to_spec(config, "GPT2LMHeadModel")
    assert config == before
    assert spec["decoder"]["block"]["feedforward"]["activation"] == "gelu_tanh"
    assert spec["decoder"]["block"]["norm"] == {"name": "layernorm", "eps": 1e-5}


def test_spec_carries_family_options() -> None:
    llama = hf_to_spec(hf_model("llama").config, "LlamaForCausalLM")
    assert llama["position"] == {"name": "rotary", "base": 500.0, "fraction": 1.0}
    assert llama["decoder"]["block"]["attention"]["num_kv_heads"] == 2
    assert llama["decoder"]["block"]["norm"] == {"name": "rmsnorm", "eps": 1e-6}
    assert llama["tie_embeddings"] is False
    neox = hf_to_spec(_config("gpt_neox"), "GPTNeoXForCausalLM")
    assert neox["position"] == {"name": "rotary", "base": 1000.0, "fraction": 0.5}
    assert neox["decoder"]["block"]["residual"] == {"name": "parallel"}
    bert = hf_to_spec(_config("bert"), "BertForMaskedLM")
    assert bert["decoder" if "decoder" in bert else "encoder"]["block"]["norm"]["eps"] == 1e-12
    assert bert["head"] == "mlm" and bert["type_vocab_size"] == 3 and bert["embedding_norm"] is True


def test_legacy_rope_keys_are_read() -> None:
    """config.json files from before transformers 5 keep rope_theta and rope_scaling at the top level."""
    config = _config("llama")
    config.pop("rope_parameters")
    config.update(rope_theta=2500.0, rope_scaling={"type": "linear", "factor": 3.0})
    spec = hf_to_spec(config, "LlamaForCausalLM")
    assert spec["position"] == {"name": "rotary", "base": 2500.0, "fraction": 1.0,
                                "scaling": {"type": "linear", "factor": 3.0}}  # fmt: skip


def _with(spec: dict, path: str, value) -> dict:
    """A copy of ``spec`` with the dotted ``path`` set to ``value``."""
    spec = copy.deepcopy(spec)
    *parents, leaf = path.split(".")
    here = spec
    for key in parents:
        here = here.setdefault(int(key) if key.isdigit() else key, {})
    here[leaf] = value
    return spec


@pytest.mark.parametrize(
    "family,path,value,named",
    [
        ("qwen3", "decoder.block.attention.qk_norm", {"name": "layernorm"}, "qk_norm"),
        ("qwen3", "decoder.block.attention.qk_norm", {"name": "rmsnorm", "eps": 1e-3}, "qk_norm"),
        ("qwen2", "decoder.block.attention.bias", True, "bias"),  # to Qwen2 or Llama: out_proj has none
        ("mixtral", "decoder.block.feedforward.aux_loss_weight", 0.01, "aux_loss_weight"),
        ("mixtral", "decoder.block.feedforward.normalize_top_k", False, "normalize_top_k"),
        ("mixtral", "decoder.block.feedforward.bias", True, "bias"),
        ("mistral", "decoder.layers.1.attention.mechanism.window_size", 3, "same window"),
        ("mistral", "decoder.layers.1.attention.dropout", 0.1, "window only"),
        ("gpt_neox", "decoder.block.attention.qk_norm", {"name": "layernorm"}, "qk_norm"),
        ("gpt2", "decoder.block.attention.bias", "qkv", "bias"),
        ("bert", "encoder.block.feedforward.bias", False, "has biases"),
    ],
)  # fmt: skip
def test_to_hf_refuses_what_the_family_cannot_express(family: str, path: str, value, named: str) -> None:
    spec = _with(from_hf(hf_model(family)).spec, path, value)
    with pytest.raises(ConfigError, match=named):
        to_hf(build_model(spec))


@pytest.mark.parametrize(
    "family,path,value,exported",
    [
        ("llama", "decoder.block.attention.qk_norm", {"name": "rmsnorm"}, "Qwen3ForCausalLM"),
        ("llama", "decoder.block.attention.bias", "qkv", "Qwen2ForCausalLM"),
        ("mistral", "decoder.block.attention.mechanism", {"name": "scaled_dot_product"}, "LlamaForCausalLM"),
    ],
)  # fmt: skip
def test_a_llama_shaped_spec_exports_to_the_family_that_expresses_it(
    family: str, path: str, value, exported: str
) -> None:
    model = build_model(_with(from_hf(hf_model(family)).spec, path, value)).eval()
    back = to_hf(model)
    assert type(back).__name__ == exported
    ids = torch.randint(0, VOCAB, (2, 11), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(back(ids).logits, model(ids), rtol=1e-5, atol=1e-5)


def test_to_hf_refuses_an_mlm_head_activation_hf_cannot_express() -> None:
    spec = from_hf(hf_model("bert")).spec
    spec = {**spec, "head_activation": "relu"}  # the MLP stays gelu: HF has one hidden_act for both
    with pytest.raises(ConfigError, match="head_activation"):
        to_hf(build_model(spec))


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_a_head_that_differs_from_the_embedding_it_is_tied_to_is_refused_by_name(family: str) -> None:
    """tie_word_embeddings=True, but lm_head was replaced by another tensor: HF's forward uses the head,
    its tie_weights the embedding. Which one the user meant is unknowable, so both are named."""
    hf = hf_model(family, tie_word_embeddings=True)
    embedding = hf.get_input_embeddings().weight
    assert hf.lm_head.weight is embedding
    hf.lm_head.weight = torch.nn.Parameter(embedding.detach() + 0.25)
    embedding_key = "transformer.wte.weight" if family == "gpt2" else "model.embed_tokens.weight"
    message = rf"tie_word_embeddings=True\), but lm_head\.weight differs from {embedding_key} by up to 0\.25"
    with pytest.raises(ConfigError, match=message):
        from_hf(hf)
    hf.lm_head.weight = embedding  # tied again: accepted
    from_hf(hf)
