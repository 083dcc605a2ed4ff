"""Short-conv hybrids (lfm2, lfm2_moe, lfm3): ReplayCache keeps their conv windows in its conv ring, so plain decoding,
speculation and manual crops equal stock decoding or a recomputation from scratch."""

import pytest
import torch
from conftest import GREEDY_KW, cache_kwarg, decode, get_model, max_logit_diff
from test_speculative import _accepted_and_rejected, _lookup_prompt, _stock_greedy
from transformers import DynamicCache

from hf_replayssm import ReplayCache, RollbackError
from hf_replayssm.adapters.short_conv import ConvSchedule
from hf_replayssm.tiny import tiny_model

pytestmark = pytest.mark.equivalence
SHORT_CONV = ["lfm2", "lfm2_moe", "lfm3"]


def _check_conv_layers(cache):
    """Every SSM layer is a conv-only layer: a conv ring, no checkpoint, no records, nothing left pending."""
    layers = cache.replay_layers
    assert layers and all(isinstance(layer.schedule, ConvSchedule) for layer in layers.values())
    for layer in layers.values():
        assert layer.checkpoint is None and layer.num_pending == 0 and not layer.recording
        window = layer.conv_states[0]
        assert window.shape[-1] == layer.schedule.conv_kernel and torch.isfinite(window).all()


def _nearby_draft(model_type, target, closeness=0.9):
    """A draft of the same type, its own seed, pulled towards the target's weights so that it agrees with the target
    on some tokens (a fully independent random draft is never accepted, a copy always)."""
    draft = tiny_model(model_type, seed=5)
    with torch.no_grad():
        for own, goal in zip(draft.parameters(), target.parameters(), strict=True):
            own.lerp_(goal, closeness)
    return draft


def _assert_equals_greedy(out, greedy, prompt_len):
    """Same tokens and logits (within 1e-4) as plain greedy decoding, except that the runs may part at a float tie:
    a step where greedy's two best logits are within 1e-5, so that rounding differences between a multi-token verify
    forward and single steps pick either token (stock speculation parts there too). True if the runs agree."""
    differ = (out.sequences[0] != greedy.sequences[0]).nonzero()
    if len(differ) == 0:
        assert max_logit_diff(out.logits, greedy.logits) < 1e-4
        return True
    step = int(differ[0]) - prompt_len
    assert max_logit_diff(out.logits[: step + 1], greedy.logits[: step + 1]) < 1e-4
    best, second = greedy.logits[step][0].topk(2).values
    assert best - second < 1e-5, f"parted from greedy at step {step} without a tie"
    return False


@pytest.mark.parametrize("model_type", SHORT_CONV)
def test_greedy_matches_stock(model_type):
    model = get_model(model_type)
    prompt = torch.randint(3, 120, (2, 7))
    stock = model.generate(prompt, **GREEDY_KW)
    for buffer_len in (1, 4, 16):  # nothing to flush: the buffer length must change nothing
        cache = ReplayCache(buffer_len=buffer_len)
        out = model.generate(prompt, **GREEDY_KW, **{cache_kwarg(model): cache})
        assert torch.equal(out.sequences, stock.sequences), buffer_len
        assert max_logit_diff(out.logits, stock.logits) < 1e-4, buffer_len
        stats = cache.stats()
        steps = GREEDY_KW["max_new_tokens"] - 1
        assert stats["ssm_layers"] == model.config.layer_types.count("conv")
        assert stats["decode_steps"] == stats["ssm_layers"] * steps
        assert stats["flushes"] == stats["checkpoint_writes"] == 0
        memory = cache.memory()
        assert memory["checkpoint"] == memory["buffer"] == 0 and memory["conv"] > 0
        _check_conv_layers(cache)


@pytest.mark.parametrize("model_type", SHORT_CONV)
def test_prompt_lookup_equals_greedy(model_type):
    model = get_model(model_type)
    mixed_run = False
    for attempt in range(8):  # every run must equal greedy; at least one must both accept and reject drafts
        prompt = _lookup_prompt(model, attempt)
        greedy = model.generate(prompt, **GREEDY_KW)
        cache = ReplayCache(buffer_len=4)
        out = model.generate(prompt, **{cache_kwarg(model): cache}, prompt_lookup_num_tokens=3, **GREEDY_KW)
        agreed = _assert_equals_greedy(out, greedy, prompt.shape[1])
        _check_conv_layers(cache)
        accepted, rejected = _accepted_and_rejected(cache, GREEDY_KW["max_new_tokens"])
        if agreed and accepted > 0 and rejected > 0:
            mixed_run = True
            break
    assert mixed_run, "no run with both accepted and rejected drafts"


