"""The embedded data of every task: BERT masking, T5 span corruption, generated images, resumable."""

from __future__ import annotations

import torch

from brickwork.data import ByteTokenizer, read_corpus
from brickwork.train.tasks import TASKS
from brickwork.train.tasks.image_classification import image_batches
from brickwork.train.tasks.masked_lm import MASK_ID
from brickwork.train.tasks.seq2seq import DECODER_START_ID, SPAN_LENGTH, span_count
from brickwork.train.tasks.text import BYTES

TOKENS = ByteTokenizer().encode(read_corpus()[0][:20000])


def test_masked_lm_scores_fifteen_percent_mostly_masked() -> None:
    batch = TASKS["masked_lm"].text_batches(TOKENS, 64, 64, seed=0).next_batch()
    scored = batch["labels"] != -100
    assert 0.12 < scored.float().mean() < 0.18
    assert scored.any(dim=1).all()
    masked = batch["input_ids"][scored] == MASK_ID
    assert 0.7 < masked.float().mean() < 0.9
    # Unscored positions are the text itself, and every label is a byte of it.
    assert (batch["input_ids"][~scored] < BYTES).all() and (batch["labels"][scored] < BYTES).all()


def test_span_corruption_puts_back_the_original_window() -> None:
    seq_len = 40
    batch = TASKS["seq2seq"].text_batches(TOKENS, 8, seq_len, seed=1).next_batch()
    spans = span_count(seq_len)
    assert batch["input_ids"].shape == (8, seq_len - spans * (SPAN_LENGTH - 1))
    assert batch["labels"].shape == (8, spans * (SPAN_LENGTH + 1))
    assert (batch["decoder_input_ids"][:, 0] == DECODER_START_ID).all()
    assert torch.equal(batch["decoder_input_ids"][:, 1:], batch["labels"][:, :-1])
    # What the planner and MFU count: the lengths the encoder and the decoder read.
    source, target = TASKS["seq2seq"].model_lengths(seq_len)
    assert (source, target) == (batch["input_ids"].shape[1], batch["decoder_input_ids"].shape[1])
    assert TASKS["causal_lm"].model_lengths(seq_len) == (seq_len, seq_len)
    text = bytes(TOKENS.tolist())
    for inputs, labels in zip(batch["input_ids"].tolist(), batch["labels"].tolist()):
        filled = {
            labels[i]: labels[i + 1 : i + 1 + SPAN_LENGTH] for i in range(0, len(labels), SPAN_LENGTH + 1)
        }
        assert sorted(filled) == list(range(BYTES, BYTES + spans))
        window = [b for t in inputs for b in (filled[t] if t >= BYTES else [t])]
        assert len(window) == seq_len and bytes(window) in text


def test_generated_images_are_learnable_classes_and_resume_exactly() -> None:
    source = image_batches(16, 3, 1000, 32, seed=3)
    batch = source.next_batch()
    assert batch["pixel_values"].shape == (32, 3, 16, 16) and batch["pixel_values"].dtype == torch.float32
    assert batch["labels"].min() >= 0 and batch["labels"].max() < 10  # the first 10 of 1000 classes
    state = source.state_dict()
    following = source.next_batch()
    source.load_state_dict(state)
    assert all(torch.equal(following[k], v) for k, v in source.next_batch().items())
    assert all(
        torch.equal(a["labels"], b["labels"]) for a, b in zip(source.validation(2), source.validation(2))
    )


def test_causal_lm_labels_are_the_input_ids_as_in_hf() -> None:
    batch = TASKS["causal_lm"].text_batches(TOKENS, 4, 16, seed=0).next_batch()
    assert batch["input_ids"].shape == (4, 16)
    assert torch.equal(batch["input_ids"], batch["labels"])  # the model shifts them


def test_a_larger_vocabulary_puts_the_mask_and_the_sentinels_past_it() -> None:
    base = 1000
    ids = (torch.arange(5000) * 7919) % base  # every id of a 1000-token vocabulary, mapped like a file
    assert TASKS["causal_lm"].vocab_size(base) == 1000
    assert TASKS["masked_lm"].vocab_size(base) == 1001 and TASKS["seq2seq"].vocab_size(base) == 1016
    batch = TASKS["masked_lm"].text_batches(ids.to(torch.uint16), 64, 64, seed=0, base=base).next_batch()
    scored = batch["labels"] != -100
    assert batch["input_ids"].dtype == torch.long
    assert 0.7 < (batch["input_ids"][scored] == base).float().mean() < 0.9
    assert (batch["input_ids"][batch["input_ids"] != base] < base).all()
    # Random replacements are drawn from the whole vocabulary, not just the bytes.
    replaced = scored & (batch["input_ids"] != base) & (batch["input_ids"] != batch["labels"])
    assert replaced.sum() > 20 and (batch["input_ids"][replaced] >= BYTES).float().mean() > 0.5
    batch = TASKS["seq2seq"].text_batches(ids, 8, 40, seed=1, base=base).next_batch()
    sentinels = batch["labels"][:, :: SPAN_LENGTH + 1]
    assert torch.equal(sentinels, torch.arange(base, base + span_count(40)).expand_as(sentinels))
