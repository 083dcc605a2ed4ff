"""The same guarantees on a CUDA device (skipped without one; run on the H200, see README "GPU check")."""

import pytest
import torch
from conftest import (
    SUPPORTED,
    assert_rows_agree,
    assisted_forwards_compile,
    cache_kwarg,
    decode,
    get_model,
    max_logit_diff,
)
from transformers import DynamicCache

from hf_replayssm import PRESETS, ReplayCache
from hf_replayssm.tiny import tiny_model

pytestmark = [pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"), pytest.mark.gpu]
# cuDNN convolutions default to TF32 on Ampere+ (about 1e-3 relative): stock decoding's conv over a verify window and
# the cache's conv ring would then differ by more than float32 rounding. Compare at float32 precision.
torch.backends.cudnn.allow_tf32 = False
GREEDY = dict(do_sample=False, max_new_tokens=24, min_new_tokens=24, output_logits=True, return_dict_in_generate=True,
              suppress_tokens=[0])


def _cuda(model_type, seed=0):
    get_model(model_type)  # skips model types this transformers version lacks
    return tiny_model(model_type, seed=seed).cuda()


@pytest.mark.parametrize("model_type", SUPPORTED)
def test_cuda_greedy_matches_stock(model_type):
    model = _cuda(model_type)
    prompt = torch.randint(3, 120, (2, 7), device="cuda")
    stock = model.generate(prompt, **GREEDY)
    for buffer_len in (1, 4, 16):
        cache = ReplayCache(buffer_len=buffer_len)
        out = model.generate(prompt, **{cache_kwarg(model): cache}, **GREEDY)
        assert torch.equal(out.sequences, stock.sequences)
        assert max_logit_diff(out.logits, stock.logits) < 1e-4
        assert all(layer.checkpoint.is_cuda for layer in cache.replay_layers.values())


@pytest.mark.parametrize("model_type", ["nemotron_h", "falcon_h1", "qwen3_5_text", "kimi_linear"])
def test_cuda_speculation_equals_greedy(model_type):
    model, draft = _cuda(model_type), _cuda(model_type, seed=5)
    base = torch.randint(3, 120, (1, 5), device="cuda")
    prompt = torch.cat([base] * 3, dim=1)
    greedy = model.generate(prompt, **GREEDY)
    for extra in (dict(prompt_lookup_num_tokens=3), dict(assistant_model=draft)):
        out = model.generate(prompt, past_key_values=ReplayCache(buffer_len=8), **extra, **GREEDY)
        assert torch.equal(out.sequences, greedy.sequences)
        assert max_logit_diff(out.logits, greedy.logits) < 1e-4


def test_device_map_with_cpu_offloaded_layers(tmp_path):
    """device_map="auto" with a small GPU budget maps some layers to "cpu": accelerate keeps their weights there and
    runs them on cuda:0, so their ReplaySSM buffers live on cuda:0 too (next to the computation)."""
    from transformers import AutoModelForCausalLM

    model = tiny_model("qwen3_next")
    model.save_pretrained(tmp_path)
    # use_kernels=False: from 5.25 from_pretrained kernelizes by default, and with a device map on CUDA it resolves
    # fla's hub kernels, which fails offline (the GPU machine); test_hub_kernels.py covers kernelized models
    dispatched = AutoModelForCausalLM.from_pretrained(tmp_path, device_map="auto", use_kernels=False,
                                                      max_memory={0: "300KB", "cpu": "2GB"}).eval()
    assert {"cpu", 0} <= set(dispatched.hf_device_map.values()) or {"cpu", "cuda:0"} <= {
        str(v) for v in dispatched.hf_device_map.values()}
    prompt = torch.randint(3, 120, (1, 6))
    stock = model.generate(prompt, **GREEDY)
    cache = ReplayCache(buffer_len=4)
    out = dispatched.generate(prompt.to(dispatched.device), past_key_values=cache, **GREEDY)
    assert torch.equal(out.sequences.cpu(), stock.sequences)
    assert max_logit_diff([x.cpu() for x in out.logits], stock.logits) < 1e-4
    devices = {layer.checkpoint.device for layer in cache.replay_layers.values()}
    devices |= {layer.conv.buffer.device for layer in cache.replay_layers.values()}
    assert devices == {torch.device("cuda", 0)}


@pytest.mark.parametrize("precision", list(PRESETS))
def test_cuda_policies_and_exact_separated_recurrence(precision):
    model = _cuda("nemotron_h")
    tokens = torch.randint(3, 120, (1, 60), device="cuda")
    cache, fp32 = ReplayCache(buffer_len=4, precision=precision), ReplayCache(buffer_len=4)
    decode(model, tokens, 6, cache)
    decode(model, tokens, 6, fp32)
    first = min(cache.replay_layers)
    if PRESETS[precision].mode == "separated" and PRESETS[precision].checkpoint_format == "fp32":
        # the copy's rounding never enters the recurrence: the checkpoint is the fp32 policy's, up to the FMA
        # contraction of the flush kernel's read-copy variant (the copy's own rounding is ~1e-2 relative)
        torch.testing.assert_close(cache.replay_layers[first].checkpoint, fp32.replay_layers[first].checkpoint,
                                   rtol=1e-5, atol=1e-6)
    assert cache.memory()["checkpoint"] > 0


def test_cuda_demo_and_precision_check():
    from hf_replayssm.demo import run_demo
    from hf_replayssm.eval.precision_check import precision_check
    from hf_replayssm.models import load_model

    result = run_demo(max_new_tokens=64, device="cuda", progress=False)
    assert result["identical_tokens"] and result["identical_tokens_lookup"] and result["device"].startswith("cuda")
    model, tokenizer = load_model("tiny-gdn", device="cuda")
    report = precision_check(model, tokenizer, tokens=64, progress=False, policies=["fp32", "shared-nvfp4"])
    assert report.mean_kl("fp32") == 0.0 and report.mean_kl("shared-nvfp4") > 0
    print(result["report"])
    print(report.table())


def test_cuda_hybrid_draft_with_a_long_prompt_and_window_growth():
    model, draft = _cuda("nemotron_h"), _cuda("qwen3_next", seed=5)
    draft.generation_config.assistant_confidence_threshold = 0.0
    prompt = torch.randint(3, 120, (1, 48), device="cuda")
    greedy = model.generate(prompt, **GREEDY)
    out = model.generate(prompt, past_key_values=ReplayCache(buffer_len=4), assistant_model=draft,
                         num_assistant_tokens=3, **GREEDY)
    assert torch.equal(out.sequences, greedy.sequences)
    assert max_logit_diff(out.logits, greedy.logits) < 1e-4


@pytest.mark.parametrize("precision", ["fp32", "separated-nvfp4"])
def test_cuda_memory_report_matches_the_allocator(precision):
    """memory() equals what the CUDA allocator holds for the cache (every tensor it keeps alive, nothing else)."""
    model = _cuda("qwen3_5_text")
    tokens = torch.randint(3, 120, (4, 40), device="cuda")
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    cache = ReplayCache(buffer_len=8, precision=precision)
    with torch.no_grad():
        for pos in range(0, 40, 8):
            model(tokens[:, pos : pos + 8], **{cache_kwarg(model): cache}, use_cache=True, logits_to_keep=1)
        for pos in range(3):
            model(tokens[:, pos : pos + 1], **{cache_kwarg(model): cache}, use_cache=True, logits_to_keep=1)
    torch.cuda.synchronize()
    held = torch.cuda.memory_allocated() - base
    reported = cache.memory()["total"]
    # the caching allocator rounds each block up to 512 bytes
    blocks = sum(1 for _ in cache.replay_layers.values()) * 16 + 8
    assert reported <= held <= reported + 512 * blocks, (reported, held)


@pytest.mark.parametrize("model_type", ["nemotron_h", "falcon_h1", "qwen3_5_text", "qwen3_next", "kimi_linear"])
def test_cuda_triton_backend_matches_stock_and_reference(model_type):
    """backend="triton" on the GPU (phase-specialised replay/flush kernels inside generate): the same tokens as
    stock decoding and the torch backend, logits within fp32 rounding, the same flush schedule; 2 rows, 40 steps."""
    pytest.importorskip("triton")
    model = _cuda(model_type)
    prompt = torch.randint(3, 120, (2, 9), device="cuda")
    kw = dict(GREEDY, max_new_tokens=40, min_new_tokens=40)
    stock = model.generate(prompt, **kw)
    for buffer_len in (1, 5, 16):
        triton_cache = ReplayCache(buffer_len=buffer_len, backend="triton")
        torch_cache = ReplayCache(buffer_len=buffer_len, backend="torch")
        out = model.generate(prompt, **{cache_kwarg(model): triton_cache}, **kw)
        ref = model.generate(prompt, **{cache_kwarg(model): torch_cache}, **kw)
        assert triton_cache.resolved_backend == "triton"
        assert torch.equal(out.sequences, stock.sequences) and torch.equal(out.sequences, ref.sequences)
        assert max_logit_diff(out.logits, stock.logits) < 1e-4
        assert max_logit_diff(out.logits, ref.logits) < 1e-4
        assert triton_cache.stats() == torch_cache.stats()


@pytest.mark.parametrize("rows", [2, 256])
@pytest.mark.parametrize("policy", ["separated-fp8", "separated-nvfp4"])
@pytest.mark.parametrize("model_type", ["nemotron_h", "qwen3_5_text", "kimi_linear"])
def test_cuda_triton_backend_separated_flushes_in_the_kernel(model_type, policy, rows):
    """Eager separated precision on the GPU: flush steps run the step kernel (outputs from the copy, the fold into
    the fp32 checkpoint) and the Triton re-encode refreshes the copy; against the torch backend with the same policy
    (summation order can flip one code of a later layer's copy: 2e-3 for fp8; nvfp4's E2M1 steps are up to a third of
    a block's scale, so 3e-2, run 142 measured 1.2e-2 on Kimi-Linear; the format's own error against fp32 is 0.13-10),
    the same flush schedule, the copy the store's codec gives for the final checkpoint. 256 rows: the copy launches'
    large-batch defaults (Mamba-2 one warp over a whole head, the delta rule's streamed whole-head tile); there a few
    rows meet a flipped code (run 189: Kimi-Linear 0.038 fp8, 0.16 nvfp4 at worst; run 190: median row 7e-6, 3 % of
    rows past 2e-3, codes differing 1-175 of 262144 a layer), so :func:`assert_rows_agree`'s large-batch form."""
    pytest.importorskip("triton")
    model = _cuda(model_type)
    if rows == 256:
        from hf_replayssm.kernels import delta_rule, mamba2

        fmt, c = policy.removeprefix("separated-"), model.config
        if model_type == "nemotron_h":
            assert mamba2.replay_launch_config(rows, c.mamba_num_heads, c.mamba_head_dim, c.ssm_state_size,
                                               fmt)["num_warps"] == 1
        else:
            assert delta_rule.read_copy_stream_config(rows, 16, model_type == "kimi_linear", fmt) is not None
    prompt = torch.randint(3, 120, (rows, 9), device="cuda")
    kw = dict(GREEDY, max_new_tokens=24, min_new_tokens=24)
    fused = ReplayCache(buffer_len=5, precision=policy, backend="triton")
    reference = ReplayCache(buffer_len=5, precision=policy, backend="torch")
    out = model.generate(prompt, **{cache_kwarg(model): fused}, **kw)
    ref = model.generate(prompt, **{cache_kwarg(model): reference}, **kw)
    assert_rows_agree(out.logits, ref.logits, 3e-2 if policy.endswith("nvfp4") else 2e-3)
    assert fused.stats() == reference.stats() and fused.stats()["flushes"] > 0
    for layer in fused.replay_layers.values():
        assert layer.schedule.kernel_flushes > 0
        store = layer.schedule.store
        want = store.slots[0].read_codec.encode(store.recurrence())
        for name, value in store.slots[0].read_copy.items():
            assert torch.equal(value, want[name]), name


# falcon_h1 / zamba2: layers with both an SSM state and attention (ReplayStaticHybridLayer)
@pytest.mark.parametrize("model_type", ["nemotron_h", "qwen3_5_text", "kimi_linear", "falcon_h1", "zamba2"])
def test_cuda_compiled_static_cache_with_cuda_graphs(model_type):
    """A static ReplayCache under transformers' default compile config (Inductor, reduce-overhead: CUDA graphs):
    the same tokens as eager stock decoding and as the eager static cache, logits within 1e-4, one graph."""
    pytest.importorskip("triton")
    from torch._dynamo.utils import guard_failures

    from hf_replayssm.bench.generate import cudagraph_skips

    model = _cuda(model_type)
    prompt = torch.randint(3, 120, (2, 9), device="cuda")
    kw = dict(GREEDY, max_new_tokens=40, min_new_tokens=40)
    stock = model.generate(prompt, **kw)
    eager = model.generate(prompt, past_key_values=ReplayCache(16, max_cache_len=49), **kw)
    torch._dynamo.reset()
    guard_failures.clear()
    skips = cudagraph_skips()
    cache = ReplayCache(16, max_cache_len=49)
    out = model.generate(prompt, past_key_values=cache, **kw)  # a compileable cache on CUDA: generate compiles
    assert getattr(model, "_compiled_call", None) is not None
    assert cudagraph_skips() == skips, "Inductor ran the decode step without CUDA graphs (TORCH_LOGS=perf_hints)"
    failed = {code.co_name: reasons[:2] for code, reasons in guard_failures.items() if reasons}
    assert not failed, f"the decode step recompiled: {failed}"
    assert torch.equal(out.sequences, stock.sequences) and torch.equal(out.sequences, eager.sequences)
    assert max_logit_diff(out.logits, eager.logits) < 1e-4
    assert max_logit_diff(out.logits, stock.logits) < 1e-4


@pytest.mark.parametrize("model_type", ["nemotron_h", "qwen3_5_text", "kimi_linear", "falcon_h1"])
def test_cuda_static_cache_speculation(model_type):
    """Speculation on a static ReplayCache on CUDA: transformers 5.25 compiles the verify forwards of a compileable
    cache (CUDA graphs; 5.17 runs them eagerly), which run on device positions through the verify ops (the Triton
    verify kernels; a draft model's windows of 21 tokens in pieces of 16). Prompt lookup and a draft model equal
    greedy decoding and the same calls kept eager (``disable_compile``) within 1e-4; a plain generate on the same
    cache afterwards compiles and equals stock."""
    pytest.importorskip("triton")
    from torch._dynamo.utils import counters

    model, draft = _cuda(model_type), _cuda(model_type, seed=5)
    base = torch.randint(3, 120, (1, 5), device="cuda")
    prompt = torch.cat([base] * 3, dim=1)
    greedy = model.generate(prompt, **GREEDY)
    cache = ReplayCache(8, max_cache_len=prompt.shape[1] + GREEDY["max_new_tokens"] + 22)
    torch._dynamo.reset()
    for extra in (dict(prompt_lookup_num_tokens=3), dict(assistant_model=draft)):
        cache.reset()
        eager = model.generate(prompt, past_key_values=cache, disable_compile=True, **extra, **GREEDY)
        cache.reset()
        counters.clear()
        out = model.generate(prompt, past_key_values=cache, **extra, **GREEDY)
        assert (counters["stats"]["unique_graphs"] > 0) == assisted_forwards_compile()  # (5.17: eager windows)
        assert torch.equal(out.sequences, greedy.sequences) and torch.equal(eager.sequences, greedy.sequences)
        assert max_logit_diff(out.logits, greedy.logits) < 1e-4
        # Inductor's fused kernels round apart from eager (H100, 5.25, the draft model's windows: 1.7e-5), as in
        # test_cuda_compiled_static_cache_with_cuda_graphs
        assert max_logit_diff(out.logits, eager.logits) < 1e-4
    cache.reset()
    counters.clear()
    out = model.generate(prompt, past_key_values=cache, **GREEDY)
    assert counters["stats"]["unique_graphs"] > 0, "the plain decode steps did not compile"
    assert torch.equal(out.sequences, greedy.sequences) and max_logit_diff(out.logits, greedy.logits) < 1e-4
    torch._dynamo.reset()


@pytest.mark.parametrize("rows", [2, 256])
@pytest.mark.parametrize("model_type", ["nemotron_h", "qwen3_5_text", "kimi_linear"])
@pytest.mark.parametrize("policy", ["separated-fp8", "separated-nvfp4"])
def test_cuda_static_cache_with_a_read_copy(model_type, policy, rows):
    """Separated precision in a static cache on CUDA (the decode op's Triton kernels, the read copy re-encoded on the
    device for the rows that flush): the same tokens as a dynamic cache with the same policy, eager and compiled
    (CUDA graphs), logits within 2e-3, and the copy afterwards the encoding of the checkpoint as torch computes it on
    CUDA (whose division by a Python scalar is a reciprocal multiply, which the kernel reproduces). 256 rows: the
    split step's large-batch launches (Mamba-2: one warp over a whole head, the coefficients pre-launch)."""
    pytest.importorskip("triton")
    from hf_replayssm.precision.formats import get_format

    get_model(model_type)
    model = tiny_model(model_type, seed=0, initializer_range=0.2).cuda()  # logit gaps well above the tolerance
    prompt = torch.randint(3, 120, (rows, 9), device="cuda")
    kw = dict(GREEDY, max_new_tokens=40, min_new_tokens=40)
    dynamic = model.generate(prompt, past_key_values=ReplayCache(16, precision=policy), **kw)
    eager = model.generate(prompt, past_key_values=ReplayCache(16, precision=policy, max_cache_len=49),
                           disable_compile=True, **kw)
    torch._dynamo.reset()
    cache = ReplayCache(16, precision=policy, max_cache_len=49)
    out = model.generate(prompt, past_key_values=cache, **kw)
    assert getattr(model, "_compiled_call", None) is not None
    # the dynamic cache's flush steps run the torch path, so a checkpoint that lands next to an 8-bit rounding
    # boundary can round one code of the copy the other way (2^-4 relative): logits within 2e-3 (256 rows: the typical
    # row to float32 rounding, 90 % within 2e-3; run 189 saw 0.0026-0.031 at worst)
    for run in (eager, out):
        assert torch.equal(run.sequences, dynamic.sequences)
        assert_rows_agree(run.logits, dynamic.logits, 2e-3)
    fmt = policy.removeprefix("separated-")
    for layer in cache.replay_layers.values():
        state, read_copy, _ = layer.schedule.store.kernel_operands()
        expected = get_format(fmt).encode(state)
        for name, tensor in read_copy.items():
            if name != "row":
                got = tensor.view(torch.uint8) if tensor.dtype == torch.float8_e4m3fn else tensor
                assert torch.equal(got, expected[name]), name


@pytest.mark.parametrize("model_type", ["nemotron_h", "qwen3_5_text"])
def test_cuda_batched_speculation_rows_equal_rows_alone(model_type):
    """Batched speculation on CUDA: a drafter right up to a random place per round, so rows accept different numbers
    of drafts and roll back per row (neutral records through a mask and conv windows through a gather, both built on
    the device from counts copied from pinned memory, without a host synchronisation); every row equals its own
    greedy decoding."""
    from hf_replayssm.batched import batched_prompt_lookup

    get_model(model_type)
    model = tiny_model(model_type, seed=0, initializer_range=0.2).cuda()  # logit gaps far above float32 rounding
    generator = torch.Generator().manual_seed(7)
    prompts = [torch.randint(3, model.config.vocab_size, (n,), generator=generator).tolist() for n in (10, 7, 9)]
    new = 14
    truth = []
    for prompt in prompts:  # plain greedy decoding of the row alone with a stock cache: raw argmax, no end of sequence
        stock, tokens = DynamicCache(config=model.config), list(prompt)
        with torch.no_grad():
            logits = model(torch.tensor([prompt], device="cuda"), past_key_values=stock, use_cache=True).logits
            for _ in range(new):
                tokens.append(int(logits[0, -1].argmax()))
                logits = model(torch.tensor([[tokens[-1]]], device="cuda"), past_key_values=stock,
                               use_cache=True).logits
        truth.append(tokens)
    rng = torch.Generator().manual_seed(11)

    def drafter(row, tokens, count):
        upcoming = truth[row][len(tokens) : len(tokens) + count]
        wrong = int(torch.randint(0, count + 1, (1,), generator=rng))
        return [t if i != wrong else (t + 1) % model.config.vocab_size for i, t in enumerate(upcoming)]

    width = max(map(len, prompts))
    input_ids = torch.tensor([[1] * (width - len(p)) + p for p in prompts], device="cuda")
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device="cuda")
    cache = ReplayCache(buffer_len=4)
    result = batched_prompt_lookup(model, input_ids, attention_mask=mask, max_new_tokens=new, num_draft_tokens=3,
                                   drafter=drafter, cache=cache)
    for prompt, tokens, expected in zip(prompts, result.new_tokens, truth, strict=True):
        assert tokens == expected[len(prompt) :]
    assert 0 < result.accepted < result.drafted
    assert cache.stats()["rolled_back_tokens"] > 0
    # windows past flush boundaries ran the verify kernel from checkpoints the fold kernel staged
    assert sum(layer.schedule.kernel_folds for layer in cache.replay_layers.values()) > 0


