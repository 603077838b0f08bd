"""HF's own training tools drive a brickwork model unchanged: ``Trainer`` (which passes
``num_items_in_batch``, for gradient accumulation) logs the same per-step losses and evaluation loss
on a model converted with ``from_hf`` as on the HF original, and saves it; accelerate trains it with
``accelerator.backward(out.loss)`` like the HF model."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from hf_models import VOCAB, hf_model
from safetensors.torch import load_file

from brickwork.factory import from_hf

transformers = pytest.importorskip("transformers")

ROWS, SEQ = 16, 12


def dataset(family: str, seed: int) -> list[dict[str, torch.Tensor]]:
    """Rows as an HF collator makes them: a causal LM's labels are its input ids with padding set to
    -100; a masked LM's hold the original ids where it scores, -100 elsewhere."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for index in range(ROWS):
        ids = torch.randint(1, VOCAB - 1, (SEQ,), generator=g)  # no id 0: HF BERT's padding row is frozen
        mask = torch.ones(SEQ, dtype=torch.long)
        mask[SEQ - index % 4 :] = 0  # rows end in 0..3 padding positions
        if family == "bert":
            scored = (torch.rand(SEQ, generator=g) < 0.3) & mask.bool()
            scored[0] = True
            inputs = torch.where(scored, VOCAB - 1, ids)  # the last id stands for [MASK]
            labels = torch.where(scored, ids, -100)
            rows.append({"input_ids": inputs, "attention_mask": mask, "labels": labels})
        else:
            labels = ids.masked_fill(mask == 0, -100)
            rows.append({"input_ids": ids, "attention_mask": mask, "labels": labels})
    return rows


def run_trainer(model: torch.nn.Module, family: str, out: Path) -> tuple[list[float], float, object]:
    # HF's BertForMaskedLM takes num_items_in_batch but averages each micro-batch anyway, so under
    # accumulation it logs the sum of their means; brickwork's encoder honours it. Compared without.
    accumulate = 1 if family == "bert" else 2
    args = transformers.TrainingArguments(
        output_dir=str(out),
        per_device_train_batch_size=4,
        per_device_eval_batch_size=4,
        gradient_accumulation_steps=accumulate,
        max_steps=4,
        learning_rate=5e-3,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        seed=0,
        data_seed=0,
        disable_tqdm=True,
    )
    trainer = transformers.Trainer(
        model=model, args=args, train_dataset=dataset(family, 1), eval_dataset=dataset(family, 2)
    )
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    return losses, trainer.evaluate()["eval_loss"], trainer


@pytest.mark.slow
@pytest.mark.parametrize("family", ["gpt2", "llama", "bert", "mistral", "qwen2", "qwen3", "mixtral"])
def test_trainer_logs_the_losses_of_the_hf_original(family: str, tmp_path: Path) -> None:
    hf = hf_model(family).train()
    ours = from_hf(copy.deepcopy(hf))
    want, want_eval, _ = run_trainer(hf, family, tmp_path / "hf")
    got, got_eval, trainer = run_trainer(ours, family, tmp_path / "ours")
    assert len(got) == len(want) == 4
    for step, (a, b) in enumerate(zip(got, want, strict=True)):
        assert abs(a - b) <= 1e-4, f"step {step + 1}: brickwork {a} vs HF {b}"
    assert abs(got_eval - want_eval) <= 1e-4
    assert want[-1] < want[0]  # it learns: the comparison is not between two idle runs
    # Trainer.save_model writes the state dict with safetensors; a tied head must not stop it.
    trainer.save_model(str(tmp_path / "saved"))
    saved = load_file(tmp_path / "saved" / "model.safetensors")
    fresh = from_hf(hf_model(family, seed=5))
    fresh.load_state_dict(saved, strict=True)
    for name, value in ours.state_dict().items():
        torch.testing.assert_close(fresh.state_dict()[name], value, rtol=0, atol=0, msg=name)


def test_accelerate_trains_it_like_the_hf_model() -> None:
    accelerate = pytest.importorskip("accelerate")
    hf = hf_model("gpt2").train()
    ours = from_hf(copy.deepcopy(hf))
    losses = {}
    for name, model in (("hf", hf), ("ours", ours)):
        accelerator = accelerate.Accelerator(cpu=True, gradient_accumulation_steps=2)
        optimizer = torch.optim.AdamW(model.parameters(), lr=5e-3)
        loader = torch.utils.data.DataLoader(dataset("gpt2", 3), batch_size=4)
        model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
        losses[name] = []
        for batch in loader:
            with accelerator.accumulate(model):
                out = model(**batch)
                accelerator.backward(out.loss)
                optimizer.step()
                optimizer.zero_grad()
            losses[name].append(out.loss.item())
    assert len(losses["ours"]) == ROWS // 4
    assert losses["ours"] == pytest.approx(losses["hf"], abs=1e-5)
    assert losses["hf"][-1] < losses["hf"][0]
