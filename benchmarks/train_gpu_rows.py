"""One row of the GPU training benchmark: a shape trained by one implementation, eager or compiled.

- ``plain``: the plain-torch model of the shape (benchmarks/nanogpt_reference.py, llama_reference.py)
  in nanoGPT's loop: logits and ``F.cross_entropy``, backward, clipping at 1.0, fused AdamW, with
  ``torch.compile(model)`` for the compiled row, as nanoGPT compiles.
- ``brickwork``: brickwork's model of the same spec in the same loop, its loss ``model(ids,
  labels=ids).loss``, compiled region by region as ``train.compile`` compiles it
  (parallel/compile.py): model speed apart from what the CLI adds.
- ``fp8``: the ``brickwork`` row with its layers' linears in float8 first (``train.precision=fp8``,
  tensorwise, brickwork/train/fp8.py), over bf16 autocast as the other rows: fp8 against bf16.
- ``packed``: the ``brickwork`` row on packed documents (``data.pack``): each window holds documents
  of random lengths (a new one starts at a token with probability ``PACKED_STARTS / seq_len``), its
  ``document_ids`` make attention document-causal (one FlexAttention block mask a step on CUDA) and
  restart the positions, and no label crosses a boundary: the cost of the document mask.
- ``cli``: the function behind ``brickwork train`` with dotted overrides, on a nanoGPT-format token
  folder, compiled by ``train.compile``; its rate is read from the run's metrics.jsonl.

Every bare-loop step ends in ``loss.item()`` as the CLI's step ends in reading its loss, so both time
the whole step, the GPU's work included. On CUDA the rows run bf16 autocast over float32 weights
(``train.precision=bf16-mixed``); on a CPU float32.
"""

from __future__ import annotations

import contextlib
import gc
import io
import shutil
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from brickwork.data.token_file import token_dtype
from brickwork.factory import build_model
from brickwork.parallel.compile import apply_compile
from brickwork.train.fp8 import convert_to_fp8
from brickwork.train.metrics import MetricsLog
from brickwork.train.trainer import train_new

from .train_gpu_shapes import Shape

IMPLEMENTATIONS = ("plain", "brickwork", "fp8", "packed", "cli")
# Documents a packed window holds on average (a GPT-2 window of 1024 tokens: 256-token documents).
PACKED_STARTS = 4
MODES = ("eager", "compiled")
# brickwork/train/loop.py logs each step's rate as the mean over its last 20 steps: only records whose
# window holds no warm-up step (compilation, first allocations) are read.
RATE_WINDOW = 20
GRAD_CLIP = 1.0


@dataclass(frozen=True)
class Row:
    shape: Shape
    implementation: str
    mode: str

    @property
    def name(self) -> str:
        return f"{self.shape.name}/{self.implementation}/{self.mode}"


@dataclass(frozen=True)
class Settings:
    """What every row of a run shares: the device, the step counts and the train step's precision."""

    device: torch.device
    warmup: int
    steps: int
    precision: str
    work_dir: Path

    def autocast(self) -> contextlib.AbstractContextManager:
        if self.precision == "fp32":
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=torch.bfloat16)


def measure(row: Row, settings: Settings) -> dict:
    """The row's tokens/s, step ms, peak memory (CUDA) and first loss; ``error`` instead when it failed
    (an out-of-memory row, a model that cannot compile): the other rows still run."""
    cuda = settings.device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    try:
        run = run_cli if row.implementation == "cli" else run_bare
        result = run(row, settings)
    except Exception as err:  # any failure is this row's result, reported beside the others
        result = {"error": f"{type(err).__name__}: {err}"}
    finally:
        torch._dynamo.reset()  # each row compiles afresh and frees what its graphs held
        gc.collect()
    result["wall_s"] = time.perf_counter() - started
    if cuda and "error" not in result:
        result["peak_gib"] = (torch.cuda.max_memory_allocated() - base) / 2**30
    if cuda:
        torch.cuda.empty_cache()
    return {"row": row.name, "shape": row.shape.name, "family": row.shape.preset,
            "implementation": row.implementation, "mode": row.mode, **result}  # fmt: skip


