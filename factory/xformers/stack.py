"""One xformers stack config: read under xformers' keys, names and defaults, and translated to brickwork.

:func:`read_stack` (and :func:`read_head` for one ``multi_head_config``) is the one reading of a stack
config, lenient as xformers was: both ``from_xformers_config`` and ``brickwork.xformers``' config
classes go through it. The ``translate_*`` functions then turn what it read into brickwork's block
spec strictly: each refuses keys it does not know, accepts "feature off" values of features brickwork
lacks, drops keys documented as inert, and raises ConfigError at the xformers key path otherwise.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping
from typing import Any

from brickwork.components.attention import ATTENTION_REGISTRY
from brickwork.errors import ConfigError, join_path

BLOCK_KEYS = {
    "encoder": ("multi_head_config",),
    "decoder": ("multi_head_config_masked", "multi_head_config_cross"),
}
# Keys that change nothing in brickwork: kernel choices, duplicated dims, xformers bookkeeping.
INERT_BLOCK_KEYS = {"use_triton"}
# Keys accepted only with the value that means "feature off".
OFF_ONLY_BLOCK = {"simplicial_embeddings": None}
OFF_ONLY_HEAD = {"in_proj_container": None, "out_proj": None, "use_separate_proj_weight": True}
# xformers' defaults for the block keys a config leaves out (or sets to None).
BLOCK_DEFAULTS = {
    "residual_norm_style": "post", "normalization": "layernorm", "num_layers": 1, "reversible": False
}  # fmt: skip
# xformers' residual styles and normalizations, under the same names in brickwork; xformers' other
# normalization, "skip", has no brickwork block form.
RESIDUAL = ("pre", "post", "deepnorm")
NORMALIZATION = ("layernorm",)
FEEDFORWARD = {"MLP": "mlp", "MixtureOfExperts": "moe"}
# xformers names whose component is another one's here: FusedMLP was the MLP with Triton kernels, and
# brickwork's MLP picks its fused kernels per call (on CUDA).
FEEDFORWARD_ALIASES = {"FusedMLP": "MLP"}
# xformers' earlier name of a block key, still found in configs written for it.
RENAMED_BLOCK_KEYS = {"layer_norm_style": "residual_norm_style"}
# xformers' other gate, "round_robin", has no brickwork router.
MOE_GATES = {"top_2": 2}
# xformers' mechanism names where brickwork's registry names the same mechanism otherwise.
MECHANISM_NAMES = {"orthoformer": "ortho", "lambda": "lambda_layer"}
# xformers' position encodings as brickwork's (a vocab encoding is a learned table beside the tokens').
POSITIONS = {"vocab": "learned", "sine": "sine", "learnable": "learned"}
WEIGHT_INIT = {
    "vit": {"name": "xavier"},
    "timm": {"name": "normal", "std": 0.02},
    "moco": {"name": "xavier"},
    "small": {"name": "small_init"},
}
# Each xformers mechanism (by xformers' name) and the keys its config class declared beside ``name``
# and ``dropout``; ``brickwork.xformers`` builds its config classes from this table.
XFORMERS_MECHANISMS = {
    "scaled_dot_product": ("causal", "seq_len", "to_seq_len"),
    "favor": ("causal", "dim_features", "dim_head", "iter_before_redraw", "feature_map_type",
              "normalize_inputs"),
    "global": ("attention_query_mask", "causal", "force_sparsity"),
    "local": ("causal", "window_size", "force_sparsity"),
    "random": ("causal", "r", "constant_masking", "force_sparsity"),
    "linformer": ("seq_len", "k"),
    "nystrom": ("num_heads", "num_landmarks", "landmark_pooling", "causal", "pinverse_original_init",
                "inv_iterations", "v_skip_connection", "conv_kernel_size", "use_razavi_pinverse"),
    "orthoformer": ("num_landmarks", "subsample_fraction", "landmark_selection"),
    "lambda": ("seq_len", "dim_head"),
    "pooling": ("pool_size", "stride", "padding"),
    "visual": ("dim_model",),
    "fourier_mix": (),
    "compositional": ("dim_model", "num_heads", "dim_attn", "num_rules", "dim_key", "dim_value",
                      "dim_selection", "qk_rule", "nonlinear", "q_compose", "bias", "causal",
                      "in_proj_container", "use_separate_proj_weight"),
    "blocksparse": ("layout", "block_size", "num_heads"),
}  # fmt: skip
# xformers' factory filled in the layer's sizes (dim_model, num_heads, dim_features) and its example
# configs set seq_len for every mechanism; each mechanism's constructor swallowed the keys it did not
# use. A key from these that a brickwork mechanism has no option for is dropped the same way
# (docs/spec.md lists them); any other key is an error.
XFORMERS_ATTENTION_KEYS = frozenset(
    {"name", "dropout", "seq_len", "dim_model", "num_heads", "dim_features"}
).union(*XFORMERS_MECHANISMS.values())
# Keys that changed what an xformers mechanism computed and that brickwork has no option for: only
# the "feature off" value converts.
OFF_ONLY_ATTENTION = {
    "nystrom": {"landmark_pooling": None, "v_skip_connection": None, "conv_kernel_size": None},
    "random": {"constant_masking": True},
    "pooling": {"stride": 1},
    "compositional": {"dim_attn": None, "dim_key": None, "dim_value": None, "in_proj_container": None,
                      "use_separate_proj_weight": True, "bias": True},
}  # fmt: skip
# What xformers' mechanism had built in: its pooling mixed over the square grid of tokens, and its
# global tokens are the positions its query mask flags (not a leading count).
FIXED_OPTIONS = {"pooling": {"grid": True}, "global": {"num_global_tokens": None}}
# xformers' linformer swallowed ``causal`` and ran bidirectionally: a causal mask cannot pass through
# the projection along the sequence. brickwork converts it the same way, with a warning.
IGNORED_CAUSAL = {"linformer"}


def take(cfg: Mapping[str, Any], path: str, known: set[str]) -> dict[str, Any]:
    """A copy of ``cfg`` after refusing keys outside ``known``."""
    if not isinstance(cfg, Mapping):
        raise ConfigError(f"expected a mapping, got {cfg!r}", path)
    for key in cfg:
        if key not in known:
            raise ConfigError("unknown or unsupported xformers key", join_path(path, str(key)), known, key)
    return dict(cfg)


def require(cfg: Mapping[str, Any], path: str, keys: Iterable[str]) -> None:
    """ConfigError at the first of ``keys`` that ``cfg`` lacks."""
    for key in keys:
        if key not in cfg:
            raise ConfigError("missing required key", join_path(path, key))


def choose(value: Any, choices: Any, path: str, what: str) -> Any:
    """``value`` when it is one of ``choices``, else a ConfigError at ``path`` naming ``what``."""
    if value not in choices:
        raise ConfigError(f"{what} {value!r}", path, choices, value)
    return value


def off_only(cfg: Mapping[str, Any], path: str, rules: Mapping[str, Any]) -> None:
    for key, off in rules.items():
        if key in cfg and cfg[key] != off:
            raise ConfigError(f"brickwork has no equivalent; only {off!r} is supported", join_path(path, key))


def stack_kind(cfg: Mapping[str, Any], path: str) -> str:
    """A stack config's ``block_type`` (a name or a ``BlockType`` member) as ``encoder``/``decoder``."""
    kind = cfg.get("block_type")
    kind = getattr(kind, "value", kind)
    if kind not in BLOCK_KEYS:
        reason = "missing required key" if "block_type" not in cfg else f"unknown block_type {kind!r}"
        raise ConfigError(reason, join_path(path, "block_type"), BLOCK_KEYS, kind)
    return kind


