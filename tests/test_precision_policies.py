"""Precision policies: presets, memory, the exactness of the separated recurrence, KL ordering, exact rollback."""

import json
import subprocess
import sys

import pytest
import torch
from conftest import decode, get_model

from hf_replayssm import PRESETS, PrecisionPolicy, ReplayCache
from hf_replayssm.eval.precision_check import position_bins, precision_check
from hf_replayssm.tiny import slow_heads, tiny_model

FAMILIES = ["nemotron_h", "qwen3_5_text", "kimi_linear"]  # Mamba-2, GDN, KDA


def long_memory_model(model_type):
    """A tiny model whose SSM heads forget slowly: with the fast-decaying random init a checkpoint's rounding error
    is forgotten within a few steps, and shared and separated storage look alike."""
    return slow_heads(tiny_model(model_type))


def test_presets():
    assert list(PRESETS) == ["fp32", "bf16", "fp16-sr", "separated-fp8", "separated-nvfp4", "fp16-sr+nvfp4",
                             "shared-fp8", "shared-nvfp4"]
    assert PRESETS["separated-nvfp4"] == PrecisionPolicy("fp32", read_format="nvfp4")
    assert PRESETS["fp16-sr+nvfp4"].mode == "separated" and PRESETS["fp16-sr+nvfp4"].stochastic_rounding
    assert PRESETS["shared-nvfp4"].mode == "shared" and PRESETS["shared-nvfp4"].read_format is None
    assert {name: round(p.bytes_per_element(128), 4) for name, p in PRESETS.items()} == {
        "fp32": 4.0, "bf16": 2.0, "fp16-sr": 2.0, "separated-fp8": 5.0312, "separated-nvfp4": 4.5625,
        "fp16-sr+nvfp4": 2.5625, "shared-fp8": 1.0312, "shared-nvfp4": 0.5625}
    with pytest.raises(ValueError, match="unknown precision 'nvfp8'; use one of fp32, bf16, fp16-sr"):
        ReplayCache(precision="nvfp8")
    with pytest.raises(ValueError, match="stochastic rounding is available for bf16 and fp16"):
        PrecisionPolicy("fp8", stochastic_rounding=True)
    with pytest.raises(ValueError, match="unknown read_format"):
        PrecisionPolicy(read_format="int8")


