"""A run whose spec asks for ``backend: triton`` on CPU must have Triton's interpreter: checked before
the run folder is created, so that it fails in one line naming the key rather than at the first step.

``brickwork train`` chooses the interpreter for a run on CPU before anything loads triton
(``brickwork.cli``); this check catches the cases where that was not possible (triton already loaded
compiled in the process, e.g. ``train.device: cpu`` written in a spec file on a machine with a GPU).
"""

from __future__ import annotations

from typing import Any

import torch

from brickwork.errors import ConfigError, join_path
from brickwork.kernels import use_triton_interpreter
from brickwork.train.run_config import RunConfig


def triton_backend_paths(node: Any, path: str = "") -> list[str]:
    """The dotted paths of every ``backend: triton`` in a spec."""
    if isinstance(node, dict):
        found = [join_path(path, "backend")] if node.get("backend") == "triton" else []
        return found + [p for k, v in node.items() for p in triton_backend_paths(v, join_path(path, k))]
    if isinstance(node, list):
        return [p for i, v in enumerate(node) for p in triton_backend_paths(v, join_path(path, i))]
    return []


def check_triton_backends(run: RunConfig) -> None:
    """ConfigError naming the first ``backend: triton`` of a CPU run when this process cannot
    interpret Triton kernels any more."""
    paths = triton_backend_paths(run.spec)
    on_cpu = run.train.device == "cpu" or not torch.cuda.is_available()
    if not paths or not on_cpu:
        return
    try:
        use_triton_interpreter()
    except RuntimeError as err:
        raise ConfigError(f"a run on CPU; {err}", paths[0]) from None
