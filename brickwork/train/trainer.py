"""``brickwork train``: set up a run (model, data, optimizer, run folder), train it, sample from it.

A new run writes ``config.yaml`` first; a resumed run reads it back, loads the newest complete
checkpoint and continues, so its loss curve is the one the uninterrupted run would have drawn.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from brickwork.data import ByteTokenizer, RandomWindows, fixed_windows, read_corpus, split_tokens
from brickwork.errors import ConfigError
from brickwork.factory import build_model, dump_spec, load_spec
from brickwork.factory.convert import config_to_dict
from brickwork.train.checkpoint import latest_checkpoint, load_run_checkpoint
from brickwork.train.distributed import agree_on_rank0, check_world, make_engine, resolve_dist
from brickwork.train.loop import LoopState, run_loop
from brickwork.train.metrics import MetricsLog, plot_losses
from brickwork.train.optim import build_optimizer
from brickwork.train.resume_check import check_resume
from brickwork.train.run_config import RunConfig, resolve_run
from brickwork.train.run_lock import RunLock

TOKENIZER = ByteTokenizer()


@dataclass
class RunResult:
    """What a finished run reports: where it lives, its first and last validation loss, its sample."""

    run_dir: Path
    first_val_loss: float
    final_val_loss: float
    seconds: float
    sample: str


def train_new(spec_arg: str | None, overrides: list[str]) -> RunResult:
    """Start a run from a preset or spec file with dotted overrides."""
    run = resolve_run(spec_arg, overrides)
    check_world(run.dist)
    run_dir = Path(run.train.out_dir or agree_on_rank0(default_out_dir(run.name), run.dist))
    with RunLock(run_dir, "train.out_dir"):
        return _train(run, run_dir, resume=False)


def train_resume(run_dir: str, dist_overrides: list[str] | None = None) -> RunResult:
    """Continue the run in ``run_dir`` from its newest complete checkpoint.

    ``dist_overrides`` (``dist.*`` only) continue it under another layout; config.yaml then records
    the new dist dict.
    """
    folder = Path(run_dir)
    config = folder / "config.yaml"
    if not config.is_file():
        raise ConfigError(f"{run_dir!r} is not a run folder: it has no config.yaml", "--resume")
    overrides = list(dist_overrides or [])
    for text in overrides:
        if not text.startswith("dist."):
            raise ConfigError(
                "a resumed run continues exactly as its config.yaml says; give no SPEC or overrides "
                f"other than dist.* ones (the layout to continue under), got {text!r}",
                "--resume",
            )
    latest_checkpoint(folder)
    run = resolve_run(str(config), overrides)
    relayout = run.dist != (load_spec(config).get("dist") or {})
    try:
        check_world(run.dist)
    except ConfigError as err:
        raise ConfigError(
            f"{err.reason}; or continue under another layout with dist.* overrides after --resume "
            f"{run_dir}, e.g. dist.data_parallel_size=1",
            err.path,
        ) from None
    with RunLock(folder):
        return _train(run, folder, resume=True, relayout=relayout)


def default_out_dir(name: str) -> str:
    return os.path.join("runs", f"{name}-{time.strftime('%Y%m%d-%H%M%S')}")


def _train(run: RunConfig, run_dir: Path, resume: bool, relayout: bool = False) -> RunResult:
    cfg = run.train
    started = time.perf_counter()
    data, source = read_corpus(run.data.path)
    train_tokens, val_tokens = split_tokens(TOKENIZER.encode(data), run.data.val_fraction, cfg.seq_len)
    kind = run.spec.get("model")
    if kind != "decoder_lm":
        raise ConfigError(
            f"brickwork train trains decoder_lm models, got {kind!r}", "model", choices=["decoder_lm"]
        )
    torch.manual_seed(cfg.seed)
    model = build_model(_byte_vocab(run))
    run.spec = model.spec
    _check_fits(run)
    check_world(run.dist)
    run.dist = resolve_dist(run.dist)
    # Every process decides about the folder before any of them writes to it.
    checkpoint = latest_checkpoint(run_dir, intact=True) if resume else None
    if checkpoint is None:
        _check_unclaimed(run_dir)
    params = sum(p.numel() for p in model.parameters())
    engine = make_engine(model, run)
    say = print if engine.is_main else _quiet

    batches = RandomWindows(train_tokens, cfg.batch_size, cfg.seq_len, seed=cfg.seed)
    val_inputs, val_labels = fixed_windows(val_tokens, cfg.eval_batches * cfg.batch_size, cfg.seq_len)
    optimizer = build_optimizer(engine.parameters(), cfg)
    state = LoopState(0, batches, val_inputs, val_labels)
    log = MetricsLog(run_dir / "metrics.jsonl")
    if checkpoint is not None:
        state.step, folder = checkpoint
        for line in check_resume(folder, run.spec, config_to_dict(cfg)):
            say(line)
        meta, data_state, state.val_loss = load_run_checkpoint(folder, engine.checkpoint_model, optimizer)
        batches.load_state_dict(data_state)
        say(f"resuming {run_dir} from step {state.step} of {cfg.steps}")
        saved, now = _layout(meta["dist"]), _layout(run.dist)
        if saved != now:
            say(f"the checkpoint was saved as {saved}; continuing as {now}")
        if engine.is_main:
            log.truncate_after(state.step)
            if relayout:
                # The run goes on under the new dist dict; a later --resume with no overrides keeps it.
                dump_spec(run.to_dict(), run_dir / "config.yaml")
    else:
        if engine.is_main:
            run_dir.mkdir(parents=True, exist_ok=True)
            dump_spec(run.to_dict(), run_dir / "config.yaml")
        say(f"run folder {run_dir}")
    say(f"model {run.name}: {params:,} parameters; data: {source}, {val_tokens.numel():,} bytes held out")
    say(f"{cfg.steps} steps of {cfg.batch_size} x {cfg.seq_len} tokens on {engine.describe()}")

    title = f"{run.name}: {run_dir.name}"
    final = run_loop(engine, optimizer, cfg, state, run_dir, title)
    sample_model = engine.sample_model()
    engine.close()
    if not engine.is_main:
        return RunResult(run_dir, math.nan, final, time.perf_counter() - started, "")
    records = log.read()
    plotted = plot_losses(records, run_dir / "loss.png", title)
    if not plotted:
        say("no loss.png: drawing it needs matplotlib (pip install 'brickwork[bench]')")
    first = next((r["val_loss"] for r in records if r.get("val_loss") is not None), math.nan)
    sample = _sample(sample_model, cfg)
    result = RunResult(run_dir, first, final, time.perf_counter() - started, sample)
    written = "metrics, loss.png" if plotted else "metrics"
    say(
        f"validation loss {result.first_val_loss:.3f} -> {result.final_val_loss:.3f} "
        f"({result.seconds:.0f} s); {written} and checkpoints in {run_dir}"
    )
    if sample:
        say(f"sample ({cfg.sample_tokens} bytes, KV-cache decoding, temperature {cfg.sample_temperature}):")
        say(sample)
    return result


def _layout(dist_dict: dict | None) -> str:
    """A resolved dist dict as ``dp=2 tp=1 pp=1 zero_stage=0``; one process (or None, a plain
    module's save) as ``1 process``."""
    if dist_dict is None:
        return "1 process"
    dp, tp, pp = (dist_dict[f"{k}_parallel_size"] for k in ("data", "tensor", "pipeline"))
    if dp * tp * pp == 1:
        return "1 process"
    return f"dp={dp} tp={tp} pp={pp} zero_stage={dist_dict['zero_stage']}"


def _byte_vocab(run: RunConfig) -> dict:
    """The spec with ``vocab_size`` set to the byte-level tokenizer's 256 ids, saying so if it changes."""
    spec = dict(run.spec)
    vocab = spec.get("vocab_size")
    if vocab != TOKENIZER.vocab_size:
        if vocab is not None and int(os.environ.get("RANK", "0")) == 0:
            print(f"vocab_size {vocab} -> {TOKENIZER.vocab_size}: the training data is byte-level")
        spec["vocab_size"] = TOKENIZER.vocab_size
    return spec


def _check_fits(run: RunConfig) -> None:
    """The model's positions must cover the training and sampling lengths."""
    limit = run.spec.get("max_seq_len")
    cfg = run.train
    if limit is not None and cfg.seq_len > limit:
        raise ConfigError(
            f"{cfg.seq_len} is longer than max_seq_len={limit}; lower it or raise max_seq_len",
            "train.seq_len",
        )
    prompt = len(TOKENIZER.encode(cfg.sample_prompt))
    room = max(0, cfg.seq_len - prompt)
    if cfg.sample_tokens > room:
        raise ConfigError(
            f"{cfg.sample_tokens} bytes after the {prompt}-byte train.sample_prompt reach past the "
            f"train.seq_len={cfg.seq_len} positions the model learns; use at most {room}",
            "train.sample_tokens",
        )


def _check_unclaimed(run_dir: Path) -> None:
    """A new run may not write into a folder that already holds one."""
    if (run_dir / "config.yaml").exists() or (run_dir / "checkpoints").exists():
        raise ConfigError(
            f"{str(run_dir)!r} already holds a run; continue it with --resume {run_dir} "
            "or choose another train.out_dir",
            "train.out_dir",
        )


@torch.no_grad()
def _sample(model: torch.nn.Module, cfg) -> str:
    """Text generated after ``cfg.sample_prompt`` with the model's KV-cache ``generate``."""
    if cfg.sample_tokens == 0:
        return ""
    model.eval()
    device = next(model.parameters()).device
    prompt = TOKENIZER.encode(cfg.sample_prompt)[None].to(device)
    generator = torch.Generator(device=device).manual_seed(cfg.seed)
    out = model.generate(prompt, cfg.sample_tokens, temperature=cfg.sample_temperature, generator=generator)
    return TOKENIZER.decode(out[0].cpu())


def _quiet(*_: object) -> None:
    """Non-main ranks print nothing."""
