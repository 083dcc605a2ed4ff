"""Greedy / sampled / beam decoding with ReplayCache against each model's stock decoding, on logits."""

import pytest
import torch
from conftest import SUPPORTED, cache_kwarg, decode, get_model, max_logit_diff

from hf_replayssm import ReplayCache
from hf_replayssm.tiny import tiny_model

pytestmark = pytest.mark.equivalence
GREEDY = dict(do_sample=False, max_new_tokens=24, min_new_tokens=24, output_logits=True, return_dict_in_generate=True)


@pytest.mark.parametrize("model_type", SUPPORTED)
def test_greedy_matches_stock(model_type):
    model = get_model(model_type)
    prompt = torch.randint(3, 120, (2, 7))
    stock = model.generate(prompt, **GREEDY)
    for buffer_len in (1, 4, 16):  # 1 = plain step decoding; 4 and 16 put flushes inside the run
        cache = ReplayCache(buffer_len=buffer_len)
        out = model.generate(prompt, **GREEDY, **{cache_kwarg(model): cache})
        assert torch.equal(out.sequences, stock.sequences), buffer_len
        assert max_logit_diff(out.logits, stock.logits) < 1e-4, buffer_len
        stats = cache.stats()
        layers = stats["ssm_layers"]
        assert layers > 0
        steps = GREEDY["max_new_tokens"] - 1  # the first new token comes from the prefill
        assert stats["decode_steps"] == layers * steps
        assert stats["flushes"] == layers * (steps // buffer_len)
        assert stats["checkpoint_writes"] == layers * (1 + steps // buffer_len)


@pytest.mark.parametrize("model_type", ["nemotron_h", "qwen3_next", "kimi_linear", "falcon_h1"])
def test_left_padded_batch(model_type):
    model = get_model(model_type)
    prompt = torch.randint(3, 120, (3, 9))
    mask = torch.ones_like(prompt)
    mask[0, :4] = 0  # left padding of different lengths
    mask[1, :2] = 0
    prompt[mask == 0] = model.config.get_text_config().pad_token_id or 0
    stock = model.generate(prompt, attention_mask=mask, **GREEDY)
    out = model.generate(prompt, attention_mask=mask, past_key_values=ReplayCache(buffer_len=5), **GREEDY)
    assert torch.equal(out.sequences, stock.sequences)
    assert max_logit_diff(out.logits, stock.logits) < 1e-4


@pytest.mark.parametrize("model_type", ["nemotron_h", "qwen3_5_text", "kimi_linear"])
def test_sampling_and_num_return_sequences(model_type):
    model = get_model(model_type)
    prompt = torch.randint(3, 120, (2, 6))
    kwargs = dict(do_sample=True, top_k=20, num_return_sequences=3, max_new_tokens=20, min_new_tokens=20,
                  output_logits=True, return_dict_in_generate=True)
    torch.manual_seed(7)
    stock = model.generate(prompt, **kwargs)
    torch.manual_seed(7)
    cache = ReplayCache(buffer_len=6)
    out = model.generate(prompt, past_key_values=cache, **kwargs)
    assert out.sequences.shape[0] == 6
    assert torch.equal(out.sequences, stock.sequences)
    assert max_logit_diff(out.logits, stock.logits) < 1e-4


@pytest.mark.parametrize("model_type", ["nemotron_h", "qwen3_next", "zamba2"])
def test_beam_search_reorders_replay_buffers(model_type):
    model = get_model(model_type)
    prompt = torch.randint(3, 120, (1, 6))
    kwargs = dict(num_beams=3, do_sample=False, max_new_tokens=14, min_new_tokens=14, output_scores=True,
                  return_dict_in_generate=True)
    stock = model.generate(prompt, **kwargs)
    out = model.generate(prompt, past_key_values=ReplayCache(buffer_len=4), **kwargs)
    assert torch.equal(out.sequences, stock.sequences)
    torch.testing.assert_close(out.sequences_scores, stock.sequences_scores, atol=1e-4, rtol=1e-5)


def test_pure_attention_model_behaves_like_dynamic_cache():
    model = get_model("llama")
    prompt = torch.randint(3, 120, (1, 6))
    stock = model.generate(prompt, **GREEDY)
    cache = ReplayCache()
    out = model.generate(prompt, past_key_values=cache, **GREEDY)
    assert torch.equal(out.sequences, stock.sequences)
    assert max_logit_diff(out.logits, stock.logits) < 1e-5
    assert cache.stats()["ssm_layers"] == 0
    pld = model.generate(prompt, past_key_values=ReplayCache(), prompt_lookup_num_tokens=3, **GREEDY)
    assert torch.equal(pld.sequences, stock.sequences)


@pytest.mark.parametrize("model_type", ["nemotron_h", "qwen3_next", "kimi_linear"])
def test_manual_forward_and_cache_reuse_across_generate_calls(model_type):
    """Prefill, then single-token forwards by hand; then continue with generate() on the same cache."""
    model = get_model(model_type)
    prompt = torch.randint(3, 120, (1, 8))
    steps = torch.randint(3, 120, (1, 10))
    full = torch.cat([prompt, steps], dim=1)
    stock_cache = __import__("transformers").DynamicCache(config=model.config)
    cache = ReplayCache(buffer_len=4)
    with torch.no_grad():
        ref = [model(prompt, past_key_values=stock_cache, use_cache=True).logits[:, -1]]
        got = [model(prompt, past_key_values=cache, use_cache=True).logits[:, -1]]
        for i in range(steps.shape[1]):
            ref.append(model(steps[:, i : i + 1], past_key_values=stock_cache, use_cache=True).logits[:, -1])
            got.append(model(steps[:, i : i + 1], past_key_values=cache, use_cache=True).logits[:, -1])
    assert max_logit_diff(got, ref) < 1e-4
    assert cache.get_seq_length() == full.shape[1]
    # generate() reuses the cached prefix of `full` and continues from it
    more = model.generate(full, past_key_values=cache, **GREEDY)
    stock_more = model.generate(full, past_key_values=stock_cache, **GREEDY)
    assert torch.equal(more.sequences, stock_more.sequences)
    assert max_logit_diff(more.logits, stock_more.logits) < 1e-4


@pytest.mark.parametrize("model_type", ["nemotron_h", "qwen3_5_text", "kimi_linear"])
def test_bf16_models_stay_as_close_to_fp32_as_stock(model_type):
    """In a bfloat16 model the replay math runs in float32 (as the mamba_ssm / fla kernels do), with records stored
    losslessly in the model's dtype; it is at least as close to the float32 model as stock bf16 decoding is."""
    from transformers import DynamicCache

    fp32 = get_model(model_type)
    bf16 = tiny_model(model_type).to(torch.bfloat16)
    tokens = torch.randint(3, 120, (1, 40))

    reference = decode(fp32, tokens, 8, DynamicCache(config=fp32.config))
    stock = decode(bf16, tokens, 8, DynamicCache(config=bf16.config)).float()
    replay = decode(bf16, tokens, 8, ReplayCache(buffer_len=8)).float()
    stock_error, replay_error = (stock - reference).abs().max(), (replay - reference).abs().max()
    assert replay_error <= 1.1 * stock_error + 1e-3, (replay_error, stock_error)