@pytest.mark.parametrize("precision", list(PRESETS))
def test_memory_per_component(precision):
    model = get_model("nemotron_h")
    cache = ReplayCache(precision=precision)
    with torch.no_grad():
        model(torch.randint(3, 120, (2, 6)), past_key_values=cache, use_cache=True)
    elements = sum(layer.checkpoint.numel() for layer in cache.replay_layers.values())
    rows = sum(layer.checkpoint[..., 0].numel() for layer in cache.replay_layers.values())
    layers = len(cache.replay_layers)
    memory = cache.memory()
    per_format = {"fp32": 4 * elements, "bf16": 2 * elements, "fp16": 2 * elements, "fp8": elements + 4 * rows,
                  "nvfp4": elements // 2 + elements // 16 + (4 * 2 + 8) * layers}  # + sequence scales, 0-d row
    policy = PRESETS[precision]
    assert memory["checkpoint"] == per_format[policy.checkpoint_format]
    assert memory["read_copy"] == (per_format[policy.read_format] if policy.read_format else 0)
    assert memory["buffer"] > 0 and memory["conv"] > 0 and memory["attention_kv"] > 0


@pytest.mark.parametrize("model_type", FAMILIES)
def test_separated_mode_keeps_the_recurrence_exact(model_type):
    """After many flushes the float32 checkpoint under separated-nvfp4 equals the one under fp32: bit for bit for
    Mamba-2, to float32 rounding for GDN/KDA (corrected values recomputed at flush from raw inputs). Checked on the
    first SSM layer, whose inputs do not depend on earlier SSM outputs under teacher forcing."""
    model = long_memory_model(model_type)
    tokens = torch.randint(3, 120, (1, 70))
    checkpoints = {}
    for precision in ("fp32", "separated-nvfp4", "separated-fp8", "shared-nvfp4"):
        cache = ReplayCache(buffer_len=4, precision=precision)
        decode(model, tokens, 6, cache)
        first = cache.replay_layers[min(cache.replay_layers)]
        assert first.num_buffered == 0 and cache.stats()["flushes"] >= 16 * len(cache.replay_layers)
        checkpoints[precision] = first.checkpoint.clone()
    reference = checkpoints["fp32"]
    for precision in ("separated-nvfp4", "separated-fp8"):
        if model_type == "nemotron_h":
            assert torch.equal(checkpoints[precision], reference), precision
        else:
            torch.testing.assert_close(checkpoints[precision], reference, atol=1e-5, rtol=1e-5)
    # ... while a shared low-precision checkpoint drifts far from it
    assert (checkpoints["shared-nvfp4"] - reference).abs().max() > 100 * 1e-5


@pytest.mark.parametrize("model_type", FAMILIES)
def test_kl_ordering(model_type):
    model = long_memory_model(model_type)
    report = precision_check(model, tokens=240, progress=False, policies=[
        "fp32", "bf16", "separated-fp8", "shared-fp8", "separated-nvfp4", "shared-nvfp4"])
    kl = {p: report.mean_kl(p) for p in report.policies}
    assert kl["fp32"] < 1e-12  # the fp32 arm, a separate batch row, reproduces the reference
    assert report.top1_agreement["fp32"] == 1.0
    assert 0 < kl["separated-fp8"] < kl["shared-fp8"]
    assert 0 < kl["separated-nvfp4"] < kl["shared-nvfp4"]
    assert kl["bf16"] < kl["separated-fp8"] < kl["separated-nvfp4"]
    assert report.bins == position_bins(240) and report.bins[-1] == (128, 240)
    assert len(report.binned("shared-nvfp4")) == len(report.bins)
    assert "KL(fp32 || policy)" in report.table()


def test_per_row_policies_in_one_batch_match_separate_runs():
    model = get_model("qwen3_5_text")
    tokens = torch.randint(3, 120, (1, 30))
    policies = ["fp32", "shared-nvfp4", "fp16-sr"]
    together = decode(model, tokens.expand(3, -1), 8, ReplayCache(buffer_len=4, precision=policies))
    for row, precision in enumerate(policies):
        alone = decode(model, tokens, 8, ReplayCache(buffer_len=4, precision=precision))
        torch.testing.assert_close(together[row], alone[0], atol=1e-4, rtol=0)
    with pytest.raises(ValueError, match="3 per-row precision policies for a batch of 2"):
        model(tokens[:, :4].expand(2, -1), past_key_values=ReplayCache(precision=policies), use_cache=True)
    with pytest.raises(ValueError, match="3 per-row precision policies for a batch of 2"):  # even when they agree
        model(tokens[:, :4].expand(2, -1), past_key_values=ReplayCache(precision=["fp32"] * 3), use_cache=True)
    one = decode(model, tokens, 8, ReplayCache(buffer_len=4, precision=["shared-nvfp4"]))  # a list of one: one policy
    torch.testing.assert_close(one, decode(model, tokens, 8, ReplayCache(buffer_len=4, precision="shared-nvfp4")),
                               atol=0, rtol=0)


def _run_rounds(model, cache, prompt, rounds, reject_seed):
    """Speculative rounds: a window of drafts, then a crop of the rejected ones. Rejected drafts are random tokens
    drawn from ``reject_seed``; accepted ones are the same in every run."""
    accepted_gen = torch.Generator().manual_seed(0)
    reject_gen = torch.Generator().manual_seed(reject_seed)
    cache.activate_past_recording()
    cache.expect_prompt(prompt.shape[1])
    pending = prompt
    snapshots = []
    with torch.no_grad():
        for window, reject in rounds:
            keep = torch.randint(3, 120, (1, window - reject), generator=accepted_gen)
            drop = torch.randint(3, 120, (1, reject), generator=reject_gen)
            model(torch.cat([pending, keep, drop], dim=1), past_key_values=cache, use_cache=True)
            cache.crop(-reject)
            pending = keep[:, :0]
            snapshots.append(_cache_bytes(cache))
        last = model(torch.randint(3, 120, (1, 1), generator=accepted_gen), past_key_values=cache, use_cache=True)
    return snapshots, last.logits


def _cache_bytes(cache):
    state = []
    for layer in cache.replay_layers.values():
        for slot in layer.store.slots:
            state += [t.clone() for t in slot.checkpoint.values()]
            state += [t.clone() for t in (slot.read_copy or {}).values()]
        state += [t.clone() for t in layer.ring.read().values()]
        state.append(layer.conv.window(layer.schedule.conv_kernel).clone())
        ring = layer.ring
        positions = [ring.origin, ring.num_committed, ring.num_pending, layer.schedule.checkpoint_position]
        state.append(torch.tensor(positions))
    return state


# Models without mixture-of-experts blocks: grouped expert matmuls are not batch-invariant (a rejected token's routing
# changes the grouping, hence the last bits of accepted tokens), which would hide what this test checks.
@pytest.mark.parametrize("precision", list(PRESETS))
@pytest.mark.parametrize("model_type", ["nemotron_h", "falcon_h1", "qwen3_5_text", "kimi_linear"])
def test_rejected_drafts_leave_no_trace(model_type, precision):
    """Under every policy a crop restores the cache exactly: two runs that differ only in the content of the drafts
    they reject end in bit-identical caches (checkpoint, read copy, records, conv window, cursors) and give
    bit-identical logits afterwards."""
    model = get_model(model_type)
    prompt = torch.randint(3, 120, (1, 7))
    rounds = [(5, 2), (3, 0), (6, 5), (4, 1), (2, 1), (6, 3), (5, 4), (4, 2)]  # (window, rejected)
    a_states, a_logits = _run_rounds(model, ReplayCache(buffer_len=4, window=6, precision=precision), prompt, rounds, 1)
    b_states, b_logits = _run_rounds(model, ReplayCache(buffer_len=4, window=6, precision=precision), prompt, rounds, 2)
    for a, b in zip(a_states, b_states, strict=True):
        assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert torch.equal(a_logits, b_logits)


def test_precision_check_command():
    out = subprocess.run(
        [sys.executable, "-m", "hf_replayssm.cli", "precision-check", "--model", "tiny-gdn", "--tokens", "40",
         "--policies", "fp32,separated-nvfp4,shared-nvfp4", "--json", "--no-progress"],
        capture_output=True, text=True, check=True,
    )
    result = json.loads(out.stdout)
    assert result["policies"] == ["fp32", "separated-nvfp4", "shared-nvfp4"]
    assert result["mean_kl"]["fp32"] == 0.0 and result["positions"] == 40
