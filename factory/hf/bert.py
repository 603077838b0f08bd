"""BERT (``BertModel``, ``BertForMaskedLM``): post-norm encoder with token-type embeddings.

The embeddings are summed and then normalised (``embedding_norm``); each layer normalises after its
residual add. ``BertModel`` may carry the tanh pooler, ``BertForMaskedLM`` carries the MLM head,
whose decoder bias HF stores under two names (``cls.predictions.bias`` and its alias).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any, ClassVar

from .config import HFConfig
from .family import Family, Rule, Variant
from .spec import (
    attention_spec,
    block,
    check_blocks,
    encoder_spec,
    hf_activation,
    mlp_spec,
    spec_attention,
    spec_feedforward,
    spec_norm,
    unsupported,
)

_MLM_TIED = {"cls.predictions.decoder.weight": "bert.embeddings.word_embeddings.weight"}
_MLM_BIAS = {"cls.predictions.decoder.bias": "cls.predictions.bias"}


class Bert(Family):
    name = "bert"
    model_type = "bert"
    variants: ClassVar[dict[str, Variant]] = {
        "BertModel": Variant("BertModel", head="none", prefix=""),
        "BertModel+pooler": Variant("BertModel", head="none", prefix="", pooler=True),
        "BertForMaskedLM": Variant(
            "BertForMaskedLM",
            head="mlm",
            prefix="bert.",
            tied=_MLM_TIED,
            aliases=_MLM_BIAS,
            # A pretraining checkpoint also holds the pooler and the next-sentence head, which HF
            # skips when it loads BertForMaskedLM.
            skipped_prefixes=("bert.pooler.", "cls.seq_relationship."),
            head_prefixes=("cls.",),
        ),
    }
    ignored_suffixes = ("embeddings.position_ids",)

    def variant(self, architecture: str, keys: Collection[str]) -> Variant:
        if architecture == "BertModel" and "pooler.dense.weight" in keys:
            architecture = "BertModel+pooler"
        return super().variant(architecture, keys)

    def spec(self, cfg: HFConfig, variant: Variant) -> dict[str, Any]:
        cfg.expect("is_decoder", False, False, "brickwork builds BERT as a bidirectional encoder")
        cfg.expect("add_cross_attention", False, False, "brickwork's Encoder has no cross-attention")
        cfg.expect("is_encoder_decoder", False, False, "BERT is an encoder")
        cfg.expect("position_embedding_type", "absolute", "absolute", "only absolute positions are mapped")
        dim = cfg.require("hidden_size")
        activation = cfg.activation("hidden_act", "gelu")
        eps = float(cfg.get("layer_norm_eps", 1e-12))
        # hidden_dropout_prob drops the embeddings and both branch outputs; brickwork's MLP drops its
        # hidden activations instead (see docs/interop.md).
        hidden_dropout = cfg.dropout("hidden_dropout_prob")
        attention = attention_spec(
            num_heads=cfg.require("num_attention_heads"),
            bias=True,
            fused_qkv=False,
            probs_dropout=cfg.dropout("attention_probs_dropout_prob"),
            output_dropout=hidden_dropout,
        )
        feedforward = mlp_spec(cfg.require("intermediate_size"), activation, hidden_dropout)
        return encoder_spec(
            vocab_size=cfg.require("vocab_size"),
            dim_model=dim,
            max_seq_len=cfg.get("max_position_embeddings", 512),
            type_vocab_size=cfg.get("type_vocab_size", 2),
            dropout=hidden_dropout,
            eps=eps,
            head="mlm" if variant.head == "mlm" else None,
            head_activation=activation,  # HF's MLM head transform uses the feedforward's hidden_act
            pooler=variant.pooler,
            tie_embeddings=bool(cfg.get("tie_word_embeddings", True)),
            num_layers=cfg.require("num_hidden_layers"),
            block=block(
                residual="post",
                norm={"name": "layernorm", "eps": eps},
                attention=attention,
                feedforward=feedforward,
            ),
        )

    def rules(self, spec: Mapping[str, Any], variant: Variant) -> list[Rule]:
        p = variant.prefix
        e = f"{p}embeddings."
        rules = [
            Rule(f"{e}word_embeddings.weight", "token_embedding.weight"),
            Rule(f"{e}position_embeddings.weight", "position_embedding.weight"),
            Rule(f"{e}token_type_embeddings.weight", "token_type_embedding.weight"),
            Rule(f"{e}LayerNorm.weight", "embedding_norm.weight"),
            Rule(f"{e}LayerNorm.bias", "embedding_norm.bias"),
        ]
        for i in range(spec["encoder"]["num_layers"]):
            h, b = f"{p}encoder.layer.{i}.", f"layers.{i}."
            pairs = [
                ("attention.self.query", "attention.q_proj"),
                ("attention.self.key", "attention.k_proj"),
                ("attention.self.value", "attention.v_proj"),
                ("attention.output.dense", "attention.out_proj"),
                ("attention.output.LayerNorm", "attention_norm"),
                ("intermediate.dense", "feedforward.up_proj"),
                ("output.dense", "feedforward.down_proj"),
                ("output.LayerNorm", "feedforward_norm"),
            ]
            rules += [Rule(f"{h}{hf}.{t}", f"{b}{bw}.{t}") for hf, bw in pairs for t in ("weight", "bias")]
        if variant.pooler:
            rules += [Rule(f"{p}pooler.dense.{t}", f"pooler.dense.{t}") for t in ("weight", "bias")]
        if variant.head == "mlm":
            c = "cls.predictions."
            rules += [
                Rule(f"{c}transform.dense.weight", "mlm_head.dense.weight"),
                Rule(f"{c}transform.dense.bias", "mlm_head.dense.bias"),
                Rule(f"{c}transform.LayerNorm.weight", "mlm_head.norm.weight"),
                Rule(f"{c}transform.LayerNorm.bias", "mlm_head.norm.bias"),
                Rule(f"{c}decoder.weight", "mlm_head.decoder.weight"),
                Rule(f"{c}bias", "mlm_head.decoder.bias"),
            ]
        return rules

    def matches(self, spec: Mapping[str, Any]) -> bool:
        return spec.get("model") == "encoder"

    def hf_config(self, spec: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
        check_blocks(spec, self.name, ("post",), "layernorm", fused_qkv=False, bias=True)
        attn = spec_attention(spec)
        ff = spec_feedforward(spec, self.name, names=("mlp",))
        mlm = spec.get("head") == "mlm"
        if mlm and spec.get("pooler"):
            raise unsupported(self.name, "pooler", "HF's BertForMaskedLM has no pooler")
        if mlm and spec.get("head_activation", "gelu") != ff["activation"]:
            raise unsupported(
                self.name, "head_activation", "HF BERT uses one hidden_act for the MLM head and the MLP"
            )
        config = {
            "vocab_size": spec["vocab_size"],
            "hidden_size": spec["dim_model"],
            "num_hidden_layers": spec["encoder"]["num_layers"],
            "num_attention_heads": attn["num_heads"],
            "intermediate_size": ff["hidden_dim"],
            "hidden_act": hf_activation(ff, self.name, "gelu"),
            "hidden_dropout_prob": spec["dropout"],
            "attention_probs_dropout_prob": attn["mechanism"].get("dropout", 0.0),
            "max_position_embeddings": spec["max_seq_len"],
            "type_vocab_size": spec["type_vocab_size"],
            "layer_norm_eps": spec_norm(spec)["eps"],
            "tie_word_embeddings": spec["tie_embeddings"],
        }
        return ("BertForMaskedLM" if mlm else "BertModel"), config
