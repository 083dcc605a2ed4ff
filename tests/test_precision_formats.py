"""Storage formats: bit layouts against hand-computed values, rounding rules, error bounds, stochastic rounding;
the checkpoint store: per-row policies, memory."""

import pytest
import torch

from hf_replayssm.precision import PRESETS, CheckpointStore, PrecisionPolicy
from hf_replayssm.precision.formats import (
    E2M1_GRID,
    NoiseKey,
    e2m1_decode,
    e2m1_encode,
    e4m3_decode,
    e4m3_encode,
    get_format,
    pack_nibbles,
    philox4x32,
    sr_uniforms,
    stochastic_round,
    unpack_nibbles,
)


def test_e2m1_grid_and_codes():
    grid = torch.tensor(E2M1_GRID)
    assert E2M1_GRID == (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
    assert e2m1_encode(grid).tolist() == list(range(8))
    assert e2m1_encode(-grid[1:]).tolist() == list(range(9, 16))  # sign is bit 3
    assert torch.equal(e2m1_decode(torch.arange(16, dtype=torch.uint8)), torch.cat([grid, -grid]))


def test_e2m1_round_to_nearest_even():
    # midpoints go to the neighbour with the even code (mantissa bit 0)
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    assert e2m1_decode(e2m1_encode(ties)).tolist() == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0]
    near = torch.tensor([0.26, 0.74, 1.3, 2.49, 2.51, 4.9, 5.1, 7.0, 1e9, -0.2, -5.5])
    assert e2m1_decode(e2m1_encode(near)).tolist() == [0.5, 0.5, 1.5, 2.0, 3.0, 4.0, 6.0, 6.0, 6.0, 0.0, -6.0]


def test_nibble_packing_order():
    codes = torch.tensor([1, 2, 3, 4, 15, 0], dtype=torch.uint8)
    packed = pack_nibbles(codes)
    assert packed.tolist() == [0x21, 0x43, 0x0F]  # element 2i in the low nibble
    assert torch.equal(unpack_nibbles(packed), codes)


def test_e4m3_bits():
    values = torch.tensor([1.0, 1.0625, 1.1875, 448.0, 1000.0, 2.0**-9, 2.0**-11, -2.0, 0.0])
    # 1.0625 ties between 1.0 (mantissa 0) and 1.125 (mantissa 1): even -> 1.0; 1.1875 -> 1.25 (mantissa 2)
    assert e4m3_encode(values).tolist() == [0x38, 0x38, 0x3A, 0x7E, 0x7E, 0x01, 0x00, 0xC0, 0x00]
    assert e4m3_decode(torch.tensor([0x38, 0x3A, 0x7E, 0x01], dtype=torch.uint8)).tolist() == [
        1.0, 1.25, 448.0, 2.0**-9]


def test_nvfp4_hand_computed_block():
    v = torch.tensor([6, -3, 1.5, 0.5, 0, 0.25, 0.75, 1.25, 2.5, 5, 4, 1, 2, 3.5, -6, 0])
    x = (v * 448 / 512).view(1, 1, 16)  # block amax 6*448/512
    fmt = get_format("nvfp4")
    enc = fmt.encode(x)
    # tensor scale = amax / (6*448) = 1/512; block scale = amax / 6 / (1/512) = 448 -> E4M3 0x7E; x / (448/512) = v
    assert enc["tensor_scale"].tolist() == [1 / 512]
    assert enc["block_scale"].flatten().tolist() == [0x7E]
    # codes 7,13 | 3,1 | 0,0 | 2,2 | 4,6 | 6,2 | 4,6 | 15,0  (ties 0.25->0, 0.75->1, 1.25->1, 2.5->2, 5->4, 3.5->4)
    assert enc["packed"].flatten().tolist() == [0xD7, 0x13, 0x00, 0x22, 0x64, 0x26, 0x64, 0x0F]
    expected = torch.tensor([6, -3, 1.5, 0.5, 0, 0, 1, 1, 2, 4, 4, 1, 2, 4, -6, 0]) * 448 / 512
    assert torch.equal(fmt.decode(enc).flatten(), expected)


