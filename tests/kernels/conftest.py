"""Kernel tests: a fixed seed per test. (tests/conftest.py chooses Triton's interpreter where there
is no CUDA device, before any test module imports triton.)"""

import pytest
import torch


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)