def plain_loss(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return model(inputs, targets)[1]


def brickwork_loss(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    # HF's meaning: the labels are the inputs, shifted inside the model.
    return model(inputs, labels=inputs).loss


def packed_loss(
    model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, document_ids: torch.Tensor
) -> torch.Tensor:
    # A document's first token is predicted from nothing of its own: no label there (data.pack's rule).
    starts = torch.ones_like(document_ids, dtype=torch.bool)
    starts[:, 1:] = document_ids[:, 1:] != document_ids[:, :-1]
    return model(inputs, labels=inputs.masked_fill(starts, -100), document_ids=document_ids).loss


def random_documents(shape: Shape, device: torch.device, generator: torch.Generator) -> torch.Tensor:
    """[batch, seq_len] document ids: a document starts at each token with probability
    ``PACKED_STARTS / seq_len``, and at every row's first token."""
    starts = torch.rand(shape.batch, shape.seq_len, device=device, generator=generator)
    starts = starts < PACKED_STARTS / shape.seq_len
    starts[:, 0] = True
    return starts.long().cumsum(1) - 1


def adamw(model: nn.Module) -> torch.optim.AdamW:
    """nanoGPT's AdamW: weight decay on matrices and embeddings only, torch's fused update."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=3e-4, betas=(0.9, 0.95), fused=True)


def run_bare(row: Row, settings: Settings) -> dict:
    """``settings.warmup + settings.steps`` steps of the bare loop on random token windows."""
    shape = row.shape
    torch.manual_seed(0)
    plain, packed = row.implementation == "plain", row.implementation == "packed"
    model = (shape.plain_model() if plain else build_model(shape.spec())).to(settings.device).train()
    if row.implementation == "fp8":
        # Before compiling, as train.precision=fp8 converts before parallelize compiles.
        convert_to_fp8(model, "tensorwise", min_features=shape.fp8_min_features, device=settings.device)
    loss_of: Callable[..., torch.Tensor] = plain_loss if plain else packed_loss if packed else brickwork_loss
    forward = model
    if row.mode == "compiled":
        # nanoGPT compiles its whole model; brickwork's own switch compiles its regions in place.
        forward = torch.compile(model) if plain else apply_compile(model)
    optimizer = adamw(model)
    generator = torch.Generator(settings.device).manual_seed(1)
    seconds, losses = [], []
    for _ in range(settings.warmup + settings.steps):
        window = torch.randint(
            shape.vocab, (shape.batch, shape.seq_len + 1), device=settings.device, generator=generator
        )
        inputs, targets = window[:, :-1].contiguous(), window[:, 1:].contiguous()
        documents = (random_documents(shape, settings.device, generator),) if packed else ()
        start = time.perf_counter()
        with settings.autocast():
            loss = loss_of(forward, inputs, targets, *documents)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
        seconds.append(time.perf_counter() - start)
    step_s = statistics.median(seconds[settings.warmup :])
    return {
        "tokens_per_s": shape.tokens / step_s,
        "step_ms": 1e3 * step_s,
        "warmup_s": sum(seconds[: settings.warmup]),
        "first_loss": losses[0],
        "params": sum(p.numel() for p in model.parameters()),
    }


def token_folder(shape: Shape, folder: Path) -> Path:
    """A nanoGPT data folder of uniformly random token ids (train.bin, val.bin), as the bare loops draw."""
    folder.mkdir(parents=True, exist_ok=True)
    dtype = token_dtype(shape.vocab, smallest=np.uint16)  # nanoGPT's uint16, wider only if it must be
    rng = np.random.default_rng(0)
    window = shape.batch * (shape.seq_len + 1)
    for name, windows in (("train.bin", 64), ("val.bin", 8)):
        rng.integers(0, shape.vocab, windows * window, dtype=dtype).tofile(folder / name)
    return folder


def cli_overrides(row: Row, settings: Settings, data: Path, out: Path, steps: int) -> list[str]:
    shape = row.shape
    return [
        *shape.overrides(),
        f"data.path={data}",
        f"train.out_dir={out}",
        f"train.steps={steps}",
        f"train.batch_size={shape.batch}",
        f"train.seq_len={shape.seq_len}",
        f"train.precision={settings.precision}",
        f"train.device={settings.device.type}",
        f"train.grad_clip={GRAD_CLIP}",
        # One validation batch before and after, one checkpoint at the end: the least a run does.
        "train.eval_batches=1",
        f"train.eval_interval={steps}",
        f"train.checkpoint_interval={steps}",
        "train.keep_checkpoints=1",
        "train.sample_tokens=0",
        # Explicit both ways: train.compile's default (auto) compiles on CUDA.
        f"train.compile={'true' if row.mode == 'compiled' else 'false'}",
    ]


def run_cli(row: Row, settings: Settings) -> dict:
    """``brickwork train`` for warm-up, a full rate window and ``settings.steps`` more steps; the median
    of the logged rates whose window lies past the warm-up."""
    shape = row.shape
    data = token_folder(shape, settings.work_dir / f"data-{shape.name}")
    out = settings.work_dir / row.name.replace("/", "-")
    first_clean = settings.warmup + RATE_WINDOW
    overrides = cli_overrides(row, settings, data, out, first_clean - 1 + settings.steps)
    try:
        # The CLI's own lines (the dropout it set, the progress bar off a terminal) stay out of the report.
        with contextlib.redirect_stdout(io.StringIO()):
            train_new(shape.preset, overrides)
        records = [r for r in MetricsLog(out / "metrics.jsonl").read() if "loss" in r]
    finally:
        shutil.rmtree(out, ignore_errors=True)
    timed = [r for r in records if r["step"] >= first_clean]
    tokens_per_s = statistics.median(r["tokens_per_s"] for r in timed)
    result = {"tokens_per_s": tokens_per_s, "step_ms": 1e3 * shape.tokens / tokens_per_s}
    result["first_loss"] = records[0]["loss"]
    return result
