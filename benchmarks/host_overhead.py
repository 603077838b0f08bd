"""Host cost of the Python layers around a Triton launch: the public function with the launch a no-op.

``python -m benchmarks.host_overhead`` times each public kernel function (``backend="triton"``) with
the kernel launch itself replaced by a function that returns at once, so what remains is argument
checks, launch-parameter choice, output allocation, autograd and dispatch: the host work brickwork
adds around a launch. It runs on CPU tensors through Triton's interpreter, where only the launch
differs from a GPU run. The same figures on a GPU, with the real launch, come from ``torch.profiler``
(see docs/kernels.md).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import torch

from brickwork import kernels


@contextmanager
def launches_are_noops() -> Iterator[None]:
    """Within this block every Triton kernel launch returns at once without running the kernel."""
    from triton.runtime.interpreter import InterpretedFunction

    if not hasattr(InterpretedFunction, "run"):
        raise RuntimeError("needs Triton's interpreter: call kernels.use_triton_interpreter() first")
    original = InterpretedFunction.run
    InterpretedFunction.run = lambda self, *args, **kwargs: None
    try:
        yield
    finally:
        InterpretedFunction.run = original


def _cases(rows: int, width: int) -> dict[str, tuple[Callable[..., torch.Tensor], list[torch.Tensor]]]:
    x = torch.randn(rows, width, requires_grad=True)
    w = torch.randn(width, requires_grad=True)
    b = torch.randn(width, requires_grad=True)
    scores = torch.randn(2, 4, rows // 8, width, requires_grad=True)
    mask = torch.ones(rows // 8, width, dtype=torch.bool)
    return {
        "layer_norm": (lambda x, w, b: kernels.layer_norm(x, w, b, backend="triton"), [x, w, b]),
        "rms_norm": (lambda x, w: kernels.rms_norm(x, w, backend="triton"), [x, w]),
        "bias_gelu": (lambda x, b: kernels.bias_gelu(x, b, backend="triton"), [x, b]),
        "bias_gelu_dropout": (
            lambda x, b: kernels.bias_gelu_dropout(x, b, 0.1, 7, backend="triton"),
            [x, b],
        ),
        "masked_softmax": (
            lambda s, m: kernels.masked_softmax(s, m, 0.125, backend="triton"),
            [scores, mask],
        ),
    }


def _median_us(fn: Callable[[], object], repeats: int) -> float:
    for _ in range(20):
        fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e6)
    return statistics.median(samples)


def measure(rows: int = 64, width: int = 256, repeats: int = 300) -> list[dict]:
    """Per kernel: median host microseconds of a no-grad forward, and of forward + backward."""
    results = []
    with launches_are_noops():
        for name, (fn, args) in _cases(rows, width).items():
            with torch.no_grad():
                forward = _median_us(lambda fn=fn, args=args: fn(*args), repeats)
            leaves = [a for a in args if a.requires_grad]

            def train_step(fn=fn, args=args, leaves=leaves) -> None:
                out = fn(*args)
                torch.autograd.grad(out, leaves, torch.ones_like(out))

            both = _median_us(train_step, repeats)
            results.append({"kernel": name, "forward_us": forward, "forward_backward_us": both})
    return results


def eager_torch_reference_us(rows: int = 64, width: int = 256, repeats: int = 300) -> dict[str, float]:
    """The same measure for eager torch's own LayerNorm, the yardstick for the host cost of one op."""
    x = torch.randn(rows, width, requires_grad=True)
    w = torch.randn(width, requires_grad=True)
    b = torch.randn(width, requires_grad=True)

    def fn() -> torch.Tensor:
        return torch.nn.functional.layer_norm(x, (width,), w, b)

    with torch.no_grad():
        forward = _median_us(fn, repeats)

    def train_step() -> None:
        out = fn()
        torch.autograd.grad(out, [x, w, b], torch.ones_like(out))

    return {"forward_us": forward, "forward_backward_us": _median_us(train_step, repeats)}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.host_overhead", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--repeats", type=int, default=300)
    args = parser.parse_args(argv)
    kernels.use_triton_interpreter()  # before anything imports triton: the kernels run on CPU tensors
    torch.set_num_threads(1)
    print("| kernel | forward (no grad), µs | forward + backward, µs |\n|---|---|---|")
    for row in measure(repeats=args.repeats):
        print(f"| {row['kernel']} | {row['forward_us']:.1f} | {row['forward_backward_us']:.1f} |")
    reference = eager_torch_reference_us(repeats=args.repeats)
    print(
        f"| eager torch F.layer_norm (kernel included, CPU) | {reference['forward_us']:.1f} | "
        f"{reference['forward_backward_us']:.1f} |"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
