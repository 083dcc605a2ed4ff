"""A static ReplayCache (``max_cache_len``): plain decode steps on per-row device positions, equal to stock decoding,
and a decode step that ``torch.compile`` traces as one graph (fullgraph) inside transformers' own generate path."""

from __future__ import annotations

import os
import sys

import pytest
import torch
from conftest import generate_compiled_once, max_logit_diff
from transformers.generation import CompileConfig

from hf_replayssm import ReplayCache
from hf_replayssm.layers import RollbackError
from hf_replayssm.tiny import tiny_model

# also in the compat run (torch 2.11 + transformers 5.17, what GPU images ship): Dynamo differs between versions
pytestmark = pytest.mark.equivalence

FAMILIES = ["nemotron_h", "qwen3_5_text", "kimi_linear"]  # Mamba-2, Gated DeltaNet, KDA
NEW = 20
GREEDY = dict(do_sample=False, max_new_tokens=NEW, min_new_tokens=NEW, output_logits=True,
              return_dict_in_generate=True)


def _model(model_type):
    return tiny_model(model_type, seed=0, initializer_range=0.2)


def _prompt(model, rows=2, length=11, seed=1):
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(3, model.config.vocab_size, (rows, length), generator=generator)


def _compile_config(backend="aot_eager"):
    config = CompileConfig(fullgraph=True, backend=backend, mode=None)
    config._compile_all_devices = True  # transformers compiles generate's decode step on CUDA only otherwise
    return config


@pytest.mark.parametrize("model_type", FAMILIES)
@pytest.mark.parametrize("buffer_len", [1, 4])
def test_static_cache_decodes_like_stock(model_type, buffer_len):
    """Eager: the same tokens as stock greedy decoding, logits within fp32 rounding, the same flush schedule as a
    dynamic ReplayCache, and the layers really decoded on device positions."""
    model = _model(model_type)
    prompt = _prompt(model)
    stock = model.generate(prompt, **GREEDY)
    dynamic = ReplayCache(buffer_len)
    reference = model.generate(prompt, past_key_values=dynamic, **GREEDY)
    cache = ReplayCache(buffer_len, max_cache_len=prompt.shape[1] + NEW)
    out = model.generate(prompt, past_key_values=cache, **GREEDY)
    assert torch.equal(out.sequences, stock.sequences)
    assert max_logit_diff(out.logits, stock.logits) < 1e-4
    assert max_logit_diff(out.logits, reference.logits) < 1e-4
    assert all(layer.schedule.device_positions.is_active() for layer in cache.replay_layers.values())
    assert cache.stats() == dynamic.stats()
    assert cache.is_compileable and not dynamic.is_compileable


@pytest.mark.parametrize("model_type", FAMILIES)
def test_compiled_generate_is_one_graph_equal_to_eager(model_type):
    """generate(..., compile_config=...) compiles the decode step with fullgraph=True: one graph, no recompilation
    across 19 steps (flushes included), no graph break; outputs equal the eager static cache (aot_eager: the custom
    ops' in-place writes go through functionalisation as under Inductor)."""
    from torch._dynamo.utils import counters

    model = _model(model_type)
    prompt = _prompt(model)
    eager_cache = ReplayCache(4, max_cache_len=prompt.shape[1] + NEW)
    eager = model.generate(prompt, past_key_values=eager_cache, **GREEDY)
    torch._dynamo.reset()
    counters.clear()
    cache = ReplayCache(4, max_cache_len=prompt.shape[1] + NEW)
    out = model.generate(prompt, past_key_values=cache, compile_config=_compile_config(), **GREEDY)
    assert getattr(model, "_compiled_call", None) is not None, "generate did not take the compiled path"
    assert counters["stats"]["unique_graphs"] == 1 and not counters["graph_break"]
    assert torch.equal(out.sequences, eager.sequences)
    assert max_logit_diff(out.logits, eager.logits) < 1e-5  # transformers' compiled masks round a little apart
    assert cache.stats() == eager_cache.stats()


