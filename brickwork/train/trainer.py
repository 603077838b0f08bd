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
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import torch.distributed as dist

from brickwork.blocks import MODELS
from brickwork.checkpoint import complete_checkpoints, latest_checkpoint
from brickwork.data.sources import TextData
from brickwork.data.task_batches import TaskBatches
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
from brickwork.train.auto_dist import choose_layout, wants_auto
from brickwork.train.checkpoint import load_run_checkpoint
from brickwork.train.distributed import agree_on_rank0, check_world
from brickwork.train.fp8 import convert_for_layout
from brickwork.train.heap import keep_freed_memory
from brickwork.train.init_weights import load_initial_weights, pretrained_base
from brickwork.train.loop import LoopState, run_loop
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
from brickwork.train.run_config import RunConfig, resolve_run
from brickwork.train.run_data import run_data, run_tokenizer
from brickwork.train.run_lock import RunLock
from brickwork.train.step import TrainStep
from brickwork.train.task_spec import task_spec
from brickwork.train.tasks import Task, kind_task
from brickwork.train.threads import apply_cpu_threads
from brickwork.train.trained_model import held_out_prompt
from brickwork.train.triton_backends import check_triton_backends

logger = logging.getLogger(__name__)


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
    run = resolve_run(base, overrides)
    _resolve_auto(run)
    task = _task(run)
    layout = _run_layout(run)
    check_before_writing(run, task, layout)
    check_triton_backends(run)
    with peers_watched(layout.timeout_s):
        run_dir = Path(run.train.out_dir or agree_on_rank0(default_out_dir(run.name), layout))
    made = _missing_parents(run_dir)
    try:
        with RunLock(run_dir, "train.out_dir") as lock, peers_watched(layout.timeout_s, run_dir):
            try:
                return _train(run, layout, run_dir, resume=False)
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
    config = folder / "config.yaml"
    if not config.is_file():
        raise ConfigError(f"{run_dir!r} is not a run folder: it has no config.yaml", "--resume")
    overrides = list(overrides or [])
    check_resume_overrides(overrides)
    saved_steps = complete_checkpoints(folder)
    step = saved_steps[-1][0] if saved_steps else 0
    run = resolve_run(str(config), overrides)
    _resolve_auto(run)
    if run.train.steps < step:
        raise ConfigError(
            f"{run.train.steps} is below step {step} of the newest checkpoint; a resumed run can only go on",
            "train.steps",
        )
    changes = config_changes(load_spec(config), run.to_dict())
    try:
        layout = _run_layout(run)
    except ConfigError as err:
        raise ConfigError(
            f"{err.reason}; or continue under another layout with dist.* overrides after --resume "
            f"{run_dir}, e.g. dist.data_parallel_size=1",
            err.path,
        ) from None
    check_before_writing(run, _task(run), layout, resumed=True)
    check_triton_backends(run)
    with RunLock(folder), peers_watched(layout.timeout_s, folder):
        return _train(
            run, layout, folder, resume=True, changes=changes, accept_data_change=accept_data_change
        )


def _resolve_auto(run: RunConfig) -> None:
    """``dist: auto``: the planner's layout for the launched world, recorded in config.yaml."""
    if wants_auto(run.dist):
        task = _task(run)
        tokenizer = run_tokenizer(run) if task.uses_tokenizer else None
        run.dist = choose_layout(task_spec(run, task, tokenizer, quiet=True), run.dist, run.train)


def default_out_dir(name: str) -> str:
    return os.path.join("runs", f"{name}-{time.strftime('%Y%m%d-%H%M%S')}")


