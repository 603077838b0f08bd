"""The example specs in configs/ build and run."""

from pathlib import Path

import pytest
import torch
from factory_specs import run

from brickwork.factory import build_block, build_model, get_preset, load_spec

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.yaml"))


def test_there_are_examples() -> None:
    assert len(CONFIGS) >= 5


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_example_builds_and_runs(path: Path) -> None:
    spec = load_spec(path)
    if "model" not in spec:
        block = build_block(path)
        x = torch.randn(2, 5, spec["dim_model"])
        assert block(x).shape == x.shape
        return
    model = build_model(path)
    out = run(model, spec["model"])
    assert torch.isfinite(out).all()
    assert build_model(model.spec).spec == model.spec


def test_gpt_tiny_file_is_the_resolved_preset() -> None:
    path = next(p for p in CONFIGS if p.name == "gpt-tiny.yaml")
    assert load_spec(path) == build_model(get_preset("gpt-tiny")).spec
