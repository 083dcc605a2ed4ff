"""Backend selection, and the fused Triton decode steps (Mamba-2, GDN, KDA) inside ReplayCache, run on CPU under
TRITON_INTERPRET=1 in a subprocess (the interpreter must be on before triton is imported, and a bad load can crash
the process)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import get_model

from hf_replayssm import ReplayCache

ROOT = Path(__file__).resolve().parents[1]


def test_backend_resolution_on_cpu():
    model = get_model("nemotron_h")
    assert ReplayCache.for_model(model).resolved_backend == "torch"  # auto: Triton only on CUDA
    assert ReplayCache.for_model(model, backend="torch").resolved_backend == "torch"
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.importorskip("triton")
        with pytest.raises(ValueError, match="runs on CUDA devices"):
            ReplayCache.for_model(model, backend="triton")


def test_interpreter_refuses_triton_36_with_numpy_24(monkeypatch):
    """Triton's interpreter up to 3.6 fails on NumPy 2.4 deep inside every kernel that loops over an integer
    argument: backend='triton' under TRITON_INTERPRET=1 on the CPU refuses that pair with what to install, and
    accepts Triton 3.7+ or NumPy below 2.4; CUDA devices (compiled kernels) are not concerned."""
    import numpy
    import torch

    triton = pytest.importorskip("triton")
    from hf_replayssm.cache import resolve_backend

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    for triton_version, numpy_version, refused in (("3.6.0", "2.4.6", True), ("3.5.1", "2.5.0", True),
                                                   ("3.7.0", "2.4.6", False), ("3.6.0", "2.3.5", False),
                                                   ("3.9.0", "2.4.0", False)):
        monkeypatch.setattr(triton, "__version__", triton_version)
        monkeypatch.setattr(numpy, "__version__", numpy_version)
        if refused:
            with pytest.raises(ValueError, match=r"pip install 'triton>=3.7' or 'numpy<2.4'"):
                resolve_backend("triton", torch.device("cpu"))
        else:
            assert resolve_backend("triton", torch.device("cpu")) == "triton"
        assert resolve_backend("triton", torch.device("cuda", 0)) == "triton"


def test_auto_resolves_to_triton_on_cuda_devices():
    """auto = the kernels on CUDA when triton imports (resolution only: no device is touched), the reference on CPU,
    and a clear error for an unknown name."""
    import torch

    from hf_replayssm.cache import _triton_available, resolve_backend

    expected = "triton" if _triton_available() else "torch"
    assert resolve_backend("auto", torch.device("cuda", 0)) == expected
    assert resolve_backend("auto", torch.device("cpu")) == "torch"
    assert resolve_backend("auto", None) == "torch"
    with pytest.raises(ValueError, match="backend must be one of"):
        resolve_backend("cuda", torch.device("cpu"))


# The fused-kernel checks, one subprocess per part so that pytest-xdist spreads them over its workers (as one script
# they were the suite's longest test). Each part builds its own models: tiny_model seeds the RNG, so a part's inputs
# do not depend on the parts before it. The interpreter's time goes per kernel launch, so decoding runs only as long
# as it takes to cross flushes (buffer length 4; asserted) and, speculating, to roll drafts back and fold records.
PRELUDE = """
import sys, torch
sys.path.insert(0, "tests")
from conftest import GREEDY_KW, decode, max_logit_diff
from kernel_harness import RecordedKernel
from transformers import DynamicCache
from hf_replayssm import ReplayCache
from hf_replayssm.tiny import tiny_model


def greedy_kw(new_tokens):
    return dict(GREEDY_KW, max_new_tokens=new_tokens, min_new_tokens=new_tokens)


def kernel_windows(cache):
    return sum(layer.schedule.kernel_windows for layer in cache.replay_layers.values())


def kernel_folds(cache):
    return sum(layer.schedule.kernel_folds for layer in cache.replay_layers.values())


def separated_against_torch(model_type, policy):
    # decoding with a separated policy through the Triton kernels against the torch backend with the same policy (see
    # the part "separated" for the tolerance); returns the kernels' cache
    other = tiny_model(model_type)
    sample = torch.randint(3, 120, (2, 12))
    fused = ReplayCache(4, precision=policy, backend="triton")
    reference = ReplayCache(4, precision=policy, backend="torch")
    got, want = decode(other, sample, 6, fused), decode(other, sample, 6, reference)
    assert max_logit_diff(got, want) < 2e-3, (model_type, policy, max_logit_diff(got, want))
    assert fused.stats() == reference.stats(), (model_type, fused.stats(), reference.stats())
    assert fused.stats()["flushes"] > 0
    for idx, layer in fused.replay_layers.items():
        torch.testing.assert_close(layer.current_state(), reference.replay_layers[idx].current_state(),
                                   atol=1e-4, rtol=1e-4)
    return fused


