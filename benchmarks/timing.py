"""Timing: ``triton.testing.do_bench`` on GPU, a wall-clock loop on CPU; and the copy bandwidth."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence

import torch

QUANTILES = (0.5, 0.2, 0.8)


def _clear_grads(leaves: Sequence[torch.Tensor]) -> None:
    for t in leaves:
        t.grad = None


def time_ms(
    fn: Callable[[], object], device: torch.device, grad_to_none: Sequence[torch.Tensor] = ()
) -> tuple[float, float, float]:
    """(median, 20th, 80th percentile) milliseconds of ``fn()``; ``grad_to_none`` are reset before each call.

    On CUDA this is ``triton.testing.do_bench`` (which also flushes the L2 cache between calls). On CPU
    it runs ``fn`` twice to warm up, then at least 5 and at most 100 times within about 0.3 s.
    """
    if device.type == "cuda":
        from triton.testing import do_bench

        median, low, high = do_bench(fn, quantiles=list(QUANTILES), grad_to_none=list(grad_to_none))
        return median, low, high
    for _ in range(2):
        _clear_grads(grad_to_none)
        fn()
    samples: list[float] = []
    deadline = time.perf_counter() + 0.3
    while len(samples) < 5 or (len(samples) < 100 and time.perf_counter() < deadline):
        _clear_grads(grad_to_none)
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e3)
    deciles = statistics.quantiles(samples, n=10, method="inclusive")
    return statistics.median(samples), deciles[1], deciles[7]


def mode_step(
    fn: Callable[..., torch.Tensor], inputs: list, mode: str
) -> tuple[Callable[[], object], list[torch.Tensor]]:
    """(what to time, leaves whose grads to reset) for one mode.

    forward runs ``fn`` with autograd recording, as in training; backward replays one recorded graph
    (``retain_graph``); forward+backward records and runs a new graph each call.
    """
    leaves = [t for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad]
    if mode == "forward":
        return (lambda: fn(*inputs)), leaves
    if mode == "backward":
        y = fn(*inputs)
        dy = torch.randn_like(y)
        return (lambda: y.backward(dy, retain_graph=True)), leaves
    if mode == "forward+backward":
        dy = torch.randn_like(fn(*inputs))
        return (lambda: fn(*inputs).backward(dy)), leaves
    raise ValueError(f"unknown mode {mode!r}; expected forward, backward or forward+backward")


def copy_bandwidth_gbps(device: torch.device, nbytes: int | None = None) -> float:
    """Device memory bandwidth in GB/s from a large device-to-device copy (bytes read + bytes written).

    1 GiB on CUDA, far beyond any L2 cache; 256 MiB on CPU.
    """
    nbytes = nbytes or (2**30 if device.type == "cuda" else 2**28)
    src = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    median_ms = time_ms(lambda: dst.copy_(src), device)[0]
    return 2 * nbytes / (median_ms * 1e-3) / 1e9
