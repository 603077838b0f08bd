"""``brickwork train``: set up a run (model, data, optimizer, run folder), train it, sample from it.

A new run writes ``config.yaml`` first; a resumed run reads it back, loads the newest complete
checkpoint and continues, so its loss curve is the one the uninterrupted run would have drawn.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import torch
import torch.distributed as dist
from torch import nn

from brickwork.checkpoint import complete_checkpoints, latest_checkpoint
from brickwork.checkpoint.run_folder import SavedCheckpoint
from brickwork.data.sources import TextData
from brickwork.errors import ConfigError
from brickwork.extras import missing_package
from brickwork.factory import build_model, dump_spec, load_spec
from brickwork.launch_env import is_first_rank
from brickwork.option_types import config_to_dict
from brickwork.parallel import ParallelConfig, full_state_dict, parallel_state, parallelize
from brickwork.parallel.compile import check_compilable
from brickwork.parallel.mesh import mesh_device_type
from brickwork.sampling import sample_ids
from brickwork.train.atomic_file import replacing
from brickwork.train.checkpoint import load_run_checkpoint
from brickwork.train.config import TrainConfig
from brickwork.train.data_identity import DataIdentity
from brickwork.train.distributed import agree_on_rank0
from brickwork.train.fp8 import convert_for_layout
from brickwork.train.heap import keep_freed_memory
from brickwork.train.init_weights import load_initial_weights, pretrained_base
from brickwork.train.loop import LoopState, Training, run_loop
from brickwork.train.metrics import MetricsLog, plot_losses
from brickwork.train.optim import build_optimizer
from brickwork.train.peers import peers_watched
from brickwork.train.preflight import check_before_writing
from brickwork.train.resume_check import check_resume
from brickwork.train.resume_overrides import (
    CHANGES_FILE,
    check_resume_overrides,
    config_changes,
    record_changes,
)
from brickwork.train.retention import remove_unfinished
from brickwork.train.run import Run, resolve, run_task, with_auto_dist
from brickwork.train.run_config import resolve_run
from brickwork.train.run_data import run_data
from brickwork.train.run_lock import RunLock
from brickwork.train.step import TrainStep
from brickwork.train.threads import apply_cpu_threads
from brickwork.train.trained_model import held_out_prompt

logger = logging.getLogger(__name__)
Changes = dict[str, list]  # config key -> [old, new]: what a resume's overrides change in config.yaml


@dataclass
class RunResult:
    """What a finished run reports: where it lives, its first and last validation loss, its sample."""

    run_dir: Path
    first_val_loss: float
    final_val_loss: float
    seconds: float
    sample: str


def train_new(spec_arg: str | None, overrides: list[str], init_from: str | None = None) -> RunResult:
    """Start a run from a preset or spec file with dotted overrides; ``init_from`` (anything
    ``from_pretrained`` reads) gives the starting weights, and the spec too when SPEC is left out."""
    base: str | tuple[str, dict] | None = spec_arg
    if init_from is not None:
        base = spec_arg or pretrained_base(init_from)
        overrides = [*overrides, f"train.init_from={init_from}"]
    config = resolve_run(base, overrides)
    task = run_task(config)
    run = resolve(with_auto_dist(config, task), task)
    check_before_writing(run)
    with peers_watched(run.layout.timeout_s):
        default = default_out_dir(run.config.name)
        run_dir = Path(run.config.train.out_dir or agree_on_rank0(default, run.layout))
    made = _missing_parents(run_dir)
    try:
        with RunLock(run_dir, "train.out_dir") as lock, peers_watched(run.layout.timeout_s, run_dir):
            try:
                return _train(run, run_dir, resume=False)
            except BaseException:
                # A run stopped before it wrote config.yaml (data that reads badly, say) leaves no
                # folder behind. Only the lock's holder may touch the folder: a refused process may
                # have seen it missing too.
                if lock.created and not (run_dir / "config.yaml").exists():
                    lock.clear()
                raise
    except BaseException:
        _remove_if_empty(made)  # once the lock has let go of the run folder
        raise


def train_resume(
    run_dir: str, overrides: list[str] | None = None, accept_data_change: bool = False
) -> RunResult:
    """Continue the run in ``run_dir`` from its newest complete checkpoint, or from step 0 if it
    stopped before saving one.

    ``overrides`` change what does not change the model, the data or the batch
    (brickwork/train/resume_overrides.py): another layout (``dist.*``), more steps, the learning rate
    and its schedule, the intervals, logging, sampling; config.yaml and config_changes.jsonl then
    record them. ``accept_data_change`` goes on with data that changed since the run started
    (brickwork/train/data_identity.py); data.json records it.
    """
    folder = Path(run_dir)
    config_file = folder / "config.yaml"
    if not config_file.is_file():
        raise ConfigError(f"{run_dir!r} is not a run folder: it has no config.yaml", "--resume")
    overrides = list(overrides or [])
    check_resume_overrides(overrides)
    saved_steps = complete_checkpoints(folder)
    step = saved_steps[-1].step if saved_steps else 0
    config = resolve_run(str(config_file), overrides)
    task = run_task(config)
    config = with_auto_dist(config, task)
    if config.train.steps < step:
        raise ConfigError(
            f"{config.train.steps} is below step {step} of the newest checkpoint; a resumed run can only "
            "go on",
            "train.steps",
        )
    changes = config_changes(load_spec(config_file), config.to_dict())
    try:
        run = resolve(config, task, resumed=True)
    except ConfigError as err:
        raise ConfigError(
            f"{err.reason}; or continue under another layout with dist.* overrides after --resume "
            f"{run_dir}, e.g. dist.data_parallel_size=1",
            err.path,
        ) from None
    check_before_writing(run)
    with RunLock(folder), peers_watched(run.layout.timeout_s, folder):
        return _train(run, folder, resume=True, changes=changes, accept_data_change=accept_data_change)


def default_out_dir(name: str) -> str:
    return os.path.join("runs", f"{name}-{time.strftime('%Y%m%d-%H%M%S')}")


def _train(
    run: Run, run_dir: Path, resume: bool, changes: Changes | None = None, accept_data_change: bool = False
) -> RunResult:
    """Set ``run`` up in ``run_dir`` (its data, model and step; resumed from the newest intact
    checkpoint, or the folder written afresh), train it to the end, and sample from it."""
    started = time.perf_counter()
    threads = apply_cpu_threads()
    # Every process decides about the folder before any of them writes to it (the token cache first).
    # A resumed run that stopped before its first checkpoint starts again from step 0, in place.
    checkpoint = latest_checkpoint(run_dir, intact=True) if resume and complete_checkpoints(run_dir) else None
    if not resume:
        _check_unclaimed(run_dir)
    data = run_data(run, run_dir, None if checkpoint is None else checkpoint.step, accept_data_change)
    built = _build_model(run, initial_weights=checkpoint is None)
    # Every rank has checked the run folder before rank 0 writes into it.
    dist.barrier()
    val_batches = run.task.validation_batches(run.config, data.text)
    state = LoopState(0, run.task.train_batches(run.config, data.text), val_batches)
    training = _training(run, built.model)
    if resume and is_first_rank():
        for name in remove_unfinished(run_dir):
            _say(f"removed checkpoints/{name}: a save or a deletion of it was cut off before it finished")
    if checkpoint is None:
        _start_folder(run, run_dir, resume, data.identity, changes)
    else:
        _resume_from(run, run_dir, checkpoint, training, state, data.identity, changes)
    _say_setup(run, built, data.text, threads.threads)
    on_cpu = parallel_state(built.model).device.type == "cpu"
    if on_cpu:
        keep_freed_memory()
    with _flush_denormals(on_cpu):
        final = run_loop(run, training, state, run_dir)
    return _finish(run, built.model, run_dir, data.text, final, started)


class BuiltModel(NamedTuple):
    """The run's model as ``parallelize`` left it, its parameter count (whole, before the layout
    shards it), and the names of the linears ``train.precision=fp8`` converted."""

    model: nn.Module
    parameters: int
    fp8: list[str]


def _build_model(run: Run, initial_weights: bool) -> BuiltModel:
    """The model of ``run``'s spec, seeded by ``train.seed`` or, with ``initial_weights``, holding
    ``train.init_from``'s; then laid out."""
    cfg = run.config.train
    torch.manual_seed(cfg.seed)
    model = build_model(run.config.spec)
    if cfg.init_from is not None and initial_weights:
        load_initial_weights(model, cfg.init_from)
    parameters = sum(p.numel() for p in model.parameters())
    fp8 = []
    if cfg.precision == "fp8":
        # torchao swaps the linears before tensor parallel, compilation and FSDP wrap them.
        fp8 = convert_for_layout(model, cfg.fp8_recipe, cfg.fp8_min_features, run.layout)
    model = parallelize(model, run.layout, compile=_compiles(cfg.compile, model, run.layout))
    return BuiltModel(model, parameters, fp8)


