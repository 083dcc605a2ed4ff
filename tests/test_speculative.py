"""Speculative decoding through generate(), and ReplayCache rollback against recomputation from scratch."""

import pytest
import torch
from conftest import REPRESENTATIVE, STOCK_ROLLS_BACK_LINEAR, cache_kwarg, decode, get_model, max_logit_diff
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import DynamicCache

from hf_replayssm import PRESETS, ReplayCache, RollbackError
from hf_replayssm.layers import ReplayLayer

pytestmark = pytest.mark.equivalence
# suppress_tokens: a generated pad token (id 0) makes generate() infer a padding mask for it; keep tokens ordinary.
GREEDY = dict(do_sample=False, max_new_tokens=30, min_new_tokens=30, output_logits=True, return_dict_in_generate=True,
              suppress_tokens=[0])


def _repetitive_prompt(length=5, repeats=3):
    base = torch.randint(3, 120, (1, length))
    return torch.cat([base] * repeats, dim=1)


def _accepted_and_rejected(cache, new_tokens):
    """Drafts accepted (tokens beyond one per verify forward) and tokens rolled back, per SSM layer."""
    stats = cache.stats()
    forwards = stats["decode_steps"] // stats["ssm_layers"] + 1
    return new_tokens - forwards, stats["rolled_back_tokens"] // stats["ssm_layers"]


def _lookup_prompt(model, attempt):
    """A prompt that contains the model's own greedy continuation, so prompt lookup finds drafts that match."""
    generator = torch.Generator().manual_seed(attempt)
    start = torch.randint(3, 120, (1, 4), generator=generator)
    continuation = model.generate(start, do_sample=False, max_new_tokens=12, min_new_tokens=12)
    return torch.cat([continuation, start], dim=1)


@pytest.mark.parametrize("model_type", REPRESENTATIVE)
def test_prompt_lookup_equals_greedy(model_type):
    model = get_model(model_type)
    mixed_run = False
    for attempt in range(8):  # every run must equal greedy; at least one must both accept and reject drafts
        prompt = _lookup_prompt(model, attempt)
        greedy = model.generate(prompt, **GREEDY)
        cache = ReplayCache(buffer_len=8)
        out = model.generate(prompt, past_key_values=cache, prompt_lookup_num_tokens=3, **GREEDY)
        assert torch.equal(out.sequences, greedy.sequences)
        assert max_logit_diff(out.logits, greedy.logits) < 1e-4
        assert all(layer.num_pending == 0 and not layer.recording for layer in cache.replay_layers.values())
        accepted, rejected = _accepted_and_rejected(cache, GREEDY["max_new_tokens"])
        if accepted > 0 and rejected > 0:
            mixed_run = True
            break
    assert mixed_run, "no run with both accepted and rejected drafts"


@pytest.mark.parametrize("model_type", REPRESENTATIVE)
def test_hybrid_draft_model_equals_greedy(model_type, monkeypatch):
    from transformers.generation.candidate_generator import AssistedCandidateGenerator

    model, draft = get_model(model_type), get_model(model_type, seed=5)
    prompt = _repetitive_prompt()
    greedy = model.generate(prompt, **GREEDY)

    crops, rounds = {}, []
    original_crop, original_candidates = ReplayCache.crop, AssistedCandidateGenerator.get_candidates

    def spy_crop(self, tokens_to_remove):
        crops.setdefault(id(self), []).append(int(tokens_to_remove))
        return original_crop(self, tokens_to_remove)

    def spy_candidates(self, input_ids, **kwargs):
        candidates, logits = original_candidates(self, input_ids, **kwargs)
        rounds.append((input_ids.clone(), candidates.clone(), logits))
        return candidates, logits

    monkeypatch.setattr(ReplayCache, "crop", spy_crop)
    monkeypatch.setattr(AssistedCandidateGenerator, "get_candidates", spy_candidates)
    # Four drafts every round: the random draft model is rarely confident, and the one-token drafts its confidence
    # threshold would leave need no rollback of the draft cache from transformers 5.25 on (only the main one's)
    for name, value in (("assistant_confidence_threshold", 0.0), ("num_assistant_tokens", 4),
                        ("num_assistant_tokens_schedule", "constant")):
        monkeypatch.setattr(draft.generation_config, name, value)
    cache = ReplayCache(buffer_len=8)
    out = model.generate(prompt, past_key_values=cache, assistant_model=draft, **GREEDY)
    assert torch.equal(out.sequences, greedy.sequences)
    assert max_logit_diff(out.logits, greedy.logits) < 1e-4
    assert cache.stats()["rolled_back_tokens"] > 0

    # The draft model got a ReplayCache of its own, which was rolled back ...
    draft_crops = [calls for key, calls in crops.items() if key != id(cache)]
    assert len(draft_crops) == 1 and any(n < 0 for n in draft_crops[0])
    # ... exactly: every round's drafts (and their logits) equal the draft's own stock decoding of the same
    # sequence (prompt prefilled, then one token at a time). A draft cache that rolled back wrongly would make
    # the proposals drift and acceptance drop silently.
    monkeypatch.undo()
    for input_ids, candidates, logits in rounds:
        new = candidates.shape[1] - input_ids.shape[1]
        if new == 0:
            continue
        allowed = None if logits is None else torch.isfinite(logits)  # the draft's logits processors (e.g. min_length)
        ref_tokens, ref_logits = _stock_greedy(draft, input_ids, prompt.shape[1], new, allowed)
        assert torch.equal(ref_tokens, candidates[:, input_ids.shape[1] :])
        if logits is not None:  # processed scores: compare where no processor masked a token
            finite = torch.isfinite(logits)
            assert finite.float().mean() > 0.9
            torch.testing.assert_close(logits[finite], ref_logits[finite], atol=1e-4, rtol=0)