model = tiny_model("nemotron_h")
tokens = torch.randint(3, 120, (3, 16))
"""

FUSED_PARTS = {
    "mamba2_step": """
stock = decode(model, tokens, 6, DynamicCache(config=model.config))
for buffer_len, length in ((1, 10), (4, 16)):  # every step a flush; two flushes
    fused, reference = ReplayCache(buffer_len, backend="triton"), ReplayCache(buffer_len, backend="torch")
    got = decode(model, tokens[:, :length], 6, fused)
    decode(model, tokens[:, :length], 6, reference)
    assert fused.resolved_backend == "triton"
    assert max_logit_diff(got, stock[:, : length - 5]) < 1e-4, buffer_len
    assert fused.stats() == reference.stats(), (fused.stats(), reference.stats())
    assert fused.stats()["flushes"] >= 2, fused.stats()
    for idx, layer in fused.replay_layers.items():  # the kernel's in-place flushes give the reference's state
        torch.testing.assert_close(layer.current_state(), reference.replay_layers[idx].current_state(),
                                   atol=1e-5, rtol=1e-5)

# batch_select_indices between fused steps (device positions re-derived for the new batch), a flush after it
cache = ReplayCache(4, backend="triton")
decode(model, tokens[:, :8], 6, cache)
cache.batch_select_indices(torch.tensor([2, 0]))
flushes = cache.stats()["flushes"]
with torch.no_grad():
    got = [model(tokens[[2, 0], p : p + 1], past_key_values=cache, use_cache=True).logits[:, -1]
           for p in range(8, 16)]
assert max_logit_diff(torch.stack(got, 1), stock[[2, 0], 3:]) < 1e-4
assert cache.stats()["flushes"] > flushes
""",
    # the delta-rule families (GVA Gated DeltaNet, per-channel-gate KDA)
    "delta_step": """
for model_type in ("qwen3_5_text", "kimi_linear"):
    other = tiny_model(model_type)
    sample = torch.randint(3, 120, (2, 12))
    fused, reference = ReplayCache(4, backend="triton"), ReplayCache(4, backend="torch")
    got = decode(other, sample, 6, fused)
    assert max_logit_diff(got, decode(other, sample, 6, DynamicCache(config=other.config))) < 1e-4, model_type
    decode(other, sample, 6, reference)
    assert fused.stats() == reference.stats()
    assert fused.stats()["flushes"] > 0
""",
    # speculation (verify windows through the Triton verify kernels, pieces past a flush boundary too, from a
    # checkpoint the fold kernel stages) then plain decoding through the step kernel, with one cache
    "mamba2_speculation": """
prompt = torch.cat([tokens[:1, :5]] * 3, dim=1)
stock_cache = DynamicCache(config=model.config)
greedy = model.generate(prompt, past_key_values=stock_cache, **greedy_kw(10))
cache = ReplayCache(4, backend="triton")
out = model.generate(prompt, past_key_values=cache, prompt_lookup_num_tokens=3, **greedy_kw(10))
assert torch.equal(out.sequences, greedy.sequences) and max_logit_diff(out.logits, greedy.logits) < 1e-4
assert kernel_windows(cache) > 0 and kernel_folds(cache) > 0 and cache.stats()["rolled_back_tokens"] > 0
flushes = cache.stats()["flushes"]
more = model.generate(out.sequences, past_key_values=cache, **greedy_kw(5))
again = model.generate(greedy.sequences, past_key_values=stock_cache, **greedy_kw(5))
assert torch.equal(more.sequences, again.sequences) and max_logit_diff(more.logits, again.logits) < 1e-4
assert cache.stats()["flushes"] > flushes

