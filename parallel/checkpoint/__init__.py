"""Checkpoints of a parallelized model: DCP folders saved from any layout and loaded under any other
(save_load.py), also written in the background while training goes on (async_save.py), packed
``colwise:N`` parameters in the single-process order (packed_shards.py). The format itself, and
reading it in one process, is ``brickwork.checkpoint``."""

from brickwork.parallel.checkpoint.async_save import async_save_checkpoint, save_group
from brickwork.parallel.checkpoint.save_load import load_checkpoint, save_checkpoint

__all__ = ["async_save_checkpoint", "load_checkpoint", "save_checkpoint", "save_group"]
