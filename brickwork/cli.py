"""The ``brickwork`` command: ``train``, ``sample``, ``eval``, ``tokenizer train``, ``plan``, ``export``,
``info`` and ``bench``.

A mistake a user can fix (unknown preset, bad override, missing file, world size not matching the
dist dict, a run folder with nothing to resume, a folder it cannot write, a full disk) ends in one
line naming the fix, not a traceback (brickwork/error_report.py); ``--traceback`` shows the full one.
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Sequence

import brickwork
from brickwork.benchmarks.selection import add_selection_arguments
from brickwork.error_report import error_line, speaks
from brickwork.errors import ConfigError, RunFailure
from brickwork.logs import show_messages

USAGE_ERROR = 2
SAMPLE_SEPARATOR = "-" * 15  # between the samples of --num-samples, as nanoGPT's sample.py prints them

TRAIN_EPILOG = """\
examples:
  brickwork train                                   the gpt-tiny preset on the embedded corpus
  brickwork train gpt-tiny train.steps=200 train.lr=1e-3 decoder.num_layers=2
  brickwork train t5-small encoder.num_layers=2 decoder.num_layers=2 train.grad_accum_steps=2
  brickwork train vit image_size=32 patch_size=8 encoder.num_layers=2 train.precision=bf16
  brickwork train my_model.yaml data.path=my.txt train.out_dir=runs/mine
  brickwork train data.path=docs/ data.tokenizer=tokenizer.json      a folder of text files, BPE tokens
  brickwork train data.path=data/shakespeare_char                    a nanoGPT folder (train.bin, meta.pkl)
  brickwork train --resume runs/mine                continue from the newest complete checkpoint
  brickwork train --resume runs/mine train.steps=2000               ... for more steps
  brickwork train --resume runs/mine dist.data_parallel_size=1     ... in one process
  brickwork train --resume runs/mine train.lr=1e-4 train.steps=3000  ... with a new learning rate
  brickwork train train.log_to=[tensorboard,wandb]   metrics.jsonl plus TensorBoard and W&B
  brickwork train --init-from saved/ train.steps=100   fine-tune a save_pretrained folder (or an HF one)
  torchrun --nproc_per_node 2 -m brickwork train dist.tensor_parallel_size=2
"""

PLAN_EPILOG = """\
examples:
  brickwork plan llama3-8b --devices 8xH100-80GB --global-batch 512 --seq-len 8192
  brickwork plan llama3-70b --devices 8xH100-80GB --nodes 16 --global-batch 1024 --seq-len 8192 -o dist.yaml
  brickwork plan llama dim_model=4096 decoder.num_layers=32 --devices 8xA100-80GB --global-batch 256
"""


EVAL_EPILOG = """\
examples:
  brickwork eval runs/mine                          the run's own held-out data
  brickwork eval runs/mine data.path=other.txt train.eval_batches=32
  brickwork eval saved/ --json                      a save_pretrained or HF folder, on the embedded corpus
