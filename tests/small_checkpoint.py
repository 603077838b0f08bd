"""A small model and one saved checkpoint of it, for the checkpoint format and optimizer-restore tests."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from brickwork.parallel import save_checkpoint


def small_model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 32), nn.Linear(32, 4))


def save_small_checkpoint(folder: Path) -> Path:
    """A complete checkpoint of ``small_model(0)`` after one AdamW step, model and optimizer state."""
    model = small_model(0)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 16)).sum().backward()
    optimizer.step()
    return save_checkpoint(folder, model, optimizer, 1)
