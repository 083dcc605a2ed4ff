"""Bad inputs get clear errors that say what to do."""

import pytest
import torch
from conftest import get_model

from hf_replayssm import PRESETS, ReplayCache, RollbackError, supported_model_types


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(buffer_len=0), "buffer_len must be an int >= 1"),
        (dict(buffer_len="16"), "buffer_len must be an int >= 1"),
        (dict(precision="fp4"), "unknown precision 'fp4'; use one of"),
        (dict(backend="cuda"), "backend must be one of"),
        (dict(buffer_len=True), "buffer_len must be an int >= 1"),
        (dict(window=-1), "window must be an int >= 0"),
        (dict(window=True), "window must be an int >= 0"),
        (dict(window=2.0), "window must be an int >= 0"),
    ],
)
def test_constructor_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ReplayCache(**kwargs)


def test_unknown_precision_lists_presets():
    with pytest.raises(ValueError) as info:
        ReplayCache(precision="nope")
    assert all(name in str(info.value) for name in PRESETS)


def test_supported_model_types_lists_every_family():
    types = supported_model_types()
    for name in ["nemotron_h", "falcon_h1", "bamba", "granitemoehybrid", "zamba2", "mamba2", "qwen3_next", "qwen3_5",
                 "qwen3_5_text", "qwen3_5_moe", "olmo_hybrid", "kimi_linear", "bailing_hybrid", "glm5_next", "lfm2",
                 "lfm2_vl", "lfm3_vl"]:
        assert name in types


def test_cache_cannot_move_to_another_model():
    first, second = get_model("qwen3_next"), get_model("qwen3_next", seed=5)
    cache = ReplayCache()
    first.generate(torch.randint(3, 120, (1, 4)), past_key_values=cache, max_new_tokens=2)
    with pytest.raises(ValueError, match=r"bound to a Qwen3NextForCausalLM .* create a new ReplayCache"):
        second.generate(torch.randint(3, 120, (1, 4)), past_key_values=cache, max_new_tokens=2)


def test_cache_refuses_another_batch_size():
    model = get_model("nemotron_h")
    cache = ReplayCache()
    with torch.no_grad():
        model(torch.randint(3, 120, (2, 4)), past_key_values=cache, use_cache=True)
        with pytest.raises(ValueError, match="batch size 2, got a batch of 3"):
            model(torch.randint(3, 120, (3, 1)), past_key_values=cache, use_cache=True)


@pytest.mark.parametrize("model_type", ["mamba", "jamba"])
def test_unsupported_recurrences_are_refused_at_bind(model_type):
    model = get_model(model_type)
    with pytest.raises(ValueError, match=r"cannot replay .*Mamba-1.*Supported model types: .*nemotron_h"):
        model.generate(torch.randint(3, 120, (1, 4)), past_key_values=ReplayCache(), max_new_tokens=2)
    with pytest.raises(ValueError, match="Mamba-1"):
        ReplayCache.for_model(model)


def test_unsupported_draft_model_is_refused():
    model, draft = get_model("qwen3_next"), get_model("jamba")
    with pytest.raises(ValueError, match="Mamba-1"):
        model.generate(torch.randint(3, 120, (1, 6)), past_key_values=ReplayCache(), assistant_model=draft,
                       max_new_tokens=4)


def test_speculation_needs_an_empty_cache():
    model = get_model("kimi_linear")
    cache = ReplayCache()
    prompt = torch.randint(3, 120, (1, 6))
    out = model.generate(prompt, past_key_values=cache, max_new_tokens=3)
    with pytest.raises(ValueError, match="need an empty ReplayCache"):
        model.generate(out, past_key_values=cache, prompt_lookup_num_tokens=2, max_new_tokens=3)


def test_unbound_cache_in_a_direct_mixer_call():
    model = get_model("nemotron_h")
    mixer = model.model.layers[0].mixer
    with pytest.raises(ValueError, match="not bound to a model"):
        mixer(torch.randn(1, 3, model.config.hidden_size), cache_params=ReplayCache())


def test_in_place_conv_update_outside_the_replay_path_is_refused():
    """transformers 5.25's conv counts a token through ``cache.increase_count`` only when it updated a conv state in
    place, which it skips for layers that record their past (replay layers always do): a call means a mixer wrote
    the conv state behind the ring's back."""
    model = get_model("qwen3_next")
    cache = ReplayCache()
    with torch.no_grad():
        model(torch.randint(3, 120, (1, 5)), past_key_values=cache, use_cache=True)
    layer_idx = next(iter(cache.replay_layers))
    with pytest.raises(RuntimeError, match="updated in place, outside the ReplaySSM path"):
        cache.layers[layer_idx].increase_count(0)
    assert not hasattr(cache.layers[layer_idx], "cumulative_length_linear")  # the schedule counts the tokens


