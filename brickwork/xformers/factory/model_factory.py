"""xformers' ``xFormer`` model and ``xFormerConfig``: stacks of encoder and decoder blocks."""

from __future__ import annotations

import copy
import dataclasses
import logging
from typing import Any

import torch
from torch import nn

from brickwork.errors import ConfigError, join_path
from brickwork.factory.xformers.stack import check_stacks, read_stack, stack_kind
from brickwork.xformers._compat import XformersCompatError
from brickwork.xformers.components import ResidualNormStyle
from brickwork.xformers.components.residual import get_deepnorm_coefficients
from brickwork.xformers.components.reversible import ReversibleSequence
from brickwork.xformers.factory.block_configs import (
    xFormerBlockConfig,
    xFormerDecoderConfig,
    xFormerEncoderConfig,
)
from brickwork.xformers.factory.block_factory import xFormerDecoderBlock, xFormerEncoderBlock
from brickwork.xformers.factory.weight_init import get_weight_init_fn, xFormerWeightInit

logger = logging.getLogger("brickwork.xformers")


@dataclasses.dataclass(init=False)
class xFormerConfig:
    """Block configs (a list, or a name -> config dict), embedding tying and the weight init."""

    stack_configs: list[xFormerBlockConfig] | dict[str, xFormerBlockConfig]
    tie_embedding_weights: bool = False
    weight_init: xFormerWeightInit = xFormerWeightInit.ViT

    def __init__(
        self,
        stack_configs: list[dict[str, Any]] | dict[str, dict[str, Any]],
        tie_embedding_weights: bool = False,
        weight_init: xFormerWeightInit | str = xFormerWeightInit.ViT,
    ) -> None:
        # Read as from_xformers_config reads them (older names, defaults, dims filled in).
        named = stack_configs.items() if isinstance(stack_configs, dict) else enumerate(stack_configs)
        given = {k: read_stack(c, join_path("stack_configs", k)) for k, c in named}
        kinds = {"encoder": xFormerEncoderConfig, "decoder": xFormerDecoderConfig}
        typed = {k: kinds[stack_kind(c, "")](**c) for k, c in given.items()}
        as_dict = isinstance(stack_configs, dict)
        self._given: Any = given if as_dict else list(given.values())
        self.stack_configs = typed if as_dict else list(typed.values())
        self.tie_embedding_weights = tie_embedding_weights
        self.weight_init = xFormerWeightInit(weight_init)

    def to_dict(self) -> dict[str, Any]:
        """The config as the dict it was given (what ``from_xformers_config`` converts)."""
        return {
            "stack_configs": copy.deepcopy(self._given),
            "tie_embedding_weights": self.tie_embedding_weights,
            "weight_init": self.weight_init.value,
        }


class xFormer(nn.Module):
    """``forward(src, tgt=None, encoder_input_mask=None, decoder_input_mask=None)``: encoders, then
    decoders on their output (or on ``tgt``); returns the last hidden states ``[B, T, E]``."""

    def __init__(
        self,
        stack_configs: xFormerBlockConfig | list[xFormerBlockConfig] | dict[str, xFormerBlockConfig],
        tie_embedding_weights: bool = False,
        weight_init: xFormerWeightInit | str = xFormerWeightInit.ViT,
    ) -> None:
        super().__init__()
        if isinstance(stack_configs, dict):
            stack_configs = list(stack_configs.values())
        if not isinstance(stack_configs, list):
            stack_configs = [stack_configs]
        try:  # a config's attributes are what read_stack read
            check_stacks([(join_path("stack_configs", i), vars(c)) for i, c in enumerate(stack_configs)],
                         tie_embedding_weights)  # fmt: skip
        except ConfigError as err:
            raise XformersCompatError(str(err)) from None
        encoders: list[nn.Module] = []
        decoders: list[nn.Module] = []
        self.reversible_encoder = False
        self.rev_enc_pose_encoding = None
        for config in stack_configs:
            encoder = isinstance(config, xFormerEncoderConfig)
            builder = xFormerEncoderBlock.from_config if encoder else xFormerDecoderBlock.from_config
            recipient = encoders if encoder else decoders
            for i in range(config.num_layers):
                if recipient:
                    config.layer_position.mark_not_first()
                if config is not stack_configs[-1] or i < config.num_layers - 1:
                    config.layer_position.mark_not_last()
                block = builder(config)
                if config.reversible:
                    if block.pose_encoding is not None:
                        self.rev_enc_pose_encoding = block.pose_encoding
                    self.reversible_encoder = True
                    recipient.append(nn.ModuleList(xFormerEncoderBlock.get_reversible_layer(config)))
                else:
                    recipient.append(block)
        if (
            tie_embedding_weights
            and encoders
            and decoders
            and encoders[0].pose_encoding is not None
            and (decoders[0].pose_encoding is not None)
        ):
            encoders[0].pose_encoding = decoders[0].pose_encoding
        stack = nn.ModuleList(encoders)
        self.encoders: nn.Module = ReversibleSequence(stack) if self.reversible_encoder else stack
        self.decoders = nn.ModuleList(decoders)
        use_deepnorm = stack_configs[0].residual_norm_style == ResidualNormStyle.DeepNorm
        self.init_weights(xFormerWeightInit(weight_init), use_deepnorm)

    @classmethod
    def from_config(cls, config: xFormerConfig) -> xFormer:
        return cls(config.stack_configs, config.tie_embedding_weights, config.weight_init)

    def init_weights(self, weight_init: xFormerWeightInit, use_deep_norm: bool) -> None:
        """``weight_init`` everywhere, scaled by DeepNorm's beta for each part when it is used."""
        n_enc = len(self.encoders.blocks) if self.reversible_encoder else len(self.encoders)
        coefficients = get_deepnorm_coefficients(n_enc, len(self.decoders)) if use_deep_norm else (None, None)
        init = get_weight_init_fn(weight_init)
        for stack, coefficient in zip((self.encoders, self.decoders), coefficients):
            for name, module in stack.named_children():
                init(module=module, name=name, gain=coefficient.beta if coefficient is not None else 1.0)

    def forward(
        self,
        src: torch.Tensor,
        tgt: torch.Tensor | None = None,
        encoder_input_mask: torch.Tensor | None = None,
        decoder_input_mask: torch.Tensor | None = None,
    ) -> torch.Tensor | None:
        memory = src
        if len(list(self.encoders.parameters())) > 0:
            if isinstance(self.encoders, nn.ModuleList):
                for encoder in self.encoders:
                    memory = encoder(memory, input_mask=encoder_input_mask)
            else:
                if self.rev_enc_pose_encoding is not None:
                    memory = self.rev_enc_pose_encoding(src)
                x = torch.cat([memory, memory], dim=-1)
                if encoder_input_mask is not None:
                    x = x + encoder_input_mask.unsqueeze(-1)
                x = self.encoders(x)
                memory = torch.stack(x.chunk(2, dim=-1)).mean(dim=0)
            if not self.decoders:
                return memory
        if len(self.decoders) > 0:
            tgt = src.clone() if tgt is None else tgt
            for decoder in self.decoders:
                tgt = decoder(target=tgt, memory=memory, input_mask=decoder_input_mask)
            return tgt
        return None
