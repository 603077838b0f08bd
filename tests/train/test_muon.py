"""``train.optimizer: muon``: the update against a float64 Newton-Schulz, one process's step against
torch's Muon, which parameters Muon takes, its options' checks, a resume that continues exactly, a
matrix split over 2 ranks against the whole one, and tensor parallel, ZeRO-3 and ZeRO-1 against one
process."""

from __future__ import annotations

import copy
import functools
import math
from pathlib import Path

import pytest
import torch
from optimizer_cases import (
    MUON,
    decoder,
    float64_newton_schulz,
    newton_schulz,
    resumed_layout,
    run_layouts,
    sharded_steps,
    train,
)
from torch import nn
from torch.distributed.tensor import Shard
from torch.distributed.tensor.placement_types import _StridedShard
from train_cases import build, global_batches, spec

from brickwork.errors import ConfigError
from brickwork.factory import build_model
from brickwork.parallel import full_state_dict, load_checkpoint, save_checkpoint, spawn
from brickwork.train.config import TrainConfig
from brickwork.train.muon import MuonWithAdamW, muon_matrices
from brickwork.train.optim import build_optimizer
from brickwork.train.sharded_muon import ShardedMuon


@pytest.mark.parametrize(
    ("shape", "nesterov", "adjust"), [((24, 40), True, "match_rms_adamw"), ((48, 16), False, "original")]
)
def test_update_is_newton_schulz_of_the_momentum(shape, nesterov, adjust):
    lr, decay, mu, steps = 0.1, 0.05, 0.9, 5
    torch.manual_seed(0)
    matrix, bias = nn.Parameter(torch.randn(shape)), nn.Parameter(torch.randn(shape[0]))
    twin = nn.Parameter(bias.detach().clone())
    groups = [{"params": [matrix], "muon": True}, {"params": [bias], "weight_decay": 0.0}]
    optimizer = MuonWithAdamW(
        groups, lr=lr, weight_decay=decay, momentum=mu, nesterov=nesterov, ns_steps=steps, adjust_lr_fn=adjust
    )
    adamw = torch.optim.AdamW([twin], lr=lr, weight_decay=0.0, betas=(0.9, 0.95))
    # Muon's momentum is an average, B <- mu B + (1 - mu) g; Nesterov steps along (1 - mu) g + mu B.
    # match_rms_adamw scales the step by 0.2 sqrt(max(A, B)), the original by sqrt(max(1, A / B)).
    scale = (
        0.2 * math.sqrt(max(shape)) if adjust == "match_rms_adamw" else math.sqrt(max(1, shape[0] / shape[1]))
    )
    momentum = torch.zeros(shape, dtype=torch.float64)
    for _ in range(3):
        grad = torch.randn(shape)
        before = matrix.detach().double()
        matrix.grad, bias.grad = grad.clone(), torch.randn(shape[0])
        twin.grad = bias.grad.clone()
        optimizer.step()
        adamw.step()
        momentum = mu * momentum + (1 - mu) * grad.double()
        direction = (1 - mu) * grad.double() + mu * momentum if nesterov else momentum
        want = newton_schulz(direction, steps)
        got = (before * (1 - lr * decay) - matrix.detach().double()) / (lr * scale)
        # torch iterates in bfloat16: a few percent of the largest entry; a wrong momentum or Nesterov
        # rule differs by 30-50% of it from the second step on.
        assert (got - want).abs().max() <= 0.06 * want.abs().max()
        assert torch.equal(bias, twin)  # the other parameters are torch's AdamW's exactly


def test_state_dict_round_trip_restores_both_parts():
    def make() -> tuple[list[nn.Parameter], MuonWithAdamW]:
        torch.manual_seed(0)
        params = [nn.Parameter(torch.randn(8, 12)), nn.Parameter(torch.randn(8))]
        return params, MuonWithAdamW([{"params": params[:1], "muon": True}, {"params": params[1:]}], lr=0.1)

    def step(params: list[nn.Parameter], optimizer: MuonWithAdamW, seed: int) -> None:
        torch.manual_seed(seed)
        for p in params:
            p.grad = torch.randn_like(p)
        optimizer.step()

    (a, first), (b, second) = make(), make()
    for seed in (1, 2):
        step(a, first, seed)
    with torch.no_grad():
        for p, q in zip(a, b):
            q.copy_(p)
    second.load_state_dict(copy.deepcopy(first.state_dict()))  # torch shares the tensors otherwise
    assert (
        second.parts[True].state is second.state
        and second.parts[False].param_groups[0] is second.param_groups[1]
    )
    step(a, first, 3)
    step(b, second, 3)
    assert all(torch.equal(p, q) for p, q in zip(a, b))


