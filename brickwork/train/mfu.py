"""Model FLOPs utilisation (MFU) of a training run: the model FLOP/s it achieves over the dense peak
FLOP/s of all its devices at its precision, as nanoGPT and torchtitan report it.

The model FLOPs of a token are the planner's count (parallel/planner/flops.py), counted the way
Narayanan et al. report them: forward and backward (three forward passes), with the whole attention
square, and without recomputation (which is work the hardware does but the model does not need).
That is nanoGPT's ``6N + 12·L·H·Q·T``, where N counts the weights that take part in a matmul (the LM
head's included) and leaves out the biases and norm gains nanoGPT also counts. The peak comes from
the planner's table of device presets (parallel/planner/devices.py, :meth:`Device.peak_flops`).

MFU is unknown on a CPU, on a GPU no preset describes, and for a model the planner does not count
(reversible stacks).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from brickwork.errors import ConfigError
from brickwork.parallel.planner.devices import running_preset
from brickwork.parallel.planner.flops import step_flops
from brickwork.parallel.planner.lengths import Lengths
from brickwork.parallel.planner.model_facts import model_facts


@dataclass(frozen=True)
class Utilization:
    """A run's MFU at a given throughput: ``flops_per_token × tokens/s ÷ peak_flops``.

    ``flops_per_token`` is the model's (forward and backward) for one token of the global batch,
    ``peak_flops`` that of all devices together. Both are None when MFU is unknown, and
    ``unknown`` then says why.
    """

    flops_per_token: float | None
    peak_flops: float | None
    unknown: str | None = None

    def mfu(self, tokens_per_s: float) -> float | None:
        """The fraction of peak that ``tokens_per_s`` tokens a second use; None when unknown."""
        if self.flops_per_token is None or self.peak_flops is None:
            return None
        return self.flops_per_token * tokens_per_s / self.peak_flops


def run_utilization(
    spec: Mapping[str, Any],
    seq_len: int,
    precision: str,
    device: torch.device,
    devices: int,
    lengths: tuple[int, int] | None = None,
) -> Utilization:
    """The :class:`Utilization` of a run of ``spec`` on ``devices`` devices like ``device`` (this
    process's), with sequences of ``seq_len`` tokens at the train step's ``precision``. ``lengths``:
    the (source, target) tokens each sequence puts through an encoder-decoder's encoder and decoder
    (Task.model_lengths; left out, both ``seq_len``); the FLOPs per token are per ``seq_len`` token.

    Reads the spec on the meta device once; on a CPU or an unknown GPU it does not read it at all.
    """
    preset = running_preset(device)
    if preset is None:
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
        return Utilization(None, None, f"no peak FLOP/s is known for {name} (parallel/planner/devices.py)")
    try:
        facts = model_facts(spec)
    except ConfigError as err:
        return Utilization(None, None, f"no FLOP count: {err.reason}")
    per_row = step_flops(facts, 1, Lengths(*lengths) if lengths else Lengths.one(seq_len), recompute="none")
    per_token = per_row / seq_len
    return Utilization(per_token, devices * preset.peak_flops(precision))
