"""HF's sliding-window attention <-> brickwork's causal ``local`` mechanism, layer by layer.

HF's ``sliding_window = W`` lets the query at position i see the keys at i - W + 1 .. i: W positions,
its own included (the mask keeps ``kv_idx > q_idx - W``). brickwork's causal ``local`` attention sees
the keys at i - window_size // 2 .. i, so HF's W is ``window_size = 2 W - 1``. Mistral and Mixtral slide
in every layer, Qwen2 and Qwen3 in the layers their ``layer_types`` mark ``sliding_attention``. A spec
holds a window shared by every layer in its block's mechanism, and windows that differ between layers
as per-layer mechanisms.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from brickwork.factory.choice import merge_spec

from .spec import unsupported

# The options of a causal local mechanism that HF has a setting for (its backend computes the same).
_LOCAL_OPTIONS = {"name", "window_size", "dropout", "backend", "causal"}


def local_mechanism(window: int, dropout: float) -> dict[str, Any]:
    """The mechanism of HF's window of ``window`` positions."""
    return {"name": "local", "window_size": 2 * window - 1, "dropout": dropout}


def with_windows(spec: dict[str, Any], windows: Sequence[int | None]) -> dict[str, Any]:
    """``spec`` (a decoder with plain attention) with layer i attending within ``windows[i]`` (None: to
    every earlier position)."""
    attention = spec["decoder"]["block"]["attention"]
    dropout = attention["mechanism"]["dropout"]
    if len(set(windows)) == 1:
        if windows[0] is not None:
            attention["mechanism"] = local_mechanism(windows[0], dropout)
        return spec
    spec["decoder"]["layers"] = {
        i: {"attention": {"mechanism": local_mechanism(window, dropout)}}
        for i, window in enumerate(windows)
        if window is not None
    }
    return spec


def read_windows(spec: Mapping[str, Any], family: str) -> tuple[list[int | None], dict[str, Any]]:
    """Each layer's window (None: plain causal attention), and ``spec`` with plain attention in every
    layer and no per-layer overrides, for the checks of the rest; refuses layers that differ in
    anything but their window."""
    decoder = spec["decoder"]
    block = decoder["block"]
    overrides = {int(i): layer for i, layer in (decoder.get("layers") or {}).items()}
    windows, plain = [], []
    for i in range(decoder["num_layers"]):
        override = overrides.get(i, {})
        mechanism = override.get("attention", {}).get("mechanism", {})
        if override and override != {"attention": {"mechanism": mechanism}}:
            raise unsupported(
                family, f"decoder.layers.{i}", "HF layers differ in their attention window only"
            )
        window, mechanism = _window(merge_spec(block["attention"]["mechanism"], mechanism), family, i)
        windows.append(window)
        plain.append(mechanism)
    if any(m != plain[0] for m in plain):
        raise unsupported(
            family, "decoder.layers", "HF layers differ in their window only, not in attention options"
        )
    attention = {**block["attention"], "mechanism": plain[0]}
    decoder = {k: v for k, v in decoder.items() if k != "layers"} | {
        "block": {**block, "attention": attention}
    }
    return windows, {**spec, "decoder": decoder}


def _window(mechanism: Mapping[str, Any], family: str, layer: int) -> tuple[int | None, dict[str, Any]]:
    """(HF's window, the plain attention with the same options) of a local mechanism; (None, the
    mechanism less its backend, which computes the same) of any other."""
    if mechanism["name"] != "local":
        return None, {k: v for k, v in mechanism.items() if k != "backend"} | {
            "scale": mechanism.get("scale")
        }
    extra = set(mechanism) - _LOCAL_OPTIONS
    if extra:
        raise unsupported(
            family, f"decoder.layers.{layer}.attention.mechanism", f"options {sorted(extra)} are not in HF"
        )
    plain = {"name": "scaled_dot_product", "dropout": mechanism.get("dropout", 0.0), "scale": None}
    return mechanism["window_size"] // 2 + 1, plain