def test_nvfp4_layout_and_error_bound():
    x = torch.randn(3, 4, 8, 40) * torch.logspace(-3, 2, 40)  # rows of 40: padded to 48 = 3 blocks
    fmt = get_format("nvfp4")
    enc = fmt.encode(x)
    assert enc["packed"].shape == (3, 4, 8, 24) and enc["packed"].dtype == torch.uint8
    assert enc["block_scale"].shape == (3, 4, 8, 3) and enc["tensor_scale"].shape == (3,)
    err = (fmt.decode(enc) - x).abs()
    padded = torch.nn.functional.pad(x, (0, 8)).unflatten(-1, (3, 16)).abs().amax(-1, keepdim=True)
    block_amax = padded.expand(-1, -1, -1, -1, 16).flatten(-2)[..., :40]
    floor = x.abs().flatten(1).amax(1).view(3, 1, 1, 1) / (6 * 448) * 2.0**-9
    assert (err <= (1 + 2**-4) / 6 * block_amax + floor).all()
    assert fmt.bytes_per_element(128) == 0.5625


def test_fp8_row_scaling_and_error_bound():
    x = torch.randn(2, 3, 5, 64) * torch.logspace(-4, 1, 64)
    fmt = get_format("fp8")
    enc = fmt.encode(x)
    assert enc["codes"].dtype == torch.uint8 and enc["scale"].shape == (2, 3, 5, 1)
    amax = x.abs().amax(-1, keepdim=True)
    torch.testing.assert_close(enc["scale"], amax / 448)
    err = (fmt.decode(enc) - x).abs()
    assert (err <= torch.maximum(x.abs() * 2.0**-4, amax / 448 * 2.0**-10)).all()
    exact = torch.tensor([[448.0, 1.0, -1.25, 0.001953125]])  # representable once scaled by 1
    assert torch.equal(fmt.decode(fmt.encode(exact)), exact)
    zero = torch.zeros(1, 4)
    assert torch.equal(fmt.decode(fmt.encode(zero)), zero)


@pytest.mark.parametrize("name", ["bf16", "fp16"])
def test_round_to_nearest_half_formats(name):
    fmt = get_format(name)
    x = torch.randn(10000) * 10
    rel = ((fmt.decode(fmt.encode(x)) - x).abs() / x.abs()).max()
    assert rel <= (2.0**-8 if name == "bf16" else 2.0**-11)
    if name == "fp16":
        assert fmt.decode(fmt.encode(torch.tensor([1e5]))).item() == 65504.0  # saturates instead of inf


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_stochastic_rounding_is_unbiased_and_reproducible(dtype):
    # values between representable neighbours, including fp16 subnormals; row i rounds with the noise of position i
    x = torch.tensor([1.0 + 2.0**-12, -3.3, 1e-3, 6.0e-6, 12345.678]).repeat(40000, 1)
    positions = torch.arange(x.shape[0]).unsqueeze(1)
    first = stochastic_round(x, dtype, sr_uniforms(1, 0, positions, x.shape[1:]))
    again = stochastic_round(x, dtype, sr_uniforms(1, 0, positions, x.shape[1:]))
    other = stochastic_round(x, dtype, sr_uniforms(2, 0, positions, x.shape[1:]))
    assert torch.equal(first, again) and not torch.equal(first, other)
    lo, hi = first.float().amin(0), first.float().amax(0)
    assert (lo <= x[0]).all() and (hi >= x[0]).all() and (hi - lo > 0).all()  # both neighbours occur
    # mean within 4 standard errors of the exact value (variance <= (hi-lo)^2 / 4)
    stderr = (hi - lo) / 2 / x.shape[0] ** 0.5
    assert ((first.float().mean(0) - x[0]).abs() <= 4 * stderr).all()
    assert ((first.float() - x).abs() <= (hi - lo)).all()  # less than one ulp away
    # exact values and the saturation bound never move
    exact = torch.tensor([[0.0, 1.0, -2.5, 65504.0 if dtype == torch.float16 else 2.0**100]])
    assert torch.equal(stochastic_round(exact, dtype, torch.full((1, 4), 0.999)).float(), exact)