def read_stack(cfg: Mapping[str, Any], path: str) -> dict[str, Any]:
    """A copy of one stack config as xformers read it: its older key and component names replaced
    (``layer_norm_style``, ``FusedMLP``), enum members as their values, xformers' defaults where a block
    key is left out or None, and each sub-config given the block's ``dim_model`` (a patch embedding its
    ``out_channels``) where it leaves it out. Keys it does not know are kept: the caller decides."""
    out = dict(cfg)
    for old, new in RENAMED_BLOCK_KEYS.items():
        if old in out:
            if out.get(new) is not None:
                raise ConfigError(f"give {new} or its old name {old}, not both", join_path(path, old))
            out[new] = out.pop(old)
    kind = stack_kind(out, path)
    for key, default in BLOCK_DEFAULTS.items():
        value = out.get(key)
        out[key] = default if value is None else getattr(value, "value", value)
    out["block_type"] = kind
    dim = out.get("dim_model")
    for key in ("feedforward_config", "position_encoding_config", *BLOCK_KEYS[kind]):
        if isinstance(out.get(key), Mapping):
            out[key] = {"dim_model": dim, **out[key]}
    if isinstance(out.get("patch_embedding_config"), Mapping):
        out["patch_embedding_config"] = {"out_channels": dim, **out["patch_embedding_config"]}
    feedforward = out.get("feedforward_config")
    if isinstance(feedforward, Mapping) and feedforward.get("name") in FEEDFORWARD_ALIASES:
        out["feedforward_config"] = {**feedforward, "name": FEEDFORWARD_ALIASES[feedforward["name"]]}
    for key in BLOCK_KEYS[kind]:
        if isinstance(out.get(key), Mapping):
            out[key] = read_head(out[key])
    return out


