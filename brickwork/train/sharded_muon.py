"""torch's Muon step, made exact for matrices split over ranks (tensor parallel, FSDP2, both).

Newton-Schulz orthogonalisation is not elementwise: the orthogonalised local shard of a matrix is not
the local shard of the orthogonalised matrix, and the learning-rate adjustment reads the matrix's
shape. So for a sharded parameter the momentum-updated gradient is gathered to the whole matrix
(one all-gather per mesh dim it is split over), orthogonalised whole on every rank of its shard
group, and each rank applies its own shard of the result. torch's ``Muon`` given DTensors gets the
same mathematics through DTensor's sharded matmuls, but with 11 to 16 collectives per matrix and
step at ``ns_steps=5`` on 2 ranks (all-reduces of bfloat16 partial products among them); a local
shard under DDP + tensor parallel it would orthogonalise on its own, which is wrong.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.distributed.tensor import DTensor, distribute_tensor
from torch.distributed.tensor._dtensor_spec import DTensorSpec
from torch.optim import _muon
from torch.optim.optimizer import _to_scalar


class ShardedMuon(torch.optim.Muon):
    """torch's ``Muon`` whose update of a sharded matrix is the update of the whole matrix, sharded.

    Plain tensors take exactly torch's step (its momentum and Nesterov rule, its bfloat16
    Newton-Schulz with its coefficients, its learning-rate adjustment), so one process is unchanged.
    A parameter is sharded when it is a DTensor (tensor parallel's Shard(0)/Shard(1), FSDP2's
    Shard(0), or both on a 2-D mesh) or a local shard carrying its DTensor layout in ``_st_info``
    (tensor parallel under DDP, parallel/data/ddp.py). Every rank of a shard group must step the
    same matrices in the same order, which holds when each rank steps all of its parameters
    (FSDP2, tensor parallel), and under ZeRO-1 with tensor parallel as well, because
    ZeroRedundancyOptimizer assigns parameters by size and tensor parallel splits every parameter
    evenly.
    """

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params: list[torch.Tensor] = []
            grads: list[torch.Tensor] = []
            buffers: list[torch.Tensor] = []
            self._init_group(group, params, grads, buffers)
            lr, momentum = _to_scalar(group["lr"]), group["momentum"]
            for param, grad, buffer in zip(params, grads, buffers, strict=True):
                buffer.lerp_(grad, 1 - momentum)
                update = grad.lerp(buffer, momentum) if group["nesterov"] else buffer
                layout = shard_layout(param)
                # Looked up at each call, so a test can run the iteration at a higher precision.
                orthogonalise = _muon._zeropower_via_newtonschulz
                coefficients, steps, eps = group["ns_coefficients"], group["ns_steps"], group["eps"]
                local = param.to_local() if isinstance(param, DTensor) else param
                if layout is None:
                    update, shape = orthogonalise(update, coefficients, steps, eps), param.shape
                else:
                    whole = orthogonalise(whole_matrix(update, layout), coefficients, steps, eps)
                    # The mesh's device; FSDP2's cpu_offload keeps the shard itself on the CPU.
                    update, shape = local_shard(whole, layout).to(local.device), layout.shape
                local.mul_(1 - lr * group["weight_decay"])
                local.add_(update, alpha=-_muon._adjust_lr(lr, group["adjust_lr_fn"], shape))
        return loss


def shard_layout(param: torch.Tensor) -> DTensorSpec | None:
    """How ``param`` is split over ranks: a DTensor's own layout, or the one a local shard under
    DDP + tensor parallel carries; None for a whole matrix."""
    if isinstance(param, DTensor):
        return param._spec
    return getattr(param, "_st_info", None)


def whole_matrix(update: torch.Tensor, layout: DTensorSpec) -> torch.Tensor:
    """The whole ``layout.shape`` matrix of which ``update`` (a DTensor, or a local shard) is this
    rank's part, on every rank of ``layout.mesh``: collective over it."""
    local = update.to_local() if isinstance(update, DTensor) else update
    sharded = DTensor.from_local(
        local, layout.mesh, layout.placements, run_check=False, shape=layout.shape, stride=layout.stride
    )
    return sharded.full_tensor()


def local_shard(whole: torch.Tensor, layout: DTensorSpec) -> torch.Tensor:
    """This rank's part of ``whole`` under ``layout``, cut locally: every rank holds ``whole``."""
    return distribute_tensor(whole, layout.mesh, layout.placements, src_data_rank=None).to_local()
