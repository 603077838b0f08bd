"""BERT (``BertModel``, ``BertForMaskedLM``): post-norm encoder with token-type embeddings.

The embeddings are summed and then normalised (``embedding_norm``); each layer normalises after its
residual add. ``BertModel`` may carry the tanh pooler, ``BertForMaskedLM`` carries the MLM head,
whose decoder bias HF stores under two names (``cls.predictions.bias`` and its alias).

Under tensor parallel each attention's q/k/v sit under ``attention.self`` and their row-wise partner
under ``attention.output``; the MLP's halves are ``intermediate.dense`` and ``output.dense`` of the
layer. So the plan is written per layer, each attention and each layer owning its pair: a glob such as
``layer.*.output.dense`` would also match ``attention.output.dense``, since ``*`` crosses dots. The
masked-LM decoder is split on the vocabulary like the word embedding it is tied to, and
``cls.predictions.bias`` (tied to its bias) follows it; the small dense layers of the pooler, the MLM
transform and classifiers stay whole.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any, ClassVar

import torch
from torch import nn

from brickwork.errors import ConfigError
from brickwork.layout import ModelPlan, Stage, StageRecipe

from .config import HFConfig
from .family import Family, Rule, Variant, module_rules, prefix
from .spec import (
    attention_spec,
    block,
    check_blocks,
    hf_mlp,
    hf_sizes,
    mlp_spec,
    spec_attention,
    spec_feedforward,
    spec_norm,
    unsupported,
)
from .stages import run_layers

_MLM = Variant(
    "BertForMaskedLM",
    head="mlm",
    prefix="bert.",
    tied={"cls.predictions.decoder.weight": "bert.embeddings.word_embeddings.weight"},
    aliases={"cls.predictions.decoder.bias": "cls.predictions.bias"},
    # A pretraining checkpoint also holds the pooler and the next-sentence head, which HF skips when
    # it loads BertForMaskedLM.
    skipped_prefixes=("bert.pooler.", "cls.seq_relationship."),
    head_prefixes=("cls.",),
)
# HF module -> (brickwork module, tensor-parallel style), of an attention and of a layer's MLP: the
# weight map and the plan read them.
_ATTENTION = {
    "self.query": ("q_proj", "colwise"),
    "self.key": ("k_proj", "colwise"),
    "self.value": ("v_proj", "colwise"),
    "output.dense": ("out_proj", "rowwise"),
}
_MLP = {
    "intermediate.dense": ("feedforward.up_proj", "colwise"),
    "output.dense": ("feedforward.down_proj", "rowwise"),
}
# Small dense layers on top of the encoder (MLM transform, NSP, task heads): kept whole on every rank.
_WHOLE = ("cls.predictions.transform.dense", "cls.seq_relationship", "classifier", "qa_outputs")


class Bert(Family):
    name = "bert"
    model_type = "bert"
    variants: ClassVar[dict[str, Variant]] = {
        "BertModel": Variant("BertModel", head="none", prefix="", init={"add_pooling_layer": False}),
        "BertModel+pooler": Variant(
            "BertModel", head="none", prefix="", pooler=True, init={"add_pooling_layer": True}
        ),
        _MLM.architecture: _MLM,
    }
    ignored_suffixes = ("embeddings.position_ids",)
    shape = "a post-norm encoder"

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
        return {
            "model": "encoder",
            "vocab_size": cfg.require("vocab_size"),
            "dim_model": dim,
            "max_seq_len": cfg.get("max_position_embeddings", 512),
            "position": {"name": "learned"},
            "type_vocab_size": cfg.get("type_vocab_size", 2),
            "embedding_norm": True,
            "final_norm": False,
            "head": variant.head,  # "none" or "mlm"
            "head_activation": activation,  # HF's MLM head transform uses the feedforward's hidden_act
            "pooler": variant.pooler,
            "dropout": hidden_dropout,
            "tie_embeddings": bool(cfg.get("tie_word_embeddings", True)),
            "encoder": {
                "num_layers": cfg.require("num_hidden_layers"),
                "block": block(
                    residual="post",
                    norm={"name": "layernorm", "eps": eps},
                    attention=attention,
                    feedforward=feedforward,
                ),
            },
        }

    def rules(self, spec: Mapping[str, Any], variant: Variant) -> list[Rule]:
        p = variant.prefix
        e = f"{p}embeddings."
        rules = [
            Rule(f"{e}word_embeddings.weight", "token_embedding.weight"),
            Rule(f"{e}position_embeddings.weight", "position_embedding.weight"),
            Rule(f"{e}token_type_embeddings.weight", "token_type_embedding.weight"),
            *module_rules(f"{e}LayerNorm", "embedding_norm"),
        ]
        for i in range(spec["encoder"]["num_layers"]):
            h, b = f"{p}encoder.layer.{i}.", f"layers.{i}."
            pairs = [
                ("attention.output.LayerNorm", "attention_norm"),
                ("output.LayerNorm", "feedforward_norm"),
            ]
            pairs += [(hf, bw) for hf, (bw, _) in _MLP.items()]
            rules += attention_rules(f"{h}attention.", f"{b}attention.")
            rules += [rule for hf, bw in pairs for rule in module_rules(f"{h}{hf}", f"{b}{bw}")]
        if variant.pooler:
            rules += module_rules(f"{p}pooler.dense", "pooler.dense")
        if variant.head == "mlm":
            c = "cls.predictions."
            rules += [
                *module_rules(f"{c}transform.dense", "mlm_head.dense"),
                *module_rules(f"{c}transform.LayerNorm", "mlm_head.norm"),
                Rule(f"{c}decoder.weight", "mlm_head.decoder.weight"),
                Rule(f"{c}bias", "mlm_head.decoder.bias"),
            ]
        return rules

    def matches(self, spec: Mapping[str, Any]) -> bool:
        return spec.get("model") == "encoder"

    def hf_config(self, spec: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
        check_blocks(spec, self.name, ("post",), "layernorm", fused_qkv=False, bias=True)
        attn = spec_attention(spec)
        ff = spec_feedforward(spec, self.name, names=("mlp",), bias=True)
        mlm = spec.get("head") == "mlm"
        if mlm and spec.get("pooler"):
            raise unsupported(self.name, "pooler", "HF's BertForMaskedLM has no pooler")
        if mlm and spec.get("head_activation", "gelu") != ff["activation"]:
            raise unsupported(
                self.name, "head_activation", "HF BERT uses one hidden_act for the MLM head and the MLP"
            )
        config = {
            **hf_sizes(spec),
            **hf_mlp(ff, self.name, "gelu"),
            "hidden_dropout_prob": spec["dropout"],
            "attention_probs_dropout_prob": attn["mechanism"].get("dropout", 0.0),
            "type_vocab_size": spec["type_vocab_size"],
            "layer_norm_eps": spec_norm(spec)["eps"],
        }
        return (
            "BertForMaskedLM" if mlm else "BertModel+pooler" if spec.get("pooler") else "BertModel"
        ), config

    def tp_plan(self, model: nn.Module) -> ModelPlan:
        p = prefix(model, _MLM)
        attention = {hf: style for hf, (_, style) in _ATTENTION.items()}
        mlp = {hf: style for hf, (_, style) in _MLP.items()}
        plan: dict[str, str | dict[str, str]] = {f"{p}embeddings.word_embeddings": "vocab"}
        for i, layer in enumerate(model.get_submodule(f"{p}encoder.layer")):
            here = f"{p}encoder.layer.{i}"
            plan[f"{here}.attention"] = attention
            if hasattr(layer, "crossattention"):
                plan[f"{here}.crossattention"] = attention
            plan[here] = mlp
        names = {name for name, _ in model.named_modules()}
        plan.update({name: "replicate" for name in (f"{p}pooler.dense", *_WHOLE) if name in names})
        if "cls.predictions.decoder" in names:
            plan["cls.predictions.decoder"] = "colwise"
        # The attention reshapes with -1 heads, so nothing needs dividing; heads must still split whole.
        return ModelPlan(plan, {}, {"num_attention_heads": model.config.num_attention_heads})

    def stage_recipe(self, model: nn.Module) -> StageRecipe:
        if not (prefix(model, _MLM) and isinstance(getattr(model, "cls", None), nn.Module)):
            raise ConfigError(
                "pipeline parallel splits HF BERT with a head on the encoder's output (BertForMaskedLM); "
                f"{type(model).__name__} has none",
                "pipeline_parallel_size",
            )
        return BertStages(model)


def attention_rules(hf: str, bw: str) -> list[Rule]:
    """The tensors of a ``BertAttention`` under ``hf`` and of brickwork's attention under ``bw``."""
    return [rule for a, (m, _) in _ATTENTION.items() for rule in module_rules(f"{hf}{a}", f"{bw}{m}")]


