"""Delta-rule family adapters: Gated DeltaNet (qwen3_next, qwen3_5, qwen3_5_moe, olmo_hybrid) and Kimi Delta
Attention (kimi_linear, bailing_hybrid, glm5_next).

Their mixers call ``*_recurrent_*`` for one token and ``*_chunk_*`` for several, with raw q/k, value, log-decay
``g`` (per head for GDN, per key channel for KDA) and ``beta``. Inside a replay call both become
``ReplayLayer.forward_tokens`` after the same normalisation the torch reference applies (the module's own
``l2norm``, then ``1/sqrt(d_k)`` on q).
"""

from __future__ import annotations

import torch

from ..recurrences import DeltaRuleRecurrence
from .base import CallArgs, FamilyAdapter, interceptor


def _key_heads(t: torch.Tensor, mixer) -> torch.Tensor:
    """One query/key per key head. transformers 5.17 repeats them to the value heads before calling the recurrence;
    the copies are identical, so every ``ratio``-th head is the original."""
    # read from the instance dict: a getattr default on a module without the attribute (Kimi-Linear's) goes through
    # nn.Module.__getattr__, which a compiled step guards on the module's parameter and buffer dicts
    key_heads = mixer.__dict__.get("num_k_heads", t.shape[2])
    if key_heads < t.shape[2]:
        return t[:, :, :: t.shape[2] // key_heads]
    return t


def _tokens(module, call, a: CallArgs) -> dict:
    """The recurrence's inputs as the mixer passed them; normalisation and head expansion happen on read."""
    value = a["value"]
    return {
        "q": _key_heads(a["query"], call.module),
        "k": _key_heads(a["key"], call.module),
        "v": value,
        "beta": a["beta"].float(),
        "g": a["g"].float(),
        "normalize": module.l2norm if a["use_qk_l2norm_in_kernel"] else None,
        "value_heads": value.shape[2],
    }


def _replay(module, call, a: CallArgs, original, chunked: bool):
    if a["cu_seqlens"] is not None:
        raise ValueError("ReplayCache does not support packed sequences (cu_seqlens); pad the batch instead")
    chunk_fn = None
    if chunked:  # the model's own chunked path, for tokens the cache absorbs (a prefill)

        def chunk_fn(start: int, stop: int, initial_state: torch.Tensor):
            return a.call(
                original,
                query=a["query"][:, start:stop],
                key=a["key"][:, start:stop],
                value=a["value"][:, start:stop],
                g=a["g"][:, start:stop],
                beta=a["beta"][:, start:stop],
                initial_state=initial_state,
                output_final_state=True,
            )

    tokens = _tokens(module, call, a)
    positions = call.positions
    if positions.takes(tokens):  # a plain step on device positions: no method or property looked up on the layer
        out, final = positions.step(tokens, a["query"].dtype), positions.operands[0]  # (a guard each, per layer)
    else:
        out = call.layer.forward_tokens(tokens, chunk_fn, out_dtype=a["query"].dtype)
        final = call.layer.checkpoint
    call.handled_tokens += a["value"].shape[1]
    return out, final if a["output_final_state"] else None


@interceptor
def _recurrent(module, call, a: CallArgs, original):
    return _replay(module, call, a, original, chunked=False)


@interceptor
def _chunk(module, call, a: CallArgs, original):
    return _replay(module, call, a, original, chunked=True)


GATED_DELTANET = FamilyAdapter(
    name="gated_deltanet",
    recurrence=DeltaRuleRecurrence,
    mixers={
        "Qwen3NextGatedDeltaNet": ("qwen3_next",),
        "Qwen3_5GatedDeltaNet": ("qwen3_5", "qwen3_5_text"),
        "Qwen3_5MoeGatedDeltaNet": ("qwen3_5_moe", "qwen3_5_moe_text"),
        "OlmoHybridGatedDeltaNet": ("olmo_hybrid",),
        "LaraMiniGatedDeltaNet": ("lara_mini",),
    },
    interceptors={"torch_recurrent_gated_delta_rule": _recurrent, "torch_chunk_gated_delta_rule": _chunk},
    fused_conv=True,
)

KIMI_DELTA = FamilyAdapter(
    name="kimi_delta_attention",
    recurrence=DeltaRuleRecurrence,
    mixers={
        "KimiLinearDeltaAttention": ("kimi_linear",),
        "BailingHybridDeltaAttention": ("bailing_hybrid",),
        "Glm5NextTextLinearAttention": ("glm5_next",),
    },
    interceptors={"recurrent_kimi_delta_attention": _recurrent, "chunk_kimi_delta_attention": _chunk},
    fused_conv=True,
)
