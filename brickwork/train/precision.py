"""The precision policy of a train step: autocast dtype, and dynamic loss scaling for fp16.

| precision    | compute            | weights and gradient reduction                        |
|--------------|--------------------|-------------------------------------------------------|
| ``fp32``     | fp32               | fp32                                                  |
| ``bf16``     | bf16 autocast      | fp32                                                  |
| ``bf16-mixed``| bf16              | fp32 master weights; FSDP's MixedPrecisionPolicy (bf16 |
|              |                    | parameters in compute, fp32 reduce) where sharded     |
| ``fp16``     | fp16 autocast      | fp32, loss scaled dynamically (:class:`LossScaler`)    |
| ``fp8``      | float8 matmuls in  | as ``bf16-mixed``                                     |
|              | the layers' big    |                                                       |
|              | linears, bf16 else |                                                       |

fp8 trains the ``Float8Linear`` layers that :func:`brickwork.train.fp8.convert_to_fp8` swapped in
before ``parallelize`` (brickwork/train/fp8.py); the step itself computes as ``bf16-mixed`` does.

An fp16 step whose gradients overflow is skipped on every rank, never applied, and the scale halves.
The scaler's state (the scale, the clean steps towards the next doubling, the overflows in a row) is
part of a run's checkpoint, so a resumed run goes on with the scale the uninterrupted one had.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from brickwork.parallel import ParallelState

PRECISIONS = ("fp32", "bf16", "bf16-mixed", "fp16", "fp8")
_DIST_PRECISION = {"fp32": "fp32", "bf16": "bf16", "bf16-mixed": "bf16", "fp16": "fp16", "fp8": "bf16"}
# fp32 master weights with bf16 compute; fp8 adds float8 matmuls to it.
_MIXED = ("bf16-mixed", "fp8")


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
        if precision in _MIXED and sharded and policy != "bf16":
            raise ValueError(
                f"precision={precision!r} on an FSDP (zero_stage 2/3) model needs its MixedPrecisionPolicy: "
                "parallelize it with dist mixed_precision='bf16'"
            )
        # FSDP's policy already computes in bf16; elsewhere autocast does.
        self.dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
        if precision in _MIXED and not sharded:
            self.dtype = torch.bfloat16
        self.scaler = LossScaler(device, distributed=state is not None) if precision == "fp16" else None

    def autocast(self) -> contextlib.AbstractContextManager:
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype)

    def evaluation(self) -> contextlib.AbstractContextManager:
        """What evaluation computes under: training's autocast, but float32 for fp16, where an overflow
        has no loss scaler to skip it and would end the run with a NaN validation loss."""
        return contextlib.nullcontext() if self.scaler is not None else self.autocast()

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self.scaler.scale if self.scaler is not None else loss


class LossScaler:
    """Dynamic loss scaling with torch GradScaler's policy: start at 2**16, halve on an overflow,
    double after 2000 steps without one.

    It unscales each rank's local gradient pieces (``to_local`` of DTensor shards) with torch's own
    fused ``_amp_foreach_non_finite_check_and_unscale_``: torch's GradScaler and ShardedGradScaler
    cannot take the mix of DTensor and plain gradients that tensor parallel leaves. The found-inf
    flag is all-reduced over every rank, so all of them skip the same step.
    """

    def __init__(self, device: torch.device, distributed: bool, init_scale: float = 2.0**16) -> None:
        self.device = device
        self.distributed = distributed
        self.scale = init_scale
        self.growth_interval = 2000
        self._clean_steps = 0
        # Steps skipped since the last one applied: a run whose steps keep overflowing is diverging.
        self.overflows_in_a_row = 0

    @torch.no_grad()
    def unscale_(self, params: Sequence[torch.Tensor]) -> bool:
        """Divide every gradient by the scale in place; True when one held an inf or NaN."""
        found = torch.zeros(1, device=self.device)
        inverse = torch.full((1,), 1.0 / self.scale, device=self.device)
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for param in params:
            if param.grad is not None:
                grad = param.grad.to_local() if isinstance(param.grad, DTensor) else param.grad
                by_dtype.setdefault(grad.dtype, []).append(grad)
        for grads in by_dtype.values():
            torch._amp_foreach_non_finite_check_and_unscale_(grads, found, inverse)
        if self.distributed:
            dist.all_reduce(found, op=dist.ReduceOp.MAX)
        return bool(found.item())

    def update(self, overflowed: bool) -> None:
        if overflowed:
            self.scale /= 2
            self._clean_steps = 0
            self.overflows_in_a_row += 1
            return
        self.overflows_in_a_row = 0
        self._clean_steps += 1
        if self._clean_steps == self.growth_interval:
            self.scale *= 2
            self._clean_steps = 0

    def state_dict(self) -> dict[str, float | int]:
        """What the scaler carries from step to step, as JSON data (the same on every rank)."""
        return {
            "scale": self.scale,
            "clean_steps": self._clean_steps,
            "overflows_in_a_row": self.overflows_in_a_row,
        }

    def load_state_dict(self, state: dict[str, float | int]) -> None:
        """Continue from :meth:`state_dict`'s values; ValueError names a value that is not one it wrote."""
        scale, clean, overflows = state["scale"], state["clean_steps"], state["overflows_in_a_row"]
        if isinstance(scale, bool) or not isinstance(scale, int | float) or not 0 < scale < math.inf:
            raise ValueError(f"the loss scale must be a positive finite number, got {scale!r}")
        for name, count in (("clean_steps", clean), ("overflows_in_a_row", overflows)):
            if isinstance(count, bool) or not isinstance(count, int) or count < 0:
                raise ValueError(f"{name} must be a count >= 0, got {count!r}")
        self.scale, self._clean_steps, self.overflows_in_a_row = float(scale), clean, overflows
