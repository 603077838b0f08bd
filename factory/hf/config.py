"""Reading a Hugging Face config strictly: every key is either translated, known to be inert, or refused.

A config arrives as a ``PretrainedConfig`` (``from_hf``) or as the dict of a ``config.json`` (checkpoint
loading, where ``transformers`` need not be installed). Both become a plain dict; :class:`HFConfig`
then hands out values key by key and, once a family adapter is done, refuses every key nobody read.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from brickwork.errors import ConfigError

# Keys of every HF config that do not change what a model computes in a forward pass: bookkeeping,
# tokenizer ids, generation defaults, labels of task heads brickwork does not build.
INERT_KEYS = frozenset(
    {
        "_name_or_path", "_commit_hash", "_attn_implementation_autoset", "architectures", "model_type",
        "transformers_version", "dtype", "torch_dtype", "use_bfloat16", "torchscript", "return_dict",
        "output_hidden_states", "output_attentions", "output_scores", "return_dict_in_generate",
        "use_cache", "initializer_range", "id2label", "label2id", "num_labels", "problem_type",
        "finetuning_task", "tokenizer_class", "prefix", "task_specific_params", "bos_token_id",
        "eos_token_id", "pad_token_id", "sep_token_id", "decoder_start_token_id", "tf_legacy_loss",
        "chunk_size_feed_forward", "gradient_checkpointing", "max_length", "min_length", "do_sample",
        "early_stopping", "num_beams", "num_beam_groups", "diversity_penalty", "temperature", "top_k",
        "top_p", "typical_p", "repetition_penalty", "length_penalty", "no_repeat_ngram_size",
        "encoder_no_repeat_ngram_size", "bad_words_ids", "num_return_sequences", "forced_bos_token_id",
        "forced_eos_token_id", "remove_invalid_values", "exponential_decay_length_penalty",
        "suppress_tokens", "begin_suppress_tokens", "cross_attention_hidden_size", "classifier_dropout",
        "summary_type", "summary_use_proj", "summary_activation", "summary_proj_to_labels",
        "summary_first_dropout", "summary_last_dropout", "keys_to_ignore_at_inference",
    }
)  # fmt: skip

# HF activation names -> brickwork activation names, for the ones brickwork computes identically.
# gelu_new, gelu_fast and gelu_pytorch_tanh all compute the tanh approximation of GELU.
ACTIVATIONS = {
    "gelu": "gelu",
    "gelu_python": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_fast": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_python_tanh": "gelu_tanh",
    "relu": "relu",
    "silu": "silu",
    "swish": "silu",
}
# The reverse direction writes the canonical HF name of each brickwork activation.
HF_ACTIVATIONS = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu", "silu": "silu"}


def config_dict(config: Any) -> dict[str, Any]:
    """A plain dict copy of an HF config object or of a config.json mapping."""
    if isinstance(config, Mapping):
        return dict(config)
    to_dict = getattr(config, "to_dict", None)
    if to_dict is None:
        raise TypeError(f"expected a transformers config or a mapping, got {type(config).__name__}")
    return dict(to_dict())


class HFConfig:
    """One HF config being translated; errors name the HF key as ``hf_config.<key>``."""

    def __init__(self, data: Mapping[str, Any], family: str) -> None:
        self.data = dict(data)
        self.family = family
        self.used: set[str] = set()

    def path(self, key: str) -> str:
        return f"hf_config.{key}"

    def has(self, key: str) -> bool:
        return key in self.data and self.data[key] is not None

    def get(self, key: str, default: Any = None) -> Any:
        """The value of ``key`` (``default`` when absent or None), marking it as translated."""
        self.used.add(key)
        value = self.data.get(key)
        return default if value is None else value

    def require(self, key: str) -> Any:
        if not self.has(key):
            raise ConfigError(f"a {self.family} config needs {key!r}", self.path(key))
        return self.get(key)

    def expect(self, key: str, allowed: Any, default: Any, why: str) -> Any:
        """Read ``key`` and refuse any value other than ``allowed`` (one value or a tuple of them)."""
        value = self.get(key, default)
        choices = allowed if isinstance(allowed, tuple) else (allowed,)
        if value not in choices:
            raise ConfigError(
                f"{self.family} option {key}={value!r} is not supported: {why}",
                self.path(key),
                choices=[repr(c) for c in choices],
            )
        return value

    def activation(self, key: str, default: str) -> str:
        name = self.get(key, default)
        if name not in ACTIVATIONS:
            raise ConfigError(
                f"{self.family} activation {name!r} has no brickwork equivalent",
                self.path(key),
                choices=ACTIVATIONS,
                got=name,
            )
        return ACTIVATIONS[name]

    def dropout(self, key: str) -> float:
        value = float(self.get(key, 0.0))
        if not 0.0 <= value < 1.0 or math.isnan(value):
            raise ConfigError(f"dropout must be in [0, 1), got {value}", self.path(key))
        return value

    def finish(self) -> None:
        """Refuse every key that was neither translated nor known to be inert."""
        left = sorted(k for k in self.data if k not in self.used and k not in INERT_KEYS)
        if left:
            raise ConfigError(
                f"{self.family} config options not understood by brickwork: {', '.join(left)}; "
                "refusing to drop them silently",
                self.path(left[0]),
            )
