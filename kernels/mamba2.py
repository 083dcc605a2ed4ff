"""Triton decode-step kernels for Mamba-2 layers: the ReplaySSM replay-or-flush step and the standard step.

Entry points (each with a torch reference of the same signature, re-exported here from
``hf_replayssm.ops.mamba2_step``):

* :func:`mamba2_replay_step` / :func:`mamba2_replay_step_ref`: one decode token per batch row. Rows whose ring is
  not full compute ``y`` from the float32 checkpoint plus the buffered records and only append a record; rows that
  reach ``buffer_len`` fold the records and the token into the checkpoint in place. Decided per row on
  the device: by default two launches in stream order (``PHASE`` 3, flush-only, whose programs of replaying rows
  exit after reading the count; then ``PHASE`` 4, replay-only, which also updates every row's count), so that no
  program carries the other phase's registers (the fused kernel was 1.4x slower than the phase-specialised host
  launches at batch 256 on an H200); one fused launch (``PHASE`` 0) on request.
* :func:`mamba2_state_update` / :func:`mamba2_state_update_ref`: the standard step (read state, update, write in
  place, output), i.e. mamba_ssm's ``selective_state_update`` for Mamba-2 (scalar ``A``/``dt``/``D`` per head).

Shapes (B = batch, H = heads, P = head_dim, G = groups with H % G == 0, N = d_state, R = ring capacity):
state [B, H, P, N]; ring_x [B, R, H, P]; ring_dt [B, R, H] float32; ring_B [B, R, G, N]; origin, count [B] int32;
x, z [B, H, P]; dt [B, H]; B, C [B, G, N]; A, D, dt_bias [H]. Every stride is passed to the kernels, so views
(e.g. slices of a larger pool, x/B/C split out of one projection) work without copies; only ``origin``/``count``
must be int32.

Design notes:

* Grid ``(cdiv(P, BLOCK_P), B, H)``; each program keeps a ``[BLOCK_P, next_pow2(N)]`` float32 tile of one head's
  state in registers. No autotuning (the kernels write state); the launch configuration comes from
  :func:`replay_launch_config` / :func:`state_update_launch_config` (picked from an H200 sweep) and can be
  overridden through the private ``_config`` argument of ``_replay_step`` / ``_state_update`` (the benchmark
  sweeps it).
* Replay math (per program, ``m`` = current token, records ``j < count``; ``la_i = A dt_i``):
  ``seg_j = sum_{j<i<count} la_i + la_m`` is summed directly over the records in between (never the difference of
  two long cumulative sums, see ``hf_replayssm/ops/decay.py``), ``lam = sum_{i<count} la_i + la_m``,
  ``w_j = dt_j exp(seg_j)``; ``y = exp(lam) (S0 C) + sum_j w_j (B_j . C) x_j + dt_m (B_m . C) x_m + D x_m``.
* Flush: the records and the token are folded by the sequential recurrence ``S = exp(A dt_j) S + dt_j x_j B_j^T``
  (the standard step's exact arithmetic, so the checkpoint equals what stepping gives), then ``y = S C + D x_m``.
  All math is fp32 on CUDA cores, no ``tl.dot`` and hence no tf32 question: an ieee ``tl.dot`` for
  ``X^T diag(w) B`` was tried and needed ~250 registers per thread, which throttled every (non-flush) program of
  the launch, since a kernel's register allocation is its worst branch's. bf16/fp16 inputs are upcast to fp32
  right after loading (also required by ``TRITON_INTERPRET=1``).
* Issue order: the state tile is loaded first, then the row's count/origin and the token, then the records (their
  addresses wait for origin/count): GPUs issue in order, so a load placed after an instruction that waits on
  another load (or a barrier) adds a full memory round trip to every program.
* The per-row phase is read on the device; the count update needs no second launch. Each program reads the count
  (low 16 bits of ``count[b]``) at its start and takes a ticket with ``atomic_add(count[b], 1 << 16)`` at its end;
  the program that draws the row's last ticket (every program of the row has read the count by then) writes the
  new count with an atomic exchange, which also clears the ticket bits. Relaxed atomics suffice (only ``count[b]``
  is communicated, ordered by that address's coherence). Hence ``buffer_len < 2**16`` and fewer than ``2**15``
  programs per row (asserted), and ``count`` must not be shared by two launches that run concurrently (e.g. several
  layers on different streams; sequential launches sharing it would also see each other's updates).
* ``origin`` is never modified: after a flush the ring restarts at slot ``origin[b]``.
* Records are appended by the programs that own them: x by every P tile, dt by P tile 0, B by P tile 0 of the first
  head of each group. The appended slot ``(origin + count) % R`` differs from every slot read in the same launch
  because ``count + 1 < buffer_len <= R + 1``.
* Host positions (``origin``/``count`` as ints: every row at one position, plain batched decoding) select a
  kernel specialised to the phase (constexpr ``PHASE`` 1 / 2): the replay-only program carries no flush code and
  needs no position load or count update, and the flush-only program folds the records in closed form
  (``exp(lam) S0 + X^T diag(w) B``, one ``tl.dot`` in tf32x3, i.e. float32 accuracy) with all records loaded at once
  instead of a chain of dependent per-record loads. The fused device-phase kernel (``PHASE`` 0) keeps the
  sequential fold (fewer registers for every program of the launch).
* Read copy (separated precision, ``read_copy``/``read_format``): replaying rows take ``S0 C`` from a
  low-precision copy of the checkpoint (fp8 / nvfp4, the store's encoding), decoded tile by tile in registers by
  ``kernels/read_copy.py``; the replay-only kernel then never reads the fp32 checkpoint. The flush-only kernel is
  unchanged (the copy is not passed to it). The fused kernel loads the row's count before its state tile (one
  extra round trip) and reads either the checkpoint (flush rows) or the copy (replay rows) through masked loads.
  Nothing re-encodes the copy: the caller refreshes it after a flush. Measured (H200, Nemotron-H-8B shape, batch
  256, ``--read-format``): host-phase cycle with an fp8 copy 257 us (2.15x the standard step; fp32 replay 345 us),
  nvfp4 672 us; the device-phase kernels reading a copy are slower (fp8 557 us in phase, nvfp4 1088 us, with
  register spills): see ``BENCHMARKS.md``.
* Measured on an H200 (``python -m hf_replayssm.kernels.bench``; cold L2, CUDA graphs, averaged over whole cycles
  of L=16), Nemotron-H-8B shape, batch 256: host-phase cycle 345 us vs 553 us for this module's standard step
  (1.60x, 82 % of copy bandwidth; replay-only launch 334 us, flush-only 750 us); the fused device-phase kernel
  484 us (1.15x). See ``BENCHMARKS.md``.
"""

from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

from hf_replayssm.kernels.counts import advance_counts
from hf_replayssm.kernels.flush_grid import (
    due_item,
    due_rows,
    flush_grid_programs,
    use_device_grid,
    walk_item,
    walk_positions,
)
from hf_replayssm.kernels.host_math import cdiv, next_power_of_2
from hf_replayssm.kernels.read_copy import load_nvfp4_blocks, load_read_tile, nvfp4_blocks_dot, read_copy_operands
from hf_replayssm.kernels.read_copy_encode import (
    encode_constants,
    fp8_encode_tile,
    reencode_flushed_rows,
    store_flushed_tile,
)
from hf_replayssm.ops.mamba2_step import mamba2_replay_step_ref, mamba2_state_update_ref
from hf_replayssm.ops.positions import host_phase

__all__ = [
    "host_flush_launch_config",
    "mamba2_replay_step",
    "mamba2_replay_step_ref",
    "mamba2_state_update",
    "mamba2_state_update_ref",
    "replay_launch_config",
    "state_update_launch_config",
]

_TICKET_SHIFT = 16
FLUSH_PRECISION = "tf32x3"  # input precision of the flush-only kernel's tl.dot (float32 accuracy on tensor cores)
LAST_COMPILED: dict = {}  # last compiled kernel per entry point (n_regs / n_spills for the benchmark)


@triton.jit
def _softplus(x):
    # torch.nn.functional.softplus (threshold 20) as max(x, 0) + log1p(exp(-|x|)), with log1p(u) ~ u - u^2/2 for
    # tiny u (plain log(1 + u) would round those to 0).
    u = tl.exp(-tl.abs(x))
    log1p_u = tl.where(u < 1e-4, u * (1.0 - 0.5 * u), tl.log(1.0 + u))
    return tl.where(x > 20.0, x, tl.maximum(x, 0.0) + log1p_u)


@triton.jit
def _token_dt(dt_ptr, dt_bias_ptr, pid_b, h, stride_dt_b, stride_dt_h, stride_dt_bias,
              HAS_DT_BIAS: tl.constexpr, DT_SOFTPLUS: tl.constexpr):
    dt = tl.load(dt_ptr + pid_b * stride_dt_b + h * stride_dt_h).to(tl.float32)
    if HAS_DT_BIAS:
        dt += tl.load(dt_bias_ptr + h * stride_dt_bias).to(tl.float32)
    if DT_SOFTPLUS:
        dt = _softplus(dt)
    return dt


@triton.jit
def _mamba2_records(ring_x_ptr, ring_dt_ptr, ring_B_ptr, pid_b, h, group, origin, count, ring_size, offs_p, offs_n,
                    mask_p, mask_n, la_m, A_h,
                    stride_rx_b, stride_rx_r, stride_rx_h, stride_rx_p,
                    stride_rdt_b, stride_rdt_r, stride_rdt_h,
                    stride_rB_b, stride_rB_r, stride_rB_g, stride_rB_n,
                    BLOCK_R: tl.constexpr, RING_PHYSICAL: tl.constexpr):
    """The ``count`` committed records as tiles x_r [R, BLOCK_P], B_r [R, N] with their weights
    ``w_j = dt_j exp(seg_j)`` (0 for empty slots) and the log decay ``lam`` from the checkpoint to the token."""
    offs_r = tl.arange(0, BLOCK_R)
    if RING_PHYSICAL:
        # Every physical slot, whose addresses do not wait for origin/count; a slot's logical position decides.
        slots = offs_r
        pos = (offs_r - origin + ring_size) % ring_size
        valid = (offs_r < ring_size) & (pos < count)
    else:
        pos = offs_r
        valid = offs_r < count
        slots = (origin + offs_r) % ring_size
    x_r = tl.load(ring_x_ptr + pid_b * stride_rx_b + slots[:, None] * stride_rx_r + h * stride_rx_h
                  + offs_p[None, :] * stride_rx_p, mask=valid[:, None] & mask_p[None, :], other=0.0).to(tl.float32)
    dt_r = tl.load(ring_dt_ptr + pid_b * stride_rdt_b + slots * stride_rdt_r + h * stride_rdt_h,
                   mask=valid, other=0.0).to(tl.float32)
    B_r = tl.load(ring_B_ptr + pid_b * stride_rB_b + slots[:, None] * stride_rB_r + group * stride_rB_g
                  + offs_n[None, :] * stride_rB_n, mask=valid[:, None] & mask_n[None, :], other=0.0).to(tl.float32)
    w, lam = _mamba2_record_decays(dt_r, valid, pos, la_m, A_h)
    return x_r, B_r, w, lam


@triton.jit
def _mamba2_record_decays(dt_r, valid, pos, la_m, A_h):
    """The records' weights ``w_j = dt_j exp(seg_j)`` [R] (0 for empty slots) and the log decay ``lam`` from the
    checkpoint to the token; the log decays as direct sums of the terms in between (invalid records contribute 0)."""
    la_r = A_h * dt_r
    after = pos[None, :] > pos[:, None]  # [j, i]: record i comes after record j
    seg = tl.sum(tl.where(after, la_r[None, :], 0.0), axis=1) + la_m  # log decay record j -> token m
    lam = tl.sum(la_r, axis=0) + la_m  # log decay checkpoint -> token m
    return tl.where(valid, dt_r * tl.exp(seg), 0.0), lam