@pytest.mark.parametrize("model_type", SHORT_CONV)
def test_draft_model_equals_greedy(model_type, monkeypatch):
    from transformers.generation.candidate_generator import AssistedCandidateGenerator

    model = get_model(model_type)
    draft = _nearby_draft(model_type, model)
    prompt = torch.randint(3, 120, (1, 9))
    greedy = model.generate(prompt, **GREEDY_KW)

    draft_caches, rounds = [], []
    original_candidates = AssistedCandidateGenerator.get_candidates

    def spy_candidates(self, input_ids, **kwargs):
        candidates, logits = original_candidates(self, input_ids, **kwargs)
        draft_caches.append(next((v for v in self.assistant_kwargs.values() if isinstance(v, ReplayCache)), None))
        rounds.append((input_ids.clone(), candidates.clone(), logits))
        return candidates, logits

    monkeypatch.setattr(AssistedCandidateGenerator, "get_candidates", spy_candidates)
    cache = ReplayCache(buffer_len=4)
    out = model.generate(prompt, **{cache_kwarg(model): cache}, assistant_model=draft, **GREEDY_KW)
    monkeypatch.undo()
    assert _assert_equals_greedy(out, greedy, prompt.shape[1])
    accepted, rejected = _accepted_and_rejected(cache, GREEDY_KW["max_new_tokens"])
    assert accepted > 0 and rejected > 0, (accepted, rejected)
    _check_conv_layers(cache)

    # The draft model ran on a ReplayCache of its own, which was rolled back too ...
    draft_cache = draft_caches[-1]
    assert isinstance(draft_cache, ReplayCache) and draft_cache is not cache
    assert draft_cache.stats()["rolled_back_tokens"] > 0
    # ... exactly: every round's drafts equal the draft's own stock decoding of the same sequence.
    for input_ids, candidates, logits in rounds:
        new = candidates.shape[1] - input_ids.shape[1]
        if new == 0:
            continue
        allowed = None if logits is None else torch.isfinite(logits)
        ref_tokens, ref_logits = _stock_greedy(draft, input_ids, prompt.shape[1], new, allowed)
        assert torch.equal(ref_tokens, candidates[:, input_ids.shape[1] :])
        if logits is not None:
            finite = torch.isfinite(logits)
            torch.testing.assert_close(logits[finite], ref_logits[finite], atol=1e-4, rtol=0)


@pytest.mark.parametrize("model_type", SHORT_CONV)
def test_stock_assisted_generation_agrees(model_type):
    """transformers itself runs speculation on these models (its conv crop is exact); ReplayCache gives the same, float
    ties included (lfm2_moe's first lookup prompt parts from greedy at a tie of 1e-6, in both)."""
    model = get_model(model_type)
    prompt = _lookup_prompt(model, 0)
    stock = model.generate(prompt, prompt_lookup_num_tokens=3, **GREEDY_KW)
    out = model.generate(prompt, **{cache_kwarg(model): ReplayCache()}, prompt_lookup_num_tokens=3, **GREEDY_KW)
    assert torch.equal(out.sequences, stock.sequences)
    assert max_logit_diff(out.logits, stock.logits) < 1e-4


# (window, rejected) per verify forward: windows beyond the reserved one grow the conv ring; rejections of all but one
ROUNDS = [(4, 2), (3, 0), (7, 6), (1, 0), (5, 3), (2, 1)]