@pytest.mark.parametrize("model_type", ["nemotron_h", "qwen3_5_text"])
def test_compiled_decode_with_inductor(model_type):
    """The same with Inductor (what a GPU run uses), on the Mamba-2 family and on GDN; the compiled step computes the
    short conv as a fused elementwise sum (ops/short_conv.py) instead of F.conv1d."""
    model = _model(model_type)
    prompt = _prompt(model)
    eager = model.generate(prompt, past_key_values=ReplayCache(4, max_cache_len=prompt.shape[1] + NEW), **GREEDY)
    torch._dynamo.reset()
    cache = ReplayCache(4, max_cache_len=prompt.shape[1] + NEW)
    out = model.generate(prompt, past_key_values=cache, compile_config=_compile_config("inductor"), **GREEDY)
    assert torch.equal(out.sequences, eager.sequences)
    assert max_logit_diff(out.logits, eager.logits) < 1e-4


@pytest.mark.parametrize("model_type", ["nemotron_h", "qwen3_5_text"])
def test_manual_steps_views_and_a_continuation(model_type):
    """The manual cache API: single-token forwards on device positions; reading the sequence length, the stats and
    the stock state views does not leave them; a multi-token forward hands the positions back to the host schedule
    and continues exactly like a stock cache."""
    from transformers import DynamicCache

    model = _model(model_type)
    ids = _prompt(model, length=30, seed=3)
    cache = ReplayCache(4, max_cache_len=64)
    stock = DynamicCache(config=model.config)
    with torch.no_grad():
        ours, theirs = model(ids[:, :9], past_key_values=cache), model(ids[:, :9], past_key_values=stock)
        for pos in range(9, 20):
            ours = model(ids[:, pos : pos + 1], past_key_values=cache)
            theirs = model(ids[:, pos : pos + 1], past_key_values=stock)
            assert (ours.logits - theirs.logits).abs().max() < 1e-4
        layer_idx, layer = next(iter(cache.replay_layers.items()))
        assert layer.schedule.device_positions.is_active()
        assert layer.tokens_seen == 20 and cache.stats()["tokens"] == 20 * len(cache.replay_layers)
        stock_layer = stock.layers[layer_idx]
        assert torch.allclose(layer.conv_states[0].float(), stock_layer.conv_states[0].float())
        assert layer.schedule.device_positions.is_active(), "reading counts or the conv window left device positions"
        ours = model(ids[:, 20:26], past_key_values=cache)  # several tokens: back on the host schedule
        theirs = model(ids[:, 20:26], past_key_values=stock)
        assert (ours.logits - theirs.logits).abs().max() < 1e-4
        assert cache.stats()["prefills"] == 2 * len(cache.replay_layers)  # it took the host's prefill path
        assert torch.allclose(layer.current_state(), stock_layer.recurrent_states[0].float(), atol=1e-5)
        assert not layer.schedule.device_positions.is_active()  # reading the full state needs the host positions
        for pos in range(26, 30):  # and back on the device
            ours = model(ids[:, pos : pos + 1], past_key_values=cache)
            theirs = model(ids[:, pos : pos + 1], past_key_values=stock)
            assert (ours.logits - theirs.logits).abs().max() < 1e-4
        assert layer.schedule.device_positions.is_active() and layer.tokens_seen == 30