@triton.jit
def _mamba2_weights_kernel(
    ring_dt_ptr, ring_B_ptr, origin_ptr, count_ptr, dt_ptr, B_ptr, C_ptr, A_ptr, dt_bias_ptr, weights_ptr,
    N, ring_size, heads_per_group, origin_host, count_host,
    stride_rdt_b, stride_rdt_r, stride_rdt_h,
    stride_rB_b, stride_rB_r, stride_rB_g, stride_rB_n,
    stride_origin, stride_count,
    stride_dt_b, stride_dt_h,
    stride_B_b, stride_B_g, stride_B_n,
    stride_C_b, stride_C_g, stride_C_n,
    stride_A, stride_dt_bias,
    DEVICE_POSITIONS: tl.constexpr,
    HAS_DT_BIAS: tl.constexpr,
    DT_SOFTPLUS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_R: tl.constexpr,
):
    """A head's replay quantities that do not depend on P, once per (row, head), into ``weights`` [B, H, BLOCK_R + 2]:
    each record's coefficient ``w_j (B_j . C_m)`` [BLOCK_R] (records in logical order), ``exp(lam)`` and the token's
    ``dt_m (B_m . C_m)``. The replay programs of the head's P tiles then read them instead of each loading the
    records' B [R, N] and reducing it against C (the ``WEIGHTS_GIVEN`` form of :func:`_mamba2_replay_math`, the same
    expressions). Grid (B, H); positions as the replay launch reads them (the counts before the step)."""
    pid_b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    group = h // heads_per_group
    if DEVICE_POSITIONS:
        origin = tl.load(origin_ptr + pid_b * stride_origin)
        count = tl.load(count_ptr + pid_b * stride_count, volatile=True) & 0xFFFF
    else:
        origin = origin_host
        count = count_host
    offs_n = tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    offs_r = tl.arange(0, BLOCK_R)
    valid = offs_r < count
    slots = (origin + offs_r) % ring_size
    dt_m = _token_dt(dt_ptr, dt_bias_ptr, pid_b, h, stride_dt_b, stride_dt_h, stride_dt_bias, HAS_DT_BIAS,
                     DT_SOFTPLUS)
    A_h = tl.load(A_ptr + h * stride_A).to(tl.float32)
    B_f = tl.load(B_ptr + pid_b * stride_B_b + group * stride_B_g + offs_n * stride_B_n, mask=mask_n,
                  other=0.0).to(tl.float32)
    C_f = tl.load(C_ptr + pid_b * stride_C_b + group * stride_C_g + offs_n * stride_C_n, mask=mask_n,
                  other=0.0).to(tl.float32)
    dt_r = tl.load(ring_dt_ptr + pid_b * stride_rdt_b + slots * stride_rdt_r + h * stride_rdt_h,
                   mask=valid, other=0.0).to(tl.float32)
    B_r = tl.load(ring_B_ptr + pid_b * stride_rB_b + slots[:, None] * stride_rB_r + group * stride_rB_g
                  + offs_n[None, :] * stride_rB_n, mask=valid[:, None] & mask_n[None, :], other=0.0).to(tl.float32)
    w, lam = _mamba2_record_decays(dt_r, valid, offs_r, A_h * dt_m, A_h)
    w_base = weights_ptr + (pid_b * tl.num_programs(1) + h) * (BLOCK_R + 2)
    tl.store(w_base + offs_r, w * tl.sum(B_r * C_f[None, :], axis=1))
    tl.store(w_base + BLOCK_R, tl.exp(lam))
    tl.store(w_base + BLOCK_R + 1, dt_m * tl.sum(B_f * C_f, axis=0))


@triton.jit
def _mamba2_replay_math(s0, ring_x_ptr, ring_dt_ptr, ring_B_ptr, pid_b, h, group, pid_p, origin, count, ring_size,
                        heads_per_group, offs_p, offs_n, mask_p, mask_n, x_m, B_m, x_f, B_f, C_f, dt_m, la_m, A_h,
                        stride_rx_b, stride_rx_r, stride_rx_h, stride_rx_p,
                        stride_rdt_b, stride_rdt_r, stride_rdt_h,
                        stride_rB_b, stride_rB_r, stride_rB_g, stride_rB_n,
                        BLOCK_R: tl.constexpr, RING_PHYSICAL: tl.constexpr, append=True, w_base=0,
                        WEIGHTS_GIVEN: tl.constexpr = False, S0_IS_PRODUCT: tl.constexpr = False):
    """Replay: y from the checkpoint tile ``s0`` [BLOCK_P, BLOCK_N] (or, S0_IS_PRODUCT, its product with C already
    taken, S0 C_m [BLOCK_P]: a read copy reduced as stored) and the ``count`` committed records, then append the
    token's record (unless ``append`` is false: a flushing row's output from the read copy, FLUSH_READS_COPY).
    WEIGHTS_GIVEN: the records' coefficients, exp(lam) and the token's term come from ``_mamba2_weights_kernel`` at
    ``w_base`` (records in logical order), so only the records' x are loaded here. A tile's product with C is taken
    after the records' loads, as before the as-stored readers: reduced first, the fp32 host-phase replay compiled to
    110 registers instead of 167 and its cycle measured 369 us against 345-349 at batch 256 (runs 144 / 148 against
    116 / 124, Nemotron-H-8B)."""
    if WEIGHTS_GIVEN:
        offs_r = tl.arange(0, BLOCK_R)
        valid = offs_r < count
        slots = (origin + offs_r) % ring_size
        x_r = tl.load(ring_x_ptr + pid_b * stride_rx_b + slots[:, None] * stride_rx_r + h * stride_rx_h
                      + offs_p[None, :] * stride_rx_p, mask=valid[:, None] & mask_p[None, :], other=0.0
                      ).to(tl.float32)
        y = (tl.load(w_base + BLOCK_R) * (s0 if S0_IS_PRODUCT else tl.sum(s0 * C_f[None, :], axis=1))
             + tl.sum(tl.load(w_base + offs_r)[:, None] * x_r, axis=0) + tl.load(w_base + BLOCK_R + 1) * x_f)
    else:
        x_r, B_r, w, lam = _mamba2_records(
            ring_x_ptr, ring_dt_ptr, ring_B_ptr, pid_b, h, group, origin, count, ring_size, offs_p, offs_n, mask_p,
            mask_n, la_m, A_h, stride_rx_b, stride_rx_r, stride_rx_h, stride_rx_p, stride_rdt_b, stride_rdt_r,
            stride_rdt_h, stride_rB_b, stride_rB_r, stride_rB_g, stride_rB_n, BLOCK_R, RING_PHYSICAL)
        bc = tl.sum(B_r * C_f[None, :], axis=1)  # [R]: B_j . C_m
        bc_m = tl.sum(B_f * C_f, axis=0)
        y = (tl.exp(lam) * (s0 if S0_IS_PRODUCT else tl.sum(s0 * C_f[None, :], axis=1))
             + tl.sum((w * bc)[:, None] * x_r, axis=0)
             + (dt_m * bc_m) * x_f)
    # Append the token's record: x by every P tile, dt by P tile 0, B by P tile 0 of the group's first head (no
    # writer at all, writer_p = -1, and no x lanes when not appending).
    slot = (origin + count) % ring_size
    writer_p = tl.where(append, 0, -1)
    tl.store(ring_x_ptr + pid_b * stride_rx_b + slot * stride_rx_r + h * stride_rx_h + offs_p * stride_rx_p,
             x_m.to(ring_x_ptr.dtype.element_ty), mask=mask_p & (offs_p < tl.where(append, 2147483647, 0)))
    if pid_p == writer_p:
        tl.store(ring_dt_ptr + pid_b * stride_rdt_b + slot * stride_rdt_r + h * stride_rdt_h,
                 dt_m.to(ring_dt_ptr.dtype.element_ty))
        if h % heads_per_group == 0:
            tl.store(ring_B_ptr + pid_b * stride_rB_b + slot * stride_rB_r + group * stride_rB_g
                     + offs_n * stride_rB_n, B_m.to(ring_B_ptr.dtype.element_ty), mask=mask_n)
    return y


@triton.jit
def _mamba2_token(x_ptr, dt_ptr, B_ptr, C_ptr, A_ptr, D_ptr, z_ptr, dt_bias_ptr, pid_b, h, group, offs_p, offs_n,
                  mask_p, mask_n, stride_x_b, stride_x_h, stride_x_p, stride_dt_b, stride_dt_h,
                  stride_B_b, stride_B_g, stride_B_n, stride_C_b, stride_C_g, stride_C_n,
                  stride_A, stride_D, stride_dt_bias, stride_z_b, stride_z_h, stride_z_p,
                  HAS_D: tl.constexpr, HAS_Z: tl.constexpr, HAS_DT_BIAS: tl.constexpr, DT_SOFTPLUS: tl.constexpr):
    """One (row, head, P tile)'s token: every load before any arithmetic on a loaded value. Returns x and B as
    loaded, x / B / C in float32, dt (biased, softplus'd), A dt, A, and D and z (0.0 where absent)."""
    dt_raw = tl.load(dt_ptr + pid_b * stride_dt_b + h * stride_dt_h)
    if HAS_DT_BIAS:
        dt_bias = tl.load(dt_bias_ptr + h * stride_dt_bias)
    A_h = tl.load(A_ptr + h * stride_A).to(tl.float32)
    D_h = 0.0
    if HAS_D:
        D_h = tl.load(D_ptr + h * stride_D).to(tl.float32)
    x_m = tl.load(x_ptr + pid_b * stride_x_b + h * stride_x_h + offs_p * stride_x_p, mask=mask_p, other=0.0)
    B_m = tl.load(B_ptr + pid_b * stride_B_b + group * stride_B_g + offs_n * stride_B_n, mask=mask_n, other=0.0)
    C_m = tl.load(C_ptr + pid_b * stride_C_b + group * stride_C_g + offs_n * stride_C_n, mask=mask_n, other=0.0)
    z = 0.0
    if HAS_Z:
        z = tl.load(z_ptr + pid_b * stride_z_b + h * stride_z_h + offs_p * stride_z_p, mask=mask_p, other=0.0)
    dt_m = dt_raw.to(tl.float32)
    if HAS_DT_BIAS:
        dt_m += dt_bias.to(tl.float32)
    if DT_SOFTPLUS:
        dt_m = _softplus(dt_m)
    return (x_m, B_m, x_m.to(tl.float32), B_m.to(tl.float32), C_m.to(tl.float32), dt_m, A_h * dt_m, A_h, D_h, z)


@triton.jit
def _mamba2_store_y(y, x_f, D_h, z, y_ptr, pid_b, h, offs_p, mask_p, stride_y_b, stride_y_h, stride_y_p,
                    HAS_D: tl.constexpr, HAS_Z: tl.constexpr):
    """y + D x, gated by z silu(z) where given, stored in y's dtype."""
    if HAS_D:
        y += D_h * x_f
    if HAS_Z:
        z_f = z.to(tl.float32)
        y *= z_f * tl.sigmoid(z_f)
    tl.store(y_ptr + pid_b * stride_y_b + h * stride_y_h + offs_p * stride_y_p, y.to(y_ptr.dtype.element_ty),
             mask=mask_p)


@triton.jit
def _encode_flushed_fp8(s_new, state_ptrs, mask_pn, mask_p, rc_values_ptr, rc_scales_ptr, pid_b, h, offs_p, offs_n,
                        stride_rcv_b, stride_rcv_h, stride_rcv_p, stride_rcv_n, stride_rcs_b, stride_rcs_h,
                        stride_rcs_p, ENCODE_SCALAR_RECIPROCAL: tl.constexpr, ENCODE_FP8_CONVERT: tl.constexpr):
    """_encode_in_flush: the fp8 copy of a flush's new checkpoint tile from its registers (whole rows: N <= BLOCK_N),
    of the values as stored (rounded to the checkpoint's dtype): the re-encode's bits."""
    fp8_encode_tile(s_new.to(state_ptrs.dtype.element_ty).to(tl.float32), mask_pn, mask_p,
                    rc_values_ptr + pid_b * stride_rcv_b + h * stride_rcv_h + offs_p[:, None] * stride_rcv_p
                    + offs_n[None, :] * stride_rcv_n,
                    rc_scales_ptr + pid_b * stride_rcs_b + h * stride_rcs_h + offs_p * stride_rcs_p,
                    ENCODE_SCALAR_RECIPROCAL, ENCODE_FP8_CONVERT)


