"""A patch-embedding input and the ViT-style image encoder built on it (Dosovitskiy et al. 2021)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from brickwork.blocks.block import EncoderBlock
from brickwork.blocks.model_kind import ModelKind, ModelSpec, Stack, StackSection
from brickwork.blocks.output import IGNORE_INDEX, LossOutput, logits_loss
from brickwork.blocks.reversible import as_layers, run_layers
from brickwork.checks import check_positive_int
from brickwork.errors import ConfigError


class PatchEmbedding(nn.Module):
    """Cuts an image into ``patch_size`` squares and projects each to ``dim_model``.

    images ``[B, channels, image_size, image_size]`` -> ``[B, (image_size / patch_size)², dim_model]``,
    patches in row-major order. The projection is a strided convolution, ``proj``.
    """

    def __init__(self, image_size: int, patch_size: int, channels: int, dim_model: int) -> None:
        super().__init__()
        self.check_geometry(image_size, patch_size, channels)
        self.image_size, self.patch_size, self.channels = image_size, patch_size, channels
        self.num_patches = (image_size // patch_size) ** 2
        self.proj = nn.Conv2d(channels, dim_model, kernel_size=patch_size, stride=patch_size)

    @staticmethod
    def check_geometry(image_size: int, patch_size: int, channels: int) -> None:
        """ConfigError naming the option unless the image cuts into whole patches."""
        for option, value in (("image_size", image_size), ("patch_size", patch_size), ("channels", channels)):
            check_positive_int(value, option)
        if image_size % patch_size:
            raise ConfigError(
                f"image_size={image_size} must be a multiple of patch_size={patch_size}",
                "patch_size",
                related=["image_size"],
            )

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        expected = (self.channels, self.image_size, self.image_size)
        if images.dim() != 4 or tuple(images.shape[1:]) != expected:
            raise ValueError(
                f"images must have shape [B, {', '.join(map(str, expected))}], got {tuple(images.shape)}"
            )
        return self.proj(images).flatten(2).transpose(1, 2)  # (B, N, d)


class ImageEncoder(nn.Module):
    """``model(images [B, C, H, W])`` -> class logits ``[B, num_classes]``, or hidden states
    ``[B, N, d]`` when built without a classifier (``num_classes=0``).

    Patches (plus a learned class token in front when ``class_token``) get ``position`` added and go
    through the encoder blocks. The classifier reads the class token (``pool="cls"``) or the mean of
    all tokens (``pool="mean"``). ``forward`` is ``head(layers(embed(images)))``. With a classifier,
    ``labels=`` [B] (class ids) returns a :class:`~brickwork.blocks.output.LossOutput` with the logits.
    """

    # What HF's Trainer reads: it passes num_items_in_batch and counts the labels as they are.
    accepts_loss_kwargs = True
    loss_type = "ForImageClassification"

    def __init__(
        self,
        patch_embedding: PatchEmbedding,
        layers: Sequence[EncoderBlock],
        position: nn.Module | None = None,
        class_token: bool = True,
        final_norm: nn.Module | None = None,
        num_classes: int = 0,
        pool: str = "cls",
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        if not layers:
            raise ValueError("ImageEncoder needs at least one layer")
        if pool not in ("cls", "mean") or (pool == "cls" and not class_token):
            raise ConfigError(f"pool must be 'mean', or 'cls' with a class token; got {pool!r}", "pool",
                              related=["class_token"])  # fmt: skip
        if num_classes < 0:
            raise ConfigError(f"must be >= 0 (0: no classifier), got {num_classes}", "num_classes")
        dim = layers[0].attention.dim_model
        self.patch_embedding = patch_embedding
        self.class_token = nn.Parameter(torch.zeros(1, 1, dim)) if class_token else None
        self.position_embedding = position
        self.dropout = nn.Dropout(dropout)
        self.layers = as_layers(layers)
        self.final_norm = final_norm if final_norm is not None else nn.Identity()
        self.pool = pool
        self.classifier = nn.Linear(dim, num_classes) if num_classes > 0 else None

    def embed(self, images: torch.Tensor) -> torch.Tensor:
        """[B, C, H, W] -> [B, N (+1), d]."""
        h = self.patch_embedding(images)
        if self.class_token is not None:
            h = torch.cat([self.class_token.expand(h.shape[0], -1, -1), h], dim=1)
        if self.position_embedding is not None:
            h = self.position_embedding(h)
        return self.dropout(h)

    def example_input(self) -> torch.Tensor:
        """One image of zeros, [1, C, H, W], on the weights' device: what ``embed`` takes."""
        patches = self.patch_embedding
        size = (1, patches.channels, patches.image_size, patches.image_size)
        return torch.zeros(size, device=patches.proj.weight.device)

    def head(self, h: torch.Tensor) -> torch.Tensor:
        """[B, N, d] -> logits [B, num_classes], or normalised hidden states [B, N, d]."""
        h = self.final_norm(h)
        if self.classifier is None:
            return h
        pooled = h[:, 0] if self.pool == "cls" else h.mean(dim=1)
        return self.classifier(pooled)

    def forward(
        self,
        images: torch.Tensor,
        labels: torch.Tensor | None = None,
        *,
        num_items_in_batch: int | torch.Tensor | None = None,
        ignore_index: int = IGNORE_INDEX,
    ) -> torch.Tensor | LossOutput:
        if labels is not None and self.classifier is None:
            raise ValueError("labels= scores class logits, but this image encoder has no classifier")
        h = self.embed(images)
        h = run_layers(self.layers, h)
        out = self.head(h)
        if labels is None:
            return out
        return logits_loss(out, labels, num_items_in_batch, ignore_index)


@dataclass(kw_only=True)
class ImageEncoderSpec(ModelSpec):
    """A ViT: image patches instead of token ids; ``num_classes > 0`` adds a classifier."""

    image_size: int = 224
    patch_size: int = 16
    channels: int = 3
    num_classes: int = 0
    class_token: bool = True
    pool: Literal["cls", "mean"] = "cls"
    encoder: StackSection

    def check_options(self) -> None:
        # Checked with the spec, not only when the patch embedding is built: positions are sized
        # from the patch count first.
        PatchEmbedding.check_geometry(self.image_size, self.patch_size, self.channels)

    @property
    def max_seq_len(self) -> int:
        """The patches, and the class token: what positions are sized by."""
        return (self.image_size // self.patch_size) ** 2 + int(self.class_token)


def build_image_encoder(spec: ImageEncoderSpec, position: nn.Module | None, encoder: Stack) -> ImageEncoder:
    return ImageEncoder(
        patch_embedding=PatchEmbedding(spec.image_size, spec.patch_size, spec.channels, spec.dim_model),
        layers=encoder.layers,
        position=position,
        class_token=spec.class_token,
        final_norm=encoder.final_norm(spec),
        num_classes=spec.num_classes,
        pool=spec.pool,
        dropout=spec.dropout,
    )


def check_trainable(spec: Mapping[str, Any]) -> None:
    if not spec.get("num_classes"):
        raise ConfigError(
            "an image encoder trains as a classifier, which needs num_classes > 0", "num_classes"
        )


IMAGE_ENCODER = ModelKind(ImageEncoderSpec, build_image_encoder, "image_classification", check_trainable)