def test_muon_takes_the_blocks_linear_weights_and_adamw_the_rest():
    for tied in (True, False):
        torch.manual_seed(0)
        model = build_model({**spec("decoder"), "tie_embeddings": tied})
        optimizer = build_optimizer(model, TrainConfig(optimizer="muon", weight_decay=0.25))
        names = {id(p): n for n, p in model.named_parameters()}
        muon, decayed, plain = ([names[id(p)] for p in g["params"]] for g in optimizer.param_groups)
        projections = (
            "attention.qkv_proj",
            "attention.out_proj",
            "feedforward.up_proj",
            "feedforward.down_proj",
        )
        assert sorted(muon) == sorted(f"layers.{i}.{p}.weight" for i in range(2) for p in projections)
        head = [] if tied else ["lm_head.weight"]  # tied: the embedding's Parameter, listed once
        assert sorted(decayed) == sorted(["token_embedding.weight", "position_embedding.weight", *head])
        assert all(model.get_parameter(n).ndim == 1 for n in plain)
        assert len(muon) + len(decayed) + len(plain) == len(names)
        assert [g["weight_decay"] for g in optimizer.param_groups] == [0.25, 0.25, 0.0]
        assert [g["muon"] for g in optimizer.param_groups] == [True, False, False]
        assert isinstance(optimizer.parts[True], torch.optim.Muon)
        assert isinstance(optimizer.parts[False], torch.optim.AdamW)
    assert muon_matrices(nn.Sequential(nn.Embedding(4, 4), nn.Linear(4, 4))) == []
    with pytest.raises(ConfigError, match=r"train.optimizer: muon steps the matrices of transformer blocks"):
        build_optimizer(nn.Sequential(nn.Linear(4, 4)), TrainConfig(optimizer="muon"))


def test_muon_options_and_their_defaults():
    cfg = TrainConfig(optimizer="muon", muon_momentum=0.9, muon_nesterov=False, muon_ns_steps=3)
    group = build_optimizer(build("decoder"), cfg).param_groups[0]
    assert (group["momentum"], group["nesterov"], group["ns_steps"]) == (0.9, False, 3)
    assert group["adjust_lr_fn"] == "match_rms_adamw"
    defaults = build_optimizer(build("decoder"), TrainConfig(optimizer="muon")).param_groups[0]
    assert (defaults["momentum"], defaults["nesterov"], defaults["ns_steps"]) == (0.95, True, 5)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"muon_momentum": 0.9}, "muon_momentum: applies to optimizer muon only, and optimizer is 'adamw'"),
        ({"optimizer": "sgd", "muon_ns_steps": 3}, "muon_ns_steps: applies to optimizer muon only"),
        ({"optimizer": "muon", "muon_momentum": 1.0}, r"muon_momentum: must be a number in \[0, 1\)"),
        ({"optimizer": "muon", "muon_nesterov": "yes"}, "muon_nesterov: must be true or false"),
        ({"optimizer": "muon", "muon_ns_steps": 0}, "muon_ns_steps: must be a positive integer"),
        ({"optimizer": "muon", "muon_ns_steps": 100}, r"muon_ns_steps: must be a number in \[1, 100\)"),
        ({"optimizer": "muon", "muon_adjust_lr": "adamw"}, "muon_adjust_lr: unknown value 'adamw'"),
    ],
)
def test_bad_muon_options_name_the_key(options, message):
    with pytest.raises(ConfigError, match=message):
        TrainConfig(**options)


def test_resume_continues_exactly(tmp_path: Path):
    cfg = TrainConfig(
        optimizer="muon", schedule="wsd", steps=4, warmup_steps=1, decay_fraction=0.5, grad_clip=0.0
    )
    g = torch.Generator().manual_seed(7)
    batches = [
        {"input_ids": (ids := torch.randint(0, 48, (2, 8), generator=g)), "labels": ids} for _ in range(4)
    ]
    whole = build("decoder")
    train(whole, build_optimizer(whole, cfg), cfg, batches)
    first = build("decoder")
    optimizer = build_optimizer(first, cfg)
    train(first, optimizer, cfg, batches[:2])
    save_checkpoint(tmp_path, first, optimizer, 2)
    resumed = build("decoder", seed=1)  # other weights: the checkpoint must bring every value
    optimizer = build_optimizer(resumed, cfg)
    load_checkpoint(tmp_path, resumed, optimizer)
    train(resumed, optimizer, cfg, batches[2:], first_step=2)
    for (name, want), got in zip(whole.state_dict().items(), resumed.state_dict().values(), strict=True):
        assert torch.equal(got, want), name


