"""``brickwork train`` of a masked LM and of a seq2seq model logs the same losses under ZeRO-3 and
under tensor parallel as in one process, once ``dropout=0`` has turned every dropout off (the
TrainStep-level promise of tests/train/test_train_layouts.py, checked through the command)."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_runs import SMALL, check_ok, curve, run_cli

from brickwork.factory import load_spec

pytestmark = [pytest.mark.slow, pytest.mark.distributed]

MODELS = {
    "masked_lm": ["configs/bert-small.yaml", "encoder.num_layers=1"],
    "seq2seq": ["t5-small", "encoder.num_layers=1", "decoder.num_layers=1"],
}
LAYOUTS = {
    "zero3": ["dist.data_parallel_size=2", "dist.zero_stage=3"],
    "tp2": ["dist.tensor_parallel_size=2"],
}
REPO = Path(__file__).resolve().parents[2]


def _args(model: str, out_dir: str) -> list[str]:
    spec, *overrides = MODELS[model]
    spec = str(REPO / spec) if spec.endswith(".yaml") else spec
    return ["train", spec, *overrides, *SMALL, "dropout=0", f"train.out_dir={out_dir}"]


@pytest.fixture(scope="module")
def single(workdir: Path) -> dict[str, Path]:
    runs = {}
    for model in MODELS:
        out = check_ok(run_cli(_args(model, f"{model}-single"), workdir))
        assert "dropout=0 sets every dropout of the spec" in out
        runs[model] = workdir / f"{model}-single"
    return runs


@pytest.mark.timeout(600)
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("model", sorted(MODELS))
def test_the_losses_match_one_process(
    single: dict[str, Path], workdir: Path, model: str, layout: str
) -> None:
    out_dir = f"{model}-{layout}"
    check_ok(run_cli([*_args(model, out_dir), *LAYOUTS[layout]], workdir, nproc=2, timeout=540))
    spec = load_spec(workdir / out_dir / "config.yaml")
    dropouts = [v for k, v in _flatten(spec) if k.endswith("dropout")]
    assert len(dropouts) >= 4 and set(dropouts) == {0}
    got, expected = curve(workdir / out_dir), curve(single[model])
    assert [r[0] for r in got] == [r[0] for r in expected]
    for a, b in zip(got, expected):
        for x, y in zip(a[1:], b[1:]):
            assert (x is None) == (y is None)
            if x is not None:
                assert x == pytest.approx(y, rel=1e-5, abs=1e-6)


def _flatten(node: object, path: str = "") -> list[tuple[str, object]]:
    if isinstance(node, dict):
        return [item for k, v in node.items() for item in _flatten(v, f"{path}.{k}")]
    return [(path, node)]
