"""``backend="triton"`` on CPU through every entry point: importing ``brickwork.kernels`` sets nothing;
a CPU Triton call chooses the interpreter when triton is not loaded yet; ``use_triton_interpreter()``
chooses it up front; ``brickwork train`` chooses it for a run on CPU; and where triton was already
imported compiled, each refuses in one clear line instead of failing inside triton. Every case runs
in a fresh process without ``TRITON_INTERPRET`` in its environment."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from brickwork.kernels.backend import TRITON_INSTALLED

pytestmark = pytest.mark.skipif(not TRITON_INSTALLED, reason="needs the triton package")

NORM = {"name": "layernorm", "backend": "triton"}


def _run(script: str, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["CUDA_VISIBLE_DEVICES"] = ""  # the CPU case, on any machine
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), *args],
        capture_output=True, text=True, env=env, cwd=cwd, timeout=240,
    )  # fmt: skip


def test_importing_sets_nothing_and_the_first_cpu_call_chooses_the_interpreter() -> None:
    result = _run(
        """
        import os, sys, torch
        import brickwork.kernels as k
        print("TRITON_INTERPRET" in os.environ, "triton" in sys.modules)
        x, w, b = torch.randn(3, 5, 40), torch.randn(40), torch.randn(40)
        y = k.layer_norm(x, w, b, backend="triton")
        print(os.environ["TRITON_INTERPRET"], torch.allclose(y, k.layer_norm_ref(x, w, b), atol=1e-5))
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "False", "1", "True"]


def test_use_triton_interpreter_first_lets_a_built_model_run_its_triton_norms() -> None:
    result = _run(
        f"""
        from brickwork.kernels import use_triton_interpreter
        use_triton_interpreter()
        import torch
        from brickwork.factory import build_model, get_preset
        torch.manual_seed(0)
        spec = get_preset("gpt-tiny")
        spec["decoder"]["num_layers"] = 1
        spec["decoder"]["block"]["norm"] = {NORM!r}
        model = build_model(spec).eval()
        twin = build_model({{**spec, "decoder": {{**spec["decoder"], "block": {{**spec["decoder"]["block"],
                            "norm": {{"name": "layernorm"}}}}}}}}).eval()
        twin.load_state_dict(model.state_dict())
        ids = torch.randint(0, spec["vocab_size"], (2, 12))
        with torch.no_grad():
            print(torch.allclose(model(ids), twin(ids), atol=1e-4))
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True"]


def test_after_a_compiled_import_the_call_and_the_switch_refuse_clearly() -> None:
    result = _run(
        """
        import torch, torch._dynamo  # loads triton, compiled: nothing chose the interpreter yet
        import brickwork.kernels as k
        from brickwork.components.residual import LayerNorm
        for attempt in (lambda: LayerNorm(8, backend="triton")(torch.randn(2, 8)), k.use_triton_interpreter):
            try:
                attempt()
            except RuntimeError as err:
                print(str(err).count("brickwork.kernels.use_triton_interpreter() before importing them"))
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["1", "1"]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_brickwork_train_with_a_triton_norm_on_cpu_matches_the_torch_twin(tmp_path: Path) -> None:
    small = ["gpt-tiny", "decoder.num_layers=1", "train.steps=2", "train.batch_size=2", "train.seq_len=16",
             "train.eval_interval=1", "train.eval_batches=1", "train.sample_tokens=0"]  # fmt: skip
    cli = "import sys; from brickwork.cli import main; sys.exit(main(sys.argv[1:]))"
    for name, norm in (("triton", NORM), ("torch", {"name": "layernorm"})):
        norm_text = "{" + ", ".join(f"{k}: {v}" for k, v in norm.items()) + "}"
        result = _run(
            cli, "train", *small, f"decoder.block.norm={norm_text}", f"train.out_dir={name}", cwd=tmp_path
        )
        assert result.returncode == 0, result.stderr
    curves = [(tmp_path / name / "metrics.jsonl").read_text().splitlines() for name in ("triton", "torch")]
    losses = [[json.loads(line).get("loss", json.loads(line).get("val_loss")) for line in c] for c in curves]
    assert losses[0] == pytest.approx(losses[1], rel=1e-4)


def test_brickwork_train_refuses_before_the_run_folder_when_triton_is_already_compiled(
    tmp_path: Path,
) -> None:
    result = _run(
        """
        import sys, torch._dynamo  # a process that loaded triton compiled before the command ran
        from brickwork.cli import main
        norm = "decoder.block.norm={name: layernorm, backend: triton}"
        sys.exit(main(["train", "decoder.num_layers=1", norm, "train.out_dir=run"]))
        """,
        cwd=tmp_path,
    )
    assert result.returncode == 2, result.stderr
    line = result.stderr.strip()
    assert "\\n" not in line
    assert line.startswith(
        "brickwork train: error: decoder.block.norm.backend: a run on CPU; backend='triton'"
    )
    assert not (tmp_path / "run").exists()
