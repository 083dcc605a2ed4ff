"""Every transformers speculative-decoding mode with a ReplayCache: multi-token-prediction heads (``use_mtp``),
universal assisted generation (an assistant with another tokenizer), DFlash assistants, early-exit
self-speculation and speculative sampling. Greedy modes must equal plain greedy decoding; sampling must emit, at
every position, the main model's teacher-forced logits for that prefix. Modes a transformers version lacks are
skipped; modes it cannot run on a hybrid are refused with a clear error."""

import copy

import pytest
import torch
import transformers
from conftest import GREEDY_KW, STOCK_ROLLS_BACK_LINEAR, decode, get_model, max_logit_diff
from transformers import DynamicCache

from hf_replayssm import ReplayCache

pytestmark = pytest.mark.equivalence
GREEDY = dict(GREEDY_KW, max_new_tokens=20, min_new_tokens=20)
SAMPLE = dict(do_sample=True, max_new_tokens=24, min_new_tokens=24, output_logits=True, output_scores=True,
              return_dict_in_generate=True, suppress_tokens=[0])


def _draft_counts(cache, new_tokens):
    """(drafts accepted, tokens rolled back) by the main model's cache: each verify forward emits one token of its
    own plus the drafts it accepted."""
    stats = cache.stats()
    forwards = stats["decode_steps"] // stats["ssm_layers"] + 1
    return new_tokens - forwards, stats["rolled_back_tokens"] // stats["ssm_layers"]


def _steer_drafts(monkeypatch, generator_cls, reference):
    """Random-weight drafters (MTP heads, DFlash) almost never propose the main model's token. Rewrite the first
    0, 1 or 2 drafts of each round (in turn) to the reference continuation, so a run accepts some drafts and rejects
    others; the verify step, and hence the output, must not depend on what the drafts were."""
    original = generator_cls.get_candidates
    calls = []

    def get_candidates(self, input_ids, *args, **kwargs):
        candidates, logits = original(self, input_ids, *args, **kwargs)
        calls.append(1)
        start = input_ids.shape[1]
        agree = min(len(calls) % 3, candidates.shape[1] - start, reference.shape[1] - start)
        if agree > 0:
            candidates = candidates.clone()
            candidates[:, start : start + agree] = reference[:, start : start + agree]
        return candidates, logits

    monkeypatch.setattr(generator_cls, "get_candidates", get_candidates)


def _assert_greedy_exact(out, greedy, cache):
    assert torch.equal(out.sequences, greedy.sequences)
    assert max_logit_diff(out.logits, greedy.logits) < 1e-4
    accepted, rejected = _draft_counts(cache, GREEDY["max_new_tokens"])
    assert accepted > 0 and rejected > 0, (accepted, rejected)


# ---------------------------------------------------------------------------------------------------------------
# a. Multi-token-prediction heads


def _mtp_model():
    # The MTP block copies the norm class of the main model's last layer; a linear-attention last layer would hand
    # it the gated output norm (which needs a gate; refused, see below), so this tiny model ends with attention.
    types = ["linear_attention", "full_attention", "linear_attention", "full_attention"]
    return _model_with("bailing_hybrid", layer_types=types, mtp_layer_types=["full_attention"],
                          mtp_mlp_layer_types=["dense"])


def _model_with(model_type, **overrides):
    from hf_replayssm.tiny import tiny_model

    get_model(model_type)  # skips when this transformers version lacks the model type
    return tiny_model(model_type, **overrides)


def _random_mtp_heads(monkeypatch):
    """transformers loads MTP weights from the main model's checkpoint; a tiny random model has none, so build the
    MTP block with its own random init instead (the drafts' quality does not matter for exactness)."""
    from transformers.modeling_layers import MtpModel

    def from_pretrained(cls, main_model, device_map=None, **kwargs):
        torch.manual_seed(7)
        return cls(main_model, main_model.config.get_text_config().num_mtp_layers).eval()

    monkeypatch.setattr(MtpModel, "from_pretrained", classmethod(from_pretrained))


