"""A packed row of documents trains as the documents would alone: the loss, the mask and the positions."""

from __future__ import annotations

import pytest
import torch

from brickwork.blocks import IGNORE_INDEX
from brickwork.components.attention import ATTENTION_REGISTRY, DocumentMask
from brickwork.data.packing import packed_labels
from brickwork.errors import ConfigError
from brickwork.factory import build_model
from brickwork.train.packing import check_document_masks

VOCAB, EOS = 64, 0
LENGTHS = (5, 9, 1, 13, 4)  # a 1-token document (its EOS) and a last one cut by the window's end


def decoder(position: str, mechanism: str = "scaled_dot_product", num_kv_heads: int = 2) -> torch.nn.Module:
    torch.manual_seed(0)
    spec = {
        "model": "decoder_lm",
        "vocab_size": VOCAB,
        "dim_model": 32,
        "max_seq_len": 32,
        "position": {"name": position},
        "decoder": {
            "num_layers": 2,
            "block": {
                "attention": {"num_heads": 4, "num_kv_heads": num_kv_heads, "mechanism": {"name": mechanism}},
                "feedforward": {"name": "mlp", "hidden_dim": 64},
            },
        },
    }
    return build_model(spec).eval()


def documents() -> list[torch.Tensor]:
    """Documents of random tokens (never the EOS id), each ended by EOS but the last, which the
    window's end cuts before its EOS."""
    g = torch.Generator().manual_seed(1)
    docs = [torch.cat([torch.randint(1, VOCAB, (n - 1,), generator=g), torch.tensor([EOS])]) for n in LENGTHS]
    docs[-1][-1] = 7
    return docs


def packed_row() -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids [1, 32], document_ids [1, 32]): the documents end to end."""
    docs = documents()
    ids = torch.cat(docs)
    document_ids = torch.cat([torch.full((len(d),), i) for i, d in enumerate(docs)])
    return ids[None], document_ids[None]


def loss_sum(model: torch.nn.Module, ids: torch.Tensor, labels: torch.Tensor, **kw) -> torch.Tensor:
    return model(ids, labels=labels, num_items_in_batch=1, return_logits=False, **kw).loss


@pytest.mark.parametrize("position", ["learned", "rotary", "alibi"])
def test_packed_loss_is_the_sum_of_each_document_alone(position: str) -> None:
    model = decoder(position)
    ids, document_ids = packed_row()
    labels = packed_labels(ids, document_ids)
    # Each document alone, its labels its own ids: every target inside it, its EOS included.
    alone = sum(loss_sum(model, d[None], d[None].clone()) for d in documents())
    # With gradients on CPU the dense mask runs; without, FlexAttention (eager on CPU).
    packed = loss_sum(model, ids, labels, document_ids=document_ids)
    with torch.no_grad():
        flex = loss_sum(model, ids, labels, document_ids=document_ids)
    torch.testing.assert_close(packed.double(), alone.double(), atol=1e-5, rtol=0)
    torch.testing.assert_close(flex.double(), alone.double(), atol=1e-5, rtol=0)
    # The targets scored: every token but each document's first, which nothing before it predicts.
    assert int((labels != IGNORE_INDEX).sum()) == ids.shape[1] - len(LENGTHS)
    # Without the mask the documents see each other: the check above can fail.
    assert (loss_sum(model, ids, labels) - alone).abs() > 1e-3


def test_gradients_of_the_packed_row_are_those_of_the_documents_alone() -> None:
    model = decoder("rotary", num_kv_heads=1)
    ids, document_ids = packed_row()
    loss_sum(model, ids, packed_labels(ids, document_ids), document_ids=document_ids).backward()
    packed = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    sum(loss_sum(model, d[None], d[None].clone()) for d in documents()).backward()
    for got, want in zip(packed, (p.grad for p in model.parameters())):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


def test_document_mask_keeps_each_document_causal_and_restarts_positions() -> None:
    document_ids = torch.tensor([[0, 0, 0, 1, 1, 2], [5, 5, 5, 5, 5, 5]])
    mask = DocumentMask(document_ids)
    assert mask.positions().tolist() == [[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 4, 5]]
    q, k = torch.arange(6)[:, None], torch.arange(6)[None, :]
    want = (document_ids[:, :, None] == document_ids[:, None, :]) & (k <= q)
    assert torch.equal(mask.dense()[:, 0], want)
    # The block mask says the same rule: its dense form (one token per block) is the mask.
    block = mask.block_mask()
    assert block.shape[1] == 1  # no head dim: it broadcasts over whatever heads a rank holds
    assert mask.block_mask() is block  # built once, shared by every layer


def test_local_attention_takes_the_dense_document_mask() -> None:
    model = decoder("rotary", mechanism="local")
    ids, document_ids = packed_row()
    alone = sum(loss_sum(model, d[None], d[None].clone()) for d in documents())
    packed = loss_sum(model, ids, packed_labels(ids, document_ids), document_ids=document_ids)
    torch.testing.assert_close(packed.double(), alone.double(), atol=1e-5, rtol=1e-6)


@pytest.mark.parametrize("mechanism", ["nystrom", "favor"])
def test_a_mechanism_without_full_masks_is_refused(mechanism: str) -> None:
    spec_model = decoder("rotary", mechanism="scaled_dot_product")
    check_document_masks(spec_model)  # the default mechanism passes
    with pytest.raises(ConfigError, match=rf"^data.pack: attention {mechanism!r} at layers.0.attention"):
        check_document_masks(decoder("learned", mechanism=mechanism))


class ProductBias:
    """A position bias that depends on where the query row is, not only on its distance to the key
    (ALiBi's would be the same whatever the rows' shift): ``0.1 * q * kv``, bottom-right aligned."""

    def __call__(self, tq: int, tk: int, device: torch.device | str | None = None) -> torch.Tensor:
        q, kv = torch.arange(tk - tq, tk, device=device), torch.arange(tk, device=device)
        return 0.1 * (q[:, None] * kv[None, :]).float()[None]

    def score_mod(self):
        return lambda score, b, h, q_idx, kv_idx: score + 0.1 * q_idx * kv_idx


def test_the_last_query_rows_attend_as_in_the_whole_mask() -> None:
    # Context parallel's rows: the queries of a sequence's last positions against all of its keys.
    document_ids = torch.tensor([[0, 0, 0, 1, 1, 2, 2, 2], [4, 4, 4, 4, 4, 4, 5, 5]])
    whole, tail = DocumentMask(document_ids), DocumentMask(document_ids, queries=3)
    assert torch.equal(tail.positions(), whole.positions()[:, 5:])
    assert torch.equal(tail.dense(), whole.dense()[:, :, 5:])
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 8, 16, generator=g) for _ in range(3))
    mechanism = ATTENTION_REGISTRY.build("scaled_dot_product", "mechanism", causal=True)
    with torch.no_grad():
        want = whole.attend(mechanism, q, k, v, ProductBias())[:, :, 5:]
        blocks = tail.attend(mechanism, q[:, :, 5:], k, v, ProductBias())  # FlexAttention: no gradient
    dense = tail.attend(mechanism, q[:, :, 5:].requires_grad_(), k, v, ProductBias())  # a CPU backward
    torch.testing.assert_close(blocks, want)
    torch.testing.assert_close(dense.detach(), want)
