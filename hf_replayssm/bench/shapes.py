"""Random-weight models with the per-layer shapes of real hybrids (fewer layers), for benchmarks on a GPU.

Nothing is downloaded: configs only. Layer counts are cut to keep the models small; every per-layer shape is the
real one, so per-layer cache sizes and kernel costs are the real ones.
"""

from __future__ import annotations

import torch

# Prefill forward length that keeps transformers' torch prefill within an H200 at batch 256 (its Mamba-2 chunk scan
# materialises [B, chunks, chunk, chunk, H, N] products, padded to whole chunks: 160 GiB at batch 256 with 128-token
# chunks, so the Nemotron-H-like model also scans in 16-token chunks; chunking changes prefill rounding only).
PREFILL_PIECE = {"qwen3_5": 128, "nemotron_h": 16, "kimi_linear": 64}

SHAPES = {
    # Qwen3.5-4B-like: Gated DeltaNet with 32 value / 16 key heads of 128, attention 16 q / 4 kv heads of 256
    "qwen3_5": dict(
        model_type="qwen3_5_text", hidden_size=2560, intermediate_size=9216, vocab_size=32000,
        layer_types=["linear_attention"] * 3 + ["full_attention"] + ["linear_attention"] * 3 + ["full_attention"],
        num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=4, head_dim=256,
        linear_num_value_heads=32, linear_num_key_heads=16, linear_key_head_dim=128, linear_value_head_dim=128,
        linear_conv_kernel_dim=4,
    ),
    # Nemotron-H-like: Mamba-2 with 80 heads of 64, state 128, 8 groups ("M-M*M-M-")
    "nemotron_h": dict(
        model_type="nemotron_h", hidden_size=2560, intermediate_size=10240, vocab_size=32000,
        layers_block_type=["mamba", "mlp", "mamba", "attention", "mamba", "mlp", "mamba", "mlp"],
        num_attention_heads=20, num_key_value_heads=4, head_dim=128, mamba_num_heads=80, mamba_head_dim=64,
        ssm_state_size=128, n_groups=8, conv_kernel=4, chunk_size=16,
    ),
    # Kimi-Linear-like: Kimi Delta Attention with 32 heads of 128
    "kimi_linear": dict(
        model_type="kimi_linear", hidden_size=2304, intermediate_size=9216, moe_intermediate_size=1024,
        vocab_size=32000, num_hidden_layers=4, num_attention_heads=32, num_key_value_heads=32,
        kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128, linear_head_dim=128,
        linear_num_heads=32, num_local_experts=8, num_experts_per_tok=2, mlp_layer_types=["dense"] * 4,
        layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"],
        pad_token_id=0, bos_token_id=1, eos_token_id=2,  # the config's defaults lie outside a 32000-token vocabulary
    ),
}


def shaped_config(name: str, **overrides):
    from transformers import AutoConfig

    spec = {**SHAPES[name], **overrides}
    model_type = spec.pop("model_type")
    return AutoConfig.for_model(model_type, **spec)


def shaped_model(name: str, device="cuda", dtype=torch.bfloat16, seed: int = 0, **overrides):
    """A random-init causal LM with ``name``'s per-layer shapes, in ``dtype`` on ``device``, eval mode."""
    from transformers import AutoModelForCausalLM

    config = shaped_config(name, **overrides)
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.eval()
