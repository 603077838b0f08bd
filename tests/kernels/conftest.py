"""Kernel tests: Triton's interpreter where there is no CUDA device, and a fixed seed per test.

``brickwork.kernels`` sets ``TRITON_INTERPRET=1`` on import when no CUDA device exists, but only if
triton is not loaded yet; this conftest runs before the test modules here import anything, so a test
module that imports triton itself still gets the interpreter.
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)
