"""The causal-LM task's fused head: a whole DecoderLM head goes through the fused linear + cross-entropy
kernel, with the loss and gradients of the logits path; anything else takes the logits path."""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F

from brickwork.factory import build_model, get_preset
from brickwork.train.tasks import TASKS


def _model() -> torch.nn.Module:
    spec = copy.deepcopy(get_preset("gpt-tiny"))
    spec["decoder"]["num_layers"] = 2
    torch.manual_seed(0)
    return build_model(spec).double()


def _batch(vocab: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, vocab, (2, 16), generator=g)
    labels = torch.roll(ids, -1, 1)
    labels[0, :5] = -100
    return {"input_ids": ids, "labels": labels}


def test_fused_head_matches_the_logits_formula() -> None:
    model = _model()
    batch = _batch(model.lm_head.out_features)
    loss, count = TASKS["causal_lm"](model, batch)
    assert "FusedLinearCrossEntropy" in type(loss.grad_fn).__name__
    loss.backward()
    fused = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    logits = model(batch["input_ids"])  # float64, written out: the sum of -log softmax at the labels
    reference = F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), reduction="sum")
    reference.backward()
    assert count.item() == 27
    torch.testing.assert_close(loss, reference, rtol=1e-12, atol=1e-10)
    for name, p in model.named_parameters():
        torch.testing.assert_close(fused[name], p.grad, rtol=1e-9, atol=1e-11, msg=name)


def test_under_autocast_the_head_runs_in_the_autocast_dtype() -> None:
    model = _model().float()
    batch = _batch(model.lm_head.out_features)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, _ = TASKS["causal_lm"](model, batch)
        logits = model(batch["input_ids"])
    assert logits.dtype == torch.bfloat16
    reference = F.cross_entropy(logits.float().flatten(0, 1), batch["labels"].flatten(), reduction="sum")
    torch.testing.assert_close(loss, reference, rtol=2e-3, atol=1e-2)


def test_a_model_that_is_not_a_decoder_lm_takes_the_logits_path() -> None:
    model = _model()
    batch = _batch(model.lm_head.out_features)
    loss, _ = TASKS["causal_lm"](_Logits(model), batch)
    assert type(loss.grad_fn).__name__.startswith("Nll")
    fused, _ = TASKS["causal_lm"](model, batch)
    torch.testing.assert_close(loss, fused.float(), rtol=1e-6, atol=1e-5)  # the logits path sums in fp32


class _Logits(torch.nn.Module):
    """Another codebase's module around the decoder: only its logits are known."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.inner(input_ids, attention_mask)
