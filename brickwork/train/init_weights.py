"""``brickwork train --init-from PATH``: a new run that starts from saved weights instead of random ones.

``PATH`` is anything ``brickwork.factory.from_pretrained`` reads: a ``save_pretrained`` folder, a run
or checkpoint folder, the file ``brickwork export`` writes, or an HF model folder (through
``from_hf``). Without a SPEC the run trains the saved model's own spec; with one, the weights must fit
it exactly. The path is recorded as ``train.init_from`` in the run's config.yaml; a resumed run takes
its weights from its own checkpoint instead.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import nn

from brickwork.errors import ConfigError
from brickwork.factory import from_pretrained

OPTION = "--init-from"


def pretrained(path: str) -> nn.Module:
    """The model at ``path``; ConfigError naming the option and the path when it cannot be read."""
    try:
        return from_pretrained(path)
    except (FileNotFoundError, ValueError) as err:
        raise ConfigError(f"cannot start from {path!r}: {err}", OPTION) from None


def pretrained_base(path: str) -> tuple[str, dict[str, Any]]:
    """(run name, model spec) of the model saved at ``path``: what a run without SPEC trains."""
    spec = getattr(pretrained(path), "spec", None)
    if not isinstance(spec, dict):
        raise ConfigError(f"the model at {path!r} carries no spec; give a SPEC for it", OPTION)
    return Path(path).stem or "pretrained", spec


def load_initial_weights(model: nn.Module, path: str) -> None:
    """Load the weights saved at ``path`` into the freshly built ``model``, strictly."""
    state = pretrained(path).state_dict()
    try:
        model.load_state_dict(state, strict=True)
    except (RuntimeError, ValueError) as err:
        raise ConfigError(
            f"the weights at {path!r} do not fit this run's model spec (leave SPEC out to train the saved "
            f"model's own spec): {err}",
            OPTION,
        ) from None
