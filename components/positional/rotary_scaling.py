"""Rotary frequencies with context-extension scaling: linear, NTK-aware, YaRN and Llama 3.

Option names follow the papers and Hugging Face's ``rope_scaling`` keys, so a config carries over as is.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from brickwork.checks import InRange, check_bool, check_positive_int
from brickwork.errors import ConfigError, join_path

_REQUIRED = object()

# type -> {option: default}; _REQUIRED marks options without a default.
SCALING_OPTIONS: dict[str, dict[str, Any]] = {
    "linear": {"factor": _REQUIRED},
    "ntk": {"factor": _REQUIRED},
    "yarn": {
        "factor": _REQUIRED,
        "original_max_position_embeddings": _REQUIRED,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "attention_factor": None,
        "truncate": True,
    },
    "llama3": {
        "factor": _REQUIRED,
        "original_max_position_embeddings": _REQUIRED,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
    },
}


def _above(options: dict[str, Any], key: str, low: float, path: str) -> None:
    InRange(low, open_low=True)(options[key], join_path(path, key))


def check_scaling(scaling: Mapping[str, Any] | None, path: str = "scaling") -> dict[str, Any] | None:
    """A checked copy of ``scaling`` with defaults filled in (the input is not modified).

    ``scaling`` is ``None`` or a mapping with ``type`` (linear, ntk, yarn, llama3) and that type's options.
    """
    if scaling is None:
        return None
    if not isinstance(scaling, Mapping):
        raise ConfigError(f"must be a mapping with a 'type' key or null, got {scaling!r}", path)
    kind = scaling.get("type")
    if kind not in SCALING_OPTIONS:
        raise ConfigError(
            f"unknown rotary scaling type {kind!r}", join_path(path, "type"), SCALING_OPTIONS, kind
        )
    allowed = SCALING_OPTIONS[kind]
    options: dict[str, Any] = {"type": kind}
    for key, value in scaling.items():
        if key == "type":
            continue
        if key not in allowed:
            raise ConfigError(
                f"unknown option {key!r} for {kind} scaling", join_path(path, key), [*allowed, "type"], key
            )
        options[key] = value
    for key, default in allowed.items():
        if key not in options:
            if default is _REQUIRED:
                raise ConfigError(f"{kind} scaling needs {key!r}", join_path(path, key))
            options[key] = default
    InRange(1.0)(options["factor"], join_path(path, "factor"))
    if "original_max_position_embeddings" in options:
        key = "original_max_position_embeddings"
        check_positive_int(options[key], join_path(path, key))
    if kind == "yarn":
        _above(options, "beta_slow", 0.0, path)
        _above(options, "beta_fast", options["beta_slow"], path)
        if options["attention_factor"] is not None:
            _above(options, "attention_factor", 0.0, path)
        check_bool(options["truncate"], join_path(path, "truncate"))
    if kind == "llama3":
        _above(options, "low_freq_factor", 0.0, path)
        _above(options, "high_freq_factor", options["low_freq_factor"], path)
    return options


def rotary_inv_freq(
    dim: int, base: float, scaling: Mapping[str, Any] | None = None
) -> tuple[torch.Tensor, float]:
    """Inverse frequencies ``[dim // 2]`` (float64) of a rotary embedding over ``dim`` channels, and the
    attention factor that multiplies cos and sin (1.0 except for YaRN). ``scaling`` must be checked."""
    inv_freq = 1.0 / base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    if scaling is None:
        return inv_freq, 1.0
    kind, factor = scaling["type"], float(scaling["factor"])
    if kind == "linear":
        # Position interpolation (Chen et al. 2023): positions p -> p / factor.
        return inv_freq / factor, 1.0
    if kind == "ntk":
        # NTK-aware: stretch the base so the lowest frequency is interpolated by `factor` while the
        # highest stays put.
        return rotary_inv_freq(dim, base * factor ** (dim / (dim - 2)))[0], 1.0
    if kind == "yarn":
        return _yarn(inv_freq, dim, base, factor, scaling)
    return _llama3(inv_freq, factor, scaling), 1.0


def _yarn(
    inv_freq: torch.Tensor, dim: int, base: float, factor: float, scaling: Mapping[str, Any]
) -> tuple[torch.Tensor, float]:
    """YaRN (Peng et al. 2023): interpolate the low frequencies, keep (extrapolate) the high ones, with a
    linear ramp between the dimensions that turn ``beta_slow`` and ``beta_fast`` times over the original
    context; cos and sin are scaled by ``0.1 ln(factor) + 1``."""
    original = scaling["original_max_position_embeddings"]

    def dim_for_rotations(rotations: float) -> float:
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = dim_for_rotations(scaling["beta_fast"]), dim_for_rotations(scaling["beta_slow"])
    if scaling["truncate"]:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # the ramp needs a non-empty interval
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    extrapolate = 1 - ramp  # 1 for fast-turning (high-frequency) dimensions
    scaled = inv_freq * extrapolate + inv_freq / factor * (1 - extrapolate)
    attention_factor = scaling["attention_factor"]
    if attention_factor is None:
        attention_factor = 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0
    return scaled, float(attention_factor)


def _llama3(inv_freq: torch.Tensor, factor: float, scaling: Mapping[str, Any]) -> torch.Tensor:
    """Llama 3.1: divide the low frequencies (wavelength over ``original / low_freq_factor``) by
    ``factor``, keep the high ones (wavelength under ``original / high_freq_factor``), blend between."""
    original = scaling["original_max_position_embeddings"]
    low_freq_factor, high_freq_factor = scaling["low_freq_factor"], scaling["high_freq_factor"]
    wavelength = 2 * math.pi / inv_freq
    smooth = (original / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor)
    blended = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    out = torch.where(wavelength > original / low_freq_factor, inv_freq / factor, blended)
    return torch.where(wavelength < original / high_freq_factor, inv_freq, out)