def _training(run: Run, model: nn.Module) -> Training:
    """The optimizer ``train:`` names, on ``model``'s parameters, and the step that trains both."""
    cfg = run.config.train
    optimizer = build_optimizer(model, cfg)
    step = TrainStep(
        model,
        optimizer,
        run.task,
        grad_accum_steps=cfg.grad_accum_steps,
        precision=cfg.precision,
        grad_clip=cfg.grad_clip if cfg.grad_clip > 0 else None,
    )
    return Training(model, optimizer, step)


def _start_folder(
    run: Run, run_dir: Path, resume: bool, identity: DataIdentity, changes: Changes | None
) -> None:
    """A run from step 0: rank 0 creates ``run_dir`` and writes its data record and config.yaml."""
    if is_first_rank():
        run_dir.mkdir(parents=True, exist_ok=True)
        if resume:
            _say(f"{run_dir} has no checkpoint yet: it starts again from step 0")
            # Its curve is drawn again from the start.
            MetricsLog(run_dir / "metrics.jsonl").truncate_after(-1)
        identity.save(run_dir)  # before config.yaml, which marks the folder as a run's
        _write_config(run, run_dir, 0, changes)
    _say(f"run folder {run_dir}")


def _resume_from(
    run: Run,
    run_dir: Path,
    checkpoint: SavedCheckpoint,
    training: Training,
    state: LoopState,
    identity: DataIdentity,
    changes: Changes | None,
) -> None:
    """Load ``checkpoint`` into the model, the optimizer, the step and the batches, and go on from its
    step; rank 0 drops the metrics recorded after it and writes what the resume changed."""
    state.step = checkpoint.step
    changed = check_resume(checkpoint.folder, run.config.spec, config_to_dict(run.config.train))
    for line in [*changed, *identity.notes]:
        _say(line)
    loaded = load_run_checkpoint(checkpoint.folder, training.model, training.optimizer, training.step)
    state.val_loss = loaded.val_loss
    state.batches.load_state_dict(loaded.data_state)
    _say(f"resuming {run_dir} from step {state.step} of {run.config.train.steps}")
    saved, now = _dist_summary(loaded.meta["dist"]), _dist_summary(run.config.dist)
    if saved != now:
        _say(f"the checkpoint was saved as {saved}; continuing as {now}")
    if is_first_rank():
        log = MetricsLog(run_dir / "metrics.jsonl")
        torn = log.truncate_after(state.step)
        if torn is not None:
            _say(f"{log.path}: dropped its last line, cut off by a crash mid-write: {torn[:60]!r}")
        identity.save(run_dir)
        if changes:
            # The run goes on under the new settings; a later --resume keeps them.
            _write_config(run, run_dir, state.step, changes)


