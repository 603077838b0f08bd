"""HF's own code on brickwork models: pipelines (text-generation, fill-mask), PEFT's LoRA (train,
save, reload, merge) and the Trainer (predictions for compute_metrics, save_model folders that load
both ways). Tokenizers are built here, offline, with ``tokenizers``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers
from peft import LoraConfig, PeftModel, get_peft_model
from safetensors.torch import load_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from brickwork.factory import build_model, from_pretrained, get_preset
from brickwork.hf import BrickworkForCausalLM, to_hf_class

WORDS = ["the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "to", "red", "ball", "while", "birds"]


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models: threads only add synchronisation on a busy CPU."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tokenizer() -> transformers.PreTrainedTokenizerFast:
    """A word-level tokenizer: four special tokens, then the words."""
    vocab = {w: i for i, w in enumerate(["[PAD]", "[UNK]", "[MASK]", "[EOS]", *WORDS])}
    words = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    words.decoder = decoders.WordPiece()  # joins words with spaces
    specials = dict(pad_token="[PAD]", unk_token="[UNK]", mask_token="[MASK]", eos_token="[EOS]")
    return transformers.PreTrainedTokenizerFast(tokenizer_object=words, **specials)


def causal_spec(vocab_size: int) -> dict:
    spec = get_preset("gpt-tiny") | {"vocab_size": vocab_size, "dim_model": 32, "max_seq_len": 32}
    block = {**spec["decoder"]["block"], "attention": {"num_heads": 2, "fused_qkv": True}}
    return spec | {"vocab_multiple": 16, "decoder": {**spec["decoder"], "num_layers": 2, "block": block}}


def causal_lm(vocab_size: int, seed: int = 0) -> BrickworkForCausalLM:
    torch.manual_seed(seed)
    return to_hf_class(build_model(causal_spec(vocab_size)))


def batches(tokenizer, count: int = 8) -> list[dict[str, torch.Tensor]]:
    """Causal-LM samples of 8 word ids, HF's way: labels are the input ids."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(4, len(tokenizer), (count, 8), generator=g)
    return [{"input_ids": row, "labels": row} for row in ids]


def test_text_generation_and_fill_mask_pipelines_run_brickwork_models(tokenizer, tmp_path: Path) -> None:
    model = causal_lm(len(tokenizer)).eval()
    prompt = "the cat sat on"
    generate = transformers.pipeline("text-generation", model=model, tokenizer=tokenizer)
    text = generate(prompt, max_new_tokens=5, do_sample=False, return_full_text=False)[0]["generated_text"]
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    greedy = model.model.generate(ids, 5)  # the plain model's own sampler
    assert text.split() == tokenizer.decode(greedy[0, ids.shape[1] :]).split()
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    from_folder = transformers.pipeline("text-generation", model=str(tmp_path))
    batch = from_folder([prompt, "a dog"], max_new_tokens=5, do_sample=False, return_full_text=False)
    assert batch[0][0]["generated_text"] == text

    spec = get_preset("bert-base") | {"vocab_size": len(tokenizer), "dim_model": 32, "max_seq_len": 32}
    spec["encoder"] = {**spec["encoder"], "num_layers": 2}
    spec["encoder"]["block"] = {**spec["encoder"]["block"], "attention": {"num_heads": 2}}
    encoder = build_model(spec | {"type_vocab_size": 0}).eval()
    fill = transformers.pipeline("fill-mask", model=to_hf_class(encoder), tokenizer=tokenizer)
    found = fill("the cat [MASK] on a mat", top_k=3)
    masked = tokenizer("the cat [MASK] on a mat", return_tensors="pt").input_ids
    with torch.no_grad():
        probs = encoder(masked)[0, 2].softmax(-1)
    top = probs.topk(3)
    assert [f["token"] for f in found] == top.indices.tolist()
    torch.testing.assert_close(torch.tensor([f["score"] for f in found]), top.values)


