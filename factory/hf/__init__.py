"""Hugging Face interop: GPT-2, BERT, Llama, GPT-NeoX, Mistral, Qwen2, Qwen3 and Mixtral in and out of
brickwork, and drop-in attention.

``transformers`` is needed only by ``to_hf`` (which builds an HF model) and, naturally, by the HF
models handed to ``from_hf``; ``load_hf_checkpoint`` reads a model folder without it.
"""

from .checkpoint import load_hf_checkpoint, read_weights
from .convert import FAMILIES, build_from_hf, from_hf, hf_state_to_brickwork, hf_to_spec, to_hf

__all__ = [
    "FAMILIES",
    "build_from_hf",
    "from_hf",
    "hf_state_to_brickwork",
    "hf_to_spec",
    "load_hf_checkpoint",
    "read_weights",
    "to_hf",
]
