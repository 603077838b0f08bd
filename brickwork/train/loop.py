"""The training loop: scheduled steps, periodic evaluation, checkpoints, metrics and a progress bar."""

from __future__ import annotations

import math
import sys
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch
from tqdm import tqdm

from brickwork.data import RandomWindows
from brickwork.factory.convert import config_to_dict
from brickwork.parallel import ParallelModel
from brickwork.train.checkpoint import prune_checkpoints, save_run_checkpoint
from brickwork.train.config import TrainConfig
from brickwork.train.metrics import MetricsLog, plot_losses
from brickwork.train.optim import learning_rate, set_learning_rate


class Engine(Protocol):
    """What the loop needs from a single-process or a parallel runner."""

    is_main: bool

    def train_step(
        self, input_ids: torch.Tensor, labels: torch.Tensor, optimizer: torch.optim.Optimizer
    ) -> float: ...

    def evaluate(self, input_ids: torch.Tensor, labels: torch.Tensor, batch_size: int) -> float: ...

    @property
    def checkpoint_model(self) -> torch.nn.Module | ParallelModel: ...


@dataclass
class LoopState:
    """Where a run stands: the next step to take and the batches still to draw."""

    step: int
    batches: RandomWindows
    val_inputs: torch.Tensor
    val_labels: torch.Tensor
    val_loss: float = math.nan


class NonFiniteLoss(ValueError):
    """The loss became NaN or infinite; raised so the CLI can name the fix in one line."""


def run_loop(
    engine: Engine,
    optimizer: torch.optim.Optimizer,
    cfg: TrainConfig,
    state: LoopState,
    run_dir: Path,
    title: str,
) -> float:
    """Train from ``state.step`` to ``cfg.steps``; returns the final validation loss.

    Only the main process writes files and prints. Evaluation and checkpointing happen after the
    steps that are multiples of their intervals and after the last step.
    """
    log = MetricsLog(run_dir / "metrics.jsonl")
    val_loss = state.val_loss
    if state.step == 0:
        val_loss = engine.evaluate(state.val_inputs, state.val_labels, cfg.batch_size)
        _record(engine, log, {"step": 0, "val_loss": val_loss})
        if engine.is_main:
            print(f"step {0:>{len(str(cfg.steps))}}/{cfg.steps}  val loss {val_loss:.4f} before training")
    tokens_per_step = cfg.batch_size * cfg.seq_len
    recent: deque[float] = deque(maxlen=20)
    bar = tqdm(
        total=cfg.steps,
        initial=state.step,
        # A bar redrawn with carriage returns only garbles logs; without a terminal the
        # evaluation lines alone report progress.
        disable=not (engine.is_main and sys.stdout.isatty()),
        unit="step",
        file=sys.stdout,
        dynamic_ncols=True,
        mininterval=0.5,
        bar_format="{l_bar}{bar}| {n}/{total} [{elapsed}<{remaining}{postfix}]",
    )
    for step in range(state.step, cfg.steps):
        lr = learning_rate(step, cfg)
        set_learning_rate(optimizer, lr)
        inputs, labels = state.batches.next_batch()
        started = time.perf_counter()
        loss = engine.train_step(inputs, labels, optimizer)
        recent.append(time.perf_counter() - started)
        done = step + 1
        if not math.isfinite(loss):
            bar.close()
            raise NonFiniteLoss(
                f"the training loss became {loss} at step {done}; lower train.lr (now {cfg.lr}) "
                f"or set train.grad_clip (now {cfg.grad_clip})"
            )
        tokens_per_s = tokens_per_step * len(recent) / sum(recent)
        _record(engine, log, {"step": done, "loss": loss, "lr": lr, "tokens_per_s": round(tokens_per_s, 1)})
        if done % cfg.eval_interval == 0 or done == cfg.steps:
            val_loss = engine.evaluate(state.val_inputs, state.val_labels, cfg.batch_size)
            _record(engine, log, {"step": done, "val_loss": val_loss})
            if engine.is_main:
                eta = _clock(sum(recent) / len(recent) * (cfg.steps - done))
                bar.write(
                    f"step {done:>{len(str(cfg.steps))}}/{cfg.steps}  train loss {loss:.4f}  "
                    f"val loss {val_loss:.4f}  {tokens_per_s:,.0f} tok/s  ETA {eta}",
                    file=sys.stdout,
                )
        if done % cfg.checkpoint_interval == 0 or done == cfg.steps:
            save_run_checkpoint(
                run_dir,
                done,
                engine.checkpoint_model,
                optimizer,
                state.batches.state_dict(),
                val_loss,
                settings=config_to_dict(cfg),
            )
            if engine.is_main:
                prune_checkpoints(run_dir, cfg.keep_checkpoints)
                plot_losses(log.read(), run_dir / "loss.png", title)
        bar.set_postfix_str(f"loss {loss:.3f}, val {val_loss:.3f}, {tokens_per_s:,.0f} tok/s", refresh=False)
        bar.update(1)
        state.step = done
    bar.close()
    return val_loss


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}:{secs:02d}"


def _record(engine: Engine, log: MetricsLog, record: dict) -> None:
    if engine.is_main:
        log.append(record)