"""


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--traceback", action="store_true", help="show the full traceback of an error")
    parser = argparse.ArgumentParser(
        prog="brickwork", description="brickwork: build, train and benchmark models."
    )
    parser.add_argument("--version", action="version", version=f"brickwork {brickwork.__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    command = functools.partial(commands.add_parser, parents=[common])  # each takes --traceback

    train = command(
        "train",
        help="train any preset or spec file on small embedded data",
        description="Train a spec-built model on the task its kind implies: a decoder LM (causal LM) or an "
        "encoder with an MLM head (masked LM) on the embedded corpus or a text file, an encoder-decoder on "
        "T5 span corruption of it, an image encoder on a generated image set.",
        epilog=TRAIN_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    train.add_argument(
        "args",
        nargs="*",
        metavar="[SPEC] [key=value ...]",
        help="a preset name or a .yaml/.json spec (default gpt-tiny), then dotted overrides of the model "
        "spec and of the train., data. and dist. sections",
    )
    train.add_argument(
        "--resume",
        metavar="RUN_DIR",
        help="continue a run from its newest complete checkpoint; overrides may change what keeps the "
        "model, the data and the batch: dist.* (another layout), train.steps, the learning rate and its "
        "schedule, the intervals, logging, sampling, train.compile",
    )
    train.add_argument(
        "--accept-data-change",
        action="store_true",
        help="with --resume: go on although the data or tokenizer changed since the run started "
        "(data.json records it); a tokenizer of another size is refused even so",
    )
    train.add_argument(
        "--init-from",
        metavar="PATH",
        help="start from saved weights: a save_pretrained folder, a run folder, an exported .safetensors "
        "file or an HF model folder; without SPEC the run trains that model's spec",
    )
    plan = command(
        "plan",
        help="rank the parallel layouts of a model on a cluster",
        description="Price every valid layout (tensor, pipeline, data, context and expert parallel sizes, "
        "ZeRO stage, schedule, micro-batch size, recomputation) of a decoder LM on a cluster, without "
        "building it: memory per device and step time. Prints the layouts that fit, fastest first, each "
        "with the terms of its step that differ from the best's; -o writes the best one's dist dict.",
        epilog=PLAN_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    plan.add_argument(
        "args",
        nargs="+",
        metavar="SPEC [key=value ...]",
        help="a preset name or a .yaml/.json spec (or run config), then dotted overrides as train takes them",
    )
    plan.add_argument(
        "--devices",
        required=True,
        help="devices per node, e.g. 8xH100-80GB (presets: A100-40GB, A100-80GB, H100-80GB, H200)",
    )
    plan.add_argument("--nodes", type=int, default=1, help="nodes of --devices each (default 1)")
    plan.add_argument(
        "--global-batch", type=int, help="sequences per step (if left out: the spec's train.batch_size, said)"
    )
    plan.add_argument(
        "--seq-len", type=int, help="tokens per sequence (if left out: the spec's train.seq_len, said)"
    )
    plan.add_argument("--precision", default="bf16-mixed", help="the train step's (default bf16-mixed)")
    plan.add_argument("--top", type=int, default=10, help="rows of the table (default 10)")
    plan.add_argument("-o", "--out", help="write the best layout's dist dict here as YAML (default: nothing)")
    sample = command(
        "sample",
        help="generate text from a trained decoder LM",
        description="Continue a prompt with a run's newest checkpoint (or anything else from_pretrained "
        "reads), past the training length: the KV cache slides over the last --window tokens. The same "
        "seed gives the same text.",
    )
    sample.add_argument("source", metavar="RUN_OR_FOLDER", help="a run, checkpoint, export, saved/HF folder")
    sample.add_argument(
        "--prompt",
        help="the text to continue (default: a run's model continues the start of its held-out data, "
        "any other model a newline)",
    )
    sample.add_argument("--num-samples", type=int, default=1, help="samples to draw (default 1)")
    sample.add_argument("--max-new-tokens", type=int, default=200, help="tokens to generate (default 200)")
    sample.add_argument("--temperature", type=float, default=0.8, help="0 is greedy (default 0.8)")
    sample.add_argument("--top-k", type=int, help="draw from the K most likely tokens only")
    sample.add_argument("--seed", type=int, default=0, help="seeds the draw (default 0)")
    sample.add_argument("--window", type=int, help="tokens the model reads at once (default: train.seq_len)")
    sample.add_argument("--tokenizer", help="'bytes' or a tokenizer.json (default: the run's own)")
    evaluation = command(
        "eval",
        help="the validation loss (and perplexity) of a trained model, writing nothing",
        description="Evaluate a run's newest checkpoint (or anything else from_pretrained reads) on the "
        "validation set training uses: train.eval_batches batches of the held-out data of the run, or of "
        "the data that data.* overrides give. Prints one figure a line; nothing is written.",
        epilog=EVAL_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    evaluation.add_argument(
        "source", metavar="RUN_OR_FOLDER", help="a run, checkpoint, export, saved/HF folder"
    )
    evaluation.add_argument(
        "overrides",
        nargs="*",
        metavar="key=value",
        help="data.* (another data set), train.seq_len, train.batch_size, train.eval_batches, "
        "train.device, train.seed",
    )
    evaluation.add_argument("--json", action="store_true", help="print one JSON object instead")
    tokenizer = command("tokenizer", help="train a byte-level BPE tokenizer on your text")
    tokenizer_commands = tokenizer.add_subparsers(dest="tokenizer_command", metavar="ACTION", required=True)
    bpe = tokenizer_commands.add_parser(
        "train",
        parents=[common],
        help="learn a byte-level BPE from text files, offline",
        description="Learn a byte-level BPE (GPT-2's kind: every byte is a symbol, so nothing is unknown) "
        "with the tokenizers library and write it as a tokenizer.json for data.tokenizer.",
    )
    bpe.add_argument("files", nargs="+", metavar="FILES", help="text files to learn from")
    bpe.add_argument(
        "--vocab-size",
        type=int,
        required=True,
        help="ids in all, at least 257; fewer when the text has no more pairs seen --min-frequency times",
    )
    bpe.add_argument("--min-frequency", type=int, default=2, help="merge pairs seen at least this often")
    bpe.add_argument("-o", "--out", default="tokenizer.json", help="file to write (default tokenizer.json)")
    export = command(
        "export",
        help="write a run's newest checkpoint as one single-process safetensors file",
        description="Write the weights of a run's newest complete checkpoint (or of one checkpoint "
        "folder), whatever layout saved it, as one safetensors file that build_model + load_state_dict "
        "accept. The file's metadata holds the model spec (JSON) and the step.",
    )
    export.add_argument(
        "source", metavar="RUN_DIR", help="a run folder or one of its checkpoints/step_* folders"
    )
    export.add_argument("out", metavar="OUT", help="the file to write, ending in .safetensors")
    command("info", help="versions, devices, kernel backends, components and presets")
    bench = command(
        "bench",
        help="kernel benchmarks and a training-step benchmark against HF transformers",
        description="Run the kernel benchmark sweep, then time a training step of GPT-2-small- and "
        "Llama-shaped models built by brickwork against the same models in HF transformers.",
    )
    bench.add_argument("--skip-kernels", action="store_true", help="only the model benchmark")
    add_selection_arguments(bench)
    bench.add_argument("--skip-models", action="store_true", help="only the kernel benchmarks")
    bench.add_argument("--compile", action="store_true", help="also time torch.compile of each model")
    bench.add_argument("--layers", type=int, default=12, help="layers per model (default 12, the full shape)")
    bench.add_argument("--batch", type=int, help="sequences per step (default 1 on CPU, 8 on GPU)")
    bench.add_argument("--seq-len", type=int, help="tokens per sequence (default 128 on CPU, 1024 on GPU)")
    bench.add_argument("--repeats", type=int, default=3, help="timed steps per model (median)")
    bench.add_argument("--out", default="benchmarks/results", help="results folder")
    return parser


def split_spec_and_overrides(args: Sequence[str]) -> tuple[str | None, list[str]]:
    """``["gpt-tiny", "a.b=1"]`` -> ("gpt-tiny", ["a.b=1"]); only the first argument may lack ``=``."""
    spec = None
    overrides = list(args)
    if overrides and "=" not in overrides[0]:
        spec = overrides.pop(0)
    for text in overrides:
        if "=" not in text:
            raise ConfigError(f"expected a dotted key=value override after SPEC, got {text!r}", "overrides")
    return spec, overrides


def run_train(ns: argparse.Namespace) -> int:
    """Train; a run stopped by SIGTERM or SIGUSR1 (saved, its lock released) says so in one line and
    ends with 128 + the signal's number, as a shell reports a process the signal killed."""
    _interpret_triton_on_cpu(ns.args)
    from brickwork.train.preemption import Preempted
    from brickwork.train.trainer import train_new, train_resume

    try:
        if ns.resume:
            if ns.init_from:
                raise ConfigError("a resumed run takes its weights from its own checkpoint", "--init-from")
            train_resume(ns.resume, ns.args, accept_data_change=ns.accept_data_change)
        elif ns.accept_data_change:
            raise ConfigError(
                "a new run has no earlier data to differ from; use it with --resume", "--accept-data-change"
            )
        else:
            train_new(*split_spec_and_overrides(ns.args), init_from=ns.init_from)
    except Preempted as stop:
        if speaks(stop):
            print(f"brickwork train: {stop}", file=sys.stderr)
        return stop.exit_status
    return 0