@pytest.mark.parametrize("model_type", [*FAMILIES, "zamba2"])  # zamba2: Mamba-2 layers and hybrid blocks
@pytest.mark.parametrize("policy", ["separated-fp8", "separated-nvfp4"])
def test_static_cache_with_a_read_copy(model_type, policy):
    """Separated precision on device positions: replays read the read copy, the decode op re-encodes the copy of
    the rows that flushed (no host write), so the static cache decodes like a dynamic cache with the same policy
    (eager and compiled), and its copy after the run is the encoding of its checkpoint."""
    from hf_replayssm.precision.formats import get_format

    model = _model(model_type)
    prompt = _prompt(model)
    dynamic = model.generate(prompt, past_key_values=ReplayCache(4, precision=policy), **GREEDY)
    cache = ReplayCache(4, precision=policy, max_cache_len=prompt.shape[1] + NEW)
    out = model.generate(prompt, past_key_values=cache, **GREEDY)
    assert all(layer.schedule.device_positions.is_active() for layer in cache.replay_layers.values())
    assert torch.equal(out.sequences, dynamic.sequences)
    # The paths fold and replay in different float32 orders (and CPU kernels round a tensor's tail apart), so a
    # checkpoint value next to a code boundary can encode to the neighbouring fp8 / nvfp4 code in one of them: the
    # logits then differ by about one code's step (runs on an AVX-512 CPU: up to 2e-4), not by float32 rounding.
    assert max_logit_diff(out.logits, dynamic.logits) < 1e-3
    fmt = policy.removeprefix("separated-")
    for layer in cache.replay_layers.values():
        state, read_copy, read_format = layer.schedule.store.kernel_operands()
        assert read_format == fmt
        expected = get_format(fmt).encode(state)
        for name, tensor in read_copy.items():
            if name != "row":
                assert torch.equal(tensor.view(torch.uint8) if tensor.dtype == torch.float8_e4m3fn else tensor,
                                   expected[name]), (name, layer)
    torch._dynamo.reset()
    compiled_cache = ReplayCache(4, precision=policy, max_cache_len=prompt.shape[1] + NEW)
    compiled = model.generate(prompt, past_key_values=compiled_cache, compile_config=_compile_config(), **GREEDY)
    assert torch.equal(compiled.sequences, out.sequences)
    assert max_logit_diff(compiled.logits, out.logits) < 1e-3  # as above (seen: 2.3e-5 on an AVX-512 CPU)
    assert compiled_cache.stats() == cache.stats()


@pytest.mark.parametrize("model_type", ["nemotron_h", "qwen3_5_text"])
def test_static_read_copy_as_a_user_would_use_it(model_type):
    """A static cache with a read copy through a continuation (the positions go back to the host for the new
    prompt tokens, which read the copy the device re-encoded), reset() and reuse compiled, each equal to a dynamic
    cache with the same policy."""
    model = _model(model_type)
    prompt = _prompt(model)
    kw = dict(do_sample=False, max_new_tokens=9, min_new_tokens=9)
    dynamic = ReplayCache(4, precision="separated-nvfp4")
    first_d = model.generate(prompt, past_key_values=dynamic, **kw)
    second_d = model.generate(first_d, past_key_values=dynamic, **kw)
    cache = ReplayCache(4, precision="separated-nvfp4", max_cache_len=prompt.shape[1] + 18)
    first = model.generate(prompt, past_key_values=cache, **kw)
    second = model.generate(first, past_key_values=cache, **kw)
    assert torch.equal(first, first_d) and torch.equal(second, second_d)
    assert cache.stats() == dynamic.stats()
    cache.reset()
    torch._dynamo.reset()
    again = model.generate(prompt, past_key_values=cache, compile_config=_compile_config(), **kw)
    assert torch.equal(again, first)


def test_static_cache_refuses_what_it_cannot_do():
    model = _model("qwen3_5_text")
    prompt = _prompt(model, rows=1)
    cache = ReplayCache(4, max_cache_len=64)
    model.generate(prompt, past_key_values=cache, max_new_tokens=5)
    with pytest.raises(RollbackError, match="only the last 0"):  # tokens fed outside speculation stay
        cache.crop(-1)
    with pytest.raises(ValueError, match="float32-checkpoint"):  # it would decode eagerly, and transformers'
        ReplayCache(4, precision="shared-fp8", max_cache_len=64).bind(model)  # masks need a compileable cache
    with pytest.raises(ValueError, match="ShortConv"):
        ReplayCache(4, max_cache_len=64).bind(_model("lfm2"))
    with pytest.raises(ValueError, match="max_cache_len"):
        ReplayCache(4, max_cache_len=0)
    with pytest.raises(ValueError, match="max_cache_len=16"):
        model.generate(prompt, past_key_values=ReplayCache(4, max_cache_len=12), max_new_tokens=5)


