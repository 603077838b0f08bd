"""Spawned workers for the planner's tests: train one step of a small model under a layout and
measure what the cost model predicts (state bytes, saved activations), or run it under a memory cap."""

from __future__ import annotations

import copy
import resource
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor
from torch.optim.optimizer import register_optimizer_step_pre_hook
from torch.utils._python_dispatch import TorchDispatchMode

from brickwork.factory import build_model, get_preset
from brickwork.parallel import parallel_state, parallelize
from brickwork.train import TrainStep

BATCH, SEQ = 4, 32
TARGET = SEQ // 4  # an encoder-decoder's decoder tokens a row, fewer than its source's, as T5's


def gpt_spec(layers: int = 2, vocab: int = 128) -> dict[str, Any]:
    spec = copy.deepcopy(get_preset("gpt-tiny"))
    spec.update(vocab_size=vocab, dim_model=64, max_seq_len=SEQ)
    spec["decoder"]["num_layers"] = layers
    spec["decoder"]["block"]["feedforward"]["hidden_dim"] = 256
    return spec


def llama_spec(layers: int = 2, vocab: int = 131) -> dict[str, Any]:
    spec = copy.deepcopy(get_preset("llama"))
    spec.update(vocab_size=vocab, dim_model=64, max_seq_len=SEQ)
    spec["decoder"]["num_layers"] = layers
    block = spec["decoder"]["block"]
    block["attention"].update(num_heads=4, num_kv_heads=2)
    block["feedforward"]["hidden_dim"] = 176
    return spec


def bert_spec(layers: int = 2, vocab: int = 128) -> dict[str, Any]:
    """A BERT-like encoder with its masked-LM head, post-norm, dropout 0.1 (attention dropout too)."""
    spec = copy.deepcopy(get_preset("bert-base"))
    spec.update(vocab_size=vocab, dim_model=64, max_seq_len=SEQ)
    spec["encoder"]["num_layers"] = layers
    spec["encoder"]["block"]["attention"]["num_heads"] = 4
    spec["encoder"]["block"]["feedforward"]["hidden_dim"] = 256
    return spec


def t5_spec(layers: int = 2, vocab: int = 128) -> dict[str, Any]:
    """A T5-like encoder-decoder: rotary, RMSNorm, ReLU MLPs, tied head, feedforward dropout 0.1."""
    spec = copy.deepcopy(get_preset("t5-small"))
    spec.update(vocab_size=vocab, dim_model=64, max_seq_len=SEQ)
    for stack in ("encoder", "decoder"):
        spec[stack]["num_layers"] = layers
        block = spec[stack]["block"]
        for attention in ("attention", "cross_attention"):
            if attention in block:
                block[attention]["num_heads"] = 4
        block["feedforward"]["hidden_dim"] = 256
    return spec


TASKS = {"decoder_lm": "causal_lm", "encoder": "masked_lm", "encoder_decoder": "seq2seq"}