@triton.jit
def _mamba2_flushed_state(s0, state_ptrs, mask_pn, ring_x_ptr, ring_dt_ptr, ring_B_ptr, pid_b, h, group, origin,
                          count, ring_size, offs_p, offs_n, mask_p, mask_n, x_f, B_f, dt_m, la_m, A_h,
                          stride_rx_b, stride_rx_r, stride_rx_h, stride_rx_p,
                          stride_rdt_b, stride_rdt_r, stride_rdt_h,
                          stride_rB_b, stride_rB_r, stride_rB_g, stride_rB_n,
                          FOLD_UNROLL: tl.constexpr, FLUSH_DOT: tl.constexpr, FLUSH_PRECISION: tl.constexpr,
                          BLOCK_R: tl.constexpr, amax_ptr, FLUSH_AMAX: tl.constexpr):
    """Flush: fold the records and the token into the checkpoint in place; returns the new state tile (a flush's
    output from it: ``tl.sum(s * C[None, :], axis=1)``). FLUSH_DOT: the
    closed form ``exp(lam) S0 + X^T diag(w) B + token`` with all records loaded at once (one tl.dot, tf32x3 =
    float32 accuracy); otherwise the sequential recurrence (the standard step's arithmetic) over records read
    FOLD_UNROLL at a time: fewer registers than the closed form, but a chain of about count / FOLD_UNROLL dependent
    round trips to memory (FOLD_UNROLL >= count: one; the same arithmetic at every FOLD_UNROLL). FLUSH_AMAX: the
    stored tile's max |s| is folded into ``amax_ptr[pid_b]`` (read_copy_encode.store_flushed_tile), the nvfp4
    re-encode's first pass."""
    if FLUSH_DOT:
        x_r, B_r, w, lam = _mamba2_records(
            ring_x_ptr, ring_dt_ptr, ring_B_ptr, pid_b, h, group, origin, count, ring_size, offs_p, offs_n, mask_p,
            mask_n, la_m, A_h, stride_rx_b, stride_rx_r, stride_rx_h, stride_rx_p, stride_rdt_b, stride_rdt_r,
            stride_rdt_h, stride_rB_b, stride_rB_r, stride_rB_g, stride_rB_n, BLOCK_R, False)
        s = (s0 * tl.exp(lam) + tl.dot(tl.trans(x_r * w[:, None]), B_r, input_precision=FLUSH_PRECISION)
             + (dt_m * x_f)[:, None] * B_f[None, :])
        store_flushed_tile(s, state_ptrs, mask_pn, amax_ptr, pid_b, FLUSH_AMAX)
        return s
    s = s0
    for j0 in range(0, count, FOLD_UNROLL):
        for jj in tl.static_range(FOLD_UNROLL):
            j = j0 + jj
            slot_j = (origin + j) % ring_size  # a valid slot even for j >= count (discarded below)
            dt_j = tl.load(ring_dt_ptr + pid_b * stride_rdt_b + slot_j * stride_rdt_r + h * stride_rdt_h)
            x_j = tl.load(ring_x_ptr + pid_b * stride_rx_b + slot_j * stride_rx_r + h * stride_rx_h
                          + offs_p * stride_rx_p, mask=mask_p, other=0.0).to(tl.float32)
            B_j = tl.load(ring_B_ptr + pid_b * stride_rB_b + slot_j * stride_rB_r + group * stride_rB_g
                          + offs_n * stride_rB_n, mask=mask_n, other=0.0).to(tl.float32)
            dt_j = dt_j.to(tl.float32)
            s = tl.where(j < count, s * tl.exp(A_h * dt_j) + (dt_j * x_j)[:, None] * B_j[None, :], s)
    s = s * tl.exp(la_m) + (dt_m * x_f)[:, None] * B_f[None, :]
    store_flushed_tile(s, state_ptrs, mask_pn, amax_ptr, pid_b, FLUSH_AMAX)
    return s