def test_mtp_heads_equal_greedy(monkeypatch):
    from transformers.generation.candidate_generator import MTPCandidateGenerator

    model = _mtp_model()
    _random_mtp_heads(monkeypatch)
    prompt = torch.randint(3, 120, (1, 8))
    greedy = model.generate(prompt, **GREEDY)
    _steer_drafts(monkeypatch, MTPCandidateGenerator, greedy.sequences)
    cache = ReplayCache(buffer_len=4)
    out = model.generate(prompt, past_key_values=cache, use_mtp=True, **GREEDY)
    _assert_greedy_exact(out, greedy, cache)


def test_mtp_sampling_emits_teacher_forced_logits(monkeypatch):
    from transformers.generation.candidate_generator import MTPCandidateGenerator

    model = _mtp_model()
    _random_mtp_heads(monkeypatch)
    prompt = torch.randint(3, 120, (1, 8))
    _steer_drafts(monkeypatch, MTPCandidateGenerator, model.generate(prompt, **GREEDY).sequences)
    torch.manual_seed(11)
    accepted, rejected = _sample_and_check(model, prompt, dict(use_mtp=True), SAMPLE)
    assert accepted > 0 and rejected > 0, (accepted, rejected)


def test_mtp_without_mtp_layers_is_refused():
    """A hybrid that ships no MTP layers (every supported one in 5.17; all but bailing_hybrid in 5.24)."""
    model = get_model("qwen3_5_text")
    cache = ReplayCache()  # created first: the first ReplayCache installs the generate() hook
    with pytest.raises(ValueError, match="num_mtp_layers"):
        model.generate(torch.randint(3, 120, (1, 6)), past_key_values=cache, use_mtp=True, **GREEDY)


def test_mtp_after_a_linear_attention_last_layer_is_refused(monkeypatch):
    """transformers would build the MTP block with the gated norm of a linear-attention last layer and fail on a
    missing gate; ReplayCache says why instead."""
    model = _model_with("bailing_hybrid", mtp_layer_types=["full_attention"], mtp_mlp_layer_types=["dense"])
    assert model.config.layer_types[-1] == "linear_attention"
    _random_mtp_heads(monkeypatch)
    cache = ReplayCache()
    with pytest.raises(ValueError, match="last decoder layer is a linear-attention layer"):
        model.generate(torch.randint(3, 120, (1, 6)), past_key_values=cache, use_mtp=True, **GREEDY)


# ---------------------------------------------------------------------------------------------------------------
# b. Universal assisted generation: an assistant with another tokenizer, itself a hybrid


@pytest.fixture
def bundled_pair():
    """The bundled Nemotron-H-style model as the main model, the bundled Qwen3.5-style model as a draft whose
    tokenizer has 8 extra tokens (another vocabulary, so transformers takes the different-tokenizer route). Built for
    each test (a few ms): transformers' assisted generation can leave state on the assistant (its generation config)."""
    from hf_replayssm.models import load_model

    main, main_tokenizer = load_model("tiny-mamba2", device="cpu")
    draft, draft_tokenizer = load_model("tiny-gdn", device="cpu")
    draft_tokenizer.add_tokens([f"<draft_extra_{i}>" for i in range(8)])
    with torch.random.fork_rng():  # the new embedding rows are drawn from the global RNG: fix them, whatever ran before
        torch.manual_seed(0)
        draft.resize_token_embeddings(len(draft_tokenizer), mean_resizing=False)
    prompt = main_tokenizer("ROMEO: What light through yonder window breaks? It is the east", return_tensors="pt")
    return main, draft, dict(tokenizer=main_tokenizer, assistant_tokenizer=draft_tokenizer), prompt.input_ids


def test_universal_assisted_generation_equals_greedy(bundled_pair):
    main, draft, tokenizers, prompt = bundled_pair
    kwargs = dict(GREEDY, max_new_tokens=30, min_new_tokens=30)
    greedy = main.generate(prompt, **kwargs)
    cache = ReplayCache(buffer_len=4)
    out = main.generate(prompt, past_key_values=cache, assistant_model=draft, **tokenizers, **kwargs)
    assert torch.equal(out.sequences, greedy.sequences)
    assert max_logit_diff(out.logits, greedy.logits) < 1e-4
    accepted, rejected = _draft_counts(cache, kwargs["max_new_tokens"])
    assert accepted > 0 and rejected > 0, (accepted, rejected)


