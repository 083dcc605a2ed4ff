"""ReplayCache as a user drives it: drafts of every kind and size, batch operations, the stock views of the state,
reuse, pickling, threads and compiled stock calls. Each test is a regression test for a failure found that way."""

import pickle
import threading

import pytest
import torch
from conftest import GREEDY_KW, STOCK_ROLLS_BACK_LINEAR, cache_kwarg, decode, get_model, max_logit_diff
from transformers import DynamicCache

from hf_replayssm import ReplayCache, RollbackError

pytestmark = pytest.mark.equivalence


def _stock_greedy_from(model, tokens, prompt_len, new, allowed=None):
    """Stock decoding of ``tokens`` (prompt prefilled, the rest one at a time), then ``new`` greedy tokens (among
    ``allowed[:, i]`` at step i: the draft's own logits processors, e.g. min_new_tokens)."""
    key = cache_kwarg(model)
    cache = DynamicCache(config=model.config)
    out = []
    with torch.no_grad():
        last = model(tokens[:, :prompt_len], **{key: cache}, use_cache=True).logits[:, -1]
        for pos in range(prompt_len, tokens.shape[1]):
            last = model(tokens[:, pos : pos + 1], **{key: cache}, use_cache=True).logits[:, -1]
        for step in range(new):
            choice = last if allowed is None else last.masked_fill(~allowed[:, step], float("-inf"))
            out.append(choice.argmax(-1, keepdim=True))
            last = model(out[-1], **{key: cache}, use_cache=True).logits[:, -1]
    return torch.cat(out, dim=1)


def _spy_draft_rounds(monkeypatch):
    from transformers.generation.candidate_generator import AssistedCandidateGenerator

    rounds, original = [], AssistedCandidateGenerator.get_candidates

    def spy(self, input_ids, **kwargs):
        candidates, logits = original(self, input_ids, **kwargs)
        rounds.append((input_ids.clone(), candidates.clone(), logits))
        return candidates, logits

    monkeypatch.setattr(AssistedCandidateGenerator, "get_candidates", spy)
    return rounds


# ------------------------------------------------------------------------------------------------ drafts
@pytest.mark.parametrize(("main_type", "draft_type"), [("nemotron_h", "qwen3_next"), ("qwen3_5_text", "kimi_linear")])
def test_hybrid_draft_with_a_long_prompt(main_type, draft_type, monkeypatch):
    """A hybrid draft model, a 48-token prompt, drafts until the confidence threshold never stops them: used to end
    in RecursionError (the draft cache took its prompt as drafts and overflowed its ring)."""
    model, draft = get_model(main_type), get_model(draft_type, seed=5)
    draft.generation_config.assistant_confidence_threshold = 0.0
    draft.generation_config.num_assistant_tokens = 5
    prompt = torch.randint(3, 120, (1, 48), generator=torch.Generator().manual_seed(3))
    rounds = _spy_draft_rounds(monkeypatch)
    greedy = model.generate(prompt, **GREEDY_KW)
    cache = ReplayCache(buffer_len=4)
    out = model.generate(prompt, past_key_values=cache, assistant_model=draft, **GREEDY_KW)
    assert torch.equal(out.sequences, greedy.sequences)
    assert max_logit_diff(out.logits, greedy.logits) < 1e-4
    monkeypatch.undo()
    assert len(rounds) > 3
    for input_ids, candidates, logits in rounds:  # the draft's proposals: its own stock decoding of the sequence
        new = candidates.shape[1] - input_ids.shape[1]
        if new:
            allowed = None if logits is None else torch.isfinite(logits)
            ref = _stock_greedy_from(draft, input_ids, prompt.shape[1], new, allowed)
            assert torch.equal(ref, candidates[:, input_ids.shape[1] :])


