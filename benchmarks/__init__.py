"""Kernel microbenchmarks: one script per kernel and a runner (``python -m benchmarks``), and the
training-step benchmark of whole models. :func:`run` runs both; it is what ``brickwork bench`` calls.

Each kernel script compares the providers ``brickwork`` (the Triton kernels on GPU, their torch twins on
CPU), ``torch`` (eager), ``torch.compile``, and ``liger`` / ``apex`` where installed, over row widths
and dtypes, for forward, backward and forward+backward. See docs/benchmarks.md.
"""

from __future__ import annotations

from typing import Any

__all__ = ["run"]


def __getattr__(name: str) -> Any:
    # ``run`` is loaded on first use: the ``brickwork`` command line reads the sweep's flags from
    # selection.py when it starts, and must not import torch (and the kernels) for that.
    if name == "run":
        from .suite import run

        return run
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
