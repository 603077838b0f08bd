"""``train.precision: fp8`` (brickwork/train/fp8.py): which linears torchao converts, runs on the CPU
with its emulated float8 matmuls against bf16-mixed and against one process, checkpoints that load
into a plain model, and the refusals."""

from __future__ import annotations

import copy
import importlib.util
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.distributed.tensor import DTensor
from torchao.float8.float8_linear import Float8Linear
from torchao.float8.fsdp_utils import WeightWithDynamicFloat8CastTensor

from brickwork.checkpoint.export import read_checkpoint_weights
from brickwork.data.corpus import read_corpus
from brickwork.errors import ConfigError
from brickwork.factory import build_model, from_pretrained, get_preset
from brickwork.parallel import full_state_dict, parallelize, save_checkpoint, spawn
from brickwork.train import TrainStep
from brickwork.train.fp8 import check_fp8_device, convert_to_fp8, fp8_candidates
from brickwork.train.run_config import resolve_run
from brickwork.train.trainer import train_new

CPU = torch.device("cpu")
# The tiny Llama: width 64, SwiGLU 128, 4 query heads over 2 kv heads, so k/v project 64 -> 32.
TINY = {
    "vocab_size": 64,
    "dim_model": 64,
    "max_seq_len": 64,
    "vocab_multiple": 1,
    "decoder.num_layers": 2,
    "decoder.block.attention.num_heads": 4,
    "decoder.block.attention.num_kv_heads": 2,
    "decoder.block.feedforward.hidden_dim": 128,
}


def tiny_spec() -> dict:
    spec = copy.deepcopy(get_preset("llama"))
    for key, value in TINY.items():
        *parents, last = key.split(".")
        node = spec
        for part in parents:
            node = node[part]
        node[last] = value
    return spec


RUN = [
    "train.steps=10",
    "train.batch_size=4",
    "train.seq_len=32",
    "train.eval_interval=10",
    "train.eval_batches=1",
    "train.checkpoint_interval=10",
    "train.sample_tokens=0",
    "train.device=cpu",
    "train.precision=fp8",
    "train.fp8_min_features=64",
]


def layer_linears(model: nn.Module) -> dict[str, nn.Linear]:
    return {f"layers.{n}": m for n, m in model.layers.named_modules() if isinstance(m, nn.Linear)}


def test_only_the_layers_large_linears_are_converted() -> None:
    model = build_model(tiny_spec())
    names = convert_to_fp8(model, "tensorwise", min_features=64, device=CPU)
    # Both sizes multiples of 16 and >= 64: q (64 -> 64), out, gate, up (64 -> 128), down (128 -> 64).
    expected = sorted(
        name
        for name, m in layer_linears(build_model(tiny_spec())).items()
        if min(m.in_features, m.out_features) >= 64
    )
    assert names == expected and len(names) == 10
    assert not any(name.endswith(("k_proj", "v_proj")) for name in names)
    for name, module in model.named_modules():
        if name in names:
            assert isinstance(module, Float8Linear) and module.config.emulate
        elif isinstance(module, nn.Linear):
            assert type(module) is nn.Linear, name  # k/v (64 -> 32) and the LM head stay bf16
    assert type(model.lm_head) is nn.Linear and type(model.token_embedding) is nn.Embedding


@pytest.mark.parametrize(("preset", "recipe"), [("gpt2", "tensorwise"), ("llama3-8b", "rowwise")])
def test_torchaos_size_rule_per_recipe(preset: str, recipe: str) -> None:
    with torch.device("meta"):
        model = build_model(preset)

    def wanted(m: nn.Linear) -> bool:
        k, n = m.in_features, m.out_features
        if k % 16 or n % 16:
            return False
        if recipe == "tensorwise":
            return not (k <= 4096 and n <= 1024)
        return n > 2048 and k > 1024 and not (n <= 4096 and k <= 2048)

    expected = [name for name, m in layer_linears(model).items() if wanted(m)]
    assert fp8_candidates(model, recipe, None) == expected
    chosen = {name.split(".")[-1] for name in expected}
    if preset == "gpt2":  # fc1 (768 -> 3072) converts, fc2 (3072 -> 768) and out_proj stay bf16
        assert chosen == {"qkv_proj", "up_proj"}
    else:  # Llama 3 8B's k/v projections (4096 -> 1024), slower in rowwise fp8, stay bf16
        assert chosen == {"q_proj", "out_proj", "gate_proj", "up_proj", "down_proj"}