@pytest.mark.parametrize("model_type", ["nemotron_h", "kimi_linear"])
def test_compiled_step_takes_the_packed_operands_once(model_type):
    """A compiled decode step's graph takes the SSM layers' operands as the decode pack's tensors, once for all the
    layers (checkpoint, each record field, conv window, positions: each [layers, ...], sliced inside the graph), and
    nothing through a layer's own positions: every graph input is host work before each CUDA-graph replay
    (BENCHMARKS.md, fiftieth session). The layers' own tensors are slices of the packed ones, and the step counters
    advanced through them."""
    inputs = []

    def recording_backend(gm, example_inputs):
        inputs.append([node.name for node in gm.graph.nodes if node.op == "placeholder"])
        return gm.forward

    model = _model(model_type)
    prompt = _prompt(model, rows=1)
    cache = ReplayCache(4, max_cache_len=prompt.shape[1] + 6)
    torch._dynamo.reset()
    model.generate(prompt, past_key_values=cache, compile_config=_compile_config(recording_backend), do_sample=False,
                   max_new_tokens=6)
    assert len(inputs) == 1, "one compiled decode graph"
    assert not [name for name in inputs[0] if "_positions_" in name], inputs[0]
    pack = cache.decode_pack
    assert pack is not None and len(cache.replay_layers) >= 2
    packed = [name for name in inputs[0] if "decode_pack" in name]
    fields = len(pack.fields)
    assert len(packed) == 3 + fields, packed  # checkpoint, conv window, positions, the record fields
    for slot, (idx, layer) in enumerate(cache.replay_layers.items()):
        assert pack.slots[idx] == slot
        positions = layer.schedule.device_positions
        assert positions.steps_taken() > 0  # the counter view advanced through the packed positions
        assert positions.positions.data_ptr() == pack.positions[slot].data_ptr()
        assert layer.schedule.store.kernel_operands()[0].data_ptr() == pack.state[slot].data_ptr()
        for name, field in layer.ring.fields.items():
            assert field.data_ptr() == pack.fields[name][slot].data_ptr()


def test_layer_questions_follow_the_layer_list():
    """is_compileable / is_linear / get_seq_length / replay_layers are worked out once per layer list (generate
    asks them every step): a rebuilt, grown or unpickled list is described anew, and a cache whose model is gone
    is not compileable."""
    import gc
    import pickle

    from transformers.cache_utils import LinearAttentionLayer

    model = _model("nemotron_h")
    prompt = _prompt(model, rows=1)
    cache = ReplayCache(4, max_cache_len=prompt.shape[1] + 8)
    assert not cache.is_compileable  # unbound
    model.generate(prompt, past_key_values=cache, do_sample=False, max_new_tokens=3)
    replay = cache.replay_layers
    assert cache.is_compileable and replay == {i: layer for i, layer in enumerate(cache.layers)
                                               if type(layer).__name__ == "ReplayLayer"}
    assert cache.get_seq_length() == prompt.shape[1] + 2
    linear = cache.is_linear
    assert len(linear) == len(cache.layers) and not all(linear)
    replay.clear()  # a copy: the cache's own view is untouched
    assert cache.replay_layers
    cache.layers.append(LinearAttentionLayer())  # grown in place: described anew
    assert len(cache.is_linear) == len(linear) + 1 and cache.is_linear[-1]
    cache.layers.pop()
    copy = pickle.loads(pickle.dumps(cache))
    assert not copy.is_compileable  # unbound until its next use
    assert set(copy.replay_layers) == set(cache.replay_layers)
    assert all(a is not b for a, b in zip(copy.replay_layers.values(), cache.replay_layers.values(), strict=True))
    dynamic = ReplayCache(4)
    model.generate(prompt, past_key_values=dynamic, do_sample=False, max_new_tokens=3)
    before = dynamic.replay_layers
    dynamic.reset()  # a dynamic cache rebuilds its layers
    after = dynamic.replay_layers
    assert set(after) == set(before) and all(after[i] is not before[i] for i in after)
    assert not dynamic.is_compileable
    del model
    gc.collect()
    assert not cache.is_compileable  # its model is gone


