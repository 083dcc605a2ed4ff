"""Is verifying several tokens in one forward exact for a model? (``speculation_refusal``)

Speculative decoding verifies T draft tokens in one forward where plain decoding feeds them one at a time. That equals
plain decoding only if every layer's output is independent of how the tokens are grouped into forwards. A survey of the
supported model types (tiny random-init models, stock ``DynamicCache``, prefill 8 tokens, then single tokens versus
chunks of 3 and 4, 96 tokens, transformers 5.17 and 5.24; every window-, top-k- or capacity-like config option set
small enough for the context to exceed it) found:

* Chunk-independent up to float rounding (max |logit diff| 1e-5 .. 1e-4 in float32): the Mamba-2 family (falcon_h1,
  bamba, granitemoehybrid, mamba2, and nemotron_h, zamba2 apart from the dt clamp below), the gated-delta-rule family
  (qwen3_next, qwen3_5_text, qwen3_5_moe_text, olmo_hybrid), the KDA family (kimi_linear, bailing_hybrid, incl.
  ``kda_safe_gate``), all their attention layers, and every MoE router (plain and group-limited top-k; none of these
  has a capacity limit). nemotron_h's ``sliding_window`` is never read by its modeling code, so it changes nothing.
  (bamba's default position ids ignore the cache: forwards after the first need explicit ``position_ids``, which
  ``generate`` passes.)
* Chunk-dependent: glm5_next's DeepSeek-style sparse attention indexer. Each query attends only to the
  ``index_topk // index_kpool`` best-scoring complete key pools (plus its own incomplete pool). While the context holds
  at most ``index_topk`` tokens every complete pool is selected and the layer is plain causal attention; beyond that the
  selection is a real choice, and it depends on the forward's shape: scores that tie exactly (``relu`` zeroes whole
  pools) are broken by ``topk`` differently for different numbers of candidate pools, and near-ties flip with float
  rounding. With index_topk=16 the tiny model's chunked logits leave stepwise ones by ~0.3 some tokens past 16 (also
  in float64: identical scores, ties at 0 broken differently for 9 and 10 candidate pools); with index_topk above
  the context they agree to ~1e-5, MoE layers included.
* Not a chunking dependence (reported, not refused): Mamba-2 layers clamp dt to ``time_step_limit`` (nemotron_h and
  zamba2: to ``time_step_min``) in the multi-token chunk scan but not in the single-token update, so stock
  multi-token forwards differ from single-token decoding wherever ``softplus(dt + dt_bias)`` falls outside the limits.
  This is the same prefill-versus-decode difference plain decoding already has.

This module imports nothing from transformers; it only reads the (text) config.
"""

from __future__ import annotations

__all__ = ["chunking_limit", "speculation_refusal"]


def _text_config(model_or_config):
    config = getattr(model_or_config, "config", model_or_config)
    get_text_config = getattr(config, "get_text_config", None)
    return config, (get_text_config(decoder=True) if get_text_config is not None else config)


def _model_type(config, text_config) -> str:
    return getattr(config, "model_type", None) or getattr(text_config, "model_type", None) or type(config).__name__


def _indexer_limit(text_config) -> tuple[str, int] | None:
    """A DeepSeek-style sparse attention indexer (glm5_next; any config with ``index_topk``): exact while the context
    has at most ``index_topk`` tokens."""
    index_topk = getattr(text_config, "index_topk", None)
    if index_topk is None:
        return None
    layer_types = getattr(text_config, "layer_types", None)
    # Every glm5_next layer is either linear attention or indexed softmax attention (named "indexed_attention" in
    # transformers 5.24, "deepseek_sparse_attention" in 5.17): without softmax attention the indexer never runs.
    if layer_types is not None and all(layer_type == "linear_attention" for layer_type in layer_types):
        return None
    return "index_topk", int(index_topk)


# Checks that bound the context up to which multi-token forwards equal single-token ones. Each returns
# (config parameter, limit in tokens) or None. Only the indexer was found to depend on chunking (see module docstring).
_LIMITS = (_indexer_limit,)

_WHAT = {"index_topk": "sparse attention indexer"}
_HOW = {
    "index_topk": "selects keys differently when several tokens are verified in one forward once the context "
    "exceeds {limit} tokens",
}


def chunking_limit(model) -> tuple[str, int] | None:
    """(config parameter, context length in tokens) up to which a forward over several new tokens gives the same
    logits as feeding them one at a time; None when no limit is known for this model (chunk-independent)."""
    _, text_config = _text_config(model)
    limits = [limit for check in _LIMITS if (limit := check(text_config)) is not None]
    return min(limits, key=lambda item: item[1]) if limits else None


def speculation_refusal(model, max_length: int | None) -> str | None:
    """Why speculative decoding (several draft tokens verified per forward) would not equal plain decoding for
    ``model`` with contexts of up to ``max_length`` tokens (prompt + new tokens; None: unknown, unbounded), or None
    when it would.

    ``model`` may be a model or its config; composite (image-text) configs are read through their text config.
    """
    config, text_config = _text_config(model)
    limit = chunking_limit(text_config)
    if limit is None:
        return None
    parameter, length = limit
    if max_length is not None and max_length <= length:
        return None
    model_type = _model_type(config, text_config)
    asked = "no max_length was given" if max_length is None else f"max_length={max_length}"
    return (
        f"{model_type}'s {_WHAT[parameter]} ({parameter}={length}) {_HOW[parameter].format(limit=length)}, so "
        f"speculative decoding would not equal plain decoding ({asked}); use plain decoding, or keep "
        f"prompt + max_new_tokens <= {length}"
    )
