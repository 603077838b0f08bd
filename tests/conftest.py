"""Suite-wide test settings: tests marked ``gpu`` run only where CUDA is present; elsewhere Triton
kernels run through the interpreter, chosen here before any test module imports triton."""

import pytest
import torch

from brickwork.kernels import use_triton_interpreter

if not torch.cuda.is_available():
    use_triton_interpreter()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