def _train(
    run: RunConfig,
    config: ParallelConfig,
    run_dir: Path,
    resume: bool,
    changes: dict[str, list] | None = None,
    accept_data_change: bool = False,
) -> RunResult:
    cfg = run.train
    started = time.perf_counter()
    threads = apply_cpu_threads()
    task = _task(run)
    # Every process decides about the folder before any of them writes to it (the token cache first).
    # A resumed run that stopped before its first checkpoint starts again from step 0, in place.
    checkpoint = latest_checkpoint(run_dir, intact=True) if resume and complete_checkpoints(run_dir) else None
    if not resume:
        _check_unclaimed(run_dir)
    resumed_at = None if checkpoint is None else checkpoint[0]
    text, data_identity = run_data(run, task, config, run_dir, resumed_at, accept_data_change)
    tokenizer = text.tokenizer if text is not None else None
    torch.manual_seed(cfg.seed)
    model = build_model(task_spec(run, task, tokenizer))
    if cfg.init_from is not None and checkpoint is None:
        load_initial_weights(model, cfg.init_from)
    run.spec = model.spec
    params = sum(p.numel() for p in model.parameters())
    fp8 = []
    if cfg.precision == "fp8":
        # torchao swaps the linears before tensor parallel, compilation and FSDP wrap them.
        fp8 = convert_for_layout(model, cfg.fp8_recipe, cfg.fp8_min_features, config)
    model = parallelize(model, config, compile=_compiles(run.train.compile, model, config))
    layout = parallel_state(model)
    is_main = dist.get_rank() == 0
    say = logger.info if is_main else _quiet
    # Every rank has checked the run folder before rank 0 writes into it.
    dist.barrier()

    batches, val_batches, source = _data(run, task, text)
    optimizer = build_optimizer(model, cfg)
    step = TrainStep(
        model,
        optimizer,
        task,
        grad_accum_steps=cfg.grad_accum_steps,
        precision=cfg.precision,
        grad_clip=cfg.grad_clip if cfg.grad_clip > 0 else None,
    )
    state = LoopState(0, batches, val_batches)
    log = MetricsLog(run_dir / "metrics.jsonl")
    if resume and is_main:
        for name in remove_unfinished(run_dir):
            say(f"removed checkpoints/{name}: a save or a deletion of it was cut off before it finished")
    if checkpoint is not None:
        state.step, folder = checkpoint
        for line in [*check_resume(folder, run.spec, config_to_dict(cfg)), *data_identity.notes]:
            say(line)
        meta, data_state, state.val_loss = load_run_checkpoint(folder, model, optimizer, step)
        batches.load_state_dict(data_state)
        say(f"resuming {run_dir} from step {state.step} of {cfg.steps}")
        saved, now = _layout(meta["dist"]), _layout(run.dist)
        if saved != now:
            say(f"the checkpoint was saved as {saved}; continuing as {now}")
        if is_main:
            torn = log.truncate_after(state.step)
            if torn is not None:
                say(f"{log.path}: dropped its last line, cut off by a crash mid-write: {torn[:60]!r}")
            data_identity.save(run_dir)
            if changes:
                # The run goes on under the new settings; a later --resume keeps them.
                with replacing(run_dir / "config.yaml") as partial:
                    dump_spec(run.to_dict(), partial)
                _record(run_dir, state.step, changes, say)
    else:
        if is_main:
            run_dir.mkdir(parents=True, exist_ok=True)
            if resume:
                say(f"{run_dir} has no checkpoint yet: it starts again from step 0")
                log.truncate_after(-1)  # its curve is drawn again from the start
            data_identity.save(run_dir)  # before config.yaml, which marks the folder as a run's
            with replacing(run_dir / "config.yaml") as partial:
                dump_spec(run.to_dict(), partial)
            if changes:
                _record(run_dir, 0, changes, say)
        say(f"run folder {run_dir}")
    say(f"model {run.name}: {params:,} parameters, task {task.name}; data: {source}")
    cpu = f", {threads.threads} CPU threads per process" if layout.device.type == "cpu" else ""
    say(f"{cfg.steps} steps of {_step_size(run, task)} on {_describe(layout, cfg.precision)}{cpu}")
    if fp8:
        say(f"fp8 ({cfg.fp8_recipe or 'tensorwise'}): {len(fp8)} linears in float8, the rest in bf16")

    title = f"{run.name}: {run_dir.name}"
    if layout.device.type == "cpu":
        keep_freed_memory()
    with _flush_denormals(layout.device.type == "cpu"):
        final = run_loop(
            model,
            step,
            task,
            optimizer,
            cfg,
            state,
            run_dir,
            title,
            is_main,
        )
    sample_model = _sample_model(run, model) if task.samples_text else None
    dist.barrier()
    dist.destroy_process_group()
    if not is_main:
        return RunResult(run_dir, math.nan, final, time.perf_counter() - started, "")
    records = log.read()
    plotted = plot_losses(records, run_dir / "loss.png", title)
    if not plotted:
        say(f"no loss.png: {missing_package('matplotlib', 'drawing it')}")
    first = next((r["val_loss"] for r in records if r.get("val_loss") is not None), math.nan)
    sample = _sample(sample_model, cfg, text) if sample_model is not None else ""
    result = RunResult(run_dir, first, final, time.perf_counter() - started, sample)
    written = "metrics, loss.png" if plotted else "metrics"
    say(
        f"validation loss {result.first_val_loss:.3f} -> {result.final_val_loss:.3f} "
        f"({result.seconds:.0f} s); {written} and checkpoints in {run_dir}"
    )
    if sample:
        say(f"sample ({cfg.sample_tokens} tokens after the prompt, temperature {cfg.sample_temperature}):")
        say(sample)
    return result