@pytest.mark.parametrize("model_type", SHORT_CONV)
def test_manual_crop_equals_recomputation(model_type):
    model = get_model(model_type)
    key = cache_kwarg(model)
    generator = torch.Generator().manual_seed(11)
    prompt = torch.randint(3, 120, (1, 6), generator=generator)
    cache = ReplayCache(window=3)
    cache.activate_past_recording()
    got, accepted = {}, prompt  # absolute position -> logits kept after the crops
    with torch.no_grad():
        logits = model(prompt, **{key: cache}, use_cache=True).logits
        got[prompt.shape[1] - 1] = logits[:, -1]
        for window, reject in ROUNDS:
            drafts = torch.randint(3, 120, (1, window), generator=generator)
            logits = model(drafts, **{key: cache}, use_cache=True).logits
            for offset in range(window - reject):
                got[accepted.shape[1] + offset] = logits[:, offset]
            assert cache.get_seq_length() == accepted.shape[1] + window
            cache.crop(-reject)
            accepted = torch.cat([accepted, drafts[:, : window - reject]], dim=1)
            assert cache.get_seq_length() == accepted.shape[1]
        with pytest.raises(RollbackError, match="cannot roll back 1 tokens exactly"):
            cache.crop(-1)  # the crop committed every kept token
        cache.deactivate_past_recording()
        steps = torch.randint(3, 120, (1, 3), generator=generator)
        for i in range(steps.shape[1]):  # plain steps after the crops
            got[accepted.shape[1] + i] = model(steps[:, i : i + 1], **{key: cache}, use_cache=True).logits[:, -1]
    full = torch.cat([accepted, steps], dim=1)
    reference = decode(model, full, prompt.shape[1], DynamicCache(config=model.config))  # positions prompt-1 ..
    for pos, logits in got.items():
        torch.testing.assert_close(logits, reference[:, pos - prompt.shape[1] + 1], atol=1e-4, rtol=0)
    assert cache.stats()["rolled_back_tokens"] == cache.stats()["ssm_layers"] * sum(r for _, r in ROUNDS)
    _check_conv_layers(cache)

    # Negative control: the rejected tokens do change what follows, so a conv window that was not rewound would fail.
    with torch.no_grad():
        wrong = decode(model, torch.cat([prompt, torch.randint(3, 120, (1, 2)), steps[:, :1]], dim=1), 6,
                       DynamicCache(config=model.config))[:, -1]
        right = decode(model, torch.cat([prompt, steps[:, :1]], dim=1), 6, DynamicCache(config=model.config))[:, -1]
    assert (wrong - right).abs().max() > 1e-2


@pytest.mark.parametrize("model_type", SHORT_CONV)
def test_cache_reuse_for_a_continuation(model_type):
    """Speculation, then plain generate() calls continuing on the same cache, then reset() for another batch."""
    model = get_model(model_type)
    key = cache_kwarg(model)
    prompt = _lookup_prompt(model, 1)  # (attempt 0 of lfm2_moe parts from greedy at a float tie)
    cache, stock_cache = ReplayCache(buffer_len=4), DynamicCache(config=model.config)
    first = model.generate(prompt, **{key: cache}, prompt_lookup_num_tokens=3, **GREEDY_KW)
    stock_first = model.generate(prompt, **{key: stock_cache}, **GREEDY_KW)
    assert torch.equal(first.sequences, stock_first.sequences)
    assert cache.stats()["rolled_back_tokens"] > 0
    conv_shapes = {idx: layer.conv.buffer.shape for idx, layer in cache.replay_layers.items()}
    more = model.generate(first.sequences, **{key: cache}, **GREEDY_KW)
    stock_more = model.generate(first.sequences, **{key: stock_cache}, **GREEDY_KW)
    assert cache.get_seq_length() == more.sequences.shape[1] - 1
    assert torch.equal(more.sequences, stock_more.sequences)
    assert max_logit_diff(more.logits, stock_more.logits) < 1e-4
    _check_conv_layers(cache)
    assert {idx: layer.conv.buffer.shape for idx, layer in cache.replay_layers.items()} == conv_shapes  # no growth

    cache.reset()
    batch = torch.randint(3, 120, (3, 5))
    again = model.generate(batch, **{key: cache}, **GREEDY_KW)
    stock = model.generate(batch, **GREEDY_KW)
    assert torch.equal(again.sequences, stock.sequences)
    assert max_logit_diff(again.logits, stock.logits) < 1e-4


@pytest.mark.parametrize("model_type", SHORT_CONV)
def test_beam_search_reorders_conv_windows(model_type):
    model = get_model(model_type)
    prompt = torch.randint(3, 120, (1, 6))
    kwargs = dict(num_beams=3, do_sample=False, max_new_tokens=14, min_new_tokens=14, output_scores=True,
                  return_dict_in_generate=True)
    stock = model.generate(prompt, **kwargs)
    out = model.generate(prompt, **{cache_kwarg(model): ReplayCache()}, **kwargs)
    assert torch.equal(out.sequences, stock.sequences)
    torch.testing.assert_close(out.sequences_scores, stock.sequences_scores, atol=1e-4, rtol=1e-5)


def test_mixer_that_bypasses_the_conv_ring_is_refused(monkeypatch):
    """A conv input that did not come from the cache's conv ring (as a foreign kernel path would feed) is refused."""
    model = get_model("lfm2")
    cache = ReplayCache.for_model(model)
    monkeypatch.setattr(ReplayCache, "update_conv_state", lambda self, conv_states, *args, **kwargs: conv_states)
    with torch.no_grad(), pytest.raises(RuntimeError, match="did not route its recurrence through ReplayCache"):
        model(torch.randint(3, 120, (1, 4)), **{cache_kwarg(model): cache}, use_cache=True)
