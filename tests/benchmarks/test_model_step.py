"""The training-step benchmark on tiny GPT-2 and Llama shapes: every variant, same weights, sane rows."""

from __future__ import annotations

import pytest

from brickwork.benchmarks import model_step

TINY = model_step.TINY_CASES

VARIANTS = [
    "hf", "brickwork", "brickwork, twins", "brickwork, fused head loss", "hf + AdamW", "brickwork + AdamW",
]  # fmt: skip


@pytest.mark.parametrize("case", TINY, ids=lambda c: c.name)
def test_every_variant_is_timed_on_the_same_model(case):
    pytest.importorskip("transformers")
    rows = model_step.run_case(case, layers=2, batch=2, seq=16, repeats=1, compile_too=False)
    assert [r["variant"] for r in rows] == VARIANTS
    for row in rows:
        # from_hf gives the same function: the logits agree before anything is timed.
        assert row["max_logit_diff"] < 1e-4 and row["dtype"] == "float32" and row["layers"] == 2
        assert row["wall_ms"] > 0 and row["tokens_per_s"] == pytest.approx(32 / (row["wall_ms"] * 1e-3))
        assert "gpu_ms" not in row  # CPU: all time is host time
    table = model_step.markdown_table(rows)
    assert f"| {case.name} | brickwork + AdamW | 2 | 2 x 16 | float32 |" in table


def test_fused_head_loss_equals_the_logits_loss():
    pytest.importorskip("transformers")
    import torch

    from brickwork.factory import from_hf

    torch.manual_seed(0)
    model = from_hf(model_step.gpt2_tiny(1).eval())
    ids = torch.randint(0, 97, (2, 9))
    torch.testing.assert_close(
        model_step._fused_head_loss(model, ids), model_step._logits_loss(model, ids), rtol=1e-5, atol=1e-5
    )


def test_twins_context_sends_default_calls_to_the_twin_and_restores():
    import brickwork.kernels as kernels

    original = kernels.use_triton
    with model_step.torch_twins():
        assert kernels.use_triton(None, object()) is False
    assert kernels.use_triton is original


def test_ratios_compare_with_hf_in_the_same_setting():
    assert model_step._hf_twin("brickwork, compiled, twins") == "hf, compiled"
    assert model_step._hf_twin("brickwork + fused AdamW") == "hf + fused AdamW"
    assert model_step._hf_twin("brickwork, compiled + AdamW") == "hf, compiled + AdamW"


@pytest.mark.parametrize(("case", "kernel"), [(TINY[0], "layer_norm"), (TINY[1], "rms_norm")])
def test_compiled_cuda_variants_switch_one_kernel_to_its_triton_op_and_restore(case, kernel):
    pytest.importorskip("transformers")
    from brickwork.factory import from_hf

    hf = case.build_hf(1)
    ours = from_hf(hf)
    on_cuda = [v[0] for v in model_step._variants(hf, ours, compile_too=True, cuda=True)]
    assert [name for name in on_cuda if "Triton" in name] == [f"brickwork, compiled, Triton {kernel}"]
    on_cpu = [v[0] for v in model_step._variants(hf, ours, compile_too=True, cuda=False)]
    assert not [name for name in on_cpu if "Triton" in name]  # the Triton ops compile only for CUDA
    norms = [m for m in ours.modules() if isinstance(m, model_step.KERNEL_MODULES[kernel])]
    assert len(norms) == 3  # two in the layer, the final norm
    with model_step.triton_kernel(ours, kernel):
        assert all(m.backend == "triton" for m in norms)
    assert all(m.backend is None for m in norms)


@pytest.mark.slow
def test_compile_report_finds_one_graph_per_model_and_counts_kernels(tmp_path, capsys):
    pytest.importorskip("transformers")
    import json

    assert (
        model_step.main(["--tiny", "--layers", "1", "--batch", "2", "--seq-len", "8", "--out", str(tmp_path)])
        == 0
    )
    (written,) = tmp_path.glob("compile_report_*.json")
    rows = json.loads(written.read_text())["results"]
    assert [(r["model"], r["variant"]) for r in rows] == [
        (case.name, variant) for case in TINY for variant in ("hf", "brickwork")
    ]
    for row in rows:
        assert (row["graphs"], row["graph_breaks"]) == (1, 0)
        assert row["kernels"] > 0 and row["max_logit_diff"] < 1e-4
    assert "| llama-tiny | brickwork | 1 | 0 |" in capsys.readouterr().out
