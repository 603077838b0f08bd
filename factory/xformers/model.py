"""``from_xformers_config``: xformers' factory configs (``xFormerConfig``) as brickwork specs.

Every key of the xformers config is translated, known to change nothing (and dropped on purpose), or
refused with a :class:`ConfigError` naming its path in the xformers config. Errors found while
checking the translated spec are reported at the xformers key they came from.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from brickwork.errors import ConfigError, join_path
from brickwork.factory.build import resolve_spec
from brickwork.factory.xformers.stack import (
    BLOCK_KEYS,
    POSITIONS,
    WEIGHT_INIT,
    check_stacks,
    choose,
    off_only,
    read_stack,
    require,
    take,
    translate_stack,
)


class _Converter:
    def __init__(self, vocab_size: int | None, max_seq_len: int | None, image_size: int | None) -> None:
        self.vocab_size, self.max_seq_len, self.image_size = vocab_size, max_seq_len, image_size
        self.paths: list[tuple[str, str]] = []  # (brickwork path, xformers path)

    def map(self, brickwork: str, xformers: str) -> None:
        self.paths.append((brickwork, xformers))

    def remap(self, err: ConfigError) -> ConfigError:
        """``err`` with its brickwork key path replaced by the xformers key it came from."""
        best = max(
            (p for p in self.paths if err.path == p[0] or err.path.startswith(p[0] + ".")),
            key=lambda p: len(p[0]),
            default=None,
        )
        if best is None:
            return err
        rest = err.path[len(best[0]) :].lstrip(".")
        return ConfigError(err.reason, join_path(best[1], rest), err.choices, err.got)

    def model(self, entries: list[tuple[str, Any]], top: Mapping[str, Any]) -> dict[str, Any]:
        stacks = [translate_stack(path, cfg) for path, cfg in entries]
        check_stacks([(path, read_stack(cfg, path)) for path, cfg in entries],
                     top.get("tie_embedding_weights", False) is True)  # fmt: skip
        encoders = [st for st in stacks if st["kind"] == "encoder"]
        decoders = [st for st in stacks if st["kind"] == "decoder"]
        if not encoders:
            raise ConfigError(
                "a decoder stack attends to an encoder's output, and there is no encoder stack; xformers "
                "decoder-only models are encoder stacks with causal attention",
                join_path(decoders[0]["path"], "block_type"),
            )
        first = stacks[0]
        for st in stacks[1:]:
            if st["dim_model"] != first["dim_model"]:
                reason = f"all stacks need the same dim_model; {first['path']} has {first['dim_model']}"
                raise ConfigError(reason, join_path(st["path"], "dim_model"))
            if st["rotary"] != first["rotary"]:
                head = join_path(st["path"], BLOCK_KEYS[st["kind"]][0])
                raise ConfigError("brickwork applies rotary embeddings to every self-attention or to none",
                                  join_path(head, "use_rotary_embeddings"))  # fmt: skip
            if st["patches"] is not None:
                raise ConfigError("only the first stack of an image encoder embeds patches",
                                  join_path(st["path"], "patch_embedding_config"))  # fmt: skip
        causal = {st["causal"] for st in encoders}
        causal_key = ("multi_head_config", "attention", "causal")
        if len(causal) > 1:
            raise ConfigError("encoder stacks mix causal and bidirectional attention",
                              join_path(encoders[-1]["path"], *causal_key))  # fmt: skip
        share_embeddings = True
        if decoders:
            kind = "encoder_decoder"
            if causal == {True}:
                raise ConfigError("the encoder of an encoder-decoder must not be causal",
                                  join_path(encoders[0]["path"], *causal_key))  # fmt: skip
            share_embeddings = top.get("tie_embedding_weights", False)
            if not isinstance(share_embeddings, bool):
                raise ConfigError(f"must be true or false, got {share_embeddings!r}", "tie_embedding_weights")
        elif first["patches"] is not None:
            if causal == {True}:
                raise ConfigError("an image encoder attends both ways; set causal: false",
                                  join_path(first["path"], *causal_key))  # fmt: skip
            return self.image_model(first, stacks, top)
        else:
            kind = "decoder_lm" if causal == {True} else "encoder"
        embedding = self.embedding(stacks, first["dim_model"])
        spec: dict[str, Any] = {"model": kind, "vocab_size": embedding.pop("vocab_size")}
        spec["dim_model"] = first["dim_model"]
        self.map("dim_model", join_path(first["path"], "dim_model"))
        spec.update(embedding)
        spec["tie_embeddings"] = True
        spec["final_norm"] = stacks[-1]["residual"] == "pre"
        spec["init"] = self.init(top)
        if kind == "encoder_decoder":
            spec["encoder"] = self.stack_spec(encoders, "encoder")
            spec["decoder"] = self.stack_spec(decoders, "decoder")
            if not share_embeddings:
                # Untied, xformers' first encoder and first decoder block each embed with a position
                # encoding of their own (token table and, for "vocab", position table).
                spec["share_embeddings"] = False
                self.map("share_embeddings", "tie_embedding_weights")
        else:
            name = "decoder" if kind == "decoder_lm" else "encoder"
            spec[name] = self.stack_spec(encoders, name)
        return spec

    def init(self, top: Mapping[str, Any]) -> dict[str, Any]:
        init = top.get("weight_init", "vit")
        init = getattr(init, "value", init)  # an xFormerWeightInit enum member
        return dict(WEIGHT_INIT[choose(init, WEIGHT_INIT, "weight_init", "unknown weight_init")])

    def image_model(
        self, first: Mapping[str, Any], stacks: list[dict[str, Any]], top: Mapping[str, Any]
    ) -> dict[str, Any]:
        """A ViT: the first stack's ``patch_embedding_config`` becomes brickwork's patch embedding."""
        path = join_path(first["path"], "patch_embedding_config")
        patches = take(
            first["patches"], path, {"in_channels", "out_channels", "kernel_size", "stride", "padding"}
        )
        off_only(patches, path, {"padding": 0})
        dim = first["dim_model"]
        require(patches, path, ("in_channels", "out_channels", "kernel_size"))
        if patches["out_channels"] != dim:
            raise ConfigError(f"must equal dim_model={dim}", join_path(path, "out_channels"))
        size = patches["kernel_size"]
        if patches.get("stride", size) != size:
            raise ConfigError("brickwork cuts non-overlapping patches: stride must equal kernel_size",
                              join_path(path, "stride"))  # fmt: skip
        position_path = join_path(first["path"], "position_encoding_config")
        position = take(first["position"] or {"name": "none"}, position_path,
                        {"name", "dim_model", "seq_len", "add_class_token"})  # fmt: skip
        choose(position["name"], ("learnable", "sine", "none"), join_path(position_path, "name"),
               "unsupported position encoding for images:")  # fmt: skip
        class_token = position.get("add_class_token", False) is True
        image_size = self.image_size
        if image_size is None:
            side = math.isqrt(position.get("seq_len", 0))
            if side * side != position.get("seq_len", 0) or side == 0:
                raise ConfigError("gives no square patch count; pass image_size=",
                                  join_path(position_path, "seq_len"))  # fmt: skip
            image_size = side * size
        spec: dict[str, Any] = {
            "model": "image_encoder", "dim_model": dim, "image_size": image_size, "patch_size": size,
            "channels": patches["in_channels"], "num_classes": 0, "class_token": class_token,
            "pool": "cls" if class_token else "mean", "final_norm": stacks[-1]["residual"] == "pre",
            "position": {"name": POSITIONS.get(position["name"], "none")}, "init": self.init(top),
        }  # fmt: skip
        self.map("dim_model", join_path(first["path"], "dim_model"))
        self.map("patch_size", join_path(path, "kernel_size"))
        self.map("channels", join_path(path, "in_channels"))
        spec["encoder"] = self.stack_spec(stacks, "encoder")
        return spec

    def stack_spec(self, stacks: list[dict[str, Any]], name: str) -> dict[str, Any]:
        """One brickwork stack: the first xformers stack's block, later stacks as per-layer overrides."""
        out: dict[str, Any] = {
            "num_layers": sum(st["num_layers"] for st in stacks),
            "block": stacks[0]["block"],
        }
        self.map_block(join_path(name, "block"), stacks[0])
        start, layers = stacks[0]["num_layers"], {}
        for st in stacks[1:]:
            for i in range(start, start + st["num_layers"]):
                layers[i] = st["block"]
                self.map_block(join_path(name, "layers", i), st)
            start += st["num_layers"]
        if layers:
            out["layers"] = layers
        self.map(join_path(name, "num_layers"), join_path(stacks[0]["path"], "num_layers"))
        self.map(join_path(name, "reversible"), join_path(stacks[0]["path"], "reversible"))
        if stacks[0]["reversible"]:  # then all of them (check_stacks)
            out["reversible"] = True
        return out

    def map_block(self, prefix: str, st: Mapping[str, Any]) -> None:
        pairs = [
            ("", ""), ("residual", "residual_norm_style"), ("norm", "normalization"),
            ("feedforward", "feedforward_config"),
            ("feedforward.hidden_dim", "feedforward_config.hidden_layer_multiplier"),
            ("feedforward.num_experts", "feedforward_config.number_of_experts"),
            ("feedforward.top_k", "feedforward_config.gate"),
        ]  # fmt: skip
        for attention, head in zip(("attention", "cross_attention"), BLOCK_KEYS[st["kind"]]):
            pairs += [(attention, head), (f"{attention}.dropout", f"{head}.residual_dropout"),
                      (f"{attention}.mechanism", f"{head}.attention")]  # fmt: skip
        for brickwork, xformers in pairs:
            self.map(join_path(prefix, brickwork), join_path(st["path"], xformers))

    def embedding(self, stacks: list[dict[str, Any]], dim: Any) -> dict[str, Any]:
        """vocab_size, max_seq_len, position and dropout from the first stack's position encoding."""
        first = stacks[0]
        for st in stacks[1:]:
            if st["position"] is not None and st["position"] != first["position"]:
                reason = f"brickwork embeds positions once, as {first['path']}.position_encoding_config says"
                raise ConfigError(f"{reason}; this one differs",
                                  join_path(st["path"], "position_encoding_config"))  # fmt: skip
        path = join_path(first["path"], "position_encoding_config")
        cfg = first["position"]
        out: dict[str, Any] = {"vocab_size": self.vocab_size, "max_seq_len": self.max_seq_len, "dropout": 0.0}
        positions: list[dict[str, Any]] = []
        if cfg is not None:
            name = cfg.get("name") if isinstance(cfg, Mapping) else None
            choose(name, POSITIONS, join_path(path, "name"), "unsupported position encoding")
            known = {"name", "dim_model", "seq_len", "vocab_size", "dropout", "add_class_token"}
            c = take(cfg, path, known)
            off_only(c, path, {"add_class_token": False})
            if c.get("dim_model", dim) != dim:
                raise ConfigError(f"must equal the block's dim_model={dim}", join_path(path, "dim_model"))
            if name == "vocab":
                require(c, path, ("vocab_size", "seq_len"))
                out["vocab_size"] = c["vocab_size"]
                self.map("vocab_size", join_path(path, "vocab_size"))
            elif "vocab_size" in c:
                raise ConfigError(f"{name!r} takes no vocab_size", join_path(path, "vocab_size"))
            if "seq_len" in c:
                out["max_seq_len"] = c["seq_len"]
                self.map("max_seq_len", join_path(path, "seq_len"))
            out["dropout"] = c.get("dropout", 0.0)
            self.map("dropout", join_path(path, "dropout"))
            positions.append({"name": POSITIONS[name]})
            self.map("position", path)
        if first["rotary"]:
            positions.append({"name": "rotary"})
        if out["vocab_size"] is None:
            raise ConfigError("no 'vocab' position encoding gives the vocabulary size; pass vocab_size= "
                              "(brickwork models embed token ids themselves)", path)  # fmt: skip
        out["position"] = positions[0] if len(positions) == 1 else positions or {"name": "none"}
        if out["max_seq_len"] is None:
            del out["max_seq_len"]
        return out


