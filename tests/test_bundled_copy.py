"""The bundled copying model (tiny-gdn-copy): it copies a repeated passage of natural text, which is what
prompt-lookup speculation drafts, so speculation accepts most drafts on repetitive text; ReplayCache's prompt lookup
on it emits plain greedy's tokens in far fewer forwards."""

from __future__ import annotations

import functools

import torch

from hf_replayssm import ReplayCache
from hf_replayssm.demo import DEFAULT_PROMPT
from hf_replayssm.models import BUNDLED, bundled_path, load_model

NAME = "tiny-gdn-copy"


@functools.cache
def _load():
    return load_model(NAME, device="cpu")


def test_bundled_with_its_training_note():
    model, tokenizer = _load()
    assert NAME in BUNDLED and tokenizer is not None and model.config.model_type == "qwen3_5_text"
    note = (bundled_path(NAME) / "TRAINING.txt").read_text()
    assert "--repeat-random" in note and "--repeat-mix 0.6" in note and "later copies 0.960" in note


def test_copies_a_repeated_passage():
    """Teacher-forced top-1 on a Hamlet passage said three times: the first copy can only be predicted, the later
    ones copied (tiny-gdn: 0.26 on both)."""
    model, tokenizer = _load()
    passage = tokenizer(DEFAULT_PROMPT)["input_ids"]
    ids = torch.tensor([passage * 3])
    with torch.no_grad():
        hit = (model(ids).logits[0, :-1].argmax(-1) == ids[0, 1:]).float()
    first, later = hit[: len(passage) - 1].mean().item(), hit[len(passage) :].mean().item()
    assert later > 0.85 and later > first + 0.3, (first, later)


def test_prompt_lookup_equals_greedy_in_fewer_forwards():
    """generate(prompt_lookup_num_tokens=10) with a ReplayCache on a passage said twice: plain greedy's tokens, with
    far fewer model forwards than tokens (each accepted draft is a token without a forward of its own)."""
    model, tokenizer = _load()
    passage = tokenizer(DEFAULT_PROMPT)["input_ids"]
    prompt = torch.tensor([passage * 2])
    new = 60
    settings = dict(do_sample=False, max_new_tokens=new, min_new_tokens=new, suppress_tokens=[0])
    greedy = model.generate(prompt, past_key_values=ReplayCache(), **settings)
    forwards = []
    hook = model.register_forward_pre_hook(lambda module, args, kwargs: forwards.append(1), with_kwargs=True)
    try:
        cache = ReplayCache()
        lookup = model.generate(prompt, past_key_values=cache, prompt_lookup_num_tokens=10, **settings)
    finally:
        hook.remove()
    assert torch.equal(lookup, greedy)
    assert len(forwards) <= new // 2, len(forwards)  # the prefill plus verify forwards (greedy: 1 + 59; seen: 22)
    assert cache.stats()["rolled_back_tokens"] > 0  # some drafts were rejected and rolled back exactly
