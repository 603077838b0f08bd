"""Packed documents (``data.pack``): windows of documents end to end, each followed by its end id.

The token stream holds every document followed by the end-of-document id (:func:`end_of_document`),
so the boundaries are the ids themselves: a window drawn anywhere is full (no padding), and each
token's document is the number of end ids before it (:func:`document_ids_of`; a document's end id is
its own last token). A batch carries ``document_ids`` [B, T] beside ``input_ids`` and ``labels``; the
model turns them into its document-causal mask and positions that restart at 0 with each document.

The loss rule (:func:`packed_labels`): position t is scored against token t + 1 only within one
document. A document's last text token predicts its end id; the end id predicts nothing, since the
next document's first token is ignored (-100), as HF's ``DataCollatorWithFlattening`` does. The
first document of a window may begin before it: it is scored from its first token in the window on.
"""

from __future__ import annotations

import torch

from brickwork.blocks import IGNORE_INDEX
from brickwork.data.tokenizer import END_OF_TEXT, ByteTokenizer, Tokenizer
from brickwork.errors import ConfigError

# The byte tokenizer has no id to spare: NUL, which text does not use, ends its documents (a document
# that holds one is refused: brickwork/data/token_file.py).
BYTE_END_OF_DOCUMENT = 0


def end_of_document(tokenizer: Tokenizer) -> int:
    """The id that ends every packed document: the tokenizer's ``<|endoftext|>``, NUL for bytes;
    ConfigError at ``data.pack`` for a tokenizer with neither (a character vocabulary, bare ids)."""
    if tokenizer.end_of_text is not None:
        return tokenizer.end_of_text
    if isinstance(tokenizer, ByteTokenizer):
        return BYTE_END_OF_DOCUMENT
    raise ConfigError(
        f"the tokenizer {tokenizer.name} has no {END_OF_TEXT} token to end each document with; give "
        "data.tokenizer one that has, or bytes",
        "data.pack",
    )


def document_ids_of(tokens: torch.Tensor, end_id: int) -> torch.Tensor:
    """[B, T] windows -> [B, T] document ids: the number of end ids before each token."""
    ends = (tokens == end_id).long()
    return ends.cumsum(dim=1) - ends


def packed_labels(input_ids: torch.Tensor, document_ids: torch.Tensor) -> torch.Tensor:
    """HF labels [B, T] of packed rows: the input ids, ignored (-100) where a document begins, so
    nothing is predicted across a boundary (the model shifts them: position t scores label t + 1)."""
    labels = input_ids.clone()
    labels[:, 0] = IGNORE_INDEX  # never a target after the shift; ignored to say it begins a document
    labels[:, 1:][document_ids[:, 1:] != document_ids[:, :-1]] = IGNORE_INDEX
    return labels


def packed_rows(windows: torch.Tensor, end_id: int) -> dict[str, torch.Tensor]:
    """A causal-LM batch of full windows [B, T] cut from a stream of ended documents."""
    document_ids = document_ids_of(windows, end_id)
    return {
        "input_ids": windows,
        "labels": packed_labels(windows, document_ids),
        "document_ids": document_ids,
    }