def test_bundled_gdn_drafts_for_bundled_mamba2():
    from hf_replayssm.models import load_model

    model, tokenizer = load_model("tiny-mamba2", device="cpu")
    draft, _ = load_model("tiny-gdn", device="cpu")
    draft.generation_config.assistant_confidence_threshold = 0.0
    prompt = tokenizer("To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer the "
                       "slings and arrows of outrageous fortune", return_tensors="pt").input_ids
    assert prompt.shape[1] >= 40
    kwargs = dict(do_sample=False, max_new_tokens=24, min_new_tokens=24, return_dict_in_generate=True,
                  output_logits=True)
    greedy = model.generate(prompt, **kwargs)
    out = model.generate(prompt, past_key_values=ReplayCache(), assistant_model=draft, **kwargs)
    assert torch.equal(out.sequences, greedy.sequences)
    assert max_logit_diff(out.logits, greedy.logits) < 1e-4


@pytest.mark.parametrize("schedule", ["constant", "heuristic"])
def test_window_follows_what_transformers_drafts(schedule):
    """`num_assistant_tokens=3` on the main call does not reach the assistant (it drafts its own config's 20); the
    heuristic schedule grows the draft every fully accepted round. Neither may fail half-way."""
    model = get_model("qwen3_next")
    draft = get_model("qwen3_next", seed=5)  # other weights: drafts get rejected, so crops reach deep
    draft.generation_config.num_assistant_tokens = 20
    draft.generation_config.num_assistant_tokens_schedule = schedule
    draft.generation_config.assistant_confidence_threshold = 0.0  # always draft the full number
    prompt = torch.randint(3, 120, (1, 8))
    greedy = model.generate(prompt, **GREEDY_KW)
    cache = ReplayCache(buffer_len=4)
    out = model.generate(prompt, past_key_values=cache, assistant_model=draft, num_assistant_tokens=3, **GREEDY_KW)
    assert torch.equal(out.sequences, greedy.sequences)
    assert max_logit_diff(out.logits, greedy.logits) < 1e-4


def test_a_window_larger_than_reserved_grows_the_rings():
    """Manual speculation past the reserved window: the rings grow (the flush grid stays) and rollback is exact."""
    model = get_model("nemotron_h")
    tokens = torch.randint(3, 120, (1, 30))
    reference = decode(model, tokens, 6, DynamicCache(config=model.config))
    cache = ReplayCache(buffer_len=4, window=1)
    cache.activate_past_recording()
    with torch.no_grad():
        model(tokens[:, :6], past_key_values=cache, use_cache=True)
        position = 6
        for window, keep in ((9, 3), (12, 12), (7, 1)):
            drafts = torch.cat([tokens[:, position : position + keep], torch.randint(3, 120, (1, window - keep))], 1)
            logits = model(drafts, past_key_values=cache, use_cache=True).logits
            for i in range(keep):
                torch.testing.assert_close(logits[:, i], reference[:, position + i - 5], atol=1e-4, rtol=0)
            cache.crop(-(window - keep))
            position += keep
    assert cache.get_seq_length() == position
    layer = next(iter(cache.replay_layers.values()))
    assert layer.ring.capacity >= 12 and layer.counters["flushes"] == (position - 6) // 4


# ------------------------------------------------------------------------------------------------ batch operations
@pytest.mark.parametrize("model_type", ["nemotron_h", "falcon_h1", "qwen3_5_text", "kimi_linear"])
def test_batch_select_and_repeat_continue_exactly(model_type):
    """After batch_select_indices / batch_repeat_interleave decoding continues as if those rows had been decoded
    from the start."""
    model = get_model(model_type)
    tokens = torch.randint(3, 120, (3, 24))
    key = cache_kwarg(model)
    cache = ReplayCache(buffer_len=4)
    with torch.no_grad():
        model(tokens[:, :6], **{key: cache}, use_cache=True)
        for pos in range(6, 13):
            model(tokens[:, pos : pos + 1], **{key: cache}, use_cache=True)
        cache.batch_select_indices(torch.tensor([2, 0]))
        cache.batch_repeat_interleave(2)  # rows: 2, 2, 0, 0
        rows = torch.tensor([2, 2, 0, 0])
        got = [model(tokens[rows, pos : pos + 1], **{key: cache}, use_cache=True).logits[:, -1]
               for pos in range(13, 24)]
    reference = decode(model, tokens[rows], 6, DynamicCache(config=model.config))[:, 8:]
    assert max_logit_diff(torch.stack(got, 1), reference) < 1e-4


