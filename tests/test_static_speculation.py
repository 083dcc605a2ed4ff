"""Speculative decoding on a static ReplayCache (``max_cache_len``): transformers' assisted loop at batch size 1,
its verify forwards on device positions (compiled where transformers compiles them), its crops committing on the
device (or, where the host schedule must take over, on the host) and giving back the static attention layers' newest
slots; plain decode steps before and after it on device positions (and compiled)."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from conftest import assisted_forwards_compile, decode, max_logit_diff
from transformers import DynamicCache, StaticCache
from transformers.cache_utils import StaticLayer, StaticSlidingWindowLayer
from transformers.generation import CompileConfig

from hf_replayssm import ReplayCache, cache_argument
from hf_replayssm import cache as cache_module
from hf_replayssm.layers import RollbackError
from hf_replayssm.static_decode import DevicePositions
from hf_replayssm.tiny import tiny_model

pytestmark = pytest.mark.equivalence

FAMILIES = ["nemotron_h", "qwen3_5_text", "kimi_linear"]  # Mamba-2, Gated DeltaNet, KDA
NEW, DRAFTS = 24, 3
# suppress_tokens: a generated pad token (id 0) makes generate() infer a padding mask for it; keep tokens ordinary
GREEDY = dict(do_sample=False, max_new_tokens=NEW, min_new_tokens=NEW, output_logits=True,
              return_dict_in_generate=True, suppress_tokens=[0])


def _model(model_type, seed=0):
    return tiny_model(model_type, seed=seed, initializer_range=0.2)


def _lookup_prompt(model, attempt):
    """A prompt that holds the model's own greedy continuation, so that prompt lookup finds drafts that match."""
    start = torch.randint(3, model.config.vocab_size, (1, 4), generator=torch.Generator().manual_seed(attempt))
    continuation = model.generate(start, do_sample=False, max_new_tokens=10, min_new_tokens=10, suppress_tokens=[0])
    return torch.cat([continuation, start], dim=1)


def _device_positions_active(cache) -> bool:
    return all(layer.schedule.device_positions.is_active() for layer in cache.replay_layers.values())


@pytest.mark.parametrize("model_type", FAMILIES)
def test_prompt_lookup_on_a_static_cache_equals_greedy(model_type):
    """Every run gives the greedy tokens and logits; at least one both accepts and rejects drafts; a continuation on
    the same cache decodes plainly on device positions again, equal to stock."""
    model = _model(model_type)
    forwards = []
    hook = model.register_forward_pre_hook(lambda module, args: forwards.append(1))
    mixed = False
    try:
        for attempt in range(10):  # random weights accept few drafts: try prompts until one run mixes both
            prompt = _lookup_prompt(model, attempt)
            greedy = model.generate(prompt, **GREEDY)
            cache = ReplayCache(4, max_cache_len=prompt.shape[1] + NEW + DRAFTS + 6)
            forwards.clear()
            out = model.generate(prompt, past_key_values=cache, prompt_lookup_num_tokens=DRAFTS, **GREEDY)
            assert torch.equal(out.sequences, greedy.sequences)
            assert max_logit_diff(out.logits, greedy.logits) < 1e-4
            # each verify forward keeps its accepted drafts and one token more
            if cache.stats()["rolled_back_tokens"] > 0 and len(forwards) < NEW:
                mixed = True
                break
    finally:
        hook.remove()
    assert mixed, "no run both accepted and rejected drafts"
    assert cache.get_seq_length() == out.sequences.shape[1] - 1  # the last token is not fed yet
    more = model.generate(out.sequences, past_key_values=cache, **dict(GREEDY, max_new_tokens=6, min_new_tokens=6))
    assert _device_positions_active(cache)
    # against stock greedy decoding of the prompt (a stock prefill of the whole sequence would differ: Mamba-2
    # mixers clamp dt in a multi-token forward and not in a decode step)
    stock = model.generate(prompt, **dict(GREEDY, max_new_tokens=NEW + 6, min_new_tokens=NEW + 6))
    assert torch.equal(more.sequences, stock.sequences)
    assert max_logit_diff(more.logits, stock.logits[NEW:]) < 1e-4


