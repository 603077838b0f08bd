"""The checks of ``data.pack`` against the rest of a run, made before anything is written: the task,
the layout (not context parallel and a pipeline together), and every attention layer of the model
(built on the meta device, which allocates nothing). The data's own check is
:func:`brickwork.data.sources.check_packable`. ``brickwork eval`` makes the same checks."""

from __future__ import annotations

import torch
from torch import nn

from brickwork.blocks.decoder_lm import DecoderLM
from brickwork.components.attention import ATTENTION_REGISTRY, MultiHeadAttention
from brickwork.data.sources import check_packable
from brickwork.data.tokenizer import Tokenizer
from brickwork.errors import ConfigError
from brickwork.factory import build_model
from brickwork.parallel import ParallelConfig
from brickwork.train.run_config import RunConfig
from brickwork.train.tasks import TASKS, Task

KEY = "data.pack"


def check_packing(
    run: RunConfig, task: Task, tokenizer: Tokenizer, spec: dict, layout: ParallelConfig | None = None
) -> None:
    """ConfigError at ``data.pack`` where packed documents cannot train as ``run`` says (``layout``
    None: one process, as ``brickwork eval`` runs)."""
    if not run.data.pack:
        return
    if not task.packs:
        packing = ", ".join(n for n, t in TASKS.items() if t.packs)
        raise ConfigError(f"packs documents for {packing}; this run's task is {task.name}", KEY)
    check_packable(run.data, tokenizer)
    if layout is not None and layout.context_parallel_size > 1 and layout.pipeline_parallel_size > 1:
        raise ConfigError(
            f"context_parallel_size={layout.context_parallel_size} gathers the document ids in the "
            "decoder's forward, which pipeline stages do not run; pack with context parallel or a "
            "pipeline, not both",
            KEY,
        )
    with torch.device("meta"):
        model = build_model(spec)
    if not isinstance(model, DecoderLM):
        raise ConfigError(f"packs documents for brickwork's decoder LM, not {type(model).__name__}", KEY)
    check_document_masks(model)


def check_document_masks(model: nn.Module) -> None:
    """ConfigError at ``data.pack`` naming the first attention layer whose mechanism cannot keep
    packed documents apart (it takes no full masks: linformer, nystrom, favor, fourier_mix, ...)."""
    able = [n for n in ATTENTION_REGISTRY.names() if ATTENTION_REGISTRY.get(n).mask_support == "full"]
    for path, layer in model.named_modules():
        if not isinstance(layer, MultiHeadAttention) or layer.mechanism.mask_support == "full":
            continue
        cls = type(layer.mechanism)
        name = next((n for n in ATTENTION_REGISTRY.names() if ATTENTION_REGISTRY.get(n) is cls), cls.__name__)
        raise ConfigError(
            f"attention {name!r} at {path} cannot keep packed documents apart: it takes "
            f"{cls.mask_support!r} masks, not the full document mask; mechanisms that can: {able}",
            KEY,
        )