class BertStages(StageRecipe):
    """HF BERT with a head on the encoder's output (``BertForMaskedLM``'s ``cls``) split by its layer
    list: the embeddings module (word, position and segment tables, LayerNorm, dropout) on the first
    stage, which reads ``token_type_ids``, the head on the last. Every stage builds the bidirectional
    padding mask from ``attention_mask`` as the HF model's own forward does."""

    stacks = ("bert.encoder.layer",)

    def head_modules(self) -> list[str]:
        return ["cls"]

    def outer_modules(self, units: Sequence[tuple[str, int]], first: bool, last: bool) -> list[str]:
        return (["bert.embeddings"] if first else []) + (self.head_modules() if last else [])

    def run(self, stage: Stage, carried: tuple, extras: dict[str, torch.Tensor]) -> Any:
        from transformers.masking_utils import create_bidirectional_mask

        h = carried[0]
        if stage.is_first:
            h = stage.get_submodule("bert.embeddings")(
                input_ids=h, token_type_ids=extras.get("token_type_ids")
            )
        mask = create_bidirectional_mask(
            config=self.model.config, inputs_embeds=h, attention_mask=extras.get("attention_mask")
        )
        h = run_layers(stage, self.stacks[0], h, {"attention_mask": mask})
        return stage.get_submodule("cls")(h) if stage.is_last else h