# ------------------------------------------------------------------------------------------------ pure Mamba-2
def test_pure_mamba2_direct_call_uses_the_cache():
    """A ReplayCache passed as past_key_values to a forward that names its cache otherwise is moved there."""
    model = get_model("mamba2")
    tokens = torch.randint(3, 120, (1, 12))
    cache = ReplayCache(buffer_len=4)
    with torch.no_grad():
        model(tokens[:, :6], past_key_values=cache, use_cache=True)
        got = [model(tokens[:, p : p + 1], past_key_values=cache, use_cache=True).logits[:, -1] for p in range(6, 12)]
    assert cache.get_seq_length() == 12
    reference = decode(model, tokens, 6, DynamicCache(config=model.config))[:, 1:]
    assert max_logit_diff(torch.stack(got, 1), reference) < 1e-4


def test_pure_mamba2_cache_reuse_continues_exactly():
    model = get_model("mamba2")
    key = cache_kwarg(model)
    prompt = torch.randint(3, 120, (1, 7))
    kwargs = dict(do_sample=False, max_new_tokens=6, min_new_tokens=6, suppress_tokens=[0])
    whole = model.generate(prompt, max_new_tokens=12, min_new_tokens=12, do_sample=False, suppress_tokens=[0],
                           output_logits=True, return_dict_in_generate=True)
    cache = ReplayCache(buffer_len=4)
    first = model.generate(prompt, **{key: cache}, **kwargs)
    if key == "cache_params":  # transformers 5.17 would re-feed the whole prefix: a clear error instead
        with pytest.raises(ValueError, match="cannot continue from a non-empty ReplayCache"):
            model.generate(first, **{key: cache}, **kwargs)
        return
    second = model.generate(first, **{key: cache}, **kwargs, output_logits=True, return_dict_in_generate=True)
    assert torch.equal(second.sequences, whole.sequences)
    assert max_logit_diff(second.logits, whole.logits[6:]) < 1e-4


def test_pure_mamba2_as_a_draft_model():
    model, draft = get_model("nemotron_h"), get_model("mamba2", seed=5)
    prompt = torch.randint(3, 120, (1, 20))
    greedy = model.generate(prompt, **GREEDY_KW)
    if cache_kwarg(draft) == "cache_params":
        with pytest.raises(ValueError, match="pure Mamba"):
            model.generate(prompt, past_key_values=ReplayCache(), assistant_model=draft, **GREEDY_KW)
        return
    out = model.generate(prompt, past_key_values=ReplayCache(buffer_len=4), assistant_model=draft, **GREEDY_KW)
    assert torch.equal(out.sequences, greedy.sequences)
    assert max_logit_diff(out.logits, greedy.logits) < 1e-4


# ------------------------------------------------------------------------------------------------ stock views
@pytest.mark.parametrize("model_type", ["nemotron_h", "qwen3_next", "kimi_linear"])
def test_stock_views_show_current_values(model_type):
    model = get_model(model_type)
    tokens = torch.randint(3, 120, (2, 15))
    cache, stock = ReplayCache(buffer_len=8), DynamicCache(config=model.config)
    decode(model, tokens, 6, cache)
    decode(model, tokens, 6, stock)
    for idx, layer in cache.replay_layers.items():
        assert layer.num_buffered > 0  # records not yet folded: the checkpoint alone is stale
        want_state = stock.layers[idx].recurrent_states[0].float()
        torch.testing.assert_close(layer.recurrent_states[0], want_state, atol=1e-5, rtol=1e-5)
        if hasattr(cache, "get_recurrent_state"):
            torch.testing.assert_close(cache.get_recurrent_state(idx), want_state, atol=1e-5, rtol=1e-5)
        want_conv = stock.layers[idx].conv_states[0]
        got_conv = layer.conv_states[0]
        assert got_conv.shape == want_conv.shape
        torch.testing.assert_close(got_conv, want_conv)


