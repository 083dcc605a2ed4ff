"""The ReplaySSM schedule: no state write between flushes, one flush every L steps, L=1 = step decoding."""

import pytest
import torch
from conftest import decode, get_model
from transformers import DynamicCache

from hf_replayssm import ReplayCache

pytestmark = pytest.mark.equivalence


@pytest.mark.parametrize("model_type", ["nemotron_h", "qwen3_next", "kimi_linear", "zamba2"])
def test_checkpoint_written_only_at_flushes(model_type):
    model = get_model(model_type)
    buffer_len, steps = 4, 13
    cache = ReplayCache(buffer_len=buffer_len)
    with torch.no_grad():
        model(torch.randint(3, 120, (2, 6)), past_key_values=cache, use_cache=True)
        layers = cache.replay_layers
        pointers = {idx: layer.checkpoint.data_ptr() for idx, layer in layers.items()}
        before = {idx: layer.checkpoint.clone() for idx, layer in layers.items()}
        for step in range(1, steps + 1):
            model(torch.randint(3, 120, (2, 1)), past_key_values=cache, use_cache=True)
            flush = step % buffer_len == 0
            for idx, layer in layers.items():
                assert layer.checkpoint.data_ptr() == pointers[idx]  # written in place, static address
                assert torch.equal(layer.checkpoint, before[idx]) != flush, (step, idx)
                assert layer.num_buffered == step % buffer_len
                before[idx] = layer.checkpoint.clone()
    stats = cache.stats()
    assert stats["decode_steps"] == steps * len(layers)
    assert stats["flushes"] == (steps // buffer_len) * len(layers)
    assert stats["checkpoint_writes"] == (1 + steps // buffer_len) * len(layers)
    assert stats["rolled_back_tokens"] == 0


@pytest.mark.parametrize("model_type", ["nemotron_h", "falcon_h1", "qwen3_5_text", "kimi_linear"])
def test_buffer_len_one_is_step_decoding(model_type):
    """With L=1 every step folds its token straight into the checkpoint, which then tracks the stock state."""
    model = get_model(model_type)
    cache, stock = ReplayCache(buffer_len=1), DynamicCache(config=model.config)
    tokens = torch.randint(3, 120, (1, 5))
    for _ in range(6):
        decode(model, tokens, tokens.shape[1], cache)  # the new tokens only: a prefill, then single steps
        decode(model, tokens, tokens.shape[1], stock)
        for idx, layer in cache.replay_layers.items():
            assert layer.num_buffered == 0
            stock_state = stock.layers[idx].recurrent_states[0]
            torch.testing.assert_close(layer.checkpoint, stock_state.float(), atol=1e-5, rtol=1e-5)
        tokens = torch.randint(3, 120, (1, 1))


def test_current_state_matches_stock_between_flushes():
    model = get_model("qwen3_next")
    cache, stock = ReplayCache(buffer_len=8), DynamicCache(config=model.config)
    tokens = torch.randint(3, 120, (1, 10))
    decode(model, tokens, 5, cache)
    decode(model, tokens, 5, stock)
    for idx, layer in cache.replay_layers.items():
        assert layer.num_buffered == 5
        torch.testing.assert_close(layer.current_state(), stock.layers[idx].recurrent_states[0], atol=1e-5, rtol=1e-5)
