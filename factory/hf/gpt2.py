"""GPT-2 (``GPT2LMHeadModel``): learned positions, pre-LayerNorm, fused Conv1D q|k|v, tanh-GELU MLP.

HF's Conv1D stores weights as [in, out], so every projection is transposed; ``c_attn`` holds all
query rows, then all key rows, then all value rows, and is permuted into brickwork's per-head
groups. Under tensor parallel ``c_attn`` splits as three column blocks (``colwise:3``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar

from torch import nn

from brickwork.layout import ModelPlan, StageRecipe

from .config import HFConfig
from .family import Family, Rule, Variant, causal_lm, module_rules, prefix, transposed, with_head
from .layout import blocks_to_groups, groups_to_blocks
from .spec import (
    attention_spec,
    block,
    check_blocks,
    decoder_spec,
    hf_activation,
    mlp_spec,
    spec_attention,
    spec_feedforward,
    spec_norm,
    unsupported,
)
from .stages import HFCausalLMStages

_LM = causal_lm("GPT2LMHeadModel", "transformer", "wte")


class GPT2(Family):
    name = "gpt2"
    model_type = "gpt2"
    variants: ClassVar[dict[str, Variant]] = {_LM.architecture: _LM}
    shape = "learned positions"
    ignored_suffixes = (".attn.bias", ".attn.masked_bias")

    def spec(self, cfg: HFConfig, variant: Variant) -> dict[str, Any]:
        cfg.expect("add_cross_attention", False, False, "brickwork's DecoderLM has no cross-attention")
        cfg.expect("is_encoder_decoder", False, False, "GPT-2 is a decoder-only model")
        cfg.get("is_decoder")  # GPT-2 is causal whatever this flag says
        cfg.get("n_ctx")  # a legacy duplicate of n_positions
        # Mixed-precision detail of HF's eager path: the same function, computed in float32.
        cfg.get("reorder_and_upcast_attn")
        dim = cfg.require("n_embd")
        heads = cfg.require("n_head")
        layers = cfg.require("n_layer")
        # GPT-2's resid_pdrop drops the attention output (brickwork's attention dropout) and the MLP
        # output; brickwork's MLP drops its hidden activations instead (see docs/interop.md).
        resid = cfg.dropout("resid_pdrop")
        attention = attention_spec(
            num_heads=heads,
            bias=True,
            fused_qkv=True,
            probs_dropout=cfg.dropout("attn_pdrop"),
            output_dropout=resid,
        )
        mechanism = attention["mechanism"]
        if not cfg.get("scale_attn_weights", True):
            mechanism["scale"] = 1.0
        feedforward = mlp_spec(
            cfg.get("n_inner") or 4 * dim, cfg.activation("activation_function", "gelu_new"), resid
        )
        out = decoder_spec(
            vocab_size=cfg.require("vocab_size"),
            dim_model=dim,
            max_seq_len=cfg.require("n_positions"),
            position={"name": "learned"},
            dropout=cfg.dropout("embd_pdrop"),
            tie_embeddings=bool(cfg.get("tie_word_embeddings", True)),
            num_layers=layers,
            block=block(
                residual="pre",
                norm={"name": "layernorm", "eps": float(cfg.get("layer_norm_epsilon", 1e-5))},
                attention=attention,
                feedforward=feedforward,
            ),
        )
        if cfg.get("scale_attn_by_inverse_layer_idx", False):
            base = mechanism.get("scale", (dim // heads) ** -0.5)
            # Per-layer overrides merge into the block's mechanism options.
            out["decoder"]["layers"] = {
                i: {"attention": {"mechanism": {"scale": base / (i + 1)}}} for i in range(layers)
            }
        return out

    def rules(self, spec: Mapping[str, Any], variant: Variant) -> list[Rule]:
        p = variant.prefix
        heads = spec_attention(spec)["num_heads"]
        rules = [
            Rule(f"{p}wte.weight", "token_embedding.weight"),
            Rule(f"{p}wpe.weight", "position_embedding.weight"),
        ]
        for i in range(spec["decoder"]["num_layers"]):
            h, b = f"{p}h.{i}.", f"layers.{i}."
            rules += [
                *module_rules(f"{h}ln_1", f"{b}attention_norm"),
                *attention_rules(f"{h}attn.", f"{b}attention.", heads, spec["dim_model"] // heads),
                *module_rules(f"{h}ln_2", f"{b}feedforward_norm"),
                Rule(f"{h}mlp.c_fc.weight", f"{b}feedforward.up_proj.weight", transposed, transposed),
                Rule(f"{h}mlp.c_fc.bias", f"{b}feedforward.up_proj.bias"),
                Rule(f"{h}mlp.c_proj.weight", f"{b}feedforward.down_proj.weight", transposed, transposed),
                Rule(f"{h}mlp.c_proj.bias", f"{b}feedforward.down_proj.bias"),
            ]
        return [*rules, *module_rules(f"{p}ln_f", "final_norm"), Rule("lm_head.weight", "lm_head.weight")]

    def matches(self, spec: Mapping[str, Any]) -> bool:
        return spec.get("model") == "decoder_lm" and spec["position"]["name"] == "learned"

    def hf_config(self, spec: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
        attn = spec_attention(spec)
        dim, heads = spec["dim_model"], attn["num_heads"]
        mechanism = attn["mechanism"]
        scale = mechanism.get("scale")
        if scale not in (None, 1.0, (dim // heads) ** -0.5):
            raise unsupported(
                self.name, "decoder.block.attention.mechanism.scale", "GPT-2 scales by 1/sqrt(D) or 1"
            )
        base = (dim // heads) ** -0.5 if scale is None else scale
        by_layer = _inverse_layer_scaling(spec, mechanism, base)
        check_blocks(
            _without_layers(spec) if by_layer else spec, self.name, ("pre",), "layernorm", True, True
        )
        ff = spec_feedforward(spec, self.name, ("mlp",), bias=True)
        config = {
            "vocab_size": spec["vocab_size"],
            "n_positions": spec["max_seq_len"],
            "n_embd": dim,
            "n_layer": spec["decoder"]["num_layers"],
            "n_head": heads,
            "n_inner": ff["hidden_dim"],
            "activation_function": hf_activation(ff, self.name, "gelu"),
            "layer_norm_epsilon": spec_norm(spec)["eps"],
            "embd_pdrop": spec["dropout"],
            "attn_pdrop": mechanism.get("dropout", 0.0),
            "resid_pdrop": attn["dropout"],
            "tie_word_embeddings": spec["tie_embeddings"],
            "scale_attn_weights": base != 1.0,
            "scale_attn_by_inverse_layer_idx": by_layer,
        }
        return "GPT2LMHeadModel", config

    def tp_plan(self, model: nn.Module) -> ModelPlan:
        p = prefix(model, _LM)
        plan = {
            f"{p}wte": "vocab",
            f"{p}h.*.attn.c_attn": "colwise:3",  # q | k | v: each rank takes its heads of each
            f"{p}h.*.attn.c_proj": "rowwise",
            f"{p}h.*.mlp.c_fc": "colwise",
            f"{p}h.*.mlp.c_proj": "rowwise",
        }
        # The attention splits its fused output by split_size and reshapes by the head count.
        divide = {f"{p}h.*.attn": ["split_size", "num_heads", "embed_dim"]}
        return ModelPlan(with_head(model, _LM, plan), divide, {"n_head": model.config.n_head})

    def stage_recipe(self, model: nn.Module) -> StageRecipe:
        return HFCausalLMStages(model, _LM, "h", "wte", "ln_f", position="wpe", dropout="drop")


def attention_rules(hf: str, bw: str, heads: int, head_dim: int) -> list[Rule]:
    """The tensors of a ``GPT2Attention`` under ``hf`` and of brickwork's attention under ``bw``."""

    def qkv_in(t):
        return blocks_to_groups(t.t() if t.dim() == 2 else t, heads, head_dim).contiguous()

    def qkv_out(t):
        t = groups_to_blocks(t, heads, head_dim)
        return t.t().contiguous() if t.dim() == 2 else t

    return [
        Rule(f"{hf}c_attn.weight", f"{bw}qkv_proj.weight", qkv_in, qkv_out),
        Rule(f"{hf}c_attn.bias", f"{bw}qkv_proj.bias", qkv_in, qkv_out),
        Rule(f"{hf}c_proj.weight", f"{bw}out_proj.weight", transposed, transposed),
        Rule(f"{hf}c_proj.bias", f"{bw}out_proj.bias"),
    ]


def _inverse_layer_scaling(spec: Mapping[str, Any], mechanism: Mapping[str, Any], base: float) -> bool:
    """Whether the per-layer overrides are exactly GPT-2's scale_attn_by_inverse_layer_idx."""
    layers = {int(k): v for k, v in (spec["decoder"].get("layers") or {}).items()}
    if set(layers) != set(range(spec["decoder"]["num_layers"])):
        return False
    others = {k: v for k, v in mechanism.items() if k != "scale"}
    for i, override in layers.items():
        inner = override.get("attention", {}).get("mechanism", {})
        if override != {"attention": {"mechanism": inner}}:
            return False
        merged = {**mechanism, **inner}
        scale = merged.pop("scale", None)
        if merged != others or scale is None or not math.isclose(scale, base / (i + 1)):
            return False
    return True


def _without_layers(spec: Mapping[str, Any]) -> dict[str, Any]:
    return {**spec, "decoder": {k: v for k, v in spec["decoder"].items() if k != "layers"}}