# ---------------------------------------------------------------------------------------------------------------
# c. DFlash assistants (a block drafter fed with the main model's hidden states)


def _dflash_assistant(main):
    try:
        from transformers import MuseGlimmerAssistantConfig, MuseGlimmerAssistantModel
    except ImportError:
        pytest.skip(f"transformers {transformers.__version__} has no DFlash assistant model")
    text = main.config.get_text_config()
    config = MuseGlimmerAssistantConfig(
        hidden_size=text.hidden_size, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, block_size=4, mask_token_id=5, target_layer_ids=[0, 1],
        vocab_size=text.vocab_size, initializer_range=0.2,
    )
    torch.manual_seed(3)
    return MuseGlimmerAssistantModel(config).eval()


@pytest.mark.parametrize("model_type", ["qwen3_5_text", "nemotron_h"])
def test_dflash_assistant_equals_greedy(model_type, monkeypatch):
    from transformers.generation.candidate_generator import DFlashTokenCandidateGenerator

    model = get_model(model_type)
    assistant = _dflash_assistant(model)
    prompt = torch.randint(3, 120, (1, 8))
    greedy = model.generate(prompt, **GREEDY)
    if not STOCK_ROLLS_BACK_LINEAR:  # transformers < 5.25 refuses it with its own cache
        with pytest.raises(ValueError, match="stateful"):
            model.generate(prompt, assistant_model=assistant, speculation_type="dflash", **GREEDY)
    _steer_drafts(monkeypatch, DFlashTokenCandidateGenerator, greedy.sequences)
    cache = ReplayCache(buffer_len=4)
    out = model.generate(prompt, past_key_values=cache, assistant_model=assistant, speculation_type="dflash", **GREEDY)
    _assert_greedy_exact(out, greedy, cache)


# ---------------------------------------------------------------------------------------------------------------
# d. Speculative sampling: every emitted position carries the main model's teacher-forced logits


def _teacher_forced_logits(model, sequence, prompt_len):
    """Logits of the main model for every position after the prompt, with the final sequence forced through a stock
    cache: [B, new tokens, vocab]. Fed token by token after the prompt, as plain decoding computes them: one forward
    of the whole sequence would not do, since transformers' NemotronH chunked forward differs from its own decode
    step (dt_limit applied only when chunked) by up to 7e-3 on these tiny models."""
    return decode(model, sequence[:, :-1], prompt_len, DynamicCache(config=model.config))


def _lookup_prompt(model):
    """A prompt that contains the model's own greedy continuation, so prompt lookup proposes drafts worth taking."""
    start = torch.randint(3, 120, (1, 4))
    return torch.cat([model.generate(start, do_sample=False, max_new_tokens=12, min_new_tokens=12), start], dim=1)


def _sampling_run(mode, model_type, monkeypatch):
    """(main model, prompt, generate kwargs) of a draft-model speculative-sampling mode."""
    model = get_model(model_type)
    if mode == "assistant":
        return model, torch.randint(3, 120, (1, 8)), dict(assistant_model=get_model(model_type, seed=5))
    from transformers.generation.candidate_generator import DFlashTokenCandidateGenerator

    prompt = torch.randint(3, 120, (1, 8))
    _steer_drafts(monkeypatch, DFlashTokenCandidateGenerator, model.generate(prompt, **GREEDY).sequences)
    return model, prompt, dict(assistant_model=_dflash_assistant(model), speculation_type="dflash")