# ------------------------------------------------------------------------------------------------ reuse and API
def test_reset_takes_any_batch():
    model = get_model("qwen3_next")
    cache = ReplayCache(buffer_len=4)
    decode(model, torch.randint(3, 120, (2, 9)), 5, cache)
    cache.reset()
    assert cache.get_seq_length() == 0
    tokens = torch.randint(3, 120, (3, 11))
    got = decode(model, tokens, 5, cache)
    stock = DynamicCache(config=model.config)
    assert max_logit_diff(got, decode(model, tokens, 5, stock)) < 1e-4
    # the stock views follow the schedule a reset put in place (they hold the schedule, not the layer)
    for idx, layer in cache.replay_layers.items():
        torch.testing.assert_close(layer.recurrent_states[0], stock.layers[idx].recurrent_states[0].float(),
                                   atol=1e-5, rtol=1e-5)
        assert layer.conv_states[0].shape == stock.layers[idx].conv_states[0].shape


def test_a_dropped_cache_is_freed_without_the_cycle_collector():
    """No reference cycle through the stock views: the last reference gone, the cache and its tensors go at once
    (GPU memory with them), not at the garbage collector's next pass."""
    import gc
    import weakref

    model = get_model("nemotron_h")
    cache = ReplayCache(buffer_len=4)
    decode(model, torch.randint(3, 120, (2, 9)), 5, cache)
    layer = next(iter(cache.replay_layers.values()))
    refs = [weakref.ref(cache), weakref.ref(layer), weakref.ref(layer.schedule)]
    del layer
    gc.disable()
    try:
        del cache
        assert [ref() for ref in refs] == [None, None, None]
    finally:
        gc.enable()


@pytest.mark.parametrize("model_type", ["nemotron_h", "kimi_linear"])
def test_pickled_cache_continues_exactly(model_type):
    model = get_model(model_type)
    tokens = torch.randint(3, 120, (2, 20))
    cache = ReplayCache(buffer_len=4)
    decode(model, tokens[:, :11], 6, cache)
    restored = pickle.loads(pickle.dumps(cache))
    key = cache_kwarg(model)
    with torch.no_grad():
        for pos in range(11, 20):
            a = model(tokens[:, pos : pos + 1], **{key: cache}, use_cache=True).logits
            b = model(tokens[:, pos : pos + 1], **{key: restored}, use_cache=True).logits
            assert torch.equal(a, b)
    with pytest.raises(ValueError, match="another architecture"):
        pickle.loads(pickle.dumps(cache)).bind(get_model("qwen3_next"))


# ------------------------------------------------------------------------------------------------ threads, compile
@pytest.mark.skipif(STOCK_ROLLS_BACK_LINEAR, reason="transformers >= 5.25 no longer refuses assisted generation for "
                    "stateful models: there is no refusal to lift")
