"""Llama (``LlamaForCausalLM``): RMSNorm, SwiGLU, rotary (half-split), GQA, optional biases.

Mistral, Qwen2, Qwen3 and Mixtral are built the same way, with the same tensor names, and subclass
:class:`Llama`: each changes what differs through its hooks (``attention_options``, ``feedforward``,
``windows``, ``feedforward_rules``, ``layer_plan`` and their ``hf_*`` inverses).

Under tensor parallel q/k/v and gate/up split by columns, o/down by rows; HF's attention reshapes with
-1 heads and keeps the q-per-kv ratio, so no attribute is divided, but both head counts must split.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from torch import nn

from brickwork.errors import ConfigError
from brickwork.layout import ModelPlan, StageRecipe

from .config import HFConfig
from .family import Family, Packed, Rule, Variant, causal_lm, module_rules, prefix, with_head
from .rope import hf_rope, read_rope
from .spec import (
    attention_spec,
    block,
    check_blocks,
    decoder_spec,
    head_dim_of,
    hf_mlp,
    hf_sizes,
    spec_attention,
    spec_block,
    spec_feedforward,
    spec_norm,
    unsupported,
)
from .stages import HFCausalLMStages
from .windows import read_windows, with_windows

# HF module of an attention -> brickwork module.
ATTENTION = {"q_proj": "q_proj", "k_proj": "k_proj", "v_proj": "v_proj", "o_proj": "out_proj"}
# HF module of a layer -> tensor-parallel style, for the plan of a gated MLP family.
GATED_LAYER_PLAN = {
    "self_attn.q_proj": "colwise",
    "self_attn.k_proj": "colwise",
    "self_attn.v_proj": "colwise",
    "self_attn.o_proj": "rowwise",
    "mlp.gate_proj": "colwise",
    "mlp.up_proj": "colwise",
    "mlp.down_proj": "rowwise",
}


class Llama(Family):
    name = "llama"
    model_type = "llama"
    lm: ClassVar[Variant] = causal_lm("LlamaForCausalLM")
    variants: ClassVar[dict[str, Variant]] = {lm.architecture: lm}
    shape = "rotary + RMSNorm + gated MLP"
    ignored_suffixes = ("rotary_emb.inv_freq",)
    tie_default = False
    # Config keys that change nothing the model computes (pretraining-time tensor-parallel slicing:
    # HF computes the same function without it).
    inert: ClassVar[tuple[str, ...]] = ("pretraining_tp",)
    layer_plan: ClassVar[Mapping[str, str]] = GATED_LAYER_PLAN
    # The attention bias the family's HF class can have: True/False/"qkv", or None for a config option.
    attention_bias: ClassVar[bool | str | None] = None
    qk_norm: ClassVar[bool] = False
    # head_dim when the config leaves it out; None: hidden_size // num_attention_heads.
    head_dim_default: ClassVar[int | None] = None

    def spec(self, cfg: HFConfig, variant: Variant) -> dict[str, Any]:
        cfg.expect("is_encoder_decoder", False, False, f"HF {self.name} is a decoder-only model")
        cfg.get("is_decoder")  # causal whatever this flag says
        for key in self.inert:
            cfg.get(key)
        dim = cfg.require("hidden_size")
        heads = cfg.require("num_attention_heads")
        head_dim = cfg.get("head_dim") or self.head_dim_default or dim // heads
        max_len = cfg.get("max_position_embeddings", 2048)
        eps = float(cfg.get("rms_norm_eps", 1e-6))
        attention = attention_spec(
            num_heads=heads,
            num_kv_heads=cfg.get("num_key_value_heads", heads),
            bias=False,
            fused_qkv=False,
            probs_dropout=cfg.dropout("attention_dropout"),
            output_dropout=0.0,
            dim_head=head_dim if head_dim != dim // heads else None,
        )
        position = read_rope(cfg, head_dim, max_len, default_fraction=1.0)
        if position["fraction"] != 1.0:
            raise ConfigError(
                f"{self.name} option partial_rotary_factor={position['fraction']} is not supported: HF "
                f"{self.name} rotates every channel",
                "hf_config.rope_parameters.partial_rotary_factor",
            )
        layers = cfg.require("num_hidden_layers")
        spec = decoder_spec(
            vocab_size=cfg.require("vocab_size"),
            dim_model=dim,
            max_seq_len=max_len,
            position=position,
            dropout=0.0,
            tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            num_layers=layers,
            block=block(
                residual="pre",
                norm={"name": "rmsnorm", "eps": eps},
                attention=attention | self.attention_options(cfg, eps),
                feedforward=self.feedforward(cfg, cfg.activation("hidden_act", "silu")),
            ),
        )
        return with_windows(spec, self.windows(cfg, layers))

    def attention_options(self, cfg: HFConfig, eps: float) -> dict[str, Any]:
        """The attention spec's options that differ between the families (``eps``: the RMSNorms')."""
        return {"bias": bool(cfg.get("attention_bias", False))}

    def feedforward(self, cfg: HFConfig, activation: str) -> dict[str, Any]:
        return gated_mlp(cfg, activation, bias=bool(cfg.get("mlp_bias", False)))

    def windows(self, cfg: HFConfig, num_layers: int) -> list[int | None]:
        """Each layer's sliding window (windows.py), None where it attends to every earlier position."""
        return [None] * num_layers

    def rules(self, spec: Mapping[str, Any], variant: Variant) -> list[Rule | Packed]:
        p = variant.prefix
        attention = spec_attention(spec)
        rules: list[Rule | Packed] = [Rule(f"{p}embed_tokens.weight", "token_embedding.weight")]
        for i in range(spec["decoder"]["num_layers"]):
            h, b = f"{p}layers.{i}.", f"layers.{i}."
            rules += [
                Rule(f"{h}input_layernorm.weight", f"{b}attention_norm.weight"),
                Rule(f"{h}post_attention_layernorm.weight", f"{b}feedforward_norm.weight"),
                *attention_rules(f"{h}self_attn.", f"{b}attention.", attention),
                *self.feedforward_rules(spec, variant, h, b),
            ]
        rules += [Rule(f"{p}norm.weight", "final_norm.weight"), Rule("lm_head.weight", "lm_head.weight")]
        return rules

    def feedforward_rules(
        self, spec: Mapping[str, Any], variant: Variant, h: str, b: str
    ) -> list[Rule | Packed]:
        """The tensors of layer ``h``'s MLP (HF) and ``b``'s feedforward (brickwork)."""
        bias = spec_feedforward(spec, self.name, names=("swiglu", "glu"))["bias"]
        projections = ("gate_proj", "up_proj", "down_proj")
        return [
            rule for n in projections for rule in module_rules(f"{h}mlp.{n}", f"{b}feedforward.{n}", bias)
        ]

    def matches(self, spec: Mapping[str, Any]) -> bool:
        return (
            spec.get("model") == "decoder_lm"
            and spec["position"]["name"] == "rotary"
            and spec_norm(spec)["name"] == "rmsnorm"
        )

    def hf_config(self, spec: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
        windows, plain = read_windows(spec, self.name)
        check_blocks(plain, self.name, ("pre",), "rmsnorm", False, self.attention_bias, self.qk_norm)
        attention = spec_attention(plain)
        if attention["dropout"] or spec_block(spec)["feedforward"].get("dropout") or spec["dropout"]:
            raise unsupported(self.name, "dropout", f"HF {self.name} drops attention probabilities only")
        config = {
            **hf_sizes(spec),
            "num_key_value_heads": attention["num_kv_heads"] or attention["num_heads"],
            "head_dim": head_dim_of(spec),
            "rms_norm_eps": spec_norm(spec)["eps"],
            "rope_parameters": hf_rope(spec["position"], self.name, fraction_allowed=False),
            "attention_dropout": attention["mechanism"].get("dropout", 0.0),
        }
        config |= self.hf_attention(attention, spec_norm(spec)["eps"])
        config |= self.hf_feedforward(spec) | self.hf_windows(windows)
        return self.lm.architecture, config

    def hf_attention(self, attention: Mapping[str, Any], eps: float) -> dict[str, Any]:
        """The HF config options of ``attention_options``, from a spec ``check_blocks`` accepted."""
        return {"attention_bias": attention["bias"]}

    def hf_feedforward(self, spec: Mapping[str, Any]) -> dict[str, Any]:
        ff = spec_feedforward(spec, self.name, names=("swiglu", "glu"))
        return hf_mlp(ff, self.name, "silu") | {"mlp_bias": ff["bias"]}

    def hf_windows(self, windows: Sequence[int | None]) -> dict[str, Any]:
        """The HF config options of the layers' windows."""
        if any(windows):
            raise unsupported(
                self.name, "decoder.block.attention.mechanism.name", f"HF {self.name} has no sliding window"
            )
        return {}

    def tp_plan(self, model: nn.Module) -> ModelPlan:
        p = prefix(model, self.lm)
        plan = {f"{p}layers.*.{hf}": style for hf, style in self.layer_plan.items()}
        heads = {n: getattr(model.config, n) for n in ("num_attention_heads", "num_key_value_heads")}
        return ModelPlan(with_head(model, self.lm, {f"{p}embed_tokens": "vocab", **plan}), {}, heads)

    def stage_recipe(self, model: nn.Module) -> StageRecipe:
        return HFCausalLMStages(model, self.lm, "layers", "embed_tokens", "norm", rotary="rotary_emb")


def attention_rules(hf: str, bw: str, attention: Mapping[str, Any]) -> list[Rule]:
    """The tensors of an HF attention under ``hf`` and of brickwork's under ``bw``: q/k/v/o with the
    biases ``attention["bias"]`` says, and the per-head q/k norms when it has them."""
    bias = attention["bias"]
    rules = []
    for hf_name, bw_name in ATTENTION.items():
        has_bias = bias is True or (bias == "qkv" and hf_name != "o_proj")
        rules += module_rules(f"{hf}{hf_name}", f"{bw}{bw_name}", has_bias)
    if attention.get("qk_norm") is not None:
        rules += [Rule(f"{hf}{name}.weight", f"{bw}{name}.weight") for name in ("q_norm", "k_norm")]
    return rules


def gated_mlp(cfg: HFConfig, activation: str, bias: bool) -> dict[str, Any]:
    """The spec of HF's ``down(act(gate(x)) * up(x))``: SwiGLU, or a GLU of another activation."""
    feedforward = {
        "name": "swiglu" if activation == "silu" else "glu",
        "hidden_dim": cfg.require("intermediate_size"),
        "bias": bias,
        "dropout": 0.0,
    }
    return feedforward if activation == "silu" else feedforward | {"activation": activation}
