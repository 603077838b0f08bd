"""xformers' weight-init schemes (``vit``, ``moco``, ``small``, ``timm``) for the factory models.

Every ``nn.Linear`` gets its scheme's distribution, scaled by ``gain`` (DeepNorm's beta); biases are
zeroed. Other modules with a ``init_weights`` / ``reset_parameters`` method initialise themselves.
With ``_assert_if_not_initialized`` set, a module holding parameters that nothing initialises is
reported as an error instead of a log line.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from enum import Enum

import torch
from torch import nn

from brickwork.xformers._compat import XformersCompatError

logger = logging.getLogger("brickwork.xformers")
_assert_if_not_initialized = False


class xFormerWeightInit(str, Enum):
    Timm = "timm"
    ViT = "vit"
    Moco = "moco"
    Small = "small"


def _small_init_(tensor: torch.Tensor, gain: float = 1.0) -> torch.Tensor:
    """Normal with std sqrt(2 / (5 d)), d the input width (Nguyen & Salazar, "Transformers without Tears")."""
    return nn.init.normal_(tensor, std=gain * math.sqrt(2.0 / (5 * tensor.shape[1])))


_LINEAR_INITS: dict[xFormerWeightInit, Callable[[torch.Tensor, float], torch.Tensor]] = {
    xFormerWeightInit.ViT: lambda w, gain: nn.init.xavier_uniform_(w, gain=gain),
    xFormerWeightInit.Moco: lambda w, gain: nn.init.xavier_uniform_(w, gain=gain),
    xFormerWeightInit.Small: _small_init_,
    xFormerWeightInit.Timm: lambda w, gain: nn.init.trunc_normal_(w, std=0.02 * gain),
}


def get_weight_init_fn(init_choice: xFormerWeightInit | str) -> Callable[..., None]:
    """``fn(module, name="", gain=1.0)`` applying ``init_choice`` to every layer of ``module``."""
    choice = xFormerWeightInit(init_choice)

    def init(module: nn.Module, name: str = "", gain: float = 1.0) -> None:
        for child in module.modules():
            if isinstance(child, nn.Linear):
                _LINEAR_INITS[choice](child.weight, gain)
                if child.bias is not None:
                    nn.init.zeros_(child.bias)
            elif hasattr(child, "init_weights"):
                child.init_weights()
            elif hasattr(child, "reset_parameters"):
                child.reset_parameters()
            elif list(child.parameters(recurse=False)):
                message = f"{type(child).__name__} holds parameters that the {choice.value} init does not set"
                if _assert_if_not_initialized:
                    raise XformersCompatError(message)
                logger.info(message)

    return init
