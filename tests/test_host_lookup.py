"""Prompt lookup from a host copy of the ids (``hf_replayssm.host_lookup``): the drafts transformers' own search finds,
and generate() on a ReplayCache using it."""

import pytest
import torch
from conftest import get_model, max_logit_diff
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import LogitsProcessorList, NoRepeatNGramLogitsProcessor
from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

from hf_replayssm import ReplayCache, host_lookup
from hf_replayssm.host_lookup import HostPromptLookup, earliest_lookup

# also in the compat run (transformers 5.17): the drafts are checked against the installed transformers' own search
pytestmark = pytest.mark.equivalence


def _stock(num_drafts, max_ngram, max_length, eos, processors=None):
    return PromptLookupCandidateGenerator(
        eos_token_id=None if eos is None else torch.tensor(eos), num_output_tokens=num_drafts,
        max_matching_ngram_size=max_ngram, max_length=max_length, logits_processor=processors, vocab_size=8,
    )


def _assert_same_candidates(ours, theirs, ids):
    mine, mine_logits = ours.get_candidates(ids)
    expected, expected_logits = theirs.get_candidates(ids)
    assert mine_logits is None and expected_logits is None
    assert mine.shape == expected.shape and torch.equal(mine, expected), (ids.tolist(), mine.tolist(),
                                                                          expected.tolist())


# a vocabulary of 5 makes matches, repeated matches, end-of-sequence tokens and cut-offs frequent
sequences = st.lists(st.integers(0, 4), min_size=1, max_size=40)


@settings(max_examples=400, deadline=None, derandomize=True)
@given(tokens=sequences, num_drafts=st.integers(1, 6), max_ngram=st.integers(1, 4), extra=st.integers(-3, 8),
       eos=st.sampled_from([None, [4], [3, 4]]), empty_list=st.booleans())
def test_drafts_equal_transformers(tokens, num_drafts, max_ngram, extra, eos, empty_list):
    """Every setting transformers' search reads: the n-gram sizes, the draft count, max_length (at, below and past the
    ids), end-of-sequence ids; without logits processors or with an empty list (what generate passes)."""
    ids = torch.tensor([tokens])
    max_length = max(1, len(tokens) + extra)
    theirs = _stock(num_drafts, max_ngram, max_length, eos, LogitsProcessorList() if empty_list else None)
    ours = HostPromptLookup(_stock(num_drafts, max_ngram, max_length, eos,
                                   LogitsProcessorList() if empty_list else None))
    _assert_same_candidates(ours, theirs, ids)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(tokens=st.lists(st.integers(0, 4), min_size=2, max_size=60), cuts=st.lists(st.integers(1, 5), max_size=12),
       eos=st.sampled_from([None, [4]]))