def read_head(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of a ``multi_head_config`` whose ``attention`` config takes the layer's ``num_heads`` and
    ``dim_model``, and the head size as ``dim_features``, where it leaves them out (xformers' factory
    filled them in the same way: a FAVOR layer draws as many features as its head has channels)."""
    out = dict(cfg)
    attention, heads, dim = out.get("attention"), out.get("num_heads"), out.get("dim_model")
    if not isinstance(attention, Mapping):
        return out
    attention = {"num_heads": heads, "dim_model": dim, **attention}
    whole = all(isinstance(n, int) and not isinstance(n, bool) for n in (heads, dim))
    if attention.get("dim_features") is None and whole and heads > 0:
        attention["dim_features"] = dim // heads
    out["attention"] = attention
    return out


def check_stacks(stacks: list[tuple[str, Mapping[str, Any]]], tied: bool) -> None:
    """xformers' rules across one model's stacks, each ``(key path, what read_stack read)``: only
    encoder stacks are reversible, all of them or none; deepnorm is every stack's style or none's;
    reversible stacks take neither tied embeddings nor deepnorm."""
    encoders = [(path, st) for path, st in stacks if st["block_type"] == "encoder"]
    for path, st in stacks:
        if st["block_type"] == "decoder" and st["reversible"]:
            raise ConfigError("only encoder stacks can be reversible", join_path(path, "reversible"))
    reversible = {st["reversible"] for _, st in encoders}
    if len(reversible) > 1:
        raise ConfigError("all encoder stacks are reversible or none is; these differ",
                          join_path(encoders[-1][0], "reversible"))  # fmt: skip
    deepnorm = {st["residual_norm_style"] == "deepnorm" for _, st in stacks}
    if len(deepnorm) > 1:
        raise ConfigError("all stacks use deepnorm or none does; these differ",
                          join_path(stacks[-1][0], "residual_norm_style"))  # fmt: skip
    if reversible == {True} and (tied or deepnorm == {True}):
        raise ConfigError("reversible stacks take neither tied embeddings nor deepnorm",
                          join_path(encoders[0][0], "reversible"))  # fmt: skip


def translate_stack(path: str, cfg: Any) -> dict[str, Any]:
    if not isinstance(cfg, Mapping):
        raise ConfigError(f"a stack config must be a mapping, got {cfg!r}", path)
    c = read_stack(cfg, path)
    kind = c["block_type"]
    known = {
        "block_type", "num_layers", "dim_model", "residual_norm_style", "normalization",
        "position_encoding_config", "feedforward_config", "patch_embedding_config", "reversible",
        *BLOCK_KEYS[kind],
        *INERT_BLOCK_KEYS,
        *OFF_ONLY_BLOCK,
    }  # fmt: skip
    take(c, path, known)
    off_only(c, path, OFF_ONLY_BLOCK)
    require(c, path, ("dim_model", "feedforward_config", *BLOCK_KEYS[kind]))
    style = choose(c["residual_norm_style"], RESIDUAL, join_path(path, "residual_norm_style"),
                   "unknown residual style")  # fmt: skip
    norm = choose(
        c["normalization"], NORMALIZATION, join_path(path, "normalization"), "unsupported normalization"
    )
    dim = c["dim_model"]
    self_attention, rotary, causal = translate_attention(
        c[BLOCK_KEYS[kind][0]], join_path(path, BLOCK_KEYS[kind][0]), dim, self_attention=True
    )
    block: dict[str, Any] = {"attention": self_attention}
    if kind == "decoder":
        if not causal:
            raise ConfigError("brickwork's decoder self-attention is always causal; set causal: true",
                              join_path(path, "multi_head_config_masked", "attention", "causal"))  # fmt: skip
        # A causal cross-attention (xformers' README uses one) keeps ``causal`` among its mechanism's
        # options: query i sees the first i + S - T memory positions (bottom-right aligned).
        cross = "multi_head_config_cross"
        block["cross_attention"], _, _ = translate_attention(c[cross], join_path(path, cross), dim, False)
    block["feedforward"] = translate_feedforward(
        c["feedforward_config"], join_path(path, "feedforward_config"), dim
    )
    block["norm"], block["residual"] = {"name": norm}, {"name": style}
    return {
        "path": path, "kind": kind, "block": block, "num_layers": c["num_layers"], "dim_model": dim,
        "rotary": rotary, "causal": causal, "residual": style,
        "position": c.get("position_encoding_config"), "patches": c.get("patch_embedding_config"),
        "reversible": c["reversible"],
    }  # fmt: skip


def translate_attention(
    cfg: Any, path: str, dim: Any, self_attention: bool
) -> tuple[dict[str, Any], bool, bool]:
    """(attention spec, uses rotary, is causal) for a ``multi_head_config``."""
    known = {"num_heads", "residual_dropout", "bias", "attention", "dim_model", "dim_key", "dim_value",
             "use_rotary_embeddings", *OFF_ONLY_HEAD}  # fmt: skip
    c = take(cfg, path, known)
    off_only(c, path, OFF_ONLY_HEAD)
    for key in ("dim_model", "dim_key", "dim_value"):
        if c.get(key) not in (None, dim):
            raise ConfigError(f"brickwork projects to dim_model={dim}; only that or null is supported",
                              join_path(path, key))  # fmt: skip
    require(c, path, ("num_heads", "attention"))
    bias = c.get("bias", True)
    if isinstance(bias, (list, tuple)):
        if len(set(bias)) != 1:
            raise ConfigError(
                f"brickwork uses one bias setting for the q/k/v and output projections; got {list(bias)}",
                join_path(path, "bias"),
            )
        bias = bias[0]
    rotary = c.get("use_rotary_embeddings", False) is True
    if rotary and not self_attention:
        raise ConfigError("rotary embeddings apply to self-attention only",
                          join_path(path, "use_rotary_embeddings"))  # fmt: skip
    mechanism, causal = translate_mechanism(c["attention"], join_path(path, "attention"), c["num_heads"])
    spec = {"num_heads": c["num_heads"], "dropout": c.get("residual_dropout", 0.0), "bias": bias,
            "mechanism": mechanism}  # fmt: skip
    return spec, rotary, causal


def translate_mechanism(cfg: Any, path: str, num_heads: Any) -> tuple[dict[str, Any], bool]:
    if not isinstance(cfg, Mapping):
        raise ConfigError(f"expected a mapping with a 'name' key, got {cfg!r}", path)
    name = MECHANISM_NAMES.get(cfg.get("name"), cfg.get("name"))
    if name not in ATTENTION_REGISTRY:
        reason = (
            "missing required key"
            if "name" not in cfg
            else f"xformers attention {name!r} has no brickwork equivalent"
        )
        raise ConfigError(reason, join_path(path, "name"), ATTENTION_REGISTRY.names(), name)
    check_mechanism(name, cfg, path)
    options = ATTENTION_REGISTRY.get(name).option_names()
    out = {"name": name, **FIXED_OPTIONS.get(name, {})}
    causal = cfg.get("causal", False) is True
    if causal and name in IGNORED_CAUSAL:
        warnings.warn(
            f"{join_path(path, 'causal')}: xformers ran {name} bidirectionally whatever causal said (a "
            "causal mask cannot pass through its projection along the sequence); so does this model",
            stacklevel=4,
        )
        causal = False
    for key, value in cfg.items():
        if key in ("name", "causal") or key in OFF_ONLY_ATTENTION.get(name, {}):
            continue
        if key in RESHAPED_ATTENTION.get(name, {}):
            option, translate = RESHAPED_ATTENTION[name][key]
            out[option] = translate(value, join_path(path, key))
            continue
        if key == "num_heads":
            if value != num_heads:
                raise ConfigError(f"must equal the layer's num_heads={num_heads}", join_path(path, key))
            continue  # the layer passes its head count in itself
        if key in options:
            out[key] = value
        elif key not in XFORMERS_ATTENTION_KEYS:
            raise ConfigError(
                f"unknown key {key!r} for xformers attention {name!r}", join_path(path, str(key)),
                sorted(set(options) | XFORMERS_ATTENTION_KEYS), key,
            )  # fmt: skip
    if name == "compositional":
        out.setdefault("selection", compositional_selection(cfg.get("qk_rule"), cfg.get("nonlinear")))
    if causal:
        out["causal"] = True  # a mechanism without a causal form is refused when the spec is checked
    return out, causal


def compositional_selection(qk_rule: Any, nonlinear: Any) -> str:
    """xformers' rule scoring as compositional attention's ``selection``: ``qk_rule`` a dot product,
    else a score network, of two layers when ``nonlinear``. (``q_compose`` changes nothing here: the
    selection query is always the head's projected query.)"""
    return "dot" if qk_rule else ("mlp" if nonlinear else "linear")


def check_mechanism(name: str, cfg: Mapping[str, Any], path: str) -> None:
    """Refuse the options of xformers' mechanism ``name`` (brickwork's name) that brickwork lacks."""
    off_only(cfg, path, OFF_ONLY_ATTENTION.get(name, {}))
    if name == "pooling" and cfg.get("padding") not in (None, cfg.get("pool_size", 3) // 2):
        raise ConfigError("the window is centred on each token: padding must be pool_size // 2",
                          join_path(path, "padding"))  # fmt: skip


def global_positions(mask: Any, path: str) -> list[int]:
    """xformers' ``attention_query_mask`` (a bool per position, ``[T, 1]``) as the global positions."""
    flags = mask.flatten().tolist() if hasattr(mask, "flatten") else list(mask)
    flags = [bool(f[0] if isinstance(f, list | tuple) else f) for f in flags]
    if not any(flags):
        raise ConfigError("marks no global position", path)
    return [i for i, flag in enumerate(flags) if flag]


def _shared_layout(layout: Any, path: str) -> list[list[bool]]:
    """xformers' ``[H, blocks, blocks]`` layout as brickwork's one layout for every head."""
    layout = layout.tolist() if hasattr(layout, "tolist") else layout
    if layout and isinstance(layout[0], list) and layout[0] and isinstance(layout[0][0], list):
        if any(head != layout[0] for head in layout):
            raise ConfigError("brickwork uses one layout for every head; these differ", path)
        layout = layout[0]
    return [[bool(x) for x in row] for row in layout]


# xformers options whose value brickwork reads in another form: (brickwork option, translation).
RESHAPED_ATTENTION = {
    "global": {"attention_query_mask": ("global_positions", global_positions)},
    "blocksparse": {"layout": ("layout", _shared_layout)},
}


def translate_feedforward(cfg: Any, path: str, dim: Any) -> dict[str, Any]:
    c = take(cfg, path, {"name", "dim_model", "dropout", "activation", "hidden_layer_multiplier", "bias",
                              "number_of_experts", "gate"})  # fmt: skip
    name = c.get("name")
    if name not in FEEDFORWARD:
        reason = "missing required key" if "name" not in c else f"unsupported feedforward {name!r}"
        raise ConfigError(reason, join_path(path, "name"), [*FEEDFORWARD, *FEEDFORWARD_ALIASES], name)
    if FEEDFORWARD[name] != "moe":
        for key in ("number_of_experts", "gate"):
            if key in c:
                raise ConfigError(f"only MixtureOfExperts takes {key}", join_path(path, key))
    if c.get("dim_model", dim) != dim:
        raise ConfigError(f"must equal the block's dim_model={dim}", join_path(path, "dim_model"))
    require(c, path, ("activation", "hidden_layer_multiplier"))
    multiplier = c["hidden_layer_multiplier"]
    hidden = multiplier * dim if isinstance(multiplier, (int, float)) and isinstance(dim, int) else None
    if hidden is None or isinstance(multiplier, bool) or hidden != int(hidden) or hidden <= 0:
        raise ConfigError(f"must make a positive whole hidden size with dim_model={dim}, got {multiplier!r}",
                          join_path(path, "hidden_layer_multiplier"))  # fmt: skip
    # xformers' activation names (an Activation member or its value) are brickwork's, which checks them.
    out = {"name": FEEDFORWARD[name], "hidden_dim": int(hidden),
           "activation": getattr(c["activation"], "value", c["activation"]),
           "dropout": c.get("dropout", 0.0), "bias": c.get("bias", True)}  # fmt: skip
    if out["name"] == "moe":
        require(c, path, ("number_of_experts",))
        out["num_experts"] = c["number_of_experts"]
        gate = getattr(c.get("gate", "top_2"), "value", c.get("gate", "top_2"))
        out["top_k"] = MOE_GATES[choose(gate, MOE_GATES, join_path(path, "gate"), "unsupported gate")]
    return out