@pytest.mark.parametrize("family", ["mamba2", "gdn", "kda"])
def test_cuda_verify_compiles_once_per_window_tile(family):
    """Draft counts 5, 6 and 7 share one compiled verify kernel (the window's width is a runtime argument and its
    tiles are sized by BLOCK_T = 8): a constexpr width cost a JIT compile per new draft count in a speculative run.
    Each width's outputs are finite and the ring holds its appended records."""
    from hf_replayssm.kernels import bench_verify

    gen = torch.Generator(device="cuda").manual_seed(0)
    shape = bench_verify.SMOKE_SHAPES[family]["smoke"]
    verify_kernel = None
    variants = []
    for window in (5, 6, 7):  # one ring capacity (L - 1 + T = 19) for every width, as in a speculative run
        case = bench_verify.make_case(family, shape, 2, window, 20 - window, torch.device("cuda"), gen, True)
        module = __import__(f"hf_replayssm.kernels.{case.verify_module}", fromlist=["LAST_COMPILED"])
        out = case.verify(module, case.copies[0])
        torch.cuda.synchronize()
        assert torch.isfinite(out).all()
        verify_kernel = next(v for n, v in vars(module).items() if n.endswith("_verify_kernel"))
        caches = getattr(verify_kernel, "device_caches", None)
        if caches is None:
            pytest.skip("this Triton keeps no per-device kernel cache to count")
        variants.append(sum(len(entry[0]) for entry in caches.values()))
    assert variants[1] == variants[0] and variants[2] == variants[0], variants


