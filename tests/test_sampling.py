"""Sampling past the training window: the sliding KV cache against a crop-and-recompute reference."""

from __future__ import annotations

import math

import pytest
import torch

from brickwork.errors import ConfigError
from brickwork.factory import build_model, get_preset
from brickwork.sampling import next_token, sample_ids


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models decode token by token: threads only add synchronisation (40x slower on a busy CPU)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def small_decoder(position: str, max_seq_len: int | None = None) -> torch.nn.Module:
    spec = get_preset("gpt-tiny") | {"vocab_size": 61, "dim_model": 32, "position": position}
    spec["decoder"] = {**spec["decoder"], "num_layers": 2}
    spec["decoder"]["block"] = {**spec["decoder"]["block"], "attention": {"num_heads": 2}}
    if max_seq_len is not None:
        spec["max_seq_len"] = max_seq_len
    torch.manual_seed(0)
    return build_model(spec).eval()


def reference(model, prompt, count, window, slide, temperature=0.0, top_k=None, seed=0) -> list[int]:
    """Each token from a plain forward over the context since the last refill, no cache: the context
    starts over at the newest ``window - slide + 1`` tokens whenever it would exceed ``window``."""
    generator = torch.Generator().manual_seed(seed)
    ids = prompt.tolist()
    start = max(0, len(ids) - window)
    with torch.no_grad():
        for _ in range(count):
            logits = model(torch.tensor([ids[start:]]))[:, -1]
            ids.append(int(next_token(logits, temperature, top_k, generator)))
            if len(ids) - start > window:
                start = len(ids) - (window - slide + 1)
    return ids


@pytest.mark.parametrize(("position", "max_seq_len"), [("learned", 12), ("rotary", None)])
@pytest.mark.parametrize("slide", [1, 3, None])
def test_the_sliding_cache_continues_past_the_window_as_recompute_does(position, max_seq_len, slide):
    model = small_decoder(position, max_seq_len)
    prompt = torch.tensor([5, 9, 2, 33, 7])
    window = 12
    got = sample_ids(model, prompt, 30, window=window, temperature=0.0, slide=slide)
    assert got.tolist() == reference(model, prompt, 30, window, slide or window // 4)
    drawn = sample_ids(model, prompt, 30, window=window, temperature=1.0, top_k=20, seed=4, slide=slide)
    assert drawn.tolist() == reference(model, prompt, 30, window, slide or window // 4, 1.0, 20, 4)


def test_slide_one_is_nanogpts_crop_and_recompute():
    model = small_decoder("learned", 10)
    prompt = torch.tensor(list(range(1, 15)))  # longer than the window: cropped to its last 10
    ids = prompt.tolist()
    with torch.no_grad():
        for _ in range(12):
            ids.append(int(model(torch.tensor([ids[-10:]]))[0, -1].argmax()))
    assert sample_ids(model, prompt, 12, window=10, temperature=0, slide=1).tolist() == ids


def test_a_seed_fixes_the_text_and_top_k_limits_the_draw():
    model = small_decoder("learned", 16)
    prompt = torch.tensor([3, 4])
    a = sample_ids(model, prompt, 40, window=16, temperature=1.5, seed=1)
    assert torch.equal(a, sample_ids(model, prompt, 40, window=16, temperature=1.5, seed=1))
    assert not torch.equal(a, sample_ids(model, prompt, 40, window=16, temperature=1.5, seed=2))
    greedy = sample_ids(model, prompt, 40, window=16, temperature=0)
    assert torch.equal(greedy, sample_ids(model, prompt, 40, window=16, temperature=1.5, top_k=1, seed=9))
    assert model.training is False


def test_next_token_draws_only_from_the_top_k():
    logits = torch.tensor([[0.0, 5.0, 4.9, -1.0, 4.8]])
    g = torch.Generator().manual_seed(0)
    drawn = {int(next_token(logits, 1.0, 2, g)) for _ in range(200)}
    assert drawn == {1, 2}


def test_next_token_draws_only_from_the_nucleus():
    # probabilities 0.37, 0.33, 0.30, ...: the first two hold 0.5 of the mass, the first alone 0.3
    logits = torch.tensor([[0.0, 5.0, 4.9, -1.0, 4.8]])
    g = torch.Generator().manual_seed(0)
    assert {int(next_token(logits, 1.0, None, g, top_p=0.5)) for _ in range(200)} == {1, 2}
    assert {int(next_token(logits, 1.0, None, g, top_p=0.3)) for _ in range(50)} == {1}
    assert {int(next_token(logits, 1.0, None, g, top_p=1.0)) for _ in range(400)} == {0, 1, 2, 3, 4}


def test_generate_slides_past_max_seq_len_as_sample_does():
    model = small_decoder("learned", 12)
    prompt = torch.tensor([5, 9, 2, 33, 7])
    got = model.generate(prompt[None], 30, slide=3)  # the window is max_seq_len, 12
    assert got[0].tolist() == reference(model, prompt, 30, 12, 3)
    assert torch.equal(got[0], sample_ids(model, prompt, 30, window=12, temperature=0.0, slide=3))


def test_bad_arguments_are_refused():
    model = small_decoder("learned", 8)
    with pytest.raises(ValueError, match="non-empty 1-D"):
        sample_ids(model, torch.tensor([], dtype=torch.long), 4, window=8)
    with pytest.raises(ConfigError, match=r"^top_k: must be an integer >= 1, got 0"):
        sample_ids(model, torch.tensor([1]), 4, window=8, top_k=0)
    with pytest.raises(ValueError, match=r"slide must be in 1..window=8"):
        sample_ids(model, torch.tensor([1]), 4, window=8, slide=9)


@pytest.mark.parametrize(
    ("option", "value", "expected"),
    [
        ("temperature", math.nan, r"^temperature: must be a finite number >= 0 \(0 = greedy\), got nan"),
        ("temperature", math.inf, r"^temperature: must be a finite number >= 0 .*, got inf"),
        ("temperature", -0.5, r"^temperature: must be a finite number >= 0 .*, got -0.5"),
        ("seed", 2**70, rf"^seed: must be in 0 \.\. 2\*\*64 - 1, got {2**70}"),
        ("seed", -1, r"^seed: must be in 0 \.\. 2\*\*64 - 1, got -1"),
        ("window", 9, r"^window: 9 tokens is past the 8 positions the model has \(its max_seq_len\)"),
        ("top_p", 0.0, r"^top_p: must be a probability in \(0, 1\], got 0.0"),
        ("top_p", 1.5, r"^top_p: must be a probability in \(0, 1\], got 1.5"),
    ],
)
def test_options_no_run_can_use_are_refused_by_name(option, value, expected):
    model = small_decoder("learned", 8)
    with pytest.raises(ConfigError, match=expected):
        sample_ids(model, torch.tensor([1]), 20, **{"window": 8, option: value})


def test_the_largest_seed_and_a_tiny_temperature_sample():
    model = small_decoder("learned", 8)
    prompt = torch.tensor([3, 4])
    greedy = sample_ids(model, prompt, 6, window=8, temperature=0.0)
    # Logits divided by 1e-300 overflow float32; the draw is then greedy's, not a NaN softmax.
    assert torch.equal(sample_ids(model, prompt, 6, window=8, temperature=1e-300, seed=2**64 - 1), greedy)