def _interpret_triton_on_cpu(args: Sequence[str]) -> None:
    """A run on CPU (no GPU here, or train.device=cpu) runs any Triton kernel its spec asks for through
    Triton's interpreter: compiled Triton needs a GPU. The choice must precede triton's import, which
    the trainer's own imports cause, so it is made here (docs/kernels.md)."""
    import torch

    on_cpu = "train.device=cpu" in args or not torch.cuda.is_available()
    if on_cpu and "triton" not in sys.modules:
        from brickwork.kernels import use_triton_interpreter

        use_triton_interpreter()


def run_plan(ns: argparse.Namespace) -> int:
    from pathlib import Path

    import yaml

    from brickwork.blocks import MODELS
    from brickwork.parallel.planner import plan
    from brickwork.plan_report import plan_table
    from brickwork.train.run_config import resolve_run
    from brickwork.train.tasks import kind_task

    for option in ("nodes", "global_batch", "seq_len", "top"):
        value = getattr(ns, option)
        if value is not None and value < 1:
            raise ConfigError(f"must be a positive integer, got {value}", f"--{option.replace('_', '-')}")
    run = resolve_run(*split_spec_and_overrides(ns.args))
    cluster = f"{ns.nodes}x{ns.devices}" if ns.nodes > 1 else ns.devices
    batch, seq_len = ns.global_batch or run.train.batch_size, ns.seq_len or run.train.seq_len
    for flag, given, key, value in (
        ("--global-batch", ns.global_batch, "train.batch_size", batch),
        ("--seq-len", ns.seq_len, "train.seq_len", seq_len),
    ):
        if given is None:
            print(f"assuming {flag} {value} (the spec's {key}); give {flag} for the run you plan")
    kind = run.spec.get("model")  # a kind the factory does not know is the planner's to refuse
    task = kind_task(kind) if kind in MODELS else None
    source, target = task.model_lengths(seq_len) if task else (seq_len, seq_len)
    if task is not None and (source, target) != (seq_len, seq_len):
        print(
            f"its {task.name} task puts {source} source and {target} target tokens a row; "
            "tokens/s counts the source's"
        )
    plans = plan(
        run.spec, cluster, global_batch=batch, seq_len=source, target_len=target, precision=ns.precision
    )
    print(f"{len(plans)} layouts fit on {cluster} for {batch} x {seq_len} tokens per step:\n")
    print(plan_table(plans, ns.top))
    best = plans[0]
    accum = f" train.grad_accum_steps={best.grad_accum_steps}" if best.grad_accum_steps > 1 else ""
    if ns.out is None:
        print(f"best: {best.name}; -o FILE writes its dist dict (train with train.batch_size={batch}{accum})")
        return 0
    Path(ns.out).write_text(yaml.safe_dump({"dist": best.dist}, sort_keys=False))
    print(f"wrote {ns.out}: the dist dict of {best.name}; train it with train.batch_size={batch}{accum}")
    return 0


