"""Every model family under torch.compile: one graph, no graph break, no recompile, eager's numbers.

The models are the presets shrunk to width 32 and one layer per stack (every layer traces alike, and
the graph's structure does not depend on the width). Forward passes compile with ``aot_eager``
(dynamo's capture and AOTAutograd's tracing, without Inductor's C++ build time); the training step
compiles with Inductor, forward and backward.
"""

import copy
import warnings
from typing import Any

import pytest
import torch
import torch._dynamo

from brickwork.factory import build_model, get_preset
from brickwork.train import TrainStep

VOCAB, B, T = 61, 2, 12


def _tiny(preset: str) -> dict[str, Any]:
    """``preset`` at width 32, one layer of four heads (two kv heads where it groups them), no dropout."""
    spec = get_preset(preset)
    spec["dim_model"] = 32
    spec["dropout"] = 0.0
    if "vocab_size" in spec:
        spec["vocab_size"] = VOCAB
    if spec["model"] == "image_encoder":
        spec.update(image_size=16, patch_size=8, num_classes=5)
    for stack in ("encoder", "decoder"):
        if stack not in spec:
            continue
        spec[stack]["num_layers"] = 1
        block = spec[stack]["block"]
        for name in ("attention", "cross_attention"):
            if name in block:
                kv_heads = 2 if "num_kv_heads" in block[name] else None
                block[name].update(num_heads=4, num_kv_heads=kv_heads, dropout=0.0)
                block[name]["mechanism"]["dropout"] = 0.0
        block["feedforward"].update(hidden_dim=64, dropout=0.0)
    return spec


