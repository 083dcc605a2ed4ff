"""Re-encoding the low-precision read copy of a checkpoint on the device, for the batch rows that just flushed.

Entry point (torch reference of the same signature, re-exported here from :mod:`hf_replayssm.ops.read_copy`):

* :func:`reencode_read_copy` / :func:`reencode_read_copy_ref`: ``state`` [B, H, A, C] (the float32 checkpoint, any
  strides; rows = its last dim C), ``read_copy`` its encoding dict (layouts in :mod:`hf_replayssm.ops.read_copy`),
  ``select`` [B] int32 or bool on the device. Every batch row ``b`` with ``select[b] != 0`` gets its copy rewritten
  in place, bit-identical to ``get_format(read_format).encode(state)`` for that row on the same device; the other
  rows' bytes are not touched. No host sync (``select`` is read by the programs), so it can sit in a CUDA graph.

Launches (grid axis 2 = batch row; a program of a row not selected loads ``select[b]`` and does nothing else):

* ``fp8``: one launch, grid ``(cdiv(A, BLOCK_A), H, B)``; a program owns whole rows (a ``[BLOCK_A, next_pow2(C)]``
  tile): row amax, ``scale = amax / 448`` (1 for an all-zero row), ``codes = E4M3(x / scale)`` saturating at +-448.
* ``nvfp4``: the sequence scale needs the amax of the whole batch row first, hence two launches: (1) grid
  ``(cdiv(H A, BLOCK_R), B)``, each program's tile amax merged by ``atomic_max`` on the float's int32 bits into a
  zeroed [B] scratch (non-negative floats order like their bits); (2) grid ``(cdiv(A, BLOCK_A), H, B)`` over tiles
  ``[BLOCK_A, nb, 16]`` loaded as even / odd elements (the two nibbles of a byte): ``tensor_scale = amax / 2688``
  (or 1), per 16-element block ``bits = E4M3(block amax / 6 / tensor_scale)``, ``block_scale = decode(bits) *
  tensor_scale``, codes = E2M1 of ``x / block_scale`` (0 where the block scale is 0) rounded to nearest with ties to
  the even code (``e2m1_encode``'s bucketize tie rule; by rounding the quotient's float bits, or by comparisons),
  saturating at +-6, the sign bit only on non-zero codes. Storage padding (C not a multiple of 16) encodes zeros.
  Program (0, 0, b) writes ``tensor_scale[b]``. With ``amax=`` (the replay steps' ``reencode_copy``: their flush
  launches fold each row's amax as they store the new checkpoint, :func:`store_flushed_tile`) launch (1) is skipped:
  one read of the checkpoint instead of two.
* Compact grids (the default, ``_programs_per_row=P`` with P = ``COMPACT_PROGRAMS_PER_ROW``; ``None`` gives the
  per-tile grids above): every launch
  above gets ``(min(P, tiles), B)`` programs instead; program p of a selected batch row loops over its tiles of
  flattened rows (r = h A + a) ``p, p + P, ...`` (the same per-tile code, so the same bits), so a row not selected
  costs P programs per launch, not one per tile; nvfp4's program p = 0 writes ``tensor_scale[b]``, and an amax
  program merges its tiles into one ``atomic_max``.

Bit identity with torch (the arithmetic is the encoders' operation for operation):

* Divisions by tensors use ``tl.div_rn`` (IEEE round to nearest, as torch; Triton's ``/`` is approximate on GPUs),
  except nvfp4's element quotients: each block's reciprocal (one ``div_rn``) and two Markstein corrections by fma give
  the correctly rounded quotient, the same bits (``_quotient_by_reciprocal``).
* Divisions by Python constants (448, 6, 2688) differ by device in eager torch: on CPU a true division, on CUDA a
  multiplication by the float32 reciprocal (ATen's ``div_true_kernel_cuda`` does this for CPU-scalar divisors, which
  changes the last bit in about half the cases). ``SCALAR_RECIPROCAL`` (constexpr) follows the state's device.
* E4M3: fp8 codes on GPUs by the hardware conversion (``cvt.rn.satfinite.e4m3x2.f32``, round to nearest even) after
  clamping to +-448, as torch clamps; under ``TRITON_INTERPRET=1`` (and on GPUs older than sm_89, which have no fp8
  conversion) an exact integer version (``FP8_CONVERT`` "soft"), since the interpreter's float8 cast rounds ties away
  from zero and loses mantissa carries. nvfp4 block scales always by the integer version: the hardware conversion
  gave other bits than torch's for 35-45 % of the blocks of [32, 8] / [128, 2] scale tiles on the H200 (run 169).
  Block scales are decoded from their bits arithmetically (exact on both).

NaN states are not handled specially (torch's encoders keep them NaN; the kernels may not). Bit-identical to
torch's encoders on the H200 (``tests/test_kernels_read_copy_encode.py`` with ``REPLAYSSM_KERNEL_TEST_DEVICE=cuda``).
Cost there (batch 256, every row flushing together once per 16 steps, averaged over the cycle; H200 run 30), per
step, per-tile grids / compact grids (P = 16): GDN Qwen3-Next fp8 31 / 16 us, nvfp4 84 / 54 us; Mamba-2
Nemotron-H-8B fp8 59 / 26 us, nvfp4 162 / 96 us. The per-tile grids launch one program per tile for every row at
every step, and the rows not selected load ``select[b]`` and exit. With rows in mixed phases (a quarter of them
flushing at each step; the bench's "mixed" case, which decoding does not produce: rows share one flush grid) the
compact grids were slower (fp8 2-4 us, nvfp4 43-85 us per step): a flushing row's tiles are then done by 16 programs
in turn instead of all at once.
"""

