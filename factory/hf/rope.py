"""HF rotary settings <-> brickwork's ``position: {name: rotary, ...}``.

transformers 5 keeps them in ``config.rope_parameters`` (``rope_type``, ``rope_theta``,
``partial_rotary_factor`` and the scaling options); older config.json files use ``rope_theta``,
``rope_scaling`` (with ``type``), and GPT-NeoX's ``rotary_pct`` / ``rotary_emb_base``. Both are read.
brickwork computes HF's ``default``, ``linear``, ``llama3`` and ``yarn`` RoPE exactly; ``dynamic``
(recomputed per sequence length) and ``longrope`` are refused.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from brickwork.errors import ConfigError

from .config import HFConfig

# HF rope_type -> the options brickwork's scaling of the same name takes from it.
_SCALING_OPTIONS = {
    "linear": ("factor",),
    "llama3": ("factor", "original_max_position_embeddings", "low_freq_factor", "high_freq_factor"),
    "yarn": (
        "factor",
        "original_max_position_embeddings",
        "beta_fast",
        "beta_slow",
        "attention_factor",
        "truncate",
    ),
}
_PATH = "hf_config.rope_parameters"
# (old top-level key, its rope_parameters name)
_LEGACY = (
    ("rope_theta", "rope_theta"),
    ("rotary_emb_base", "rope_theta"),
    ("rotary_pct", "partial_rotary_factor"),
    ("partial_rotary_factor", "partial_rotary_factor"),
)


def _parameters(cfg: HFConfig) -> dict[str, Any]:
    """rope_parameters in the transformers 5 form, whichever form the config holds."""
    params = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
    if any(isinstance(v, Mapping) for v in params.values()):
        raise ConfigError(f"{cfg.family}: per-layer-type RoPE settings are not supported", _PATH)
    for legacy, name in _LEGACY:
        if cfg.has(legacy):
            params.setdefault(name, cfg.get(legacy))
    kind = params.pop("rope_type", None)
    legacy_kind = params.pop("type", None)
    params["rope_type"] = kind or legacy_kind or "default"
    return params


def read_rope(cfg: HFConfig, head_dim: int, max_len: int, default_fraction: float) -> dict[str, Any]:
    """The brickwork ``position`` spec of an HF rotary config."""
    params = _parameters(cfg)
    kind = params.pop("rope_type")
    out: dict[str, Any] = {
        "name": "rotary",
        "base": float(params.pop("rope_theta", 10000.0)),
        "fraction": float(params.pop("partial_rotary_factor", default_fraction)),
    }
    if kind == "default":
        scaling = None
    elif kind in _SCALING_OPTIONS:
        scaling = _scaling(kind, params, max_len, cfg.family)
    else:
        raise ConfigError(
            f"{cfg.family}: RoPE type {kind!r} has no exact brickwork equivalent",
            f"{_PATH}.rope_type",
            choices=["default", *_SCALING_OPTIONS],
            got=kind,
        )
    if params:
        raise ConfigError(
            f"{cfg.family}: RoPE options not understood for rope_type {kind!r}: {', '.join(sorted(params))}",
            f"{_PATH}.{sorted(params)[0]}",
        )
    if int(head_dim * out["fraction"]) < 2:
        raise ConfigError(f"{cfg.family}: fewer than 2 rotating channels", f"{_PATH}.partial_rotary_factor")
    if scaling is not None:
        out["scaling"] = scaling
    return out


def _scaling(kind: str, params: dict[str, Any], max_len: int, family: str) -> dict[str, Any]:
    """brickwork scaling options from HF's, popping each one read from ``params``."""
    original = params.pop("original_max_position_embeddings", None) or max_len
    factor = params.pop("factor", None)
    if factor is None:
        if kind != "yarn":
            raise ConfigError(f"{family}: {kind} RoPE needs 'factor'", f"{_PATH}.factor")
        factor = max_len / original
    out: dict[str, Any] = {"type": kind, "factor": float(factor)}
    if kind in ("llama3", "yarn"):
        out["original_max_position_embeddings"] = int(original)
    if kind == "llama3":
        out["low_freq_factor"] = float(params.pop("low_freq_factor", 1.0))
        out["high_freq_factor"] = float(params.pop("high_freq_factor", 4.0))
    if kind == "yarn":
        # HF reads these with `or`, so 0 and None both mean the default.
        out["beta_fast"] = float(params.pop("beta_fast", None) or 32.0)
        out["beta_slow"] = float(params.pop("beta_slow", None) or 1.0)
        out["truncate"] = bool(params.pop("truncate", True))
        attention_factor = params.pop("attention_factor", None)
        mscale, mscale_all_dim = params.pop("mscale", None), params.pop("mscale_all_dim", None)
        if attention_factor is None and mscale and mscale_all_dim:
            attention_factor = _mscale(factor, mscale) / _mscale(factor, mscale_all_dim)
        out["attention_factor"] = None if attention_factor is None else float(attention_factor)
    return out


def _mscale(factor: float, mscale: float) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def hf_rope(position: Mapping[str, Any], family: str, fraction_allowed: bool) -> dict[str, Any]:
    """HF ``rope_parameters`` for a brickwork rotary ``position`` spec; refuses what HF lacks."""
    if position.get("interleaved", False):
        raise ConfigError(
            f"{family} pairs rotary channels half-split; interleaved pairing has no HF equivalent",
            "position.interleaved",
        )
    out: dict[str, Any] = {"rope_theta": float(position.get("base", 10000.0))}
    fraction = float(position.get("fraction", 1.0))
    if fraction_allowed:
        out["partial_rotary_factor"] = fraction
    elif fraction != 1.0:
        raise ConfigError(f"HF {family} rotates every channel; fraction must be 1.0", "position.fraction")
    scaling = position.get("scaling")
    if scaling is None:
        out["rope_type"] = "default"
        return out
    kind = scaling.get("type")
    if kind not in _SCALING_OPTIONS:
        raise ConfigError(
            f"rotary scaling {kind!r} has no HF equivalent", "position.scaling.type", _SCALING_OPTIONS, kind
        )
    out["rope_type"] = kind
    out.update({k: scaling[k] for k in _SCALING_OPTIONS[kind] if k in scaling})
    return out