def _stock_greedy(model, input_ids, prompt_len, new, allowed=None):
    """Stock decoding: prefill the prompt, feed the rest one token at a time, then greedily add ``new`` tokens
    (choosing among ``allowed[:, i]`` tokens at step i when given)."""
    cache = DynamicCache(config=model.config)
    tokens, logits = [], []
    with torch.no_grad():
        last = model(input_ids[:, :prompt_len], past_key_values=cache, use_cache=True).logits[:, -1]
        for pos in range(prompt_len, input_ids.shape[1]):
            last = model(input_ids[:, pos : pos + 1], past_key_values=cache, use_cache=True).logits[:, -1]
        for step in range(new):
            logits.append(last)
            choice = last if allowed is None else last.masked_fill(~allowed[:, step], float("-inf"))
            tokens.append(choice.argmax(-1, keepdim=True))
            last = model(tokens[-1], past_key_values=cache, use_cache=True).logits[:, -1]
    return torch.cat(tokens, dim=1), torch.stack(logits, dim=1)


@pytest.mark.parametrize("precision", list(PRESETS))
@pytest.mark.parametrize("model_type", ["nemotron_h", "qwen3_5_text", "kimi_linear"])
def test_speculation_equals_plain_decoding_under_every_policy(model_type, precision):
    """Prompt lookup and a hybrid draft give exactly what plain decoding with the same policy gives."""
    model = get_model(model_type)
    prompt = _lookup_prompt(model, 0)
    plain = model.generate(prompt, past_key_values=ReplayCache(buffer_len=4, precision=precision), **GREEDY)
    for extra in (dict(prompt_lookup_num_tokens=3), dict(assistant_model=get_model(model_type, seed=5))):
        cache = ReplayCache(buffer_len=4, precision=precision)
        out = model.generate(prompt, past_key_values=cache, **extra, **GREEDY)
        assert torch.equal(out.sequences, plain.sequences)
        assert max_logit_diff(out.logits, plain.logits) < TOLERANCE[precision]
        assert cache.stats()["rolled_back_tokens"] > 0


@pytest.mark.parametrize("model_type", ["nemotron_h", "qwen3_next", "kimi_linear"])
def test_plain_decoding_after_speculation_is_exact_and_bounded(model_type):
    model = get_model(model_type)
    prompt = _repetitive_prompt()
    cache, stock_cache = ReplayCache(buffer_len=4), DynamicCache(config=model.config)
    first = model.generate(prompt, past_key_values=cache, prompt_lookup_num_tokens=3, **GREEDY)
    stock_first = model.generate(prompt, past_key_values=stock_cache, **GREEDY)
    assert torch.equal(first.sequences, stock_first.sequences)
    capacity = {idx: layer.ring.capacity for idx, layer in cache.replay_layers.items()}
    conv_shape = {idx: layer.conv.buffer.shape for idx, layer in cache.replay_layers.items()}
    more = model.generate(first.sequences, past_key_values=cache, **GREEDY)
    stock = model.generate(first.sequences, past_key_values=stock_cache, **GREEDY)
    assert torch.equal(more.sequences, stock.sequences)
    assert max_logit_diff(more.logits, stock.logits) < 1e-4
    for idx, layer in cache.replay_layers.items():
        assert not layer.recording and layer.num_pending == 0
        assert layer.num_buffered < layer.buffer_len
        assert layer.ring.capacity == capacity[idx] and layer.conv.buffer.shape == conv_shape[idx]


