"""A padded vocabulary's own form (tp=1: the padding at the end of the table) and how a padded module
is laid out again for tensor parallel, from its real rows."""

from __future__ import annotations

import torch
from torch import nn

from brickwork.layout.vocab_padding import (
    VocabPadding,
    module_padding,
    pad_own_vocabulary,
    pad_vocabulary,
    padded_names,
    unpadded_state_dict,
)


class _TiedHead(nn.Module):
    """An embedding [vocab, 3] and a head sharing its weight, as a tied LM has them."""

    def __init__(self, vocab: int = 7) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab, 3)
        self.head = nn.Linear(3, vocab, bias=False)
        self.head.weight = self.embedding.weight


def test_a_models_own_padding_is_at_the_end_of_the_table() -> None:
    padding = VocabPadding.for_size(50257, 1, 64)
    assert (padding.padded, padding.tp) == (50304, 1)
    table = torch.arange(14.0).view(7, 2)
    own = VocabPadding.for_size(7, 1, 4)
    padded = own.pad(table)
    assert padded.shape == (8, 2) and not padded[7:].any()
    assert torch.equal(padded[:7], table) and torch.equal(own.padded_ids(torch.arange(7)), torch.arange(7))
    assert own.unpad(padded).data_ptr() == padded.data_ptr()  # a view of the real rows
    assert own.has_view(padded) and not VocabPadding.for_size(7, 2, 4).has_view(padded)
    logits = torch.randn(2, 5, 8)
    assert torch.equal(own.real_columns(logits), logits[..., :7])


def test_padding_keeps_the_tie_and_the_real_rows_and_shows_only_them() -> None:
    torch.manual_seed(0)
    model = _TiedHead()
    before = model.embedding.weight.detach().clone()
    pad_own_vocabulary(model, ["embedding", "head"], 7, 4)
    assert model.head.weight is model.embedding.weight and model.embedding.weight.shape == (8, 3)
    assert (model.embedding.num_embeddings, model.head.out_features) == (8, 8)
    assert set(padded_names([model])) == {"embedding.weight", "head.weight"}
    assert model.head(torch.randn(4, 3)).shape == (4, 7)  # the real columns only
    state = unpadded_state_dict(model)
    assert torch.equal(state["embedding.weight"], before) and torch.equal(state["head.weight"], before)
    other = _TiedHead()
    pad_own_vocabulary(other, ["embedding", "head"], 7, 4)
    other.load_state_dict(state)  # the real rows alone: padded on loading
    assert torch.equal(other.embedding.weight[:7], before) and not other.embedding.weight[7:].any()


def test_a_multiple_the_vocabulary_fills_pads_nothing() -> None:
    model = _TiedHead()
    pad_own_vocabulary(model, ["embedding", "head"], 7, 7)
    assert model.embedding.weight.shape == (7, 3) and not padded_names([model])


def test_tensor_parallel_lays_a_padded_module_out_again_from_its_real_rows() -> None:
    torch.manual_seed(0)
    model = _TiedHead(vocab=5)
    before = model.embedding.weight.detach().clone()
    pad_own_vocabulary(model, ["embedding", "head"], 5, 4)  # rows 0-4 real, 5-7 padding
    split = VocabPadding(5, 8, 2)  # at tp=2 the same 8 rows: 3 real and a zero, 2 real and two zeros
    pad_vocabulary(model, ["embedding", "head"], split)
    assert module_padding(model.head) == split and model.head.weight is model.embedding.weight
    weight = model.embedding.weight.detach()
    assert torch.equal(weight[[0, 1, 2, 4, 5]], before) and not weight[[3, 6, 7]].any()
    hidden = torch.randn(4, 3)
    torch.testing.assert_close(model.head(hidden), hidden @ before.T)  # the real columns, in order
    assert len(model.head._forward_hooks) == 1  # one hook, reading the module's padding at each call