def _record(run_dir: Path, step: int, changes: dict[str, list], say) -> None:
    """Say what a resume changed in config.yaml, and append it to the run's change record."""
    record_changes(run_dir, step, changes)
    listed = ", ".join(f"{key} {old!r} -> {new!r}" for key, (old, new) in changes.items())
    say(f"config.yaml changed from step {step}: {listed} (recorded in {CHANGES_FILE})")


def _task(run: RunConfig) -> Task:
    """The task the spec's model kind trains on (``MODELS[kind].task``), with the data made for it."""
    kind = run.spec.get("model")
    if kind not in MODELS:
        raise ConfigError(f"brickwork train has no task for model {kind!r}", "model", choices=MODELS)
    MODELS[kind].check_trainable(run.spec)
    return kind_task(kind)


def _run_layout(run: RunConfig) -> ParallelConfig:
    """The run's one layout, resolved once the world and ``dist: auto`` are known and handed to every
    later step (the checks, the data, the process group, ``parallelize``): the dist dict checked
    against the processes launched, with the device from ``train.device`` and FSDP's bf16 policy for
    ``train.precision=bf16-mixed`` (and fp8) under ZeRO-2/3. ``run.dist`` becomes the dist dict
    config.yaml records, written from the checked layout before those two train settings join it."""
    config = check_world(run.dist)
    run.dist = config.to_dict()
    train_settings: dict[str, str] = {}
    if run.train.device != "auto":
        train_settings["device_type"] = run.train.device
    if run.train.precision in ("bf16-mixed", "fp8") and config.zero_stage >= 2:
        train_settings["mixed_precision"] = "bf16"
    return replace(config, **train_settings) if train_settings else config


def _compiles(choice: str | bool, model: torch.nn.Module, config: ParallelConfig) -> bool:
    """``train.compile``: ``auto`` is on where the layout computes on CUDA and the model and layout can
    compile (saying why not when they cannot); ``true`` refuses a model or layout that cannot."""
    if choice is False or (choice == "auto" and mesh_device_type(config) != "cuda"):
        return False
    try:
        check_compilable(model, config)
    except ConfigError as err:
        if choice is True:
            raise err.at("train") from None
        if is_first_rank():
            logger.info(f"train.compile=auto runs eager: {err.reason}")
        return False
    return True


def _data(run: RunConfig, task: Task, text: TextData | None) -> tuple[TaskBatches, list[dict], str]:
    """(training batches, validation batches, where the data comes from) for ``task``."""
    val = task.validation_batches(run, text)
    return task.train_batches(run, text), val, task.describe_data(run, text)


def _step_size(run: RunConfig, task: Task) -> str:
    cfg = run.train
    unit = f"x {cfg.seq_len} tokens" if task.sample_unit == "tokens" else task.sample_unit
    accum = f" ({cfg.grad_accum_steps} accumulated micro-batches)" if cfg.grad_accum_steps > 1 else ""
    return f"{cfg.batch_size} {unit}{accum}"


def _describe(layout, precision: str) -> str:
    c = layout.config
    where = f"{layout.device.type}" + (f", {precision}" if precision != "fp32" else "")
    if dist.get_world_size() == 1:
        return f"1 process, {where}"
    return (
        f"{dist.get_world_size()} processes ({where}): dp={c.data_parallel_size} "
        f"tp={c.tensor_parallel_size} pp={c.pipeline_parallel_size} zero_stage={c.zero_stage}"
        + (f" cp={c.context_parallel_size}" if c.context_parallel_size > 1 else "")
    )


def _sample_model(run: RunConfig, model: torch.nn.Module) -> torch.nn.Module | None:
    """On rank 0, a single-process copy of the trained decoder to sample from (gathering is collective)."""
    full = full_state_dict(model)
    if dist.get_rank() != 0:
        return None
    single = build_model(run.spec)
    single.load_state_dict(full, strict=True)
    return single


def _layout(dist_dict: dict | None) -> str:
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


def _sample(model: torch.nn.Module, cfg, text: TextData) -> str:
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


def _quiet(*_: object) -> None:
    """Non-main ranks print nothing."""
