"""Every preset builds, runs forward and backward, and has the parameter count docs/spec.md states."""

import re
from pathlib import Path

import pytest
import torch

from brickwork.factory import ConfigError, build_model, get_preset, list_presets
from brickwork.layout.vocab_padding import padded_names

DOCS = Path(__file__).resolve().parents[2] / "docs" / "spec.md"


def documented_counts() -> dict[str, int]:
    """Preset name -> parameter count from the presets table of docs/spec.md."""
    rows = re.findall(r"^\| `([\w-]+)` \| \w+ \| .* \| ([\d,]+) \|$", DOCS.read_text(), flags=re.M)
    return {name: int(count.replace(",", "")) for name, count in rows}


def real_parameters(model: torch.nn.Module) -> int:
    """The parameters of ``model`` with its real vocabulary: the padding rows its ``vocab_multiple``
    adds hold no weights (they stay zero) and are not counted."""
    padded = padded_names([model])
    return sum(
        (padded[name].unpad(param) if name in padded else param).numel()
        for name, param in model.named_parameters()
    )


def gpt2_parameters(vocab: int, positions: int, dim: int, layers: int, hidden: int) -> int:
    """GPT-2 with biases everywhere, a fused qkv, a final LayerNorm and a tied head."""
    per_layer = (
        2 * 2 * dim
        + (dim * 3 * dim + 3 * dim)
        + (dim * dim + dim)
        + (dim * hidden + hidden)
        + (hidden * dim + dim)
    )
    return vocab * dim + positions * dim + layers * per_layer + 2 * dim


def test_gpt2_has_the_gpt2_small_parameter_count() -> None:
    assert gpt2_parameters(50257, 1024, 768, 12, 3072) == 124_439_808 == documented_counts()["gpt2"]
    # The full model is counted in the test over all presets; one layer checks the formula's shape here.
    spec = get_preset("gpt2")
    spec["decoder"]["num_layers"] = 1
    model = build_model(spec)
    assert real_parameters(model) == gpt2_parameters(50257, 1024, 768, 1, 3072)
    assert model.token_embedding.weight.shape[0] == 50304  # vocab_multiple: 64, as nanoGPT's
    assert model.lm_head.weight is model.token_embedding.weight
    assert hasattr(model.layers[0].attention, "qkv_proj")


def test_docs_list_every_preset() -> None:
    assert sorted(documented_counts()) == list_presets()
    assert {"gpt2", "gpt-tiny", "bert-base", "llama", "t5-small", "vit"} <= set(list_presets())


# Presets too large to hold on a test machine: counted on the meta device, not run.
PUBLISHED_SHAPES = ("llama3-8b", "llama3-70b", "llama3-405b")


@pytest.mark.parametrize("name", PUBLISHED_SHAPES)
def test_llama3_presets_have_their_published_shape_and_size(name: str) -> None:
    with torch.device("meta"):
        model = build_model(get_preset(name))
    assert real_parameters(model) == documented_counts()[name]
    attention = model.layers[0].attention
    assert attention.num_kv_heads == 8 and attention.rotary is not None
    assert type(model.layers[0].feedforward).__name__ == "SwiGLU"
    assert model.lm_head.weight is not model.token_embedding.weight


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in list_presets() if n not in PUBLISHED_SHAPES])
def test_preset_builds_runs_and_matches_its_documented_size(name: str) -> None:
    torch.manual_seed(0)
    model = build_model(get_preset(name))
    assert real_parameters(model) == documented_counts()[name]
    spec = model.spec
    if spec["model"] == "image_encoder":
        out = model(torch.randn(1, spec["channels"], spec["image_size"], spec["image_size"]))
        assert out.shape == (1, spec["num_classes"])
    elif spec["model"] == "encoder_decoder":
        out = model(
            torch.randint(0, spec["vocab_size"], (1, 6)), torch.randint(0, spec["vocab_size"], (1, 5))
        )
        assert out.shape == (1, 5, spec["vocab_size"])
    else:
        out = model(torch.randint(0, spec["vocab_size"], (1, 6)))
        assert out.shape == (1, 6, spec["vocab_size"])
    out.float().logsumexp(-1).mean().backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)


def test_llama_preset_is_llama_shaped() -> None:
    spec = get_preset("llama")
    spec["decoder"]["num_layers"] = 1
    layer = build_model(spec).layers[0]
    assert type(layer.attention_norm).__name__ == "RMSNorm"
    assert type(layer.feedforward).__name__ == "SwiGLU"
    assert layer.attention.num_kv_heads == 2 and layer.attention.rotary is not None


def test_every_preset_with_a_vocabulary_pads_it_to_a_multiple_of_64() -> None:
    for name in list_presets():
        spec = get_preset(name)
        assert spec.get("vocab_multiple") == (64 if "vocab_size" in spec else None), name


def test_presets_are_exact_names_and_fresh_copies() -> None:
    spec = get_preset("gpt-tiny")
    spec["decoder"]["num_layers"] = 99
    assert get_preset("gpt-tiny")["decoder"]["num_layers"] == 4
    with pytest.raises(ConfigError, match=r"unknown preset 'gpt-2'.*did you mean 'gpt2'"):
        get_preset("gpt-2")