from __future__ import annotations

import contextlib
import os

import torch
import triton
import triton.language as tl

from hf_replayssm.kernels.host_math import cdiv, next_power_of_2
from hf_replayssm.ops.read_copy import check_reencode, reencode_read_copy_ref

__all__ = ["COMPACT_PROGRAMS_PER_ROW", "EVERY_ROW_PROGRAMS_PER_ROW", "encode_constants", "fp8_encode_tile",
           "reencode_flushed_rows", "reencode_launch_config", "reencode_read_copy", "reencode_read_copy_ref"]

TILE_ELEMENTS = 4096  # float32 elements per program tile (32 per thread at 4 warps)
NUM_WARPS = 4
# ``_programs_per_row`` of the default compact grids: B / 16 flushing batch rows still give a few programs per SM on
# a 132-SM GPU (16 per row: 2 per SM at B = 256). Measured faster than the per-tile grids on an H200 with every row
# flushing together in run 30 (see the module docstring), no longer since (EVERY_ROW_PROGRAMS_PER_ROW below); the
# compiled path's steps, whose flushing rows are any subset, keep it.
COMPACT_PROGRAMS_PER_ROW = 16
# ``_programs_per_row`` of a re-encode of every batch row (a flush at host positions: every row flushes together): the
# per-tile grid. H200, Nemotron-H-8B shape [256, 128, 64, 128], every row selected, the re-encode alone (run 175,
# ``benchmarks/gpu/reencode_tile_probe.py``): nvfp4 with the flush's amax 539 us per-tile against 595 compact
# (575-619 at 8-64 programs per row), fp8 315 against 335 (fp8 at copy bandwidth either way).
EVERY_ROW_PROGRAMS_PER_ROW = None


def _float32_reciprocal(d: float) -> float:
    """fl32(1 / d), as ATen computes ``opmath_t(1) / scalar`` for a float32 tensor divided by a CPU scalar on CUDA."""
    return (torch.ones((), dtype=torch.float32) / d).item()  # CPU: an IEEE float32 division


_FP8_MAX = tl.constexpr(448.0)
_INV_FP8_MAX = tl.constexpr(_float32_reciprocal(448.0))
_INV_SIX = tl.constexpr(_float32_reciprocal(6.0))
_INV_NVFP4_TENSOR = tl.constexpr(_float32_reciprocal(6.0 * 448.0))
_E4M3_MIN_NORMAL_BITS = tl.constexpr(0x3C800000)  # float32 bits of 2^-6, the smallest normal E4M3 magnitude


@triton.jit
def _div_const(x, d: tl.constexpr, inv_d: tl.constexpr, SCALAR_RECIPROCAL: tl.constexpr):
    """``x / d`` for a Python-constant divisor, as eager torch computes it on the device (see the module docstring)."""
    if SCALAR_RECIPROCAL:
        return x * inv_d
    else:
        return tl.div_rn(x, tl.zeros_like(x) + d)  # (div_rn does not broadcast)


@triton.jit
def _e4m3_bits(v, FP8_CONVERT: tl.constexpr):
    """float32 -> E4M3 (fn) bit patterns (int32 0..255): clamp to +-448, round to nearest even (sign kept on zeros).

    "soft": normals (>= 2^-6) keep 3 mantissa bits by adding 0x7FFFF + the kept lsb to the float's bits (a carry
    bumps the exponent), then rebias 127 -> 7; smaller values are multiples of 2^-9: |v| 2^9 (exact) rounded to an
    integer 0..8, ties to even (8 is the bit pattern of 2^-6)."""
    v = tl.minimum(tl.maximum(v, -_FP8_MAX), _FP8_MAX)
    if FP8_CONVERT == "hw":
        return v.to(tl.float8e4nv, fp_downcast_rounding="rtne").to(tl.uint8, bitcast=True).to(tl.int32)
    else:
        u = v.to(tl.int32, bitcast=True)
        sign = (u >> 24) & 0x80
        mag = u & 0x7FFFFFFF
        normal = ((mag + 0x7FFFF + ((mag >> 20) & 1)) >> 20) - (120 << 3)
        t = tl.abs(v) * 512.0
        q = t.to(tl.int32)  # floor: t >= 0
        frac = t - q.to(tl.float32)
        q += ((frac > 0.5) | ((frac == 0.5) & ((q & 1) == 1))).to(tl.int32)
        return tl.where(mag >= _E4M3_MIN_NORMAL_BITS, normal, q) | sign


@triton.jit
def _e4m3_value(bits):
    """Non-negative E4M3 bit patterns (int32 0..126) -> float32, exactly: (8 + m) 2^(e - 10), or m 2^-9 (e = 0)."""
    exponent = bits >> 3
    mantissa = bits & 7
    normal = (((exponent + 120) << 23) | (mantissa << 20)).to(tl.float32, bitcast=True)
    return tl.where(exponent == 0, mantissa.to(tl.float32) * 0.001953125, normal)


@triton.jit
def _e2m1_codes(x):
    """float32 -> E2M1 codes (int32 0..15). The magnitude code counts the midpoints 0.25, 0.75, ..., 5 below |x|;
    at a midpoint torch's bucketize gives the lower code and ties-to-even then bumps odd ones (midpoints 0.75, 1.75,
    3.5), so those three count when reached (>=), the others only when passed (>). Sign bit 3 only on non-zero
    codes."""
    m = tl.abs(x)
    code = ((m > 0.25).to(tl.int32) + (m >= 0.75).to(tl.int32) + (m > 1.25).to(tl.int32)
            + (m >= 1.75).to(tl.int32) + (m > 2.5).to(tl.int32) + (m >= 3.5).to(tl.int32)
            + (m > 5.0).to(tl.int32))
    return tl.where((x < 0) & (code != 0), code + 8, code)


