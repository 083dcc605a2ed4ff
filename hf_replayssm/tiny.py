"""Tiny random-init hybrid models built from configs (tests, demo, examples; nothing is downloaded).

``initializer_range=0.2`` by default: with transformers' 0.02 the SSM branch contributes so little that a broken
rollback still produces the right tokens.
"""

from __future__ import annotations

import math

import torch

COMMON = dict(
    vocab_size=128, hidden_size=64, num_hidden_layers=4, pad_token_id=0, bos_token_id=1, eos_token_id=2,
    initializer_range=0.2,
)
_ATTN = dict(num_attention_heads=4, num_key_value_heads=2, intermediate_size=128)
_LA3_FA = ["linear_attention", "linear_attention", "full_attention", "linear_attention"]
_CONV2_FA_CONV = ["conv", "conv", "full_attention", "conv"]
# rms_norm_eps=1e-3: random-init GDN heads emit outputs with norms down to ~1e-4, which the gated RMSNorm (eps
# 1e-6) scales up a thousandfold, so fp32 rounding alone moves stock decoding's own logits by ~1e-4.
_GDN = dict(head_dim=16, linear_key_head_dim=16, linear_value_head_dim=16, linear_num_key_heads=2,
            linear_num_value_heads=4, linear_conv_kernel_dim=4, rms_norm_eps=1e-3)
_MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32)
_KDA = dict(num_attention_heads=4, num_key_value_heads=4, intermediate_size=128, moe_intermediate_size=32,
            kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16, num_local_experts=4,
            num_experts_per_tok=2, linear_head_dim=16, linear_num_heads=4, mlp_layer_types=["dense"] * 4,
            layer_types=_LA3_FA)
_MAMBA2_HEADS = dict(mamba_n_heads=8, mamba_d_head=16, mamba_n_groups=2, mamba_d_state=16, mamba_chunk_size=8)

TINY_CONFIGS: dict[str, dict] = {
    "nemotron_h": dict(layers_block_type=["mamba", "attention", "mamba", "mlp"], num_attention_heads=4,
                       num_key_value_heads=2, head_dim=16, intermediate_size=128, ssm_state_size=16,
                       mamba_num_heads=8, mamba_head_dim=16, n_groups=2, chunk_size=8),
    "falcon_h1": dict(**_ATTN, **_MAMBA2_HEADS, mamba_d_ssm=128, head_dim=16),
    "bamba": dict(**_ATTN, **_MAMBA2_HEADS, attn_layer_indices=[1]),
    "granitemoehybrid": dict(**_ATTN, **_MAMBA2_HEADS, layer_types=["mamba", "attention", "mamba", "mamba"],
                             num_local_experts=4, num_experts_per_tok=2, shared_intermediate_size=64),
    "zamba2": dict(num_attention_heads=4, intermediate_size=128, n_mamba_heads=8, mamba_d_state=16, mamba_ngroups=2,
                   chunk_size=8, layers_block_type=["mamba", "hybrid", "mamba", "mamba"]),
    "mamba2": dict(num_heads=8, head_dim=16, state_size=16, n_groups=2, chunk_size=8, conv_kernel=4, expand=2),
    "qwen3_next": dict(**_ATTN, **_GDN, **_MOE, layer_types=_LA3_FA),
    "qwen3_5_text": dict(**_ATTN, **_GDN, layer_types=_LA3_FA),
    "qwen3_5_moe_text": dict(**_ATTN, **_GDN, **_MOE, layer_types=_LA3_FA),
    "olmo_hybrid": dict(**_ATTN, **_GDN, layer_types=_LA3_FA),
    "lara_mini": dict(**_ATTN, **_GDN, **_MOE, layer_types=_LA3_FA),
    "kimi_linear": dict(_KDA),
    "bailing_hybrid": dict(_KDA),
    # GLM-5-Next exists only as an image-text model; the tiny vision tower is never run by text-only prompts.
    "glm5_next": dict(
        text_config=dict(**COMMON, **{**_KDA, "qk_rope_head_dim": 0, "qk_nope_head_dim": 16}, q_lora_rank=32,
                         n_routed_experts=4, index_topk=16, index_kpool=4, index_head_dim=16, index_n_heads=2,
                         head_dim=16, hc_mult=1),
        vision_config=dict(depth=1, hidden_size=32, num_heads=2, intermediate_size=64, out_hidden_size=64,
                           projection_intermediate_size=64, image_size=28, patch_size=14),
        image_token_id=120, video_token_id=121, image_start_token_id=122, image_end_token_id=123,
        video_start_token_id=124, video_end_token_id=125,
    ),
    # short-conv hybrids: conv_L_cache (3 taps) as in the released models
    "lfm2": dict(**_ATTN, layer_types=_CONV2_FA_CONV, block_auto_adjust_ff_dim=False),
    "lfm3": dict(**_ATTN, layer_types=_CONV2_FA_CONV, conv_L_cache=4),
    "lfm2_moe": dict(**_ATTN, layer_types=_CONV2_FA_CONV, num_dense_layers=1, num_experts=4, num_experts_per_tok=2,
                     moe_intermediate_size=32),
    # refused or stock, for tests of the error paths
    "mamba": dict(state_size=8, expand=2, conv_kernel=4),
    "jamba": dict(**_ATTN, num_experts=4, attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2,
                  expert_layer_offset=1, mamba_d_state=8),
    "llama": dict(**_ATTN),
}


