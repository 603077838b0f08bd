"""``load_trained`` (``brickwork sample``) reads what ``from_pretrained`` reads, through the same reader:
a save_pretrained folder (a run or checkpoint folder: test_checked_once.py); a model that is no decoder
LM, and anything unreadable, is a ConfigError naming RUN_OR_FOLDER."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from brickwork.cli import main
from brickwork.data import ByteTokenizer
from brickwork.errors import ConfigError
from brickwork.factory import build_model, save_pretrained
from brickwork.train.trained_model import OPTION, load_trained

TINY = {"decoder.num_layers": 1, "dim_model": 32, "decoder.block.attention.num_heads": 2}


def tiny() -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model("gpt-tiny", TINY)


def test_a_save_pretrained_folder_samples(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = tiny()
    save_pretrained(model, tmp_path / "saved")
    trained = load_trained(str(tmp_path / "saved"))
    assert trained.description == str(tmp_path / "saved")
    assert isinstance(trained.tokenizer, ByteTokenizer) and not trained.model.training
    assert trained.window == model.spec["max_seq_len"]  # no run: the spec says
    for name, value in model.state_dict().items():
        assert torch.equal(trained.model.state_dict()[name], value), name
    assert main(["sample", str(tmp_path / "saved"), "--prompt", "Once", "--max-new-tokens", "4"]) == 0
    assert capsys.readouterr().out.startswith("Once")


def test_what_is_no_decoder_lm_or_unreadable_is_refused_naming_the_option(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    overrides = {"dim_model": 32, "encoder.num_layers": 1, "encoder.block.attention.num_heads": 2}
    save_pretrained(build_model("bert-base", overrides), tmp_path / "bert")
    with pytest.raises(ConfigError, match=r"model of kind 'encoder'; only decoder LMs generate text") as err:
        load_trained(str(tmp_path / "bert"))
    assert err.value.path == OPTION
    assert main(["sample", str(tmp_path / "bert"), "--prompt", "x"]) == 2
    assert f"error: {OPTION}: {str(tmp_path / 'bert')!r} holds a model of kind" in capsys.readouterr().err
    # from_pretrained's own errors (a FileNotFoundError, a ValueError) come as this option's.
    (tmp_path / "bert" / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    for source, reason in ((tmp_path / "none", "does not exist"), (tmp_path / "bert", "not a readable")):
        with pytest.raises(ConfigError, match=reason) as err:
            load_trained(str(source))
        assert err.value.path == OPTION


@pytest.mark.parametrize(
    ("option", "value", "expected"),
    [
        ("--temperature", "nan", "--temperature: must be a finite number >= 0 (0 = greedy), got nan"),
        ("--seed", str(2**70), f"--seed: must be in 0 .. 2**64 - 1, got {2**70}"),
        ("--window", "257", "--window: 257 tokens is past the 256 positions the model has (its max_seq_len)"),
    ],
)
def test_sampling_options_no_model_can_use_are_one_line_naming_the_option(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], option: str, value: str, expected: str
) -> None:
    save_pretrained(tiny(), tmp_path / "saved")
    assert main(["sample", str(tmp_path / "saved"), "--prompt", "Once", option, value]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "\n" not in captured.err.strip()
    assert captured.err.startswith(f"brickwork sample: error: {expected}")


def test_a_tokenizer_must_fit_the_real_vocabulary_not_the_padded_rows(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = build_model("gpt-tiny", {**TINY, "vocab_size": 200})  # the preset pads to 256 rows
    assert model.token_embedding.weight.shape[0] == 256 and model.vocab_size == 200
    save_pretrained(model, tmp_path / "saved")
    trained = load_trained(str(tmp_path / "saved"))
    assert trained.tokenizer.vocab_size == 200  # its 200 ids, not bytes: the padding rows are no ids
    with pytest.raises(ConfigError, match=r"the tokenizer has 256 ids, more than the model's vocab_size 200"):
        load_trained(str(tmp_path / "saved"), tokenizer="bytes")