def test_lora_trains_saves_reloads_and_merges(tokenizer, tmp_path: Path) -> None:
    base = causal_lm(len(tokenizer))
    base.save_pretrained(tmp_path / "base")
    lora = get_peft_model(
        base, LoraConfig(task_type="CAUSAL_LM", target_modules=["qkv_proj", "out_proj"], r=4, lora_alpha=8)
    )
    trainable = [p for p in lora.parameters() if p.requires_grad]
    assert trainable and sum(p.numel() for p in trainable) < 0.1 * lora.num_parameters()
    optimizer = torch.optim.AdamW(trainable, lr=3e-2)
    batch = torch.stack([b["input_ids"] for b in batches(tokenizer)])
    losses = []
    for _ in range(8):
        loss = lora(input_ids=batch, labels=batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    lora.save_pretrained(tmp_path / "adapter")
    lora.eval()
    with torch.no_grad():
        ref = lora(input_ids=batch).logits
    assert lora.generate(input_ids=batch[:2, :4], max_new_tokens=4, do_sample=False).shape == (2, 8)

    fresh = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "base")
    reloaded = PeftModel.from_pretrained(fresh, tmp_path / "adapter").eval()
    with torch.no_grad():
        assert torch.equal(reloaded(input_ids=batch).logits, ref)
        merged = reloaded.merge_and_unload()
        assert isinstance(merged, BrickworkForCausalLM)
        torch.testing.assert_close(merged(batch).logits, ref, rtol=1e-5, atol=1e-5)
    merged.save_pretrained(tmp_path / "merged")
    again = from_pretrained(tmp_path / "merged").eval()
    with torch.no_grad():
        torch.testing.assert_close(again(batch), ref, rtol=1e-5, atol=1e-5)


def next_token_accuracy(prediction: transformers.EvalPrediction) -> dict[str, float]:
    logits, labels = torch.as_tensor(prediction.predictions), torch.as_tensor(prediction.label_ids)
    return {"accuracy": (logits[:, :-1].argmax(-1) == labels[:, 1:]).float().mean().item()}


@pytest.mark.parametrize("hf_class", [True, False], ids=["hf_class", "plain"])
def test_trainer_gets_predictions_and_its_saved_folder_loads(hf_class: bool, tokenizer, tmp_path) -> None:
    model = causal_lm(len(tokenizer))
    model = model if hf_class else model.model
    data = batches(tokenizer)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "run"), per_device_train_batch_size=4, per_device_eval_batch_size=4,
        max_steps=2, learning_rate=1e-3, report_to=[], use_cpu=True, save_strategy="no",
        disable_tqdm=True, logging_strategy="no",
    )  # fmt: skip
    trainer = transformers.Trainer(
        model=model, args=args, train_dataset=data, eval_dataset=data, compute_metrics=next_token_accuracy
    )
    trainer.train()
    accuracy = trainer.evaluate()["eval_accuracy"]
    batch = torch.stack([b["input_ids"] for b in data])
    model.eval()
    with torch.no_grad():
        logits = model(batch).logits if hf_class else model(batch)
    expected = next_token_accuracy(transformers.EvalPrediction(logits.numpy(), batch.numpy()))["accuracy"]
    assert accuracy == pytest.approx(expected)
    trainer.save_model(tmp_path / "saved")
    if hf_class:
        with torch.no_grad():
            loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "saved")
            assert torch.equal(loaded(batch).logits, logits)
            assert torch.equal(from_pretrained(tmp_path / "saved").eval()(batch), logits)
        return
    # A plain model's folder holds its weights alone: they load into the model, the spec is needed
    with pytest.raises(FileNotFoundError, match="without a spec"):
        from_pretrained(tmp_path / "saved")
    again = build_model(model.spec).eval()
    again.load_state_dict(load_file(tmp_path / "saved" / "model.safetensors"))
    with torch.no_grad():
        assert torch.equal(again(batch), logits)
