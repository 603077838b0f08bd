"""Generation against HF's own: greedy tokens of brickwork's HF class (HF's GenerationMixin on its KV
cache), of the plain model's generate and of ``brickwork sample`` equal HF's model's for the same
weights, for left-padded batches, prompts alone and end-of-sequence ids; HF's sampling, logits
processors, streamers and stopping criteria run on the brickwork class."""

from __future__ import annotations

import pytest
import torch
from generation_models import GENERATION_MODELS
from hf_models import VOCAB
from torch import nn
from transformers import StoppingCriteria, StoppingCriteriaList
from transformers.generation.streamers import BaseStreamer

from brickwork.factory.hf import from_hf
from brickwork.hf import to_hf_class
from brickwork.sampling import sample_ids

NEW = 12  # tokens to generate


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models decode token by token: threads only add synchronisation on a busy CPU."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def models(family: str) -> tuple[nn.Module, nn.Module, nn.Module]:
    """(HF's model, the brickwork model converted from it, brickwork's HF class around that one)."""
    hf = GENERATION_MODELS[family]()
    hf.generation_config.eos_token_id = None  # all NEW tokens, unless a test sets one
    hf.generation_config.pad_token_id = 0
    plain = from_hf(hf)
    ours = to_hf_class(plain)
    ours.generation_config.pad_token_id = 0
    return hf, plain, ours


def prompts() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return [torch.randint(1, VOCAB, (n,), generator=g) for n in (5, 2, 7)]


def left_padded(rows: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """The prompts right-aligned in one batch [B, T], with the attention mask of their padding."""
    width = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, row in enumerate(rows):
        ids[i, width - len(row) :], mask[i, width - len(row) :] = row, 1
    return ids, mask


@pytest.mark.parametrize("family", GENERATION_MODELS)
def test_greedy_tokens_are_hf_s_for_a_left_padded_batch_and_for_each_prompt_alone(family: str) -> None:
    hf, plain, ours = models(family)
    rows = prompts()
    ids, mask = left_padded(rows)
    with torch.no_grad():
        ref = hf.generate(ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False)
    assert ref.shape == (3, ids.shape[1] + NEW)
    assert torch.equal(ours.generate(ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False), ref)
    assert torch.equal(plain.generate(ids, NEW, attention_mask=mask), ref)
    for i, row in enumerate(rows):
        alone = ref[i, ids.shape[1] - len(row) :]
        assert torch.equal(plain.generate(row[None], NEW)[0], alone)
        window = plain.max_seq_len  # brickwork sample: the same sampler, one prompt, no slide here
        assert torch.equal(sample_ids(plain, row, NEW, window=window, temperature=0.0), alone)


@pytest.mark.parametrize("family", GENERATION_MODELS)
def test_an_end_of_sequence_id_finishes_its_row_as_in_hf(family: str) -> None:
    hf, plain, ours = models(family)
    ids, mask = left_padded(prompts())
    free = plain.generate(ids, NEW, attention_mask=mask)
    eos = int(free[0, ids.shape[1] + 2])  # row 0 ends by its third new token (others maybe sooner)
    options = dict(attention_mask=mask, max_new_tokens=NEW, do_sample=False, eos_token_id=eos, pad_token_id=0)
    with torch.no_grad():
        ref = hf.generate(ids, **options)
    assert torch.equal(ours.generate(ids, **options), ref)
    got = plain.generate(ids, NEW, attention_mask=mask, eos_token_id=eos, pad_token_id=0)
    assert torch.equal(got, ref)
    new = got[0, ids.shape[1] :]
    first = int((new == eos).nonzero()[0])  # by its third token, then padding
    assert first <= 2 and (new[first + 1 :] == 0).all()


def test_hf_sampling_and_logits_processors_run_on_the_brickwork_class() -> None:
    hf, _, ours = models("llama")
    ids, mask = left_padded(prompts())
    options = dict(attention_mask=mask, max_new_tokens=NEW, top_k=8, top_p=0.9, repetition_penalty=1.3)
    draws = []
    for seed in (1, 1, 2):
        torch.manual_seed(seed)
        draws.append(ours.generate(ids, do_sample=True, temperature=0.7, **options))
    assert torch.equal(draws[0], draws[1]) and not torch.equal(draws[0], draws[2])
    with torch.no_grad():  # HF's repetition penalty reads brickwork's logits as it reads its own
        ref = hf.generate(ids, do_sample=False, **options)
        beams = hf.generate(ids, attention_mask=mask, max_new_tokens=NEW, num_beams=3, do_sample=False)
    assert torch.equal(ours.generate(ids, do_sample=False, **options), ref)
    # beam search reorders HF's cache, which brickwork's attention writes
    assert torch.equal(ours.generate(ids, attention_mask=mask, max_new_tokens=NEW, num_beams=3), beams)


def test_streamers_and_stopping_criteria_run_on_the_brickwork_class() -> None:
    _, _, ours = models("gpt2")
    prompt = prompts()[0][None]

    class Collect(BaseStreamer):
        def __init__(self) -> None:
            self.chunks, self.ended = [], False

        def put(self, value: torch.Tensor) -> None:
            self.chunks.append(value.flatten())

        def end(self) -> None:
            self.ended = True

    class StopAfter(StoppingCriteria):
        def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs) -> torch.Tensor:
            return torch.full((input_ids.shape[0],), input_ids.shape[1] >= prompt.shape[1] + 3)

    streamer = Collect()
    out = ours.generate(prompt, max_new_tokens=NEW, do_sample=False, streamer=streamer)
    assert streamer.ended and torch.equal(torch.cat(streamer.chunks), out[0])
    stopped = ours.generate(
        prompt, max_new_tokens=NEW, do_sample=False, stopping_criteria=StoppingCriteriaList([StopAfter()])
    )
    assert torch.equal(stopped, out[:, : prompt.shape[1] + 3])


def test_the_brickwork_sampler_draws_the_same_for_a_seed_from_the_nucleus() -> None:
    _, plain, _ = models("llama")
    ids, mask = left_padded(prompts())

    def drawn(seed: int) -> torch.Tensor:
        generator = torch.Generator().manual_seed(seed)
        options = dict(temperature=0.8, top_k=8, top_p=0.9, generator=generator)
        return plain.generate(ids, NEW, attention_mask=mask, **options)

    assert torch.equal(drawn(1), drawn(1)) and not torch.equal(drawn(1), drawn(2))
    # top_p=1e-9 keeps the most likely token alone: greedy, whatever the seed
    greedy = plain.generate(ids, NEW, attention_mask=mask)
    generator = torch.Generator().manual_seed(5)
    options = dict(attention_mask=mask, temperature=1.0, top_p=1e-9, generator=generator)
    assert torch.equal(plain.generate(ids, NEW, **options), greedy)