# ---------------------------------------------------------------------------------------------------------------
# Property test: random accept/reject patterns and window sizes, ReplayCache vs recomputation from scratch.

def _stock_step_logits(model, tokens, prompt_len):
    """Stock decoding: prefill the prompt, then one token at a time."""
    return decode(model, tokens, prompt_len, DynamicCache(config=model.config))


def _plain_step_logits(model, tokens, prompt_len, precision, buffer_len):
    """Plain (non-speculative) ReplayCache decoding with the same policy."""
    return decode(model, tokens, prompt_len, ReplayCache(buffer_len=buffer_len, precision=precision))


rounds = st.lists(st.tuples(st.integers(1, 6), st.integers(0, 5)), min_size=1, max_size=5)
# A speculative window and single steps compute the same values with different batch shapes, so the inputs of the
# SSM layers differ in the last float32 bits between speculative and plain decoding. A state element that sits that
# close to a rounding boundary of a low-precision format (or to a stochastic-rounding threshold) can then round to
# the other neighbour: one unit of the format (2^-8 relative for bf16, up to 1/8 for fp8 and more for nvfp4). Without
# boundary-aligned staged checkpoints the difference is the format's whole error and the tokens diverge. The exact
# staging semantics are checked bit for bit at the layer level (test_layer_schedule.py), where the inputs are
# identical, and rollback itself bit for bit under every policy (test_precision_policies.py).
def _tolerance(name):
    policy = PRESETS[name]
    formats = {policy.checkpoint_format, policy.read_format}
    if formats & {"fp8", "nvfp4"}:
        return 5e-2
    return 1e-2 if policy.stochastic_rounding else 2e-3 if "bf16" in formats else 1e-4


TOLERANCE = {name: _tolerance(name) for name in PRESETS}


@pytest.mark.parametrize("model_type", REPRESENTATIVE)
@settings(max_examples=6, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prompt_len=st.integers(2, 9), buffer_len=st.sampled_from([1, 2, 3, 8]), rounds=rounds, seed=st.integers(0, 99))
def test_rollback_equals_recomputation(model_type, prompt_len, buffer_len, rounds, seed):
    _check_rollback(model_type, prompt_len, buffer_len, rounds, seed, "fp32")


@pytest.mark.parametrize("precision", [p for p in PRESETS if p != "fp32"])
@pytest.mark.parametrize("model_type", ["nemotron_h", "qwen3_5_text", "kimi_linear"])
@settings(max_examples=3, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prompt_len=st.integers(2, 9), buffer_len=st.sampled_from([2, 3, 8]), rounds=rounds, seed=st.integers(0, 99))
def test_rollback_equals_recomputation_under_every_policy(model_type, precision, prompt_len, buffer_len, rounds,
                                                          seed):
    """The reference is plain decoding with the same policy: each token reads the checkpoint of its own flush
    boundary, so speculation changes nothing, whatever the storage format."""
    _check_rollback(model_type, prompt_len, buffer_len, rounds, seed, precision)


def _check_rollback(model_type, prompt_len, buffer_len, rounds, seed, precision):
    model = get_model(model_type)
    generator = torch.Generator().manual_seed(seed)
    prompt = torch.randint(3, 120, (1, prompt_len), generator=generator)
    cache = ReplayCache(buffer_len=buffer_len, window=6, precision=precision)
    cache.activate_past_recording()
    cache.expect_prompt(prompt_len)
    accepted = prompt
    verify_logits = {}  # absolute position -> logits produced by a verify forward and kept after the crop
    pending_input = prompt
    with torch.no_grad():
        for window, reject in rounds:
            reject = min(reject, window - 1)
            drafts = torch.randint(3, 120, (1, window), generator=generator)
            forward_input = torch.cat([pending_input, drafts], dim=1)
            logits = model(forward_input, past_key_values=cache, use_cache=True).logits
            start = accepted.shape[1] - pending_input.shape[1]
            keep = forward_input.shape[1] - reject
            for offset in range(keep):
                verify_logits[start + offset] = logits[:, offset]
            cache.crop(-reject)
            accepted = torch.cat([accepted, drafts[:, : window - reject]], dim=1)
            pending_input = accepted[:, :0]
        final = torch.randint(3, 120, (1, 1), generator=generator)
        verify_logits[accepted.shape[1]] = model(final, past_key_values=cache, use_cache=True).logits[:, -1]
    full = torch.cat([accepted, final], dim=1)
    if precision == "fp32":
        reference = _stock_step_logits(model, full, prompt_len)
    else:
        reference = _plain_step_logits(model, full, prompt_len, precision, buffer_len)
    assert cache.get_seq_length() == full.shape[1]
    for pos, got in verify_logits.items():
        if pos >= prompt_len - 1:
            torch.testing.assert_close(got, reference[:, pos - prompt_len + 1], atol=TOLERANCE[precision], rtol=0)
    for layer in cache.replay_layers.values():
        state = layer.current_state()
        assert torch.isfinite(state).all()