def tiny_config(model_type: str, **overrides):
    from transformers import AutoConfig

    base = TINY_CONFIGS[model_type]
    if "text_config" in base:  # composite (image-text) model: the text part carries COMMON
        text_config = {**base["text_config"], **overrides}
        return AutoConfig.for_model(model_type, **{**base, "text_config": text_config})
    return AutoConfig.for_model(model_type, **{**COMMON, **base, **overrides})


PER_LAYER_KEYS = ("layer_types", "layers_block_type", "mlp_layer_types")


def repeat_layers(spec: dict, layers: int) -> dict:
    """Overrides that give the config ``spec`` ``layers`` layers: the first ones of its layer pattern, the pattern
    repeated when asked for more (every per-layer list alike)."""
    cut = {key: [spec[key][i % len(spec[key])] for i in range(layers)] for key in PER_LAYER_KEYS if key in spec}
    if "num_hidden_layers" in spec:
        cut["num_hidden_layers"] = layers
    return cut


def deeper(model_type: str, layers: int) -> dict:
    """Overrides that give ``model_type``'s tiny model ``layers`` layers: its layer pattern repeated (how the cost
    of a decode step's host work grows with depth)."""
    base = TINY_CONFIGS[model_type]
    if "text_config" in base:
        raise ValueError(f"{model_type}: a composite model; deepen its text_config instead")
    return repeat_layers({**COMMON, **base}, layers)


def slow_heads(model, decay_rate: float = 1e-3):
    """Give every SSM head a slow decay (A_log = log ``decay_rate``), like the long-memory heads of real models: with
    the fast-decaying random init a state's rounding error is forgotten within a few tokens."""
    for module in model.modules():
        if isinstance(getattr(module, "A_log", None), torch.nn.Parameter):
            with torch.no_grad():
                module.A_log.fill_(math.log(decay_rate))
    return model


def tiny_model(model_type: str, seed: int = 0, dtype: torch.dtype = torch.float32, **overrides):
    """A fixed-seed random-init causal LM of ``model_type`` in eval mode."""
    from transformers import AutoModelForCausalLM

    config = tiny_config(model_type, **overrides)
    torch.manual_seed(seed)
    if hasattr(config, "text_config") and config.text_config is not config:
        from transformers import AutoModelForImageTextToText

        model = AutoModelForImageTextToText.from_config(config, dtype=dtype)
    else:
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.eval()