@triton.jit
def _e2m1_codes_rounded(q):
    """:func:`_e2m1_codes` by rounding the float's bits instead of seven comparisons (E2M1 is a float format with one
    mantissa bit, normals >= 1, subnormal step 1/2; its codes are its bit patterns, so ties to the even code are the
    float's ties to even). |q| >= 1: drop 22 mantissa bits rounding to nearest even (a carry bumps the exponent),
    rebias (1.0 -> code 2), saturate at 7 (+-6). |q| < 1: the FADD of 2^22 (ulp 1/2) rounds |q| to a multiple of 1/2,
    ties to even, and its low bits count the halves (0, 1, 2)."""
    u = q.to(tl.int32, bitcast=True)
    mag = u & 0x7FFFFFFF
    normal = tl.minimum(((mag + 0x1FFFFF + ((mag >> 22) & 1)) >> 22) - 252, 7)
    small = (tl.abs(q) + 4194304.0).to(tl.int32, bitcast=True) - 0x4A800000
    code = tl.where(mag >= 0x3F800000, normal, small)
    return tl.where((u < 0) & (code != 0), code | 8, code)


@triton.jit
def _quotient_by_reciprocal(x, d, r):
    """RN(x / d) (IEEE division, as ``tl.div_rn``) from ``r = RN(1 / d)``, with d > 0 and no under- or overflow
    around the quotient: x r is within two ulps of x / d; a Newton correction with the fma's residual
    ``x - q d`` makes it faithful, a second one correctly rounded (Markstein's theorem: r within half an ulp of
    1 / d and q within one ulp of x / d give RN(q + (x - q d) r) = RN(x / d), the residual exact in one fma). One
    multiply and four fmas instead of a division each; ``r`` is one division per 16-element block."""
    q = x * r
    q = tl.fma(tl.fma(-q, d, x), r, q)
    return tl.fma(tl.fma(-q, d, x), r, q)


@triton.jit
def _e2m1_pair_bytes(x_even, x_odd, block_scale, divisor, reciprocal, BY_RECIPROCAL: tl.constexpr):
    """Bytes ``code(x_even / block_scale) | code(x_odd / block_scale) << 4`` (codes 0 where the block scale is 0),
    ``x_*`` [BLOCK, BLOCK_NB, n], the block values [BLOCK, BLOCK_NB, 1]. BY_RECIPROCAL: quotients from the block's
    reciprocal (:func:`_quotient_by_reciprocal`) and codes by rounding (:func:`_e2m1_codes_rounded`); otherwise the
    division and the comparisons. The same bits either way."""
    d = tl.broadcast_to(divisor, x_even.shape)
    if BY_RECIPROCAL:
        r = tl.broadcast_to(reciprocal, x_even.shape)
        code_even = _e2m1_codes_rounded(_quotient_by_reciprocal(x_even, d, r))
        code_odd = _e2m1_codes_rounded(_quotient_by_reciprocal(x_odd, d, r))
    else:
        zero = block_scale == 0  # (block scales are >= 0)
        code_even = _e2m1_codes(tl.where(zero, 0.0, tl.div_rn(x_even, d)))
        code_odd = _e2m1_codes(tl.where(zero, 0.0, tl.div_rn(x_odd, d)))
    return (code_even | (code_odd << 4)).to(tl.uint8)


@triton.jit
def _store_e2m1_pairs(ptrs, mask, x_even, x_odd, block_scale, divisor, reciprocal, fast,
                      RECIPROCAL_QUOTIENT: tl.constexpr):
    """Store :func:`_e2m1_pair_bytes`: by the reciprocal where RECIPROCAL_QUOTIENT and the tile allows it (``fast``,
    a runtime scalar), by the division otherwise."""
    if RECIPROCAL_QUOTIENT:
        if fast:
            tl.store(ptrs, _e2m1_pair_bytes(x_even, x_odd, block_scale, divisor, reciprocal, True), mask=mask)
        else:
            tl.store(ptrs, _e2m1_pair_bytes(x_even, x_odd, block_scale, divisor, reciprocal, False), mask=mask)
    else:
        tl.store(ptrs, _e2m1_pair_bytes(x_even, x_odd, block_scale, divisor, reciprocal, False), mask=mask)


# ---------------------------------------------------------------------------------------------------------------
# per-tile math, shared by the two grids: a tile is BLOCK rows of batch row b given by their head h and index a
# (h a scalar in the default grid, a vector in the compact one); row_mask marks the rows that exist


@triton.jit
def fp8_encode_tile(x, mask, row_mask, codes_ptrs, scale_ptrs, SCALAR_RECIPROCAL: tl.constexpr,
                    FP8_CONVERT: tl.constexpr):
    """Store the fp8 encoding of a float32 tile of whole rows ``x`` [ROWS, COLS] (0 where ``mask`` is false):
    codes at ``codes_ptrs`` [ROWS, COLS] under ``mask``, each row's scale at ``scale_ptrs`` [ROWS] under
    ``row_mask``. Also the Mamba-2 flush's optional in-kernel re-encode (``kernels/mamba2.py``,
    ``_encode_in_flush``): the same bits."""
    amax = tl.max(tl.abs(x), axis=1)
    scale = tl.where(amax > 0, _div_const(amax, _FP8_MAX, _INV_FP8_MAX, SCALAR_RECIPROCAL), 1.0)
    codes = _e4m3_bits(tl.div_rn(x, tl.broadcast_to(scale[:, None], x.shape)), FP8_CONVERT)
    tl.store(codes_ptrs, codes.to(tl.uint8).to(codes_ptrs.dtype.element_ty, bitcast=True), mask=mask)
    tl.store(scale_ptrs, scale, mask=row_mask)