def _stock_rollback_logits(model, prompt, window, nxt, keep_dropped_states: bool):
    """Stock DynamicCache: prompt, then ``window`` while recording, crop all but its first token, then ``nxt``; the
    last logits. ``keep_dropped_states``: leave the recurrent states as the whole window left them (what transformers'
    crop did before 5.25: it cropped the attention layers only)."""
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(prompt, past_key_values=cache, use_cache=True)
        if STOCK_ROLLS_BACK_LINEAR:
            cache.activate_past_recording(recurrent_states_to_keep=window.shape[1])
        else:
            cache.activate_past_recording()
        model(window, past_key_values=cache, use_cache=True)
        linear = [layer for layer in cache.layers if hasattr(layer, "recurrent_states")]
        after_window = [dict(layer.recurrent_states) for layer in linear]
        assert any(after_window), "no recurrent state to roll back"
        cache.crop(1 - window.shape[1])
        if keep_dropped_states:
            for layer, states in zip(linear, after_window, strict=True):
                layer.recurrent_states.update(states)
        return model(nxt, past_key_values=cache, use_cache=True).logits[:, -1]


# (not nemotron_h: transformers 5.17's own crop raises a TypeError on it)
@pytest.mark.parametrize("model_type", ["falcon_h1", "qwen3_next", "kimi_linear"])
def test_stock_rollback_is_detectably_wrong(model_type):
    """Negative control: a rollback that leaves the recurrent state where the dropped tokens put it is wrong by far
    more than our tolerance, so the tests above would catch a rollback that is not exact. Before transformers 5.25
    that is what its own crop did; from 5.25 it keeps per-token states while recording and its crop is exact."""
    model = get_model(model_type)
    prompt = torch.randint(3, 120, (1, 6))
    window = torch.randint(3, 120, (1, 3))
    nxt = torch.randint(3, 120, (1, 1))
    reference = _stock_step_logits(model, torch.cat([prompt, window[:, :1], nxt], dim=1), 6)[:, -1]
    wrong = _stock_rollback_logits(model, prompt, window, nxt, keep_dropped_states=not STOCK_ROLLS_BACK_LINEAR)
    if STOCK_ROLLS_BACK_LINEAR:
        assert (wrong - reference).abs().max() < 1e-4  # transformers' own crop is exact now
        wrong = _stock_rollback_logits(model, prompt, window, nxt, keep_dropped_states=True)
    assert (wrong - reference).abs().max() > 1e-2


def test_rollback_deeper_than_buffered_raises():
    model = get_model("qwen3_next")
    cache = ReplayCache(buffer_len=4, window=2)
    cache.activate_past_recording()
    with torch.no_grad():
        model(torch.randint(3, 120, (1, 5)), past_key_values=cache, use_cache=True)
        cache.crop(0)
        model(torch.randint(3, 120, (1, 3)), past_key_values=cache, use_cache=True)
        cache.crop(torch.tensor(-1))  # 0-d tensor, as transformers 5.17 passes it
        with pytest.raises(RollbackError, match="cannot roll back 9 tokens exactly"):
            cache.crop(-9)
        assert cache.get_seq_length() == 7  # the refused crop changed nothing
    layers = [layer for layer in cache.layers if isinstance(layer, ReplayLayer)]
    assert all(layer.tokens_seen == 7 for layer in layers)


def test_pure_mamba2_speculation():
    model = get_model("mamba2")
    key = cache_kwarg(model)
    prompt = _repetitive_prompt()
    greedy = model.generate(prompt, **GREEDY)
    if key == "cache_params":  # transformers 5.17 looks for the cache under past_key_values only
        with pytest.raises(ValueError, match="pure Mamba models"):
            model.generate(prompt, cache_params=ReplayCache(), prompt_lookup_num_tokens=3, **GREEDY)
        return
    out = model.generate(prompt, **{key: ReplayCache()}, prompt_lookup_num_tokens=3, **GREEDY)
    assert torch.equal(out.sequences, greedy.sequences)
    assert max_logit_diff(out.logits, greedy.logits) < 1e-4