def test_cuda_below_compute_capability_8_9_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100-SXM4-80GB")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    model = build_model(tiny_spec())
    with pytest.raises(ConfigError, match=r"^precision: .*8\.9.*A100-SXM4-80GB is 8\.0.*bf16-mixed"):
        convert_to_fp8(model, min_features=64, device=torch.device("cuda"))
    assert not any(isinstance(m, Float8Linear) for m in model.modules())  # refused before any change
    for capability in [(8, 9), (9, 0), (10, 0)]:
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None, c=capability: c)
        check_fp8_device(torch.device("cuda"))
    monkeypatch.setattr(torch.version, "hip", "7.0")  # an MI300's (9, 4) is no sm_94
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 4))
    with pytest.raises(ConfigError, match=r"^precision: .*on ROCm train with bf16-mixed"):
        check_fp8_device(torch.device("cuda"))


def test_refusals(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    for overrides, message in [
        (["train.fp8_recipe=rowwise"], "train.fp8_recipe: applies to precision fp8 only"),
        (["train.precision=bf16", "train.fp8_min_features=64"], "train.fp8_min_features: applies to"),
        (["train.precision=fp8", "train.fp8_recipe=colwise"], "train.fp8_recipe: unknown value 'colwise'"),
        (["train.precision=fp8", "train.fp8_min_features=0"], "train.fp8_min_features: must be a positive"),
    ]:
        with pytest.raises(ConfigError, match=message):
            resolve_run("gpt-tiny", overrides)
    # gpt-tiny's largest linear is 128 -> 512: no linear reaches torchao's tensorwise sizes.
    run_dir = tmp_path / "run"
    with pytest.raises(ConfigError, match=r"train.fp8_min_features: no linear .* tensorwise size rule"):
        train_new("gpt-tiny", ["train.precision=fp8", "train.device=cpu", f"train.out_dir={run_dir}"])
    assert not run_dir.exists()
    with pytest.raises(ValueError, match="has none: convert it before parallelize"):
        model = build_model(tiny_spec())
        TrainStep(model, torch.optim.SGD(model.parameters()), "causal_lm", precision="fp8")
    find_spec = importlib.util.find_spec
    absent = lambda name, *args: None if name == "torchao" else find_spec(name, *args)
    monkeypatch.setattr(importlib.util, "find_spec", absent)
    with pytest.raises(ConfigError, match=r"^train.precision: .* the torchao package.*brickwork\[fp8\]"):
        resolve_run("gpt-tiny", ["train.precision=fp8"])


def corpus_curve(precision: str) -> list[float]:
    """The train losses of 50 AdamW steps of the tiny Llama (byte vocabulary) on the embedded corpus."""
    tokens = torch.tensor(list(read_corpus()[0]))
    torch.manual_seed(0)
    model = build_model({**tiny_spec(), "vocab_size": 256})
    if precision == "fp8":
        convert_to_fp8(model, min_features=64, device=CPU)
    step = TrainStep(model, torch.optim.AdamW(model.parameters(), lr=3e-3), "causal_lm", precision=precision)
    g = torch.Generator().manual_seed(0)
    losses = []
    for _ in range(50):
        ids = tokens[torch.randint(0, len(tokens) - 32, (4, 1), generator=g) + torch.arange(32)]
        losses.append(step({"input_ids": ids, "labels": ids}))
    return losses


def test_fp8_loss_follows_bf16_over_50_steps() -> None:
    bf16, fp8 = corpus_curve("bf16-mixed"), corpus_curve("fp8")
    assert fp8[0] > 5.0 and sum(fp8[-10:]) / 10 < fp8[0] - 2.0  # it learned
    assert abs(sum(fp8[-10:]) - sum(bf16[-10:])) / 10 < 0.03
    assert max(abs(a - b) for a, b in zip(fp8, bf16, strict=True)) < 0.1
    assert fp8 != bf16  # not bf16 under another name: float8's rounding moves the curve


@pytest.fixture(scope="module")
def fp8_run(tmp_path_factory) -> Path:
    """``brickwork train`` of the tiny Llama in fp8 (tensorwise, emulated): 10 steps, one checkpoint."""
    run_dir = tmp_path_factory.mktemp("fp8") / "run"
    overrides = [f"{key}={value}" for key, value in TINY.items() if key != "vocab_size"]
    train_new("llama", [*overrides, *RUN, f"train.out_dir={run_dir}"])
    return run_dir


def test_fp8_checkpoint_loads_into_a_plain_model(fp8_run: Path) -> None:
    model = from_pretrained(fp8_run)
    assert not any(isinstance(m, Float8Linear) for m in model.modules())
    state = model.state_dict()
    assert state.keys() == build_model(model.spec).state_dict().keys()
    assert all(type(t) is torch.Tensor and t.dtype == torch.float32 for t in state.values())
    # The trained weights give nearly the same loss in bf16 and in emulated fp8, below the untrained.
    ids = torch.tensor([list(read_corpus()[0][:32])] * 2)
    fp8 = copy.deepcopy(model)
    convert_to_fp8(fp8, min_features=64, device=CPU)
    torch.manual_seed(0)
    untrained = build_model(model.spec)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        losses = [float(m.eval()(ids, labels=ids).loss) for m in (model, fp8, untrained)]
    assert abs(losses[0] - losses[1]) < 0.05 and losses[0] < losses[2] - 0.5


LAYOUTS = {
    # tensorwise under ZeRO-3: FSDP2 gathers the weights in float8
    "zero3": ({"data_parallel_size": 2, "zero_stage": 3, "mixed_precision": "bf16"}, "tensorwise"),
    "tp2-sp": ({"tensor_parallel_size": 2, "sequence_parallel": True}, "rowwise"),
}


def train_fp8(dist_dict: dict, recipe: str, checkpoint: Path | None = None) -> dict:
    """Two SGD steps of the tiny Llama in fp8, in one process (``dist_dict={}``) or laid out; the
    losses, the full weights before and after, and what the weights are; saved to ``checkpoint``."""
    torch.manual_seed(0)
    model = build_model(tiny_spec())
    start = {k: v.clone() for k, v in model.state_dict().items()}
    gather = dist_dict.get("zero_stage", 0) >= 2 and recipe == "tensorwise"
    convert_to_fp8(model, recipe, min_features=32, device=CPU, fsdp_float8_all_gather=gather)
    if dist_dict:
        model = parallelize(model, dist_dict)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    step = TrainStep(model, optimizer, "causal_lm", precision="fp8")
    dp = dist_dict.get("data_parallel_size", 1)
    rank = torch.distributed.get_rank() if dist_dict else 0
    losses = []
    for ids in torch.randint(0, 64, (2, 4, 16), generator=torch.Generator().manual_seed(0)):
        rows = ids.chunk(dp)[rank % dp]
        losses.append(step({"input_ids": rows, "labels": rows}))
    state = full_state_dict(model) if dist_dict else model.state_dict()
    if checkpoint is not None:
        save_checkpoint(checkpoint, model, optimizer, step=2)
    weight = model.layers[0].attention.q_proj.weight
    local = weight.to_local() if isinstance(weight, DTensor) else weight
    return {
        "losses": losses,
        "start": start,
        "state": {k: v.float() for k, v in state.items()},
        "plain": all(type(v) is torch.Tensor for v in state.values()),
        "float8_gather": isinstance(local, WeightWithDynamicFloat8CastTensor),
    }


def train_layouts(checkpoint: Path) -> dict:
    return {
        name: train_fp8(*layout, checkpoint if name == "zero3" else None) for name, layout in LAYOUTS.items()
    }


@pytest.mark.timeout(240)
def test_fp8_layouts_match_one_process(tmp_path: Path) -> None:
    results = spawn(train_layouts, 2, tmp_path / "zero3", timeout=200)
    # FSDP's float8-gathering weights (and the momentum made like them) are saved as plain tensors.
    saved, _ = read_checkpoint_weights(tmp_path / "zero3")
    assert saved.keys() == results[0]["zero3"]["state"].keys()
    for key, tensor in saved.items():
        assert torch.equal(tensor, results[0]["zero3"]["state"][key]), key
    for name, (_, recipe) in LAYOUTS.items():
        ref = train_fp8({}, recipe)
        for rank in results:
            got = rank[name]
            assert got["plain"] and got["float8_gather"] == (name == "zero3"), name
            torch.testing.assert_close(got["losses"], ref["losses"], rtol=2e-3, atol=0)
            assert got["state"].keys() == ref["state"].keys()
            for key, weights in ref["state"].items():
                # bf16 sums in another order move float8's rounding: measured at most 0.1 of the
                # update; a gradient scaled wrong by the layout would be off by half of it or more.
                update = (weights - ref["start"][key]).norm()
                assert (got["state"][key] - weights).norm() < 0.25 * update, f"{name} {key}"
