"""Reading a low-precision copy of the checkpoint inside the replay kernels, decoded in registers.

The copy's layout is the store's encoding (see :mod:`hf_replayssm.ops.read_copy`): rows are the state's last dim.
:func:`read_copy_operands` turns an encoding into the kernel operands (three pointers and nine strides, the same for
both formats); :func:`load_read_tile` loads one ``[BLOCK_A, BLOCK_C]`` tile of state ``[B, H, A, C]`` and returns it
decoded to float32, never materialising a decoded state in memory.

* ``fp8``: codes (viewed as ``float8_e4m3fn``: the hardware conversion decodes them) times the row's float32 scale.
* ``nvfp4``: element ``c`` is nibble ``c % 2`` of byte ``c // 2`` (E2M1: sign bit 3, exponent bits 2-1, mantissa
  bit 0), times its block's E4M3 scale (block ``c // 16``), times the batch row's float32 scale, multiplied in that
  order, as the torch decoder does, so both give bit-identical values. By default a byte tile is loaded once and
  both nibbles decoded and interleaved (``nvfp4_pairs``); the alternative, each byte loaded by the two lanes that
  decode its nibbles, issues twice the (unvectorised) loads and was slower on the H200.

Measured on an H200 (batch 256, ``hf-replayssm bench kernels --read-format``; ``BENCHMARKS.md``): these kernels are
not byte-bound but instruction- and register-bound (up to 255 registers per thread), so reading 1 or 0.56 bytes per
element instead of 4 does not yet make them faster than the fp32 replay, except Mamba-2 with fp8. The delta rule's
replay-only launches stream a copy K rows at a time instead of loading a whole tile here (``_chunk_k``,
``kernels.delta_rule.read_copy_stream_config``; GDN fp8 host cycle 254.5 -> 196.9 us, nvfp4 467.9 -> 285.3, KDA fp8
296.9 -> 250.3; with device positions a split step whose flush launch has a tile of its own: GDN fp8 348.5 -> 236.1,
nvfp4 532.4 -> 369.6, KDA fp8 338.3 -> 291.1).

Readers that need the copy only against a vector take an nvfp4 tile as stored, by scale block
(:func:`load_nvfp4_blocks`: bytes 8 at a time, one block scale per 8 bytes): the delta rule's streamed read folds the
scales into q and k and accumulates even and odd elements apart, Mamba-2's replay launches reduce the bytes against
C's halves (:func:`nvfp4_blocks_dot`); no interleave, one scale product per block. Both nibbles of a byte decode at
once through float16 (:func:`e2m1_pair_to_float`). H200, batch 256, host cycle: GDN nvfp4 271.2 -> 229.1 us (stored
order) -> 170.0 (blocks, pair decode), KDA 351.4 -> 268.4 -> 209.4, Mamba-2 457.3 -> 389.9 -> 290.8 (1.90x our fp32
standard step). Mamba-2's replay launches take an fp8 copy as stored too: its row scale multiplies each row's sum of
codes x C (Nemotron-H-8B host cycle 256.8 -> 244.7 us, 2.25x our standard step).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hf_replayssm.ops.read_copy import check_read_copy


def read_copy_operands(read_copy: dict | None, read_format: str | None, state: torch.Tensor) -> tuple[str, tuple]:
    """(effective read format, kernel operands): the operands are ``(values, scales, tensor_scale)`` followed by the
    strides ``values (b, h, a, c), scales (b, h, a, c), tensor_scale (b)``. Without a copy the pointers are the state
    (never read) and the strides 0."""
    fmt = check_read_copy(read_copy, read_format, state)
    if fmt == "fp32":
        return fmt, (state, state, state, *(0,) * 9)
    if fmt == "fp8":
        values, scales, tensor_scale = read_copy["codes"], read_copy["scale"], read_copy["scale"]
        tensor_strides = (0,)  # unused
    else:
        values, scales, tensor_scale = read_copy["packed"], read_copy["block_scale"], read_copy["tensor_scale"]
        tensor_strides = (tensor_scale.stride(0),)
    if values.dtype == torch.uint8 and fmt == "fp8":
        values = values.view(torch.float8_e4m3fn)  # a view: loads decode through the fp8 conversion
    if scales.dtype == torch.uint8:
        scales = scales.view(torch.float8_e4m3fn)
    return fmt, (values, scales, tensor_scale, *values.stride(), *scales.stride(), *tensor_strides)


@triton.jit
def e2m1_to_float(nibble):
    """E2M1 codes (int32 0..15) -> float32: magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6; bit 3 is the sign. Built as the
    float's bits, which costs about half the instructions of arithmetic on the fields (SASS for sm_90): a code
    ``c = 2e + m`` with e >= 1 is 2^(e-1) (1 + m/2), i.e. exponent field e + 126 and mantissa bit 22 = m, which
    ``(c << 22) + (126 << 23)`` lays out; c = 1 is 0.5 (``126 << 23``) and c = 0 is 0. Every code (and -0.0 for
    code 8) is bit-identical to the field arithmetic and to the torch decoder."""
    code = nibble & 7
    bits = tl.where(code > 1, (code << 22) + 0x3F000000, code * 0x3F000000)
    return (bits | ((nibble & 8) << 28)).to(tl.float32, bitcast=True)


# e2m1_pair_to_float's values are the codes' times this; its callers fold the factor into a scale they multiply by
# anyway (exact: a power of two)
E2M1_PAIR_UNSCALE = tl.constexpr(16384.0)


@triton.jit
def e2m1_pair_to_float(byte):
    """A byte of two E2M1 codes (int32 0..255: element 2j in the low nibble, 2j + 1 in the high one) -> the two values
    as float32, each times 2^-14 (multiply by ``E2M1_PAIR_UNSCALE`` to undo). Both are decoded at once through
    float16: a code's three magnitude bits placed at bits 9-11 of a half (the exponent's two low bits and the
    mantissa's top bit) and its sign at bit 15 give exactly the code's value times 2^-14 (code 1 lands on the half
    subnormal 2^-15), so one word holds both halves after three integer operations, and the hardware converts each
    half; about half the SASS instructions of two :func:`e2m1_to_float` calls. Bit-identical to them after the
    rescaling (every code, -0.0 included)."""
    both = byte | (byte << 12)  # low nibble at bits 0-3, high nibble at bits 16-19
    halves = ((both & 0x70007) << 9) | ((both & 0x80008) << 12)
    low = halves.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    high = (halves >> 16).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    return low, high


@triton.jit
def code_offsets(offs, CODE_VECTOR: tl.constexpr):
    """``offs`` (contiguous offsets of fp8 codes) as equal values whose provable contiguity is ``CODE_VECTOR``
    ((c // n) * n + c % n), so that Triton loads the codes at most that many to a vector; 0: ``offs`` itself (the
    compiler's widest, 16 codes to a thread). The vector width sets the layout of what a kernel computes from the
    loaded tile (``delta_rule._replay_step``'s ``_flush_code_vector``)."""
    if CODE_VECTOR > 0:
        return (offs // CODE_VECTOR) * CODE_VECTOR + offs % CODE_VECTOR
    return offs


@triton.jit
def load_read_tile(values_ptr, scales_ptr, tensor_scale_ptr, pid_b, h, offs_a, offs_c, mask, row_mask, c_start,
                   row_len, stride_v_b, stride_v_h, stride_v_a, stride_v_c,
                   stride_s_b, stride_s_h, stride_s_a, stride_s_c, stride_t_b,
                   READ_FORMAT: tl.constexpr, BLOCK_C: tl.constexpr, SCALE_PER_ROW: tl.constexpr,
                   CODE_VECTOR: tl.constexpr = 0):
    """The decoded float32 tile ``[len(offs_a), BLOCK_C]`` of head ``h`` of batch row ``pid_b`` (0 where ``mask``
    is false) of a read copy in ``READ_FORMAT`` ("fp8", "nvfp4" or "nvfp4_pairs"). ``offs_c`` = ``c_start +
    arange(BLOCK_C)``; ``mask`` = ``row_mask[:, None] & (offs_c < row_len)`` (the rows that read the copy, the row
    length). fp8 scales: ``SCALE_PER_ROW`` loads one per row under ``row_mask`` ([BLOCK_A, 1], broadcast), else one
    per element under ``mask``. Which is faster depends on the kernel's tile layout (H200, batch 256, host-phase
    cycle: Mamba-2 257 us per row vs 361 per element; GDN 463 per row vs 311 per element), so each family picks.
    fp8 codes: loaded at most ``CODE_VECTOR`` to a vector (:func:`code_offsets`; 0: the compiler's widest).

    "nvfp4" has each lane load the byte of its own nibble (two loads per byte, not vectorised); "nvfp4_pairs" loads
    a ``[BLOCK_A, BLOCK_C // 2]`` byte tile once (contiguous, vectorisable), decodes both nibbles and interleaves them
    (``tl.join`` + ``tl.reshape``: a register shuffle the compiler may route through shared memory). Same values;
    the pairs were faster in every H200 measurement (batch 256, host-phase cycle: Mamba-2 672 vs 1088 us, GDN 673
    vs 712), so the kernels use them unless told otherwise (``_nvfp4_pairs=False``). A tile 16 or more wide loads by
    scale block (:func:`load_nvfp4_blocks`: one scale load per 8 bytes, not per byte). ``c_start`` must be a
    multiple of ``BLOCK_C`` (so of 16 for the block loads, even for narrower tiles)."""
    v_base = values_ptr + pid_b * stride_v_b + h * stride_v_h + offs_a[:, None] * stride_v_a
    s_base = scales_ptr + pid_b * stride_s_b + h * stride_s_h + offs_a[:, None] * stride_s_a
    if READ_FORMAT == "fp8":
        codes = tl.load(v_base + code_offsets(offs_c, CODE_VECTOR)[None, :] * stride_v_c, mask=mask, other=0.0)
        if SCALE_PER_ROW:
            row_scale = tl.load(s_base, mask=row_mask[:, None], other=0.0)  # [BLOCK_A, 1]
        else:
            row_scale = tl.load(s_base + offs_c[None, :] * 0, mask=mask, other=0.0)  # the row's scale, per element
        return codes.to(tl.float32) * row_scale
    elif READ_FORMAT == "nvfp4_pairs":
        v_head = values_ptr + pid_b * stride_v_b + h * stride_v_h
        s_head = scales_ptr + pid_b * stride_s_b + h * stride_s_h
        tensor_scale = tl.load(tensor_scale_ptr + pid_b * stride_t_b)
        if BLOCK_C >= 16:  # by scale block: one scale load per 8 bytes (c_start is a multiple of BLOCK_C)
            offs_b = c_start // 16 + tl.arange(0, BLOCK_C // 16)
            byte, block_scale = load_nvfp4_blocks(v_head, s_head, offs_a, row_mask, offs_b, row_len, stride_v_a,
                                                  stride_v_c, stride_s_a, stride_s_c)
            block_scale = (block_scale.to(tl.float32) * E2M1_PAIR_UNSCALE)[:, :, None]
        else:  # a tile narrower than a scale block
            offs_j = c_start // 2 + tl.arange(0, BLOCK_C // 2)  # byte j holds elements 2j (low nibble) and 2j + 1
            byte, block_scale = load_nvfp4_bytes(v_head, s_head, offs_a, row_mask, offs_j, row_len, stride_v_a,
                                                 stride_v_c, stride_s_a, stride_s_c)
            block_scale = block_scale.to(tl.float32) * E2M1_PAIR_UNSCALE
        low, high = e2m1_pair_to_float(byte.to(tl.int32))  # (an odd row's last high nibble is padding)
        low = (low * block_scale) * tensor_scale  # the torch decoder's order: bit-identical values
        high = (high * block_scale) * tensor_scale
        return tl.reshape(tl.join(low, high), [offs_a.shape[0], BLOCK_C])
    else:
        byte = tl.load(v_base + (offs_c // 2)[None, :] * stride_v_c, mask=mask, other=0).to(tl.int32)
        nibble = (byte >> ((offs_c % 2) * 4)[None, :]) & 0xF
        block_scale = tl.load(s_base + (offs_c // 16)[None, :] * stride_s_c, mask=mask, other=0.0)
        tensor_scale = tl.load(tensor_scale_ptr + pid_b * stride_t_b)
        return (e2m1_to_float(nibble) * block_scale.to(tl.float32)) * tensor_scale


@triton.jit
def load_nvfp4_bytes(v_base, s_base, offs_a, row_mask, offs_j, row_len, stride_v_a, stride_v_c, stride_s_a,
                     stride_s_c):
    """Rows ``offs_a`` of an nvfp4 copy (bases already at the batch row and head) as stored: packed bytes
    ``[len(offs_a), len(offs_j)]`` (byte j: element 2j in the low nibble, 2j + 1 in the high one) and each byte's
    block scale (block j // 8), 0 where masked: the whole-tile reader :func:`load_read_tile` (readers that need the
    copy only against a vector take it by block, :func:`load_nvfp4_blocks`)."""
    mask = row_mask[:, None] & (offs_j < row_len - row_len // 2)[None, :]  # (ceil(row_len / 2): load_nvfp4_blocks)
    byte = tl.load(v_base + offs_a[:, None] * stride_v_a + offs_j[None, :] * stride_v_c, mask=mask, other=0)
    block_scale = tl.load(s_base + offs_a[:, None] * stride_s_a + (offs_j // 8)[None, :] * stride_s_c, mask=mask,
                          other=0.0)
    return byte, block_scale


@triton.jit
def load_nvfp4_blocks(v_base, s_base, offs_a, row_mask, offs_b, row_len, stride_v_a, stride_v_c, stride_s_a,
                      stride_s_c):
    """Rows ``offs_a`` of an nvfp4 copy (bases at the batch row and head) by scale block: bytes
    ``[len(offs_a), len(offs_b), 8]`` (block b holds bytes 8b to 8b + 7, elements 16b to 16b + 15) and one block
    scale per block ``[len(offs_a), len(offs_b)]``, 0 where masked. Loading a scale per block instead of per byte
    (:func:`load_nvfp4_bytes`) saves a load instruction for each of the other seven bytes."""
    offs_j = offs_b[:, None] * 8 + tl.arange(0, 8)[None, :]  # [NB, 8] (callers' tiles span whole 16-element blocks)
    # bytes holding an element: ceil(row_len / 2), written so that the compiler sees a row length divisible by 16
    # give a byte count divisible by 8 (the mask then constant over 8 bytes: one 64-bit load, not eight)
    mask = row_mask[:, None, None] & (offs_j < row_len - row_len // 2)[None, :, :]
    byte = tl.load(v_base + offs_a[:, None, None] * stride_v_a + offs_j[None, :, :] * stride_v_c, mask=mask, other=0)
    scale_mask = row_mask[:, None] & (offs_b * 16 < row_len)[None, :]
    block_scale = tl.load(s_base + offs_a[:, None] * stride_s_a + offs_b[None, :] * stride_s_c, mask=scale_mask,
                          other=0.0)
    return byte, block_scale


@triton.jit
def nvfp4_blocks_dot(byte, block_scale, vec, BLOCK_C: tl.constexpr):
    """Each row of an nvfp4 tile by block (:func:`load_nvfp4_blocks`, the tensor scale left to the caller) against
    ``vec`` [BLOCK_C]: [rows]. A block's 8 bytes meet the vector's even and odd halves and are summed before their
    block scale multiplies them, once per block."""
    tl.static_assert(BLOCK_C >= 16, "an nvfp4 tile is read by 16-element scale blocks")
    vec_even, vec_odd = tl.split(tl.reshape(vec * E2M1_PAIR_UNSCALE, [BLOCK_C // 2, 2]))
    vec_even = tl.reshape(vec_even, [BLOCK_C // 16, 8])
    vec_odd = tl.reshape(vec_odd, [BLOCK_C // 16, 8])
    low, high = e2m1_pair_to_float(byte.to(tl.int32))
    pairs = low * vec_even[None, :, :] + high * vec_odd[None, :, :]
    return tl.sum(tl.sum(pairs, axis=2) * block_scale.to(tl.float32), axis=1)