def test_prompt_lookup_runs_past_max_length_in_a_static_cache():
    """transformers' prompt lookup caps its drafts by the prompt, not by max_length, so a last verify forward can
    write past max_length (a stock static cache sized to it raises IndexError there: transformers 5.25,
    ``cache_implementation="static"``). A static ReplayCache is sized for one window more (generate() asks for it)
    and absorbs it: some run here writes past max_length, and every run equals greedy."""
    model = _model("qwen3_5_text")
    keyword = cache_argument(model)
    written = []

    def after_forward(module, args, kwargs, output):
        written.append(int(kwargs[keyword].get_seq_length()))

    hook = model.register_forward_hook(after_forward, with_kwargs=True)
    past = False
    try:
        for attempt in range(6):
            prompt = _lookup_prompt(model, attempt)
            greedy = model.generate(prompt, **GREEDY)
            max_length = prompt.shape[1] + NEW
            cache = ReplayCache(4, max_cache_len=max_length + DRAFTS)  # the least generate() accepts
            written.clear()
            out = model.generate(prompt, past_key_values=cache, prompt_lookup_num_tokens=DRAFTS, **GREEDY)
            assert torch.equal(out.sequences, greedy.sequences)
            assert max_logit_diff(out.logits, greedy.logits) < 1e-4
            past |= max(written) > max_length
    finally:
        hook.remove()
    assert past, "no verify forward ran past max_length"


def test_draft_model_on_a_static_cache_equals_greedy(monkeypatch):
    model, draft = _model("qwen3_5_text"), _model("qwen3_5_text", seed=5)
    for name, value in (("assistant_confidence_threshold", 0.0), ("num_assistant_tokens", 4),
                        ("num_assistant_tokens_schedule", "constant")):
        monkeypatch.setattr(draft.generation_config, name, value)
    prompt = torch.randint(3, model.config.vocab_size, (1, 9), generator=torch.Generator().manual_seed(3))
    greedy = model.generate(prompt, **GREEDY)
    cache = ReplayCache(4, max_cache_len=prompt.shape[1] + NEW + 4)
    out = model.generate(prompt, past_key_values=cache, assistant_model=draft, **GREEDY)
    assert torch.equal(out.sequences, greedy.sequences)
    assert max_logit_diff(out.logits, greedy.logits) < 1e-4
    assert cache.stats()["rolled_back_tokens"] > 0