def _say_setup(run: Run, built: BuiltModel, text: TextData | None, threads: int) -> None:
    """The run's model, data, length, processes and precision, in the log's opening lines."""
    cfg, task = run.config.train, run.task
    data = task.describe_data(run.config, text)
    _say(f"model {run.config.name}: {built.parameters:,} parameters, task {task.name}; data: {data}")
    device = parallel_state(built.model).device.type
    where = device + (f", {cfg.precision}" if cfg.precision != "fp32" else "")
    processes = f"1 process, {where}"
    if dist.get_world_size() > 1:
        processes = f"{dist.get_world_size()} processes ({where}): {_dist_summary(run.config.dist)}"
    cpu = f", {threads} CPU threads per process" if device == "cpu" else ""
    _say(f"{cfg.steps} steps of {_step_size(run)} on {processes}{cpu}")
    if built.fp8:
        _say(f"fp8 ({cfg.fp8_recipe or 'tensorwise'}): {len(built.fp8)} linears in float8, the rest in bf16")


def _finish(
    run: Run, model: nn.Module, run_dir: Path, text: TextData | None, final: float, started: float
) -> RunResult:
    """End the process group and, on rank 0, plot the curve, sample and say how the run went."""
    cfg = run.config.train
    sample_model = _sample_model(run, model) if run.task.samples_text else None
    is_main = is_first_rank()
    dist.barrier()
    dist.destroy_process_group()
    if not is_main:
        return RunResult(run_dir, math.nan, final, time.perf_counter() - started, "")
    records = MetricsLog(run_dir / "metrics.jsonl").read()
    plotted = plot_losses(records, run_dir / "loss.png", run.plot_title(run_dir))
    if not plotted:
        _say(f"no loss.png: {missing_package('matplotlib', 'drawing it')}")
    first = next((r["val_loss"] for r in records if r.get("val_loss") is not None), math.nan)
    sample = _sample(sample_model, cfg, text) if sample_model is not None else ""
    result = RunResult(run_dir, first, final, time.perf_counter() - started, sample)
    written = "metrics, loss.png" if plotted else "metrics"
    _say(
        f"validation loss {result.first_val_loss:.3f} -> {result.final_val_loss:.3f} "
        f"({result.seconds:.0f} s); {written} and checkpoints in {run_dir}"
    )
    if sample:
        _say(f"sample ({cfg.sample_tokens} tokens after the prompt, temperature {cfg.sample_temperature}):")
        _say(sample)
    return result


