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
    _check_rows_alone(model, ReplayCache(buffer_len, window=4), prompt, rounds, seed)


def _check_rows_alone(model, cache, prompt: torch.Tensor, rounds: list[tuple[int, list[int]]], seed: int) -> None:
    """``rounds`` through ``cache`` (:func:`run_rounds`): each row's logits equal that row decoded alone, and the
    cache counts every dropped token in every SSM layer."""
    kept, ours = run_rounds(model, cache, prompt, rounds, seed)
    for r in range(ROWS):
        reference = _alone(model, kept[r])
        assert ours[r].shape == reference.shape
        diff = (ours[r] - reference).abs().max().item()
        assert diff < 1e-4, (r, diff)
    dropped = sum(sum(d) for _, d in rounds)
    assert cache.stats()["rolled_back_tokens"] == dropped * len(cache.replay_layers)


@pytest.mark.parametrize("model_type", ["nemotron_h", "qwen3_5_text", "kimi_linear"])
def test_drop_rows_in_a_static_cache_equal_rows_alone(model_type):
    """Per-row rollback in a static cache (``max_cache_len``): the SSM layers leave their device positions, and the
    dropped tokens keep their (masked) slots in transformers' static attention layers, as in a dynamic cache."""
    model = _model(model_type)
    rounds = [(3, [0, 2, 1]), (4, [3, 0, 2]), (2, [1, 1, 0]), (4, [0, 3, 3]), (1, [0, 0, 0])]
    prompt = torch.randint(3, model.config.vocab_size, (ROWS, PROMPT), generator=torch.Generator().manual_seed(7))
    cache = ReplayCache(3, window=4, max_cache_len=PROMPT + sum(length for length, _ in rounds))
    _check_rows_alone(model, cache, prompt, rounds, seed=7)


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
    # through the cache, after a window: refused before any layer is written (one count would broadcast over the
    # rows of the packed buffers)
    with torch.no_grad():
        model(torch.randint(3, 100, (ROWS, 2)), past_key_values=cache, use_cache=True)
    before = [{n: t.clone() for n, t in layer.schedule.ring.fields.items()} for layer in cache.replay_layers.values()]
    with pytest.raises(ValueError, match="rows"):
        cache.drop_rows([1])
    for saved, layer in zip(before, cache.replay_layers.values(), strict=True):
        assert all(torch.equal(saved[n], t) for n, t in layer.schedule.ring.fields.items())


def _greedy_alone(model, prompt: list[int], new: int) -> list[int]:
    """Plain greedy decoding of one row with a stock cache (argmax only: no end-of-sequence handling)."""
    cache, tokens = DynamicCache(config=model.config), list(prompt)
    with torch.no_grad():
        logits = model(torch.tensor([prompt]), past_key_values=cache, use_cache=True).logits
        for _ in range(new):
            tokens.append(int(logits[0, -1].argmax()))
            logits = model(torch.tensor([[tokens[-1]]]), past_key_values=cache, use_cache=True).logits
    return tokens


def _repetitive_prompts(vocab: int, lengths: list[int], seed: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    prompts = []
    for length in lengths:
        pattern = torch.randint(3, vocab, (5,), generator=generator).tolist()
        prompts.append((pattern * length)[:length])
    return prompts


@pytest.mark.parametrize("model_type", ["nemotron_h", "qwen3_5_text", "kimi_linear"])
def test_batched_prompt_lookup_equals_each_row_alone(model_type):
    """Rows of different lengths (left padding) and repetitive text: every row's tokens equal its own greedy
    decoding, with drafts accepted and rejected along the way."""
    from hf_replayssm.batched import batched_prompt_lookup

    model = _model(model_type)
    prompts = _repetitive_prompts(model.config.vocab_size, [14, 9, 12], seed=3)
    width = max(map(len, prompts))
    pad = model.config.pad_token_id or 0
    input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    eos = model.generation_config.eos_token_id
    result = batched_prompt_lookup(model, input_ids, attention_mask=mask, max_new_tokens=16, num_draft_tokens=3,
                                   eos_token_id=eos, cache=ReplayCache(buffer_len=4))
    for prompt, new in zip(prompts, result.new_tokens, strict=True):
        alone = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=16)[0, len(prompt):].tolist()
        if eos in alone:  # generate pads after the end of sequence
            alone = alone[: alone.index(eos) + 1]
        assert new == alone
    assert result.drafted > 0 and 0 <= result.acceptance <= 1


