"""The kernel benchmarks under pytest-benchmark: ``pytest benchmarks/ --benchmark-only``.

One modest shape per kernel (4096 x 4096 bfloat16 on GPU, 64 x 1024 float32 on CPU), every provider
that is available here, every mode. The sweep with bandwidth figures is ``python -m benchmarks``.
"""

import pytest
import torch

from .runner import BENCHES
from .selection import MODES, PROVIDERS
from .timing import mode_step

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
ROWS, WIDTH, DTYPE = (4096, 4096, torch.bfloat16) if DEVICE.type == "cuda" else (64, 1024, torch.float32)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("kernel", list(BENCHES))
def test_kernel(benchmark, kernel, provider, mode):
    bench = BENCHES[kernel]
    if provider not in bench.providers:
        pytest.skip(f"{kernel} has no {provider} provider")
    fn = bench.providers[provider](DEVICE)
    if fn is None:
        pytest.skip(f"{provider} is not installed or needs CUDA")
    step, leaves = mode_step(fn, bench.make_inputs(ROWS, WIDTH, DTYPE, DEVICE), mode)

    def timed() -> None:
        for t in leaves:
            t.grad = None
        step()
        if DEVICE.type == "cuda":
            torch.cuda.synchronize()

    benchmark(timed)
