"""A static ReplayCache on models whose layers hold both an SSM state and attention K/V (falcon_h1, zamba2's hybrid
blocks): ``ReplayStaticHybridLayer``, transformers' static attention plus a replay layer on device positions."""

from __future__ import annotations

import pytest
import torch
from conftest import SUPPORTED, generate_compiled_once, get_model, max_logit_diff
from transformers.generation import CompileConfig

from hf_replayssm import ReplayCache, cache_argument
from hf_replayssm.layers import ReplayStaticHybridLayer

pytestmark = pytest.mark.equivalence

HYBRIDS = ["falcon_h1", "zamba2"]
NEW = 20
GREEDY = dict(do_sample=False, max_new_tokens=NEW, min_new_tokens=NEW, output_logits=True,
              return_dict_in_generate=True)


def _prompt(model, rows=2, length=11, seed=1):
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(3, model.config.vocab_size, (rows, length), generator=generator)


def _compile_config():
    config = CompileConfig(fullgraph=True, backend="aot_eager", mode=None)
    config._compile_all_devices = True  # transformers compiles generate's decode step on CUDA only otherwise
    return config


@pytest.mark.parametrize("model_type", HYBRIDS)
def test_static_hybrid_decodes_like_stock_and_compiles(model_type):
    """Eager: stock greedy's tokens and logits, a dynamic ReplayCache's flush schedule, every SSM layer on device
    positions, the hybrid layers' K/V in preallocated slots; compiled (fullgraph): one graph, equal to eager."""
    model = get_model(model_type)
    prompt = _prompt(model)
    stock = model.generate(prompt, **GREEDY)
    dynamic = ReplayCache(4)
    model.generate(prompt, past_key_values=dynamic, **GREEDY)
    cache = ReplayCache(4, max_cache_len=prompt.shape[1] + NEW)
    eager = model.generate(prompt, past_key_values=cache, **GREEDY)
    assert torch.equal(eager.sequences, stock.sequences)
    assert max_logit_diff(eager.logits, stock.logits) < 1e-4
    hybrids = [layer for layer in cache.layers if isinstance(layer, ReplayStaticHybridLayer)]
    assert hybrids and all(layer.keys.shape[2] == prompt.shape[1] + NEW for layer in hybrids)
    assert all(int(layer.get_seq_length()) == prompt.shape[1] + NEW - 1 for layer in hybrids)
    assert all(layer.schedule.device_positions.is_active() for layer in cache.replay_layers.values())
    assert cache.stats() == dynamic.stats() and cache.is_compileable
    assert cache.memory()["attention_kv"] > 0

    out = generate_compiled_once(model, prompt, ReplayCache(4, max_cache_len=prompt.shape[1] + NEW), _compile_config(),
                                 **GREEDY)
    assert torch.equal(out.sequences, eager.sequences)
    # transformers' compiled masks round a little apart (as for the other families: within 1e-5); zamba2's larger
    # logits put that rounding at up to 1.2e-5, about 2e-6 of their size, steady across the steps
    scale = max(step.abs().max().item() for step in eager.logits)
    assert max_logit_diff(out.logits, eager.logits) < 4e-6 * scale


@pytest.mark.parametrize("model_type", HYBRIDS)
def test_static_hybrid_prompt_lookup_equals_greedy(model_type):
    """Speculation crops the hybrid layers' attention slots with their SSM part (on the device after a verified
    window, on the host otherwise): runs that accept and reject drafts equal greedy decoding."""
    model = get_model(model_type)
    generator = torch.Generator().manual_seed(3)
    start = torch.randint(3, model.config.vocab_size, (1, 5), generator=generator)
    continuation = model.generate(start, do_sample=False, max_new_tokens=10, min_new_tokens=10)
    prompt = torch.cat([continuation, continuation, start], dim=1)
    greedy = model.generate(prompt, **GREEDY)
    cache = ReplayCache(4, max_cache_len=prompt.shape[1] + NEW + 4)
    out = model.generate(prompt, past_key_values=cache, prompt_lookup_num_tokens=3, **GREEDY)
    assert torch.equal(out.sequences, greedy.sequences)
    assert max_logit_diff(out.logits, greedy.logits) < 1e-4
    assert cache.stats()["rolled_back_tokens"] > 0  # some drafts were rejected: the crops ran
    hybrids = [layer for layer in cache.layers if isinstance(layer, ReplayStaticHybridLayer)]
    assert all(int(layer.get_seq_length()) == out.sequences.shape[1] - 1 for layer in hybrids)


@pytest.mark.parametrize("model_type", HYBRIDS)
def test_static_hybrid_reset_and_batch_changes(model_type):
    """reset() zeroes the attention slots and keeps their storage, and the cache repeats its first run; a batch
    change on filled attention slots is a clear error. (A continuation, beams, sampling and pickling:
    test_compiled_decode.py::test_static_cache_as_a_user_would_use_it.)"""
    model = get_model(model_type)
    prompt = _prompt(model)
    kw = dict(do_sample=False, max_new_tokens=8, min_new_tokens=8)
    cache = ReplayCache(4, max_cache_len=40)
    first = model.generate(prompt, past_key_values=cache, **kw)
    layer = next(layer for layer in cache.layers if isinstance(layer, ReplayStaticHybridLayer))
    keys = layer.keys.data_ptr()
    with pytest.raises(ValueError, match="cannot change its batch rows"):
        layer.batch_select_indices(torch.tensor([0]))
    cache.reset()
    assert int(layer.get_seq_length()) == 0 and layer.keys.data_ptr() == keys and not layer.keys.any()
    assert torch.equal(model.generate(prompt, past_key_values=cache, **kw), first)


@pytest.mark.parametrize("model_type", SUPPORTED)
def test_static_cache_on_every_model_type(model_type):
    """Every supported model type with an SSM recurrence takes a static ReplayCache: eager equals stock greedy
    decoding, and the decode step compiles whole (one graph) with the eager static cache's tokens."""
    model = get_model(model_type)
    key = cache_argument(model)
    prompt = torch.randint(3, model.config.get_text_config().vocab_size, (2, 9),
                           generator=torch.Generator().manual_seed(1))
    settings = dict(GREEDY, max_new_tokens=8, min_new_tokens=8)
    stock = model.generate(prompt, **settings)
    eager = model.generate(prompt, **{key: ReplayCache(4, max_cache_len=17)}, **settings)
    assert torch.equal(eager.sequences, stock.sequences) and max_logit_diff(eager.logits, stock.logits) < 1e-4
    out = generate_compiled_once(model, prompt, ReplayCache(4, max_cache_len=17), _compile_config(), **settings)
    assert torch.equal(out.sequences, eager.sequences) and max_logit_diff(out.logits, eager.logits) < 1e-4
    torch._dynamo.reset()
