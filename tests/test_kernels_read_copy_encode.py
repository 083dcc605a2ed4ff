"""Device re-encode of a read copy (``hf_replayssm.kernels.read_copy_encode``) against the torch encoders.

For fp8 and nvfp4, the kernel's copy of every selected batch row must equal, bit for bit, what
``get_format(fmt).encode(state)`` gives for that row; every byte of the other rows (pre-filled with 0xAB) must be
untouched; and the kernel must agree with ``reencode_read_copy_ref`` exactly. Cases: rows of 16, 24 (storage padding
for nvfp4) and 64, A not a power of two (several row tiles, the last partial), strided states and copies, select
patterns (none / all / mixed, int32 / bool, strided), exact rounding ties of E4M3 and E2M1, all-zero rows and blocks,
block scales that underflow, huge and tiny magnitudes; the CUDA-eager arithmetic (divisions by Python constants as
reciprocal multiplications) against a torch emulation of it; errors. The cases run the default compact grids (P = 16
programs per batch row looping over its row tiles); ``compact_grid`` also runs P = 1, 3, 16 on tile counts that are
not multiples of P and the per-tile grids (``_programs_per_row=None``), whose bytes the compact ones must equal; P < 1
is rejected.

Runs in subprocesses under ``TRITON_INTERPRET=1`` like ``tests/test_kernels_read_copy.py`` (there the fp8 conversion
is the kernel's exact integer version: the interpreter's own float8 cast does not round to nearest even);
``REPLAYSSM_KERNEL_TEST_DEVICE=cuda`` runs the same checks on a GPU (hardware conversion). The reference alone is
also tested in-process on CPU.
"""

from __future__ import annotations

import re
import sys

import pytest
from kernel_harness import HAS_TRITON, run_case, worker_main

CASES = ["fp8_rows", "nvfp4_rows", "select_patterns", "strided", "fp8_ties", "nvfp4_ties", "cuda_arithmetic",
         "compact_grid", "model_shapes", "given_amax", "reciprocal_quotient", "bad_inputs"]


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
@pytest.mark.parametrize("case", CASES)
def test_reencode_kernel(case):
    run_case(__file__, case)


def test_reference_cpu():
    """The reference alone (no triton): selected rows re-encoded exactly, the others' bytes untouched."""
    import torch

    from hf_replayssm.ops.read_copy import reencode_read_copy_ref

    state = _state(batch=3, heads=2, rows=3, row=24, seed=7)
    for fmt in ("fp8", "nvfp4"):
        for select in ([1, 0, 1], [0, 0, 0], [1, 1, 1]):
            for dtype in (torch.int32, torch.bool):
                copy = _sentinel_copy(state, fmt, fp8_views=dtype == torch.bool)
                reencode_read_copy_ref(state, copy, fmt, torch.tensor(select, dtype=dtype))
                _assert_reencoded(copy, state, fmt, select)


def test_reference_errors():
    from hf_replayssm.ops.read_copy import reencode_read_copy_ref

    _check_errors(reencode_read_copy_ref, "cpu")


# ---------------------------------------------------------------------------------------------------------------
# shared helpers (also used in the subprocess)

SENTINEL = 0xAB  # every byte of a copy before the call


def _state(batch, heads, rows, row, seed, scales=None, device="cpu"):
    """Random float32 state [B, H, A, C], batch row b scaled by ``scales[b]``."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, heads, rows, row, generator=gen)
    if scales is not None:
        x = x * torch.tensor(scales, dtype=torch.float32).view(-1, 1, 1, 1)
    return x.to(device)


def _bits(t):
    """The tensor's bits as an integer tensor of the same shape (float32 -> int32, float8 -> uint8)."""
    import torch

    return {torch.float32: lambda: t.view(torch.int32), torch.float8_e4m3fn: lambda: t.view(torch.uint8)}.get(
        t.dtype, lambda: t)()


