"""xformers' device-capability helper."""

from __future__ import annotations

import torch


def gpu_capabilities_older_than_70() -> bool:
    """Whether the current CUDA device predates compute capability 7.0 (False without CUDA)."""
    if not torch.cuda.is_available():
        return False
    major, _ = torch.cuda.get_device_capability()
    return major < 7
