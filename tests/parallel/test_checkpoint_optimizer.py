"""``load_checkpoint`` restores the optimizer's hyperparameters, but not how its update runs."""

from __future__ import annotations

from pathlib import Path

import torch
from small_checkpoint import save_small_checkpoint, small_model

from brickwork.parallel import load_checkpoint


def test_hyperparameters_are_restored_but_not_how_the_update_runs(tmp_path: Path) -> None:
    save_small_checkpoint(tmp_path)
    # The saved run chose torch's default update; a run laid out differently (tensor parallel mixes
    # DTensors and plain tensors, which a foreach update cannot take) keeps its own choice.
    model = small_model(1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.5, foreach=True)
    load_checkpoint(tmp_path, model, optimizer)
    assert optimizer.param_groups[0]["lr"] == 1e-3  # the saved run's
    assert optimizer.param_groups[0]["foreach"] is True
