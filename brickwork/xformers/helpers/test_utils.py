"""xformers' test helper: a one-process ``torch.distributed`` group."""

from __future__ import annotations

import tempfile

import torch
import torch.distributed as dist


def init_torch_distributed_local() -> None:
    """Join a world of one (gloo, NCCL where CUDA runs) unless a process group already exists."""
    if dist.is_initialized():
        return
    backend = dist.Backend.NCCL if torch.cuda.is_available() else dist.Backend.GLOO
    with tempfile.NamedTemporaryFile(delete=False) as rendezvous:
        init_method = "file://" + rendezvous.name
    dist.init_process_group(backend=backend, rank=0, world_size=1, init_method=init_method)
