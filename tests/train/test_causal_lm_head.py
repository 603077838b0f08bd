"""The causal-LM task's fused head: a whole DecoderLM head goes through the fused linear + cross-entropy
kernel (``model(input_ids, labels=input_ids)``, HF's meaning: shifted inside), chunked or, where its
logits fit one chunk on the CPU, torch's own cross-entropy, with the loss and gradients of the logits
path; anything else takes the logits path. Under data parallel:
tests/train/test_train_layouts.py."""

from __future__ import annotations

import copy
from unittest import mock

import pytest
import torch
import torch.nn.functional as F

from brickwork.blocks import LossOutput
from brickwork.factory import build_model, get_preset
from brickwork.kernels import linear_cross_entropy
from brickwork.train.tasks import TASKS


def _model() -> torch.nn.Module:
    spec = copy.deepcopy(get_preset("gpt-tiny"))
    spec["decoder"]["num_layers"] = 2
    torch.manual_seed(0)
    return build_model(spec).double()


def _batch(vocab: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, vocab, (2, 16), generator=g)
    labels = ids.clone()
    labels[0, 1:6] = -100  # after the shift: row 0's first five positions are not scored
    return {"input_ids": ids, "labels": labels}


def _causal_lm(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    task = TASKS["causal_lm"]
    return task(model, task.align(batch))


def _targets(labels: torch.Tensor) -> torch.Tensor:
    """HF's shift, written out: position t is scored against label t + 1; the last position is not."""
    return torch.cat([labels[:, 1:], torch.full_like(labels[:, :1], -100)], dim=1)


@pytest.mark.parametrize("chunk_tokens", [None, 8])
def test_fused_head_matches_the_logits_formula(chunk_tokens: int | None) -> None:
    # By default the 32 tokens' logits fit one chunk, where the kernel's torch path is torch's own
    # cross-entropy; a chunk budget of 8 tokens' float32 logits makes it chunk.
    model = _model()
    batch = _batch(model.lm_head.out_features)
    budget = 4 * model.vocab_size * (chunk_tokens or 0) or linear_cross_entropy.CHUNK_LOGITS_BYTES
    with mock.patch.object(linear_cross_entropy, "CHUNK_LOGITS_BYTES", budget):
        loss, count = _causal_lm(model, batch)
    step = type(loss.grad_fn.next_functions[0][0]).__name__  # then "/ 1"
    assert ("FusedLinearCrossEntropy" in step) == (chunk_tokens is not None), step
    loss.backward()
    fused = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    logits = model(batch["input_ids"])  # float64, written out: the sum of -log softmax at the labels
    reference = F.cross_entropy(logits.flatten(0, 1), _targets(batch["labels"]).flatten(), reduction="sum")
    reference.backward()
    assert count.item() == 2 * 15 - 5
    torch.testing.assert_close(loss, reference, rtol=1e-12, atol=1e-10)
    for name, p in model.named_parameters():
        torch.testing.assert_close(fused[name], p.grad, rtol=1e-9, atol=1e-11, msg=name)


def test_forward_with_labels_returns_an_hf_output_with_the_mean_loss_sum_and_count() -> None:
    model = _model()
    batch = _batch(model.lm_head.out_features)
    ids, labels = batch["input_ids"], batch["labels"].masked_fill(batch["labels"] == -100, -1)
    mask = torch.ones_like(ids)
    mask[1, -4:] = 0
    labels[1, -4:] = -1
    logits = model(ids, attention_mask=mask)
    assert isinstance(logits, torch.Tensor) and logits.shape == (*ids.shape, model.vocab_size)
    out = model(ids, attention_mask=mask, labels=labels, ignore_index=-1)
    assert isinstance(out, LossOutput) and out.logits is None
    log_probs = torch.log_softmax(logits.detach(), dim=-1)  # float64 model: the formula in float64
    targets = _targets(labels).masked_fill(_targets(labels) == -100, -1)
    scored = targets != -1
    reference = -log_probs[scored].gather(-1, targets[scored].unsqueeze(-1)).sum()
    torch.testing.assert_close(out.loss_sum, reference, rtol=1e-12, atol=1e-10)
    assert out.count.item() == scored.sum().item() == 2 * 15 - 5 - 4
    mean = reference / scored.sum()
    for loss in (out.loss, out["loss"], out[0]):
        torch.testing.assert_close(loss, mean, rtol=1e-12, atol=1e-12)
    assert list(out) == ["loss"] and out.to_tuple() == (out.loss,)
    # HF's Trainer divides by the scored labels of the whole accumulated batch instead.
    torch.testing.assert_close(
        model(ids, labels=labels, ignore_index=-1, num_items_in_batch=50).loss * 50,
        model(ids, labels=labels, ignore_index=-1).loss_sum,
    )
    # HF's shift_labels are labels already shifted: the same loss.
    shifted = model(ids, attention_mask=mask, shift_labels=targets, ignore_index=-1)
    torch.testing.assert_close(shifted.loss_sum, out.loss_sum, rtol=0, atol=0)
    with pytest.raises(ValueError, match="not both"):
        model(ids, labels=labels, shift_labels=labels)
    with pytest.raises(TypeError, match=r"unexpected keyword arguments \['label'\]"):
        model(ids, label=labels)


def test_labels_of_another_shape_are_refused_naming_both() -> None:
    model = _model()
    batch = _batch(model.lm_head.out_features)
    with pytest.raises(ValueError, match=r"labels must have the shape of input_ids \(2, 16\), got \(2, 15\)"):
        model(batch["input_ids"], labels=batch["labels"][:, :-1])


def test_under_autocast_the_head_runs_in_the_autocast_dtype() -> None:
    model = _model().float()
    batch = _batch(model.lm_head.out_features)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, _ = _causal_lm(model, batch)
        logits = model(batch["input_ids"])
    assert logits.dtype == torch.bfloat16
    targets = _targets(batch["labels"]).flatten()
    reference = F.cross_entropy(logits.float().flatten(0, 1), targets, reduction="sum")
    torch.testing.assert_close(loss, reference, rtol=2e-3, atol=1e-2)


def test_a_model_that_is_not_a_decoder_lm_takes_the_logits_path() -> None:
    model = _model()
    batch = _batch(model.lm_head.out_features)
    loss, _ = _causal_lm(_Logits(model), batch)
    assert type(loss.grad_fn).__name__.startswith("Nll")
    fused, _ = _causal_lm(model, batch)
    torch.testing.assert_close(loss, fused.float(), rtol=1e-6, atol=1e-5)  # the logits path sums in fp32


class _Logits(torch.nn.Module):
    """Another codebase's module around the decoder: only its logits are known."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.inner(input_ids, attention_mask)


def test_evaluation_through_the_task_never_makes_the_logits() -> None:
    """In eval mode a DecoderLM given labels returns its logits (HF's compute_metrics reads them), but
    the task reads only the loss and asks for none: [B, T, vocab] would outgrow a training step."""
    model = _model().eval()
    batch = _batch(model.lm_head.out_features)
    calls = []
    model.lm_head.register_forward_hook(lambda *_: calls.append(1))
    with torch.no_grad():
        assert model(batch["input_ids"], labels=batch["labels"]).logits is not None
        assert len(calls) == 1
        loss_sum, count = _causal_lm(model, batch)
    assert len(calls) == 1  # the task's call made none
    logits = model(batch["input_ids"]).detach()
    targets = _targets(batch["labels"])
    scored = targets != -100
    want = -torch.log_softmax(logits, -1)[scored].gather(-1, targets[scored].unsqueeze(-1)).sum()
    torch.testing.assert_close(loss_sum, want, rtol=1e-12, atol=1e-10)
    assert count.item() == scored.sum().item()