def test_one_process_step_is_torchs_muon():
    for nesterov, adjust in ((True, "match_rms_adamw"), (False, None)):
        torch.manual_seed(0)
        ours, theirs = nn.Parameter(torch.randn(24, 40)), nn.Parameter(torch.randn(24, 40))
        with torch.no_grad():
            theirs.copy_(ours)
        options = {"lr": 0.1, "weight_decay": 0.05, "nesterov": nesterov, "adjust_lr_fn": adjust}
        optimizers = [ShardedMuon([ours], **options), torch.optim.Muon([theirs], **options)]
        for _ in range(3):
            ours.grad = torch.randn(24, 40)
            theirs.grad = ours.grad.clone()
            for optimizer in optimizers:
                optimizer.step()
            assert torch.equal(ours, theirs)


# A matrix split over 2 ranks on each dim, unevenly on rows (13 + 12) as FSDP2 may split it, and on
# strided rows: FSDP2's placement on the dp dim of a dp x tp mesh for a matrix tensor parallel splits
# on rows too.
SHARDED = {
    "rows": ((25, 40), Shard(0)),
    "columns": ((40, 24), Shard(1)),
    "strided rows": ((24, 40), _StridedShard(0, split_factor=2)),
}
# ZeRO-1 steps whole matrices, each on one rank; the others are split (tensor parallel, FSDP2).
LAYOUTS = {
    "tp2": {"tensor_parallel_size": 2},
    "zero3": {"data_parallel_size": 2, "zero_stage": 3},
    "zero1": {"data_parallel_size": 2, "zero_stage": 1},
}


def muon_world(folder: str) -> dict:
    return {
        "sharded": {name: sharded_steps(*case) for name, case in SHARDED.items()},
        "layouts": run_layouts(LAYOUTS),
        "resumed": {name: resumed_layout(LAYOUTS[name], f"{folder}/{name}") for name in ("tp2", "zero3")},
    }


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    return spawn(muon_world, 2, str(tmp_path_factory.mktemp("muon")), timeout=180)


@pytest.mark.distributed
@pytest.mark.timeout(240)
@pytest.mark.parametrize("name", SHARDED)
def test_sharded_matrix_steps_as_the_whole_one(world, name):
    """torch's bfloat16 Newton-Schulz included: every rank orthogonalises the same gathered matrix,
    so its shard moves exactly as the whole matrix's part does in one process."""
    shape, _ = SHARDED[name]
    torch.manual_seed(0)
    whole = nn.Parameter(torch.randn(shape))
    optimizer = ShardedMuon([whole], lr=0.1, adjust_lr_fn="match_rms_adamw")
    for grad in [torch.randn(shape) for _ in range(3)]:
        whole.grad = grad
        optimizer.step()
    for rank in world:
        got = rank["sharded"][name]
        assert torch.equal(got["dtensor"], whole.detach()) and torch.equal(got["local"], whole.detach())
        # One all-gather per matrix and step, whichever form the shard has.
        assert got["collectives"] == [{"c10d_functional.all_gather_into_tensor": 1}] * 6


@functools.cache
def one_process() -> tuple[list[float], dict[str, torch.Tensor]]:
    model = decoder()
    with float64_newton_schulz():
        losses = train(model, build_optimizer(model, MUON), MUON, global_batches("decoder"))
    return losses, full_state_dict(model)


@pytest.mark.distributed
@pytest.mark.timeout(240)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_layouts_match_one_process(world, layout):
    start, (losses, trained) = full_state_dict(decoder()), one_process()
    ranks = [rank["layouts"][layout] for rank in world]
    assert ranks[0]["losses"] == ranks[1]["losses"]
    assert ranks[0]["losses"] == pytest.approx(losses, rel=1e-5)
    for name, want in trained.items():
        assert not torch.equal(want, start[name]), f"{name} did not train"
        torch.testing.assert_close(ranks[0]["state"][name], want, rtol=1e-5, atol=1e-5 * want.abs().max())


@pytest.mark.distributed
@pytest.mark.timeout(240)
@pytest.mark.parametrize("layout", ["tp2", "zero3"])
def test_sharded_resume_continues_exactly(world, layout):
    """The momentum buffers, DTensors here, come back from the checkpoint with the weights."""
    for rank in world:
        for name, want in rank["layouts"][layout]["state"].items():
            assert torch.equal(rank["resumed"][layout][name], want), name