# The host's positions change every step: not specialised on (a value of 1 or a multiple of 16 would each
# compile another variant, seconds apiece on a fresh H200, during the first periods of a decode).
@triton.jit(do_not_specialize=["origin_host", "count_host"])
def _mamba2_replay_step_kernel(
    # pointers
    state_ptr, ring_x_ptr, ring_dt_ptr, ring_B_ptr, origin_ptr, count_ptr,
    x_ptr, dt_ptr, B_ptr, C_ptr, A_ptr, D_ptr, z_ptr, dt_bias_ptr, y_ptr,
    rc_values_ptr, rc_scales_ptr, rc_tensor_scale_ptr,  # the read copy (READ_FORMAT fp8 / nvfp4)
    weights_ptr,  # WEIGHTS_GIVEN: per (row, head) the records' coefficients, exp(lam), the token's term
    amax_ptr,  # FLUSH_AMAX: int32 [B], each flushing row's max |new checkpoint| (for the nvfp4 re-encode)
    # sizes; the host's positions (PHASE 1/2: every row at origin_host / count_host)
    P, N, ring_size, heads_per_group, origin_host, count_host,
    # strides
    stride_s_b, stride_s_h, stride_s_p, stride_s_n,
    stride_rx_b, stride_rx_r, stride_rx_h, stride_rx_p,
    stride_rdt_b, stride_rdt_r, stride_rdt_h,
    stride_rB_b, stride_rB_r, stride_rB_g, stride_rB_n,
    stride_origin, stride_count,
    stride_x_b, stride_x_h, stride_x_p,
    stride_dt_b, stride_dt_h,
    stride_B_b, stride_B_g, stride_B_n,
    stride_C_b, stride_C_g, stride_C_n,
    stride_A, stride_D, stride_dt_bias,
    stride_z_b, stride_z_h, stride_z_p,
    stride_y_b, stride_y_h, stride_y_p,
    stride_rcv_b, stride_rcv_h, stride_rcv_p, stride_rcv_n,
    stride_rcs_b, stride_rcs_h, stride_rcs_p, stride_rcs_n, stride_rct_b,
    # meta
    BUFFER_LEN: tl.constexpr,
    # 0: per row, read on the device; 1: every row replays; 2: every row flushes; 3 / 4: per row, read on the
    # device, flushing rows only / replaying rows only (one device-phase step as two launches, 3 then 4)
    PHASE: tl.constexpr,
    HAS_D: tl.constexpr,
    HAS_Z: tl.constexpr,
    HAS_DT_BIAS: tl.constexpr,
    DT_SOFTPLUS: tl.constexpr,
    TICKET: tl.constexpr,
    RING_PHYSICAL: tl.constexpr,
    FOLD_UNROLL: tl.constexpr,
    FLUSH_DOT: tl.constexpr,  # PHASE 2 / 3 only: the closed-form fold (see _mamba2_flushed_state)
    FLUSH_PRECISION: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_R: tl.constexpr,
    READ_FORMAT: tl.constexpr,  # what replay reads: "fp32" the checkpoint, "fp8" / "nvfp4" the read copy
    PREFETCH_STATE: tl.constexpr,  # PHASE 4 with READ_FORMAT "fp32" only: load the tile before the phase test
    FLUSH_READS_COPY: tl.constexpr,  # PHASE 0 / 2 / 3 with a read copy: a flushing row's y from the copy, as replays
    WEIGHTS_GIVEN: tl.constexpr = False,  # PHASE 1 / 4: record weights from _mamba2_weights_kernel
    # PHASE 0 / 2 / 3 with FLUSH_READS_COPY, or PHASE 2 beside OUTPUTS_ONLY, and an fp8 copy (_encode_in_flush; by
    # default only the latter, the host flush: see _replay_step): the flush writes the copy of its new checkpoint
    # rows too (read_copy_encode.fp8_encode_tile, bit-identical to the re-encode; ENCODE_*: its device constants)
    ENCODE_COPY: tl.constexpr = False,
    ENCODE_SCALAR_RECIPROCAL: tl.constexpr = False,
    ENCODE_FP8_CONVERT: tl.constexpr = "soft",
    FLUSH_AMAX: tl.constexpr = False,  # PHASE 0 / 2 / 3: see _mamba2_flushed_state
    # PHASE 2 / 3 with FLUSH_READS_COPY and READ_FORMAT "nvfp4_pairs" / "fp8" (_flush_copy_product, default): the
    # outputs take the copy's product with C as stored, as the replay launches do, instead of the decoded tile
    FLUSH_COPY_PRODUCT: tl.constexpr = False,
    # _flush_outputs_launch (a flush step's outputs from the copy by a replay launch, the flush itself plain): PHASE 1
    # (host positions, every row at its flush position) gives the outputs by the replay arithmetic and appends no
    # record; PHASE 4 (a split step's replay launch, after the flush launch) runs the flushing rows too, which append
    # nothing
    OUTPUTS_ONLY: tl.constexpr = False,
    STORE_Y: tl.constexpr = True,  # PHASE 2 / 3 False: the plain flush launch beside OUTPUTS_ONLY stores no output
):
    pid_p = tl.program_id(0)
    pid_b = tl.program_id(1).to(tl.int64)
    h = tl.program_id(2)
    group = h // heads_per_group

    offs_p = pid_p * BLOCK_P + tl.arange(0, BLOCK_P)
    offs_n = tl.arange(0, BLOCK_N)
    mask_p = offs_p < P
    mask_n = offs_n < N
    mask_pn = mask_p[:, None] & mask_n[None, :]

    # Positions: the host's ints, or count[b] / origin[b] read on the device (issued first, consumed later; every
    # value used after `if run` must be defined before it: Triton turns a bool variable into a tensor, so `if run`
    # is a runtime branch, whose definitions do not escape). PHASE 3 / 4: a program whose row belongs to the other
    # launch skips everything, and the replay launch alone updates count (see _replay_step).
    if PHASE == 1 or PHASE == 2:
        count_raw = count_host
        origin = origin_host
        run = PHASE < 3
    else:
        count_raw = tl.load(count_ptr + pid_b * stride_count, volatile=True)
        origin = tl.load(origin_ptr + pid_b * stride_origin)
        if PHASE == 3:
            run = (count_raw & 0xFFFF) + 1 >= BUFFER_LEN
        elif PHASE == 4 and not OUTPUTS_ONLY:
            run = (count_raw & 0xFFFF) + 1 < BUFFER_LEN
        else:
            run = PHASE != 3
    state_ptrs = (state_ptr + pid_b * stride_s_b + h * stride_s_h
                  + offs_p[:, None] * stride_s_p + offs_n[None, :] * stride_s_n)
    if PREFETCH_STATE:  # PHASE 4, fp32: the tile's load is not held back by the phase test (see delta_rule.py)
        s_pre = tl.load(state_ptrs, mask=mask_pn, other=0.0)
    if run:
        # Issue order matters (in-order issue: an instruction that waits for a load holds back everything after it):
        # the checkpoint tile, the token, then the records (whose addresses wait for origin/count). The count
        # update (ticket atomic) comes last: an atomic's result is broadcast through a barrier, which would stall
        # the whole program for a round trip if it were issued here.
        if PREFETCH_STATE:
            s0 = s_pre.to(tl.float32)
        elif READ_FORMAT == "fp32" or ((PHASE == 2 or PHASE == 3) and not FLUSH_READS_COPY):
            s0 = tl.load(state_ptrs, mask=mask_pn, other=0.0).to(tl.float32)
        elif (PHASE == 1 or PHASE == 4 or FLUSH_COPY_PRODUCT) and READ_FORMAT == "nvfp4_pairs":  # as stored: only
            # S0 C is needed
            copy_bytes, copy_scales = load_nvfp4_blocks(
                rc_values_ptr + pid_b * stride_rcv_b + h * stride_rcv_h,
                rc_scales_ptr + pid_b * stride_rcs_b + h * stride_rcs_h, offs_p, mask_p, tl.arange(0, BLOCK_N // 16),
                N, stride_rcv_p,
                stride_rcv_n, stride_rcs_p, stride_rcs_n)
            copy_tensor_scale = tl.load(rc_tensor_scale_ptr + pid_b * stride_rct_b)
        elif (PHASE == 1 or PHASE == 4 or FLUSH_COPY_PRODUCT) and READ_FORMAT == "fp8":  # as stored: the row scale
            # multiplies S0 C's sums
            copy_codes = tl.load(rc_values_ptr + pid_b * stride_rcv_b + h * stride_rcv_h
                                 + offs_p[:, None] * stride_rcv_p + offs_n[None, :] * stride_rcv_n, mask=mask_pn,
                                 other=0.0)
            copy_row_scale = tl.load(rc_scales_ptr + pid_b * stride_rcs_b + h * stride_rcs_h + offs_p * stride_rcs_p,
                                     mask=mask_p, other=0.0)
        elif PHASE == 1 or PHASE == 4 or FLUSH_READS_COPY:  # the decoded read copy (FLUSH_READS_COPY: every row's)
            s0 = load_read_tile(rc_values_ptr, rc_scales_ptr, rc_tensor_scale_ptr, pid_b, h, offs_p, offs_n, mask_pn,
                                mask_p, 0, N, stride_rcv_b, stride_rcv_h, stride_rcv_p, stride_rcv_n,
                                stride_rcs_b, stride_rcs_h, stride_rcs_p, stride_rcs_n, stride_rct_b, READ_FORMAT,
                                BLOCK_N, True)  # fp8 scales per row (faster here)
        else:
            # The row's phase decides which tile is read (masked loads: only one of the two costs bandwidth), so
            # here the tile waits one round trip for the count.
            # (row masks from comparisons on the tile offsets: a tensor mask & a scalar bool is not a valid mask
            # under TRITON_INTERPRET=1)
            n_flush = tl.where((count_raw & 0xFFFF) + 1 >= BUFFER_LEN, N, 0)  # state columns to read: all or none
            s0 = tl.load(state_ptrs, mask=mask_pn & (offs_n[None, :] < n_flush), other=0.0).to(tl.float32)
            s0 += load_read_tile(rc_values_ptr, rc_scales_ptr, rc_tensor_scale_ptr, pid_b, h, offs_p, offs_n,
                                 mask_pn & (offs_n[None, :] < N - n_flush), offs_p < tl.where(n_flush == N, 0, P),
                                 0, N, stride_rcv_b, stride_rcv_h, stride_rcv_p,
                                 stride_rcv_n, stride_rcs_b, stride_rcs_h, stride_rcs_p, stride_rcs_n, stride_rct_b,
                                 READ_FORMAT, BLOCK_N, True)
        x_m, B_m, x_f, B_f, C_f, dt_m, la_m, A_h, D_h, z = _mamba2_token(
            x_ptr, dt_ptr, B_ptr, C_ptr, A_ptr, D_ptr, z_ptr, dt_bias_ptr, pid_b, h, group, offs_p, offs_n, mask_p,
            mask_n, stride_x_b, stride_x_h, stride_x_p, stride_dt_b, stride_dt_h, stride_B_b, stride_B_g, stride_B_n,
            stride_C_b, stride_C_g, stride_C_n, stride_A, stride_D, stride_dt_bias, stride_z_b, stride_z_h,
            stride_z_p, HAS_D, HAS_Z, HAS_DT_BIAS, DT_SOFTPLUS)
        count = count_raw & 0xFFFF

        if PHASE == 1 or PHASE == 4:
            if OUTPUTS_ONLY and PHASE == 4:  # noqa: SIM108 (constexpr: a flushing row gives its output only)
                append_record = count + 1 < BUFFER_LEN
            else:
                append_record = not OUTPUTS_ONLY
            if READ_FORMAT == "nvfp4_pairs":  # (PREFETCH_STATE is fp32-only)
                s0 = copy_tensor_scale * nvfp4_blocks_dot(copy_bytes, copy_scales, C_f, BLOCK_N)
            elif READ_FORMAT == "fp8":  # one product per row, not per element
                s0 = copy_row_scale * tl.sum(copy_codes.to(tl.float32) * C_f[None, :], axis=1)
            y = _mamba2_replay_math(s0, ring_x_ptr, ring_dt_ptr, ring_B_ptr, pid_b, h, group, pid_p, origin, count,
                                    ring_size, heads_per_group, offs_p, offs_n, mask_p, mask_n, x_m, B_m, x_f, B_f, C_f,
                                    dt_m, la_m, A_h, stride_rx_b, stride_rx_r, stride_rx_h, stride_rx_p,
                                    stride_rdt_b, stride_rdt_r, stride_rdt_h, stride_rB_b, stride_rB_r, stride_rB_g,
                                    stride_rB_n, BLOCK_R, PHASE == 4 and RING_PHYSICAL,
                                    append=append_record,
                                    w_base=weights_ptr + (pid_b * tl.num_programs(2) + h) * (BLOCK_R + 2),
                                    WEIGHTS_GIVEN=WEIGHTS_GIVEN,
                                    S0_IS_PRODUCT=READ_FORMAT == "nvfp4_pairs" or READ_FORMAT == "fp8")
        elif (PHASE == 2 or PHASE == 3) and not FLUSH_READS_COPY:
            s_new = _mamba2_flushed_state(
                s0, state_ptrs, mask_pn, ring_x_ptr, ring_dt_ptr, ring_B_ptr, pid_b, h, group, origin, count,
                ring_size, offs_p, offs_n, mask_p, mask_n, x_f, B_f, dt_m, la_m, A_h, stride_rx_b, stride_rx_r,
                stride_rx_h, stride_rx_p, stride_rdt_b, stride_rdt_r, stride_rdt_h, stride_rB_b, stride_rB_r,
                stride_rB_g, stride_rB_n, FOLD_UNROLL, FLUSH_DOT, FLUSH_PRECISION, BLOCK_R, amax_ptr, FLUSH_AMAX)
            y = tl.sum(s_new * C_f[None, :], axis=1)
            if ENCODE_COPY:  # the plain flush beside _flush_outputs_launch (its outputs came from the replay launch)
                _encode_flushed_fp8(s_new, state_ptrs, mask_pn, mask_p, rc_values_ptr, rc_scales_ptr, pid_b, h, offs_p,
                                    offs_n, stride_rcv_b, stride_rcv_h, stride_rcv_p, stride_rcv_n, stride_rcs_b,
                                    stride_rcs_h, stride_rcs_p, ENCODE_SCALAR_RECIPROCAL, ENCODE_FP8_CONVERT)
        elif FLUSH_READS_COPY:
            # Every row's y from the copy by the replay arithmetic (the separated policy's flush step output); a
            # flushing row appends nothing and folds into the checkpoint, read now, instead. (PHASE 3, the split
            # step's flush launch: only flushing rows run; PHASE 2, the host positions' flush-only launch: every row.)
            # The decoded tile is reduced before the records' loads here: this launch was timed so (runs 144 / 148).
            if FLUSH_COPY_PRODUCT and READ_FORMAT == "nvfp4_pairs":
                s0_c = copy_tensor_scale * nvfp4_blocks_dot(copy_bytes, copy_scales, C_f, BLOCK_N)
            elif FLUSH_COPY_PRODUCT and READ_FORMAT == "fp8":
                s0_c = copy_row_scale * tl.sum(copy_codes.to(tl.float32) * C_f[None, :], axis=1)
            else:
                s0_c = tl.sum(s0 * C_f[None, :], axis=1)
            y = _mamba2_replay_math(s0_c, ring_x_ptr, ring_dt_ptr, ring_B_ptr, pid_b, h,
                                    group, pid_p, origin, count, ring_size, heads_per_group, offs_p, offs_n, mask_p,
                                    mask_n, x_m, B_m, x_f, B_f, C_f, dt_m, la_m, A_h, stride_rx_b, stride_rx_r,
                                    stride_rx_h, stride_rx_p, stride_rdt_b, stride_rdt_r, stride_rdt_h, stride_rB_b,
                                    stride_rB_r, stride_rB_g, stride_rB_n, BLOCK_R, RING_PHYSICAL,
                                    count + 1 < BUFFER_LEN, S0_IS_PRODUCT=True)
            if count + 1 >= BUFFER_LEN:
                s_ck = tl.load(state_ptrs, mask=mask_pn, other=0.0).to(tl.float32)
                s_new = _mamba2_flushed_state(
                    s_ck, state_ptrs, mask_pn, ring_x_ptr, ring_dt_ptr, ring_B_ptr, pid_b, h, group, origin, count,
                    ring_size, offs_p, offs_n, mask_p, mask_n, x_f, B_f, dt_m, la_m, A_h, stride_rx_b,
                    stride_rx_r, stride_rx_h, stride_rx_p, stride_rdt_b, stride_rdt_r, stride_rdt_h, stride_rB_b,
                    stride_rB_r, stride_rB_g, stride_rB_n, FOLD_UNROLL,
                    FLUSH_DOT if PHASE == 2 else False,  # PHASE 2: the host flush's own fold
                    FLUSH_PRECISION, BLOCK_R, amax_ptr, FLUSH_AMAX)
                if ENCODE_COPY:
                    _encode_flushed_fp8(s_new, state_ptrs, mask_pn, mask_p, rc_values_ptr, rc_scales_ptr, pid_b, h,
                                        offs_p, offs_n, stride_rcv_b, stride_rcv_h, stride_rcv_p, stride_rcv_n,
                                        stride_rcs_b, stride_rcs_h, stride_rcs_p, ENCODE_SCALAR_RECIPROCAL,
                                        ENCODE_FP8_CONVERT)
        else:
            is_flush = count + 1 >= BUFFER_LEN
            if is_flush:
                s_new = _mamba2_flushed_state(
                    s0, state_ptrs, mask_pn, ring_x_ptr, ring_dt_ptr, ring_B_ptr, pid_b, h, group, origin, count,
                    ring_size, offs_p, offs_n, mask_p, mask_n, x_f, B_f, dt_m, la_m, A_h, stride_rx_b, stride_rx_r,
                    stride_rx_h, stride_rx_p, stride_rdt_b, stride_rdt_r, stride_rdt_h, stride_rB_b, stride_rB_r,
                    stride_rB_g, stride_rB_n, FOLD_UNROLL, False, FLUSH_PRECISION, BLOCK_R, amax_ptr, FLUSH_AMAX)
                y = tl.sum(s_new * C_f[None, :], axis=1)
            else:
                y = _mamba2_replay_math(s0, ring_x_ptr, ring_dt_ptr, ring_B_ptr, pid_b, h, group, pid_p, origin,
                                        count, ring_size, heads_per_group, offs_p, offs_n, mask_p, mask_n, x_m, B_m,
                                        x_f, B_f, C_f, dt_m, la_m, A_h, stride_rx_b, stride_rx_r, stride_rx_h,
                                        stride_rx_p, stride_rdt_b, stride_rdt_r, stride_rdt_h, stride_rB_b,
                                        stride_rB_r, stride_rB_g, stride_rB_n, BLOCK_R, RING_PHYSICAL)

        if STORE_Y:
            _mamba2_store_y(y, x_f, D_h, z, y_ptr, pid_b, h, offs_p, mask_p, stride_y_b, stride_y_h, stride_y_p, HAS_D,
                            HAS_Z)

    if (PHASE == 0 or PHASE == 4) and TICKET:
        # Take a ticket; the program that drew the row's last one (every program of the row has read the count by
        # then) writes the new count, clearing the ticket bits. Relaxed atomics suffice: only count[b] itself is
        # communicated, and the exchange is ordered after every ticket by the coherence of that one address.
        ticket = tl.atomic_add(count_ptr + pid_b * stride_count, 1 << 16, sem="relaxed") >> 16
        if ticket == tl.num_programs(0) * tl.num_programs(2) - 1:
            old = count_raw & 0xFFFF  # (PHASE 4: read before `if run`, so also defined for the rows that skipped)
            tl.atomic_xchg(count_ptr + pid_b * stride_count, tl.where(old + 1 >= BUFFER_LEN, 0, old + 1),
                           sem="relaxed")


@triton.jit(do_not_specialize=["origin_host", "count_host"])
def _mamba2_replay_walk_kernel(
    state_ptr, ring_x_ptr, ring_dt_ptr, ring_B_ptr, origin_ptr, count_ptr,
    x_ptr, dt_ptr, B_ptr, C_ptr, A_ptr, D_ptr, z_ptr, dt_bias_ptr, y_ptr,
    n_items, heads, P, N, ring_size, heads_per_group, origin_host, count_host,
    stride_origin, stride_count,
    stride_s_b, stride_s_h, stride_s_p, stride_s_n,
    stride_rx_b, stride_rx_r, stride_rx_h, stride_rx_p,
    stride_rdt_b, stride_rdt_r, stride_rdt_h,
    stride_rB_b, stride_rB_r, stride_rB_g, stride_rB_n,
    stride_x_b, stride_x_h, stride_x_p,
    stride_dt_b, stride_dt_h,
    stride_B_b, stride_B_g, stride_B_n,
    stride_C_b, stride_C_g, stride_C_n,
    stride_A, stride_D, stride_dt_bias,
    stride_z_b, stride_z_h, stride_z_p,
    stride_y_b, stride_y_h, stride_y_p,
    HAS_D: tl.constexpr,
    HAS_Z: tl.constexpr,
    HAS_DT_BIAS: tl.constexpr,
    DT_SOFTPLUS: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_R: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    BUFFER_LEN: tl.constexpr,
    DEVICE_POSITIONS: tl.constexpr,
    RING_PHYSICAL: tl.constexpr,  # DEVICE_POSITIONS: records by physical slot, as the per-tile PHASE 4 program reads
):
    """A replay-only launch reading the fp32 checkpoint on a device-sized grid: each program walks the (row, head, P
    tile) items with a stride of the grid, and ``tl.range(num_stages=NUM_STAGES)`` lets Triton's pipeliner issue the
    next items' loads while this one computes (asynchronous copies on sm_90). Host positions (``PHASE`` 1: every row
    at ``origin_host`` / ``count_host``), or ``DEVICE_POSITIONS`` (a split step's replay launch, ``PHASE`` 4, with
    the counts advanced by a launch of their own): each row's origin / count read on the device, the items of rows
    due to flush (served by the step's flush launch) masked off, loads and stores alike. Each item is the
    ``_mamba2_replay_step_kernel`` program of that tile, the same expressions."""
    p_tiles = tl.cdiv(P, BLOCK_P)
    offs_n = tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    for item in tl.range(tl.program_id(0), n_items, tl.num_programs(0), num_stages=NUM_STAGES):
        pid_p, h, pid_b = walk_item(item, heads, p_tiles)
        group = h // heads_per_group
        origin, count, run, p_limit = walk_positions(origin_ptr, count_ptr, pid_b, stride_origin, stride_count,
                                                     origin_host, count_host, P, BUFFER_LEN, DEVICE_POSITIONS)
        offs_p = pid_p * BLOCK_P + tl.arange(0, BLOCK_P)
        mask_p = offs_p < p_limit
        mask_pn = mask_p[:, None] & mask_n[None, :]
        s0 = tl.load(state_ptr + pid_b * stride_s_b + h * stride_s_h + offs_p[:, None] * stride_s_p
                     + offs_n[None, :] * stride_s_n, mask=mask_pn, other=0.0).to(tl.float32)
        x_m, B_m, x_f, B_f, C_f, dt_m, la_m, A_h, D_h, z = _mamba2_token(
            x_ptr, dt_ptr, B_ptr, C_ptr, A_ptr, D_ptr, z_ptr, dt_bias_ptr, pid_b, h, group, offs_p, offs_n, mask_p,
            mask_n, stride_x_b, stride_x_h, stride_x_p, stride_dt_b, stride_dt_h, stride_B_b, stride_B_g, stride_B_n,
            stride_C_b, stride_C_g, stride_C_n, stride_A, stride_D, stride_dt_bias, stride_z_b, stride_z_h,
            stride_z_p, HAS_D, HAS_Z, HAS_DT_BIAS, DT_SOFTPLUS)
        y = _mamba2_replay_math(s0, ring_x_ptr, ring_dt_ptr, ring_B_ptr, pid_b, h, group, pid_p, origin, count,
                                ring_size, heads_per_group, offs_p, offs_n, mask_p, mask_n, x_m, B_m, x_f, B_f, C_f,
                                dt_m, la_m, A_h, stride_rx_b, stride_rx_r, stride_rx_h, stride_rx_p,
                                stride_rdt_b, stride_rdt_r, stride_rdt_h, stride_rB_b, stride_rB_r, stride_rB_g,
                                stride_rB_n, BLOCK_R, RING_PHYSICAL, append=run)
        _mamba2_store_y(y, x_f, D_h, z, y_ptr, pid_b, h, offs_p, mask_p, stride_y_b, stride_y_h, stride_y_p, HAS_D,
                        HAS_Z)


@triton.jit
def _mamba2_flush_due_kernel(
    state_ptr, ring_x_ptr, ring_dt_ptr, ring_B_ptr, origin_ptr, count_ptr,
    x_ptr, dt_ptr, B_ptr, C_ptr, A_ptr, D_ptr, z_ptr, dt_bias_ptr, y_ptr, amax_ptr,
    batch, heads, P, N, ring_size, heads_per_group,
    stride_s_b, stride_s_h, stride_s_p, stride_s_n,
    stride_rx_b, stride_rx_r, stride_rx_h, stride_rx_p,
    stride_rdt_b, stride_rdt_r, stride_rdt_h,
    stride_rB_b, stride_rB_r, stride_rB_g, stride_rB_n,
    stride_origin, stride_count,
    stride_x_b, stride_x_h, stride_x_p,
    stride_dt_b, stride_dt_h,
    stride_B_b, stride_B_g, stride_B_n,
    stride_C_b, stride_C_g, stride_C_n,
    stride_A, stride_D, stride_dt_bias,
    stride_z_b, stride_z_h, stride_z_p,
    stride_y_b, stride_y_h, stride_y_p,
    BUFFER_LEN: tl.constexpr,
    HAS_D: tl.constexpr,
    HAS_Z: tl.constexpr,
    HAS_DT_BIAS: tl.constexpr,
    DT_SOFTPLUS: tl.constexpr,
    FOLD_UNROLL: tl.constexpr,
    FLUSH_PRECISION: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_B: tl.constexpr,
    FLUSH_AMAX: tl.constexpr = False,
):
    """The split device-phase step's flush launch on a grid sized to the GPU (``kernels/flush_grid.py``): the
    (due row, head, P tile) items, each as the ``PHASE`` 3 program of that tile would (the sequential fold, bit for
    bit). Counts are read, not written (the replay launch after it advances them)."""
    due, rank, n_due = due_rows(count_ptr, stride_count, batch, BUFFER_LEN, BLOCK_B)
    p_tiles = tl.cdiv(P, BLOCK_P)
    offs_n = tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    for item in range(tl.program_id(0), n_due * p_tiles * heads, tl.num_programs(0)):
        pid_b, h, pid_p = due_item(due, rank, item, heads, p_tiles, BLOCK_B)
        group = h // heads_per_group
        offs_p = pid_p * BLOCK_P + tl.arange(0, BLOCK_P)
        mask_p = offs_p < P
        mask_pn = mask_p[:, None] & mask_n[None, :]
        state_ptrs = (state_ptr + pid_b * stride_s_b + h * stride_s_h
                      + offs_p[:, None] * stride_s_p + offs_n[None, :] * stride_s_n)
        s0 = tl.load(state_ptrs, mask=mask_pn, other=0.0).to(tl.float32)
        count = tl.load(count_ptr + pid_b * stride_count) & 0xFFFF
        origin = tl.load(origin_ptr + pid_b * stride_origin)
        _, _, x_f, B_f, C_f, dt_m, la_m, A_h, D_h, z = _mamba2_token(
            x_ptr, dt_ptr, B_ptr, C_ptr, A_ptr, D_ptr, z_ptr, dt_bias_ptr, pid_b, h, group, offs_p, offs_n, mask_p,
            mask_n, stride_x_b, stride_x_h, stride_x_p, stride_dt_b, stride_dt_h, stride_B_b, stride_B_g, stride_B_n,
            stride_C_b, stride_C_g, stride_C_n, stride_A, stride_D, stride_dt_bias, stride_z_b, stride_z_h,
            stride_z_p, HAS_D, HAS_Z, HAS_DT_BIAS, DT_SOFTPLUS)
        s_new = _mamba2_flushed_state(
            s0, state_ptrs, mask_pn, ring_x_ptr, ring_dt_ptr, ring_B_ptr, pid_b, h, group, origin, count, ring_size,
            offs_p, offs_n, mask_p, mask_n, x_f, B_f, dt_m, la_m, A_h, stride_rx_b, stride_rx_r, stride_rx_h,
            stride_rx_p, stride_rdt_b, stride_rdt_r, stride_rdt_h, stride_rB_b, stride_rB_r, stride_rB_g,
            stride_rB_n, FOLD_UNROLL, False, FLUSH_PRECISION, BLOCK_R, amax_ptr, FLUSH_AMAX)
        y = tl.sum(s_new * C_f[None, :], axis=1)
        _mamba2_store_y(y, x_f, D_h, z, y_ptr, pid_b, h, offs_p, mask_p, stride_y_b, stride_y_h, stride_y_p, HAS_D,
                        HAS_Z)


@triton.jit
def _mamba2_state_update_kernel(
    state_ptr, x_ptr, dt_ptr, B_ptr, C_ptr, A_ptr, D_ptr, z_ptr, dt_bias_ptr, y_ptr,
    P, N, heads_per_group,
    stride_s_b, stride_s_h, stride_s_p, stride_s_n,
    stride_x_b, stride_x_h, stride_x_p,
    stride_dt_b, stride_dt_h,
    stride_B_b, stride_B_g, stride_B_n,
    stride_C_b, stride_C_g, stride_C_n,
    stride_A, stride_D, stride_dt_bias,
    stride_z_b, stride_z_h, stride_z_p,
    stride_y_b, stride_y_h, stride_y_p,
    HAS_D: tl.constexpr,
    HAS_Z: tl.constexpr,
    HAS_DT_BIAS: tl.constexpr,
    DT_SOFTPLUS: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    pid_p = tl.program_id(0)
    pid_b = tl.program_id(1).to(tl.int64)
    h = tl.program_id(2)
    group = h // heads_per_group

    offs_p = pid_p * BLOCK_P + tl.arange(0, BLOCK_P)
    offs_n = tl.arange(0, BLOCK_N)
    mask_p = offs_p < P
    mask_n = offs_n < N
    mask_pn = mask_p[:, None] & mask_n[None, :]

    state_ptrs = (state_ptr + pid_b * stride_s_b + h * stride_s_h
                  + offs_p[:, None] * stride_s_p + offs_n[None, :] * stride_s_n)
    s = tl.load(state_ptrs, mask=mask_pn, other=0.0).to(tl.float32)
    x_f = tl.load(x_ptr + pid_b * stride_x_b + h * stride_x_h + offs_p * stride_x_p,
                  mask=mask_p, other=0.0).to(tl.float32)
    B_f = tl.load(B_ptr + pid_b * stride_B_b + group * stride_B_g + offs_n * stride_B_n,
                  mask=mask_n, other=0.0).to(tl.float32)
    C_f = tl.load(C_ptr + pid_b * stride_C_b + group * stride_C_g + offs_n * stride_C_n,
                  mask=mask_n, other=0.0).to(tl.float32)
    dt = _token_dt(dt_ptr, dt_bias_ptr, pid_b, h, stride_dt_b, stride_dt_h, stride_dt_bias,
                   HAS_DT_BIAS, DT_SOFTPLUS)
    A_h = tl.load(A_ptr + h * stride_A).to(tl.float32)

    s = s * tl.exp(A_h * dt) + (dt * x_f)[:, None] * B_f[None, :]
    tl.store(state_ptrs, s.to(state_ptr.dtype.element_ty), mask=mask_pn)
    y = tl.sum(s * C_f[None, :], axis=1)
    if HAS_D:
        y += tl.load(D_ptr + h * stride_D).to(tl.float32) * x_f
    if HAS_Z:
        z = tl.load(z_ptr + pid_b * stride_z_b + h * stride_z_h + offs_p * stride_z_p,
                    mask=mask_p, other=0.0).to(tl.float32)
        y *= z * tl.sigmoid(z)
    tl.store(y_ptr + pid_b * stride_y_b + h * stride_y_h + offs_p * stride_y_p,
             y.to(y_ptr.dtype.element_ty), mask=mask_p)


# ---------------------------------------------------------------------------------------------------------------
# launch configuration


def replay_launch_config(batch: int, heads: int, head_dim: int, d_state: int, read_format: str | None = None,
                         device_phase: bool = False) -> dict:
    """``block_p`` (P tile), ``num_warps`` and ``fold_unroll`` (records folded per loop iteration on a flush) of
    the replay step. Measured on an H200 (benchmark sweep, Nemotron-H shapes, batch 1-512): few warps with many
    state elements per thread were fastest, since each thread then has many independent 16-byte loads in flight
    and the per-program reductions synchronise fewer warps: [32, 128] tiles on 2 warps from batch * heads >= 2048,
    [16, 128] on 2 warps below. ``fold_unroll`` only matters to the fused device-phase kernel (the flush-only kernel
    folds with a tl.dot): 4 compiles the fused kernel to 168 registers instead of 252 and was 1.26x faster at
    batch 256 (484 vs 613 us per step).

    From batch * heads >= 2048, the replay-only launches take one warp where they read a low-precision copy
    (``read_format`` fp8 / nvfp4: a whole head of up to 64 rows, [64, 128], host or device positions) or the fp32
    checkpoint at host positions ([32, 128]): each program's record work (the records' B [R, N] against C, per P
    tile) then runs once per head or on fewer threads. H200, Nemotron-H-8B, batch 256, run 183
    (``benchmarks/gpu/copy_replay_probe.py``), against [32, 128] x 2: host cycle fp32 348.6 -> 321.8 us, fp8 as
    the cache runs it 267.5 -> 193.5, nvfp4 335.2 -> 266.7; the compiled path's split step (rows in phase / mixed)
    fp8 369.3 / 407.8 -> 270.3 / 310.5, nvfp4 436.9 / 509.5 -> 364.6 / 440.2 (its fp32 replay launch keeps [32,
    128] x 2: 434.8 / 456.6 on one warp against 417.6 / 433.6). ``device_phase`` (a split step's replay launch)
    picks for device positions; the fused launch and the split step's batch-grid flush launch take the fp32
    device-positions tile."""
    block_n = next_power_of_2(d_state)
    large = batch * heads >= 2048
    block_p = min(next_power_of_2(head_dim), max(1, (4096 if large else 2048) // block_n))
    reads_copy = read_format not in (None, "fp32")
    if large and reads_copy:
        return dict(block_p=min(next_power_of_2(head_dim), max(1, 8192 // block_n)), num_warps=1, fold_unroll=4)
    if large and not device_phase:
        return dict(block_p=block_p, num_warps=1, fold_unroll=4)
    return dict(block_p=block_p, num_warps=2, fold_unroll=4)


def host_flush_launch_config(batch: int, heads: int, head_dim: int, d_state: int) -> dict:
    """``block_p`` and ``num_warps`` of the host-phase flush-only launch (every row at its last buffered position;
    the record sum as one tl.dot): :func:`fold_tile_config`'s 2048-element tile on 2 warps, smaller than the replay
    tile. H200, Nemotron-H 8B shape, per flush launch (run 114, ``benchmarks/gpu/host_flush_sweep.py``): batch 256
    [16, 128] x 2 726.3 us against the replay tile [32, 128] x 2's 860.3 ([16, 128] x 1 730.7, [32, 128] x 8 816.5,
    [16, 128] x 4 924.2, the loop fold 1080.4); batch 64 183.6 against 222.6. At least 16 rows of P where the head
    has them (the tl.dot's smallest tile; d_state 256 would otherwise fall back to the loop)."""
    cfg = dict(fold_tile_config(head_dim, d_state))
    cfg["block_p"] = max(cfg["block_p"], min(16, next_power_of_2(head_dim)))
    return cfg


def state_update_launch_config(batch: int, heads: int, head_dim: int, d_state: int) -> dict:
    """``block_p`` and ``num_warps`` of the standard step: a 4096-element tile on 8 warps (for d_state 128:
    [32, 128]), the fastest of the benchmark's sweep on an H200 at batch 32 and 256 (92 % of the copy bandwidth;
    mamba_ssm's table, [4, 128] on 4 warps, was up to 19 % slower)."""
    block_n = next_power_of_2(d_state)
    block_p = min(next_power_of_2(head_dim), max(1, 4096 // block_n))
    return dict(block_p=block_p, num_warps=8 if block_p * block_n >= 2048 else 4)


# ---------------------------------------------------------------------------------------------------------------
# wrappers


def _device_guard(t: torch.Tensor):
    return torch.cuda.device(t.device) if t.is_cuda else contextlib.nullcontext()


def _optional(t: torch.Tensor | None, ref: torch.Tensor) -> torch.Tensor:
    return ref if t is None else t


def _strides(t: torch.Tensor | None, ndim: int) -> tuple[int, ...]:
    return (0,) * ndim if t is None else tuple(t.stride())


def _check_step_inputs(state, x, dt, B, C, A, D, z, dt_bias):
    batch, heads, head_dim, d_state = state.shape
    assert x.shape == (batch, heads, head_dim), f"x {tuple(x.shape)} vs state {tuple(state.shape)}"
    assert dt.shape == (batch, heads), f"dt must be [B, H], got {tuple(dt.shape)}"
    assert B.dim() == 3 and B.shape[0] == batch and B.shape[2] == d_state, f"B must be [B, G, N], got {B.shape}"
    assert C.shape == B.shape, f"C {tuple(C.shape)} vs B {tuple(B.shape)}"
    assert heads % B.shape[1] == 0, "heads must be a multiple of groups"
    assert A.shape == (heads,), f"A must be [H], got {tuple(A.shape)}"
    assert D is None or D.shape == (heads,), "D must be [H]"
    assert dt_bias is None or dt_bias.shape == (heads,), "dt_bias must be [H]"
    assert z is None or z.shape == x.shape, "z must be [B, H, P]"
    return batch, heads, head_dim, d_state, B.shape[1]


def _replay_step(
    state, ring_x, ring_dt, ring_B, origin, count, x, dt, B, C, A, D=None, z=None, dt_bias=None,
    dt_softplus=False, buffer_len=16, out=None, read_copy=None, read_format=None, _config=None, _ticket=True,
    _ring_physical=None, _split=None, _prefetch=False, _count_launch=False, flush_reads_copy=False,
    _nvfp4_pairs=True, _flush_grid=None, _flush_config=None, _walk=None, _weights=None, reencode_copy=False,
    _encode_in_flush=None, _flush_amax=True, _flush_copy_product=True,
    _flush_outputs_launch=None,
):
    """:func:`mamba2_replay_step` with a launch-configuration override (``_config``: dict with ``block_p`` and/or
    ``num_warps``) and, for diagnostics only, ``_ticket=False`` (count read plainly and left unchanged) and
    ``_ring_physical`` (force the ring read order of the device-phase kernel). ``_split`` (device positions only;
    default on): the step as two launches, a flush-only program for the rows due (the others exit after reading
    their count) and then a replay-only one (which also updates every row's count), instead of one fused program
    carrying both codes: each row is served by a program with the registers of its own phase alone. ``_prefetch``
    (split only; off: H200, Nemotron-H-8B shape, batch 256: 467 us per step with it, 434 us without) loads each
    checkpoint tile in the replay launch before its row's count arrives (a flushing row's tile is read for
    nothing). ``_count_launch`` (device positions): the step's kernels read the counts plainly and a launch of its
    own advances them afterwards (``kernels/counts.py``), instead of count tickets; with records in logical order
    (``_ring_physical=False``) and one fused launch this made the GDN step 1.2x faster on an H200, but not the
    Mamba-2 one (H200, batch 256: 450.7 vs 433.4 us split, 560.3 fused). ``_nvfp4_pairs`` (an nvfp4 read copy; default
    on): load the copy's bytes once as a byte tile and interleave the decoded nibbles; off, one byte load per nibble
    (same values; H200, batch 256, host-phase cycle 1088 vs 672 us). ``_flush_grid`` (split steps whose flush
    launch reads the fp32 checkpoint; :func:`default_flush_grid` when not given): ``"batch"`` (a program per tile
    of every row; those of rows not due exit after reading their count) or ``"device"`` (:func:`flush_grid_programs`
    programs that walk the due rows' tiles, ``_mamba2_flush_due_kernel``, at :func:`fold_tile_config` or
    ``_flush_config``; the same checkpoint bits). With host positions the flush-only launch (the last buffered
    position) runs at :func:`host_flush_launch_config` unless ``_config`` is given. ``_flush_config`` (``block_p``,
    ``num_warps``, ``fold_unroll``) sets the tile of whichever flush launch the step makes: host-phase, device-grid or
    a split step's batch-grid one (which otherwise takes the replay tile); for the device-grid one also
    ``programs_per_sm`` (its grid: that many programs per multiprocessor, ``kernels.flush_grid.PROGRAMS_PER_SM`` when
    not given). ``_walk`` (replay-only launches reading the fp32 checkpoint: host positions, or a split step's
    replay launch with ``_count_launch``; off by default): ``dict(programs_per_sm=..., num_stages=...)`` runs them
    as ``_mamba2_replay_walk_kernel``, a device-sized grid whose programs walk the tiles with their loads pipelined
    ``num_stages`` deep (H200, batch 256, host cycle: 377-745 us over ten walks against the per-tile 345-349, runs
    116-120; the delta rule's walk won, see ``kernels/delta_rule.py``). ``_weights`` (the per-tile replay-only
    launches: host positions, a flush step's outputs launch, or a split step's replay launch): a small launch first
    computes each (row, head)'s record coefficients ``w_j (B_j . C_m)``, ``exp(lam)`` and the token's
    ``dt_m (B_m . C_m)`` once (``_mamba2_weights_kernel``), which the replay programs of its P tiles read instead of
    each loading the records' B [R, N] (shared by the group's heads) and reducing it against C; those programs then
    read the records in logical order. None (the default): on for a split step's replay launch reading a copy from
    batch * heads >= 2048 (H200, Nemotron-H-8B, batch 256, run 183, rows in phase / mixed: fp8 270.3 / 310.5 ->
    266.3 / 304.3 us, nvfp4 364.6 / 440.2 -> 354.5 / 429.6; the extra launch costs nothing inside the compiled
    path's CUDA graph), off elsewhere: the host cycle gained too (fp8 193.5 -> 186.8, nvfp4 266.7 -> 263.0) but an
    eager step, host-bound at these batches, would pay the launch on the CPU; with the fp32 checkpoint it does not
    pay (run 124: host cycle 341.0 vs 345.0 us at batch 256, 93.1 vs 90.6 at 64; split step 452.0 / 440.6 against
    434.9 / 417.0). ``_flush_amax`` (``reencode_copy`` with an nvfp4 copy; default on): the flush launches fold
    each flushing row's max |new checkpoint| into a [B] scratch as they store it, and the re-encode after the step
    takes it instead of its own amax pass over the checkpoint; off, the re-encode's two passes (the same bits).
    ``_flush_copy_product`` (``flush_reads_copy`` with an fp8 / nvfp4 copy; default on): the flush-only launches
    (host positions, a split step's flush launch) take the copy's product with C as stored for the outputs, as the
    replay launches do, instead of decoding the whole tile (the same terms summed in another order; H200 run 177,
    batch 256, Nemotron-H-8B: host cycle as the cache runs it nvfp4 396.4 -> 392.8 us, fp8 298.8 -> 298.2, device
    positions in phase 473.9 -> 472.2 / 373.4 -> 371.4). ``_flush_outputs_launch`` (``flush_reads_copy``): a
    flushing row's output from the copy by the replay launch, in which it appends nothing (host positions: a
    replay-only launch before the flush; a split step: its replay launch runs the flushing rows too), and its fold
    by the plain flush launch on the fp32 checkpoint storing no output, instead of one flush launch reading both
    (False; the outputs by the same replay arithmetic on the copy's product, the checkpoint the same fold: bit for
    bit on the CPU, within 1e-6 on a GPU). None (the default): host positions, and split steps reading an nvfp4 copy
    (H200 runs 179 / 180, batch 256, Nemotron-H-8B, against the one flush launch: host cycle as the cache runs it
    nvfp4 358.1 -> 335.5 us, fp8 298.2 -> 273.7; split step nvfp4 in phase / mixed 438.0 / 523.0 -> 436.9 / 509.2,
    fp8 370.8 / 406.6 -> 385.4 / 422.4, slower). Not with the fused device-positions launch (``_split=False``) nor
    a split step with ``_encode_in_flush`` (True there is refused). ``_encode_in_flush`` (an fp8 copy with
    ``reencode_copy``; None, the default: host positions' plain flush beside ``_flush_outputs_launch``, H200 run
    181, host cycle 274.0 -> 268.3 us): the flush launch writes the copy of its rows from its registers instead of
    the re-encode launch after the step (the same bits)."""
    batch, heads, head_dim, d_state, groups = _check_step_inputs(state, x, dt, B, C, A, D, z, dt_bias)
    ring_size = ring_x.shape[1]
    assert ring_x.shape == (batch, ring_size, heads, head_dim), f"ring_x must be [B, R, H, P], got {ring_x.shape}"
    assert ring_dt.shape == (batch, ring_size, heads), f"ring_dt must be [B, R, H], got {tuple(ring_dt.shape)}"
    assert ring_B.shape == (batch, ring_size, groups, d_state), f"ring_B must be [B, R, G, N], got {ring_B.shape}"
    phase = host_phase(origin, count, buffer_len)
    if phase == 0:
        assert origin.shape == (batch,) and count.shape == (batch,), "origin and count must be [B]"
        assert origin.dtype == torch.int32 and count.dtype == torch.int32, "origin and count must be int32"
    assert 1 <= buffer_len < (1 << _TICKET_SHIFT), "buffer_len out of range"
    assert ring_size >= max(buffer_len - 1, 1), f"ring capacity {ring_size} < max(buffer_len - 1, 1)"
    read_format, read_operands = read_copy_operands(read_copy, read_format, state)
    # the nvfp4 tile loaded byte by byte per nibble, or as whole bytes (see kernels/read_copy.py); the replay launches'
    # by-block reader needs tiles of whole 16-element scale blocks, so a state under 16 wide (tiny test models only)
    # reads nibble by nibble
    pairs = _nvfp4_pairs and next_power_of_2(d_state) >= 16
    kernel_read_format = "nvfp4_pairs" if read_format == "nvfp4" and pairs else read_format
    y = torch.empty_like(x) if out is None else out
    assert y.shape == x.shape
    # the replay-only launches' tile by what they read and where their positions live; the fused launch (0) and a
    # split step's batch-grid flush launch (3) take the fp32 device-positions tile (see replay_launch_config)
    cfg = dict(replay_launch_config(batch, heads, head_dim, d_state, read_format, device_phase=phase == 0),
               **(_config or {}))
    device_cfg = dict(replay_launch_config(batch, heads, head_dim, d_state, device_phase=True), **(_config or {}))
    assert cdiv(head_dim, min(cfg["block_p"], device_cfg["block_p"])) * heads < (1 << (31 - _TICKET_SHIFT)), (
        "too many programs per row for the count ticket")

    def launch_config(kernel_phase):
        # the host-phase flush-only launch at its own tile unless the caller set one; _flush_config over a flush
        # launch's (a split step's flush launch takes no count ticket, so its tile is free)
        if kernel_phase == 2:
            return {**cfg, **(host_flush_launch_config(batch, heads, head_dim, d_state) if _config is None else {}),
                    **(_flush_config or {})}
        if kernel_phase == 3:
            return {**device_cfg, **(_flush_config or {})}
        return device_cfg if kernel_phase == 0 else cfg
    # The device-phase kernel reads every physical ring slot (addresses that need not wait for origin/count) when
    # the ring is no larger than the record tile anyway.
    block_r = next_power_of_2(max(buffer_len - 1, 1))
    ring_physical = next_power_of_2(ring_size) == block_r if _ring_physical is None else _ring_physical
    if ring_physical:
        block_r = next_power_of_2(ring_size)
    positions = (origin, count) if phase == 0 else (A, A)  # unused pointers in the host-phase kernels
    position_strides = (origin.stride(0), count.stride(0)) if phase == 0 else (0, 0)
    host = (0, 0) if phase == 0 else (origin, count)
    # Kernel phases: the host's phase, or on the device one fused launch (0) or two (3: flushes, then 4: replays).
    flush_reads_copy = bool(flush_reads_copy) and read_format != "fp32"
    # With flush_reads_copy the split's flush launch also gives a flushing row's output from the copy; its replay
    # launch is then the host-phase replay reading the copy (80 registers for fp8 at 32 x 2 on sm_90, the fused
    # launch 200; nvfp4 237 vs 255 with 200 B spilled): split by default as for fp32 (H200, batch 256, run 56: fp8
    # 369.6 us in phase against the fused launch's 525.6; nvfp4 within 1 % in run 59, the fused launch 5 % faster in
    # run 64)
    split = phase == 0 and (_split is None or bool(_split))
    # _flush_outputs_launch (see the docstring for its defaults and timings): the outputs by a replay launch in which
    # flushing rows append nothing (host positions: a PHASE 1 launch before the flush; a split step: its PHASE 4
    # launch, after the flush launch, runs the flushing rows too), the fold by the plain flush launch storing no
    # output (PHASE 2 / 3)
    if _flush_outputs_launch is None:
        outputs_launch = phase == 2 or (split and read_format == "nvfp4")
    else:
        outputs_launch = bool(_flush_outputs_launch) and (phase == 2 or split)
    # (a split step's replay launch runs after its flush launch: an fp8 copy written by the flush, _encode_in_flush,
    # would be read new; host positions give the outputs first)
    split_encodes = split and bool(_encode_in_flush)
    outputs_launch = outputs_launch and flush_reads_copy and not split_encodes
    if _flush_outputs_launch is True and phase == 0 and (not split or split_encodes):
        raise ValueError("_flush_outputs_launch=True serves host positions and the split device-positions step "
                         "without _encode_in_flush; the fused launch (_split=False) gives a flushing row's output and "
                         "its fold in one program, and a split step's flush launch writing the copy "
                         "(_encode_in_flush) runs before the replay launch that would read it")
    launches = (3, 4) if split else ((1, 2) if outputs_launch else (phase,))
    count_launch = phase == 0 and bool(_count_launch) and bool(_ticket)

    flush_grid = default_flush_grid(batch) if _flush_grid is None else _flush_grid
    flush_on_device_grid = use_device_grid(flush_grid, batch) and split and not flush_reads_copy
    if _walk is not None:
        unknown = set(_walk) - {"programs_per_sm", "num_stages"}
        serves = phase == 1 or (split and count_launch and not flush_reads_copy)
        if unknown or not serves or read_format != "fp32":
            raise ValueError("_walk (keys programs_per_sm, num_stages) serves the replay-only launches reading the "
                             "fp32 checkpoint: host positions, or a split step with _count_launch=True; got "
                             f"{dict(_walk)} at host phase {phase} (0: device positions), split {split}, count launch "
                             f"{count_launch}, read format {read_format}")

    if _weights is None:  # the default: a split step's replay launch reading a copy (see the docstring)
        _weights = split and read_format != "fp32" and _walk is None and batch * heads >= 2048
    if _weights and (_walk is not None or not (phase == 1 or split or outputs_launch)):
        raise ValueError("_weights serves the per-tile replay-only launches: host positions, or a split step (device "
                         f"positions, _split not False); got host phase {phase} (0: device positions), split {split}, "
                         f"_walk {_walk}")
    weights = A  # (unused pointer)
    if _weights:
        weights = torch.empty((batch, heads, block_r + 2), dtype=torch.float32, device=x.device)

    def launch_weights():
        LAST_COMPILED["weights"] = _mamba2_weights_kernel[(batch, heads)](
            ring_dt, ring_B, *positions, dt, B, C, A, _optional(dt_bias, A), weights,
            d_state, ring_size, heads // groups, *host,
            *ring_dt.stride(), *ring_B.stride(), *position_strides,
            *dt.stride(), *B.stride(), *C.stride(), A.stride(0), _strides(dt_bias, 1)[0],
            DEVICE_POSITIONS=phase == 0,
            HAS_DT_BIAS=dt_bias is not None,
            DT_SOFTPLUS=bool(dt_softplus),
            BLOCK_N=next_power_of_2(d_state),
            BLOCK_R=block_r,
            num_warps=1,
        )

    def launch_walk(kernel_phase):
        items = cdiv(head_dim, cfg["block_p"]) * batch * heads
        LAST_COMPILED[f"replay_phase{kernel_phase}"] = LAST_COMPILED["replay"] = _mamba2_replay_walk_kernel[
            (flush_grid_programs(x.device, items, _walk.get("programs_per_sm", 2)),)](
            state, ring_x, ring_dt, ring_B, *positions,
            x, dt, B, C, A, _optional(D, A), _optional(z, x), _optional(dt_bias, A), y,
            items, heads, head_dim, d_state, ring_size, heads // groups, *host,
            *position_strides,
            *state.stride(), *ring_x.stride(), *ring_dt.stride(), *ring_B.stride(),
            *x.stride(), *dt.stride(), *B.stride(), *C.stride(),
            A.stride(0), _strides(D, 1)[0], _strides(dt_bias, 1)[0],
            *_strides(z, 3), *y.stride(),
            HAS_D=D is not None,
            HAS_Z=z is not None,
            HAS_DT_BIAS=dt_bias is not None,
            DT_SOFTPLUS=bool(dt_softplus),
            BLOCK_P=cfg["block_p"],
            BLOCK_N=next_power_of_2(d_state),
            BLOCK_R=block_r,
            NUM_STAGES=int(_walk.get("num_stages", 2)),
            BUFFER_LEN=buffer_len,
            DEVICE_POSITIONS=kernel_phase == 4,
            RING_PHYSICAL=kernel_phase == 4 and bool(ring_physical),
            num_warps=cfg["num_warps"],
        )

    def launch_flush_due():
        flush_cfg = {**fold_tile_config(head_dim, d_state), "fold_unroll": cfg["fold_unroll"], **(_flush_config or {})}
        items = batch * cdiv(head_dim, flush_cfg["block_p"]) * heads
        LAST_COMPILED["replay_phase3"] = LAST_COMPILED["flush_due"] = _mamba2_flush_due_kernel[
            (flush_grid_programs(x.device, items, flush_cfg.get("programs_per_sm")),)](
            state, ring_x, ring_dt, ring_B, origin, count,
            x, dt, B, C, A, _optional(D, A), _optional(z, x), _optional(dt_bias, A), y, flush_amax,
            batch, heads, head_dim, d_state, ring_size, heads // groups,
            *state.stride(), *ring_x.stride(), *ring_dt.stride(), *ring_B.stride(),
            origin.stride(0), count.stride(0),
            *x.stride(), *dt.stride(), *B.stride(), *C.stride(),
            A.stride(0), _strides(D, 1)[0], _strides(dt_bias, 1)[0],
            *_strides(z, 3), *y.stride(),
            BUFFER_LEN=buffer_len,
            HAS_D=D is not None,
            HAS_Z=z is not None,
            HAS_DT_BIAS=dt_bias is not None,
            DT_SOFTPLUS=bool(dt_softplus),
            FOLD_UNROLL=flush_cfg["fold_unroll"],
            FLUSH_PRECISION=FLUSH_PRECISION,
            BLOCK_P=flush_cfg["block_p"],
            BLOCK_N=next_power_of_2(d_state),
            BLOCK_R=block_r,
            BLOCK_B=next_power_of_2(batch),
            FLUSH_AMAX=flush_amax is not A,
            num_warps=flush_cfg["num_warps"],
        )

    def launch(kernel_phase):
        if kernel_phase == 3 and flush_on_device_grid:
            return launch_flush_due()
        if kernel_phase in (1, 4) and _walk is not None:
            return launch_walk(kernel_phase)
        # Host-phase flush programs fold with one tl.dot (closed form, tf32x3; tl.dot needs every tile dimension
        # >= 16). Device-phase ones keep the sequential fold, whose checkpoint is bit for bit the standard step's
        # (what speculative rollback and the device path promise), at once per L steps.
        launch_cfg = launch_config(kernel_phase)
        flush_dot = (kernel_phase == 2 and launch_cfg["block_p"] >= 16
                     and not (_config or {}).get("flush_loop", False))
        grid = (cdiv(head_dim, launch_cfg["block_p"]), batch, heads)
        kernel = _mamba2_replay_step_kernel[grid](
            state, ring_x, ring_dt, ring_B, *positions,
            x, dt, B, C, A, _optional(D, A), _optional(z, x), _optional(dt_bias, A), y, *read_operands[:3], weights,
            flush_amax,
            head_dim, d_state, ring_size, heads // groups, *host,
            *state.stride(), *ring_x.stride(), *ring_dt.stride(), *ring_B.stride(),
            *position_strides,
            *x.stride(), *dt.stride(), *B.stride(), *C.stride(),
            A.stride(0), _strides(D, 1)[0], _strides(dt_bias, 1)[0],
            *_strides(z, 3), *y.stride(), *read_operands[3:],
            BUFFER_LEN=buffer_len,
            PHASE=kernel_phase,
            HAS_D=D is not None,
            HAS_Z=z is not None,
            HAS_DT_BIAS=dt_bias is not None,
            DT_SOFTPLUS=bool(dt_softplus),
            TICKET=bool(_ticket) and not count_launch,
            RING_PHYSICAL=bool(ring_physical),
            FOLD_UNROLL=launch_cfg["fold_unroll"],
            FLUSH_DOT=flush_dot,
            FLUSH_PRECISION=FLUSH_PRECISION,
            BLOCK_P=launch_cfg["block_p"],
            BLOCK_N=next_power_of_2(d_state),
            BLOCK_R=max(16, next_power_of_2(ring_size)) if flush_dot else block_r,
            # a flush-only launch (host phase 2, a split step's 3) reads the copy only for a flushing row's output
            # (flush_reads_copy)
            READ_FORMAT=kernel_read_format if kernel_phase in (0, 1, 4) or (kernel_phase in (2, 3) and flush_reads_copy
                                                                            and not outputs_launch) else "fp32",
            PREFETCH_STATE=kernel_phase == 4 and read_format == "fp32" and bool(_prefetch),
            FLUSH_READS_COPY=flush_reads_copy and kernel_phase in (0, 2, 3) and not outputs_launch,
            WEIGHTS_GIVEN=bool(_weights) and kernel_phase in (1, 4),
            ENCODE_COPY=encode_in_flush and kernel_phase in (0, 2, 3),
            ENCODE_SCALAR_RECIPROCAL=encode_consts[0],
            ENCODE_FP8_CONVERT=encode_consts[1],
            FLUSH_AMAX=flush_amax is not A and kernel_phase in (0, 2, 3),
            FLUSH_COPY_PRODUCT=(bool(_flush_copy_product) and flush_reads_copy and kernel_phase in (2, 3)
                                and kernel_read_format in ("nvfp4_pairs", "fp8") and not outputs_launch),
            OUTPUTS_ONLY=outputs_launch and kernel_phase in (1, 4),
            STORE_Y=not (outputs_launch and kernel_phase in (2, 3)),
            num_warps=launch_cfg["num_warps"],
        )
        LAST_COMPILED[f"replay_phase{kernel_phase}"] = LAST_COMPILED["replay"] = kernel

    # reencode_copy: a flushing row's copy re-encoded from its new checkpoint, by the re-encode launch after the step
    # (its default grid; see read_copy_encode). _encode_in_flush (fp8 with flush_reads_copy): the flush writes it
    # from its registers instead (a program holds whole rows; host phase 2, a split step's flush launch 3, the fused
    # launch 0), which saves the re-encode's read of the checkpoint. With the one flush launch reading the copy it
    # measured slower (H200, Nemotron-H-8B shape, batch 256, run 166: host cycle 304.1 us against 299.0-299.9, device
    # step in phase 381.9 against 373.2, mixed phases 439.0 against 410.3: the encode's divisions in the flush
    # programs, at their occupancy); in the plain host flush beside the outputs by the replay launch faster (run 181:
    # 273.98 -> 268.34 us), so None (the default) means there
    reencode_copy = bool(reencode_copy) and read_format != "fp32" and phase != 1
    in_flush = outputs_launch and phase == 2 if _encode_in_flush is None else bool(_encode_in_flush)
    encode_in_flush = reencode_copy and flush_reads_copy and read_format == "fp8" and in_flush
    encode_consts = encode_constants(state) if encode_in_flush else (False, "soft")
    # nvfp4: the flush launches fold each flushing row's max |new checkpoint| into a zeroed [B] scratch as they
    # store it, and the re-encode takes it (amax=) instead of reading the checkpoint once more for it; A stands in
    # as the unused pointer otherwise
    flush_amax = A
    if reencode_copy and read_format == "nvfp4" and _flush_amax:
        flush_amax = torch.zeros(batch, dtype=torch.int32, device=state.device)
    with _device_guard(x):
        if _weights:  # before the step's launches: it reads the counts they read
            launch_weights()
        for kernel_phase in launches:  # in stream order: the replay launch (4) reads the counts the flush one read
            launch(kernel_phase)
        if count_launch:
            advance_counts(count, buffer_len)
        if reencode_copy and not encode_in_flush:
            reencode_flushed_rows(state, read_copy, read_format, count if phase == 0 else None,
                                  None if flush_amax is A else flush_amax)
    return y


# Largest batch whose split device-phase step flushes on the device-sized grid by default (kernels/flush_grid.py).
# H200, Nemotron-H 8B shape, per step, rows in mixed phases / in phase (runs 103 / 105, `hf-replayssm bench kernels`,
# variant flush_device_grid): batch 32 59.2 / 58.3 us against 67.9 / 62.7 on the batch-sized grid, 64 109.8 / 108.6
# against 119.9 / 113.6, 128 212.4 / 208.4 against 225.9 / 213.9; batch 256 477.7 / 475.2 against 433.9 / 417.7.
DEVICE_GRID_MAX_BATCH = 128


def default_flush_grid(batch: int) -> str:
    """The flush launch's grid of a split device-phase step: ``"device"`` up to :data:`DEVICE_GRID_MAX_BATCH` rows
    (the launch costs what the due rows cost), ``"batch"`` beyond (where it measured slower)."""
    return "device" if batch <= DEVICE_GRID_MAX_BATCH else "batch"


def fold_tile_config(head_dim: int, d_state: int) -> dict:
    """``block_p`` and ``num_warps`` of the record folds outside the replay step (the verify commit and ring fold,
    ``kernels/mamba2_verify.py``, and the device-grid flush launch): a 2048-element tile ([16, 128] for d_state
    128) on 2 warps. H200, Nemotron-H 8B shape, batch 256, the commit with every row flushing (run 97,
    ``bench_verify --parts``): [16, 128] x 2 1043 us, x 1 1103, [32, 128] x 4 1134, the standard step's [32, 128] x 8
    1229, [64, 128] x 8 1743. Compile-only, sm_90 (Triton 3.6), the device-grid flush: 128 registers at 16 rows,
    143 at 256; at [32, 128] its loop over items needs 228."""
    block_n = next_power_of_2(d_state)
    return dict(block_p=min(next_power_of_2(head_dim), max(1, 2048 // block_n)), num_warps=2)


def _state_update(state, x, dt, B, C, A, D=None, z=None, dt_bias=None, dt_softplus=False, out=None, _config=None):
    """:func:`mamba2_state_update` with a launch-configuration override (``_config``)."""
    batch, heads, head_dim, d_state, groups = _check_step_inputs(state, x, dt, B, C, A, D, z, dt_bias)
    y = torch.empty_like(x) if out is None else out
    assert y.shape == x.shape
    cfg = dict(state_update_launch_config(batch, heads, head_dim, d_state), **(_config or {}))
    grid = (cdiv(head_dim, cfg["block_p"]), batch, heads)
    with _device_guard(x):
        LAST_COMPILED["state_update"] = _mamba2_state_update_kernel[grid](
            state, x, dt, B, C, A, _optional(D, A), _optional(z, x), _optional(dt_bias, A), y,
            head_dim, d_state, heads // groups,
            *state.stride(), *x.stride(), *dt.stride(), *B.stride(), *C.stride(),
            A.stride(0), _strides(D, 1)[0], _strides(dt_bias, 1)[0],
            *_strides(z, 3), *y.stride(),
            HAS_D=D is not None,
            HAS_Z=z is not None,
            HAS_DT_BIAS=dt_bias is not None,
            DT_SOFTPLUS=bool(dt_softplus),
            BLOCK_P=cfg["block_p"],
            BLOCK_N=next_power_of_2(d_state),
            num_warps=cfg["num_warps"],
        )
    return y


def mamba2_replay_step(
    state: torch.Tensor,
    ring_x: torch.Tensor,
    ring_dt: torch.Tensor,
    ring_B: torch.Tensor,
    origin: torch.Tensor | int,
    count: torch.Tensor | int,
    x: torch.Tensor,
    dt: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    A: torch.Tensor,
    D: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    dt_softplus: bool = False,
    buffer_len: int = 16,
    out: torch.Tensor | None = None,
    read_copy: dict[str, torch.Tensor] | None = None,
    read_format: str | None = None,
    flush_reads_copy: bool = False,
    reencode_copy: bool = False,
) -> torch.Tensor:
    """Fused ReplaySSM decode step (one launch, phase decided per row on the device).

    state [B, H, P, N] checkpoint (float32 recommended; any float dtype is loaded/stored as such);
    ring_x [B, R, H, P], ring_dt [B, R, H] float32 (post-softplus), ring_B [B, R, G, N]; origin, count [B] int32;
    x [B, H, P]; dt [B, H] raw; B, C [B, G, N]; A [H]; D [H]; z [B, H, P]; dt_bias [H]. R >= buffer_len - 1 and
    0 <= count[b] < buffer_len.

    Row b replays when ``count[b] + 1 < buffer_len`` (output from checkpoint + records, record appended at slot
    ``(origin[b] + count[b]) % R``, ``count[b] += 1``, state untouched) and flushes otherwise (records + token folded
    into ``state[b]`` in place, ``count[b] = 0``, ``origin[b]`` unchanged). Returns y [B, H, P] in x's dtype (or
    ``out``). Same semantics as :func:`mamba2_replay_step_ref`.

    ``origin`` and ``count`` may instead be host ints (every row at the same position, e.g. plain batched decoding
    with the positions mirrored on the host): the launch is then a kernel specialised to that phase (a replay-only
    or flush-only program: fewer registers, no position load, no count update) and the caller advances its own
    count.

    Separated precision: ``read_copy`` (with ``read_format`` "fp8" or "nvfp4") is a low-precision copy of ``state``
    in the checkpoint store's encoding (layouts in :mod:`hf_replayssm.ops.read_copy`; rows = d_state). Replaying
    rows then take the state term ``S0 C`` from the copy, decoded in registers, and never read ``state``; flushing
    rows read and write ``state`` as without a copy and do **not** re-encode the copy unless ``reencode_copy``: after a
    flush the caller must refresh the copy from the new checkpoint (e.g. ``CheckpointStore.write``) before the next
    replay step.
    ``flush_reads_copy`` (with a copy): a flushing row's ``y`` comes from the copy and the records by the replay
    arithmetic (the separated policy's flush step output) rather than from the new state; its checkpoint is folded
    as without it (device positions: by the split step's flush launch, ``_replay_step(..., _split=False)``: one
    fused launch; host positions: by the flush-only launch, which then reads the copy too). ``reencode_copy`` (with a
    copy): a flushing row's copy is re-encoded from its new checkpoint in the same call (the re-encode launch after
    the step's launches, on the grid that suits the positions), bit-identical to the store's encoding
    (:func:`hf_replayssm.kernels.read_copy_encode.reencode_read_copy`).
    """
    return _replay_step(state, ring_x, ring_dt, ring_B, origin, count, x, dt, B, C, A, D, z, dt_bias, dt_softplus,
                        buffer_len, out, read_copy, read_format, flush_reads_copy=flush_reads_copy,
                        reencode_copy=reencode_copy)


def mamba2_state_update(
    state: torch.Tensor,
    x: torch.Tensor,
    dt: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    A: torch.Tensor,
    D: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    dt_softplus: bool = False,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Standard Mamba-2 decode step: ``S = exp(A dt) S + dt x B^T`` in place, returns ``y = (S C + D x) silu(z)``
    [B, H, P] in x's dtype (or ``out``). Shapes as :func:`mamba2_replay_step`. Same semantics as
    :func:`mamba2_state_update_ref`."""
    return _state_update(state, x, dt, B, C, A, D, z, dt_bias, dt_softplus, out)
