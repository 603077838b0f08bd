"""Writing brickwork specs for HF families, and reading back the parts ``to_hf`` needs.

The writers produce complete specs in the format of docs/spec.md, every option spelled out, so
the spec of a converted model says exactly what it computes. The readers work on a spec as the
factory validated it (defaults filled in) and refuse any feature an HF family cannot express.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from brickwork.errors import ConfigError

from .config import HF_ACTIVATIONS


def attention_spec(
    num_heads: int,
    bias: bool,
    fused_qkv: bool,
    probs_dropout: float,
    output_dropout: float,
    num_kv_heads: int | None = None,
    dim_head: int | None = None,
) -> dict[str, Any]:
    mechanism: dict[str, Any] = {"name": "scaled_dot_product", "dropout": probs_dropout}
    out: dict[str, Any] = {
        "num_heads": num_heads,
        "num_kv_heads": num_kv_heads,
        "bias": bias,
        "fused_qkv": fused_qkv,
        "dropout": output_dropout,
        "mechanism": mechanism,
    }
    if dim_head is not None:
        out["dim_head"] = dim_head
    return out


def mlp_spec(hidden_dim: int, activation: str, dropout: float) -> dict[str, Any]:
    """The two-layer MLP with biases that GPT-2, GPT-NeoX and BERT share."""
    return {
        "name": "mlp",
        "hidden_dim": hidden_dim,
        "activation": activation,
        "bias": True,
        "dropout": dropout,
    }


def block(
    residual: str, norm: dict[str, Any], attention: dict[str, Any], feedforward: dict[str, Any]
) -> dict[str, Any]:
    return {"residual": {"name": residual}, "norm": norm, "attention": attention, "feedforward": feedforward}


def decoder_spec(*, num_layers: int, block: dict[str, Any], **model: Any) -> dict[str, Any]:
    """A ``decoder_lm`` spec with a final norm; ``model`` holds its other top-level keys (vocab_size,
    dim_model, max_seq_len, position, dropout, tie_embeddings), written in the order given."""
    decoder = {"num_layers": num_layers, "block": block}
    return {"model": "decoder_lm", **model, "final_norm": True, "decoder": decoder}


def stack(spec: Mapping[str, Any]) -> Mapping[str, Any]:
    return spec["decoder"] if spec.get("model") == "decoder_lm" else spec["encoder"]


def spec_block(spec: Mapping[str, Any]) -> Mapping[str, Any]:
    return stack(spec)["block"]


def spec_attention(spec: Mapping[str, Any]) -> Mapping[str, Any]:
    return spec_block(spec)["attention"]


def spec_norm(spec: Mapping[str, Any]) -> Mapping[str, Any]:
    return spec_block(spec)["norm"]


def spec_feedforward(
    spec: Mapping[str, Any], family: str, names: tuple[str, ...], bias: bool | None = None
) -> Mapping[str, Any]:
    """The blocks' feedforward; refused unless it is one of ``names``, with biases or without as ``bias``
    says (None: either, as a config option says)."""
    ff = spec_block(spec)["feedforward"]
    if ff["name"] not in names:
        raise unsupported(family, "feedforward.name", f"HF {family} has a {' or '.join(names)} feedforward")
    if bias is not None and ff["bias"] != bias:
        kind = "decoder" if spec.get("model") == "decoder_lm" else "encoder"
        has = "has" if bias else "has no"
        raise unsupported(family, f"{kind}.block.feedforward.bias", f"HF {family}'s feedforward {has} biases")
    return ff


def hf_activation(ff: Mapping[str, Any], family: str, default: str) -> str:
    """The HF name of a feedforward's activation; refuses one HF has no name for."""
    name = ff.get("activation", default)
    if name not in HF_ACTIVATIONS:
        raise unsupported(family, "feedforward.activation", f"HF has no activation matching {name!r}")
    return HF_ACTIVATIONS[name]


def hf_mlp(ff: Mapping[str, Any], family: str, default: str) -> dict[str, Any]:
    """The HF config keys of an MLP (plain, gated, or an expert): its width and activation."""
    return {"intermediate_size": ff["hidden_dim"], "hidden_act": hf_activation(ff, family, default)}


def hf_sizes(spec: Mapping[str, Any]) -> dict[str, Any]:
    """The HF config keys that GPT-NeoX, BERT and the Llama families name alike."""
    return {
        "vocab_size": spec["vocab_size"],
        "hidden_size": spec["dim_model"],
        "num_hidden_layers": stack(spec)["num_layers"],
        "num_attention_heads": spec_attention(spec)["num_heads"],
        "max_position_embeddings": spec["max_seq_len"],
        "tie_word_embeddings": spec["tie_embeddings"],
    }


def head_dim_of(spec: Mapping[str, Any]) -> int:
    attn = spec_attention(spec)
    return attn.get("dim_head") or spec["dim_model"] // attn["num_heads"]


def unsupported(family: str, path: str, why: str) -> ConfigError:
    return ConfigError(f"cannot export to HF {family}: {why}", path)


def check_blocks(
    spec: Mapping[str, Any],
    family: str,
    residual: tuple[str, ...],
    norm: str,
    fused_qkv: bool,
    bias: bool | str | None,
    qk_norm: bool = False,
) -> None:
    """Refuse a spec whose blocks differ from what HF ``family`` builds: ``bias`` is the attention's
    (None: true or false, as a config option says), ``qk_norm`` whether the family norms q and k."""
    kind = "decoder" if spec.get("model") == "decoder_lm" else "encoder"
    if stack(spec).get("layers"):
        raise unsupported(family, f"{kind}.layers", "HF layers are all alike; per-layer overrides are not")
    b = spec_block(spec)
    attn = b["attention"]
    checks = [
        (b["residual"]["name"] in residual, "residual.name", f"residual must be {' or '.join(residual)}"),
        (b["norm"]["name"] == norm, "norm.name", f"norm must be {norm}"),
        (attn["fused_qkv"] == fused_qkv, "attention.fused_qkv", f"fused_qkv must be {fused_qkv}"),
        (attn["bias"] in ((True, False) if bias is None else (bias,)), "attention.bias",
         f"bias must be {'true or false' if bias is None else repr(bias)}"),
        ((attn.get("qk_norm") is not None) == qk_norm, "attention.qk_norm",
         f"HF {family} {'norms' if qk_norm else 'has no norm of'} queries and keys per head"),
        (b["norm"].get("bias", True), "norm.bias", "HF's LayerNorms have biases"),
        (not attn["mechanism"].get("causal", False), "attention.mechanism.causal", "HF BERT is not causal"),
        (attn["mechanism"]["name"] == "scaled_dot_product", "attention.mechanism.name",
         "HF runs exact softmax attention (scaled_dot_product)"),
    ]  # fmt: skip
    for ok, path, why in checks:
        if not ok:
            raise unsupported(family, f"{kind}.block.{path}", why)
    extra = set(attn["mechanism"]) - {"name", "dropout", "backend", "scale", "causal"}
    if extra:
        raise unsupported(
            family, f"{kind}.block.attention.mechanism", f"options {sorted(extra)} are not in HF"
        )
