"""The HF models brickwork's generation is checked against (test_hf_generate.py): a name and a
factory of a tiny random causal LM in eval mode. A family converted by ``from_hf`` joins the checks
with one line here."""

from __future__ import annotations

import functools
from collections.abc import Callable

from hf_models import hf_model
from torch import nn

GENERATION_MODELS: dict[str, Callable[[], nn.Module]] = {
    "gpt2": functools.partial(hf_model, "gpt2", seed=9),
    "llama": functools.partial(hf_model, "llama", seed=9),
    "gpt_neox": functools.partial(hf_model, "gpt_neox", seed=9),
    "mistral": functools.partial(hf_model, "mistral", seed=9),
    "qwen2": functools.partial(hf_model, "qwen2", seed=9),
    "qwen3": functools.partial(hf_model, "qwen3", seed=9),
    "mixtral": functools.partial(hf_model, "mixtral", seed=9),
}
