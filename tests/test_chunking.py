"""``speculation_refusal`` against stock transformers: feeding tokens in chunks (as speculative verification does)
versus one at a time, through a plain ``DynamicCache`` (no ReplayCache). float64 weights and activations; parts of the
models still compute in float32, which leaves <= ~2e-5 of rounding where nothing depends on chunking."""

import functools
import inspect
import math
import warnings

import pytest
import torch
import transformers

from hf_replayssm.chunking import chunking_limit, speculation_refusal
from hf_replayssm.tiny import tiny_config, tiny_model

pytestmark = pytest.mark.equivalence

transformers.logging.set_verbosity_error()
warnings.filterwarnings("ignore", message=".*fall.*back.*")

SUPPORTED = [
    "nemotron_h", "falcon_h1", "bamba", "granitemoehybrid", "zamba2", "mamba2",
    "qwen3_next", "qwen3_5_text", "qwen3_5_moe_text", "olmo_hybrid", "lara_mini",
    "kimi_linear", "bailing_hybrid", "glm5_next", "lfm2", "lfm2_moe", "lfm3",
]
PREFILL, CHUNK, LENGTH = 8, 4, 64


def _absent(error: Exception) -> bool:
    return "Unrecognized" in str(error) or "does not recognize" in str(error)


@functools.cache
def _model(model_type: str):
    try:
        model = tiny_model(model_type, dtype=torch.float64)
    except (ValueError, KeyError) as error:
        if _absent(error):
            return None
        raise
    # torch's grouped_mm (transformers' default MoE experts kernel) has no float64
    if model._can_set_experts_implementation():
        model.set_experts_implementation("eager")
    # Mamba-2 layers clamp dt to time_step_limit (nemotron_h, zamba2: time_step_min) in the multi-token chunk scan but
    # not in the single-token update: a known prefill-versus-decode difference, not one that speculation_refusal
    # refuses (test_mamba2_dt_clamp below). Lifted here so that it does not hide a dependence on chunking.
    for module in model.modules():
        if hasattr(module, "dt_bias") and hasattr(module, "time_step_limit"):
            module.time_step_limit = (0.0, math.inf)
    return model


def get_model(model_type: str):
    model = _model(model_type)
    if model is None:
        pytest.skip(f"transformers {transformers.__version__} has no {model_type}")
    return model


@torch.no_grad()
def chunked_logits(model, tokens, chunk: int, prefill: int = PREFILL):
    """Prefill ``prefill`` tokens, then feed the rest ``chunk`` at a time through a stock DynamicCache. Returns the
    logits of positions prefill - 1 .. len - 1, [len - prefill + 1, vocab]."""
    params = inspect.signature(model.forward).parameters
    cache_name = next(name for name in ("cache", "past_key_values", "cache_params") if name in params)
    cache = transformers.DynamicCache(config=model.config)
    # bamba derives default position ids from the input alone, ignoring the cache; generate() passes them explicitly.
    # Composite (image-text) models build their own multi-axis positions.
    with_positions = "position_ids" in params and model.config.get_text_config(decoder=True) is model.config

    def forward(start, stop):
        kwargs = {cache_name: cache, "use_cache": True}
        if with_positions:
            kwargs["position_ids"] = torch.arange(start, stop)[None]
        return model(input_ids=tokens[:, start:stop], **kwargs).logits[0]

    logits = [forward(0, prefill)[-1:]]
    logits += [forward(start, min(start + chunk, tokens.shape[1])) for start in range(prefill, tokens.shape[1], chunk)]
    return torch.cat(logits)


def diffs_by_context(model, length: int, chunk: int = CHUNK):
    """Max |logit diff| between chunked and stepwise feeding, keyed by the context length (tokens seen)."""
    tokens = torch.randint(3, 120, (1, length), generator=torch.Generator().manual_seed(1234))
    diff = (chunked_logits(model, tokens, chunk) - chunked_logits(model, tokens, 1)).abs().amax(-1)
    return {PREFILL + i: value for i, value in enumerate(diff.tolist())}


@pytest.mark.parametrize("model_type", SUPPORTED)
def test_refusal_matches_stock_chunking(model_type):
    model = get_model(model_type)
    limit = chunking_limit(model)
    if speculation_refusal(model, LENGTH) is None:
        assert max(diffs_by_context(model, LENGTH).values()) < 1e-4
        return
    # Refused: exact up to the limit, and really different beyond it.
    _, length = limit
    assert speculation_refusal(model, length) is None
    diffs = diffs_by_context(model, LENGTH)
    assert max(value for context, value in diffs.items() if context <= length) < 1e-4
    assert max(value for context, value in diffs.items() if context > length) > 1e-3


@pytest.mark.parametrize("model_type", SUPPORTED)
def test_only_glm5_next_is_refused(model_type):
    try:
        config = tiny_config(model_type)
    except (ValueError, KeyError) as error:
        if _absent(error):
            pytest.skip(f"transformers {transformers.__version__} has no {model_type}")
        raise
    refused = speculation_refusal(config, None)
    assert (refused is not None) == (model_type == "glm5_next"), refused


def test_glm5_next_refusal_names_index_topk():
    try:
        config = tiny_config("glm5_next")
    except (ValueError, KeyError) as error:
        if _absent(error):
            pytest.skip(f"transformers {transformers.__version__} has no glm5_next")
        raise
    topk = config.get_text_config(decoder=True).index_topk
    assert chunking_limit(config) == ("index_topk", topk)
    for max_length in (topk + 1, 4 * topk, None):
        reason = speculation_refusal(config, max_length)
        assert reason is not None
        assert "glm5_next" in reason and f"index_topk={topk}" in reason and f"<= {topk}" in reason
    assert speculation_refusal(config, topk) is None
    assert speculation_refusal(config, 1) is None
    # without indexed layers the indexer never runs
    linear_only = tiny_config("glm5_next", layer_types=["linear_attention"] * 4)
    assert speculation_refusal(linear_only, None) is None


@pytest.mark.parametrize("model_type", ["nemotron_h", "zamba2"])
def test_mamba2_dt_clamp(model_type):
    """Mamba-2 mixers whose dt limit binds (zamba2: time_step_min; nemotron_h before transformers 5.25) clamp dt in
    multi-token forwards only: that, and nothing else, separates their chunked forwards from single-token ones
    (lifted in _model). speculation_refusal does not refuse it."""
    try:
        model = tiny_model(model_type, dtype=torch.float64)
    except (ValueError, KeyError) as error:
        if _absent(error):
            pytest.skip(f"transformers {transformers.__version__} has no {model_type}")
        raise
    assert speculation_refusal(model, None) is None
    lower = {m.time_step_limit[0] for m in model.modules() if hasattr(m, "dt_bias") and hasattr(m, "time_step_limit")}
    diff = max(diffs_by_context(model, 24).values())
    if lower == {0.0}:  # nothing to clamp (softplus is positive): chunked and single-token forwards agree
        assert diff < 1e-4
    else:
        assert diff > 1e-3
    assert max(diffs_by_context(get_model(model_type), 24).values()) < 1e-4