@runtime_checkable
class XformersConfigObject(Protocol):
    """A config object that gives back its xFormerConfig-style dict (``brickwork.xformers``'
    ``xFormerConfig``)."""

    def to_dict(self) -> dict[str, Any]: ...


def from_xformers_config(
    cfg: Mapping[str, Any] | list[Mapping[str, Any]] | XformersConfigObject,
    vocab_size: int | None = None,
    max_seq_len: int | None = None,
    image_size: int | None = None,
) -> dict[str, Any]:
    """A brickwork model spec for an xformers factory config; ``cfg`` is left unchanged.

    ``cfg`` is an ``xFormerConfig`` (``brickwork.xformers.factory``'s) or its dict form
    (``stack_configs``, ``tie_embedding_weights``, ``weight_init``), a bare list (or name -> block
    dict) of stack configs, or one stack config.
    Encoder stacks give an ``encoder`` model, or a ``decoder_lm`` when their attention is causal
    (xformers' GPT recipe); encoder then decoder stacks give an ``encoder_decoder``. xformers models
    end in hidden states; the brickwork model adds its LM head (tied to the token embedding, the
    decoder's own one where ``tie_embedding_weights`` is false, xformers' default).
    ``vocab_size`` / ``max_seq_len`` are needed only when no ``vocab`` position encoding gives them.
    A first stack with a ``patch_embedding_config`` gives an ``image_encoder`` (xformers' ViT recipe)
    ending in hidden states; ``image_size`` is needed only when the position encoding's ``seq_len``
    is not the square patch count.
    """
    conv = _Converter(vocab_size, max_seq_len, image_size)
    cfg = cfg.to_dict() if isinstance(cfg, XformersConfigObject) else copy.deepcopy(cfg)
    top: dict[str, Any] = {}
    if isinstance(cfg, Mapping) and "stack_configs" in cfg:
        top = take(cfg, "", {"stack_configs", "tie_embedding_weights", "weight_init"})
        stacks, prefix = top["stack_configs"], "stack_configs"
    else:
        stacks, prefix = cfg, ""
    if isinstance(stacks, Mapping) and "block_type" in stacks:
        stacks = [stacks]
    if isinstance(stacks, Mapping):
        entries = [(join_path(prefix, str(k)), v) for k, v in stacks.items()]
    elif isinstance(stacks, list):
        entries = [(join_path(prefix, i), v) for i, v in enumerate(stacks)]
    else:
        raise ConfigError(f"expected a list or mapping of stack configs, got {stacks!r}", prefix)
    if not entries:
        raise ConfigError("no stack configs given", prefix)
    try:
        spec = conv.model(entries, top)
    except ConfigError:
        raise
    except (TypeError, ValueError) as err:
        raise ConfigError(f"malformed xformers config: {err}", prefix) from err
    try:
        resolve_spec(spec)
    except ConfigError as err:
        raise conv.remap(err) from None
    return spec