def test_static_reset_keeps_storage_and_graphs():
    """reset() of a static cache keeps every tensor: a second compiled generate on it reuses the graph (no guard
    fails, no recompilation) and repeats the first one exactly; another batch size is a clear error."""
    from torch._dynamo.utils import counters, guard_failures

    model = _model("qwen3_5_text")
    prompt = _prompt(model)
    cache = ReplayCache(4, max_cache_len=prompt.shape[1] + NEW)
    torch._dynamo.reset()
    first = model.generate(prompt, past_key_values=cache, compile_config=_compile_config(), **GREEDY)
    layer = next(iter(cache.replay_layers.values()))
    addresses = [t.data_ptr() for t in (layer.store.kernel_operands()[0], *layer.ring.fields.values(),
                                        layer.schedule.device_positions.count, layer.schedule.device_positions.conv)]
    cache.reset()
    counters.clear()
    guard_failures.clear()
    second = model.generate(prompt, past_key_values=cache, compile_config=_compile_config(), **GREEDY)
    assert not counters["stats"]["unique_graphs"] and not any(guard_failures.values())
    assert torch.equal(first.sequences, second.sequences)
    assert all(torch.equal(a, b) for a, b in zip(first.logits, second.logits, strict=True))
    assert addresses == [t.data_ptr() for t in (layer.store.kernel_operands()[0], *layer.ring.fields.values(),
                                                layer.schedule.device_positions.count,
                                                layer.schedule.device_positions.conv)]
    cache.reset()
    with pytest.raises(ValueError, match="batch size 2"):
        model.generate(prompt[:1], past_key_values=cache, max_new_tokens=3)


@pytest.mark.parametrize("model_type", ["qwen3_5_text", "falcon_h1", "zamba2"])  # the last two: SSM + attention layers
def test_static_cache_as_a_user_would_use_it(model_type):
    """Reuse with a continuation, beam search, sampled return sequences and pickling, each equal to stock."""
    import pickle

    model = _model(model_type)
    prompt = _prompt(model)
    kw = dict(do_sample=False, max_new_tokens=8, min_new_tokens=8)
    cache = ReplayCache(4, max_cache_len=40)
    first = model.generate(prompt, past_key_values=cache, **kw)
    second = model.generate(first, past_key_values=cache, **kw)  # continues from the cached prefix
    assert torch.equal(second, model.generate(prompt, do_sample=False, max_new_tokens=16, min_new_tokens=16))
    beams = model.generate(prompt, past_key_values=ReplayCache(4, max_cache_len=40), num_beams=2, **kw)
    assert torch.equal(beams, model.generate(prompt, num_beams=2, **kw))
    torch.manual_seed(0)
    sampled = model.generate(prompt, past_key_values=ReplayCache(4, max_cache_len=40), do_sample=True,
                             num_return_sequences=2, max_new_tokens=8)
    torch.manual_seed(0)
    assert torch.equal(sampled, model.generate(prompt, do_sample=True, num_return_sequences=2, max_new_tokens=8))
    copy = pickle.loads(pickle.dumps(cache))
    with torch.no_grad():
        ours = model(second[:, -1:], past_key_values=cache).logits
        theirs = model(second[:, -1:], past_key_values=copy).logits
    assert torch.equal(ours, theirs)


@pytest.mark.parametrize("model_type", ["nemotron_h", "qwen3_5_text"])
def test_left_padding_and_prefill_chunks(model_type):
    """Left-padded rows (eager and compiled) and transformers' chunked prefill, equal to stock decoding."""
    model = _model(model_type)
    prompt = _prompt(model, length=12)
    mask = torch.ones_like(prompt)
    mask[0, :4] = 0
    prompt[0, :4] = model.config.pad_token_id or 0
    kw = dict(GREEDY, max_new_tokens=10, min_new_tokens=10)
    stock = model.generate(prompt, attention_mask=mask, **kw)
    out = model.generate(prompt, attention_mask=mask, past_key_values=ReplayCache(4, max_cache_len=22), **kw)
    assert torch.equal(out.sequences, stock.sequences) and max_logit_diff(out.logits, stock.logits) < 1e-4
    torch._dynamo.reset()
    out = model.generate(prompt, attention_mask=mask, past_key_values=ReplayCache(4, max_cache_len=22),
                         compile_config=_compile_config("eager"), **kw)
    assert torch.equal(out.sequences, stock.sequences) and max_logit_diff(out.logits, stock.logits) < 1e-4
    stock = model.generate(prompt, prefill_chunk_size=5, **kw)
    out = model.generate(prompt, prefill_chunk_size=5, past_key_values=ReplayCache(4, max_cache_len=22), **kw)
    assert torch.equal(out.sequences, stock.sequences) and max_logit_diff(out.logits, stock.logits) < 1e-4


