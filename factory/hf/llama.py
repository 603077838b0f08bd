"""Llama (``LlamaForCausalLM``): RMSNorm, SwiGLU, rotary (half-split), GQA, optional biases.

Under tensor parallel q/k/v and gate/up split by columns, o/down by rows; HF's attention reshapes with
-1 heads and keeps the q-per-kv ratio, so no attribute is divided, but both head counts must split.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from torch import nn

from brickwork.layout import ModelPlan, StageRecipe

from .config import HFConfig
from .family import Family, Rule, Variant, prefix, with_head
from .rope import hf_rope, read_rope
from .spec import (
    attention_spec,
    block,
    check_blocks,
    decoder_spec,
    head_dim_of,
    hf_activation,
    spec_attention,
    spec_feedforward,
    spec_norm,
    unsupported,
)
from .stages import HFCausalLMStages

_LM = Variant(
    "LlamaForCausalLM",
    head="lm",
    prefix="model.",
    tied={"lm_head.weight": "model.embed_tokens.weight"},
    head_prefixes=("lm_head.",),
)
# HF projection of a layer -> (brickwork module, tensor-parallel style): the weight map and the plan.
_PROJECTIONS = {
    "self_attn.q_proj": ("attention.q_proj", "colwise"),
    "self_attn.k_proj": ("attention.k_proj", "colwise"),
    "self_attn.v_proj": ("attention.v_proj", "colwise"),
    "self_attn.o_proj": ("attention.out_proj", "rowwise"),
    "mlp.gate_proj": ("feedforward.gate_proj", "colwise"),
    "mlp.up_proj": ("feedforward.up_proj", "colwise"),
    "mlp.down_proj": ("feedforward.down_proj", "rowwise"),
}


class Llama(Family):
    name = "llama"
    model_type = "llama"
    variants: ClassVar[dict[str, Variant]] = {_LM.architecture: _LM}
    shape = "rotary + RMSNorm + gated MLP"
    ignored_suffixes = ("rotary_emb.inv_freq",)
    tie_default = False

    def spec(self, cfg: HFConfig, variant: Variant) -> dict[str, Any]:
        cfg.expect("is_encoder_decoder", False, False, "Llama is a decoder-only model")
        cfg.get("is_decoder")  # Llama is causal whatever this flag says
        # Pretraining-time tensor-parallel slicing; HF computes the same function without it.
        cfg.get("pretraining_tp")
        dim = cfg.require("hidden_size")
        heads = cfg.require("num_attention_heads")
        head_dim = cfg.get("head_dim", dim // heads)
        activation = cfg.activation("hidden_act", "silu")
        bias = bool(cfg.get("attention_bias", False))
        mlp_bias = bool(cfg.get("mlp_bias", False))
        max_len = cfg.get("max_position_embeddings", 2048)
        attention = attention_spec(
            num_heads=heads,
            num_kv_heads=cfg.get("num_key_value_heads", heads),
            bias=bias,
            fused_qkv=False,
            probs_dropout=cfg.dropout("attention_dropout"),
            output_dropout=0.0,
            dim_head=head_dim if head_dim != dim // heads else None,
        )
        feedforward = {
            "name": "swiglu" if activation == "silu" else "glu",
            "hidden_dim": cfg.require("intermediate_size"),
            "bias": mlp_bias,
            "dropout": 0.0,
        }
        if activation != "silu":
            feedforward["activation"] = activation
        position = read_rope(cfg, head_dim, max_len, default_fraction=1.0)
        if position["fraction"] != 1.0:
            raise unsupported(
                self.name, "hf_config.rope_parameters.partial_rotary_factor", "HF Llama rotates every channel"
            )
        return decoder_spec(
            vocab_size=cfg.require("vocab_size"),
            dim_model=dim,
            max_seq_len=max_len,
            position=position,
            dropout=0.0,
            tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            num_layers=cfg.require("num_hidden_layers"),
            block=block(
                residual="pre",
                norm={"name": "rmsnorm", "eps": float(cfg.get("rms_norm_eps", 1e-6))},
                attention=attention,
                feedforward=feedforward,
            ),
        )

    def rules(self, spec: Mapping[str, Any], variant: Variant) -> list[Rule]:
        p = variant.prefix
        attn = spec_attention(spec)
        ff = spec_feedforward(spec, self.name, names=("swiglu", "glu"))
        bias = {"self_attn": attn["bias"], "mlp": ff["bias"]}
        rules = [Rule(f"{p}embed_tokens.weight", "token_embedding.weight")]
        for i in range(spec["decoder"]["num_layers"]):
            h, b = f"{p}layers.{i}.", f"layers.{i}."
            rules += [
                Rule(f"{h}input_layernorm.weight", f"{b}attention_norm.weight"),
                Rule(f"{h}post_attention_layernorm.weight", f"{b}feedforward_norm.weight"),
            ]
            for hf, (bw, _) in _PROJECTIONS.items():
                rules.append(Rule(f"{h}{hf}.weight", f"{b}{bw}.weight"))
                if bias[hf.split(".")[0]]:
                    rules.append(Rule(f"{h}{hf}.bias", f"{b}{bw}.bias"))
        rules += [Rule(f"{p}norm.weight", "final_norm.weight"), Rule("lm_head.weight", "lm_head.weight")]
        return rules

    def matches(self, spec: Mapping[str, Any]) -> bool:
        return (
            spec.get("model") == "decoder_lm"
            and spec["position"]["name"] == "rotary"
            and spec_norm(spec)["name"] == "rmsnorm"
        )

    def hf_config(self, spec: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
        check_blocks(spec, self.name, ("pre",), "rmsnorm", fused_qkv=False, bias=None)
        attn = spec_attention(spec)
        ff = spec_feedforward(spec, self.name, names=("swiglu", "glu"))
        if attn["dropout"] or ff["dropout"] or spec["dropout"]:
            raise unsupported(self.name, "dropout", "Llama drops attention probabilities only")
        dim = spec["dim_model"]
        head_dim = head_dim_of(spec)
        config = {
            "vocab_size": spec["vocab_size"],
            "hidden_size": dim,
            "intermediate_size": ff["hidden_dim"],
            "num_hidden_layers": spec["decoder"]["num_layers"],
            "num_attention_heads": attn["num_heads"],
            "num_key_value_heads": attn["num_kv_heads"] or attn["num_heads"],
            "head_dim": head_dim,
            "hidden_act": hf_activation(ff, self.name, "silu"),
            "max_position_embeddings": spec["max_seq_len"],
            "rms_norm_eps": spec_norm(spec)["eps"],
            "tie_word_embeddings": spec["tie_embeddings"],
            "rope_parameters": hf_rope(spec["position"], self.name, fraction_allowed=False),
            "attention_bias": attn["bias"],
            "attention_dropout": attn["mechanism"].get("dropout", 0.0),
            "mlp_bias": ff["bias"],
        }
        return "LlamaForCausalLM", config

    def tp_plan(self, model: nn.Module) -> ModelPlan:
        p = prefix(model, _LM)
        plan = {f"{p}layers.*.{hf}": style for hf, (_, style) in _PROJECTIONS.items()}
        heads = {n: getattr(model.config, n) for n in ("num_attention_heads", "num_key_value_heads")}
        return ModelPlan(with_head(model, _LM, {f"{p}embed_tokens": "vocab", **plan}), {}, heads)

    def stage_recipe(self, model: nn.Module) -> StageRecipe:
        return HFCausalLMStages(model, _LM, "layers", "embed_tokens", "norm", rotary="rotary_emb")
