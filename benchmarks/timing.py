"""Timing: device time and host time apart on GPU, a wall-clock loop on CPU; and the copy bandwidth."""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch


def _clear_grads(leaves: Sequence[torch.Tensor]) -> None:
    for t in leaves:
        t.grad = None


class Timing(NamedTuple):
    """One case's times in milliseconds.

    ``ms`` (with its 20th and 80th percentiles) is device time on CUDA, wall time on CPU. ``host_ms``
    is, on CUDA, the median time the host takes to enqueue one call while the GPU is still busy with
    earlier work; on CPU it is None, since everything there is host time.
    """

    ms: float
    ms_p20: float
    ms_p80: float
    host_ms: float | None


# Zeroed before each timed call on CUDA: larger than any current GPU's L2 cache, so nothing stays cached.
L2_FLUSH_BYTES = 256 * 2**20


@functools.cache
def _sleep_cycles_per_ms(device_index: int) -> float:
    """GPU clock cycles that ``torch.cuda._sleep`` spins per millisecond on this device, measured."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(1_000_000)
    start.record()
    torch.cuda._sleep(20_000_000)
    end.record()
    torch.cuda.synchronize()
    return 20_000_000 / start.elapsed_time(end)


def _gpu_timing(fn: Callable[[], object], grad_to_none: Sequence[torch.Tensor], budget_ms: float) -> Timing:
    """Device and host time of ``fn`` on the current CUDA device (see :func:`time_case`)."""
    flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.int8, device="cuda")
    for _ in range(3):
        _clear_grads(grad_to_none)
        fn()
    torch.cuda.synchronize()
    begin = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    wall_ms = (time.perf_counter() - begin) * 1e3
    # Busy for twice a whole call's wall time, which bounds its host time: the enqueue ends first.
    busy_cycles = int(_sleep_cycles_per_ms(torch.cuda.current_device()) * max(2 * wall_ms, 0.05))
    repeats = max(10, min(200, int(budget_ms / (3 * wall_ms + 0.1))))
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    device_ms, host_ms = [], []
    for _ in range(repeats):
        _clear_grads(grad_to_none)
        flush.zero_()
        torch.cuda._sleep(busy_cycles)
        start.record()
        host_start = time.perf_counter()
        fn()
        host_ms.append((time.perf_counter() - host_start) * 1e3)
        end.record()
        torch.cuda.synchronize()
        device_ms.append(start.elapsed_time(end))
    low, high = _percentiles(device_ms)
    return Timing(statistics.median(device_ms), low, high, statistics.median(host_ms))


def _percentiles(samples: list[float]) -> tuple[float, float]:
    deciles = statistics.quantiles(samples, n=10, method="inclusive")
    return deciles[1], deciles[7]


def time_case(
    fn: Callable[[], object],
    device: torch.device,
    grad_to_none: Sequence[torch.Tensor] = (),
    budget_ms: float = 300.0,
) -> Timing:
    """Time ``fn()``; ``grad_to_none`` are reset before each call (outside the timed part).

    On CUDA, before each call a 256 MiB buffer is zeroed (flushing L2) and ``torch.cuda._sleep``
    keeps the GPU busy for twice the call's wall time. The host enqueues the call between two CUDA
    events while the GPU is still sleeping, so the events time GPU work alone (device time), and a
    host clock around the enqueue times the host alone (host time). On CPU it runs ``fn`` twice to
    warm up, then at least 5 and at most 100 times within about ``budget_ms``.
    """
    if device.type == "cuda":
        return _gpu_timing(fn, grad_to_none, budget_ms)
    for _ in range(2):
        _clear_grads(grad_to_none)
        fn()
    samples: list[float] = []
    deadline = time.perf_counter() + budget_ms * 1e-3
    while len(samples) < 5 or (len(samples) < 100 and time.perf_counter() < deadline):
        _clear_grads(grad_to_none)
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e3)
    low, high = _percentiles(samples)
    return Timing(statistics.median(samples), low, high, None)


def time_ms(
    fn: Callable[[], object], device: torch.device, grad_to_none: Sequence[torch.Tensor] = ()
) -> tuple[float, float, float]:
    """(median, 20th, 80th percentile) milliseconds of ``fn()``: device time on CUDA, wall time on CPU."""
    return time_case(fn, device, grad_to_none)[:3]


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
