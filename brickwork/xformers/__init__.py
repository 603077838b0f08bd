"""xformers' deleted public API (components, factory, triton, helpers) running on brickwork's parts.

``import brickwork.xformers as xformers``, or aliasing the module name ``xformers`` to this package,
lets code written against xformers' component and factory API run unchanged. Each class here keeps
xformers' names, shapes, registry names and config keys, and hands the work to a brickwork component.
docs/xformers.md lists what maps to what, and which options are ignored or refused.
"""

from __future__ import annotations

import importlib.util

import torch


def _is_triton_available() -> bool:
    """Whether brickwork's Triton kernels run here: triton is importable and a CUDA device is present.

    Elsewhere ``brickwork.xformers.triton`` still works, on the kernels' exact torch twins."""
    return torch.cuda.is_available() and importlib.util.find_spec("triton") is not None


def _is_functorch_available() -> bool:
    return False
