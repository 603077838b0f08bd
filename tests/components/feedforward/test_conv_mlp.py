"""The convolutional MLP against a per-token formula written here: 1x1 convs are matmuls, the
depthwise 3x3 a sum over each token's grid neighbours."""

from __future__ import annotations

import pytest
import torch

from brickwork.components.feedforward import ConvMLP


def test_conv_mlp_matches_formula() -> None:
    torch.manual_seed(0)
    layer = ConvMLP(dim_model=3, hidden_dim=5, activation="relu").double()
    x = torch.randn(2, 16, 3, dtype=torch.float64)  # a 4 x 4 grid
    up = x @ layer.up_proj.weight[:, :, 0, 0].T + layer.up_proj.bias  # (B, T, 5)
    grid = up.reshape(2, 4, 4, 5)
    padded = torch.nn.functional.pad(grid, (0, 0, 1, 1, 1, 1))
    kernel = layer.depthwise.weight[:, 0]  # (5, 3, 3)
    mixed = sum(padded[:, i : i + 4, j : j + 4, :] * kernel[:, i, j] for i in range(3) for j in range(3))
    hidden = torch.relu(mixed + layer.depthwise.bias).reshape(2, 16, 5)
    ref = hidden @ layer.down_proj.weight[:, :, 0, 0].T + layer.down_proj.bias
    torch.testing.assert_close(layer(x), ref)


def test_conv_mlp_needs_a_square_grid() -> None:
    with pytest.raises(ValueError, match="square"):
        ConvMLP(dim_model=4)(torch.randn(1, 15, 4))