@triton.jit
def _fp8_encode_rows(
    state_ptr, codes_ptr, scale_ptr, b, h, a, row_mask,
    stride_x_b, stride_x_h, stride_x_a, stride_x_c,
    stride_q_b, stride_q_h, stride_q_a, stride_q_c,
    stride_s_b, stride_s_h, stride_s_a,
    C: tl.constexpr,
    BLOCK: tl.constexpr,
    BLOCK_C: tl.constexpr,
    SCALAR_RECIPROCAL: tl.constexpr,
    FP8_CONVERT: tl.constexpr,
):
    """codes and scale of a [BLOCK, BLOCK_C] tile of whole rows."""
    offs_c = tl.arange(0, BLOCK_C)
    mask = row_mask[:, None] & (offs_c[None, :] < C)
    x_row = h * stride_x_h + a * stride_x_a
    x = tl.load(state_ptr + b * stride_x_b + x_row[:, None] + offs_c[None, :] * stride_x_c, mask=mask,
                other=0.0).to(tl.float32)
    q_row = h * stride_q_h + a * stride_q_a
    fp8_encode_tile(x, mask, row_mask, codes_ptr + b * stride_q_b + q_row[:, None] + offs_c[None, :] * stride_q_c,
                    scale_ptr + b * stride_s_b + h * stride_s_h + a * stride_s_a, SCALAR_RECIPROCAL, FP8_CONVERT)


