"""load_hf_checkpoint on folders written by save_pretrained: safetensors, .bin, shards, no transformers."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import transformers
from hf_models import VOCAB, assert_close, hf_model, logits_of
from safetensors.torch import load_file

from brickwork.factory.hf import load_hf_checkpoint


def _ids() -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, 10), generator=torch.Generator().manual_seed(1))


# Mixtral's folder holds each expert's tensors apart (block_sparse_moe.experts.<e>.w1/w2/w3), as HF
# writes it, where its live model packs them.
@pytest.mark.parametrize("family", ["gpt2", "bert", "llama", "gpt_neox", "qwen2", "qwen3", "mixtral"])
def test_safetensors_folder(family: str, tmp_path: Path) -> None:
    hf = hf_model(family, tie_word_embeddings=True)
    hf.save_pretrained(tmp_path)
    model = load_hf_checkpoint(tmp_path)
    with torch.no_grad():
        assert_close(model(_ids()), logits_of(hf, input_ids=_ids()))


def test_bin_folder_is_read_with_weights_only(tmp_path: Path) -> None:
    """A pytorch_model.bin (here written from the same tensors) loads through torch.load(weights_only)."""
    hf = hf_model("llama")
    hf.save_pretrained(tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    (tmp_path / "model.safetensors").unlink()
    torch.save(state, tmp_path / "pytorch_model.bin")
    model = load_hf_checkpoint(tmp_path)
    with torch.no_grad():
        assert_close(model(_ids()), hf(_ids()).logits)

    # A pickle that is more than tensors is refused by weights_only loading, in brickwork's words.
    torch.save({"weights": state, "hook": print}, tmp_path / "pytorch_model.bin")
    with pytest.raises(ValueError, match=r"pytorch_model\.bin' is not a readable .*: it names print,") as err:
        load_hf_checkpoint(tmp_path)
    assert "weights_only" not in str(err.value)


def test_sharded_bf16_folder(tmp_path: Path) -> None:
    hf = hf_model("gpt_neox").to(torch.bfloat16)
    hf.save_pretrained(tmp_path, max_shard_size="20KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    model = load_hf_checkpoint(tmp_path)
    assert next(model.parameters()).dtype == torch.bfloat16
    with torch.no_grad():
        assert torch.equal(model.token_embedding.weight, hf.gpt_neox.embed_in.weight)
        assert_close(model(_ids()), hf(_ids()).logits, atol=0.1, rtol=3e-2)


def test_old_gpt2_names_without_prefix(tmp_path: Path) -> None:
    """GPT-2 checkpoints on the hub predate the 'transformer.' prefix and carry attention-mask buffers."""
    hf = hf_model("gpt2")
    hf.save_pretrained(tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    old = {k.removeprefix("transformer."): v for k, v in state.items()}
    for i in range(hf.config.n_layer):
        old[f"h.{i}.attn.bias"] = torch.ones(1, 1, 48, 48).tril()
    (tmp_path / "model.safetensors").unlink()
    torch.save(old, tmp_path / "pytorch_model.bin")
    model = load_hf_checkpoint(tmp_path)
    with torch.no_grad():
        assert_close(model(_ids()), hf(_ids()).logits)


def test_missing_files_and_unknown_tensors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_hf_checkpoint(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match=r"config\.json"):
        load_hf_checkpoint(tmp_path)
    hf = hf_model("bert", model_class=transformers.BertModel)
    hf.save_pretrained(tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    state["encoder.layer.0.extra.weight"] = torch.zeros(2)
    (tmp_path / "model.safetensors").unlink()
    torch.save(state, tmp_path / "pytorch_model.bin")
    with pytest.raises(KeyError, match=r"extra\.weight"):
        load_hf_checkpoint(tmp_path)
    (tmp_path / "pytorch_model.bin").unlink()
    with pytest.raises(FileNotFoundError, match=r"model\.safetensors"):
        load_hf_checkpoint(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["architectures"] = []
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="architectures"):
        load_hf_checkpoint(tmp_path)


def test_loads_without_transformers(tmp_path: Path) -> None:
    """A fresh interpreter in which importing transformers fails still loads the folder."""
    hf = hf_model("llama")
    hf.save_pretrained(tmp_path)
    with torch.no_grad():
        torch.save(hf(_ids()).logits, tmp_path / "expected.pt")
    script = textwrap.dedent(
        f"""
        import sys
        sys.modules["transformers"] = None  # any import of it now raises ImportError
        import torch
        from brickwork.factory.hf import load_hf_checkpoint
        model = load_hf_checkpoint({str(tmp_path)!r})
        ids = torch.randint(0, {VOCAB}, (2, 10), generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            err = (model(ids) - torch.load({str(tmp_path / "expected.pt")!r})).abs().max().item()
        assert "transformers" not in sys.modules or sys.modules["transformers"] is None
        print(err)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert float(done.stdout.strip().splitlines()[-1]) <= 1e-4