def test_crop_errors():
    model = get_model("qwen3_next")
    cache = ReplayCache(buffer_len=4)
    step = torch.randint(3, 120, (1, 1))
    with torch.no_grad():
        model(torch.randint(3, 120, (1, 6)), past_key_values=cache, use_cache=True)
        model(step, past_key_values=cache, use_cache=True)
        with pytest.raises(RollbackError, match=r"cannot roll back 1 tokens exactly.*activate_past_recording"):
            cache.crop(-1)  # plain decoding keeps no conv history to rewind
        cache.activate_past_recording()
        model(step, past_key_values=cache, use_cache=True)
        model(step, past_key_values=cache, use_cache=True)
    before = {idx: (layer.num_buffered, layer.num_pending) for idx, layer in cache.replay_layers.items()}
    with pytest.raises(RollbackError, match="cannot roll back 3 tokens exactly"):
        cache.crop(-3)  # the token decoded before recording cannot be undone
    assert {idx: (layer.num_buffered, layer.num_pending) for idx, layer in cache.replay_layers.items()} == before
    assert cache.get_seq_length() == 9  # all or nothing: nothing changed
    with pytest.raises(ValueError, match="cannot crop to length 99"):
        cache.crop(99)
    cache.crop(7)  # a positive value is the length to keep (transformers 5.17 semantics)
    assert cache.get_seq_length() == 7
    assert all(layer.num_pending == 0 and layer.num_buffered == 1 for layer in cache.replay_layers.values())


def test_device_map_auto_with_offloaded_layers(tmp_path):
    """accelerate's dispatch hooks wrap mixer forwards; the replay path must still run (disk offload on CPU)."""
    pytest.importorskip("accelerate")
    from transformers import AutoModelForCausalLM

    model = get_model("qwen3_next")
    model.save_pretrained(tmp_path / "model")
    dispatched = AutoModelForCausalLM.from_pretrained(
        tmp_path / "model", device_map="auto", max_memory={"cpu": "150KB"}, offload_folder=tmp_path / "offload"
    ).eval()
    assert any("_old_forward" in vars(module) for module in dispatched.modules())
    prompt = torch.randint(3, 120, (1, 6))
    kwargs = dict(do_sample=False, max_new_tokens=10, min_new_tokens=10, return_dict_in_generate=True)
    stock = model.generate(prompt, **kwargs)
    cache = ReplayCache(buffer_len=4)
    out = dispatched.generate(prompt, past_key_values=cache, **kwargs)
    assert torch.equal(out.sequences, stock.sequences)
    assert cache.stats()["flushes"] > 0


def test_stop_strings_with_speculation_are_refused():
    """transformers' assisted loop looks for a stop string only at the end of the tokens a round accepts: a stop string
    inside them is missed and generation runs on. With a ReplayCache that is a clear error; plain decoding stops."""
    from conftest import STOCK_ROLLS_BACK_LINEAR

    from hf_replayssm.bench.generate import speculative_prompt
    from hf_replayssm.models import load_model

    model, tokenizer = load_model("tiny-gdn-copy", device="cpu")
    ids = speculative_prompt("passage", model.config.vocab_size, 200, 0, tokenizer)
    greedy = model.generate(ids, do_sample=False, max_new_tokens=60)
    stop = tokenizer.decode(greedy[0, 200:])[20:26]  # a stop string 20 characters into the continuation
    kw = dict(do_sample=False, max_new_tokens=60, stop_strings=[stop], tokenizer=tokenizer)
    stopped = model.generate(ids, past_key_values=ReplayCache(8), **kw)
    assert stopped.shape[1] < greedy.shape[1]  # plain decoding on a ReplayCache stops there
    with pytest.raises(ValueError, match="stop_strings"):
        model.generate(ids, past_key_values=ReplayCache(8), prompt_lookup_num_tokens=10, **kw)
    if STOCK_ROLLS_BACK_LINEAR:  # transformers 5.25 runs prompt lookup on its own cache: it runs past the stop string
        assert model.generate(ids, prompt_lookup_num_tokens=10, **kw).shape[1] == greedy.shape[1]
