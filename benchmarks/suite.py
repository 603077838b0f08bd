"""``brickwork bench``'s work: the kernel sweep, then a training step of whole models against HF.

:func:`run` is the one entry point the command line calls; the scripts it drives (``runner`` for the
kernels, ``model_step`` for the models) stay importable and runnable on their own.
"""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

import torch

from brickwork.errors import ConfigError
from brickwork.extras import missing_package

from .selection import check_selection


def run(
    out: str | Path = "benchmarks/results",
    *,
    kernels: bool = True,
    kernel_selection: argparse.Namespace | None = None,
    models: bool = True,
    compile_too: bool = False,
    layers: int = 12,
    batch: int | None = None,
    seq_len: int | None = None,
    repeats: int = 3,
) -> list[Path]:
    """Run the kernel benchmark sweep (``kernels``), then time a training step of GPT-2-small- and
    Llama-shaped models built by brickwork against the same models in HF transformers (``models``).

    ``kernel_selection`` holds the sweep's flags (selection.py: kernels, providers, dtypes, widths,
    rows, modes, fresh, no_plot, threads), as ``python -m benchmarks`` parses them; None takes the
    device's defaults.

    ``layers`` per model, ``batch`` sequences of ``seq_len`` tokens per step (default 8 x 1024 on a
    GPU, 1 x 128 on CPU), the median of ``repeats`` timed steps; ``compile_too`` also times
    ``torch.compile`` of each model. Results go under ``out``; returns the model benchmark's files.
    """
    for option, value in (("layers", layers), ("batch", batch), ("seq_len", seq_len), ("repeats", repeats)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ConfigError(f"must be a positive integer, got {value}", option)
    if kernel_selection is not None:
        check_selection(kernel_selection)
    if models and importlib.util.find_spec("transformers") is None:
        raise ConfigError(missing_package("transformers", "the model benchmark (it compares with HF)"))
    if kernels:
        from .runner import parse_args, run_kernels

        selection = vars(kernel_selection) if kernel_selection is not None else vars(parse_args([]))
        run_kernels(argparse.Namespace(**{**selection, "out": out}))
    if not models:
        return []
    from . import model_step

    gpu = torch.cuda.is_available()
    batch, seq_len = batch or (8 if gpu else 1), seq_len or (1024 if gpu else 128)
    rows = []
    for case in model_step.CASES:
        print(f"timing a training step of {case.name} ({layers} layers, {batch} x {seq_len} tokens) ...")
        rows += model_step.run_case(case, layers, batch, seq_len, repeats, compile_too)
    print(model_step.markdown_table(rows), end="")
    written = model_step.write_results(rows, Path(out))
    print("wrote " + ", ".join(str(p) for p in written))
    return written
