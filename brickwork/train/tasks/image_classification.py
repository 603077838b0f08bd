"""``image_classification``: class logits of images, trained on a generated set.

Each class of the generated images is a sinusoidal grating of its own orientation and frequency
under Gaussian noise, at a random phase: learnable, different every draw.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from brickwork.data.task_batches import TaskBatches
from brickwork.train.tasks.base import Batch, Task, register_task

if TYPE_CHECKING:
    from brickwork.data.sources import TextData
    from brickwork.train.run_config import RunConfig

IMAGE_CLASSES = 10  # the generated set uses the first classes of the head


def image_batch(
    image_size: int, channels: int, classes: int, rows: int, g: torch.Generator
) -> dict[str, torch.Tensor]:
    """``rows`` generated images [rows, channels, image_size, image_size] of ``classes`` classes."""
    labels = torch.randint(0, classes, (rows,), generator=g)
    angle = labels.double() * math.pi / classes
    frequency = 2 * math.pi * (1 + labels.double() % 3) / image_size * 2
    phase = torch.rand(rows, generator=g, dtype=torch.float64) * 2 * math.pi
    grid = torch.arange(image_size, dtype=torch.float64)
    y, x = torch.meshgrid(grid, grid, indexing="ij")
    along = torch.cos(angle)[:, None, None] * x + torch.sin(angle)[:, None, None] * y
    pattern = torch.sin(frequency[:, None, None] * along + phase[:, None, None])
    noise = 0.5 * torch.randn((rows, channels, image_size, image_size), generator=g, dtype=torch.float64)
    return {"pixel_values": (pattern[:, None] + noise).float(), "labels": labels}


def image_batches(image_size: int, channels: int, num_classes: int, rows: int, seed: int) -> TaskBatches:
    """Batches of generated images for an image classifier with ``num_classes`` outputs."""
    classes = min(IMAGE_CLASSES, num_classes)
    return TaskBatches(lambda n, g: image_batch(image_size, channels, classes, n, g), rows, seed)


@register_task("image_classification")
class ImageClassification(Task):
    """``pixel_values`` [B, C, H, W] -> class logits [B, classes]; ``labels`` [B] class ids."""

    inputs = ("pixel_values",)
    required = ("pixel_values",)
    pipeline_input = "pixel_values"
    sample_unit = "images"
    uses_tokenizer = False

    def forward(self, model: nn.Module, batch: Batch) -> Any:
        return model(batch["pixel_values"])

    def train_batches(self, run: RunConfig, text: TextData | None) -> TaskBatches:
        spec, cfg = run.spec, run.train
        return image_batches(
            spec["image_size"], spec.get("channels", 3), spec["num_classes"], cfg.batch_size, cfg.seed
        )

    def validation_batches(self, run: RunConfig, text: TextData | None) -> list[dict[str, torch.Tensor]]:
        return self.train_batches(run, text).validation(run.train.eval_batches)

    def describe_data(self, run: RunConfig, text: TextData | None) -> str:
        patch, size = run.spec["patch_size"], run.spec["image_size"]
        return f"generated {size}x{size} images ({patch}x{patch} patches), {IMAGE_CLASSES} classes"
