"""GPT-NeoX (``GPTNeoXForCausalLM``): partial rotary, per-head fused qkv, parallel or pre residual.

``query_key_value`` holds ``[q_h, k_h, v_h]`` for each head in turn, which is brickwork's fused
per-group layout when every head is its own kv group, so its rows are copied as they are, and a plain
column split under tensor parallel keeps whole heads. The LM head is ``lm_head`` in recent
transformers and ``embed_out`` in older checkpoints and classes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from torch import nn

from brickwork.layout import ModelPlan, StageRecipe

from .config import HFConfig
from .family import Family, Rule, Variant, module_rules, prefix, with_head
from .rope import hf_rope, read_rope
from .spec import (
    attention_spec,
    block,
    check_blocks,
    decoder_spec,
    hf_mlp,
    hf_sizes,
    mlp_spec,
    spec_attention,
    spec_block,
    spec_feedforward,
    spec_norm,
    unsupported,
)
from .stages import HFCausalLMStages

_LM = Variant(
    "GPTNeoXForCausalLM",
    head="lm",
    prefix="gpt_neox.",
    tied={"lm_head.weight": "gpt_neox.embed_in.weight"},
    renamed={"embed_out.weight": "lm_head.weight"},
    head_prefixes=("lm_head.", "embed_out."),
)
# HF projection of a layer -> (brickwork module, tensor-parallel style): the weight map and the plan.
# query_key_value's rows are [heads, (q, k, v), head_dim]: a plain column split keeps whole heads.
_PROJECTIONS = {
    "attention.query_key_value": ("attention.qkv_proj", "colwise"),
    "attention.dense": ("attention.out_proj", "rowwise"),
    "mlp.dense_h_to_4h": ("feedforward.up_proj", "colwise"),
    "mlp.dense_4h_to_h": ("feedforward.down_proj", "rowwise"),
}


class GPTNeoX(Family):
    name = "gpt_neox"
    model_type = "gpt_neox"
    variants: ClassVar[dict[str, Variant]] = {_LM.architecture: _LM}
    shape = "rotary + LayerNorm + MLP"
    ignored_suffixes = (".attention.bias", ".attention.masked_bias", "rotary_emb.inv_freq")
    tie_default = False

    def spec(self, cfg: HFConfig, variant: Variant) -> dict[str, Any]:
        cfg.expect("is_encoder_decoder", False, False, "GPT-NeoX is a decoder-only model")
        cfg.get("is_decoder")  # GPT-NeoX is causal whatever this flag says
        dim = cfg.require("hidden_size")
        heads = cfg.require("num_attention_heads")
        head_dim = dim // heads
        max_len = cfg.get("max_position_embeddings", 2048)
        # hidden_dropout drops the embeddings and both branch outputs; brickwork's MLP drops its
        # hidden activations instead (see docs/interop.md).
        hidden_dropout = cfg.dropout("hidden_dropout")
        attention = attention_spec(
            num_heads=heads,
            bias=bool(cfg.get("attention_bias", True)),
            fused_qkv=True,
            probs_dropout=cfg.dropout("attention_dropout"),
            output_dropout=hidden_dropout,
        )
        feedforward = mlp_spec(
            cfg.require("intermediate_size"), cfg.activation("hidden_act", "gelu"), hidden_dropout
        )
        parallel = bool(cfg.get("use_parallel_residual", True))
        return decoder_spec(
            vocab_size=cfg.require("vocab_size"),
            dim_model=dim,
            max_seq_len=max_len,
            position=read_rope(cfg, head_dim, max_len, default_fraction=0.25),
            dropout=hidden_dropout,
            tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            num_layers=cfg.require("num_hidden_layers"),
            block=block(
                residual="parallel" if parallel else "pre",
                norm={"name": "layernorm", "eps": float(cfg.get("layer_norm_eps", 1e-5))},
                attention=attention,
                feedforward=feedforward,
            ),
        )

    def rules(self, spec: Mapping[str, Any], variant: Variant) -> list[Rule]:
        p = variant.prefix
        bias = spec_attention(spec)["bias"]
        rules = [Rule(f"{p}embed_in.weight", "token_embedding.weight")]
        for i in range(spec["decoder"]["num_layers"]):
            h, b = f"{p}layers.{i}.", f"layers.{i}."
            names = {"input_layernorm": "attention_norm", "post_attention_layernorm": "feedforward_norm"}
            names |= {hf: bw for hf, (bw, _) in _PROJECTIONS.items()}
            for hf, bw in names.items():  # the norms and the MLP always have biases
                rules += module_rules(f"{h}{hf}", f"{b}{bw}", bias or not hf.startswith("attention."))
        rules += [
            *module_rules(f"{p}final_layer_norm", "final_norm"),
            Rule("lm_head.weight", "lm_head.weight"),
        ]
        return rules

    def matches(self, spec: Mapping[str, Any]) -> bool:
        return (
            spec.get("model") == "decoder_lm"
            and spec["position"]["name"] == "rotary"
            and spec_norm(spec)["name"] == "layernorm"
        )

    def hf_config(self, spec: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
        residual = spec_block(spec)["residual"]["name"]
        check_blocks(spec, self.name, ("pre", "parallel"), "layernorm", fused_qkv=True, bias=None)
        attn = spec_attention(spec)
        if attn["num_kv_heads"] not in (None, attn["num_heads"]) or attn.get("dim_head"):
            raise unsupported(self.name, "decoder.block.attention", "GPT-NeoX has no GQA and D = dim / H")
        ff = spec_feedforward(spec, self.name, ("mlp",), bias=True)
        config = {
            **hf_sizes(spec),
            **hf_mlp(ff, self.name, "gelu"),
            "attention_dropout": attn["mechanism"].get("dropout", 0.0),
            "hidden_dropout": spec["dropout"],
            "layer_norm_eps": spec_norm(spec)["eps"],
            "use_parallel_residual": residual == "parallel",
            "rope_parameters": hf_rope(spec["position"], self.name, fraction_allowed=True),
            "attention_bias": attn["bias"],
        }
        return "GPTNeoXForCausalLM", config

    def tp_plan(self, model: nn.Module) -> ModelPlan:
        p = prefix(model, _LM)
        plan = {f"{p}layers.*.{hf}": style for hf, (_, style) in _PROJECTIONS.items()}
        heads = {"num_attention_heads": model.config.num_attention_heads}
        return ModelPlan(with_head(model, _LM, {f"{p}embed_in": "vocab", **plan}), {}, heads)

    def stage_recipe(self, model: nn.Module) -> StageRecipe:
        return HFCausalLMStages(
            model, _LM, "layers", "embed_in", "final_layer_norm",
            dropout="emb_dropout", rotary="rotary_emb",
        )  # fmt: skip