@pytest.mark.parametrize("model_type", ["nemotron_h", "qwen3_5_text", "kimi_linear", "lfm2"])
def test_batched_speculation_with_partly_right_drafts(model_type):
    """A drafter that knows each row's greedy continuation but corrupts one draft at a random place per round:
    rows accept different numbers of drafts every round, and every row still equals its own greedy decoding."""
    from hf_replayssm.batched import batched_prompt_lookup

    model = _model(model_type)
    generator = torch.Generator().manual_seed(7)
    prompts = [torch.randint(3, model.config.vocab_size, (n,), generator=generator).tolist() for n in (10, 7, 9)]
    new = 14
    truth = [_greedy_alone(model, p, new) for p in prompts]
    rng = torch.Generator().manual_seed(11)

    def drafter(row, tokens, count):
        upcoming = truth[row][len(tokens) : len(tokens) + count]
        wrong = int(torch.randint(0, count + 1, (1,), generator=rng))  # == count: every draft right
        return [t if i != wrong else (t + 1) % model.config.vocab_size for i, t in enumerate(upcoming)]

    width = max(map(len, prompts))
    input_ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    result = batched_prompt_lookup(model, input_ids, attention_mask=mask, max_new_tokens=new, num_draft_tokens=3,
                                   drafter=drafter, cache=ReplayCache(buffer_len=4))
    for prompt, tokens, expected in zip(prompts, result.new_tokens, truth, strict=True):
        assert tokens == expected[len(prompt) :]
    assert 0 < result.accepted < result.drafted and result.forwards < new
    assert len(set(result.accepted_per_row)) > 1 or result.accepted_per_row[0] > 0


def test_lookup_drafts():
    from hf_replayssm.batched import lookup_drafts

    assert lookup_drafts([1, 2, 3, 9, 1, 2], 2) == [3, 9]  # the bigram (1, 2) occurred before
    assert lookup_drafts([5, 1, 7, 7, 1], 3) == [7, 7, 1]  # unigram fallback, latest occurrence
    assert lookup_drafts([1, 2, 3], 4) == []


def _lookup_by_every_start(tokens, num_drafts, max_ngram):
    """The definition, spelled out: every start from the latest down, n from max_ngram to 1."""
    for n in range(min(max_ngram, len(tokens) - 1), 0, -1):
        for start in range(len(tokens) - n - 1, -1, -1):
            if tokens[start : start + n] == tokens[-n:]:
                return tokens[start + n : start + n + num_drafts]
    return []


@settings(max_examples=300, deadline=None)
@given(tokens=st.lists(st.integers(0, 5), max_size=40), num_drafts=st.integers(1, 6), max_ngram=st.integers(1, 4))
def test_lookup_drafts_equals_the_definition(tokens, num_drafts, max_ngram):
    """The C-level scan finds the same occurrence as trying every start (small alphabets: many partial matches)."""
    from hf_replayssm.batched import lookup_drafts

    assert lookup_drafts(tokens, num_drafts, max_ngram) == _lookup_by_every_start(tokens, num_drafts, max_ngram)


