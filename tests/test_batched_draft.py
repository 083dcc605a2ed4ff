"""Batched speculation with a draft model (``hf_replayssm.batched_draft.DraftModelDrafter``): the draft model's own
ReplayCache rolls each row back exactly, so its drafts equal that row's greedy continuation under the draft model
alone, and the batch's output equals every row decoded alone with plain greedy decoding."""

from __future__ import annotations

import pytest
import torch

from hf_replayssm import ReplayCache
from hf_replayssm.batched import batched_prompt_lookup
from hf_replayssm.batched_draft import DraftModelDrafter
from hf_replayssm.tiny import tiny_model

FAMILIES = ["nemotron_h", "qwen3_5_text", "kimi_linear"]
NEW = 14


def _batch(model, lengths, seed):
    generator = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(3, model.config.vocab_size, (n,), generator=generator).tolist() for n in lengths]
    width = max(lengths)
    input_ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    return prompts, input_ids, mask


def _greedy(model, tokens: list[int], new: int) -> list[int]:
    """``new`` greedy tokens after ``tokens``, the end of sequence included where greedy picks it."""
    with torch.no_grad():
        out = model.generate(torch.tensor([tokens]), do_sample=False, max_new_tokens=new, min_new_tokens=new,
                             eos_token_id=None, pad_token_id=0)
    return out[0, len(tokens) :].tolist()


class RecordingDrafter(DraftModelDrafter):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.rounds = []

    def draft_batch(self, histories, counts):
        drafts = super().draft_batch(histories, counts)
        self.rounds.append(([list(h) for h in histories], list(counts), drafts))
        return drafts


@pytest.mark.parametrize("model_type", FAMILIES)
def test_self_draft_accepts_everything(model_type):
    """The main model as its own draft: every draft is accepted (a draft cache rolled back wrong would drift and be
    rejected), and every row equals its greedy decoding alone."""
    model = tiny_model(model_type, seed=0, initializer_range=0.2)
    prompts, input_ids, mask = _batch(model, [10, 7, 9], seed=1)
    result = batched_prompt_lookup(model, input_ids, attention_mask=mask, max_new_tokens=NEW, num_draft_tokens=4,
                                   cache=ReplayCache(4), drafter=DraftModelDrafter(model, buffer_len=4, max_drafts=4))
    assert result.acceptance == 1.0 and result.forwards < NEW
    for prompt, new in zip(prompts, result.new_tokens, strict=True):
        assert new == _greedy(model, prompt, NEW)


@pytest.mark.parametrize("model_type", FAMILIES)
def test_another_draft_model_drafts_each_rows_greedy_continuation(model_type):
    """A different (random) draft model: drafts are partly rejected, with different counts per row; each round's
    drafts equal the draft model's own greedy continuation of that row alone, and the output is exact."""
    model = tiny_model(model_type, seed=0, initializer_range=0.2)
    draft = tiny_model(model_type, seed=5, initializer_range=0.2)
    prompts, input_ids, mask = _batch(model, [9, 12, 6], seed=2)
    drafter = RecordingDrafter(draft, buffer_len=4, max_drafts=3)
    result = batched_prompt_lookup(model, input_ids, attention_mask=mask, max_new_tokens=NEW, num_draft_tokens=3,
                                   cache=ReplayCache(4), drafter=drafter)
    for prompt, new in zip(prompts, result.new_tokens, strict=True):
        assert new == _greedy(model, prompt, NEW)
    assert len(drafter.rounds) == result.forwards >= 3
    for histories, counts, drafts in drafter.rounds:
        for history, count, row_drafts in zip(histories, counts, drafts, strict=True):
            assert row_drafts == (_greedy(draft, history, count) if count else [])
    assert result.accepted < result.drafted


def test_generate_routes_a_batch_with_a_draft_model():
    model = tiny_model("qwen3_5_text", seed=0, initializer_range=0.2)
    draft = tiny_model("qwen3_5_text", seed=0, initializer_range=0.2)
    draft.generation_config.num_assistant_tokens = 3
    prompts, input_ids, mask = _batch(model, [8, 11], seed=3)
    out = model.generate(input_ids, attention_mask=mask, assistant_model=draft, past_key_values=ReplayCache(4),
                         do_sample=False, max_new_tokens=NEW, eos_token_id=None, pad_token_id=0)
    for row, prompt in enumerate(prompts):
        assert out[row, input_ids.shape[1] :].tolist() == _greedy(model, prompt, NEW)


def test_a_dense_draft_model():
    """A draft without SSM layers (a small Llama): its ReplayCache holds only attention layers, rolled back by the
    mask; the batch still equals plain greedy per row."""
    from transformers import LlamaConfig, LlamaForCausalLM

    model = tiny_model("nemotron_h", seed=0, initializer_range=0.2)
    torch.manual_seed(0)
    draft = LlamaForCausalLM(LlamaConfig(vocab_size=model.config.vocab_size, hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                         initializer_range=0.2)).eval()
    prompts, input_ids, mask = _batch(model, [7, 10], seed=6)
    drafter = RecordingDrafter(draft, buffer_len=4, max_drafts=3)
    result = batched_prompt_lookup(model, input_ids, attention_mask=mask, max_new_tokens=NEW, num_draft_tokens=3,
                                   cache=ReplayCache(4), drafter=drafter)
    for prompt, new in zip(prompts, result.new_tokens, strict=True):
        assert new == _greedy(model, prompt, NEW)
    histories, counts, drafts = drafter.rounds[-1]
    assert drafts[0] == (_greedy(draft, histories[0], counts[0]) if counts[0] else [])


def test_generate_refuses_a_draft_with_another_vocabulary():
    model = tiny_model("qwen3_5_text", seed=0, initializer_range=0.2)
    draft = tiny_model("qwen3_5_text", seed=0, initializer_range=0.2, vocab_size=model.config.vocab_size + 8)
    _, input_ids, mask = _batch(model, [6, 6], seed=5)
    with pytest.raises(ValueError, match="needs the main model's vocabulary"):
        model.generate(input_ids, attention_mask=mask, assistant_model=draft, past_key_values=ReplayCache(4),
                       do_sample=False, max_new_tokens=4)


def test_too_many_drafts_are_refused():
    model = tiny_model("nemotron_h", seed=0, initializer_range=0.2)
    _, input_ids, mask = _batch(model, [6, 6], seed=4)
    with pytest.raises(ValueError, match="at most 2 drafts per row"):
        batched_prompt_lookup(model, input_ids, attention_mask=mask, max_new_tokens=8, num_draft_tokens=4,
                              cache=ReplayCache(4), drafter=DraftModelDrafter(model, buffer_len=4, max_drafts=2))
