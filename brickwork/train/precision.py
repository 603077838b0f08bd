"""The precision policy of a train step: autocast dtype, and dynamic loss scaling for fp16.

| precision    | compute            | weights and gradient reduction                        |
|--------------|--------------------|-------------------------------------------------------|
| ``fp32``     | fp32               | fp32                                                  |
| ``bf16``     | bf16 autocast      | fp32                                                  |
| ``bf16-mixed``| bf16              | fp32 master weights; FSDP's MixedPrecisionPolicy (bf16 |
|              |                    | parameters in compute, fp32 reduce) where sharded     |
| ``fp16``     | fp16 autocast      | fp32, loss scaled dynamically (GradScaler, or          |
|              |                    | ShardedGradScaler over every rank when distributed)   |

An fp16 step whose gradients overflow is skipped, never applied, and the scale halves.
"""

from __future__ import annotations

import contextlib

import torch
from torch.distributed.fsdp import FSDPModule
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

from brickwork.parallel import ParallelState

PRECISIONS = ("fp32", "bf16", "bf16-mixed", "fp16")
_DIST_PRECISION = {"fp32": "fp32", "bf16": "bf16", "bf16-mixed": "bf16", "fp16": "fp16"}


class Precision:
    """``precision`` for a model laid out as ``state`` says (None: a plain single-process module)."""

    def __init__(self, precision: str, device: torch.device, state: ParallelState | None) -> None:
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {list(PRECISIONS)}, got {precision!r}")
        self.name = precision
        self.device_type = device.type
        sharded = state is not None and any(isinstance(m, FSDPModule) for m in state.modules)
        policy = state.config.mixed_precision if state is not None else "fp32"
        if policy != "fp32" and _DIST_PRECISION[precision] != policy:
            raise ValueError(
                f"the model was parallelized with dist mixed_precision={policy!r}, which does not match "
                f"precision={precision!r}; use precision {'bf16-mixed' if policy == 'bf16' else policy!r}"
            )
        if precision == "bf16-mixed" and sharded and policy != "bf16":
            raise ValueError(
                "precision='bf16-mixed' on an FSDP (zero_stage 2/3) model needs its MixedPrecisionPolicy: "
                "parallelize it with dist mixed_precision='bf16'"
            )
        # FSDP's policy already computes in bf16; elsewhere autocast does.
        self.dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
        if precision == "bf16-mixed" and not sharded:
            self.dtype = torch.bfloat16
        self.scaler: torch.amp.GradScaler | None = None
        if precision == "fp16":
            # Every rank must agree to skip: the sharded scaler all-reduces "found inf" over the world.
            distributed = state is not None and torch.distributed.get_world_size() > 1
            scaler = ShardedGradScaler if distributed else torch.amp.GradScaler
            self.scaler = scaler(device=self.device_type)

    def autocast(self) -> contextlib.AbstractContextManager:
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype)

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return self.scaler.scale(loss) if self.scaler is not None else loss