def batch_for(spec: dict[str, Any], ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """One batch of ``spec``'s task from the token ids ``ids`` [B, T]: labels are the ids (every
    position scored; a masked LM's one in four), a seq2seq target is the first ``TARGET`` ids
    reversed."""
    if spec["model"] == "encoder":
        labels = ids.clone()
        labels[:, 1::4] = -100
        return {"input_ids": ids, "labels": labels}
    if spec["model"] == "encoder_decoder":
        target = ids[:, :TARGET].flip(-1)
        return {"input_ids": ids, "decoder_input_ids": target, "labels": target}
    return {"input_ids": ids, "labels": ids}


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def _bytes(tensors: Any) -> int:
    return sum(_local(t).numel() * t.element_size() for t in tensors)


class PeakSavedActivations:
    """The most bytes of distinct storages autograd holds for backward at once (over one micro-batch,
    all it saved; over a pipeline's overlapping ones, their peak), parameters and buffers left out."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.live: dict[int, list[int]] = {}  # storage -> [saved tensors holding it, its bytes]
        self.held = self.peak = 0

    def pack(self, t: torch.Tensor) -> Any:
        pointer = _pointer(t)
        weights = {_pointer(w) for w in [*self.model.parameters(), *self.model.buffers()]}
        if pointer is None or pointer in weights:
            return t
        entry = self.live.setdefault(pointer, [0, _local(t).untyped_storage().nbytes()])
        if entry[0] == 0:
            self.held += entry[1]
            self.peak = max(self.peak, self.held)
        entry[0] += 1
        return _Held(self, pointer, t)

    @staticmethod
    def unpack(packed: Any) -> torch.Tensor:
        return packed.tensor if isinstance(packed, _Held) else packed

    def release(self, pointer: int) -> None:
        entry = self.live[pointer]
        entry[0] -= 1
        if entry[0] == 0:
            self.held -= entry[1]
            del self.live[pointer]


class _Held:
    """A saved tensor; its storage counts as held until autograd frees the last one of it."""

    def __init__(self, probe: PeakSavedActivations, pointer: int, tensor: torch.Tensor) -> None:
        self.probe, self.pointer, self.tensor = probe, pointer, tensor

    def __del__(self) -> None:
        self.probe.release(self.pointer)


def _pointer(t: torch.Tensor) -> int | None:
    try:
        return _local(t).untyped_storage().data_ptr()
    except RuntimeError:  # an FSDP parameter between its reshard and its next gather: no storage
        return None


def measure_step(spec: dict[str, Any], dist: dict[str, Any]) -> dict[str, int]:
    """On each rank: one AdamW step of ``spec``'s task under ``dist``; the state bytes after it, and
    the activation bytes the forward saved (the whole step's micro-batch, layers and loss)."""
    torch.manual_seed(0)
    model = parallelize(build_model(spec), dist)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    step = TrainStep(model, optimizer, TASKS[spec["model"]])
    dp = parallel_state(model).mesh["dp"]
    ids = torch.randint(0, spec["vocab_size"], (BATCH, SEQ), generator=torch.Generator().manual_seed(1))
    rows = BATCH // dp.size()
    ids = ids[dp.get_local_rank() * rows :][:rows]
    saved = PeakSavedActivations(model)
    gradients = []  # the step zeroes them after: read them as the optimizer steps
    stepped = {}  # ZeRO-1 steps an inner optimizer of its own: read the state of every one that steps

    def read_gradients(opt: torch.optim.Optimizer, *_: Any) -> None:
        gradients.append(_bytes(p.grad for p in model.parameters() if p.grad is not None))
        stepped[id(opt)] = opt

    hook = register_optimizer_step_pre_hook(read_gradients)
    with torch.autograd.graph.saved_tensors_hooks(saved.pack, saved.unpack):
        step(batch_for(spec, ids))
    hook.remove()
    inner = [o for o in stepped.values() if not hasattr(o, "optim")] or [optimizer]
    states = [v for o in inner for s in o.state.values() for v in s.values() if torch.is_tensor(v)]
    return {
        "parameters": _bytes(model.parameters()),
        "gradients": max(gradients),
        "optimizer": _bytes(states),
        "activations": saved.peak,
        "stage": parallel_state(model).mesh["pp"].get_local_rank(),
    }


def measure_steps(cases: list[tuple[dict[str, Any], dict[str, Any]]]) -> list[dict[str, int]]:
    """:func:`measure_step` for each (spec, dist) in turn, in this one process."""
    return [measure_step(spec, dist) for spec, dist in cases]


def step_under_cap(
    spec: dict[str, Any], dist: dict[str, Any], rows: int, accum: int, device_bytes: int
) -> str:
    """Train one step of ``rows`` rows in ``accum`` micro-batches with this process's address space
    capped so that ``device_bytes`` is what the model, its optimizer and the step may take: "ok", or
    "out of memory" when an allocation fails."""
    torch.manual_seed(0)
    model = parallelize(build_model(spec), dist)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, spec["vocab_size"], (rows, spec["max_seq_len"]), generator=torch.Generator())
    # Warm-up on one row: the lazy allocations of a step, and the optimizer state, exist from here on.
    TrainStep(model, optimizer, "causal_lm")({"input_ids": ids[:1], "labels": ids[:1]})
    held = _bytes(model.parameters()) + _bytes(
        v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)
    )
    step = TrainStep(model, optimizer, "causal_lm", grad_accum_steps=accum)
    limits = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (_mapped_bytes() + device_bytes - held, resource.RLIM_INFINITY))
    try:
        step({"input_ids": ids, "labels": ids})
    except (MemoryError, RuntimeError) as err:
        if "memory" not in str(err).lower() and not isinstance(err, MemoryError):
            raise
        return "out of memory"
    finally:
        resource.setrlimit(resource.RLIMIT_AS, limits)  # sending the result back needs memory too
    return "ok"


