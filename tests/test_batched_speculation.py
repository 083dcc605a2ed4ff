"""Batched speculation: rows of one batch accept different numbers of drafts and each is rolled back exactly
(``ReplayCache.drop_rows``; attention positions masked by the caller), against every row decoded alone."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from transformers import DynamicCache

from hf_replayssm import ReplayCache
from hf_replayssm.layers import RollbackError
from hf_replayssm.tiny import tiny_model

FAMILIES = ["nemotron_h", "qwen3_5_text", "kimi_linear", "lfm2"]
ROWS, PROMPT = 3, 8
_MODELS: dict[str, torch.nn.Module] = {}


def _model(model_type):
    if model_type not in _MODELS:
        _MODELS[model_type] = tiny_model(model_type, seed=0, initializer_range=0.2)
    return _MODELS[model_type]


def _alone(model, tokens: list[int]) -> torch.Tensor:
    """Logits [T, V] of one row decoded alone with a stock cache: the prompt in one forward, then one token per
    forward (Mamba-2 mixers clamp dt in a multi-token forward and not in a decode step, so this is the reference)."""
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        logits = [model(torch.tensor([tokens[:PROMPT]]), past_key_values=cache, use_cache=True).logits[0]]
        for token in tokens[PROMPT:]:
            logits.append(model(torch.tensor([[token]]), past_key_values=cache, use_cache=True).logits[0])
    return torch.cat(logits)


def run_rounds(model, cache, prompt: torch.Tensor, rounds: list[tuple[int, list[int]]], seed: int):
    """Feed ``rounds`` of (window length, tokens each row drops of it) through ``cache``; returns every row's kept
    tokens and the logits our path gave at each kept position."""
    generator = torch.Generator().manual_seed(seed)
    vocab = model.config.vocab_size
    cache.activate_past_recording()
    cache.expect_prompt(prompt.shape[1])
    mask = torch.ones_like(prompt)
    kept = [row.tolist() for row in prompt]
    with torch.no_grad():
        out = model(prompt, attention_mask=mask, past_key_values=cache, use_cache=True)
    logits = [list(out.logits[r]) for r in range(ROWS)]
    for length, dropped in rounds:
        window = torch.randint(3, vocab, (ROWS, length), generator=generator)
        positions = torch.tensor([len(k) for k in kept])[:, None] + torch.arange(length)
        mask = torch.cat([mask, torch.ones(ROWS, length, dtype=mask.dtype)], dim=1)
        with torch.no_grad():
            out = model(window, attention_mask=mask, position_ids=positions, past_key_values=cache, use_cache=True)
        cache.drop_rows(dropped)
        for r, count in enumerate(dropped):
            keep = length - count
            kept[r] += window[r, :keep].tolist()
            logits[r] += list(out.logits[r, :keep])
            if count:
                mask[r, mask.shape[1] - count :] = 0
    return kept, [torch.stack(row) for row in logits]


@pytest.mark.parametrize("model_type", FAMILIES)
@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture],
          phases=[Phase.explicit, Phase.reuse, Phase.generate])  # no shrinking: each example runs a model
@given(data=st.data())
def test_rows_accepting_different_drafts_equal_rows_alone(model_type, data):
    model = _model(model_type)
    buffer_len = data.draw(st.sampled_from([1, 3, 4]), label="buffer_len")
    rounds = []
    for _ in range(data.draw(st.integers(3, 6), label="rounds")):
        length = data.draw(st.integers(1, 4), label="window")
        rounds.append((length, [data.draw(st.integers(0, length - 1), label="dropped") for _ in range(ROWS)]))
    seed = data.draw(st.integers(0, 2**16), label="seed")
    prompt = torch.randint(3, model.config.vocab_size, (ROWS, PROMPT), generator=torch.Generator().manual_seed(seed))
    cache = ReplayCache(buffer_len, window=4)
    kept, ours = run_rounds(model, cache, prompt, rounds, seed)
    for r in range(ROWS):
        reference = _alone(model, kept[r])
        assert ours[r].shape == reference.shape
        diff = (ours[r] - reference).abs().max().item()
        assert diff < 1e-4, (r, diff)
    dropped = sum(sum(d) for _, d in rounds)
    assert cache.stats()["rolled_back_tokens"] == dropped * len(cache.replay_layers)


def test_drop_rows_refusals():
    model = _model("qwen3_5_text")
    prompt = torch.randint(3, 100, (ROWS, PROMPT))
    cache = ReplayCache(4, window=4)
    run_rounds(model, cache, prompt, [(3, [0, 1, 2])], seed=0)
    with pytest.raises(RollbackError, match="only the last 0"):  # committed tokens cannot be dropped
        cache.drop_rows([0, 1, 0])
    with pytest.raises(ValueError, match=">= 0"):
        cache.drop_rows([0, -1, 0])
    with pytest.raises(ValueError, match="rows"):
        for layer in cache.replay_layers.values():
            layer.schedule.drop_rows_newest([0, 0])
    static = ReplayCache(4, max_cache_len=32)
    with pytest.raises(RollbackError, match="static"):
        static.drop_rows([0, 0, 0])