@triton.jit
def _rows_amax(
    state_ptr, b, offs_r, A, rows,
    stride_x_b, stride_x_h, stride_x_a, stride_x_c,
    C: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """max |x| (float32 scalar, >= 0) over the flattened rows offs_r (r = h A + a, those < rows) of batch row b."""
    offs_c = tl.arange(0, BLOCK_C)
    row_off = (offs_r // A) * stride_x_h + (offs_r % A) * stride_x_a
    mask = (offs_r[:, None] < rows) & (offs_c[None, :] < C)
    x = tl.load(state_ptr + b * stride_x_b + row_off[:, None] + offs_c[None, :] * stride_x_c,
                mask=mask, other=0.0).to(tl.float32)
    return tl.max(tl.max(tl.abs(x), axis=1), axis=0)


@triton.jit
def _merge_amax(amax_ptr, b, amax):
    """``amax_ptr[b] = max(itself, amax)`` on the int32 bits of a float32 amax >= 0 (integer order is float order)."""
    tl.atomic_max(amax_ptr + b, amax.to(tl.int32, bitcast=True), sem="relaxed")


@triton.jit
def accumulate_row_amax(amax_ptr, b, x, mask):
    """Fold max |x| over ``mask`` of a float32 tile of batch row b into ``amax_ptr[b]`` (int32 float bits, >= 0:
    integer order is float order), the nvfp4 re-encode's first pass done by whoever holds the rows: a flush that
    has just written them passes it to :func:`reencode_read_copy` (``amax=``) instead of the re-encode reading
    the checkpoint once more for it. ``x``: the values as stored (rounded to the checkpoint's dtype)."""
    _merge_amax(amax_ptr, b, tl.max(tl.max(tl.where(mask, tl.abs(x), 0.0), axis=1), axis=0))


@triton.jit
def store_flushed_tile(s, ptrs, mask, amax_ptr, b, FLUSH_AMAX: tl.constexpr):
    """A flush's store of its new checkpoint tile ``s`` (float32) at ``ptrs`` under ``mask``, rounded to the
    checkpoint's dtype; FLUSH_AMAX: its max |value as stored| folded into ``amax_ptr[b]``
    (:func:`accumulate_row_amax`) for the nvfp4 re-encode after the step."""
    stored = s.to(ptrs.dtype.element_ty)
    tl.store(ptrs, stored, mask=mask)
    if FLUSH_AMAX:
        accumulate_row_amax(amax_ptr, b, stored.to(tl.float32), mask)


@triton.jit
def _nvfp4_tensor_scale(amax_ptr, b, SCALAR_RECIPROCAL: tl.constexpr):
    """The sequence (tensor) scale of batch row b from its amax bits."""
    amax = tl.load(amax_ptr + b).to(tl.float32, bitcast=True)
    return tl.where(amax > 0, _div_const(amax, 2688.0, _INV_NVFP4_TENSOR, SCALAR_RECIPROCAL), 1.0)


@triton.jit
def _nvfp4_encode_rows(
    state_ptr, packed_ptr, block_scale_ptr, b, h, a, row_mask, g,
    stride_x_b, stride_x_h, stride_x_a, stride_x_c,
    stride_p_b, stride_p_h, stride_p_a, stride_p_c,
    stride_bs_b, stride_bs_h, stride_bs_a, stride_bs_c,
    C: tl.constexpr,
    NB: tl.constexpr,
    BLOCK: tl.constexpr,
    BLOCK_NB: tl.constexpr,
    SCALAR_RECIPROCAL: tl.constexpr,
    FP8_CONVERT: tl.constexpr,
    CONTIGUOUS_LOAD: tl.constexpr = True,
    RECIPROCAL_QUOTIENT: tl.constexpr = True,
):
    """Packed codes and block scales of BLOCK rows under the tensor scale g."""
    # [BLOCK, BLOCK_NB, 8] tiles of the even and odd elements: element c = 16 nb + 2 p (+ 1). CONTIGUOUS_LOAD (the
    # default): one [BLOCK, BLOCK_NB, 16] load split into even / odd elements (tl.reshape + tl.split), 8 vector loads
    # per thread instead of 32 scalar ones (sm_90 SASS); 8-15 % faster host cycles on the H200 (run 166); bit-identical
    # to the codec there with the integer block-scale rounding (run 171; its failures in run 167 came from the
    # hardware conversion); the strided pair of loads stays as the fallback
    offs_nb = tl.arange(0, BLOCK_NB)
    offs_p = tl.arange(0, 8)
    rows3 = row_mask[:, None, None]
    x_row = h * stride_x_h + a * stride_x_a
    x_base = state_ptr + b * stride_x_b + x_row[:, None, None]
    p_base = packed_ptr + b * stride_p_b + (h * stride_p_h + a * stride_p_a)[:, None, None]
    in_row = rows3 & (offs_nb[None, :, None] < NB)
    if CONTIGUOUS_LOAD:
        c = offs_nb[None, :, None] * 16 + tl.arange(0, 16)[None, None, :]
        x = tl.load(x_base + c * stride_x_c, mask=rows3 & (c < C), other=0.0).to(tl.float32)
        x_even, x_odd = tl.split(tl.reshape(x, [BLOCK, BLOCK_NB, 8, 2]))
    else:
        c_even = offs_nb[None, :, None] * 16 + 2 * offs_p[None, None, :]
        x_even = tl.load(x_base + c_even * stride_x_c, mask=rows3 & (c_even < C), other=0.0).to(tl.float32)
        x_odd = tl.load(x_base + (c_even + 1) * stride_x_c, mask=rows3 & (c_even + 1 < C),
                        other=0.0).to(tl.float32)
    block_amax = tl.maximum(tl.max(tl.abs(x_even), axis=2), tl.max(tl.abs(x_odd), axis=2))  # [BLOCK, BLOCK_NB]
    t = _div_const(block_amax, 6.0, _INV_SIX, SCALAR_RECIPROCAL)
    bits = _e4m3_bits(tl.div_rn(t, tl.broadcast_to(g, (BLOCK, BLOCK_NB))), FP8_CONVERT)
    block_scale = (_e4m3_value(bits) * g)[:, :, None]
    divisor = tl.where(block_scale > 0, block_scale, 1.0)
    if RECIPROCAL_QUOTIENT:
        # x / block_scale by the block's reciprocal (:func:`_quotient_by_reciprocal`), codes by rounding: sm_90 SASS
        # of the per-tile encode 2160 -> 3072 instructions static (`python -m hf_replayssm.kernels.registers
        # --reencode`), of which a tile with normal block scales runs 1584 (counted with the division fallback
        # branch cut from a copy of the source), the re-encode alone 540 -> 481 us (H200 run 178,
        # Nemotron-H-8B checkpoint at batch 256, amax given; bit-identical to the codec there). A block scale of 0
        # gets the reciprocal 0 with the divisor 1, so its quotients are 0 as the codec's. A tile with a block scale
        # below 2^-100 (rows of magnitudes about 1e-27) divides: the theorem needs the products q d normal for
        # |q| >= 1/4, the smallest quotient whose code is not 0. (Four 16-byte loads per thread holding whole blocks,
        # so that the block math, now a third of the instructions, ran once per block instead of once per thread of
        # a block: 1056 instructions but 918-1022 us, the loads 64 bytes apart; run 178, dropped.)
        reciprocal = tl.where(block_scale > 0, tl.div_rn(tl.full(divisor.shape, 1.0, tl.float32), divisor), 0.0)
        fast = tl.min(tl.min(tl.min(divisor, axis=2), axis=1), axis=0) >= 7.888609052210118e-31  # 2^-100
    else:
        reciprocal = divisor
        fast = False
    byte = offs_nb[None, :, None] * 8 + offs_p[None, None, :]
    _store_e2m1_pairs(p_base + byte * stride_p_c, in_row, x_even, x_odd, block_scale, divisor, reciprocal, fast,
                      RECIPROCAL_QUOTIENT)
    bs_row = h * stride_bs_h + a * stride_bs_a
    tl.store(block_scale_ptr + b * stride_bs_b + bs_row[:, None] + offs_nb[None, :] * stride_bs_c, bits.to(tl.uint8),
             mask=row_mask[:, None] & (offs_nb[None, :] < NB))


# ---------------------------------------------------------------------------------------------------------------
# default grids: one program per row tile of one head (amax: of the flattened rows) per batch row


@triton.jit
def _fp8_encode_kernel(
    state_ptr, select_ptr, codes_ptr, scale_ptr,
    A,
    stride_x_b, stride_x_h, stride_x_a, stride_x_c,
    stride_q_b, stride_q_h, stride_q_a, stride_q_c,
    stride_s_b, stride_s_h, stride_s_a,
    stride_sel,
    C: tl.constexpr,
    BLOCK_A: tl.constexpr,
    BLOCK_C: tl.constexpr,
    SCALAR_RECIPROCAL: tl.constexpr,
    FP8_CONVERT: tl.constexpr,
):
    pid_a = tl.program_id(0)
    h = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    if tl.load(select_ptr + b * stride_sel) != 0:
        offs_a = pid_a * BLOCK_A + tl.arange(0, BLOCK_A)
        _fp8_encode_rows(state_ptr, codes_ptr, scale_ptr, b, h, offs_a, offs_a < A,
                         stride_x_b, stride_x_h, stride_x_a, stride_x_c,
                         stride_q_b, stride_q_h, stride_q_a, stride_q_c,
                         stride_s_b, stride_s_h, stride_s_a,
                         C, BLOCK_A, BLOCK_C, SCALAR_RECIPROCAL, FP8_CONVERT)


@triton.jit
def _row_amax_kernel(
    state_ptr, select_ptr, amax_ptr,
    A, rows,
    stride_x_b, stride_x_h, stride_x_a, stride_x_c,
    stride_sel,
    C: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """amax_ptr[b] (int32 bits, zeroed by the caller) = max(itself, max |x| over this program's rows of batch row b);
    rows = H A, flattened as r = h A + a."""
    pid_r = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    if tl.load(select_ptr + b * stride_sel) != 0:
        offs_r = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
        amax = _rows_amax(state_ptr, b, offs_r, A, rows, stride_x_b, stride_x_h, stride_x_a, stride_x_c,
                          C, BLOCK_C)
        _merge_amax(amax_ptr, b, amax)


@triton.jit
def _nvfp4_encode_kernel(
    state_ptr, select_ptr, amax_ptr, packed_ptr, block_scale_ptr, tensor_scale_ptr,
    A,
    stride_x_b, stride_x_h, stride_x_a, stride_x_c,
    stride_p_b, stride_p_h, stride_p_a, stride_p_c,
    stride_bs_b, stride_bs_h, stride_bs_a, stride_bs_c,
    stride_t_b,
    stride_sel,
    C: tl.constexpr,
    NB: tl.constexpr,
    BLOCK_A: tl.constexpr,
    BLOCK_NB: tl.constexpr,
    SCALAR_RECIPROCAL: tl.constexpr,
    FP8_CONVERT: tl.constexpr,
    CONTIGUOUS_LOAD: tl.constexpr = True,
    RECIPROCAL_QUOTIENT: tl.constexpr = True,
):
    pid_a = tl.program_id(0)
    h = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    if tl.load(select_ptr + b * stride_sel) != 0:
        g = _nvfp4_tensor_scale(amax_ptr, b, SCALAR_RECIPROCAL)
        if (pid_a == 0) & (h == 0):
            tl.store(tensor_scale_ptr + b * stride_t_b, g)
        offs_a = pid_a * BLOCK_A + tl.arange(0, BLOCK_A)
        _nvfp4_encode_rows(state_ptr, packed_ptr, block_scale_ptr, b, h, offs_a, offs_a < A, g,
                           stride_x_b, stride_x_h, stride_x_a, stride_x_c,
                           stride_p_b, stride_p_h, stride_p_a, stride_p_c,
                           stride_bs_b, stride_bs_h, stride_bs_a, stride_bs_c,
                           C, NB, BLOCK_A, BLOCK_NB, SCALAR_RECIPROCAL, FP8_CONVERT, CONTIGUOUS_LOAD,
                           RECIPROCAL_QUOTIENT)


# ---------------------------------------------------------------------------------------------------------------
# compact grids (P, B): program p of batch row b loads select[b] once and, if selected, takes the tiles of BLOCK_R
# flattened rows (r = h A + a) t = p, p + P, p + 2P, ... (a runtime loop: one compiled kernel for any tile count)


@triton.jit
def _fp8_encode_compact_kernel(
    state_ptr, select_ptr, codes_ptr, scale_ptr,
    A, rows,
    stride_x_b, stride_x_h, stride_x_a, stride_x_c,
    stride_q_b, stride_q_h, stride_q_a, stride_q_c,
    stride_s_b, stride_s_h, stride_s_a,
    stride_sel,
    C: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
    SCALAR_RECIPROCAL: tl.constexpr,
    FP8_CONVERT: tl.constexpr,
):
    pid = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    if tl.load(select_ptr + b * stride_sel) != 0:
        for t in range(pid, tl.cdiv(rows, BLOCK_R), tl.num_programs(0)):
            offs_r = t * BLOCK_R + tl.arange(0, BLOCK_R)
            _fp8_encode_rows(state_ptr, codes_ptr, scale_ptr, b, offs_r // A, offs_r % A, offs_r < rows,
                             stride_x_b, stride_x_h, stride_x_a, stride_x_c,
                             stride_q_b, stride_q_h, stride_q_a, stride_q_c,
                             stride_s_b, stride_s_h, stride_s_a,
                             C, BLOCK_R, BLOCK_C, SCALAR_RECIPROCAL, FP8_CONVERT)


@triton.jit
def _row_amax_compact_kernel(
    state_ptr, select_ptr, amax_ptr,
    A, rows,
    stride_x_b, stride_x_h, stride_x_a, stride_x_c,
    stride_sel,
    C: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """As :func:`_row_amax_kernel`, one ``atomic_max`` per program over all of its tiles."""
    pid = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    if tl.load(select_ptr + b * stride_sel) != 0:
        amax = tl.zeros((), dtype=tl.float32)  # amaxes are >= 0: 0 is neutral
        for t in range(pid, tl.cdiv(rows, BLOCK_R), tl.num_programs(0)):
            offs_r = t * BLOCK_R + tl.arange(0, BLOCK_R)
            amax = tl.maximum(amax, _rows_amax(state_ptr, b, offs_r, A, rows, stride_x_b, stride_x_h, stride_x_a,
                                               stride_x_c, C, BLOCK_C))
        _merge_amax(amax_ptr, b, amax)


@triton.jit
def _nvfp4_encode_compact_kernel(
    state_ptr, select_ptr, amax_ptr, packed_ptr, block_scale_ptr, tensor_scale_ptr,
    A, rows,
    stride_x_b, stride_x_h, stride_x_a, stride_x_c,
    stride_p_b, stride_p_h, stride_p_a, stride_p_c,
    stride_bs_b, stride_bs_h, stride_bs_a, stride_bs_c,
    stride_t_b,
    stride_sel,
    C: tl.constexpr,
    NB: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_NB: tl.constexpr,
    SCALAR_RECIPROCAL: tl.constexpr,
    FP8_CONVERT: tl.constexpr,
    CONTIGUOUS_LOAD: tl.constexpr = True,
    RECIPROCAL_QUOTIENT: tl.constexpr = True,
):
    pid = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    if tl.load(select_ptr + b * stride_sel) != 0:
        g = _nvfp4_tensor_scale(amax_ptr, b, SCALAR_RECIPROCAL)
        if pid == 0:
            tl.store(tensor_scale_ptr + b * stride_t_b, g)
        for t in range(pid, tl.cdiv(rows, BLOCK_R), tl.num_programs(0)):
            offs_r = t * BLOCK_R + tl.arange(0, BLOCK_R)
            _nvfp4_encode_rows(state_ptr, packed_ptr, block_scale_ptr, b, offs_r // A, offs_r % A, offs_r < rows, g,
                               stride_x_b, stride_x_h, stride_x_a, stride_x_c,
                               stride_p_b, stride_p_h, stride_p_a, stride_p_c,
                               stride_bs_b, stride_bs_h, stride_bs_a, stride_bs_c,
                               C, NB, BLOCK_R, BLOCK_NB, SCALAR_RECIPROCAL, FP8_CONVERT, CONTIGUOUS_LOAD,
                           RECIPROCAL_QUOTIENT)


# ---------------------------------------------------------------------------------------------------------------
# launch configuration and wrapper


def reencode_launch_config(rows: int, row_width: int) -> int:
    """Rows per program for ``rows`` rows whose tile is ``row_width`` (a power of two) wide: a tile of about
    ``TILE_ELEMENTS`` elements, at least one row."""
    return max(1, min(next_power_of_2(max(rows, 1)), TILE_ELEMENTS // row_width))


def encode_constants(state: torch.Tensor) -> tuple[bool, str]:
    """(SCALAR_RECIPROCAL, FP8_CONVERT) that make an encode of ``state`` bit-identical to the torch codec on its
    device: divisions by constants as multiplications on CUDA, the hardware E4M3 conversion on sm_89+ GPUs (not
    under the interpreter, whose cast rounds differently)."""
    interpreted = os.environ.get("TRITON_INTERPRET", "0") == "1"
    native = state.is_cuda and torch.cuda.get_device_capability(state.device) >= (8, 9)
    return state.is_cuda, "hw" if native and not interpreted else "soft"


def _device_guard(t: torch.Tensor):
    return torch.cuda.device(t.device) if t.is_cuda else contextlib.nullcontext()


def _as_bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.dtype in (torch.float8_e4m3fn, torch.bool) else t


def reencode_flushed_rows(state: torch.Tensor, read_copy: dict, read_format: str, count: torch.Tensor | None,
                          amax: torch.Tensor | None = None) -> None:
    """The re-encode after a replay step's flushes folded into ``state`` (the steps' ``reencode_copy``): with device
    positions (``count`` [B], after the step) the rows whose count came back to 0, on the default (compact) grid;
    with host positions (``count`` None: every row flushed together) every row, on the per-tile grid
    (:data:`EVERY_ROW_PROGRAMS_PER_ROW`). ``amax``: the flush launches' per-row amax (nvfp4), as
    :func:`reencode_read_copy` takes it."""
    given = {} if amax is None else {"amax": amax}
    if count is not None:
        reencode_read_copy(state, read_copy, read_format, count == 0, **given)
    else:
        reencode_read_copy(state, read_copy, read_format, torch.ones(state.shape[0], dtype=torch.bool,
                                                                     device=state.device),
                           _programs_per_row=EVERY_ROW_PROGRAMS_PER_ROW, **given)


def reencode_read_copy(state: torch.Tensor, read_copy: dict, read_format: str, select: torch.Tensor, *,
                       _block_a: int | None = None, _scalar_reciprocal: bool | None = None,
                       _fp8_convert: str | None = None,
                       _programs_per_row: int | None = COMPACT_PROGRAMS_PER_ROW,
                       _nvfp4_scale_convert: str | None = None, _nvfp4_contiguous_load: bool = True,
                       _nvfp4_reciprocal_quotient: bool = True, amax: torch.Tensor | None = None) -> None:
    """Rewrite in place the read copy of the batch rows ``b`` with ``select[b] != 0`` from the checkpoint ``state``
    [B, H, A, C]: bit-identical to ``get_format(read_format).encode(state)`` for those rows; other rows' bytes are
    untouched. No host sync. ``amax`` (nvfp4 only): int32 [B] on the state's device holding, for every selected
    row, the float32 bits of ``max |state[b]|``, as :func:`accumulate_row_amax` leaves them (e.g. from the flush
    that just wrote those rows): the re-encode then skips its amax launch, one read of the checkpoint (a wrong
    amax gives a wrong copy: it is the caller's promise).

    Private overrides (tests): ``_block_a`` rows per program tile (default grid: of the encode launches; compact
    grid: of every launch, over the flattened H A rows), ``_scalar_reciprocal`` (default: the state is on CUDA),
    ``_fp8_convert`` "hw" / "soft" (default: "hw" on sm_89+ GPUs), ``_programs_per_row`` P: compact grids of
    ``(min(P, tiles), B)`` programs looping over a batch row's tiles (default :data:`COMPACT_PROGRAMS_PER_ROW`;
    None: one program per tile, see the module docstring), ``_nvfp4_scale_convert`` "hw" / "soft": the nvfp4 block
    scales' conversion (default "soft", or ``_fp8_convert`` when given), ``_nvfp4_contiguous_load``: the nvfp4
    encode loads its tile contiguously and splits it (False: the strided even / odd loads, see
    ``_nvfp4_encode_rows``), ``_nvfp4_reciprocal_quotient``: the nvfp4 encode's quotients by each block's
    reciprocal with codes by rounding (default; False: a division per element and the comparisons; the same bits)."""
    fmt = check_reencode(state, read_copy, read_format, select)
    if amax is not None:
        if fmt != "nvfp4":
            raise ValueError(f"amax= serves the nvfp4 re-encode (its tensor scale); got read_format {read_format!r}")
        if amax.dtype != torch.int32 or tuple(amax.shape) != (state.shape[0],) or amax.device != state.device:
            raise ValueError(f"amax must be int32 [{state.shape[0]}] on {state.device} (float32 bits per batch row), "
                             f"got {amax.dtype} {tuple(amax.shape)} on {amax.device}")
    programs = _programs_per_row
    if programs is not None and (isinstance(programs, bool) or not isinstance(programs, int) or programs < 1):
        raise ValueError(f"_programs_per_row must be None or an int >= 1, got {programs!r}")
    if state.numel() == 0:
        return
    batch, heads, rows_a, row = state.shape
    rows = heads * rows_a
    default_recip, default_convert = encode_constants(state)
    recip = default_recip if _scalar_reciprocal is None else _scalar_reciprocal
    convert = default_convert if _fp8_convert is None else _fp8_convert
    if convert not in ("hw", "soft"):
        raise ValueError(f"_fp8_convert must be 'hw' or 'soft', got {convert!r}")
    select = _as_bits(select)

    def compact(row_width: int) -> tuple[tuple[int, int], int]:
        """(grid, BLOCK_R) of a compact launch over tiles of flattened rows ``row_width`` wide."""
        block_r = _block_a or reencode_launch_config(rows, row_width)
        return (min(programs, cdiv(rows, block_r)), batch), block_r  # no program without a tile

    with _device_guard(state):
        block_c = next_power_of_2(row)
        if fmt == "fp8":
            codes, scale = _as_bits(read_copy["codes"]), read_copy["scale"]
            strides = (*state.stride(), *codes.stride(), *scale.stride()[:3], select.stride(0))
            if programs is None:
                block_a = _block_a or reencode_launch_config(rows_a, block_c)
                _fp8_encode_kernel[(cdiv(rows_a, block_a), heads, batch)](
                    state, select, codes, scale, rows_a, *strides, C=row, BLOCK_A=block_a, BLOCK_C=block_c,
                    SCALAR_RECIPROCAL=recip, FP8_CONVERT=convert, num_warps=NUM_WARPS)
            else:
                grid, block_r = compact(block_c)
                _fp8_encode_compact_kernel[grid](
                    state, select, codes, scale, rows_a, rows, *strides, C=row, BLOCK_R=block_r, BLOCK_C=block_c,
                    SCALAR_RECIPROCAL=recip, FP8_CONVERT=convert, num_warps=NUM_WARPS)
            return
        packed, block_scale = read_copy["packed"], _as_bits(read_copy["block_scale"])
        tensor_scale = read_copy["tensor_scale"]
        blocks = block_scale.shape[-1]
        block_nb = next_power_of_2(blocks)
        amax_given = amax is not None
        if not amax_given:
            amax = torch.zeros(batch, dtype=torch.int32, device=state.device)
        amax_args = (state, select, amax, rows_a, rows, *state.stride(), select.stride(0))
        encode_args = (state, select, amax, packed, block_scale, tensor_scale, rows_a)
        strides = (*state.stride(), *packed.stride(), *block_scale.stride(), tensor_scale.stride(0), select.stride(0))
        # the block scales' E4M3 bits by the exact integer rounding unless asked: the hardware conversion gave other
        # bits than torch's for 35-45 % of the blocks of some tiles on the H200 (run 169, benchmarks/gpu/
        # reencode_grid_probe.py; e.g. [32, 8] block tiles of a 128-wide row; fp8 copies, the same conversion on
        # [rows, C] tiles, matched everywhere)
        scale_convert = _nvfp4_scale_convert or ("soft" if _fp8_convert is None else convert)
        if scale_convert not in ("hw", "soft"):
            raise ValueError(f"_nvfp4_scale_convert must be 'hw' or 'soft', got {scale_convert!r}")
        consts = dict(C=row, NB=blocks, BLOCK_NB=block_nb, SCALAR_RECIPROCAL=recip, FP8_CONVERT=scale_convert,
                      num_warps=NUM_WARPS,
                      CONTIGUOUS_LOAD=bool(_nvfp4_contiguous_load),
                      RECIPROCAL_QUOTIENT=bool(_nvfp4_reciprocal_quotient))
        if programs is None:
            block_r = reencode_launch_config(rows, block_c)
            if not amax_given:
                _row_amax_kernel[(cdiv(rows, block_r), batch)](
                    *amax_args, C=row, BLOCK_R=block_r, BLOCK_C=block_c, num_warps=NUM_WARPS)
            block_a = _block_a or reencode_launch_config(rows_a, block_nb * 16)
            _nvfp4_encode_kernel[(cdiv(rows_a, block_a), heads, batch)](
                *encode_args, *strides, BLOCK_A=block_a, **consts)
        else:
            grid, block_r = compact(block_c)
            if not amax_given:
                _row_amax_compact_kernel[grid](*amax_args, C=row, BLOCK_R=block_r, BLOCK_C=block_c,
                                               num_warps=NUM_WARPS)
            grid, block_r = compact(block_nb * 16)
            _nvfp4_encode_compact_kernel[grid](*encode_args, rows, *strides, BLOCK_R=block_r, **consts)
