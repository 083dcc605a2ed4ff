"""``PackedRollback``: a per-row rollback writes every SSM layer's neutral records and conv windows at once, from
buffers packed into one tensor per kind; the cache must decode exactly as with one write per layer, repack after
a ring grows, and let packed storage go with the layers."""

from __future__ import annotations

import gc

import pytest
import torch
from test_batched_speculation import PROMPT, ROWS, _model, run_rounds

from hf_replayssm import ReplayCache
from hf_replayssm.packed_rollback import PackedRollback

ROUNDS = [(3, [0, 2, 1]), (4, [3, 0, 2]), (2, [1, 1, 0]), (4, [0, 3, 3]), (3, [2, 0, 0])]


def _run(model_type, packed: bool, monkeypatch, rounds=ROUNDS, seed=7):
    model = _model(model_type)
    prompt = torch.randint(3, model.config.vocab_size, (ROWS, PROMPT), generator=torch.Generator().manual_seed(seed))
    cache = ReplayCache(4, window=4)
    with monkeypatch.context() as patch:
        if not packed:
            patch.setattr(PackedRollback, "pack", classmethod(lambda cls, schedules: None))
        kept, logits = run_rounds(model, cache, prompt, rounds, seed)
    return cache, kept, logits


def _buffers(cache):
    return [(dict(layer.schedule.ring.fields), layer.schedule.conv.buffer) for layer in cache.replay_layers.values()]


@pytest.mark.parametrize("model_type", ["qwen3_5_text", "nemotron_h", "kimi_linear"])
def test_packed_rollback_equals_one_write_per_layer(model_type, monkeypatch):
    packed_cache, kept, logits = _run(model_type, True, monkeypatch)
    plain_cache, kept_plain, logits_plain = _run(model_type, False, monkeypatch)
    assert kept == kept_plain
    for ours, theirs in zip(logits, logits_plain, strict=True):
        assert torch.isfinite(ours).all() and torch.equal(ours, theirs)
    assert packed_cache._packed_rollback is not None and plain_cache._packed_rollback is None
    # every layer's ring field and conv window is a slice of one tensor, holding what the unpacked cache holds
    layers = _buffers(packed_cache)
    assert len(layers) >= 2
    for name in layers[0][0]:
        bases = {fields[name]._base.data_ptr() for fields, _ in layers}
        assert len(bases) == 1, name
    assert len({conv._base.data_ptr() for _, conv in layers}) == 1
    for (fields, conv), (plain_fields, plain_conv) in zip(layers, _buffers(plain_cache), strict=True):
        assert torch.equal(conv, plain_conv)
        for name, value in fields.items():
            assert torch.equal(value, plain_fields[name]), name
    assert packed_cache.stats()["rolled_back_tokens"] == plain_cache.stats()["rolled_back_tokens"] > 0


def test_repacks_after_the_ring_grows_and_frees_old_storage(monkeypatch):
    model_type = "qwen3_5_text"
    cache, _, _ = _run(model_type, True, monkeypatch, rounds=ROUNDS[:2])
    packed = cache._packed_rollback
    assert packed.holds([layer.schedule for layer in cache.replay_layers.values()])
    old = packed._fields["d"]
    assert old() is not None
    for layer in cache.replay_layers.values():
        layer.schedule.reserve_window(8)  # new, larger rings: the packed slices are left behind
    schedules = [layer.schedule for layer in cache.replay_layers.values()]
    assert not packed.holds(schedules)
    gc.collect()
    assert old() is None, "the packed ring stayed alive after every layer let go of it"
    with torch.no_grad():
        _model(model_type)(torch.randint(3, 100, (ROWS, 3)), past_key_values=cache, use_cache=True)
    cache.drop_rows([1, 0, 2])
    assert cache._packed_rollback is not packed and cache._packed_rollback.holds(schedules)


def test_unpackable_layers_keep_their_own_writes():
    """Fewer than two SSM layers, conv-only layers, or layers at different positions are not packed."""
    assert not PackedRollback.packable([])
    conv_only = _rolled_back("lfm2")
    assert conv_only._packed_rollback is None and len(conv_only.replay_layers) >= 2
    schedules = [layer.schedule for layer in _rolled_back("qwen3_5_text").replay_layers.values()]
    assert PackedRollback.packable(schedules)
    assert not PackedRollback.packable(schedules[:1])
    schedules[0].ring.origin = (schedules[0].ring.origin + 1) % schedules[0].ring.capacity
    assert not PackedRollback.packable(schedules)


def _rolled_back(model_type):
    model = _model(model_type)
    prompt = torch.randint(3, 100, (ROWS, PROMPT), generator=torch.Generator().manual_seed(2))
    cache = ReplayCache(4, window=4)
    run_rounds(model, cache, prompt, ROUNDS[:2], 2)
    return cache


def _rollback_launches(ssm_layers: int) -> int:
    """ATen operations that launch a kernel on a GPU (views and allocations excluded) in one per-row rollback of a
    Qwen3.5-like tiny model with ``ssm_layers`` GDN layers and one attention layer."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from hf_replayssm.tiny import tiny_model

    no_launch = {"view", "slice", "select", "unsqueeze", "expand", "alias", "empty", "_unsafe_view", "detach",
                 "as_strided", "empty_like", "squeeze"}
    ops = []

    class Launches(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.overloadpacket.__name__
            if name not in no_launch:
                ops.append(name)
            return func(*args, **(kwargs or {}))

    layer_types = ["linear_attention"] * ssm_layers + ["full_attention"]
    model = tiny_model("qwen3_5_text", seed=0, initializer_range=0.2, num_hidden_layers=len(layer_types),
                       layer_types=layer_types)
    prompt = torch.randint(3, model.config.vocab_size, (ROWS, PROMPT), generator=torch.Generator().manual_seed(3))
    cache = ReplayCache(8, window=4)  # no flush boundary inside the measured window (a crossed one stores each
    run_rounds(model, cache, prompt, ROUNDS[:1], 3)  # layer's checkpoint, as plain decoding does); this packs
    window = torch.randint(3, model.config.vocab_size, (ROWS, 3), generator=torch.Generator().manual_seed(4))
    mask = torch.ones(ROWS, cache.get_seq_length() + 3, dtype=torch.long)
    with torch.no_grad():
        model(window, attention_mask=mask, past_key_values=cache, use_cache=True)
    with Launches():
        cache.drop_rows([2, 0, 1])
    return len(ops)


def test_rollback_launches_do_not_grow_with_the_layers():
    """A per-row rollback launches as many kernels for six SSM layers as for two (each layer's writes were a few
    launches of tens of microseconds of host work each on CUDA, the rollback's whole cost on an H200)."""
    two, six = _rollback_launches(2), _rollback_launches(6)
    assert two == six, (two, six)
    assert 0 < six <= 12, six
