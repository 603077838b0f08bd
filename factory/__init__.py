"""The factory: specs (dict / YAML / JSON) -> checked typed configs -> blocks and whole models."""

from brickwork.errors import ConfigError
from brickwork.factory.build import apply_overrides, build_block, build_model, resolve_spec
from brickwork.factory.hf import from_hf, load_hf_checkpoint, to_hf
from brickwork.factory.presets import get_preset, list_presets
from brickwork.factory.pretrained import from_pretrained, save_pretrained
from brickwork.factory.spec_io import dump_spec, load_spec, parse_spec
from brickwork.factory.xformers import from_xformers_config

__all__ = [
    "ConfigError",
    "apply_overrides",
    "build_block",
    "build_model",
    "dump_spec",
    "from_hf",
    "from_pretrained",
    "from_xformers_config",
    "get_preset",
    "list_presets",
    "load_hf_checkpoint",
    "load_spec",
    "parse_spec",
    "resolve_spec",
    "save_pretrained",
    "to_hf",
]
