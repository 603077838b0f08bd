"""Qwen2 (``Qwen2ForCausalLM``): Llama with biases on q/k/v (none on o), and sliding windows by layer.

The q/k/v biases without an output bias are the attention's ``bias: qkv``. ``layer_types`` says which
layers attend within ``sliding_window`` (brickwork's causal ``local`` mechanism, windows.py): a
config without it slides in the layers from ``max_window_layers`` on when ``use_sliding_window`` is
set, as HF derives it. Weight names, the tensor-parallel plan and the pipeline recipe are Llama's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from brickwork.errors import ConfigError

from .config import HFConfig
from .family import Variant, causal_lm
from .llama import Llama
from .mistral import Mistral
from .spec import spec_attention, unsupported

FULL, SLIDING = "full_attention", "sliding_attention"


class Qwen2(Mistral):
    name = "qwen2"
    model_type = "qwen2"
    lm: ClassVar[Variant] = causal_lm("Qwen2ForCausalLM")
    variants: ClassVar[dict[str, Variant]] = {lm.architecture: lm}
    shape = "rotary + RMSNorm + gated MLP + q/k/v biases"
    attention_bias: ClassVar[bool | str | None] = "qkv"

    def attention_options(self, cfg: HFConfig, eps: float) -> dict[str, Any]:
        return {"bias": "qkv"}

    def windows(self, cfg: HFConfig, num_layers: int) -> list[int | None]:
        window = cfg.get("sliding_window")
        window = window if cfg.get("use_sliding_window", False) else None
        first = cfg.get("max_window_layers", 28)
        kinds = cfg.get("layer_types") or [
            SLIDING if window is not None and i >= first else FULL for i in range(num_layers)
        ]
        if len(kinds) != num_layers or not set(kinds) <= {FULL, SLIDING}:
            raise ConfigError(
                f"{self.name}: layer_types must name {FULL!r} or {SLIDING!r} for each of the {num_layers} "
                f"layers, got {kinds!r}",
                "hf_config.layer_types",
            )
        if SLIDING in kinds and window is None:
            raise ConfigError(
                f"{self.name}: layer_types has {SLIDING!r} layers, but no sliding_window is in use "
                "(use_sliding_window is off or sliding_window unset)",
                "hf_config.layer_types",
            )
        return [window if kind == SLIDING else None for kind in kinds]

    def matches(self, spec: Mapping[str, Any]) -> bool:
        return Llama.matches(self, spec) and spec_attention(spec)["bias"] == "qkv"

    def hf_windows(self, windows: Sequence[int | None]) -> dict[str, Any]:
        sizes = {w for w in windows if w is not None}
        if len(sizes) > 1:
            raise unsupported(
                self.name,
                "decoder.layers",
                f"HF {self.name}'s sliding layers share one window, got {sorted(sizes)}",
            )
        window = sizes.pop() if sizes else None
        layer_types = [FULL if w is None else SLIDING for w in windows]
        return {
            "use_sliding_window": window is not None,
            "sliding_window": window,
            "layer_types": layer_types,
        }
