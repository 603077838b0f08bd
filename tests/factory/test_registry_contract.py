"""Every registered component of every family is reachable from a spec, builds and runs."""

from typing import Any

import pytest
import torch
from factory_specs import tiny_encoder

from brickwork.blocks import INIT_REGISTRY
from brickwork.components.attention import ATTENTION_REGISTRY
from brickwork.components.feedforward import FEEDFORWARD_REGISTRY
from brickwork.components.positional import POSITIONAL_REGISTRY
from brickwork.components.residual import NORM_REGISTRY, RESIDUAL_REGISTRY
from brickwork.factory import build_model

# Options a component cannot do without in these tiny models.
REQUIRED_OPTIONS: dict[str, dict[str, Any]] = {
    "linformer": {"seq_len": 9},
    "lambda_layer": {"seq_len": 9},
    "nystrom": {"num_landmarks": 2},
    "ortho": {"num_landmarks": 2},
    "blocksparse": {"block_size": 2},
}
SEQ = 9  # 3 x 3: the grid mixers (visual) need a square


def built_in(registry: Any) -> list[str]:
    """The names brickwork registers (test modules may add their own to the same registries)."""
    return [n for n in registry.names() if registry.get(n).__module__.startswith("brickwork.")]


def encoder(**block: Any) -> dict[str, Any]:
    spec = tiny_encoder()
    spec["encoder"]["block"].update(block)
    return spec


def check(spec: dict[str, Any]) -> None:
    model = build_model(spec)
    ids = torch.randint(0, spec["vocab_size"], (2, SEQ))
    out = model(ids, attention_mask=torch.ones_like(ids) if "mask" in spec else None)
    out.square().mean().backward()
    assert torch.isfinite(out).all()
    assert build_model(model.spec).spec == model.spec


@pytest.mark.parametrize("name", built_in(ATTENTION_REGISTRY))
def test_every_attention_mechanism(name: str) -> None:
    spec = encoder()
    spec["encoder"]["block"]["attention"]["mechanism"] = {"name": name, **REQUIRED_OPTIONS.get(name, {})}
    check(spec)


@pytest.mark.parametrize("name", built_in(FEEDFORWARD_REGISTRY))
def test_every_feedforward(name: str) -> None:
    check(encoder(feedforward={"name": name, "hidden_dim": 8}))


@pytest.mark.parametrize("name", built_in(NORM_REGISTRY))
def test_every_norm(name: str) -> None:
    check(encoder(norm=name))


@pytest.mark.parametrize("name", built_in(RESIDUAL_REGISTRY))
def test_every_residual_style(name: str) -> None:
    check(encoder(residual=name))


@pytest.mark.parametrize("name", built_in(POSITIONAL_REGISTRY))
def test_every_position(name: str) -> None:
    check({**encoder(), "position": {"name": name}})


@pytest.mark.parametrize("name", built_in(INIT_REGISTRY))
def test_every_init_scheme(name: str) -> None:
    check({**encoder(), "init": name})
