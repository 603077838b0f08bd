"""Every registered component shows its own signature and docstring to ``inspect`` and ``help()``."""

from __future__ import annotations

import inspect
import pydoc

import pytest
import torch

import brickwork.components  # noqa: F401  (registers every component)
from brickwork.components.attention.base import ATTENTION_REGISTRY
from brickwork.components.attention.multi_head import MultiHeadAttention
from brickwork.components.feedforward.base import FEEDFORWARD_REGISTRY
from brickwork.components.positional.base import POSITIONAL_REGISTRY
from brickwork.components.residual.base import RESIDUAL_REGISTRY
from brickwork.components.residual.norms import NORM_REGISTRY

REGISTRIES = (ATTENTION_REGISTRY, FEEDFORWARD_REGISTRY, POSITIONAL_REGISTRY, RESIDUAL_REGISTRY, NORM_REGISTRY)
COMPONENTS = [(f"{r.family}:{name}", cls) for r in REGISTRIES for name, cls in r._entries.items()]
COMPONENTS.append(("multi_head", MultiHeadAttention))
MODULE_INIT_DOC = inspect.getdoc(torch.nn.Module.__init__)


@pytest.mark.parametrize(("name", "cls"), COMPONENTS, ids=[n for n, _ in COMPONENTS])
def test_signature_and_help_are_the_components_own(name: str, cls: type) -> None:
    own = inspect.signature(inspect.unwrap(cls.__init__))
    shown = inspect.signature(cls)
    assert list(shown.parameters) == list(own.parameters)[1:], name
    assert not any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in shown.parameters.values()), name
    page = pydoc.render_doc(cls, renderer=pydoc.plaintext)
    assert cls.__doc__ and cls.__doc__.strip().splitlines()[0] in page, name
    assert MODULE_INIT_DOC not in page, name
    assert inspect.getdoc(cls.__init__) != MODULE_INIT_DOC, name
