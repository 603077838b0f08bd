"""What a kernel benchmark declares: its inputs, its providers, the bytes it must move, its targets."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

# Traffic of a kernel that maps one [rows, width] tensor to another: forward reads x and writes y (2),
# backward reads x (or y) and dy and writes dx (3).
ROW_TRAFFIC = {"forward": 2, "backward": 3, "forward+backward": 5}

# A provider builder takes the device and returns the function to time, or None where it is unavailable.
ProviderBuilder = Callable[[torch.device], Callable[..., torch.Tensor] | None]


@dataclass(frozen=True)
class Target:
    """A bandwidth target: ``mode`` reaches ``fraction`` of the measured copy bandwidth on these widths."""

    mode: str
    fraction: float
    min_width: int = 1024
    max_width: int = 65536

    def covers(self, mode: str, width: int) -> bool:
        return mode == self.mode and self.min_width <= width <= self.max_width


@dataclass(frozen=True)
class KernelBench:
    """One kernel's benchmark.

    ``make_inputs(rows, width, dtype, device)`` returns the positional args of every provider; the
    tensors among them that require grad are the leaves whose gradients the backward modes produce.
    ``bytes_per_element`` gives, per mode, the minimal traffic in units of one element of the input
    dtype per input element (forward reads x and writes y: 2), ignoring O(width) parameters.
    """

    name: str
    make_inputs: Callable[[int, int, torch.dtype, torch.device], list]
    providers: dict[str, ProviderBuilder]
    bytes_per_element: dict[str, int]
    targets: tuple[Target, ...] = field(default_factory=tuple)
    summary: str = ""

    def bytes_moved(self, mode: str, rows: int, width: int, dtype: torch.dtype) -> int:
        return self.bytes_per_element[mode] * rows * width * torch.tensor([], dtype=dtype).element_size()


def row_inputs(vectors: int) -> Callable[[int, int, torch.dtype, torch.device], list[torch.Tensor]]:
    """``make_inputs`` of a row kernel: x ``[rows, width]``, then ``vectors`` tensors ``[width]`` (its
    weight, bias), drawn in that order from a standard normal, all requiring grad."""

    def make(rows: int, width: int, dtype: torch.dtype, device: torch.device) -> list[torch.Tensor]:
        shapes = [(rows, width)] + [(width,)] * vectors
        return [torch.randn(shape, dtype=dtype, device=device, requires_grad=True) for shape in shapes]

    return make


def optional_function(module: str, name: str, device: torch.device) -> Callable[..., torch.Tensor] | None:
    """``module.name`` from a CUDA-only package (liger-kernel, apex) if installed and on CUDA, else None."""
    if device.type != "cuda":
        return None
    try:
        return getattr(importlib.import_module(module), name, None)
    except ImportError:
        return None


def eager_provider(eager: Callable[..., torch.Tensor]) -> ProviderBuilder:
    """A provider that is the same function on every device."""
    return lambda device: eager


def compiled(eager: Callable[..., torch.Tensor]) -> ProviderBuilder:
    """The ``torch.compile`` provider: the eager torch function, compiled for this case alone.

    Dynamo's caches are reset first, so each (shape, dtype) is compiled from scratch and never hits the
    recompilation limit, which would silently fall back to eager.
    """

    def build(device: torch.device) -> Callable[..., torch.Tensor]:
        torch.compiler.reset()
        return torch.compile(eager, fullgraph=True)

    return build
