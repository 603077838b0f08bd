"""``load_checkpoint`` restores the optimizer's hyperparameters, but not how its update runs."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from brickwork.parallel import load_checkpoint, save_checkpoint


def _model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 32), nn.Linear(32, 4))


def test_hyperparameters_are_restored_but_not_how_the_update_runs(tmp_path: Path) -> None:
    saved_model = _model(0)
    saved_optimizer = torch.optim.AdamW(saved_model.parameters())
    saved_model(torch.randn(2, 16)).sum().backward()
    saved_optimizer.step()
    save_checkpoint(tmp_path, saved_model, saved_optimizer, 1)
    # The saved run chose torch's default update; a run laid out differently (tensor parallel mixes
    # DTensors and plain tensors, which a foreach update cannot take) keeps its own choice.
    model = _model(1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.5, foreach=True)
    load_checkpoint(tmp_path, model, optimizer)
    assert optimizer.param_groups[0]["lr"] == 1e-3  # the saved run's
    assert optimizer.param_groups[0]["foreach"] is True
