"""Patch embedding against an explicit cut-and-project, and the image encoder's pooling and checks."""

import pytest
import torch

from brickwork.blocks import EncoderBlock, ImageEncoder, PatchEmbedding
from brickwork.components.attention import MultiHeadAttention
from brickwork.components.feedforward import MLP
from brickwork.factory import ConfigError, build_model


def test_patch_embedding_is_a_projection_of_row_major_patches() -> None:
    torch.manual_seed(0)
    patches = PatchEmbedding(image_size=8, patch_size=4, channels=3, dim_model=5)
    images = torch.randn(2, 3, 8, 8, dtype=torch.float64)
    patches = patches.double()
    expected = []
    for row in range(2):
        for col in range(2):
            square = images[:, :, 4 * row : 4 * row + 4, 4 * col : 4 * col + 4].reshape(2, -1)
            weight = patches.proj.weight.reshape(5, -1)
            expected.append(square @ weight.T + patches.proj.bias)
    torch.testing.assert_close(patches(images), torch.stack(expected, dim=1))


def test_patch_embedding_names_bad_shapes() -> None:
    with pytest.raises(ValueError, match="image_size=10 must be a multiple of patch_size=4"):
        PatchEmbedding(10, 4, 3, 8)
    with pytest.raises(ValueError, match=r"\[B, 3, 8, 8\], got \(2, 1, 8, 8\)"):
        PatchEmbedding(8, 4, 3, 8)(torch.zeros(2, 1, 8, 8))


@pytest.mark.parametrize(("option", "value"), [("patch_size", 0), ("image_size", -8), ("patch_size", 3)])
def test_an_image_spec_names_a_bad_patch_geometry_before_positions_are_sized(option: str, value: int) -> None:
    # Learned positions are sized from the patch count, which is read from the spec first.
    block = {"attention": {"num_heads": 2}}
    spec = {"model": "image_encoder", "dim_model": 16, "image_size": 8, "patch_size": 4, "num_classes": 5,
            "position": {"name": "learned"}, "encoder": {"num_layers": 1, "block": block}}  # fmt: skip
    with pytest.raises(ConfigError, match=f"^{option}: "):
        build_model({**spec, option: value})


@pytest.mark.parametrize("pool,class_token", [("cls", True), ("mean", False)])
def test_image_encoder_pools_into_class_logits(pool: str, class_token: bool) -> None:
    torch.manual_seed(0)
    layers = [EncoderBlock(MultiHeadAttention(8, 2), MLP(8, 16)) for _ in range(2)]
    model = ImageEncoder(
        PatchEmbedding(8, 4, 3, 8), layers, class_token=class_token, num_classes=4, pool=pool
    )
    images = torch.randn(2, 3, 8, 8)
    hidden = model.embed(images)
    assert hidden.shape == (2, 4 + int(class_token), 8)
    for layer in model.layers:
        hidden = layer(hidden)
    pooled = hidden[:, 0] if pool == "cls" else hidden.mean(dim=1)
    torch.testing.assert_close(model(images), model.classifier(pooled))
    with pytest.raises(ValueError, match="pool must be 'mean', or 'cls' with a class token"):
        ImageEncoder(PatchEmbedding(8, 4, 3, 8), layers, class_token=False, pool="cls")
