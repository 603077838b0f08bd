"""Kernel microbenchmarks: one script per kernel and a runner (``python -m benchmarks``), and the
training-step benchmark of whole models. :func:`run` runs both; it is what ``brickwork bench`` calls.

Each kernel script compares the providers ``brickwork`` (the Triton kernels on GPU, their torch twins on
CPU), ``torch`` (eager), ``torch.compile``, and ``liger`` / ``apex`` where installed, over row widths
and dtypes, for forward, backward and forward+backward. See docs/benchmarks.md.
"""

from .suite import run

__all__ = ["run"]
