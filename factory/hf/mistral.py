"""Mistral (``MistralForCausalLM``): Llama without biases, every layer attending within a sliding window.

``sliding_window`` (W positions, the query's own included) is brickwork's causal ``local`` mechanism
with ``window_size = 2 W - 1`` (windows.py); a config without one is plain causal attention, the same
function as Llama's, so such a model exports as ``LlamaForCausalLM``. Weight names, the
tensor-parallel plan and the pipeline recipe are Llama's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from .config import HFConfig
from .family import Variant, causal_lm
from .llama import Llama, gated_mlp
from .spec import hf_mlp, spec_feedforward, unsupported


class Mistral(Llama):
    name = "mistral"
    model_type = "mistral"
    lm: ClassVar[Variant] = causal_lm("MistralForCausalLM")
    variants: ClassVar[dict[str, Variant]] = {lm.architecture: lm}
    shape = "rotary + RMSNorm + gated MLP + one sliding window"
    inert: ClassVar[tuple[str, ...]] = ()
    attention_bias: ClassVar[bool | str | None] = False

    def attention_options(self, cfg: HFConfig, eps: float) -> dict[str, Any]:
        return {"bias": False}

    def feedforward(self, cfg: HFConfig, activation: str) -> dict[str, Any]:
        return gated_mlp(cfg, activation, bias=False)

    def windows(self, cfg: HFConfig, num_layers: int) -> list[int | None]:
        return [cfg.get("sliding_window")] * num_layers

    def matches(self, spec: Mapping[str, Any]) -> bool:
        """A Llama-shaped spec with a sliding window in some layer."""
        overrides = (spec["decoder"].get("layers") or {}).values()
        mechanisms = [spec["decoder"]["block"]["attention"]["mechanism"]]
        mechanisms += [layer.get("attention", {}).get("mechanism", {}) for layer in overrides]
        return super().matches(spec) and any(m.get("name") == "local" for m in mechanisms)

    def hf_attention(self, attention: Mapping[str, Any], eps: float) -> dict[str, Any]:
        return {}

    def hf_feedforward(self, spec: Mapping[str, Any]) -> dict[str, Any]:
        return hf_mlp(spec_feedforward(spec, self.name, ("swiglu", "glu"), bias=False), self.name, "silu")

    def hf_windows(self, windows: Sequence[int | None]) -> dict[str, Any]:
        if len(set(windows)) > 1:
            raise unsupported(
                self.name, "decoder.layers", f"every layer of HF {self.name} attends within the same window"
            )
        return {"sliding_window": windows[0]}