def run_sample(ns: argparse.Namespace) -> int:
    from brickwork.train.trained_model import sample_text

    names = ("max_new_tokens", "temperature", "top_k", "seed", "window", "num_samples")
    options = {k: getattr(ns, k) for k in names}
    samples = sample_text(ns.source, ns.prompt, tokenizer=ns.tokenizer, **options)
    print(f"\n{SAMPLE_SEPARATOR}\n".join(samples))
    return 0


def run_eval(ns: argparse.Namespace) -> int:
    import dataclasses
    import json

    from brickwork.train.evaluation import evaluate_saved

    result = evaluate_saved(ns.source, ns.overrides)
    if ns.json:
        print(json.dumps(dataclasses.asdict(result)))
        return 0
    print(f"validation loss {result.val_loss:.4f}")
    if result.perplexity is not None:
        print(f"perplexity {result.perplexity:.2f}")
    return 0


def run_tokenizer(ns: argparse.Namespace) -> int:
    from brickwork.data.bpe_training import train_bpe

    tokenizer = train_bpe(ns.files, ns.vocab_size, ns.out, ns.min_frequency)
    print(
        f"wrote {ns.out}: a byte-level BPE of {tokenizer.vocab_size:,} tokens; train on it with "
        f"data.tokenizer={ns.out}"
    )
    return 0


def run_export(ns: argparse.Namespace) -> int:
    from pathlib import Path

    from brickwork.train.checkpoint import export_run

    out = Path(ns.out)
    if out.suffix != ".safetensors":
        raise ConfigError(f"must be a file name ending in .safetensors, got {ns.out!r}", "OUT")
    if out.is_dir():
        raise ConfigError(f"{ns.out!r} is a folder; give the name of the file to write", "OUT")
    source = Path(ns.source)
    if not source.is_dir():
        raise ConfigError(
            f"{ns.source!r} is not a folder; give a run folder or a checkpoint in it", "RUN_DIR"
        )
    folder = export_run(source, out)
    print(f"wrote {out}: the weights of {folder}")
    return 0


def run_info(_: argparse.Namespace) -> int:
    from brickwork.train.environment import environment_report

    print(environment_report())
    return 0


def run_bench(ns: argparse.Namespace) -> int:
    from brickwork.benchmarks import run

    run(
        ns.out,
        kernels=not ns.skip_kernels,
        kernel_selection=ns,
        models=not ns.skip_models,
        compile_too=ns.compile,
        layers=ns.layers,
        batch=ns.batch,
        seq_len=ns.seq_len,
        repeats=ns.repeats,
    )
    return 0


COMMANDS = {
    "train": run_train,
    "sample": run_sample,
    "eval": run_eval,
    "tokenizer": run_tokenizer,
    "plan": run_plan,
    "export": run_export,
    "info": run_info,
    "bench": run_bench,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``brickwork`` script and of ``python -m brickwork``."""
    ns = build_parser().parse_args(argv)
    # What sample and eval print on stdout is the text or the figures alone, so that it can be piped.
    show_messages(sys.stderr if ns.command in ("sample", "eval") else None)
    try:
        return COMMANDS[ns.command](ns)
    except (ConfigError, ValueError, OSError, RunFailure) as err:
        if ns.traceback:
            raise
        if speaks(err):
            print(f"brickwork {ns.command}: error: {error_line(err)}", file=sys.stderr)
        return USAGE_ERROR
    except KeyboardInterrupt:
        print(f"\nbrickwork {ns.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
