"""Every Triton kernel compiles for an sm_90 GPU (PTX and cubin), checked without a GPU.

The interpreter, which runs the kernel tests on CPU, executes kernels with numpy and accepts code the
Triton compiler rejects (control flow on tensors, mismatched types across branches). Triton compiles
for an explicit target with its bundled ptxas and no device, so this runs everywhere triton's NVIDIA
backend is installed.
"""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

PROBE = Path(__file__).with_name("gpu_codegen_probe.py")


def _nvidia_backend_installed() -> bool:
    return importlib.util.find_spec("triton.backends.nvidia") is not None


@pytest.mark.slow
@pytest.mark.skipif(not _nvidia_backend_installed(), reason="triton's NVIDIA backend is not installed")
def test_every_kernel_compiles_for_sm90():
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    result = subprocess.run(
        [sys.executable, str(PROBE)], capture_output=True, text=True, env=env, timeout=600, check=True
    )
    results = json.loads(result.stdout.strip().splitlines()[-1])
    failures = [f"{r['case']} {r['layout']}: {r['error']}" for r in results if r["error"]]
    assert not failures, "\n".join(failures)
    # The norms' statistics use correctly rounded division and square root (see layer_norm.py).
    for r in results:
        if r["case"] in ("layer_norm_fwd", "rms_norm_fwd"):
            assert r["div_rn"] and r["sqrt_rn"], r
        if r["case"] in ("layer_norm_bwd", "rms_norm_bwd"):
            assert r["div_rn"], r