def _sentinel_copy(state, fmt, fp8_views=False):
    """A read copy for ``state`` whose every byte is 0xAB (``fp8_views``: E4M3 entries as float8_e4m3fn)."""
    import torch

    from hf_replayssm.precision.formats import get_format

    shapes = {n: t for n, t in get_format(fmt).encode(state[:1]).items()}
    copy = {}
    for name, t in shapes.items():
        if name == "row":
            copy[name] = t.clone()
            continue
        shape = (state.shape[0], *t.shape[1:])
        raw = torch.full((*shape, t.element_size()), SENTINEL, dtype=torch.uint8, device=state.device)
        copy[name] = raw.view(t.dtype).squeeze(-1)
        if fp8_views and name in ("codes", "block_scale"):
            copy[name] = copy[name].view(torch.float8_e4m3fn)
    return copy


def _assert_reencoded(copy, state, fmt, select, want=None):
    """Rows with select != 0 hold ``want`` (default: the torch encoding of ``state``), the others only 0xAB bytes."""
    import torch

    from hf_replayssm.precision.formats import get_format

    want = get_format(fmt).encode(state) if want is None else want
    for name, t in copy.items():
        if name == "row":  # never written
            assert int(t) == state.shape[-1]
            continue
        got = _bits(t)
        for b, sel in enumerate(select):
            if sel:
                assert torch.equal(got[b], _bits(want[name])[b]), (fmt, name, b)
            else:
                untouched = got[b].reshape(-1).contiguous().view(torch.uint8)
                assert bool((untouched == SENTINEL).all()), (fmt, name, b, "overwritten")


def _bad_calls(device):
    """(label, call arguments after the function, expected error type, message) of invalid re-encodes."""
    import torch

    from hf_replayssm.precision.formats import get_format

    state = _state(2, 1, 3, 16, seed=0, device=device)
    fp8, nv = get_format("fp8").encode(state), get_format("nvfp4").encode(state)
    sel = torch.ones(2, dtype=torch.int32, device=device)
    return [
        ("select shape", (state, fp8, "fp8", sel[:1]), ValueError, "must have shape [2]"),
        ("select 2-d", (state, fp8, "fp8", sel[:, None]), ValueError, "must have shape [2]"),
        ("select int64", (state, fp8, "fp8", sel.long()), ValueError, "torch.int32 or torch.bool"),
        ("select float", (state, nv, "nvfp4", sel.float()), ValueError, "torch.int32 or torch.bool"),
        ("select device", (state, fp8, "fp8", torch.ones(2, dtype=torch.int32, device="meta")), ValueError,
         "select is on meta"),
        ("select list", (state, fp8, "fp8", [1, 1]), TypeError, "select must be"),
        ("no copy", (state, None, "fp8", sel), ValueError, "needs a read_copy"),
        ("fp32 format", (state, fp8, "fp32", sel), ValueError, "needs read_format"),
        ("format mismatch", (state, fp8, "nvfp4", sel), ValueError, "has entries"),
        ("codes dtype", (state, dict(fp8, codes=fp8["codes"].float()), "fp8", sel), ValueError, "must be torch.uint8"),
        ("packed row", (state, dict(nv, packed=nv["packed"][..., :-1]), "nvfp4", sel), ValueError,
         "must have shape"),
        ("state 3-d", (state[0], fp8, "fp8", sel), ValueError, "[B, H, A, C]"),
        ("state int", (state.int(), fp8, "fp8", sel), ValueError, "must be float32"),
    ]


def _check_errors(fn, device):
    for label, args, error, message in _bad_calls(device):
        with pytest.raises(error) as info:
            fn(*args)
        assert message in str(info.value), (label, str(info.value))


# ---------------------------------------------------------------------------------------------------------------
# worker side (runs in the subprocess)