def _mapped_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmSize in /proc/self/status")


def fsdp_pipeline_states(spec: dict[str, Any], dist: dict[str, Any], batch: int) -> list[dict[str, Any]]:
    """On each rank: two steps of ``batch`` rows of ``spec`` under ``dist`` (a pipeline under ZeRO-2/3);
    before each forward of each stage in the second (the first also infers the shapes the stages
    exchange), ahead of FSDP's own hook: whether the stage's parameters are whole (not the DTensor
    shards FSDP registers between gathers) and whether they hold whole gradients."""
    torch.manual_seed(0)
    model = parallelize(build_model(spec), dist)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    step = TrainStep(model, optimizer, "causal_lm")
    records: list[dict[str, Any]] = []
    for stage in model.stages:

        def look(module: nn.Module, _: Any, index: int = stage.stage_index) -> None:
            params = list(module.parameters())
            whole = not any(isinstance(p, DTensor) for p in params)
            grads = whole and all(p.grad is not None and p.grad.shape == p.shape for p in params)
            done = sum(r["stage"] == index for r in records)
            records.append({"stage": index, "microbatch": done, "whole": whole, "gradients": grads})

        stage.register_forward_pre_hook(look, prepend=True)
    ids = torch.randint(0, spec["vocab_size"], (batch, SEQ), generator=torch.Generator().manual_seed(1))
    rows = batch // parallel_state(model).mesh["dp"].size()
    step({"input_ids": ids[:rows], "labels": ids[:rows]})
    records.clear()
    step({"input_ids": ids[:rows], "labels": ids[:rows]})
    return records


def moe_spec(layers: int = 2) -> dict[str, Any]:
    """``gpt_spec`` with mixtures of 4 experts, 2 a token, for feedforwards."""
    spec = gpt_spec(layers)
    spec["decoder"]["block"]["feedforward"] = {"name": "moe", "num_experts": 4, "top_k": 2, "hidden_dim": 64}
    return spec


class _Collectives(TorchDispatchMode):
    """Counts the functional collectives dispatched while it is on, by name (waits left out)."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: dict[str, int] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        name = func.__name__.split(".")[0]
        if func.namespace == "_c10d_functional" and name not in ("wait_tensor", "_wrap_tensor_autograd"):
            self.counts[name] = self.counts.get(name, 0) + 1
        return func(*args, **(kwargs or {}))


def backward_collectives(cases: list[tuple[dict[str, Any], dict[str, Any], int]]) -> list[dict[str, int]]:
    """For each (spec, dist, rows of this rank): the collectives one backward of the model's loss runs."""
    out = []
    for spec, dist, length in cases:
        torch.manual_seed(0)
        model = parallelize(build_model(spec), dist)
        ids = torch.randint(0, spec["vocab_size"], (2, length), generator=torch.Generator().manual_seed(1))
        loss = model(ids).float().pow(2).mean()
        with _Collectives() as seen:
            loss.backward()
        out.append(seen.counts)
    return out


def pipeline_peak_saved(spec: dict[str, Any], dist: dict[str, Any], batch: int) -> dict[str, int]:
    """On each rank: its pipeline rank, and the peak saved activation bytes of one step of ``batch``
    rows (after a first step, which also infers the shapes the stages exchange)."""
    torch.manual_seed(0)
    model = parallelize(build_model(spec), dist)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    step = TrainStep(model, optimizer, "causal_lm")
    ids = torch.randint(0, spec["vocab_size"], (batch, SEQ), generator=torch.Generator().manual_seed(1))
    step({"input_ids": ids, "labels": ids})
    probe = PeakSavedActivations(model)
    with torch.autograd.graph.saved_tensors_hooks(probe.pack, probe.unpack):
        step({"input_ids": ids, "labels": ids})
    return {"stage": parallel_state(model).mesh["pp"].get_local_rank(), "peak": probe.peak}