def _sample_and_check(model, prompt, extra, kwargs):
    """One speculative-sampling run, checked against teacher forcing; returns (drafts accepted, tokens rolled back)."""
    cache = ReplayCache(buffer_len=4)
    out = model.generate(prompt, past_key_values=cache, **extra, **kwargs)
    new = out.sequences.shape[1] - prompt.shape[1]
    reference = _teacher_forced_logits(model, out.sequences, prompt.shape[1])
    got = torch.stack(out.logits, dim=1)
    assert got.shape == reference.shape and torch.isfinite(got).all()
    torch.testing.assert_close(got, reference, atol=1e-4, rtol=0)
    # processed scores (temperature, top-k): the logits over the temperature wherever a token was kept
    scores = torch.stack(out.scores, dim=1) * extra.get("temperature", 1.0)
    kept = torch.isfinite(scores)
    assert kept.any(dim=-1).all()
    torch.testing.assert_close(scores[kept], reference[kept], atol=1e-4, rtol=0)
    return _draft_counts(cache, new)


def _one_of_the_runs_mixes(model, runs, kwargs):
    """Checks every (prompt, generate kwargs) run; stops at the first that both accepted and rejected drafts."""
    counts = []
    for prompt, extra in runs:
        counts.append(_sample_and_check(model, prompt, extra, kwargs))
        if counts[-1][0] > 0 and counts[-1][1] > 0:
            return
    raise AssertionError(f"no run both accepted and rejected drafts: {counts}")


@pytest.mark.parametrize("mode", ["prompt_lookup", "assistant", "dflash"])
@pytest.mark.parametrize("model_type", ["nemotron_h", "qwen3_5_text"])
def test_speculative_sampling_emits_teacher_forced_logits(mode, model_type, monkeypatch):
    torch.manual_seed(11)
    if mode == "prompt_lookup":  # every run must be exact; one of a few must both accept and reject drafts
        model = get_model(model_type)
        # prompt lookup drafts without logits, so a draft is kept only when sampling draws it: sample cold enough
        # that the model's own continuation (which the prompt holds) is drawn often, but not always
        runs = [(_lookup_prompt(model), dict(prompt_lookup_num_tokens=3, temperature=0.1)) for _ in range(6)]
    else:
        model, prompt, extra = _sampling_run(mode, model_type, monkeypatch)
        runs = [(prompt, extra)]
    _one_of_the_runs_mixes(model, runs, SAMPLE)


def test_universal_assisted_sampling_emits_teacher_forced_logits(bundled_pair):
    """Different tokenizers with do_sample=True: transformers' universal speculative decoding generator."""
    main, draft, tokenizers, prompt = bundled_pair
    torch.manual_seed(11)
    runs = [(prompt[:, :cut], dict(assistant_model=draft, **tokenizers)) for cut in (prompt.shape[1], 9, 6)]
    _one_of_the_runs_mixes(main, runs, SAMPLE)


# ---------------------------------------------------------------------------------------------------------------
# Early-exit self-speculation (the model drafts with its first k layers, through a draft ReplayCache of its own)


def _early_exit_supported(model) -> bool:
    """transformers 5.17 sizes the early-exit draft's cache by layer type (all layers); newer versions cut it to the
    first k layers, which cannot hold the deeper SSM layers."""
    config = model.config.get_text_config(decoder=True)
    trimmed = copy.deepcopy(config)
    trimmed.num_hidden_layers = 2  # what transformers does to the shared config while drafting
    return len(DynamicCache(config=trimmed).layers) == len(DynamicCache(config=config).layers)


# (GDN and KDA hybrids: the Mamba-2 hybrids' forwards ignore the cut config and draft with every layer, so they accept
# every draft)
@pytest.mark.parametrize("model_type", ["qwen3_5_text", "kimi_linear"])
def test_early_exit_self_speculation(model_type):
    model = get_model(model_type)
    prompt = torch.randint(3, 120, (1, 8))
    cache = ReplayCache(buffer_len=4)
    if not _early_exit_supported(model):
        with pytest.raises(ValueError, match=r"assistant_early_exit \(self-speculation\) is not supported") as info:
            model.generate(prompt, past_key_values=cache, assistant_early_exit=2, **GREEDY)
        assert "use_mtp" not in str(info.value)  # these models have no multi-token-prediction layers to offer
        return
    greedy = model.generate(prompt, **GREEDY)
    out = model.generate(prompt, past_key_values=cache, assistant_early_exit=2, **GREEDY)
    _assert_greedy_exact(out, greedy, cache)