def test_the_lifted_refusal_is_scoped_to_the_replaycache_call():
    """While one thread runs speculative generate() with a ReplayCache, another thread's stock call on the same model
    still gets transformers' refusal."""
    model = get_model("qwen3_next")
    prompt = torch.randint(3, 120, (1, 8))
    inside, release, errors = threading.Event(), threading.Event(), []
    original_forward = type(model).forward

    def slow_forward(self, *args, **kwargs):
        if threading.current_thread().name == "replay":
            inside.set()
            release.wait(30)
        return original_forward(self, *args, **kwargs)

    def replay():
        try:
            model.generate(prompt, past_key_values=ReplayCache(), prompt_lookup_num_tokens=2, max_new_tokens=3)
        except Exception as error:  # reported below
            errors.append(error)

    type(model).forward = slow_forward
    try:
        thread = threading.Thread(target=replay, name="replay")
        thread.start()
        assert inside.wait(30)
        with pytest.raises(ValueError, match="stateful"):
            model.generate(prompt, prompt_lookup_num_tokens=2, max_new_tokens=3)
        release.set()
        thread.join(60)
    finally:
        type(model).forward = original_forward
        release.set()
    assert not errors
    with pytest.raises(ValueError, match="stateful"):  # and nothing stays lifted afterwards
        model.generate(prompt, prompt_lookup_num_tokens=2, max_new_tokens=3)


def test_compiled_stock_calls_after_a_replaycache_was_used():
    """The recurrence hooks stay installed after a ReplayCache was used; a fullgraph-compiled stock forward must not
    see them (Dynamo cannot trace the context lookup they make for a ReplayCache call)."""
    from transformers import StaticCache

    model = get_model("qwen3_5_text")
    prompt = torch.randint(3, 120, (1, 6))
    decode(model, prompt, 4, ReplayCache(buffer_len=2))  # installs every hook for this model class
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="eager", fullgraph=True)
    key = cache_kwarg(model)
    static = StaticCache(config=model.config, max_cache_len=16)
    eager_cache = StaticCache(config=model.config, max_cache_len=16)
    with torch.no_grad():
        got = compiled(prompt, **{key: static}, use_cache=True).logits
        want = model(prompt, **{key: eager_cache}, use_cache=True).logits
    torch.testing.assert_close(got, want)


# ------------------------------------------------------------------------------------------------ memory
def _reachable_bytes(root, model) -> int:
    """Bytes of the storages of every tensor reachable from ``root`` (not the model's own parameters/buffers)."""
    owned_by_model = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}
    seen_objects, storages = set(), {}
    stack = [root]
    while stack:
        obj = stack.pop()
        if id(obj) in seen_objects or isinstance(obj, (torch.nn.Module, str, bytes, int, float, type)):
            continue
        seen_objects.add(id(obj))
        if isinstance(obj, torch.Tensor):
            storage = obj.untyped_storage()
            if storage.data_ptr() not in owned_by_model:
                storages[storage.data_ptr()] = storage.nbytes()
            continue
        if isinstance(obj, dict):
            stack.extend(obj.values())
        elif isinstance(obj, (list, tuple, set)):
            stack.extend(obj)
        elif hasattr(obj, "__dict__"):
            stack.extend(vars(obj).values())
    return sum(storages.values())


@pytest.mark.parametrize("precision", ["fp32", "bf16", "separated-fp8", "shared-nvfp4"])
@pytest.mark.parametrize("model_type", ["nemotron_h", "qwen3_next"])
def test_memory_reports_every_byte_the_cache_keeps(model_type, precision):
    model = get_model(model_type)
    cache = ReplayCache(buffer_len=8, precision=precision)
    decode(model, torch.randint(3, 120, (2, 13)), 6, cache)
    memory = cache.memory()
    assert memory["total"] == _reachable_bytes(cache, model)
    assert memory["checkpoint"] > 0 and memory["buffer"] > 0 and memory["conv"] > 0


def test_rollback_error_changes_nothing():
    model = get_model("kimi_linear")
    cache = ReplayCache(buffer_len=4)
    cache.activate_past_recording()
    with torch.no_grad():
        model(torch.randint(3, 120, (1, 5)), past_key_values=cache, use_cache=True)
        model(torch.randint(3, 120, (1, 3)), past_key_values=cache, use_cache=True)
    with pytest.raises(RollbackError):
        cache.crop(-4)
    assert cache.get_seq_length() == 8 and all(layer.num_pending == 3 for layer in cache.replay_layers.values())
