"""Save and load like HF: ``save_pretrained`` / ``from_pretrained`` round trips, tied weights, the
file ``brickwork export`` writes and a run folder, plain ``safetensors`` saves of a tied state dict,
preset names in ``build_model``, and clear errors for damaged or foreign files."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from brickwork.errors import ConfigError
from brickwork.factory import build_model, from_pretrained, get_preset, save_pretrained
from brickwork.layout.vocab_padding import padded_names
from brickwork.parallel import export, save_checkpoint

TINY = {"decoder.num_layers": 1, "dim_model": 32, "decoder.block.attention.num_heads": 2}


def tiny(preset: str = "gpt-tiny", seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    overrides = TINY if preset == "gpt-tiny" else {}
    return build_model(preset, overrides)


def assert_same(a: torch.nn.Module, b: torch.nn.Module) -> None:
    ids = torch.randint(0, 200, (2, 9), generator=torch.Generator().manual_seed(1))
    assert a.state_dict().keys() == b.state_dict().keys()
    for name, value in a.state_dict().items():
        assert torch.equal(b.state_dict()[name], value), name
    a.eval(), b.eval()
    with torch.no_grad():
        torch.testing.assert_close(b(ids), a(ids), rtol=0, atol=0)


def test_build_model_takes_a_preset_name() -> None:
    torch.manual_seed(0)
    by_name = build_model("gpt-tiny")
    torch.manual_seed(0)
    by_spec = build_model(get_preset("gpt-tiny"))
    assert_same(by_name, by_spec)
    with pytest.raises(ConfigError, match=r"unknown preset 'gpt-tinny'.*did you mean 'gpt-tiny'"):
        build_model("gpt-tinny")


def test_save_pretrained_round_trip_keeps_the_weights_tied(tmp_path: Path) -> None:
    model = tiny()
    save_pretrained(model, tmp_path / "saved")
    names = ["config.json", "model.safetensors", "spec.yaml"]  # HF's config: brickwork.hf loads it
    assert sorted(p.name for p in (tmp_path / "saved").iterdir()) == names
    stored = load_file(tmp_path / "saved" / "model.safetensors")
    assert "lm_head.weight" not in stored and "token_embedding.weight" in stored  # each weight once
    loaded = from_pretrained(tmp_path / "saved")
    assert loaded.lm_head.weight is loaded.token_embedding.weight
    assert loaded.spec == model.spec
    assert_same(model, loaded)


def test_a_tied_state_dict_saves_with_plain_safetensors_and_loads_back_tied(tmp_path: Path) -> None:
    model = tiny()
    state = model.state_dict()
    assert state["lm_head.weight"].data_ptr() != state["token_embedding.weight"].data_ptr()
    save_file(state, tmp_path / "w.safetensors")
    other = tiny(seed=3)
    other.load_state_dict(load_file(tmp_path / "w.safetensors"), strict=True)
    assert other.lm_head.weight is other.token_embedding.weight
    assert_same(model, other)
    # The two names of one weight may not hold two different tensors.
    state = load_file(tmp_path / "w.safetensors")
    state["lm_head.weight"] = state["lm_head.weight"] + 1
    with pytest.raises(ValueError, match=r"'lm_head.weight' and 'token_embedding.weight' are one tied"):
        other.load_state_dict(state)
    # Untied models keep their own second weight, and a missing one is still reported.
    untied = build_model("gpt-tiny", {**TINY, "tie_embeddings": False})
    partial = {k: v for k, v in untied.state_dict().items() if k != "lm_head.weight"}
    with pytest.raises(RuntimeError, match=r"Missing key.*lm_head.weight"):
        untied.load_state_dict(partial, strict=True)


@pytest.mark.parametrize("preset", ["bert-base", "t5-small"])
def test_encoders_tie_and_round_trip_too(preset: str, tmp_path: Path) -> None:
    torch.manual_seed(0)
    stacks = ["encoder"] if preset == "bert-base" else ["encoder", "decoder"]
    overrides = {"dim_model": 32, **{f"{s}.num_layers": 1 for s in stacks}}
    overrides.update({f"{s}.block.attention.num_heads": 2 for s in stacks})
    model = build_model(preset, overrides)
    save_file(model.state_dict(), tmp_path / "w.safetensors")
    save_pretrained(model, tmp_path / "saved")
    loaded = from_pretrained(tmp_path / "saved")
    for name, value in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], value), name
    tied = [n for n, _ in loaded.named_parameters(remove_duplicate=False)]
    assert len(tied) == len(list(loaded.parameters())) + 1


def test_the_export_file_and_a_run_folder_load(tmp_path: Path) -> None:
    model = tiny()
    step_dir = tmp_path / "run" / "checkpoints" / "step_000003"
    save_checkpoint(step_dir, model, torch.optim.SGD(model.parameters(), lr=0.1), 3)
    (tmp_path / "run" / "config.yaml").write_text("{}\n")
    export(step_dir, tmp_path / "model.safetensors")
    for source in (tmp_path / "model.safetensors", step_dir, tmp_path / "run"):
        loaded = from_pretrained(source)
        assert loaded.lm_head.weight is loaded.token_embedding.weight, source
        assert_same(model, loaded)


def test_a_padded_vocabulary_is_saved_by_its_real_rows_and_padded_again(tmp_path: Path) -> None:
    assert not padded_names([tiny()])  # gpt-tiny's 256 ids: a multiple of 64 already, nothing padded
    torch.manual_seed(0)
    padded = build_model("gpt-tiny", {**TINY, "vocab_size": 201})  # the preset's vocab_multiple: 64
    assert padded.token_embedding.weight.shape[0] == 256 and padded.spec["vocab_multiple"] == 64
    save_pretrained(padded, tmp_path / "saved")
    stored = load_file(tmp_path / "saved" / "model.safetensors")
    assert stored["token_embedding.weight"].shape[0] == 201 and "lm_head.weight" not in stored
    step_dir = tmp_path / "run" / "checkpoints" / "step_000001"
    save_checkpoint(step_dir, padded, torch.optim.AdamW(padded.parameters()), 1)
    export(step_dir, tmp_path / "model.safetensors")
    assert load_file(tmp_path / "model.safetensors")["lm_head.weight"].shape[0] == 201
    for source in (tmp_path / "saved", tmp_path / "model.safetensors", step_dir):
        loaded = from_pretrained(source)
        assert loaded.lm_head.weight is loaded.token_embedding.weight, source
        assert loaded.spec == padded.spec
        assert_same(padded, loaded)
    # The unpadded model takes the same file: the padding was never in it.
    unpadded = build_model({**padded.spec, "vocab_multiple": 1})
    unpadded.load_state_dict(stored, strict=True)
    ids = torch.randint(0, 201, (2, 7))
    with torch.no_grad():
        torch.testing.assert_close(unpadded.eval()(ids), padded.eval()(ids), rtol=0, atol=0)


def test_an_overwrite_cut_short_never_loads_one_saves_spec_with_anothers_weights(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    save_pretrained(tiny(), tmp_path / "saved")
    second = tiny(seed=1)
    second.spec = {**second.spec, "dropout": 0.25}  # same shapes: nothing but the files tells them apart
    rename = os.replace

    def killed_before_the_spec(source: Path, target: Path) -> None:
        if Path(target).name == "spec.yaml":
            raise KeyboardInterrupt
        rename(source, target)

    monkeypatch.setattr(os, "replace", killed_before_the_spec)
    with pytest.raises(KeyboardInterrupt):
        save_pretrained(second, tmp_path / "saved")
    monkeypatch.undo()
    with pytest.raises(FileNotFoundError, match=r"save_pretrained that was cut short.*save the model again"):
        from_pretrained(tmp_path / "saved")
    save_pretrained(second, tmp_path / "saved")
    loaded = from_pretrained(tmp_path / "saved")
    assert loaded.spec["dropout"] == 0.25
    assert_same(second, loaded)
    names = ["config.json", "model.safetensors", "spec.yaml"]
    assert sorted(p.name for p in (tmp_path / "saved").iterdir()) == names


def test_damaged_or_foreign_files_are_refused_naming_them(tmp_path: Path) -> None:
    model = tiny()
    save_pretrained(model, tmp_path / "saved")
    weights = tmp_path / "saved" / "model.safetensors"
    # A foreign safetensors file: no brickwork spec in its metadata.
    save_file({"x": torch.zeros(2)}, tmp_path / "foreign.safetensors")
    with pytest.raises(ValueError, match=r"foreign.safetensors' carries no brickwork spec"):
        from_pretrained(tmp_path / "foreign.safetensors")
    # A truncated weights file.
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"model.safetensors' is not a readable safetensors file"):
        from_pretrained(tmp_path / "saved")
    # Weights of another model under the same names.
    save_file({"token_embedding.weight": torch.zeros(3, 3)}, weights)
    with pytest.raises(ValueError, match=r"model.safetensors' do not fit its spec"):
        from_pretrained(tmp_path / "saved")
    # An export file whose spec metadata is not JSON.
    save_file({"x": torch.zeros(2)}, tmp_path / "bad.safetensors", metadata={"spec": "{not json"})
    with pytest.raises(ValueError, match=r"bad.safetensors"):
        from_pretrained(tmp_path / "bad.safetensors")
    # A checkpoint whose recorded spec no longer builds.
    other = tiny()
    other.spec = {**other.spec, "dim_model": -1}
    save_checkpoint(tmp_path / "step", other, None, 1)
    with pytest.raises(ValueError, match=r"^the spec saved with '.*step' does not build: dim_model: "):
        from_pretrained(tmp_path / "step")
    with pytest.raises(FileNotFoundError, match=r"none of the folders from_pretrained reads"):
        from_pretrained(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"does not exist"):
        from_pretrained(tmp_path / "nothing")
    assert json.loads(json.dumps(model.spec)) == model.spec