# Random123 known-answer vectors: counter[4], key[2] -> output[4]
PHILOX_KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


def _philox_reference(counter, key, rounds=10):
    """Philox-4x32 on Python ints, straight from the definition (the spec a GPU kernel reproduces)."""
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for _ in range(rounds):
        p0, p1 = 0xD2511F53 * c0, 0xCD9E8D57 * c2
        c0, c1, c2, c3 = (p1 >> 32) ^ c1 ^ k0, p1 & 0xFFFFFFFF, (p0 >> 32) ^ c3 ^ k1, p0 & 0xFFFFFFFF
        k0, k1 = (k0 + 0x9E3779B9) & 0xFFFFFFFF, (k1 + 0xBB67AE85) & 0xFFFFFFFF
    return c0, c1, c2, c3


def test_philox_known_answers():
    for counter, key, expected in PHILOX_KAT:
        assert tuple(int(v) for v in philox4x32(counter, key)) == expected
        assert _philox_reference(counter, key) == expected


def test_sr_uniforms_are_the_documented_function():
    seed, layer, position = 0x1234ABCD, 7, 3_000_000_123
    u = sr_uniforms(seed, layer, position, (3, 5, 7))
    assert u.shape == (3, 5, 7) and u.dtype == torch.float32
    flat = u.flatten()
    for e in (0, 1, 2, 50, 104):
        bits = _philox_reference((e, position, 0, 0), (seed, layer))[0]
        assert flat[e].item() == (bits >> 8) * 2.0**-24
    assert ((flat * 2**24) == (flat * 2**24).round()).all() and (flat >= 0).all() and (flat < 1).all()
    assert torch.equal(NoiseKey(seed, layer, position).uniforms(torch.zeros(4, 3, 5, 7)), u)
    # seeds and layers beyond 32 bits are taken mod 2^32
    assert torch.equal(sr_uniforms(seed + 2**32, layer - 2**32, position, (3, 5, 7)), u)


def test_sr_noise_depends_on_seed_layer_position_and_element():
    shape = (4, 16, 16)
    base = sr_uniforms(0, 0, 0, shape)
    assert base.unique().numel() > 0.99 * base.numel()  # every element has its own noise
    for other in (sr_uniforms(1, 0, 0, shape), sr_uniforms(0, 1, 0, shape), sr_uniforms(0, 0, 1, shape)):
        assert (other != base).float().mean() > 0.99
    assert abs(base.mean().item() - 0.5) < 0.05  # roughly uniform
    assert torch.equal(sr_uniforms(0, 0, 0, shape), base)  # a pure function


@pytest.mark.parametrize("name", ["fp16", "bf16"])
def test_sr_row_rounds_the_same_in_any_batch(name):
    """Regression: the noise was drawn for the whole [batch, ...] tensor from one generator, so a row rounded
    differently as row 1 of a batch of 3 than alone."""
    fmt = get_format(name, stochastic_rounding=True)
    row = torch.randn(1, 4, 8, 16) * torch.logspace(-3, 2, 16)
    batch = torch.cat([torch.randn(1, 4, 8, 16), row, torch.randn(1, 4, 8, 16)])
    key = NoiseKey(seed=5, layer=3, position=17)
    alone = fmt.encode(row, key)["values"]
    together = fmt.encode(batch, key)["values"]
    assert torch.equal(together[1:2], alone)
    assert torch.equal(fmt.encode(row, key)["values"], alone)  # same inputs, same bits
    assert torch.equal(fmt.encode(row.expand(3, -1, -1, -1), key)["values"], alone.expand(3, -1, -1, -1))
    # another layer, position or seed rounds differently (most elements are not representable: p in (0, 1/2])
    for other in (NoiseKey(5, 4, 17), NoiseKey(5, 3, 18), NoiseKey(6, 3, 17)):
        assert not torch.equal(fmt.encode(row, other)["values"], alone)


