"""What spawned ranks run in the agreement tests (module-level, so that spawn can import it)."""

from __future__ import annotations

import torch.distributed as dist
from parallel_cases import tiny_spec

from brickwork.factory import build_model
from brickwork.parallel import parallelize


def parallelize_with_a_different_model_on_rank1(key: str, value: int, layout: dict) -> str:
    """Rank 1 builds its model with ``decoder.block.<key>=value``; the others with the tiny GPT spec."""
    spec = tiny_spec("gpt")
    if dist.get_rank() == 1:
        spec["decoder"]["block"]["attention"][key] = value
    parallelize(build_model(spec), layout)
    return "built"


def parallelize_with_a_different_layout_on_rank1() -> str:
    layout = {"tensor_parallel_size": 2} if dist.get_rank() == 0 else {"data_parallel_size": 2}
    parallelize(build_model(tiny_spec("gpt")), layout)
    return "built"


def parallelize_with_a_layout_too_big_on_rank1() -> str:
    layout = {"tensor_parallel_size": 2} if dist.get_rank() == 0 else {"tensor_parallel_size": 4}
    parallelize(build_model(tiny_spec("gpt")), layout)
    return "built"