class _HostReads:
    """Counts the tensor methods that read a value on the host (a device synchronisation on a GPU), except inside
    the decode-step ops' torch references (``hf_replayssm/ops/``), which stand in for the Triton kernels on CPU: those
    read each row's positions on the host, the kernels read them on the device."""

    METHODS = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__", "cpu", "numpy")
    REFERENCES = os.path.join("hf_replayssm", "ops", "")

    def __init__(self, monkeypatch):
        self.count = 0
        for name in self.METHODS:
            original = getattr(torch.Tensor, name)

            def counted(tensor, *args, _original=original, **kwargs):
                if not self._inside_a_reference():
                    self.count += 1
                return _original(tensor, *args, **kwargs)

            monkeypatch.setattr(torch.Tensor, name, counted)

    def _inside_a_reference(self) -> bool:
        frame = sys._getframe(2)
        while frame is not None:
            if self.REFERENCES in frame.f_code.co_filename:
                return True
            frame = frame.f_back
        return False


@pytest.mark.parametrize("model_type", [*FAMILIES, "falcon_h1"])  # falcon_h1: SSM and attention in one layer
@pytest.mark.parametrize("policy", ["fp32", "separated-nvfp4"])
def test_decode_steps_add_no_host_reads(model_type, policy, monkeypatch):
    """What a decode step of a static ReplayCache reads on the host, beyond what stock static decoding reads:
    nothing (a compiled step could not be captured in a CUDA graph otherwise). Counted per extra generated token:
    generate itself reads a value per step in either arm."""
    model = _model(model_type)
    prompt = _prompt(model)
    reads = _HostReads(monkeypatch)

    def per_token(make_kwargs) -> float:
        counts = []
        for new in (6, 14):
            reads.count = 0
            model.generate(prompt, do_sample=False, max_new_tokens=new, min_new_tokens=new, **make_kwargs())
            counts.append(reads.count)
        return (counts[1] - counts[0]) / 8

    stock = per_token(lambda: dict(cache_implementation="static"))
    replay = per_token(lambda: dict(past_key_values=ReplayCache(4, precision=policy,
                                                               max_cache_len=prompt.shape[1] + 14)))
    assert replay == stock, (replay, stock)


def test_pure_mamba2_static_cache_compiles():
    """A static ReplayCache on a model with no attention at all (mamba2): its layers say they are linear, as stock's
    do, so generate() builds no attention masks for the compiled step (it did, and the model refused a mask dict);
    eager equals stock, compiled is one graph equal to eager. A dynamic cache keeps reporting them as not linear, so
    that a reused cache continues from where it stopped."""
    from hf_replayssm import cache_argument

    model = _model("mamba2")
    prompt = _prompt(model)
    key = cache_argument(model)
    stock = model.generate(prompt, **GREEDY)
    cache = ReplayCache(4, max_cache_len=prompt.shape[1] + NEW)
    eager = model.generate(prompt, **{key: cache}, **GREEDY)
    assert all(cache.is_linear) and cache.is_compileable
    assert torch.equal(eager.sequences, stock.sequences) and max_logit_diff(eager.logits, stock.logits) < 1e-4
    out = generate_compiled_once(model, prompt, ReplayCache(4, max_cache_len=prompt.shape[1] + NEW), _compile_config(),
                                 **GREEDY)
    assert torch.equal(out.sequences, eager.sequences) and max_logit_diff(out.logits, eager.logits) < 1e-5
    dynamic = ReplayCache(4)
    model.generate(prompt, **{key: dynamic}, max_new_tokens=2)
    assert not any(dynamic.is_linear)