def _write_config(run: Run, run_dir: Path, step: int, changes: Changes | None) -> None:
    """config.yaml, written whole or not at all; what a resume ``changes`` in it from ``step`` is
    said, and appended to the run's change record."""
    with replacing(run_dir / "config.yaml") as partial:
        dump_spec(run.config.to_dict(), partial)
    if changes:
        record_changes(run_dir, step, changes)
        listed = ", ".join(f"{key} {old!r} -> {new!r}" for key, (old, new) in changes.items())
        _say(f"config.yaml changed from step {step}: {listed} (recorded in {CHANGES_FILE})")


def _compiles(choice: str | bool, model: nn.Module, layout: ParallelConfig) -> bool:
    """``train.compile``: ``auto`` is on where the layout computes on CUDA and the model and layout can
    compile (saying why not when they cannot); ``true`` refuses a model or layout that cannot."""
    if choice is False or (choice == "auto" and mesh_device_type(layout) != "cuda"):
        return False
    try:
        check_compilable(model, layout)
    except ConfigError as err:
        if choice is True:
            raise err.at("train") from None
        if is_first_rank():
            logger.info(f"train.compile=auto runs eager: {err.reason}")
        return False
    return True


def _step_size(run: Run) -> str:
    cfg, task = run.config.train, run.task
    unit = f"x {cfg.seq_len} tokens" if task.sample_unit == "tokens" else task.sample_unit
    accum = f" ({cfg.grad_accum_steps} accumulated micro-batches)" if cfg.grad_accum_steps > 1 else ""
    return f"{cfg.batch_size} {unit}{accum}"


def _sample_model(run: Run, model: nn.Module) -> nn.Module | None:
    """On rank 0, a single-process copy of the trained decoder to sample from (gathering is collective)."""
    full = full_state_dict(model)
    if not is_first_rank():
        return None
    single = build_model(run.config.spec)
    single.load_state_dict(full, strict=True)
    return single


def _dist_summary(dist_dict: dict | None) -> str:
    """A resolved dist dict as ``dp=2 tp=1 pp=1 zero_stage=0``; one process (or None, a plain
    module's save) as ``1 process``."""
    if dist_dict is None:
        return "1 process"
    dp, tp, pp = (dist_dict[f"{k}_parallel_size"] for k in ("data", "tensor", "pipeline"))
    cp = dist_dict.get("context_parallel_size", 1)  # absent from checkpoints saved before it existed
    if dp * cp * tp * pp == 1:
        return "1 process"
    return f"dp={dp} tp={tp} pp={pp} zero_stage={dist_dict['zero_stage']}" + (f" cp={cp}" if cp > 1 else "")


def _missing_parents(run_dir: Path) -> list[Path]:
    """The folders above ``run_dir`` that do not exist yet (``runs/``), innermost first."""
    return [parent for parent in run_dir.absolute().parents if not parent.exists()]


def _remove_if_empty(folders: list[Path]) -> None:
    """Remove the ``folders`` a failed start created (innermost first), where nothing else came into them."""
    for folder in folders:
        with contextlib.suppress(OSError):  # another process wrote into it meanwhile
            folder.rmdir()


def _check_unclaimed(run_dir: Path) -> None:
    """A new run may not write into a folder that already holds one."""
    if (run_dir / "config.yaml").exists() or (run_dir / "checkpoints").exists():
        raise ConfigError(
            f"{str(run_dir)!r} already holds a run; continue it with --resume {run_dir} "
            "or choose another train.out_dir",
            "train.out_dir",
        )


def _sample(model: nn.Module, cfg: TrainConfig, text: TextData) -> str:
    """Text generated after ``cfg.sample_prompt``, or else after the first tokens of the held-out
    data (a quarter window), with the KV cache sliding past ``seq_len``."""
    if cfg.sample_tokens == 0:
        return ""
    if cfg.sample_prompt is not None:
        prompt = text.tokenizer.encode(cfg.sample_prompt)
    else:
        prompt = held_out_prompt(text.val, cfg.seq_len)
    out = sample_ids(
        model,
        prompt,
        cfg.sample_tokens,
        window=cfg.seq_len,
        temperature=cfg.sample_temperature,
        seed=cfg.seed,
    )
    return text.tokenizer.decode(out)


@contextlib.contextmanager
def _flush_denormals(enabled: bool) -> Iterator[None]:
    """Subnormal floats (tiny gradients, Adam's second moments) take a slow microcode path on x86 CPUs;
    flushing them to zero makes CPU steps many times faster at no cost in loss. The switch is
    process-wide, so it is turned back off (torch's default; torch offers no getter) when the loop ends."""
    if not enabled:
        yield
        return
    torch.set_flush_denormal(True)
    try:
        yield
    finally:
        torch.set_flush_denormal(False)


def _say(line: str) -> None:
    """Rank 0 speaks for the run; the other ranks print nothing."""
    if is_first_rank():
        logger.info(line)