def _check(module, state, fmt, select, select_dtype="int32", fp8_views=False, want=None, **options):
    """One kernel call and one reference call on fresh sentinel copies: both exact on the selected rows, untouched
    elsewhere, equal to each other."""
    import torch

    dtype = {"int32": torch.int32, "bool": torch.bool}[select_dtype]
    sel = torch.tensor(select, dtype=dtype, device=state.device)
    got, ref = _sentinel_copy(state, fmt, fp8_views), _sentinel_copy(state, fmt, fp8_views)
    module.reencode_read_copy(state, got, fmt, sel, **options)
    if want is None:
        module.reencode_read_copy_ref(state, ref, fmt, sel)
        for name in got:
            assert torch.equal(_bits(got[name]), _bits(ref[name])), (fmt, name, "kernel vs reference")
    _assert_reencoded(got, state, fmt, select, want)


def _row_mix(device, row, rows=5):
    """Batch rows of ordinary, tiny (fp8 subnormal codes), huge and zero magnitudes, with zero (h, a) rows and a
    zero 16-element block."""
    state = _state(5, 2, rows, row, seed=row, scales=[1.0, 1e-30, 3e36, 0.0, 250.0], device=device)
    state[0, 1, 2] = 0.0  # one all-zero row
    state[4, 0, :, :16] = 0.0  # all-zero nvfp4 blocks
    state[4, 1, 0, 3] = 2e4  # one outlier: the other blocks' scales are small (some underflow E4M3)
    return state


def _rows_case(module, device, fmt):
    for row in (16, 24, 64):
        state = _row_mix(device, row)
        for block_a, select_dtype in ((2, "int32"), (None, "bool")):  # 3 row tiles (the last partial) / 1 tile
            _check(module, state, fmt, [1, 1, 0, 1, 1], select_dtype, _block_a=block_a)
        print(f" {fmt} C={row}: ok")


def case_fp8_rows(module, device):
    _rows_case(module, device, "fp8")


def case_nvfp4_rows(module, device):
    _rows_case(module, device, "nvfp4")
    state = _row_mix(device, 24)
    state[2] = 0.0  # a selected all-zero batch row: tensor scale 1
    _check(module, state, "nvfp4", [0, 0, 1, 0, 1])


def case_model_shapes(module, device):
    """Rows 128 wide (d_state of Nemotron-H, the value dim of Qwen3-Next / Kimi-Linear) and 32 wide, on both grids:
    the default tiles there are [32, 8] and [128, 2] scale blocks, where the hardware E4M3 conversion of the nvfp4
    block scales gave other bits than torch's for 35-45 % of the blocks on the H200 (run 169; the small tiles of the
    other cases did not show it); the nvfp4 encode's strided-load fallback too."""
    for shape in ((2, 8, 64, 128), (3, 4, 24, 32)):
        state = _state(*shape, seed=shape[-1], device=device)
        for fmt in ("fp8", "nvfp4"):
            for programs in (None, 16):
                _check(module, state, fmt, [1] * shape[0], _programs_per_row=programs)
        for programs in (None, 16):  # the strided even / odd loads (not the default) give the same bytes
            select = [1 - b % 2 for b in range(shape[0])]  # rows not selected stay untouched
            _check(module, state, "nvfp4", select, _programs_per_row=programs, _nvfp4_contiguous_load=False)


def _row_amax_bits(state):
    """What a flush leaves for ``amax=``: max |state[b]| per batch row as int32 float bits."""
    import torch

    return state.abs().amax(dim=(1, 2, 3)).float().view(torch.int32).contiguous()


def case_given_amax(module, device):
    """nvfp4 with ``amax=`` (the per-row amax from the flush that wrote the rows): the encode pass alone gives the
    codec's bytes, on both grids, for ordinary / tiny / huge / all-zero rows; a wrong amax does change the copy (the
    argument is what the encode reads)."""
    import torch

    for row in (24, 128):
        state = _row_mix(device, row)
        state[2] = 0.0  # an all-zero batch row: amax 0, tensor scale 1
        for programs in (None, 16):
            _check(module, state, "nvfp4", [1, 1, 1, 0, 1], amax=_row_amax_bits(state), _programs_per_row=programs)
        print(f" C={row}: the codec's bytes from the given amax")
    state = _row_mix(device, 24)
    wrong = (state.abs().amax(dim=(1, 2, 3)) * 4).view(torch.int32).contiguous()
    copy = _sentinel_copy(state, "nvfp4")
    module.reencode_read_copy(state, copy, "nvfp4", torch.ones(5, dtype=torch.int32, device=device), amax=wrong)
    want = _sentinel_copy(state, "nvfp4")
    module.reencode_read_copy(state, want, "nvfp4", torch.ones(5, dtype=torch.int32, device=device))
    assert not torch.equal(copy["tensor_scale"], want["tensor_scale"])
    print(" a wrong amax gives another copy")