def test_unknown_format_and_sr_combinations():
    with pytest.raises(ValueError, match="unknown storage format 'int4'"):
        get_format("int4")
    with pytest.raises(ValueError, match="stochastic rounding is available for bf16 and fp16"):
        get_format("nvfp4", stochastic_rounding=True)


# ------------------------------------------------------------------------------------------------ checkpoint store
def _store(precision, shape, layer=3):
    policies = [PRESETS[p] for p in precision] if isinstance(precision, list) else PRESETS[precision]
    store = CheckpointStore(policies, seed_offset=layer)
    store.allocate(shape, torch.device("cpu"))
    return store


def test_per_row_policies_round_each_row_as_alone():
    """Rows 0 and 2 of a store with policies [fp16-sr, fp32, fp16-sr] get the encodings (and reads) that a
    single-policy store gives each of them alone at batch 1: same seed, layer and position, same noise."""
    state = torch.randn(3, 4, 8, 16) * torch.logspace(-3, 1, 16)
    together = _store(["fp16-sr", "fp32", "fp16-sr"], state.shape)
    sr_slot = next(slot for slot in together.slots if slot.policy == PRESETS["fp16-sr"])
    assert sr_slot.rows.tolist() == [0, 2]
    for position, x in ((21, state), (25, state * 3)):
        together.write(x, position=position)
        staged = together.stage(x * 2, position=position + 4)
        for i, row in enumerate((0, 2)):
            alone = _store("fp16-sr", (1, *x.shape[1:]))
            alone.write(x[row : row + 1], position=position)
            assert torch.equal(sr_slot.checkpoint["values"][i : i + 1], alone.slots[0].checkpoint["values"])
            assert torch.equal(together.read()[row], alone.read()[0])
            assert torch.equal(together.recurrence()[row], alone.recurrence()[0])
            assert torch.equal(staged.recurrence()[row], alone.stage(x[row : row + 1] * 2, position + 4).read()[0])
        assert torch.equal(together.recurrence()[1], x[1])  # the fp32 row is exact
    # the same rows in a batch of 3 under one policy round the same way too
    batch = _store("fp16-sr", state.shape)
    batch.write(state * 3, position=25)
    assert torch.equal(batch.recurrence()[[0, 2]], together.recurrence()[[0, 2]])
    # another layer rounds differently
    other_layer = _store("fp16-sr", state.shape, layer=4)
    other_layer.write(state * 3, position=25)
    assert not torch.equal(other_layer.recurrence(), batch.recurrence())


def _reachable_storages(root) -> dict[int, int]:
    """Storage bytes of every tensor reachable from ``root`` through attributes, dicts, lists and tuples."""
    seen, storages, stack = set(), {}, [root]
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, (str, bytes, int, float, type, torch.dtype, torch.device)):
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            storages[obj.untyped_storage().data_ptr()] = obj.untyped_storage().nbytes()
        elif isinstance(obj, dict):
            stack.extend(obj.values())
        elif isinstance(obj, (list, tuple, set)):
            stack.extend(obj)
        elif hasattr(obj, "__dict__"):
            stack.extend(vars(obj).values())
    return storages


# bytes of a [2, 4, 8, 40] state: 2560 elements in 64 rows of 40 (nvfp4 pads rows to 48 = 3 blocks)
STATE_BYTES = {"fp32": 10240, "bf16": 5120, "fp16": 5120, "fp8": 2560 + 4 * 64,
               "nvfp4": 2 * 4 * 8 * 24 + 2 * 4 * 8 * 3 + 4 * 2 + 8}  # packed, block scales, sequence scales, row


