"""The model shapes of the GPU training benchmark, each in its three forms: brickwork's preset with
dotted overrides (what ``brickwork train`` is given), the spec those resolve to (what the bare loop
builds), and the plain-torch model of the same architecture.

GPT-2 small (12 layers, 768 wide, 12 heads, vocabulary 50257, context 1024) and a Llama-shaped
decoder at the same scale (12 layers, 768 wide, 12 query and 4 key/value heads, SwiGLU of 2048,
vocabulary 32000), 16 sequences of 1024 tokens a step; and tiny twins of both (2 layers, 64 wide,
vocabulary 251, 2 sequences of 32) that run in seconds on a CPU, to check the benchmark itself.
The ``fp8`` rows convert the linears torchao's size rule picks at the full shapes, and at the tiny
ones every linear whose sizes are multiples of 16 (the rule would leave them all in bf16).
Dropout is 0 everywhere: the plain models have none.
"""

from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass
from typing import Any

from torch import nn

from brickwork.train.run_config import resolve_run

from . import llama_reference, nanogpt_reference


@dataclass(frozen=True)
class Shape:
    """One architecture at one size. ``preset`` (``gpt2`` or ``llama``) is the brickwork preset it
    shrinks or keeps, and picks the plain model's family."""

    name: str
    preset: str
    layers: int
    dim: int
    heads: int
    kv_heads: int
    hidden: int
    vocab: int
    seq_len: int
    batch: int
    fp8_min_features: int | None = None

    @property
    def tokens(self) -> int:
        """Tokens of one training step."""
        return self.batch * self.seq_len

    def overrides(self) -> list[str]:
        """The model's dotted overrides of ``preset``, as ``brickwork train PRESET ...`` takes them."""
        block = "decoder.block"
        return [
            f"vocab_size={self.vocab}",
            f"dim_model={self.dim}",
            f"max_seq_len={self.seq_len}",
            f"decoder.num_layers={self.layers}",
            f"{block}.attention.num_heads={self.heads}",
            f"{block}.attention.num_kv_heads={self.kv_heads}",
            f"{block}.feedforward.hidden_dim={self.hidden}",
            "dropout=0",
        ]

    def spec(self) -> dict[str, Any]:
        """The model spec ``brickwork train`` builds from :meth:`overrides` (resolved by its own code)."""
        # resolve_run says on stdout where dropout=0 reached; the benchmark's output is its rows.
        with contextlib.redirect_stdout(io.StringIO()):
            return resolve_run(self.preset, self.overrides()).spec

    def plain_model(self) -> nn.Module:
        """The plain-torch model of this shape (random weights from torch's current seed)."""
        if self.preset == "gpt2":
            config = nanogpt_reference.GPTConfig(self.vocab, self.seq_len, self.layers, self.heads, self.dim)
            return nanogpt_reference.GPT(config)
        config = llama_reference.LlamaConfig(
            self.vocab, self.seq_len, self.layers, self.heads, self.kv_heads, self.dim, self.hidden
        )
        return llama_reference.Llama(config)


GPT2_SMALL = Shape("gpt2-small", "gpt2", 12, 768, 12, 12, 3072, 50257, 1024, 16)
LLAMA_12X768 = Shape("llama-12x768", "llama", 12, 768, 12, 4, 2048, 32000, 1024, 16)
FULL_SHAPES = (GPT2_SMALL, LLAMA_12X768)

GPT2_TINY = Shape("gpt2-tiny", "gpt2", 2, 64, 4, 4, 256, 251, 32, 2, fp8_min_features=16)
LLAMA_TINY = Shape("llama-tiny", "llama", 2, 64, 4, 2, 172, 251, 32, 2, fp8_min_features=16)
TINY_SHAPES = (GPT2_TINY, LLAMA_TINY)
