"""Tokens per sequence of a planned step, per part of the model.

An encoder-decoder reads two sequences a row: the encoder's source and the decoder's target, which
T5's span corruption makes several times shorter (train/tasks/seq2seq.py: 480 source and 64 target
tokens from a window of 512). Its encoder layers and embedding work on the source; its decoder
layers, their self-attention, the decoder's embedding and the head on the target; cross-attention
reads the target's queries against the source's keys. Every other model reads one sequence, its
source, and its target is the same.
"""

from __future__ import annotations

from dataclasses import dataclass

from brickwork.parallel.planner.model_facts import LayerShape


@dataclass(frozen=True)
class Lengths:
    """``source`` tokens per row for the encoder (every other model's whole sequence), ``target``
    tokens per row for an encoder-decoder's decoder (every other model's: the source's)."""

    source: int
    target: int

    @classmethod
    def one(cls, seq_len: int) -> Lengths:
        """One length for the whole model: ``seq_len`` tokens a row in every layer."""
        return cls(seq_len, seq_len)

    def of(self, shape: LayerShape) -> int:
        """Tokens per row that a layer of ``shape`` runs: a decoder layer of an encoder-decoder (it has
        cross-attention) the target's, any other layer the source's."""
        return self.target if shape.cross_attention else self.source