# Mamba-2 windows of PRODUCTS_FROM_WINDOW tokens or more take the verify kernel's tensor-core product form
# (tf32x3 on a GPU; the interpreter computes it in float32): widths seen through the kernel's form choice
from hf_replayssm.kernels import mamba2_verify as m2v
widths, form = [], m2v.default_form
m2v.default_form = lambda window: widths.append(window) or form(window)
other = tiny_model("nemotron_h", initializer_range=0.2)
prompt = torch.cat([torch.randint(3, 120, (1, 7))] * 4, dim=1)
greedy = other.generate(prompt, past_key_values=DynamicCache(config=other.config), **greedy_kw(12))
cache = ReplayCache(backend="triton")
out = other.generate(prompt, past_key_values=cache, prompt_lookup_num_tokens=6, **greedy_kw(12))
m2v.default_form = form
assert torch.equal(out.sequences, greedy.sequences) and max_logit_diff(out.logits, greedy.logits) < 1e-4
assert max(widths) >= m2v.PRODUCTS_FROM_WINDOW and min(widths) < m2v.PRODUCTS_FROM_WINDOW, widths
assert cache.stats()["rolled_back_tokens"] > 0
""",
    "delta_speculation": """
for model_type in ("qwen3_5_text", "kimi_linear"):  # GVA Gated DeltaNet and KDA verify kernels
    other = tiny_model(model_type, initializer_range=0.2)
    prompt = torch.cat([torch.randint(3, 120, (1, 5))] * 3, dim=1)
    greedy = other.generate(prompt, past_key_values=DynamicCache(config=other.config), **greedy_kw(10))
    cache = ReplayCache(4, backend="triton")
    out = other.generate(prompt, past_key_values=cache, prompt_lookup_num_tokens=3, **greedy_kw(10))
    assert torch.equal(out.sequences, greedy.sequences), model_type
    assert max_logit_diff(out.logits, greedy.logits) < 1e-4, model_type
    assert kernel_windows(cache) > 0 and kernel_folds(cache) > 0, model_type
    assert cache.stats()["rolled_back_tokens"] > 0, model_type
""",
    # the delta rule's options switched on as defaults (delta_rule.NEWEST_FIRST_DEFAULT, off: slower on the H200;
    # FLUSH_WEIGHTS_DEFAULT, on for KDA only): KDA's weights pre-launches (replay and verify) read the records newest
    # first, the separated flushes of both families take their outputs' record weights from the weights pre-launch;
    # through ReplayCache as the parts above, each launch recorded
    "untimed_defaults": """
from hf_replayssm.kernels import delta_rule
delta_rule.NEWEST_FIRST_DEFAULT = True
delta_rule.FLUSH_WEIGHTS_DEFAULT = {False: True, True: True}
weights_launches = delta_rule._kda_weights_kernel = RecordedKernel(delta_rule._kda_weights_kernel)
step_launches = delta_rule._delta_replay_step_kernel = RecordedKernel(delta_rule._delta_replay_step_kernel)
for model_type, policy in (("qwen3_5_text", "separated-nvfp4"), ("kimi_linear", "separated-fp8")):
    separated_against_torch(model_type, policy)
flushes = [kw for kw in step_launches.launches if kw["PHASE"] in (2, 3)]
assert flushes and all(kw["WEIGHTS_GIVEN"] and kw["EXACT_FOLD"] for kw in flushes), flushes
weights = weights_launches.launches
assert any(kw["GATE_PER_KEY"] for kw in weights)
assert all(kw["NEWEST_FIRST"] == kw["GATE_PER_KEY"] for kw in weights), weights

# KDA's speculation through the verify kernels with their pre-launch newest first: plain greedy's tokens
from hf_replayssm.kernels import delta_verify
verify_launches = delta_verify._verify_record_weights_kernel = RecordedKernel(
    delta_verify._verify_record_weights_kernel)
other = tiny_model("kimi_linear", initializer_range=0.2)
prompt = torch.cat([torch.randint(3, 120, (1, 5))] * 3, dim=1)
greedy = other.generate(prompt, past_key_values=DynamicCache(config=other.config), **greedy_kw(10))
cache = ReplayCache(4, backend="triton")
out = other.generate(prompt, past_key_values=cache, prompt_lookup_num_tokens=3, **greedy_kw(10))
assert torch.equal(out.sequences, greedy.sequences) and max_logit_diff(out.logits, greedy.logits) < 1e-4
assert kernel_windows(cache) > 0 and cache.stats()["rolled_back_tokens"] > 0
verify_weights = verify_launches.launches
assert verify_weights and all(kw["NEWEST_FIRST"] for kw in verify_weights), verify_weights
""",
    # batched speculation (rows accept different numbers of drafts; per-row rollback of kernel-written records,
    # neutral records folded by the fold kernel): GDN and Mamba-2
    "batched_speculation": """