@pytest.mark.parametrize("model_type", ["qwen3_5_text", "nemotron_h"])
def test_generate_routes_a_batch_with_prompt_lookup(model_type):
    """generate(batch > 1, prompt_lookup_num_tokens=k, past_key_values=ReplayCache()) decodes (transformers refuses
    batched assisted generation): the same sequences as plain batched greedy generate, eos and padding included."""
    model = _model(model_type)
    prompts = _repetitive_prompts(model.config.vocab_size, [12, 8], seed=5)
    pad = model.config.pad_token_id or 0
    input_ids = torch.tensor([[pad] * (12 - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (12 - len(p)) + [1] * len(p) for p in prompts])
    plain = model.generate(input_ids, attention_mask=mask, do_sample=False, max_new_tokens=12)
    cache = ReplayCache(4)  # created before the call: the first ReplayCache installs the generate() hook
    routed = model.generate(input_ids, attention_mask=mask, do_sample=False, max_new_tokens=12,
                            prompt_lookup_num_tokens=3, past_key_values=cache)
    assert torch.equal(routed[:, : plain.shape[1]], plain)
    assert (routed[:, plain.shape[1] :] == (model.generation_config.pad_token_id or 0)).all()
    with pytest.raises(ValueError, match="greedy only"):
        model.generate(input_ids, attention_mask=mask, do_sample=True, max_new_tokens=4, prompt_lookup_num_tokens=3,
                       past_key_values=ReplayCache(4))
    # return_dict_in_generate gives the same sequences in transformers' output type; per-step outputs are refused
    as_dict = model.generate(input_ids, attention_mask=mask, do_sample=False, max_new_tokens=12,
                             prompt_lookup_num_tokens=3, past_key_values=ReplayCache(4), return_dict_in_generate=True)
    assert type(as_dict).__name__ == "GenerateDecoderOnlyOutput" and torch.equal(as_dict.sequences, routed)
    for output in ("output_scores", "output_logits", "output_attentions", "output_hidden_states"):
        with pytest.raises(ValueError, match=f"returns the sequences only: {output}=True"):
            model.generate(input_ids, attention_mask=mask, do_sample=False, max_new_tokens=4,
                           prompt_lookup_num_tokens=3, past_key_values=ReplayCache(4), return_dict_in_generate=True,
                           **{output: True})
    # settings whose logits processors change greedy's choice are refused, not ignored
    for setting in ({"min_new_tokens": 4}, {"suppress_tokens": [0]}, {"repetition_penalty": 1.3},
                    {"no_repeat_ngram_size": 2}, {"bad_words_ids": [[5]]}):
        with pytest.raises(ValueError, match=f"does not apply {next(iter(setting))}="):
            model.generate(input_ids, attention_mask=mask, do_sample=False, max_new_tokens=4,
                           prompt_lookup_num_tokens=3, past_key_values=ReplayCache(4), **setting)
    with pytest.raises(ValueError, match="does not run logits_processor"):
        from transformers import LogitsProcessorList, MinLengthLogitsProcessor

        model.generate(input_ids, attention_mask=mask, do_sample=False, max_new_tokens=4, prompt_lookup_num_tokens=3,
                       past_key_values=ReplayCache(4),
                       logits_processor=LogitsProcessorList([MinLengthLogitsProcessor(20, eos_token_id=2)]))
    with pytest.raises(ValueError, match="does not run streamer"):  # it would never stream
        from transformers import TextStreamer

        model.generate(input_ids, attention_mask=mask, do_sample=False, max_new_tokens=4, prompt_lookup_num_tokens=3,
                       past_key_values=ReplayCache(4), streamer=TextStreamer(tokenizer=None))
    # model inputs plain generate() would hand to the forward (here: position ids; images in test_vision_language)
    with pytest.raises(ValueError, match="would ignore position_ids"):
        model.generate(input_ids, attention_mask=mask, do_sample=False, max_new_tokens=4, prompt_lookup_num_tokens=3,
                       past_key_values=ReplayCache(4), position_ids=torch.arange(input_ids.shape[1]).expand(2, -1))


def test_a_cache_after_batched_speculation_takes_no_more_tokens():
    """The batched route leaves every rejected draft's attention K/V in the cache (its own masks hid them), and its
    cache has fed the last emitted tokens too: a later forward on it would decode wrongly (it did: another
    continuation than stock). It refuses until reset(); after reset the cache serves a new prompt exactly."""
    model = _model("qwen3_5_text")
    input_ids = torch.tensor(_repetitive_prompts(model.config.vocab_size, [12, 12], seed=4))
    cache = ReplayCache(4)
    out = model.generate(input_ids, do_sample=False, max_new_tokens=8, prompt_lookup_num_tokens=3,
                         past_key_values=cache)
    with pytest.raises(ValueError, match=r"takes no more tokens.*cache.reset\(\)"):
        model.generate(out, do_sample=False, max_new_tokens=4, past_key_values=cache)
    with pytest.raises(ValueError, match="takes no more tokens"), torch.no_grad():
        model(out[:, -1:], past_key_values=cache, use_cache=True)
    assert cache.stats()["ssm_layers"] > 0  # questions that feed nothing still work
    cache.reset()
    again = model.generate(out, do_sample=False, max_new_tokens=4, past_key_values=cache)
    assert torch.equal(again, model.generate(out, do_sample=False, max_new_tokens=4))


def test_generate_route_counts_new_tokens_as_generate_does():
    """Without max_new_tokens the batched route takes max_length minus the prompt, or transformers' default of 20 new
    tokens, as plain generate() does (it used to refuse such calls); a max_length that leaves no room is an error."""
    model = _model("qwen3_5_text")
    input_ids = torch.tensor(_repetitive_prompts(model.config.vocab_size, [12, 12], seed=2))
    for lengths in ({"max_length": 27}, {}):
        plain = model.generate(input_ids, do_sample=False, **lengths)
        routed = model.generate(input_ids, do_sample=False, prompt_lookup_num_tokens=3, past_key_values=ReplayCache(4),
                                **lengths)
        assert plain.shape[1] == 12 + (15 if lengths else 20) and torch.equal(routed, plain), lengths
    with pytest.raises(ValueError, match="no room for new tokens"):
        model.generate(input_ids, do_sample=False, max_length=10, prompt_lookup_num_tokens=3,
                       past_key_values=ReplayCache(4))


def test_generate_route_infers_the_padding_mask_as_generate_does():
    """A left-padded batch passed without attention_mask: plain generate() masks the pad tokens (when the pad id is
    not an end-of-sequence id), and so does the batched route; with pad == eos nothing is masked in either."""
    model = _model("qwen3_5_text")
    input_ids = torch.tensor(_repetitive_prompts(model.config.vocab_size, [12, 12], seed=4))
    input_ids[1, :4] = 1
    for ids in ({"pad_token_id": 1}, {"pad_token_id": 1, "eos_token_id": 1}):
        plain = model.generate(input_ids, do_sample=False, max_new_tokens=8, **ids)
        routed = model.generate(input_ids, do_sample=False, max_new_tokens=8, prompt_lookup_num_tokens=3,
                                past_key_values=ReplayCache(4), **ids)
        assert torch.equal(routed[:, : plain.shape[1]], plain), ids
    unmasked = model.generate(input_ids, do_sample=False, max_new_tokens=8, pad_token_id=1,
                              attention_mask=torch.ones_like(input_ids))
    assert not torch.equal(unmasked[1], model.generate(input_ids, do_sample=False, max_new_tokens=8,
                                                       pad_token_id=1)[1])  # the mask matters for the padded row


def test_several_end_of_sequence_ids_as_in_a_generation_config():
    """A generation config may list several end-of-sequence ids (Qwen's do): each row stops at the first of them it
    emits, through generate() and batched_prompt_lookup, exactly as plain batched greedy generate stops and pads."""
    from hf_replayssm.batched import batched_prompt_lookup

    model = _model("qwen3_5_text")
    prompts = _repetitive_prompts(model.config.vocab_size, [10, 10, 10], seed=11)
    input_ids = torch.tensor(prompts)
    free = [_greedy_alone(model, p, 12)[len(p) :] for p in prompts]

    def first_stops(ids):
        return [next((t for t in row if t in ids), None) for row in free]

    # two ids such that one row stops at each (rows stop at different places; a row may not stop at all)
    eos = next([a, b] for a in free[0][1:6] for b in free[1][3:9]
               if a != b and {a, b} <= set(first_stops([a, b])))
    plain = model.generate(input_ids, do_sample=False, max_new_tokens=12, eos_token_id=eos, pad_token_id=0)
    routed = model.generate(input_ids, do_sample=False, max_new_tokens=12, eos_token_id=eos, pad_token_id=0,
                            prompt_lookup_num_tokens=3, past_key_values=ReplayCache(4))
    assert torch.equal(routed[:, : plain.shape[1]], plain) and (routed[:, plain.shape[1] :] == 0).all()
    result = batched_prompt_lookup(model, input_ids, max_new_tokens=12, num_draft_tokens=3, eos_token_id=eos,
                                   cache=ReplayCache(4))
    for row, tokens in enumerate(result.new_tokens):
        end = next((i + 1 for i, t in enumerate(free[row]) if t in eos), 12)
        assert tokens == free[row][:end], (row, tokens, free[row], eos)
    assert {tokens[-1] for tokens in result.new_tokens} >= set(eos)  # rows stopped at each of the ids


@pytest.mark.parametrize("model_type", ["nemotron_h", "qwen3_5_text"])
def test_heuristic_draft_schedule_per_row(model_type):
    """draft_schedule="heuristic": a row whose drafts always fail falls to one draft per round, a row whose drafts
    are always right keeps the full window (capped at num_draft_tokens), and every row still equals its own greedy
    decoding."""
    from hf_replayssm.batched import batched_prompt_lookup

    model = _model(model_type)
    generator = torch.Generator().manual_seed(17)
    prompts = [torch.randint(3, model.config.vocab_size, (n,), generator=generator).tolist() for n in (9, 9)]
    new = 16
    truth = [_greedy_alone(model, p, new) for p in prompts]
    asked: list[list[int]] = [[], []]

    def drafter(row, tokens, count):
        asked[row].append(count)
        upcoming = truth[row][len(tokens) : len(tokens) + count]
        if row == 0:  # always right
            return upcoming
        return [(t + 1) % model.config.vocab_size for t in upcoming]  # always wrong

    input_ids = torch.tensor(prompts)
    result = batched_prompt_lookup(model, input_ids, max_new_tokens=new, num_draft_tokens=4, drafter=drafter,
                                   cache=ReplayCache(buffer_len=4), draft_schedule="heuristic")
    for prompt, tokens, expected in zip(prompts, result.new_tokens, truth, strict=True):
        assert tokens == expected[len(prompt) :]
    assert asked[1][:4] == [4, 3, 2, 1] and set(asked[1][3:]) == {1}  # -1 per failed round, down to 1
    assert max(asked[0]) == 4 and asked[0][0] == 4  # never above the reserved window
    constant = batched_prompt_lookup(model, input_ids, max_new_tokens=new, num_draft_tokens=4, drafter=drafter,
                                     cache=ReplayCache(buffer_len=4))
    assert constant.new_tokens == result.new_tokens and constant.drafted > result.drafted
    with pytest.raises(ValueError, match="draft_schedule must be one of"):
        batched_prompt_lookup(model, input_ids, max_new_tokens=4, draft_schedule="dynamic")


def test_generate_route_takes_the_assistants_heuristic_schedule(monkeypatch):
    """A draft model whose generation config asks for transformers' heuristic schedule gets it per row in the batched
    route; prompt lookup keeps a constant number of drafts, as in transformers."""
    import hf_replayssm.batched as batched

    model, draft = _model("nemotron_h"), _model("nemotron_h")
    seen = []
    real = batched.batched_prompt_lookup

    def spy(*args, **kwargs):
        seen.append(kwargs["draft_schedule"])
        return real(*args, **kwargs)

    monkeypatch.setattr(batched, "batched_prompt_lookup", spy)
    input_ids = torch.randint(3, model.config.vocab_size, (2, 6), generator=torch.Generator().manual_seed(2))
    draft.generation_config.num_assistant_tokens = 3
    for schedule in ("heuristic", "constant"):
        draft.generation_config.num_assistant_tokens_schedule = schedule
        model.generate(input_ids, do_sample=False, max_new_tokens=5, assistant_model=draft,
                       past_key_values=ReplayCache(4))
    model.generate(input_ids, do_sample=False, max_new_tokens=5, prompt_lookup_num_tokens=3,
                   past_key_values=ReplayCache(4))
    assert seen == ["heuristic", "constant", "constant"]
