"""The GPU-trained bundled models (small-mamba2, small-kda, small-gdn): they load offline on CPU within the 8 MB
budget, their TRAINING.txt records how they were made, ReplayCache decodes them exactly like stock decoding, and they
recall a name at distance 16 (the lm-eval recall task's scoring, by log-likelihood of the four candidate names)."""

from __future__ import annotations

import functools

import pytest
import torch

from hf_replayssm import ReplayCache, cache_argument
from hf_replayssm.eval import recall
from hf_replayssm.models import BUNDLED, bundled_path, load_model
from hf_replayssm.models.train import MAX_WEIGHT_BYTES

ARCH = {"small-mamba2": "nemotron_h", "small-kda": "kimi_linear", "small-gdn": "qwen3_5_text"}
SMALL = list(ARCH)
GREEDY = dict(do_sample=False, max_new_tokens=16, min_new_tokens=16, output_logits=True, return_dict_in_generate=True,
              suppress_tokens=[0])  # a generated pad token would make generate() infer a padding mask


@functools.cache
def _load(name: str):
    model, tokenizer = load_model(name, device="cpu")
    return model, tokenizer


@pytest.mark.parametrize("name", SMALL)
def test_loads_offline_in_budget(name):
    model, tokenizer = _load(name)
    assert name in BUNDLED and tokenizer is not None
    assert all(p.dtype == torch.float32 for p in model.parameters())
    weights = bundled_path(name) / "model.safetensors"
    assert weights.stat().st_size <= MAX_WEIGHT_BYTES
    assert model.config.vocab_size == len(tokenizer)


@pytest.mark.parametrize("name", SMALL)
def test_training_note(name):
    note = (bundled_path(name) / "TRAINING.txt").read_text()
    assert f"command: python -m hf_replayssm.models.train --arch {ARCH[name]} --out /tmp/m/{name}" in note
    assert "--size small" in note and "--context 2048" in note
    assert "decay half-lives per head" in note and "all " in note and "heads >= 100 tokens" in note
    assert "recall_d1024" in note and "held_out_loss=" in note


def random_verse(tokenizer) -> str:
    """About 30 tokens of the recall task's Shakespearean filler, from a fresh random seed."""
    count = recall.TokenCounter(lambda text: tokenizer(text, add_special_tokens=False)["input_ids"])
    return recall.make_filler(torch.randint(10**6, ()).item(), 0, 30, count)[0].lstrip()


@pytest.mark.parametrize("name", SMALL)
def test_replay_cache_matches_stock_greedy(name):
    model, tokenizer = _load(name)
    prompt = tokenizer(random_verse(tokenizer), return_tensors="pt")["input_ids"][:, :24]
    assert prompt.shape == (1, 24)
    stock = model.generate(prompt, **GREEDY)
    cache = ReplayCache(buffer_len=4)
    out = model.generate(prompt, **GREEDY, **{cache_argument(model): cache})
    assert torch.equal(out.sequences, stock.sequences)
    assert len(out.logits) == len(stock.logits) == 16
    assert max((a - b).abs().max().item() for a, b in zip(out.logits, stock.logits, strict=True)) < 1e-4
    assert cache.stats()["flushes"] > 0  # 15 decode steps with a buffer of 4: the flush path ran


def choice_log_likelihoods(model, tokenizer, doc: dict) -> list[float]:
    """Summed log-probability of each candidate name after the document's context, as lm-eval scores the task
    (continuation " Name"; byte-level BPE tokenizes the concatenation as the two parts)."""
    context = tokenizer(doc["context"], add_special_tokens=False)["input_ids"]
    scores = []
    for choice in doc["choices"]:
        continuation = tokenizer(" " + choice, add_special_tokens=False)["input_ids"]
        ids = torch.tensor([context + continuation])
        with torch.no_grad():
            log_probs = model(ids).logits[0, len(context) - 1 : -1].float().log_softmax(-1)
        scores.append(log_probs.gather(-1, torch.tensor(continuation)[:, None]).sum().item())
    return scores


@pytest.mark.parametrize("name", SMALL)
def test_recalls_name_at_distance_16(name):
    """The evaluation's first four documents (seed 1234) at distance 16: at least 3 of 4 right (chance: 1 in 4)."""
    model, tokenizer = _load(name)
    count = recall.TokenCounter(lambda text: tokenizer(text, add_special_tokens=False)["input_ids"])
    correct = 0
    for index in range(4):
        doc = recall.make_doc(index, 16, count=count)
        assert 14 <= doc["filler_tokens"] <= 18
        scores = choice_log_likelihoods(model, tokenizer, doc)
        correct += max(range(len(scores)), key=scores.__getitem__) == doc["answer"]
    assert correct >= 3, f"{name}: {correct} of 4"