def test_host_copy_follows_growing_ids(tokens, cuts, eos):
    """One HostPromptLookup over the rounds of a generate() call (the ids grow by a few tokens a round) drafts as a
    fresh search does every round; ids that did not grow from the last ones are read again in full."""
    theirs = _stock(3, 2, 200, eos)
    ours = HostPromptLookup(_stock(3, 2, 200, eos))
    length = 1
    for cut in [*cuts, len(tokens)]:
        length = min(len(tokens), length + cut)
        _assert_same_candidates(ours, theirs, torch.tensor([tokens[:length]]))
    other = [(token + 1) % 5 for token in tokens]  # another sequence of the same length: not a continuation
    _assert_same_candidates(ours, theirs, torch.tensor([other]))
    _assert_same_candidates(ours, theirs, torch.tensor([tokens[: len(tokens) // 2 + 1]]))  # shorter ids


def test_earliest_occurrence_and_limits():
    tokens = [1, 2, 7, 8, 1, 2, 9, 5, 1, 2]
    assert earliest_lookup(tokens, 3, 2) == (2, 5)  # the earliest "1 2", not the latest
    assert earliest_lookup(tokens, 3, 2, max_length=4) == (2, 4)  # never at or past max_length
    assert earliest_lookup(tokens, 3, 2, stops=frozenset({8})) == (2, 3)  # cut before an end-of-sequence id
    assert earliest_lookup(tokens, 3, 2, stops=frozenset({7})) is None  # a cut that leaves nothing drafts nothing
    assert earliest_lookup([5, 6, 5, 3, 6], 2, 2) == (2, 4)  # no earlier "3 6": the 1-gram "6" at its earliest
    assert earliest_lookup([1, 2, 3], 4, 2) is None
    assert earliest_lookup([4], 4, 2) is None


def test_processors_keep_transformers_search():
    """A non-empty processor list can forbid draft tokens: transformers' own search runs (same result, its path)."""
    tokens = torch.tensor([[1, 2, 3, 1, 2, 3, 1, 2]])
    processors = LogitsProcessorList([NoRepeatNGramLogitsProcessor(3)])
    ours = HostPromptLookup(_stock(4, 2, 50, None, processors))
    calls = []
    searched = ours.searched_on_device
    ours.searched_on_device = lambda *args, **kwargs: calls.append(1) or searched(*args, **kwargs)
    _assert_same_candidates(ours, _stock(4, 2, 50, None, processors), tokens)
    assert calls == [1]
    assert ours.tokens == []  # the host copy was never read


def _copying_prompt(model, seed, length=6, repeats=4):
    """Passages that repeat, each followed by the model's own greedy continuation, so drafts match and miss."""
    start = torch.randint(3, model.config.vocab_size, (1, length), generator=torch.Generator().manual_seed(seed))
    continuation = model.generate(start, do_sample=False, max_new_tokens=10)
    prompt = torch.cat([continuation] * repeats + [start], dim=1)
    return prompt.masked_fill(prompt == 0, 3)  # a pad id (0) in the prompt would make generate() infer a padding mask


@pytest.mark.parametrize("model_type", ["nemotron_h", "qwen3_5_text"])
def test_generate_drafts_on_host_and_equals_greedy(model_type, monkeypatch):
    """generate(prompt_lookup_num_tokens=...) on a ReplayCache without logits processors: every round's drafts come
    from the host copy, equal transformers' own search on the same ids, and the output equals greedy's (logits too)."""
    model = get_model(model_type)
    rounds = []
    original = HostPromptLookup.get_candidates

    def checked(self, input_ids, *args, **kwargs):
        candidates, logits = original(self, input_ids, *args, **kwargs)
        expected, _ = self.searched_on_device(input_ids, *args, **kwargs)
        assert torch.equal(candidates, expected)
        rounds.append(candidates.shape[1] - input_ids.shape[1])
        return candidates, logits

    monkeypatch.setattr(HostPromptLookup, "get_candidates", checked)
    settings_ = dict(do_sample=False, max_new_tokens=24, output_logits=True, return_dict_in_generate=True)
    for seed in range(2):
        prompt = _copying_prompt(model, seed)
        greedy = model.generate(prompt, **settings_)
        out = model.generate(prompt, past_key_values=ReplayCache(8), prompt_lookup_num_tokens=4, **settings_)
        assert torch.equal(out.sequences, greedy.sequences)
        assert max_logit_diff(out.logits, greedy.logits) < 1e-4
    assert rounds and max(rounds) > 0, rounds  # the host search ran and drafted


def test_generate_without_replay_cache_keeps_transformers_search(monkeypatch):
    """The host search is ReplayCache's: generate() on transformers' own cache searches as it always did."""
    model = get_model("nemotron_h")
    spy = []
    monkeypatch.setattr(host_lookup, "earliest_lookup", lambda *args, **kwargs: spy.append(1))
    prompt = _copying_prompt(model, 0)
    try:
        model.generate(prompt, do_sample=False, max_new_tokens=4, prompt_lookup_num_tokens=3)
    except ValueError as error:  # transformers before 5.25 refuses assisted generation for stateful models
        assert "stateful" in str(error).lower() or "assisted" in str(error).lower()
    assert spy == []
    model.generate(prompt, past_key_values=ReplayCache(8), do_sample=False, max_new_tokens=4,
                   prompt_lookup_num_tokens=3)
    assert spy  # the host search ran for the ReplayCache call (drafting nothing: the spy finds no span)


@pytest.mark.parametrize("model_type", ["nemotron_h", "kimi_linear"])
def test_static_cache_drafts_on_host_and_equals_greedy(model_type, monkeypatch):
    """The same on a static ReplayCache (verify forwards on device positions, crops committed on the device)."""
    model = get_model(model_type)
    searched = []
    original = HostPromptLookup.get_candidates

    def counting(self, input_ids, *args, **kwargs):
        candidates, logits = original(self, input_ids, *args, **kwargs)
        searched.append(candidates.shape[1] - input_ids.shape[1])
        return candidates, logits

    monkeypatch.setattr(HostPromptLookup, "get_candidates", counting)
    settings_ = dict(do_sample=False, max_new_tokens=20, output_logits=True, return_dict_in_generate=True)
    prompt = _copying_prompt(model, 1)
    greedy = model.generate(prompt, **settings_)
    cache = ReplayCache(4, max_cache_len=prompt.shape[1] + 20 + 6)
    out = model.generate(prompt, past_key_values=cache, prompt_lookup_num_tokens=5, **settings_)
    assert torch.equal(out.sequences, greedy.sequences)
    assert max_logit_diff(out.logits, greedy.logits) < 1e-4
    assert searched and max(searched) > 0, searched