@pytest.mark.parametrize("model_type", ["nemotron_h", "qwen3_5_text"])
def test_decode_pack_through_reuse_and_speculation(model_type):
    """The decode pack as a user meets it, compiled: plain decoding packs the layers (memory report unchanged), a reset
    and a second call reuse the same packed storage, speculative calls on the same cache verify on the layers' slices
    (the rings grow for the windows once: plain decoding then packs anew, and from there alternating calls keep every
    address and compile nothing new); every call gives stock greedy's tokens and logits."""
    from torch._dynamo.utils import counters

    model = _model(model_type)
    prompt = _prompt(model, rows=1, length=13)
    settings = dict(do_sample=False, max_new_tokens=9, min_new_tokens=9, output_logits=True,
                    return_dict_in_generate=True, suppress_tokens=[0])
    stock = model.generate(prompt, **settings)
    cache = ReplayCache(4, max_cache_len=prompt.shape[1] + 9 + 8)
    config = _compile_config()

    def run(**kwargs):
        cache.reset()
        out = model.generate(prompt, past_key_values=cache, compile_config=config, **kwargs, **settings)
        assert torch.equal(out.sequences, stock.sequences)
        assert max_logit_diff(out.logits, stock.logits) < 1e-4
        return cache.decode_pack

    torch._dynamo.reset()
    first = run()
    assert first is not None and first.phase == 1
    for layer in cache.replay_layers.values():
        assert layer.schedule.device_positions.pack is first
    memory = cache.memory()
    assert memory["checkpoint"] == sum(layer.schedule.state_numel() * 4 for layer in cache.replay_layers.values())
    state = first.state.data_ptr()
    assert run() is first and first.state.data_ptr() == state  # same addresses: no re-recorded graph
    run(prompt_lookup_num_tokens=3)
    assert cache.stats()["rolled_back_tokens"] + cache.stats()["decode_steps"] > 0
    second = run()
    assert second is not None and second.phase == 1
    graphs, state = counters["stats"]["unique_graphs"], second.state.data_ptr()
    for _ in range(2):
        run(prompt_lookup_num_tokens=3)
        assert run() is second and second.state.data_ptr() == state
    assert counters["stats"]["unique_graphs"] == graphs  # nothing compiled anew
    for slot, layer in enumerate(cache.replay_layers.values()):
        assert layer.schedule.store.kernel_operands()[0].data_ptr() == second.state[slot].data_ptr()


def test_decode_pack_after_speculation_under_inductor():
    """Plain compiled decoding, then speculation on the same static cache (its rings grow for the windows), then plain
    decoding again on a new pack of other shapes, through Inductor: the same logits as stock greedy at every step. The
    new pack's sizes must stay constants (``torch._dynamo.mark_static``): with them symbolic, Inductor handed every
    layer's op the first layer's ring and the third call diverged from its second decode step."""
    model = _model("nemotron_h")
    prompt = _prompt(model, rows=1, length=13)
    settings = dict(do_sample=False, max_new_tokens=6, min_new_tokens=6, output_logits=True,
                    return_dict_in_generate=True, suppress_tokens=[0])
    stock = model.generate(prompt, **settings)
    cache = ReplayCache(4, max_cache_len=prompt.shape[1] + 6 + 8)
    config = _compile_config("inductor")
    torch._dynamo.reset()
    for lookup in (None, 3, None):
        cache.reset()
        out = model.generate(prompt, past_key_values=cache, compile_config=config, prompt_lookup_num_tokens=lookup,
                             **settings)
        assert torch.equal(out.sequences, stock.sequences), lookup
        assert max_logit_diff(out.logits, stock.logits) < 1e-4, lookup
    assert cache.decode_pack is not None and cache.decode_pack.phase == 1