def _inputs(preset: str, batch: int, masked: bool, seq: int = T) -> tuple[torch.Tensor, ...]:
    """The forward's positional arguments; ``masked`` adds a padding mask with two padded keys."""
    if preset == "vit":
        return (torch.randn(batch, 3, 16, 16),)
    ids = torch.randint(0, VOCAB, (batch, seq))
    mask = torch.ones(batch, seq, dtype=torch.long)
    mask[0, -2:] = 0
    if preset == "t5-small":
        return (ids, ids[:, : seq // 2].clone()) + ((mask,) if masked else ())
    return (ids, mask) if masked else (ids,)


CASES = [
    ("gpt2", False),
    ("gpt2", True),
    ("llama", False),
    ("llama", True),
    ("bert-base", False),
    ("bert-base", True),
    ("t5-small", False),
    ("t5-small", True),
    ("vit", False),
]


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize(
    ("preset", "masked"), CASES, ids=[f"{p}-{'mask' if m else 'plain'}" for p, m in CASES]
)
def test_forward_is_one_graph_matching_eager_without_recompiles(preset: str, masked: bool) -> None:
    torch.manual_seed(0)
    model = build_model(_tiny(preset)).eval()
    args = _inputs(preset, B, masked)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        explained = torch._dynamo.explain(model)(*args)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons
    # e.g. "Dynamo detected a call to a `functools.lru_cache`-wrapped function": traced around, not cached.
    assert not [w for w in caught if "Dynamo" in str(w.message)]
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    with torch.no_grad():
        torch.testing.assert_close(compiled(*args), model(*args), rtol=1e-5, atol=1e-5)
        with torch._dynamo.config.patch(error_on_recompile=True):
            again = _inputs(preset, B, masked)  # new tensors, same shapes
            torch.testing.assert_close(compiled(*again), model(*again), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("preset", ["gpt2", "llama"])
def test_training_forward_with_dropout_is_one_graph(preset: str) -> None:
    spec = _tiny(preset) | {"dropout": 0.1}
    block = spec["decoder"]["block"]
    block["feedforward"]["dropout"] = block["attention"]["dropout"] = 0.1
    block["attention"]["mechanism"]["dropout"] = 0.1
    model = build_model(spec).train()
    ids = torch.randint(0, VOCAB, (B, T))
    explained = torch._dynamo.explain(lambda x: model(x).float().logsumexp(-1).mean())(ids)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons


@pytest.mark.parametrize(
    "preset", ["gpt2", "llama", "bert-base", pytest.param("t5-small", marks=pytest.mark.slow), "vit"]
)
def test_new_batch_sizes_and_lengths_do_not_recompile_when_marked_dynamic(preset: str) -> None:
    model = build_model(_tiny(preset)).eval()
    compiled = torch.compile(model, backend="eager", fullgraph=True)

    def run(batch: int, seq: int) -> None:
        args = _inputs(preset, batch, masked=preset != "vit", seq=seq)
        for tensor in args:
            torch._dynamo.mark_dynamic(tensor, 0)
            if tensor.dim() == 2:  # ids and masks: the sequence dim too
                torch._dynamo.mark_dynamic(tensor, 1)
        with torch.no_grad():
            torch.testing.assert_close(compiled(*args), model(*args), rtol=1e-5, atol=1e-5)

    run(2, T)
    with torch._dynamo.config.patch(error_on_recompile=True):
        run(3, T)
        run(5, T - 4)


@pytest.mark.slow
def test_compiled_train_step_matches_eager_and_compiles_once() -> None:
    """The Llama-shaped model in the one training step, forward and backward through Inductor."""
    torch.manual_seed(0)
    eager = build_model(_tiny("llama"))
    model = copy.deepcopy(eager)
    steps = [
        TrainStep(m, torch.optim.SGD(m.parameters(), lr=0.1), "causal_lm")
        for m in (eager, torch.compile(model, fullgraph=True))
    ]
    for index in range(3):
        ids = torch.randint(0, VOCAB, (B, T))
        batch = {"input_ids": ids, "labels": ids}
        with torch._dynamo.config.patch(error_on_recompile=index > 0):
            losses = [step(batch) for step in steps]
        assert losses[1] == pytest.approx(losses[0], rel=1e-5)
    for p, q in zip(eager.parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(q, p, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("masked", [False, True])
def test_kv_cache_decoding_stops_recompiling_after_the_first_steps(masked: bool) -> None:
    """Prefill, then decode steps: the cache length turns dynamic after one static decode graph."""
    torch.manual_seed(0)
    model = build_model(_tiny("llama")).eval()
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    ids = torch.randint(0, VOCAB, (B, T))
    mask = torch.ones(B, T, dtype=torch.long)
    mask[0, :3] = 0  # left padding, as batched generation has
    caches = model.new_cache(), model.new_cache()
    with torch.no_grad():
        for step in range(5):
            extra = (mask,) if masked else ()
            tokens = ids if step == 0 else ids[:, :1] + step
            with torch._dynamo.config.patch(error_on_recompile=step >= 3):
                got = compiled(tokens, *extra, cache=caches[0])
            torch.testing.assert_close(got, model(tokens, *extra, cache=caches[1]), rtol=1e-5, atol=1e-5)
            # The mask grows as a generation loop grows it: a new contiguous tensor per step.
            mask = torch.cat([mask, torch.ones(B, 1, dtype=torch.long)], dim=1)


def test_bad_input_raises_the_eager_error_under_compile() -> None:
    """Checks on shapes and dtypes run while dynamo traces; a failing one falls back to eager and raises
    there. (With ``fullgraph=True`` no fallback is allowed: torch raises ``Unsupported`` instead, with
    the original error in its message.)"""
    spec = _tiny("gpt2") | {"max_seq_len": 16}
    model = build_model(spec).eval()
    compiled = torch.compile(model, backend="eager")
    ids = torch.zeros(2, 4, dtype=torch.long)
    bad = [
        (ValueError, r"input_ids must have shape \[B, T\], got shape \(1, 2, 4\)", (ids[None],)),
        (TypeError, r"input_ids must hold integer token ids, got dtype torch.float32", (ids.float(),)),
        (
            ValueError,
            r"attention_mask must have the shape of the ids \(2, 4\), got \(2, 5\)",
            (ids, torch.ones(2, 5)),
        ),
        (
            ValueError,
            r"input_ids reach position 20, beyond max_seq_len=16",
            (torch.zeros(1, 20, dtype=torch.long),),
        ),
    ]
    for error, message, args in bad:
        for forward in (model, compiled):
            with pytest.raises(error, match=message):
                forward(*args)