def test_cuda_jit_compiles_counts_a_real_compile():
    """The benches' compile counter sees a kernel compiled on this GPU once, and not its cached second launch."""
    import triton
    import triton.language as tl

    from hf_replayssm.bench.compiles import JitCompiles

    @triton.jit
    def _scale_by_three(x_ptr, n, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 3, mask=offs < n)

    x = torch.randn(20, device="cuda")
    expected = x * 3 * 3  # the same two roundings as the kernel's two launches
    with JitCompiles() as compiles:
        _scale_by_three[(1,)](x, 20, BLOCK=32)
        _scale_by_three[(1,)](x, 20, BLOCK=32)
    torch.cuda.synchronize()
    assert torch.equal(x, expected)
    assert compiles.supported and compiles.summary() == {"_scale_by_three": 1}, compiles.summary()


@pytest.mark.parametrize("model_type", ["nemotron_h", "qwen3_5_text"])
def test_cuda_decode_compiles_once_per_phase(model_type):
    """Plain decoding over three periods through the replay-or-flush kernel compiles one variant per kernel phase
    used (every row replays / every row flushes): the host's ring positions are runtime arguments, not specialised on
    (values of 1 or multiples of 16 each cost another compile, seconds apiece on a fresh H200). A fresh process, so
    the kernel caches hold this decode's compiles only."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(f'''
        import torch
        from hf_replayssm import ReplayCache
        from hf_replayssm.tiny import tiny_model
        family = "mamba2" if "{model_type}" == "nemotron_h" else "delta_rule"
        kernels = __import__(f"hf_replayssm.kernels.{{family}}", fromlist=["LAST_COMPILED"])
        model = tiny_model("{model_type}", seed=0).cuda()
        cache = ReplayCache(4, backend="triton")
        ids = torch.randint(3, 100, (2, 9), device="cuda")
        with torch.no_grad():
            out = model(ids, past_key_values=cache, use_cache=True)
            for _ in range(13):
                token = out.logits[:, -1:].argmax(-1)
                out = model(token, past_key_values=cache, use_cache=True)
        kernel = next(v for n, v in vars(kernels).items() if n.endswith("_replay_step_kernel"))
        if getattr(kernel, "device_caches", None) is None:
            raise SystemExit("SKIP")
        variants = sum(len(entry[0]) for entry in kernel.device_caches.values())
        phases = sorted(k for k in kernels.LAST_COMPILED if k.startswith("replay_phase"))
        print(variants, phases)
        assert cache.stats()["flushes"] > 0 and len(phases) >= 2, (cache.stats(), phases)
        assert variants == len(phases), (variants, phases)
    ''')
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    if "SKIP" in done.stderr[-200:]:
        pytest.skip("this Triton keeps no per-device kernel cache to count")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
@pytest.mark.parametrize("model_type", ["nemotron_h", "qwen3_5_text"])
def test_device_map_across_two_gpus(tmp_path, model_type):
    """device_map="auto" over two GPUs (a small budget on the first puts layers on both): the same tokens as the
    model on one GPU, logits within 1e-4, and every SSM layer's ReplaySSM buffers on its own layer's GPU."""
    from transformers import AutoModelForCausalLM

    model = tiny_model(model_type, initializer_range=0.2)
    model.save_pretrained(tmp_path)
    dispatched = AutoModelForCausalLM.from_pretrained(tmp_path, device_map="auto", use_kernels=False,  # as above
                                                      max_memory={0: "300KB", 1: "2GB"}).eval()
    assert {str(torch.device("cuda", d) if isinstance(d, int) else d) for d in dispatched.hf_device_map.values()} >= {
        "cuda:0", "cuda:1"}, dispatched.hf_device_map
    single = model.cuda()
    prompt = torch.randint(3, 120, (2, 7), device="cuda")
    for buffer_len in (4, 16):
        reference = single.generate(prompt, past_key_values=ReplayCache(buffer_len=buffer_len), **GREEDY)
        cache = ReplayCache(buffer_len=buffer_len)
        out = dispatched.generate(prompt.to(dispatched.device), past_key_values=cache, **GREEDY)
        assert torch.equal(out.sequences.to(reference.sequences.device), reference.sequences)
        assert max_logit_diff([x.to("cuda:0") for x in out.logits], reference.logits) < 1e-4
        layers = dispatched.model.layers
        for idx, layer in cache.replay_layers.items():
            home = next(layers[idx].parameters()).device
            assert layer.checkpoint.device == home, (idx, layer.checkpoint.device, home)
            if layer.conv.buffer is not None:
                assert layer.conv.buffer.device == home, idx