def test_pickled_static_cache_decodes_compiled_again():
    """A used static cache pickled or deep-copied (unbound: no model, no decode pack) and reset stays static: compiled
    decoding on it gives stock greedy's tokens and logits and packs its layers again. (An unbound cache's reset used
    to rebuild its layers' schedules as dynamic ones, and the compiled step then fell back to the host schedule.)"""
    import copy
    import pickle

    model = _model("nemotron_h")
    prompt = _prompt(model, rows=2, length=13)
    settings = dict(do_sample=False, max_new_tokens=7, min_new_tokens=7, output_logits=True,
                    return_dict_in_generate=True, suppress_tokens=[0])
    stock = model.generate(prompt, **settings)
    cache = ReplayCache(4, max_cache_len=prompt.shape[1] + 12)
    config = _compile_config()
    model.generate(prompt, past_key_values=cache, compile_config=config, **settings)
    assert cache.decode_pack is not None
    for clone in (pickle.loads(pickle.dumps(cache)), copy.deepcopy(cache)):
        assert clone.decode_pack is None
        assert all(layer.positions.pack is None for layer in clone.replay_layers.values())
        clone.reset()
        assert all(layer.schedule.static for layer in clone.replay_layers.values())
        out = model.generate(prompt, past_key_values=clone, compile_config=config, **settings)
        assert torch.equal(out.sequences, stock.sequences)
        assert max_logit_diff(out.logits, stock.logits) < 1e-4
        assert clone.decode_pack is not None and clone.decode_pack.phase == 1


def test_decode_pack_rows_stay_constants_in_a_dynamic_trace():
    """Dynamo makes an int it sees change between compiles of one frame symbolic (another model compiled before in
    the process; ``dynamic=True`` does it at once), and a pack sliced at a symbolic row reached the decode-step ops at
    the wrong offset under Inductor. The pack's rows are constants in the trace whatever Dynamo's dynamism: no graph
    input comes from them."""
    from torch._dynamo.utils import counters

    model = tiny_model("falcon_h1", seed=0, initializer_range=0.2)  # every layer an SSM layer: rows 0 to 3
    prompt = _prompt(model, rows=2, length=9)
    inputs = []

    def capture(gm, example_inputs):
        inputs.extend(node.name for node in gm.graph.nodes if node.op == "placeholder")
        return gm.forward

    config = CompileConfig(fullgraph=True, backend=capture, mode=None, dynamic=True)
    config._compile_all_devices = True
    torch._dynamo.reset()
    counters.clear()
    cache = ReplayCache(4, max_cache_len=prompt.shape[1] + 6)
    model.generate(prompt, past_key_values=cache, compile_config=config, **dict(GREEDY, max_new_tokens=6,
                                                                                min_new_tokens=6))
    assert cache.decode_pack is not None and any("decode_pack_state" in name for name in inputs), inputs
    assert not [name for name in inputs if "decode_pack_slots" in name or "decode_pack_rows" in name], inputs


def test_inductor_after_another_model_compiled():
    """The run that found it (an H100, run 239, the CUDA-graph tests in one process): a static cache compiled under
    Inductor for a model whose packed rows differ from the model compiled before it in the same process (no Dynamo
    reset between them) gives the eager tokens and logits. Before the fix its first compiled step was off by 0.7."""
    first = tiny_model("kimi_linear", seed=0, initializer_range=0.2)  # three SSM layers and an attention layer
    model = tiny_model("falcon_h1", seed=0, initializer_range=0.2)
    config = _compile_config("inductor")
    torch._dynamo.reset()
    for current in (first, model):
        prompt = _prompt(current, rows=2, length=9)
        settings = dict(GREEDY, max_new_tokens=8, min_new_tokens=8)
        eager = current.generate(prompt, past_key_values=ReplayCache(4, max_cache_len=17), **settings)
        out = current.generate(prompt, past_key_values=ReplayCache(4, max_cache_len=17), compile_config=config,
                               **settings)
        assert torch.equal(out.sequences, eager.sequences), type(current).__name__
        assert max_logit_diff(out.logits, eager.logits) < 1e-4, type(current).__name__