for model_type in ("qwen3_5_text", "nemotron_h"):
    other = tiny_model(model_type, initializer_range=0.2)
    prompt = torch.cat([torch.randint(3, 120, (3, 4))] * 3, dim=1)
    plain = other.generate(prompt, do_sample=False, max_new_tokens=8)
    cache = ReplayCache(4, backend="triton")
    routed = other.generate(prompt, do_sample=False, max_new_tokens=8, prompt_lookup_num_tokens=3,
                            past_key_values=cache)
    assert torch.equal(routed[:, : plain.shape[1]], plain), model_type
    assert kernel_windows(cache) > 0 and kernel_folds(cache) > 0, model_type
    assert cache.stats()["rolled_back_tokens"] > 0, model_type
""",
    # speculation on a static cache: verify windows on device positions through the verify ops' Triton
    # implementations (registered for the CPU here), every crop on the device, those that complete a period folded
    # by the fold kernel while the positions stay (DevicePositions.restart)
    "static_speculation": """
from hf_replayssm.kernels import ops
from hf_replayssm.static_decode import DevicePositions
for op, impl in ops.TRITON_IMPLS.items():
    op.register_kernel("cpu")(impl)
restarts = []
restart = DevicePositions.restart
DevicePositions.restart = lambda self, origin, committed: (restarts.append(committed), restart(self, origin, committed))
for model_type in ("qwen3_5_text", "nemotron_h"):
    other = tiny_model(model_type, initializer_range=0.2)
    prompt = torch.cat([torch.randint(3, 120, (1, 5))] * 3, dim=1)
    greedy = other.generate(prompt, past_key_values=DynamicCache(config=other.config), **greedy_kw(10))
    cache = ReplayCache(4, backend="triton", max_cache_len=prompt.shape[1] + 14)
    restarts.clear()
    out = other.generate(prompt, past_key_values=cache, prompt_lookup_num_tokens=3, **greedy_kw(10))
    assert torch.equal(out.sequences, greedy.sequences), model_type
    assert max_logit_diff(out.logits, greedy.logits) < 1e-4, model_type
    assert restarts and kernel_folds(cache) > 0, (model_type, restarts, kernel_folds(cache))
    assert cache.stats()["flushes"] > 0, model_type
""",
    "separated": """
# the reference where the kernels do not apply: the torch backend, and separated precision (window outputs read the
# low-precision copy, which the verify kernels do not)
prompt = torch.cat([tokens[:1, :5]] * 3, dim=1)
for backend, policy in (("torch", "fp32"), ("triton", "separated-fp8")):
    cache = ReplayCache(4, precision=policy, backend=backend)
    model.generate(prompt, past_key_values=cache, prompt_lookup_num_tokens=3, **greedy_kw(10))
    assert kernel_windows(cache) == kernel_folds(cache) == 0, (backend, policy)
    assert cache.stats()["rolled_back_tokens"] > 0, (backend, policy)

# separated precision: every step reads the fp8 / nvfp4 copy in the kernel, flush steps too (the flush-only launch
# folds into the fp32 checkpoint, the copy is re-encoded after it); equal to the torch backend with the same policy
# up to summation order -- which, once a later layer's checkpoint lands next to an 8-bit rounding boundary, can flip
# one code of its read copy (2^-4 relative), hence 2e-3
for model_type, policy in (("nemotron_h", "separated-fp8"), ("qwen3_5_text", "separated-nvfp4"),
                           ("kimi_linear", "separated-fp8")):
    fused = separated_against_torch(model_type, policy)
    for idx, layer in fused.replay_layers.items():
        assert layer.schedule.kernel_flushes > 0, (model_type, idx)  # the flush steps ran the kernel
        # the read copy was refreshed from the new checkpoint: the store's own encoding of it
        store = layer.schedule.store
        want = store.slots[0].read_codec.encode(store.recurrence())
        for name, value in store.slots[0].read_copy.items():
            assert torch.equal(value, want[name]), (model_type, idx, name)
""",
}


@pytest.mark.parametrize("part", FUSED_PARTS)
def test_fused_triton_step_inside_replaycache(part):
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"}
    script = PRELUDE + FUSED_PARTS[part] + 'print("ok")\n'
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, env=env,
                         timeout=900)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]