def _threshold_state(device, seed=11):
    """[2, 4, 16, 128]: every 16-element block's element 0 is its amax (so the block scales d are fixed), the other
    15 lie within 3 ulps of t d for the E2M1 rounding thresholds t = 0.25 .. 5 and 6-7 (saturation), of both signs:
    the quotients x / d whose code flips when the division is off by one ulp. Exact products t d (ties) included."""
    import torch

    from hf_replayssm.precision.formats import e4m3_decode, get_format

    gen = torch.Generator().manual_seed(seed)
    state = torch.randn(2, 4, 16, 128, generator=gen) * torch.tensor([1.0, 3e-7]).view(-1, 1, 1, 1)
    blocks = state.unflatten(-1, (8, 16))
    amax = blocks.abs().amax(dim=-1, keepdim=True) * (1 + torch.rand(*blocks.shape[:-1], 1, generator=gen))
    blocks[..., :1] = amax  # element 0: the block amax, above the random values it replaces
    encoded = get_format("nvfp4").encode(state.to(device))
    d = (e4m3_decode(encoded["block_scale"]).float() * encoded["tensor_scale"].view(-1, 1, 1, 1)).cpu()  # [B, H, A, 8]
    thresholds = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, 7.0])
    pick = torch.randint(0, len(thresholds), (*blocks.shape[:-1], 15), generator=gen)
    steps = torch.randint(-3, 4, pick.shape, generator=gen)
    x = thresholds[pick] * d[..., None]  # float32 products: t d rounded (exact for some)
    bits = x.view(torch.int32) + steps.to(torch.int32)  # +-3 ulps (positive floats order like their bits)
    x = bits.view(torch.float32)
    sign = torch.where(torch.rand(pick.shape, generator=gen) < 0.5, -1.0, 1.0)
    blocks[..., 1:] = torch.minimum(x, amax.expand_as(x)) * sign  # (never above the block amax)
    return state.contiguous().to(device)


def case_reciprocal_quotient(module, device):
    """``_nvfp4_reciprocal_quotient`` (the default: x / block scale by the block's reciprocal and two Markstein
    corrections, codes by rounding the float's bits) and without it (a division per element, the comparisons): the
    codec's bytes on quotients next to every E2M1 threshold (which one ulp changes), ties, rows whose block scales are
    subnormal (their tiles take the division), the row mix, rows of 24 (padding) and 128, both grids, the contiguous
    and the strided loads, the CUDA-eager arithmetic. (One Markstein correction instead of two agreed with the
    division on 1.2e8 random quotients, but is not proven correctly rounded, so no test here can tell it apart.)"""
    import torch

    from hf_replayssm.precision.formats import e2m1_encode

    q = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    below = (q.view(torch.int32) - 1).view(torch.float32)
    assert not torch.equal(e2m1_encode(q), e2m1_encode(below)), "one ulp below a threshold must change some codes"
    threshold, ties = _threshold_state(device), _nvfp4_tie_state(device)
    model = _state(2, 8, 64, 128, seed=5, device=device)
    # rows of magnitudes 1e-36 / 1e-38: block scales (tensor scale 1e-39 / 1e-41 times E4M3 values) subnormal, where
    # the reciprocal overflows: the tiles take the division
    subnormal = _state(2, 2, 4, 128, seed=9, scales=[1e-36, 1e-38], device=device)
    for quotient in (True, False):
        opt = dict(_nvfp4_reciprocal_quotient=quotient)
        for programs in (None, 16):
            _check(module, threshold, "nvfp4", [1, 1], _programs_per_row=programs, **opt)
            _check(module, threshold, "nvfp4", [1, 1], want=_cuda_eager_encode(threshold, "nvfp4"),
                   _scalar_reciprocal=True, _programs_per_row=programs, **opt)
            _check(module, model, "nvfp4", [0, 1], _programs_per_row=programs, **opt)
            _check(module, model, "nvfp4", [1, 0], _programs_per_row=programs, _nvfp4_contiguous_load=False,
                   **opt)  # the strided loads
            _check(module, subnormal, "nvfp4", [1, 1], _programs_per_row=programs, **opt)
        for row in (24, 128):
            state = _row_mix(device, row)
            for programs in (None, 16):
                _check(module, state, "nvfp4", [1, 1, 0, 1, 1], _programs_per_row=programs, **opt)
                _check(module, state, "nvfp4", [1, 1, 1, 1, 1], amax=_row_amax_bits(state),
                       _programs_per_row=programs, **opt)
        _check(module, ties, "nvfp4", [1, 1], **opt)
        _check(module, ties, "nvfp4", [1, 1], want=_cuda_eager_encode(ties, "nvfp4"), _scalar_reciprocal=True, **opt)
        print(f" {opt}: threshold quotients, row mix (tiny rows: the division fallback), ties, model shape")


