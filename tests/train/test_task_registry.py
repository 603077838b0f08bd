"""Tasks are registered objects: a new one, registered in one place, trains by name; the registry keeps
its rules; each model kind's task answers what the run makes and reports for it."""

from __future__ import annotations

import sys

import pytest
import torch

from brickwork.blocks import MODELS
from brickwork.errors import ConfigError
from brickwork.factory import build_model
from brickwork.train import TASKS, Task, TrainStep, evaluate, tasks
from brickwork.train.losses import vocab_parallel_cross_entropy
from brickwork.train.tasks import TASK_REGISTRY, TextTask, get_task, kind_task, register_task

VOCAB = 64
SPEC = {
    "model": "decoder_lm",
    "vocab_size": VOCAB,
    "dim_model": 32,
    "max_seq_len": 16,
    "position": "learned",
    "decoder": {"num_layers": 2, "block": {"attention": {"num_heads": 2}}},
}


class EveryPosition(Task):
    """Scores each position against its own label (no shift): a task a user might add."""

    inputs = ("input_ids",)
    required = ("input_ids",)
    pipeline_input = "input_ids"

    def forward(self, model: torch.nn.Module, batch) -> torch.Tensor:
        return model(batch["input_ids"])


@pytest.fixture
def every_position():
    register_task("every_position")(EveryPosition)
    yield
    TASK_REGISTRY.unregister("every_position")


def test_a_registered_task_trains_and_evaluates_by_name(every_position) -> None:
    torch.manual_seed(0)
    model = build_model(SPEC)
    ids = torch.randint(0, VOCAB, (4, 16))
    labels = torch.randint(0, VOCAB, (4, 16))
    labels[:, :3] = -100
    batch = {"input_ids": ids, "labels": labels}
    with torch.no_grad():
        logits = model(ids).double()
    scored = labels != -100
    want = -logits.log_softmax(-1).gather(-1, labels.clamp(min=0)[..., None])[..., 0][scored].mean()
    assert evaluate(model, [batch], "every_position") == pytest.approx(float(want), rel=1e-5)
    step = TrainStep(model, torch.optim.SGD(model.parameters(), lr=0.0), "every_position")
    assert step(batch) == pytest.approx(float(want), rel=1e-5)
    assert TASKS["every_position"].name == "every_position" and "every_position" in TASKS


def test_the_registry_refuses_duplicates_strangers_and_unknown_names(every_position) -> None:
    with pytest.raises(ValueError, match="'causal_lm' is already registered"):
        register_task("causal_lm")(EveryPosition)
    with pytest.raises(TypeError, match="must subclass Task"):
        register_task("not_a_task")(dict)
    with pytest.raises(ConfigError, match=r"unknown task 'every_posit'.*did you mean 'every_position'"):
        get_task("every_posit")
    with pytest.raises(KeyError):
        TASKS["every_posit"]
    assert get_task(vocab_parallel_cross_entropy) is vocab_parallel_cross_entropy  # a callable as given


def test_each_model_kind_names_a_registered_task_that_says_what_a_run_makes() -> None:
    tasks = {kind: kind_task(kind) for kind in MODELS}
    assert {kind: task.name for kind, task in tasks.items()} == {
        "decoder_lm": "causal_lm",
        "encoder": "masked_lm",
        "encoder_decoder": "seq2seq",
        "image_encoder": "image_classification",
    }
    # Only images are counted whole and read without a tokenizer; the text tasks add their own ids.
    assert {k: (t.sample_unit, t.uses_tokenizer) for k, t in tasks.items()} == {
        "decoder_lm": ("tokens", True),
        "encoder": ("tokens", True),
        "encoder_decoder": ("tokens", True),
        "image_encoder": ("images", False),
    }
    vocab = {k: t.vocab_size(256) for k, t in tasks.items() if isinstance(t, TextTask)}
    assert vocab == {"decoder_lm": 256, "encoder": 257, "encoder_decoder": 272}
    assert [n for n, t in TASKS.items() if t.perplexity] == ["causal_lm", "masked_lm"]
    assert [n for n, t in TASKS.items() if t.samples_text] == [n for n, t in TASKS.items() if t.packs]
    assert [n for n, t in TASKS.items() if t.packs] == ["causal_lm"]


def test_a_module_in_the_task_folder_registers_its_task(tmp_path, monkeypatch) -> None:
    (tmp_path / "word_lm.py").write_text(
        "from brickwork.train.tasks import register_task\n"
        "from brickwork.train.tasks.masked_lm import MaskedLM\n\n\n"
        "@register_task('word_lm')\n"
        "class WordLM(MaskedLM):\n"
        "    pass\n"
    )
    monkeypatch.setattr(tasks, "__path__", [*tasks.__path__, str(tmp_path)])
    try:
        tasks.import_task_modules()
        assert TASKS["word_lm"].name == "word_lm" and TASKS["word_lm"].vocab_size(256) == 257
    finally:
        TASK_REGISTRY.unregister("word_lm")
        sys.modules.pop("brickwork.train.tasks.word_lm", None)