@pytest.mark.parametrize("precision", list(PRESETS))
def test_store_keeps_only_its_encodings(precision):
    """Reads decode on demand: the store keeps nothing but its encodings (no float32 copy of a low-precision state),
    ``tensors()`` lists them all, and ``nbytes()`` counts every byte of them (0-d tensors included)."""
    policy = PRESETS[precision]
    store = _store(precision, (2, 4, 8, 40))
    state = torch.randn(2, 4, 8, 40)
    store.write(state, position=9)
    read, recurrence = store.read(), store.recurrence()
    assert read.dtype == recurrence.dtype == torch.float32 and read.shape == recurrence.shape == state.shape
    staged = store.stage(state * 2, position=13)
    torch.testing.assert_close(staged.recurrence(), state * 2, atol=0.5, rtol=0.2)
    store.load(staged)
    reachable = _reachable_storages(store)
    assert {t.untyped_storage().data_ptr() for t in store.tensors()} == set(reachable)
    sizes = store.nbytes()
    assert sizes["checkpoint"] + sizes["read_copy"] == sum(reachable.values())
    assert sizes == {"checkpoint": STATE_BYTES[policy.checkpoint_format],
                     "read_copy": STATE_BYTES[policy.read_format] if policy.read_format else 0}
    if policy.checkpoint_format == "fp32":  # the stored tensor itself, not a copy
        assert store.recurrence().data_ptr() == store.slots[0].checkpoint["values"].data_ptr()
        assert torch.equal(store.recurrence(), state * 2)


def test_per_row_store_memory():
    store = _store(["fp16-sr", "fp32", "fp16-sr"], (3, 4, 8, 40))
    store.write(torch.randn(3, 4, 8, 40), position=1)
    reachable = _reachable_storages(store)
    assert {t.untyped_storage().data_ptr() for t in store.tensors()} == set(reachable)
    # fp16 rows 0, 2 + fp32 row 1 + the row indices of the two slots (int64)
    assert store.nbytes() == {"checkpoint": 2 * 1280 * 2 + 1280 * 4 + 8 * 3, "read_copy": 0}
    assert sum(store.nbytes().values()) == sum(reachable.values())


def test_zero_and_index_batch_keep_the_layout():
    store = _store("fp16-sr+nvfp4", (3, 4, 8, 40))
    store.write(torch.randn(3, 4, 8, 40), position=5)
    store.index_batch(torch.tensor([2, 2, 0, 1]))
    assert store.read().shape == (4, 4, 8, 40) and store.nbytes()["read_copy"] == 4 * 4 * 8 * 27 + 4 * 4 + 8
    store.zero_()
    assert not store.recurrence().any() and not store.read().any()
    assert sum(store.nbytes().values()) == sum(_reachable_storages(store).values())
    assert PrecisionPolicy("fp16", stochastic_rounding=True, read_format="nvfp4") == PRESETS["fp16-sr+nvfp4"]


@pytest.mark.parametrize("precision", ["separated-fp8", "separated-nvfp4"])
def test_refresh_read_copy_after_an_in_place_fold(precision):
    """A kernel folds into the float32 checkpoint in place; ``refresh_read_copy`` then gives the read copy that
    ``write`` of the new state gives (the codec, or an in-place encoder handed in), into the same storage."""
    store = CheckpointStore(PRESETS[precision])
    shape = (3, 2, 8, 20)
    store.allocate(shape, torch.device("cpu"))
    store.write(torch.randn(shape), position=4)
    slot = store.slots[0]
    addresses = {name: t.data_ptr() for name, t in slot.read_copy.items()}
    new = torch.randn(shape) * 3
    slot.checkpoint["values"].copy_(new)  # what the flush kernel does
    stale = {name: t.clone() for name, t in slot.read_copy.items()}
    store.refresh_read_copy()
    want = CheckpointStore(PRESETS[precision])
    want.allocate(shape, torch.device("cpu"))
    want.write(new, position=8)
    for name, value in slot.read_copy.items():
        assert torch.equal(value, want.slots[0].read_copy[name]), name
        assert value.data_ptr() == addresses[name], name  # static addresses (compiled decoding)
    assert any(not torch.equal(stale[n], slot.read_copy[n]) for n in stale)
    calls = []
    store.refresh_read_copy(lambda state, copy, fmt: calls.append((state is slot.checkpoint["values"], fmt)))
    assert calls == [(True, PRESETS[precision].read_format)]
    plain = CheckpointStore(PRESETS["fp32"])
    plain.allocate(shape, torch.device("cpu"))
    with pytest.raises(RuntimeError, match="read copy"):
        plain.refresh_read_copy()