def case_select_patterns(module, device):
    import torch

    state = _state(4, 1, 3, 24, seed=3, device=device)
    for fmt in ("fp8", "nvfp4"):
        for select in ([0, 0, 0, 0], [1, 1, 1, 1], [0, 1, 0, 1], [1, 0, 0, 0]):
            for select_dtype in ("int32", "bool"):
                _check(module, state, fmt, select, select_dtype)
        # any non-zero int selects; a strided select
        pool = torch.tensor([5, 9, 0, 9, -1, 9, 0, 9], dtype=torch.int32, device=device)
        got, ref = _sentinel_copy(state, fmt), _sentinel_copy(state, fmt)
        module.reencode_read_copy(state, got, fmt, pool[::2])
        module.reencode_read_copy_ref(state, ref, fmt, pool[::2])
        _assert_reencoded(got, state, fmt, [1, 0, 1, 0])
        _assert_reencoded(ref, state, fmt, [1, 0, 1, 0])
        print(f" {fmt}: select patterns ok")


def case_strided(module, device):
    """A transposed slice of a pool as the state (row stride 1 along A, C stride A) and copies that are slices of
    larger pools (E4M3 entries as float8_e4m3fn views); bf16 states (upcast exactly)."""
    _strided_checks(module, device)


def _strided_checks(module, device, **options):
    import torch

    from hf_replayssm.precision.formats import get_format

    pool = _state(6, 3, 24, 5, seed=11, scales=[1, 2, 3, 4, 5, 6], device=device)  # [6, H, C, A]
    state = pool[1:5].transpose(-1, -2)  # [4, 3, 5, 24]
    assert not state.is_contiguous()
    select = [1, 0, 1, 1]
    sel = torch.tensor(select, dtype=torch.int32, device=device)
    for fmt in ("fp8", "nvfp4"):
        big = _sentinel_copy(torch.cat([state, state]), fmt, fp8_views=True)  # batch 8
        views = {n: (t if n == "row" else t[1::2]) for n, t in big.items()}  # every other batch row
        ref = _sentinel_copy(state, fmt)
        module.reencode_read_copy(state, views, fmt, sel, _block_a=2, **options)
        module.reencode_read_copy_ref(state, ref, fmt, sel)
        _assert_reencoded(views, state, fmt, select)
        for name in ref:
            assert torch.equal(_bits(views[name]), _bits(ref[name])), (fmt, name)
        for name, t in big.items():  # the pool rows around the views are untouched
            if name != "row":
                assert bool((_bits(t[0::2]).contiguous().view(torch.uint8) == SENTINEL).all()), (fmt, name)
        half = state.to(torch.bfloat16)
        _check(module, half, fmt, select, want=get_format(fmt).encode(half.float()), **options)
        print(f" {fmt}: strided state and copies, bf16 state ok {options}")


