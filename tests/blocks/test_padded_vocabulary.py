"""A model that pads its own vocabulary (``vocab_multiple``) is the unpadded model seen from outside:
the same logits, losses and real-row gradients for the same seed, padded ids never predicted or
sampled, zero gradient and zero weights in the padding rows."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from factory_specs import tiny_decoder, tiny_encoder, tiny_encoder_decoder

from brickwork.factory import build_model
from brickwork.layout.vocab_padding import padded_names
from brickwork.sampling import sample_ids

MULTIPLE = 16  # the tiny vocabularies (50, 40, 30) pad to 64, 48, 32


def _pair(spec: dict[str, Any], dtype: torch.dtype) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(unpadded, padded) models built from the same seed, in eval mode (no dropout)."""
    models = []
    for multiple in (1, MULTIPLE):
        torch.manual_seed(0)
        models.append(build_model({**spec, "vocab_multiple": multiple}).to(dtype).eval())
    return models[0], models[1]


def _loss(model: torch.nn.Module, kind: str, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits, loss) of the model's own head loss: the fused one of a decoder LM, the logits loss of
    the others. Every position scored but a few."""
    labels = ids.clone()
    labels[0, :2] = -100
    if kind == "encoder_decoder":
        out = model(ids, ids[:, :-1], labels=labels[:, 1:])
        return out.logits, out.loss
    logits = model(ids)
    return logits, model(ids, labels=labels).loss


def _check_grads(padded: torch.nn.Module, unpadded: torch.nn.Module, tol: float) -> None:
    rows = padded_names([padded])
    reference = dict(unpadded.named_parameters())
    for name, param in padded.named_parameters():
        grad = param.grad
        if name in rows:
            padding = rows[name]
            assert grad.shape[0] == padding.padded > padding.vocab, name
            assert not grad[padding.vocab :].any(), name  # padding rows take no part
            assert not param[padding.vocab :].any(), name  # and hold zeros
            grad = padding.unpad(grad)
        torch.testing.assert_close(grad, reference[name].grad, rtol=tol, atol=tol, msg=name)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize(
    ("kind", "spec"),
    [("decoder_lm", tiny_decoder), ("encoder", tiny_encoder), ("encoder_decoder", tiny_encoder_decoder)],
)
def test_padded_model_equals_the_unpadded_one(kind: str, spec: Any, dtype: torch.dtype) -> None:
    unpadded, padded = _pair(spec(), dtype)
    vocab = unpadded.vocab_size
    assert (
        padded.vocab_size == vocab
        and padded.token_embedding.num_embeddings == -(-vocab // MULTIPLE) * MULTIPLE
    )
    ids = torch.randint(0, vocab, (2, 7), generator=torch.Generator().manual_seed(1))
    ids[1, -3:] = vocab - 1  # the last real row
    tol = 1e-12 if dtype == torch.float64 else 1e-6
    (ref_logits, ref_loss), (logits, loss) = _loss(unpadded, kind, ids), _loss(padded, kind, ids)
    assert logits.shape[-1] == vocab
    torch.testing.assert_close(logits, ref_logits, rtol=tol, atol=tol)
    torch.testing.assert_close(loss, ref_loss, rtol=tol, atol=tol)
    # The loss against a reference written here: cross entropy over the real vocabulary's logits.
    if kind != "encoder_decoder":
        labels = ids.clone()
        labels[0, :2] = -100
        logits_in, labels_in = (logits[:, :-1], labels[:, 1:]) if kind == "decoder_lm" else (logits, labels)
        expected = F.cross_entropy(logits_in.flatten(0, 1).double(), labels_in.flatten())
        loss_tol = 1e-12 if loss.dtype == torch.float64 else 1e-6  # the encoder's loss is float32
        torch.testing.assert_close(loss.double(), expected, rtol=loss_tol, atol=loss_tol)
    ref_loss.backward()
    loss.backward()
    _check_grads(padded, unpadded, tol)


def test_padding_rows_take_no_part_even_when_they_are_not_zero() -> None:
    # Padding rows that somehow held huge weights still reach no logit, loss, greedy or sampled id.
    unpadded, padded = _pair(tiny_decoder(), torch.float32)
    vocab = unpadded.vocab_size
    with torch.no_grad():
        padded.lm_head.weight[vocab:] = 1e4
    ids = torch.randint(0, vocab, (2, 6), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(padded(ids), unpadded(ids), rtol=0, atol=0)
        torch.testing.assert_close(
            padded(ids, labels=ids).loss, unpadded(ids, labels=ids).loss, rtol=1e-6, atol=1e-6
        )
    greedy = padded.generate(ids[:, :2], max_new_tokens=4)
    assert torch.equal(greedy, unpadded.generate(ids[:, :2], max_new_tokens=4))
    sampled = padded.generate(ids[:, :2], 8, temperature=5.0, generator=torch.Generator().manual_seed(0))
    assert int(sampled.max()) < vocab
    text = sample_ids(padded, ids[0, :2], 20, window=8, temperature=5.0, seed=3)
    assert int(text.max()) < vocab
    assert torch.equal(text, sample_ids(unpadded, ids[0, :2], 20, window=8, temperature=5.0, seed=3))


def test_tied_weights_stay_tied_and_the_real_rows_load_alone() -> None:
    unpadded, padded = _pair(tiny_decoder(), torch.float32)
    assert padded.lm_head.weight is padded.token_embedding.weight
    assert padded.state_dict()["token_embedding.weight"].shape[0] == 64  # the model's own rows
    torch.manual_seed(5)
    other = build_model({**tiny_decoder(), "vocab_multiple": MULTIPLE})
    other.load_state_dict(unpadded.state_dict(), strict=True)  # 50 rows: padded on loading
    assert other.lm_head.weight is other.token_embedding.weight
    for name, value in padded.state_dict().items():
        assert torch.equal(other.state_dict()[name], value), name