@pytest.mark.parametrize("policy", ["separated-fp8", "separated-nvfp4"])
def test_separated_precision_speculation_on_a_static_cache(policy):
    """A read copy in a static cache through speculation: the same tokens as a dynamic cache with the same policy,
    drafts rejected on the way. The recurrence (the float32 state) agrees within float32 rounding; the logits too,
    but where that rounding puts a checkpoint value on the other side of a read-copy code's boundary: nvfp4's coarse
    codes can round one way in one cache and the other way in the other (seen at 2 torch threads: one step of 24
    off by 1.8e-4), which moves the steps that read that copy, and only them (its error never re-enters the
    recurrence)."""
    model = _model("kimi_linear")
    base = torch.randint(3, model.config.vocab_size, (1, 6), generator=torch.Generator().manual_seed(2))
    prompt = torch.cat([base] * 3, dim=1)
    dynamic_cache = ReplayCache(4, precision=policy)
    dynamic = model.generate(prompt, past_key_values=dynamic_cache, prompt_lookup_num_tokens=DRAFTS, **GREEDY)
    cache = ReplayCache(4, precision=policy, max_cache_len=prompt.shape[1] + NEW + DRAFTS)
    out = model.generate(prompt, past_key_values=cache, prompt_lookup_num_tokens=DRAFTS, **GREEDY)
    assert torch.equal(out.sequences, dynamic.sequences)
    for index, layer in cache.replay_layers.items():
        state, reference = layer.current_state(), dynamic_cache.replay_layers[index].current_state()
        assert torch.allclose(state, reference, rtol=1e-5, atol=1e-6), index
    steps = sorted(max_logit_diff([a], [b]) for a, b in zip(out.logits, dynamic.logits, strict=True))
    assert all(d == d for d in steps), steps  # no NaN (which sorts anywhere)
    if policy == "separated-fp8":
        assert steps[-1] < 1e-4
    else:  # a flipped code moves a few steps, never most of them, and never far
        assert steps[-1] < 1e-3 and steps[-len(steps) // 8] < 1e-5, steps
    assert cache.stats()["rolled_back_tokens"] > 0


@pytest.mark.parametrize("model_type", [*FAMILIES, "falcon_h1", "zamba2"])  # the last two: SSM + attention layers
def test_crop_a_static_cache_by_hand(model_type):
    """The manual cache API: plain steps on device positions, a recorded window, crop (by count and by the length to
    keep), plain steps again; the logits equal a stock cache fed only the kept tokens."""
    model = _model(model_type)
    tokens = torch.randint(3, model.config.vocab_size, (1, 30), generator=torch.Generator().manual_seed(11))
    cache = ReplayCache(4, window=5, max_cache_len=32)
    with torch.no_grad():
        model(tokens[:, :8], past_key_values=cache, use_cache=True)
        for pos in range(8, 13):  # across a flush (L = 4)
            model(tokens[:, pos : pos + 1], past_key_values=cache, use_cache=True)
        assert _device_positions_active(cache)
        cache.activate_past_recording()
        model(tokens[:, 13:18], past_key_values=cache, use_cache=True)  # a window of 5
        cache.crop(-3)  # keep 2 of them
        assert cache.get_seq_length() == 15
        model(tokens[:, 15:19], past_key_values=cache, use_cache=True)  # another window of 4
        assert cache.is_croppable  # transformers 5.17's StaticLayer says it is not; the cache crops it anyway
        cache.crop(17)  # keep 2 again, as the length to keep
        cache.deactivate_past_recording()
        for pos in range(17, 22):
            ours = model(tokens[:, pos : pos + 1], past_key_values=cache, use_cache=True).logits[:, -1]
        assert _device_positions_active(cache)
    assert cache.get_seq_length() == 22
    reference = decode(model, tokens[:, :22], 8, DynamicCache(config=model.config))[:, -1]
    assert (ours - reference).abs().max().item() < 1e-4
    assert cache.stats()["rolled_back_tokens"] == 5 * len(cache.replay_layers)


@pytest.mark.parametrize("model_type", FAMILIES)
def test_crops_after_device_verify_stay_on_the_device(model_type, monkeypatch):
    """In the assisted loop every crop commits the kept drafts on the device (``commit_windows``, once for all the
    layers) and leaves the positions alone: no device read; a crop that completes a period folds it on the host
    schedule and points the positions at the ring's new origin. Same tokens, logits and statistics as a dynamic
    cache; a plain continuation decodes on."""
    model = _model(model_type)
    prompt = _lookup_prompt(model, 0)
    dynamic_cache = ReplayCache(16)
    dynamic = model.generate(prompt, past_key_values=dynamic_cache, prompt_lookup_num_tokens=DRAFTS, **GREEDY)
    calls = Counter()
    for name in ("_count_crop", "leave", "ledger", "progress"):
        original = getattr(DevicePositions, name)
        monkeypatch.setattr(DevicePositions, name, lambda self, *a, _f=original, _n=name: (calls.update([_n]),
                                                                                           _f(self, *a))[1])
    commit_windows = cache_module.commit_windows
    monkeypatch.setattr(cache_module, "commit_windows",
                        lambda layers, kept: (calls.update(["commit_windows"]), commit_windows(layers, kept))[1])
    cache = ReplayCache(16, max_cache_len=prompt.shape[1] + NEW + DRAFTS + 6)
    out = model.generate(prompt, past_key_values=cache, prompt_lookup_num_tokens=DRAFTS, **GREEDY)
    assert torch.equal(out.sequences, dynamic.sequences) and max_logit_diff(out.logits, dynamic.logits) < 1e-4
    layers = len(cache.replay_layers)
    rounds = calls["commit_windows"]  # one call a crop on the device, every layer's count in it
    assert rounds > 0 and calls["_count_crop"] == rounds * layers
    # every crop stayed on the device, those that completed a period too (folded on the host schedule, flushes > 0
    # below): the positions were handed back, reading the ledger, once per layer, at the end of generate
    assert calls["ledger"] == layers and calls["leave"] == layers, calls
    assert calls["progress"] <= 2 * layers, calls  # prefill bookkeeping only (get_seq_length while verifying)
    # (a dynamic cache stages the checkpoints of windows that cross a flush; a static one folds at the crop)
    ours, theirs = ({k: v for k, v in c.stats().items() if k != "staged_checkpoints"} for c in (cache, dynamic_cache))
    assert ours == theirs and ours["rolled_back_tokens"] > 0 and ours["flushes"] > 0
    more = model.generate(out.sequences, past_key_values=cache, **dict(GREEDY, max_new_tokens=6, min_new_tokens=6))
    reference = model.generate(out.sequences, past_key_values=dynamic_cache,
                               **dict(GREEDY, max_new_tokens=6, min_new_tokens=6))
    assert torch.equal(more.sequences, reference.sequences) and max_logit_diff(more.logits, reference.logits) < 1e-4
    assert _device_positions_active(cache)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager-window", "compiled-window"])
def test_a_crop_past_the_verified_window_is_refused(compiled):
    """A crop that keeps more tokens than the window fed (a caller's error: the assisted loop never does it) is
    refused: at once, changing nothing, where the host saw the window's width (an eager verify forward); where it
    did not (a compiled forward called without generate()'s wrapper) the crop reads nothing, so it is counted on
    the device and raised when the positions are handed back, before anything reads the cache."""
    model = _model("qwen3_5_text")
    window_forward = torch.compile(model, backend="eager") if compiled else model
    tokens = torch.randint(3, model.config.vocab_size, (1, 20), generator=torch.Generator().manual_seed(4))
    cache = ReplayCache(16, window=4, max_cache_len=24)
    with torch.no_grad():
        model(tokens[:, :8], past_key_values=cache, use_cache=True)
        cache.set_device_verify(True)
        cache.activate_past_recording()
        model(tokens[:, 8:11], past_key_values=cache, use_cache=True)  # a host window, then the first crop
        cache.crop(9)  # enters device positions for the next window
        assert _device_positions_active(cache)
        window_forward(tokens[:, 9:11], past_key_values=cache, use_cache=True)  # a window of 2 on the device
        positions = cache.replay_layers[next(iter(cache.replay_layers))].schedule.device_positions
        assert positions.is_verifying() and (positions.fed is None) == compiled
        if not compiled:
            with pytest.raises(ValueError, match="cannot crop to length 12"):
                cache.crop(12)  # keeps 3 of 2
            assert _device_positions_active(cache) and cache.get_seq_length() == 11
            return
        cache.crop(12)  # keeps 3 of 2
        assert _device_positions_active(cache)
        with pytest.raises(RuntimeError, match="kept more tokens than their verify window fed"):
            cache.set_device_verify(False)  # hands the positions back


def _recording_config(graphs, fullgraph=True):
    def recording_backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    config = CompileConfig(fullgraph=fullgraph, backend=recording_backend, mode=None)
    config._compile_all_devices = True  # transformers compiles on CUDA only otherwise
    return config


@pytest.mark.parametrize("model_type", [*FAMILIES, "falcon_h1"])  # falcon_h1: SSM and attention in one layer
def test_verify_forwards_compile_on_device_positions(model_type, monkeypatch):
    """transformers 5.25 compiles the verify forwards of a compileable cache: a static ReplayCache's run on device
    positions through the verify ops, whole (fullgraph: no host position read, no graph break), at most one graph per
    window width, with the greedy tokens, within 1e-5 of the same call kept eager and with its statistics; a plain
    generate on the same cache afterwards compiles too. (5.17 runs assisted forwards eagerly: no graph there.)"""
    model = _model(model_type)
    graphs = []
    config = _recording_config(graphs)
    prompt = _lookup_prompt(model, 0)
    greedy = model.generate(prompt, **GREEDY)
    size = prompt.shape[1] + NEW + DRAFTS
    eager_cache = ReplayCache(4, max_cache_len=size)
    eager = model.generate(prompt, past_key_values=eager_cache, prompt_lookup_num_tokens=DRAFTS, disable_compile=True,
                           **GREEDY)
    cache = ReplayCache(4, max_cache_len=size)
    torch._dynamo.reset()
    commits = []  # crops on the device: the compiled call's caller told the cache each window's width
    count_crop = DevicePositions._count_crop
    monkeypatch.setattr(DevicePositions, "_count_crop", lambda self, kept: (commits.append(kept),
                                                                           count_crop(self, kept))[1])
    out = model.generate(prompt, past_key_values=cache, prompt_lookup_num_tokens=DRAFTS, compile_config=config,
                         **GREEDY)
    assert commits and all(1 <= kept <= DRAFTS + 1 for kept in commits)
    assert torch.equal(out.sequences, greedy.sequences) and max_logit_diff(out.logits, greedy.logits) < 1e-4
    assert max_logit_diff(out.logits, eager.logits) < 1e-5  # transformers' compiled masks round a little apart
    assert cache.stats() == eager_cache.stats() and cache.stats()["rolled_back_tokens"] > 0
    if assisted_forwards_compile():
        assert graphs and all("verify" in gm.code for gm in graphs), "the verify forwards did not compile"
        assert len(graphs) <= DRAFTS + 1  # no recompilation per step
    else:
        assert graphs == []
    cache.reset()
    graphs.clear()
    again = model.generate(prompt, past_key_values=cache, compile_config=config, **GREEDY)
    assert graphs, "the plain decode steps did not compile"
    assert torch.equal(again.sequences, greedy.sequences) and max_logit_diff(again.logits, greedy.logits) < 1e-4
    torch._dynamo.reset()


def test_speculative_sampling_compiled_equals_a_dynamic_cache():
    """Speculative sampling with a draft model (the assisted loop's rejection sampling): a static cache, its verify
    forwards compiled on device positions where transformers compiles them, draws the dynamic cache's tokens under
    the same seed, with its logits and rollback counts."""
    model, draft = _model("qwen3_5_text"), _model("qwen3_5_text", seed=3)
    prompt = torch.randint(3, model.config.vocab_size, (1, 9), generator=torch.Generator().manual_seed(1))
    sampling = dict(GREEDY, do_sample=True, temperature=1.5)
    graphs = []
    torch._dynamo.reset()
    runs = []
    for cache in (ReplayCache(4), ReplayCache(4, max_cache_len=prompt.shape[1] + NEW + 25)):
        torch.manual_seed(7)
        runs.append((cache, model.generate(prompt, past_key_values=cache, assistant_model=draft,
                                           compile_config=_recording_config(graphs, fullgraph=False), **sampling)))
    (dynamic, expected), (static, out) = runs
    assert torch.equal(out.sequences, expected.sequences) and max_logit_diff(out.logits, expected.logits) < 1e-4
    assert static.stats()["rolled_back_tokens"] == dynamic.stats()["rolled_back_tokens"] > 0
    assert bool(graphs) == assisted_forwards_compile()
    torch._dynamo.reset()


def test_verify_windows_wider_than_reserved_and_read_copies_stay_on_the_host():
    """A draft model whose heuristic schedule drafts more tokens than the cache reserved: those windows leave device
    positions for the host schedule (which grows the rings; a graph break where compiled), and the tokens stay
    greedy. A read copy (separated precision: the verify ops read none) keeps every verify forward eager."""
    model = _model("qwen3_5_text")
    draft = _model("qwen3_5_text")  # the same weights: every draft accepted, so the window grows by 2 a round
    draft.generation_config.num_assistant_tokens = 2
    draft.generation_config.num_assistant_tokens_schedule = "heuristic"
    draft.generation_config.assistant_confidence_threshold = 0.0  # (random weights: low confidence cuts drafts)
    prompt = torch.randint(3, model.config.vocab_size, (1, 7), generator=torch.Generator().manual_seed(1))
    greedy = model.generate(prompt, **GREEDY)
    graphs = []
    torch._dynamo.reset()
    cache = ReplayCache(4, max_cache_len=prompt.shape[1] + NEW + 40)
    out = model.generate(prompt, past_key_values=cache, assistant_model=draft,
                         compile_config=_recording_config(graphs, fullgraph=False), **GREEDY)
    assert torch.equal(out.sequences, greedy.sequences) and max_logit_diff(out.logits, greedy.logits) < 1e-4
    assert draft.generation_config.num_assistant_tokens > 3 + 4  # windows past the reserved slots (3)
    assert max(layer.schedule.window for layer in cache.replay_layers.values()) > 3
    graphs.clear()
    torch._dynamo.reset()
    cache = ReplayCache(4, precision="separated-fp8", max_cache_len=prompt.shape[1] + NEW + DRAFTS)
    out = model.generate(prompt, past_key_values=cache, prompt_lookup_num_tokens=DRAFTS,
                         compile_config=_recording_config(graphs), **GREEDY)
    dynamic = model.generate(prompt, past_key_values=ReplayCache(4, precision="separated-fp8"),
                             prompt_lookup_num_tokens=DRAFTS, **GREEDY)
    assert graphs == []
    assert torch.equal(out.sequences, dynamic.sequences) and max_logit_diff(out.logits, dynamic.logits) < 1e-4
    torch._dynamo.reset()


def test_static_speculation_refusals():
    model = _model("qwen3_5_text")
    prompt = torch.randint(3, model.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(2))
    with pytest.raises(ValueError, match="batch size 1"):  # the batched route keeps rejected drafts' slots
        model.generate(prompt, past_key_values=ReplayCache(4, max_cache_len=64), prompt_lookup_num_tokens=3,
                       max_new_tokens=5)
    # prompt lookup may draft past max_length: the cache must hold the drafts of the last verify forward too
    with pytest.raises(ValueError, match=r"reaches 17 tokens \(14 and up to 3 drafts.*max_cache_len=17"):
        model.generate(prompt[:1], past_key_values=ReplayCache(4, max_cache_len=16), prompt_lookup_num_tokens=3,
                       max_new_tokens=5)
    # a sliding-window static layer cannot give its slots back (transformers 5.25: once it can wrap; 5.17: ever)
    cache = ReplayCache(4, window=4, max_cache_len=24)
    cache.activate_past_recording()
    with torch.no_grad():
        model(prompt[:1], past_key_values=cache, use_cache=True)
        model(prompt[:1, :3], past_key_values=cache, use_cache=True)
    index = next(i for i, layer in enumerate(cache.layers) if isinstance(layer, StaticLayer))
    full = cache.layers[index]
    cache.layers[index] = StaticSlidingWindowLayer(max_cache_len=24, sliding_window=8)
    before = {i: layer.ring.num_pending for i, layer in cache.replay_layers.items()}
    with pytest.raises(RollbackError, match="sliding-window"):
        cache.crop(-2)
    assert {i: layer.ring.num_pending for i, layer in cache.replay_layers.items()} == before  # nothing changed
    cache.layers[index] = full
    cache.crop(-2)
    assert cache.get_seq_length() == 10


def test_static_layers_are_what_the_crop_expects():
    """The crop of a static attention layer rewinds ``cumulative_length``, where transformers' StaticLayer writes
    (5.25 has StaticLayer.crop; 5.17 has neither crop nor a sliding-window layer that could rewind)."""
    model = _model("qwen3_5_text")
    static = StaticCache(config=model.config.get_text_config(decoder=True), max_cache_len=16)
    layer = next(layer for layer in static.layers if isinstance(layer, StaticLayer))
    keys = torch.randn(1, model.config.num_key_value_heads, 5, model.config.head_dim)
    layer.update(keys, keys.clone())
    assert int(layer.get_seq_length()) == 5
    from hf_replayssm.layers import crop_static_attention

    crop_static_attention(layer, -2)
    assert int(layer.get_seq_length()) == 3
    layer.update(keys[:, :, :1] + 1, keys[:, :, :1] + 1)
    assert torch.equal(layer.keys[:, :, 3], keys[:, :, 0] + 1)  # written where the cropped slot was