def _e4m3_tie_values():
    """Positive float32 values around every E4M3 rounding decision: each representable value, the midpoints between
    neighbours (ties to even, including subnormal ones and mantissa carries such as 1.9375 -> 2) and the float32
    numbers either side of each midpoint."""
    import torch

    grid = torch.arange(0, 127, dtype=torch.uint8).view(torch.float8_e4m3fn).float()  # 0 .. 448
    mids = (grid[1:] + grid[:-1]) / 2  # exact: few significant bits
    up, down = torch.nextafter(mids, mids + 1), torch.nextafter(mids, mids - 1)
    return torch.cat([grid, mids, up, down, mids[:1] / 2, torch.tensor([2.0**-12, 1e-40])])


def case_fp8_ties(module, device):
    """Rows whose amax is 448 (scale 1: codes are E4M3 of the values themselves) holding every rounding decision of
    E4M3, both signs."""
    import torch

    values = _e4m3_tie_values()
    values = torch.cat([values, -values])
    row = 64
    per_row = row - 1
    rows = -(-values.numel() // per_row)
    values = torch.cat([values, torch.zeros(rows * per_row - values.numel())]).view(rows, per_row)
    state = torch.cat([torch.full((rows, 1), 448.0), values], dim=1)[None, None].to(device)  # [1, 1, rows, 64]
    _check(module, state, "fp8", [1])
    codes = _bits(_sentinel_copy(state, "fp8")["codes"])
    module.reencode_read_copy(state, dict(codes=codes, scale=torch.empty(1, 1, rows, 1, device=device)), "fp8",
                              torch.ones(1, dtype=torch.int32, device=device))
    assert codes[0, 0, 0, 1].item() == 0 and codes[0, 0, 0, 0].item() == 0x7E  # 0 -> 0x00, 448 -> 0x7E
    print(f" fp8: {2 * values.numel()} tie values over {rows} rows ok")


def _nvfp4_tie_state(device):
    """[2, 1, 4, 72]. Batch row 0 has amax 2688 (tensor scale 1). Block 0 holds the E2M1 midpoints 0.25 .. 5 of both
    signs with block amax 6 (block scale 1: scaled values are the values); block 1 the same halved (block scale
    0.5); blocks 2-3 have amaxes 6 m for E4M3 midpoints m, so their block scales are E4M3 ties (one of them only
    without reciprocal arithmetic, see :func:`case_cuda_arithmetic`); block 4 holds 2688
    (half of it storage padding). Batch row 1 is row 0 times 3."""
    import torch

    mids = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    block0 = torch.cat([torch.tensor([6.0]), mids, -mids, torch.tensor([0.0])])  # 16
    block_amax = 6 * torch.tensor([1.0625, 1.9375, 3 * 2.0**-10, 2.0**-10, 5 * 2.0**-10, 1.0625 * 2.0**-6, 0, 432.0])
    block_amax[6] = 7.124999523162842  # b / 6 rounds to the E4M3 tie 1.1875, b * fl32(1 / 6) above it (CUDA eager)
    blocks2_3 = (torch.linspace(-1, 1, 16) * block_amax[:, None]).view(4, 32)
    row = torch.cat([block0, block0 / 2], dim=0)  # 32
    rows = torch.cat([row.expand(4, 32), blocks2_3, torch.zeros(4, 16)], dim=1)  # [4, 80]
    rows[0, 64] = 2688.0
    rows[1, 70] = -2688.0
    state = torch.stack([rows, rows * 3]).unsqueeze(1).contiguous()  # [2, 1, 4, 80]
    return state[..., :72].to(device)  # C = 72: the last block half padding


def case_nvfp4_ties(module, device):
    _check(module, _nvfp4_tie_state(device), "nvfp4", [1, 1])
    print(" nvfp4: E2M1 and E4M3 ties ok")


def _cuda_eager_encode(x, fmt):
    """The torch encoders with every division by a Python constant done as CUDA eager torch does it: a
    multiplication by the float32 reciprocal (``formats.py`` arithmetic otherwise)."""
    import torch

    from hf_replayssm.precision.formats import FP8_MAX, NVFP4_BLOCK, e2m1_encode, e4m3_decode, e4m3_encode, pack_nibbles

    def inv(d):
        return torch.ones((), dtype=torch.float32, device=x.device) / d  # an exact float32 division

    x = x.float()
    if fmt == "fp8":
        amax = x.abs().amax(dim=-1, keepdim=True)
        scale = torch.where(amax > 0, amax * inv(FP8_MAX), torch.ones_like(amax))
        return {"codes": e4m3_encode(x / scale), "scale": scale}
    x = torch.nn.functional.pad(x, (0, (-x.shape[-1]) % NVFP4_BLOCK))
    blocks = x.unflatten(-1, (-1, NVFP4_BLOCK))
    amax = x.abs().flatten(1).amax(dim=1)
    tensor_scale = torch.where(amax > 0, amax * inv(6.0 * FP8_MAX), torch.ones_like(amax))
    g = tensor_scale.view(-1, 1, 1, 1, 1)
    bits = e4m3_encode(blocks.abs().amax(dim=-1, keepdim=True) * inv(6.0) / g)
    block_scale = e4m3_decode(bits) * g
    scaled = torch.where(block_scale > 0, blocks / torch.where(block_scale > 0, block_scale, 1.0), 0.0)
    return {"packed": pack_nibbles(e2m1_encode(scaled).flatten(-2)), "block_scale": bits.squeeze(-1),
            "tensor_scale": tensor_scale}


def case_cuda_arithmetic(module, device):
    """``_scalar_reciprocal=True`` (the default on CUDA) equals the emulated CUDA-eager encoders, which differ from
    the CPU encoders on these inputs (so the mode matters); on a GPU also the real encoder (the default path)."""
    import torch

    from hf_replayssm.precision.formats import get_format

    for fmt, state, must_differ in (("fp8", _row_mix(device, 24), True), ("nvfp4", _row_mix(device, 24), True),
                                    ("nvfp4", _nvfp4_tie_state(device), True)):
        want = _cuda_eager_encode(state, fmt)
        plain = get_format(fmt).encode(state.cpu())
        differs = [n for n in want if not torch.equal(_bits(want[n]).cpu(), _bits(plain[n]))]
        assert differs or not must_differ, (fmt, "the emulation should differ from the CPU encoder somewhere")
        select = [1, 0, 1, 1, 1][:state.shape[0]]
        _check(module, state, fmt, select, want=want, _scalar_reciprocal=True)
        if state.is_cuda:
            _check(module, state, fmt, select, want=want)
        print(f" {fmt}: reciprocal arithmetic ok (differs from CPU division in {differs})")


def case_compact_grid(module, device):
    """``_programs_per_row`` P (compact grids): tiles of flattened rows, some spanning two heads, tile counts that are
    not multiples of P (or below P), select patterns, strided inputs, ties and the CUDA-eager arithmetic: exact
    like the default grid, whose bytes they equal."""
    import torch

    state = _row_mix(device, 24)  # [5, 2, 5, 24]: 10 flattened rows per batch row
    # (P, _block_a, select, dtype); _block_a 2: 5 tiles per batch row (the third spans both heads), 4: 3 tiles (the
    # second spans both heads, the last partial), None: one tile
    runs = ((1, 2, [1, 0, 0, 1, 0], "int32"), (1, 4, [0, 0, 0, 0, 0], "bool"), (3, 2, [0, 1, 0, 0, 1], "bool"),
            (3, 4, [1, 1, 1, 1, 1], "int32"), (3, None, [0, 0, 0, 0, 0], "int32"), (16, 4, [1, 0, 1, 0, 0], "bool"),
            (16, None, [0, 0, 0, 1, 1], "int32"), (None, 2, [0, 1, 0, 0, 1], "bool"),
            (None, 4, [1, 1, 1, 1, 1], "int32"), (None, None, [1, 0, 0, 1, 0], "int32"))
    for fmt in ("fp8", "nvfp4"):
        for programs, block_a, select, select_dtype in runs:
            _check(module, state, fmt, select, select_dtype, _block_a=block_a, _programs_per_row=programs)
        sel = torch.tensor([1, 0, 0, 0, 1], dtype=torch.int32, device=device)
        default, compact = _sentinel_copy(state, fmt), _sentinel_copy(state, fmt)
        module.reencode_read_copy(state, default, fmt, sel, _block_a=2, _programs_per_row=None)  # per-tile grid
        module.reencode_read_copy(state, compact, fmt, sel, _block_a=2, _programs_per_row=3)
        for name in default:
            assert torch.equal(_bits(compact[name]), _bits(default[name])), (fmt, name, "compact vs per-tile grid")
        pool = torch.tensor([5, 0, 0, 9, -1, 9, 0, 9, 0, 0], dtype=torch.int32, device=device)
        got = _sentinel_copy(state, fmt)
        module.reencode_read_copy(state, got, fmt, pool[::2], _block_a=4, _programs_per_row=3)  # strided select
        _assert_reencoded(got, state, fmt, [1, 0, 1, 0, 0])
        _check(module, state, fmt, [0, 0, 1, 1, 1], want=_cuda_eager_encode(state, fmt), _scalar_reciprocal=True,
               _programs_per_row=3)
        print(f" {fmt}: compact grids ok")
    _strided_checks(module, device, _programs_per_row=3)  # 15 flattened rows: 8 tiles of 2
    _check(module, _nvfp4_tie_state(device), "nvfp4", [1, 1], _block_a=1, _programs_per_row=3)  # 4 tiles of 1
    print(" nvfp4: ties ok on compact grids")


def case_bad_inputs(module, device):
    import torch

    _check_errors(module.reencode_read_copy, device)
    _check_errors(module.reencode_read_copy_ref, device)
    print(f" {len(_bad_calls(device))} bad calls rejected by the kernel and the reference")
    state = _state(2, 1, 3, 16, seed=0, device=device)
    sel = torch.ones(2, dtype=torch.int32, device=device)
    for programs in (0, -1, 2.0, True):
        copy = _sentinel_copy(state, "fp8")
        with pytest.raises(ValueError, match="_programs_per_row must be None or an int >= 1"):
            module.reencode_read_copy(state, copy, "fp8", sel, _programs_per_row=programs)
        _assert_reencoded(copy, state, "fp8", [0, 0])  # nothing written
    print(" _programs_per_row < 1 (or not an int) rejected")
    copy = _sentinel_copy(state, "nvfp4")
    with pytest.raises(ValueError, match="_nvfp4_scale_convert must be 'hw' or 'soft'"):
        module.reencode_read_copy(state, copy, "nvfp4", sel, _nvfp4_scale_convert="fast")
    _assert_reencoded(copy, state, "nvfp4", [0, 0])  # nothing written
    print(" an unknown _nvfp4_scale_convert rejected")
    amax = _row_amax_bits(state)
    for fmt, bad, message in (("fp8", amax, "amax= serves the nvfp4 re-encode"),
                              ("nvfp4", amax.long(), "amax must be int32 [2]"),
                              ("nvfp4", amax[:1], "amax must be int32 [2]")):
        copy = _sentinel_copy(state, fmt)
        with pytest.raises(ValueError, match=re.escape(message)):
            module.reencode_read_copy(state, copy, fmt, sel, amax=bad)
        _assert_reencoded(copy, state, fmt, [0, 0])  # nothing written
    print(" amax= with fp8, another dtype or shape rejected")


if __name__ == "__main__":
    worker_main("read_copy_encode", globals(), sys.argv[1])
