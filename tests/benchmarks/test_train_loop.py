"""The training-loop benchmark: its plain-torch model is brickwork's gpt-tiny, and every mode reports."""

from __future__ import annotations

import json

import pytest
import torch

from brickwork.benchmarks import nanogpt_reference as ref
from brickwork.benchmarks import train_loop
from brickwork.components.attention.qkv_layout import QKVLayout
from brickwork.factory import build_model, get_preset


def plain_state(brickwork_state: dict[str, torch.Tensor], layers: int, layout: QKVLayout) -> dict:
    """brickwork's gpt-tiny weights under nanoGPT's names (and its q | k | v order of c_attn's rows)."""
    out = {"wte.weight": brickwork_state["token_embedding.weight"], "wpe.weight": None}
    out["lm_head.weight"] = brickwork_state["lm_head.weight"]
    for name in ("weight", "bias"):
        out[f"ln_f.{name}"] = brickwork_state[f"final_norm.{name}"]
        for i in range(layers):
            b, p = f"layers.{i}.", f"h.{i}."
            out[p + f"ln_1.{name}"] = brickwork_state[b + f"attention_norm.{name}"]
            out[p + f"ln_2.{name}"] = brickwork_state[b + f"feedforward_norm.{name}"]
            out[p + f"attn.c_attn.{name}"] = torch.cat(
                layout.split(brickwork_state[b + f"attention.qkv_proj.{name}"])
            )
            out[p + f"attn.c_proj.{name}"] = brickwork_state[b + f"attention.out_proj.{name}"]
            out[p + f"mlp.c_fc.{name}"] = brickwork_state[b + f"feedforward.up_proj.{name}"]
            out[p + f"mlp.c_proj.{name}"] = brickwork_state[b + f"feedforward.down_proj.{name}"]
    out["wpe.weight"] = brickwork_state["position_embedding.weight"]
    return out


def test_the_plain_model_is_the_gpt_tiny_preset() -> None:
    r = ref.Recipe()
    spec = {**get_preset("gpt-tiny"), "max_seq_len": r.block_size}
    torch.manual_seed(0)
    brickwork_model = build_model(spec).eval()
    plain, _ = ref.build(r, vocab_size=256)
    assert sum(p.numel() for p in plain.parameters()) == sum(p.numel() for p in brickwork_model.parameters())
    layout = QKVLayout(r.n_head, r.n_head, r.n_embd // r.n_head)
    plain.load_state_dict(plain_state(brickwork_model.state_dict(), r.n_layer, layout))
    ids = torch.randint(0, 256, (3, r.block_size))
    logits, loss = plain.eval()(ids, ids)
    torch.testing.assert_close(logits, brickwork_model(ids), rtol=1e-5, atol=1e-5)
    want = torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids.flatten())
    assert loss.item() == pytest.approx(want.item())


def test_held_out_windows_are_the_last_tenth() -> None:
    tokens = torch.arange(10_000)
    train, val = train_loop.held_out(tokens, ref.Recipe())
    assert train.numel() == 9_000 and len(val) == train_loop.EVAL_BATCHES
    x, y = val[0]
    assert x.shape == (12, 64) and int(x[0, 0]) == 9_000 and torch.equal(y, x + 1)


@pytest.mark.slow
def test_every_mode_reports_side_by_side(monkeypatch, tmp_path) -> None:
    # In this process instead of fresh ones: the same training calls, only faster to start.
    monkeypatch.setattr(
        train_loop, "measure", lambda name, iters, size, threads: train_loop.child(name, iters, size)
    )
    args = ["--mode", "both", "--iters", "1", "3", "--repeats", "2", "--quality-iters", "3", "--size", "6000"]
    assert train_loop.main([*args, "--note", "a test", "--out", str(tmp_path)]) == 0
    (written,) = tmp_path.glob("train_loop_*.json")
    result = json.loads(written.read_text())
    speed, quality = result["speed"], result["quality"]
    assert speed["iters"] == [1, 3] and [len(speed["runs"][n]) for n in ("brickwork", "plain")] == [2, 2]
    for name in ("brickwork", "plain"):
        assert speed["ratio"]["cpu"] == pytest.approx(speed["brickwork"]["cpu"] / speed["plain"]["cpu"])
        # Three iterations barely move a byte-level model off the uniform loss, ln 256 = 5.55.
        assert 4.0 < quality[name]["val_loss"] < 6.0 and quality[name]["cpu_ms_per_iter"] > 0
    assert result["cores"] >= 1 and speed["threads"] == torch.get_num_threads()
    table = written.with_suffix(".md").read_text()
    assert "| brickwork / plain |" in table and "| plain | " in table and "a test" in table
