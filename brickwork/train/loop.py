"""The training loop: scheduled steps, periodic evaluation, checkpoints, metrics and a progress bar.

It also ends a run that cannot go on well: a non-finite loss, fp16 steps that keep overflowing, and a
stop asked for by SIGTERM or SIGUSR1 (brickwork/train/preemption.py), checked at every step boundary.
"""

from __future__ import annotations

import logging
import math
import sys
import time
from collections import deque
from contextlib import ExitStack, closing
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from tqdm import tqdm

from brickwork.data.task_batches import TaskBatches
from brickwork.launch_env import is_first_rank
from brickwork.option_types import config_to_dict
from brickwork.parallel import parallel_state, split_rows
from brickwork.train.checkpoint_writer import CheckpointWriter
from brickwork.train.metrics import MetricsLog, plot_losses
from brickwork.train.mfu import run_utilization
from brickwork.train.optim import learning_rate, set_learning_rate
from brickwork.train.preemption import Preempted, StopSignals
from brickwork.train.run import Run
from brickwork.train.step import TrainStep, evaluate
from brickwork.train.trackers import open_trackers

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Training:
    """What the loop trains: the model as ``parallelize`` left it, the optimizer built on its
    parameters (what checkpoints save and the schedule sets), and the step that runs both."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    step: TrainStep


@dataclass
class LoopState:
    """Where a run stands: the next step to take, the batches still to draw, the fixed validation set."""

    step: int
    batches: TaskBatches
    val_batches: list[dict[str, torch.Tensor]]
    val_loss: float = math.nan


def local_share(batch: dict[str, torch.Tensor], model: nn.Module) -> dict[str, torch.Tensor]:
    """This data-parallel rank's contiguous rows of a global batch (by ``device_weights`` when they
    weigh data-parallel ranks); tensor/pipeline-parallel peers take the same rows."""
    parallel = parallel_state(model)
    layout = parallel.config
    if layout.data_parallel_size == 1:
        return batch  # one share; looking up the mesh's dp rank would cost more than the step's bookkeeping
    weights = layout.device_weights if layout.pipeline_parallel_size == 1 else None
    rows = split_rows(next(iter(batch.values())).shape[0], weights, layout.data_parallel_size)
    rank = parallel.mesh["dp"].get_local_rank()
    start = sum(rows[:rank])
    return {k: v[start : start + rows[rank]] for k, v in batch.items()}


class NonFiniteLoss(ValueError):
    """The loss became NaN or infinite; raised so the CLI can name the fix in one line."""


class DivergedError(ValueError):
    """``train.max_skipped_steps`` fp16 steps in a row overflowed; raised so the CLI can name the fix."""


def run_loop(run: Run, training: Training, state: LoopState, run_dir: Path) -> float:
    """Train from ``state.step`` to ``train.steps`` in ``run_dir``; returns the final validation loss.

    The rate counts what one sample of the task is (its ``sample_unit``): tokens, or whole images.
    The model carries its ``.spec`` (``build_model`` attaches it), from which the MFU of each step is
    counted (brickwork/train/mfu.py).

    Every rank runs it. Only the first rank writes files and prints. Evaluation and checkpointing
    happen after the steps that are multiples of their intervals and after the last step. SIGTERM or
    SIGUSR1 stops every rank after the same step, which is then checkpointed (unless
    ``train.checkpoint_on_preempt`` is false), by raising :class:`Preempted`.
    """
    cfg, task, title, is_main = run.config.train, run.task, run.plot_title(run_dir), is_first_rank()
    model, optimizer, step = training.model, training.optimizer, training.step
    settings = config_to_dict(cfg)
    trackers = open_trackers(cfg.tracker_names(), run_dir, title, settings) if is_main else []
    parallel = parallel_state(model)

    # Closed however the loop ends: the metrics file stays open between records, a checkpoint
    # written in the background is waited for, and the progress bar (made once step 0 is evaluated).
    timeout = run.layout.timeout_s
    writer = CheckpointWriter(run_dir, cfg.keep_checkpoints, is_main, cfg.async_checkpoint, timeout)
    with (
        closing(MetricsLog(run_dir / "metrics.jsonl", trackers)) as log,
        StopSignals(parallel.device) as stop,
        writer,
        ExitStack() as closes,
    ):

        def save(done: int, val_loss: float) -> Path:
            """The checkpoint of step ``done``, due by the interval or by a stop signal; then pruning."""
            folder = writer.save(
                done,
                model,
                optimizer,
                state.batches.state_dict(),
                val_loss,
                settings=settings,
                step_state=step.state_dict(),
            )
            if is_main:
                plot_losses(log.read(), run_dir / "loss.png", title)
            return folder

        val_batches = [local_share(b, model) for b in state.val_batches]
        val_loss = state.val_loss
        # A compiled run builds its graphs in its first evaluation and step: timed apart, said once,
        # and kept out of the rate.
        compiling_since = time.perf_counter() if step.compiled else None
        if state.step == 0:
            val_loss = evaluate(model, val_batches, task, precision=cfg.precision)
            _record(is_main, log, {"step": 0, "val_loss": val_loss})
            if not math.isfinite(val_loss):
                _stop_on_validation(val_loss, 0)
            if is_main:
                width = len(str(cfg.steps))
                logger.info(f"step {0:>{width}}/{cfg.steps}  val loss {val_loss:.4f} before training")
        inputs = task.sample_unit
        items_per_step = cfg.batch_size * (cfg.seq_len if inputs == "tokens" else 1)
        # The FLOPs per token and the peak, once: a step's record then costs a multiplication.
        devices = parallel.mesh.size()
        lengths = task.model_lengths(cfg.seq_len)
        utilization = run_utilization(
            model.spec, cfg.seq_len, cfg.precision, parallel.device, devices, lengths
        )
        if utilization.unknown is not None and is_main:
            logger.info(f"mfu is null in metrics.jsonl: {utilization.unknown}")
        rate_name, rate_unit = f"{inputs}_per_s", {"tokens": "tok/s", "images": "img/s"}[inputs]
        recent: deque[float] = deque(maxlen=20)
        bar = closes.enter_context(
            tqdm(
                total=cfg.steps,
                initial=state.step,
                # A bar redrawn with carriage returns only garbles logs; without a terminal the
                # evaluation lines alone report progress.
                disable=not (is_main and sys.stdout.isatty()),
                unit="step",
                file=sys.stdout,
                dynamic_ncols=True,
                mininterval=0.5,
                bar_format="{l_bar}{bar}| {n}/{total} [{elapsed}<{remaining}{postfix}]",
            )
        )
        for index in range(state.step, cfg.steps):
            # The rate times the batch's draw too, as a plain loop's clock does; not evaluations or saves.
            started = time.perf_counter()
            lr = learning_rate(index, cfg)
            set_learning_rate(optimizer, lr)
            loss = step(local_share(state.batches.next_batch(), model))
            took = time.perf_counter() - started
            done = index + 1
            if compiling_since is not None:
                if is_main:
                    seconds = time.perf_counter() - compiling_since
                    logger.info(f"compiled: the first evaluation and step took {seconds:.1f} s")
                compiling_since = None
            else:
                recent.append(took)
            if not math.isfinite(loss) and not step.metrics.get("skipped"):
                raise NonFiniteLoss(
                    f"the training loss became {loss} at step {done}; lower train.lr (now {cfg.lr}) "
                    f"or set train.grad_clip (now {cfg.grad_clip})"
                )
            per_step = sum(recent) / len(recent) if recent else took
            rate = items_per_step / per_step
            mfu = utilization.mfu(rate)
            record = {"step": done, "loss": loss, "lr": lr, rate_name: round(rate, 1), "mfu": mfu}
            record.update({k: v for k, v in step.metrics.items() if k != "skipped" or v})
            _record(is_main, log, record)
            if step.metrics.get("skipped") and is_main:
                logger.info(f"step {done}: fp16 gradients overflowed; the step was skipped")
            scaler = step.precision.scaler
            if scaler is not None and 0 < cfg.max_skipped_steps <= scaler.overflows_in_a_row:
                raise DivergedError(
                    f"the last {scaler.overflows_in_a_row} steps (to step {done}) all overflowed in fp16 "
                    f"and were skipped, the loss scale falling to {scaler.scale:g}: the run is diverging; "
                    f"lower train.lr (now {cfg.lr}), or raise train.max_skipped_steps (now "
                    f"{cfg.max_skipped_steps}); no checkpoint was saved from that state"
                )
            if done % cfg.eval_interval == 0 or done == cfg.steps:
                val_loss = evaluate(model, val_batches, task, precision=cfg.precision)
                _record(is_main, log, {"step": done, "val_loss": val_loss})
                if not math.isfinite(val_loss):
                    _stop_on_validation(val_loss, done)
                if is_main:
                    eta = _clock(per_step * (cfg.steps - done))
                    utilized = f"  MFU {mfu:.1%}" if mfu is not None else ""
                    logger.info(
                        f"step {done:>{len(str(cfg.steps))}}/{cfg.steps}  train loss {loss:.4f}  "
                        f"val loss {val_loss:.4f}  {rate:,.0f} {rate_unit}{utilized}  ETA {eta}"
                    )
            saved = save(done, val_loss) if done % cfg.checkpoint_interval == 0 or done == cfg.steps else None
            signum = stop.agreed()
            if signum:
                if saved is None and cfg.checkpoint_on_preempt:
                    saved = save(done, val_loss)
                writer.wait()  # Preempted names a complete checkpoint
                raise Preempted(signum, done, cfg.steps, saved, run_dir)
            postfix = f"loss {loss:.3f}, val {val_loss:.3f}, {rate:,.0f} {rate_unit}"
            bar.set_postfix_str(postfix, refresh=False)
            bar.update(1)
            state.step = done
        return val_loss


def _stop_on_validation(val_loss: float, step: int) -> None:
    """A non-finite validation loss ends the run before that state can be saved as a checkpoint."""
    raise NonFiniteLoss(
        f"the validation loss became {val_loss} at step {step}; no checkpoint was saved from that "
        "state, and --resume continues from the last one saved before it"
    )


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}:{secs:02d}"


def _record(is_main: bool, log: MetricsLog, record: dict) -> None:
    if is_main:
        log.append(record)
