"""Models with vocabularies tensor parallel does not divide, and what spawned ranks run on them:
HF GPT-2 with its real vocabulary (50257) and a brickwork decoder with an odd one (also padded by the
model itself, vocab_multiple), trained through the TrainStep (loss-parallel cross entropy),
checkpointed, and reloaded under other layouts."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor

from brickwork.factory import build_model, get_preset
from brickwork.parallel import full_state_dict, load_checkpoint, parallel_state, parallelize, save_checkpoint
from brickwork.train import TrainStep

GPT2_VOCAB, ODD_VOCAB = 50257, 101
DIM, SEQ, BATCH, STEPS = 16, 8, 4, 3


def build(kind: str, seed: int = 0) -> nn.Module:
    """``gpt2-hf``: HF GPT2LMHeadModel, vocab 50257, tied head. ``odd``: brickwork's gpt-tiny decoder,
    vocab 101, tied head, 1 layer (``odd2``: 2 layers, for a pipeline; ``padded``: ``odd`` padded to
    128 rows by its own ``vocab_multiple: 64``, whose seed gives it ``odd``'s weights)."""
    torch.manual_seed(seed)
    if kind == "gpt2-hf":
        from transformers import GPT2Config, GPT2LMHeadModel

        config = GPT2Config(
            vocab_size=GPT2_VOCAB, n_positions=2 * SEQ, n_embd=DIM, n_layer=1, n_head=4,
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        )  # fmt: skip
        return GPT2LMHeadModel(config)
    spec = copy.deepcopy(get_preset("gpt-tiny"))
    spec.update(vocab_size=ODD_VOCAB, dim_model=DIM, max_seq_len=2 * SEQ)
    spec["vocab_multiple"] = 64 if kind == "padded" else 1
    spec["decoder"]["num_layers"] = 2 if kind == "odd2" else 1
    spec["decoder"]["block"]["attention"]["num_heads"] = 4
    spec["decoder"]["block"]["feedforward"]["hidden_dim"] = 32
    return build_model(spec)


def vocab_of(kind: str) -> int:
    """The vocabulary of :func:`build`'s ``kind``."""
    return GPT2_VOCAB if kind == "gpt2-hf" else ODD_VOCAB


def batches(kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    """[STEPS + 1, BATCH, SEQ] ids and their causal-LM labels (HF's: the ids); the ids, and the
    targets after the shift, reach the vocabulary's last rows."""
    g = torch.Generator().manual_seed(5)
    vocab = vocab_of(kind)
    ids = torch.randint(0, vocab, (STEPS + 1, BATCH, SEQ), generator=g)
    ids[:, 0, :2] = vocab - 1
    return ids, ids.clone()


def logits(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        out = model(ids)
    out = out if isinstance(out, torch.Tensor) else out.logits
    return (out.full_tensor() if isinstance(out, DTensor) else out).detach().cpu()


def reference(kind: str) -> dict[str, Any]:
    """One process, plain torch: STEPS SGD steps of mean next-token cross entropy."""
    model = build(kind)
    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    ids, labels = batches(kind)
    first = logits(model, ids[0])
    losses = []
    for step in range(STEPS):
        opt.zero_grad()
        out = model(ids[step])
        out = out if isinstance(out, torch.Tensor) else out.logits
        loss = F.cross_entropy(out[:, :-1].flatten(0, 1), labels[step][:, 1:].flatten())  # HF's shift
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return {"losses": losses, "logits": first, "state": full_state_dict(model)}


def _batch(model: nn.Module, ids: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor] | None:
    """This data-parallel rank's rows; None on later pipeline stages (they receive activations)."""
    mesh = parallel_state(model).mesh
    if mesh["pp"].get_local_rank() > 0:
        return None
    dp = mesh["dp"]
    rows = [t.chunk(dp.size())[dp.get_local_rank()] for t in (ids, labels)]
    return {"input_ids": rows[0], "labels": rows[1]}


def train(kind: str, layout: dict[str, Any]) -> dict[str, Any]:
    """On every rank: parallelize, STEPS TrainSteps (loss-parallel cross entropy under TP)."""
    model = parallelize(build(kind), layout)
    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    step = TrainStep(model, opt, "causal_lm")
    ids, labels = batches(kind)
    pipeline = parallel_state(model).is_pipeline
    first = None if pipeline else logits(model, ids[0])
    losses = [step(_batch(model, ids[s], labels[s])) for s in range(STEPS)]
    rows = None
    if not pipeline:
        embedding = model.transformer.wte if kind == "gpt2-hf" else model.token_embedding
        rows = embedding.weight.to_local().shape[0] if isinstance(embedding.weight, DTensor) else None
    return {"losses": losses, "logits": first, "state": full_state_dict(model), "embedding_rows": rows}


def save_run(root: str, layout: dict[str, Any], kind: str = "odd") -> dict[str, Any]:
    """The odd-vocabulary decoder (or ``kind``): one AdamW step under ``layout``, saved to root; then
    its logits, and the loss of one more step (which reads the optimizer state)."""
    model = parallelize(build(kind), layout)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    step = TrainStep(model, opt, "causal_lm")
    ids, labels = batches("odd")
    step({"input_ids": ids[0], "labels": labels[0]})
    save_checkpoint(Path(root), model, opt, 1)
    return {"logits": logits(model, ids[1]), "next_loss": step({"input_ids": ids[1], "labels": labels[1]})}


def load_run(root: str, layout: dict[str, Any] | None, kind: str = "odd") -> dict[str, Any]:
    """Load the checkpoint of :func:`save_run` into ``kind`` under ``layout`` (None: a plain single
    process)."""
    model = build(kind, seed=1)  # other weights: everything must come from the checkpoint
    if layout is not None:
        model = parallelize(model, layout)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    load_checkpoint(Path(root), model, opt)
    step = TrainStep(model, opt, "causal_lm")
    ids, labels = batches("odd")
    return {"logits": logits(model, ids[1]), "next_loss": step({"input_ids": ids[1], "labels": labels[1]})}


def base_hidden(model: nn.Module) -> torch.Tensor:
    """HF GPT2Model (an embedding and no head): the last hidden states of the first batch."""
    ids, _ = batches("gpt2-hf")
    with torch.no_grad():
        return model(ids[0]).last_hidden_state.detach().cpu()


def generated(model: nn.Module) -> torch.Tensor:
    """Greedy decoding (KV cache) of 5 tokens after the first 3 of the first batch, in eval mode."""
    ids, _ = batches("odd")
    return model.eval().generate(ids[0][:, :3], 5)


def meta_built(layout: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The odd decoder built for real on rank 0 and on the meta device elsewhere, parallelized: its
    full weights (rank 0's, broadcast into the padded shards)."""
    if dist.get_rank() == 0:
        return full_state_dict(parallelize(build("odd"), layout))
    with torch.device("meta"):
        model = build("odd")
    return full_state_dict(parallelize(model, layout))


def tp2_rank(root: str) -> dict[str, Any]:
    """Both models at tp=2, greedy decoding, and the odd decoder's tp=2 checkpoint saved to root;
    the self-padded decoder at tp=2 and under ZeRO-3 (dp=2), saved under ZeRO-3 to root/padded and
    reloaded there (one spawn for all: process start-up dominates)."""
    tp2, zero3 = {"tensor_parallel_size": 2}, {"data_parallel_size": 2, "zero_stage": 3}
    padded_root = str(Path(root) / "padded")
    return {
        "gpt2-hf": train("gpt2-hf", tp2),
        "odd": train("odd", tp2),
        "odd-sp": train("odd", {**tp2, "sequence_parallel": True, "vocab_multiple": 8}),
        "padded": train("padded", tp2),
        "padded-zero3": train("padded", zero3),
        "padded-generated": generated(parallelize(build("padded"), tp2)),
        "padded-save": save_run(padded_root, zero3, "padded"),
        "padded-load": load_run(padded_root, zero3, "padded"),
        "base": base_hidden(parallelize(build("gpt2-hf").transformer, tp2)),
        "generated": generated(parallelize(build("odd"), tp2)),
        "meta": meta_built(tp2),
        "save": save_run(root, tp2),
        "out_of_range": out_of_range(parallelize(build("gpt2-hf"), tp2)),
    }


def out_of_range(model: nn.Module) -> str:
    """What a vocabulary-parallel, padded model says of an id past its vocabulary (which would find
    only a zero padding row, or no row at all, without the range check)."""
    try:
        model(torch.tensor([[1, vocab_of("gpt2-hf")]]))
    except IndexError as error:
        return str(error)
    return ""


def four_rank(root: str, scratch: str) -> dict[str, Any]:
    """GPT-2 at dp2×tp2 with ZeRO-3, the 2-layer odd decoder at pp2×tp2 (its tied embedding and head
    on different stages), the tp=2 checkpoint in root reloaded at tp=4 and under ZeRO-3 over TP, and
    checkpoints of a padded vocabulary under ZeRO-3 over TP (scratch/zero3, its real rows gathered)
    and under DDP over TP (scratch/ddp); every data-parallel rank takes the whole batch, so each run
    is the tp=2 run of :func:`save_run`."""
    zero3 = {"data_parallel_size": 2, "tensor_parallel_size": 2, "zero_stage": 3}
    return {
        "zero3": train("gpt2-hf", zero3),
        "pp2tp2": train("odd2", {"pipeline_parallel_size": 2, "tensor_parallel_size": 2}),
        "tp4": load_run(root, {"tensor_parallel_size": 4}),
        "zero3-load": load_run(root, zero3),
        "zero3-save": save_run(str(Path(scratch) / "zero3"), zero3),
        "ddp": save_run(str(Path(scratch) / "ddp"), {"data_parallel_size": 2, "tensor_parallel_size": 2}),
    }
