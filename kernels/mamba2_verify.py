"""Triton speculative-decoding kernels for Mamba-2 layers: verify a window of T tokens against the float32
checkpoint plus the ring of committed records, then commit the accepted prefix.

Entry points (each with a torch reference of the same signature, re-exported here from
``hf_replayssm.ops.mamba2_verify``):

* :func:`mamba2_verify` / :func:`mamba2_verify_ref`: outputs of T window tokens per row (token t sees the checkpoint,
  the ``count[b]`` committed records and window tokens 0..t); appends the T records at slots
  ``(origin + count + t) % R``; writes no state and leaves ``count`` unchanged.
* :func:`mamba2_commit` / :func:`mamba2_commit_ref`: ``count += accepted``; rows whose new count reaches
  ``buffer_len`` fold all their committed records into the checkpoint (sequential recurrence) and restart the ring
  at ``origin`` with ``count = 0``. Per-row phase decided on the device.
* :func:`mamba2_fold_ring` / :func:`mamba2_fold_ring_ref`: the checkpoint with ``count`` records from ring slot
  ``origin`` (host ints, the same for every row) folded in, out of place or in place: the checkpoint at a flush
  boundary a speculative window crosses (staged), or a complete period a rollback left. The commit's loop.

Shapes and ring layout are those of ``kernels/mamba2.py`` with a window axis on the tokens: state [B, H, P, N];
ring_x [B, R, H, P]; ring_dt [B, R, H] float32 (post-softplus); ring_B [B, R, G, N]; origin, count, accepted [B]
int32; x, z [B, T, H, P]; dt [B, T, H] raw; B, C [B, T, G, N]; A, D, dt_bias [H]. A window needs
``count[b] + T <= R`` (so ``R >= buffer_len - 1 + T``); the host asserts ``T <= R`` and the kernel returns NaN
outputs for a row that does not fit (and appends nothing for it), since checking ``count`` on the host would sync.

Design notes:

* Verify grid ``(cdiv(P, BLOCK_P), B, H)``, one program per P tile of one (row, head), like the replay step. The
  program reads its checkpoint tile once, the row's committed records (``BLOCK_R = next_pow2(R - T)`` of them at
  most, masked by ``j < count``) and the T window tokens. For token t:
  ``y_t = exp(lam_t) (S0 C_t) + sum_j w_jt (B_j . C_t) x_j + sum_{s<=t} w_st (B_s . C_t) x_s + D x_t``
  with the log decays summed directly over the terms in between (records after j, then window tokens up to t;
  never differences of cumulative sums, see ``hf_replayssm/ops/decay.py``). Two forms of the same sums, chosen by
  the constexpr ``WINDOW_AS_PRODUCTS`` (``_verify(..., _products=...)``; by default :func:`default_form`: tokens up
  to 4 tokens, tf32x3 products from 5):
  - token by token: a runtime loop over the window (one compile per ``BLOCK_T = max(8, next_pow2(T))``, not one
    per width, which cost a JIT compile at every new draft count of a speculative run), one pass over the state
    tile per token (``S0 C_t``) plus O((count + T)(N + P));
  - as matrix products: no term depends on another token's output, so the whole window is the SSD form of a
    chunk: ``[T, N] x [N, BLOCK_P]`` against the state tile, ``[T, N] x [N, R]`` and ``[T, R] x [R, BLOCK_P]``
    against the records, ``[T, N] x [N, T]`` and ``[T, T] x [T, BLOCK_P]`` within the window; ``BLOCK_T = 16`` (one
    compile for every width), so its cost hardly moves with T. ``tl.dot`` in IEEE float32 (``_products=True``) is
    compute-bound on CUDA cores (H200, run 77: 1.2-3.6x slower than the token form); ``"tf32x3"`` (three TF32
    tensor-core products, float32 accuracy; ``kernels/verify_products.py``) is the fast one.
  H200, batch 256, verify + commit against per-draft snapshots, both accept modes (run 80, ``bench_verify``):
  2.85-2.95x at T = 2, 3.45-3.69x at T = 4, 5.54-6.29x at T = 8 (run 74, token form on [32, 128] x 8 warps:
  1.43x / 0.93x / 1.52x).
* Records are appended by the programs that own them (x by every P tile, dt by P tile 0, B by P tile 0 of the
  group's first head); the appended slots differ from every slot read when ``count + T <= R``.
* Commit grid ``(cdiv(P, BLOCK_P), B, H)``: programs of rows that do not flush only take part in the count update.
  Flushing programs fold the records one at a time with exactly the expression of the replay step's flush and the
  standard step (``S = S * exp(A dt_j) + (dt_j x_j) B_j^T``), so the checkpoint is bit-identical to stepping the same
  tokens with :func:`mamba2_state_update` (or through the replay step's flushes) when the ring dtypes equal the
  input dtypes: the fold is split-invariant, so flushing after more than ``buffer_len`` records (a window can
  overshoot) gives the same bits.
* Count update (one launch, no host sync): every commit program reads ``count[b]``, passes a barrier, then takes a
  ticket with ``atomic_add(count[b], 1 << 16)``; the program drawing the row's last ticket writes the new count
  with an atomic exchange (clearing the ticket bits), as in ``kernels/mamba2.py``. Hence fewer than ``2**15``
  programs per row and ``count`` not shared by concurrent launches.
* All math is fp32 on CUDA cores (the products form's ``tl.dot`` in IEEE float32, not TF32, unless ``_products`` names
  ``"tf32x3"``: see ``kernels/verify_products.py``); bf16/fp16
  inputs are upcast right after loading (also required by ``TRITON_INTERPRET=1``). Launch configurations:
  :func:`verify_launch_config` for verify, :func:`fold_launch_config` for commit and the ring fold; both can be
  overridden through the private ``_config`` argument of ``_verify`` / ``_commit`` (``kernels/bench_verify.py``
  times them).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hf_replayssm.kernels.host_math import cdiv, next_power_of_2
from hf_replayssm.kernels.verify_products import dot_precision
from hf_replayssm.ops.mamba2_verify import mamba2_commit_ref, mamba2_fold_ring_ref, mamba2_verify_ref

if __package__:
    from .mamba2 import _device_guard, _optional, _softplus, _strides, fold_tile_config
else:  # loaded from its file outside the package (a checkout without the package installed)
    import importlib.util
    import sys
    from pathlib import Path

    if "_replayssm_kernels_mamba2" not in sys.modules:  # the name tests/kernel_harness.py gives it
        _spec = importlib.util.spec_from_file_location("_replayssm_kernels_mamba2",
                                                       Path(__file__).with_name("mamba2.py"))
        sys.modules[_spec.name] = importlib.util.module_from_spec(_spec)
        _spec.loader.exec_module(sys.modules[_spec.name])
    _m = sys.modules["_replayssm_kernels_mamba2"]
    _device_guard, _optional, _softplus, _strides = _m._device_guard, _m._optional, _m._softplus, _m._strides
    fold_tile_config = _m.fold_tile_config

__all__ = [
    "mamba2_commit",
    "mamba2_commit_ref",
    "mamba2_fold_ring",
    "mamba2_fold_ring_ref",
    "mamba2_verify",
    "mamba2_verify_ref",
    "verify_launch_config",
]

_TICKET_SHIFT = 16
MAX_WINDOW = 16  # the window tiles are [BLOCK_T, ...] registers
LAST_COMPILED: dict = {}


# One compile per BLOCK_T, not per window width: the width and the batch strides of the window tensors (T times a
# row's size, so 16-divisible for some widths and not others) are not specialised on.
@triton.jit(do_not_specialize=["window", "stride_x_b", "stride_dt_b", "stride_B_b", "stride_C_b", "stride_z_b",
                               "stride_y_b"])
def _mamba2_verify_kernel(
    state_ptr, ring_x_ptr, ring_dt_ptr, ring_B_ptr, origin_ptr, count_ptr,
    x_ptr, dt_ptr, B_ptr, C_ptr, A_ptr, D_ptr, z_ptr, dt_bias_ptr, y_ptr,
    P, N, ring_size, heads_per_group,
    stride_s_b, stride_s_h, stride_s_p, stride_s_n,
    stride_rx_b, stride_rx_r, stride_rx_h, stride_rx_p,
    stride_rdt_b, stride_rdt_r, stride_rdt_h,
    stride_rB_b, stride_rB_r, stride_rB_g, stride_rB_n,
    stride_origin, stride_count,
    stride_x_b, stride_x_t, stride_x_h, stride_x_p,
    stride_dt_b, stride_dt_t, stride_dt_h,
    stride_B_b, stride_B_t, stride_B_g, stride_B_n,
    stride_C_b, stride_C_t, stride_C_g, stride_C_n,
    stride_A, stride_D, stride_dt_bias,
    stride_z_b, stride_z_t, stride_z_h, stride_z_p,
    stride_y_b, stride_y_t, stride_y_h, stride_y_p,
    window,  # T, a runtime loop bound (BLOCK_T >= T sizes the window tiles)
    HAS_D: tl.constexpr,
    HAS_Z: tl.constexpr,
    HAS_DT_BIAS: tl.constexpr,
    DT_SOFTPLUS: tl.constexpr,
    WINDOW_AS_PRODUCTS: tl.constexpr,
    PRECISION: tl.constexpr,  # the products' tl.dot input precision ("ieee" or "tf32x3")
    BLOCK_P: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_T: tl.constexpr,
):
    pid_p = tl.program_id(0)
    pid_b = tl.program_id(1).to(tl.int64)
    h = tl.program_id(2)
    group = h // heads_per_group

    offs_p = pid_p * BLOCK_P + tl.arange(0, BLOCK_P)
    offs_n = tl.arange(0, BLOCK_N)
    offs_r = tl.arange(0, BLOCK_R)
    offs_t = tl.arange(0, BLOCK_T)
    mask_p = offs_p < P
    mask_n = offs_n < N
    mask_t = offs_t < window

    # Loads first (checkpoint tile, row phase, window tokens), then the records whose addresses wait for origin/count.
    s0 = tl.load(state_ptr + pid_b * stride_s_b + h * stride_s_h + offs_p[:, None] * stride_s_p
                 + offs_n[None, :] * stride_s_n, mask=mask_p[:, None] & mask_n[None, :], other=0.0).to(tl.float32)
    count = tl.load(count_ptr + pid_b * stride_count)
    origin = tl.load(origin_ptr + pid_b * stride_origin)
    A_h = tl.load(A_ptr + h * stride_A).to(tl.float32)
    x_w = tl.load(x_ptr + pid_b * stride_x_b + offs_t[:, None] * stride_x_t + h * stride_x_h
                  + offs_p[None, :] * stride_x_p, mask=mask_t[:, None] & mask_p[None, :], other=0.0)  # [T, P]
    dt_w = tl.load(dt_ptr + pid_b * stride_dt_b + offs_t * stride_dt_t + h * stride_dt_h,
                   mask=mask_t, other=0.0).to(tl.float32)
    B_w = tl.load(B_ptr + pid_b * stride_B_b + offs_t[:, None] * stride_B_t + group * stride_B_g
                  + offs_n[None, :] * stride_B_n, mask=mask_t[:, None] & mask_n[None, :], other=0.0)  # [T, N]
    if HAS_DT_BIAS:
        dt_w += tl.load(dt_bias_ptr + h * stride_dt_bias).to(tl.float32)
    if DT_SOFTPLUS:
        dt_w = _softplus(dt_w)
    dt_w = tl.where(mask_t, dt_w, 0.0)
    if HAS_D:
        D_h = tl.load(D_ptr + h * stride_D).to(tl.float32)

    fits = count + window <= ring_size  # else: NaN outputs, nothing appended (see the module docstring)
    valid = offs_r < count
    slots = (origin + offs_r) % ring_size
    x_r = tl.load(ring_x_ptr + pid_b * stride_rx_b + slots[:, None] * stride_rx_r + h * stride_rx_h
                  + offs_p[None, :] * stride_rx_p, mask=valid[:, None] & mask_p[None, :], other=0.0).to(tl.float32)
    dt_r = tl.load(ring_dt_ptr + pid_b * stride_rdt_b + slots * stride_rdt_r + h * stride_rdt_h,
                   mask=valid, other=0.0).to(tl.float32)
    B_r = tl.load(ring_B_ptr + pid_b * stride_rB_b + slots[:, None] * stride_rB_r + group * stride_rB_g
                  + offs_n[None, :] * stride_rB_n, mask=valid[:, None] & mask_n[None, :], other=0.0).to(tl.float32)

    x_wf = x_w.to(tl.float32)
    B_wf = B_w.to(tl.float32)
    la_r = A_h * dt_r  # log decays of the records (0 where invalid)
    la_w = A_h * dt_w  # of the window tokens (0 beyond T)
    after_r = tl.sum(tl.where(offs_r[None, :] > offs_r[:, None], la_r[None, :], 0.0), axis=1)  # records after j
    total_r = tl.sum(la_r, axis=0)
    if WINDOW_AS_PRODUCTS:  # the whole window as matrix products (BLOCK_T = 16: tl.dot needs 16 rows)
        C_w = tl.load(C_ptr + pid_b * stride_C_b + offs_t[:, None] * stride_C_t + group * stride_C_g
                      + offs_n[None, :] * stride_C_n, mask=mask_t[:, None] & mask_n[None, :], other=0.0)
        C_w = C_w.to(tl.float32)
        upto = tl.sum(tl.where(offs_t[None, :] <= offs_t[:, None], la_w[None, :], 0.0), axis=1)  # [T]: tokens 0..t
        # [t, s]: window tokens s < i <= t, summed directly (no differences of cumulative sums)
        i_3 = offs_t[None, None, :]
        between = (i_3 > offs_t[None, :, None]) & (i_3 <= offs_t[:, None, None])
        seg_w = tl.sum(tl.where(between, la_w[None, None, :], 0.0), axis=2)

        # Every token at once, as matrix products (IEEE float32: no TF32 rounding on the way):
        # y_t = exp(lam_t) (S0 C_t) + sum_j w_jt (B_j . C_t) x_j + sum_{s<=t} w_st (B_s . C_t) x_s
        y = tl.exp(total_r + upto)[:, None] * tl.dot(C_w, tl.trans(s0), input_precision=PRECISION)  # [T, P]
        w_r = tl.where(valid[None, :], dt_r[None, :] * tl.exp(after_r[None, :] + upto[:, None]), 0.0)  # [T, R]
        y += tl.dot(w_r * tl.dot(C_w, tl.trans(B_r), input_precision=PRECISION), x_r, input_precision=PRECISION)
        w_w = tl.where(offs_t[None, :] <= offs_t[:, None], dt_w[None, :] * tl.exp(seg_w), 0.0)  # [T, T]
        y += tl.dot(w_w * tl.dot(C_w, tl.trans(B_wf), input_precision=PRECISION), x_wf, input_precision=PRECISION)
        if HAS_D:
            y += D_h * x_wf
        if HAS_Z:
            z = tl.load(z_ptr + pid_b * stride_z_b + offs_t[:, None] * stride_z_t + h * stride_z_h
                        + offs_p[None, :] * stride_z_p, mask=mask_t[:, None] & mask_p[None, :], other=0.0)
            y *= z.to(tl.float32) * tl.sigmoid(z.to(tl.float32))
        y = tl.where(fits, y, float("nan"))
        tl.store(y_ptr + pid_b * stride_y_b + offs_t[:, None] * stride_y_t + h * stride_y_h
                 + offs_p[None, :] * stride_y_p, y.to(y_ptr.dtype.element_ty), mask=mask_t[:, None] & mask_p[None, :])
    else:  # token by token: one pass over the state tile per token
        for t in range(0, window):
            C_t = tl.load(C_ptr + pid_b * stride_C_b + t * stride_C_t + group * stride_C_g + offs_n * stride_C_n,
                          mask=mask_n, other=0.0).to(tl.float32)
            upto_t = tl.sum(tl.where(offs_t <= t, la_w, 0.0), axis=0)  # window tokens 0..t
            w_r = tl.where(valid, dt_r * tl.exp(after_r + upto_t), 0.0)
            seg_w = tl.sum(tl.where((offs_t[None, :] > offs_t[:, None]) & (offs_t[None, :] <= t), la_w[None, :],
                                    0.0), axis=1)  # [T]: window tokens s < s' <= t
            w_w = tl.where(offs_t <= t, dt_w * tl.exp(seg_w), 0.0)
            bc_r = tl.sum(B_r * C_t[None, :], axis=1)
            bc_w = tl.sum(B_wf * C_t[None, :], axis=1)
            y = (tl.exp(total_r + upto_t) * tl.sum(s0 * C_t[None, :], axis=1)
                 + tl.sum((w_r * bc_r)[:, None] * x_r, axis=0) + tl.sum((w_w * bc_w)[:, None] * x_wf, axis=0))
            if HAS_D:
                y += D_h * tl.sum(tl.where(offs_t[:, None] == t, x_wf, 0.0), axis=0)
            if HAS_Z:
                z = tl.load(z_ptr + pid_b * stride_z_b + t * stride_z_t + h * stride_z_h + offs_p * stride_z_p,
                            mask=mask_p, other=0.0).to(tl.float32)
                y *= z * tl.sigmoid(z)
            y = tl.where(fits, y, float("nan"))
            tl.store(y_ptr + pid_b * stride_y_b + t * stride_y_t + h * stride_y_h + offs_p * stride_y_p,
                     y.to(y_ptr.dtype.element_ty), mask=mask_p)

    # Append the window's records at logical positions count + t (rows that fit only).
    new_slots = (origin + count + offs_t) % ring_size
    append = offs_t < tl.where(fits, window, 0)
    tl.store(ring_x_ptr + pid_b * stride_rx_b + new_slots[:, None] * stride_rx_r + h * stride_rx_h
             + offs_p[None, :] * stride_rx_p, x_w.to(ring_x_ptr.dtype.element_ty),
             mask=append[:, None] & mask_p[None, :])
    if pid_p == 0:
        tl.store(ring_dt_ptr + pid_b * stride_rdt_b + new_slots * stride_rdt_r + h * stride_rdt_h,
                 dt_w.to(ring_dt_ptr.dtype.element_ty), mask=append)
        if h % heads_per_group == 0:
            tl.store(ring_B_ptr + pid_b * stride_rB_b + new_slots[:, None] * stride_rB_r + group * stride_rB_g
                     + offs_n[None, :] * stride_rB_n, B_w.to(ring_B_ptr.dtype.element_ty),
                     mask=append[:, None] & mask_n[None, :])


@triton.jit
def _fold_ring(s, rx_base, rdt_base, rB_base, A_h, origin, count, ring_size, offs_p, mask_p, offs_n, mask_n,
               stride_rx_r, stride_rx_p, stride_rdt_r, stride_rB_r, stride_rB_n):
    """The state tile s [BLOCK_P, BLOCK_N] with the ``count`` records from ring slot ``origin`` on folded in, in
    order, with the standard step's expression (the checkpoint stepping would give, bit for bit)."""
    A_h = A_h.to(tl.float32)
    for j in range(0, count):
        slot = (origin + j) % ring_size
        dt_j = tl.load(rdt_base + slot * stride_rdt_r).to(tl.float32)
        x_j = tl.load(rx_base + slot * stride_rx_r + offs_p * stride_rx_p, mask=mask_p, other=0.0).to(tl.float32)
        B_j = tl.load(rB_base + slot * stride_rB_r + offs_n * stride_rB_n, mask=mask_n, other=0.0).to(tl.float32)
        s = s * tl.exp(A_h * dt_j) + (dt_j * x_j)[:, None] * B_j[None, :]
    return s


@triton.jit
def _mamba2_commit_kernel(
    state_ptr, ring_x_ptr, ring_dt_ptr, ring_B_ptr, origin_ptr, count_ptr, accepted_ptr, A_ptr,
    P, N, ring_size, heads_per_group,
    stride_s_b, stride_s_h, stride_s_p, stride_s_n,
    stride_rx_b, stride_rx_r, stride_rx_h, stride_rx_p,
    stride_rdt_b, stride_rdt_r, stride_rdt_h,
    stride_rB_b, stride_rB_r, stride_rB_g, stride_rB_n,
    stride_origin, stride_count, stride_accepted, stride_A,
    BUFFER_LEN: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    pid_p = tl.program_id(0)
    pid_b = tl.program_id(1).to(tl.int64)
    h = tl.program_id(2)
    group = h // heads_per_group

    # Low 16 bits: the count (high bits: tickets already taken by this row's programs in this launch).
    count = tl.load(count_ptr + pid_b * stride_count, volatile=True) & 0xFFFF
    accepted = tl.load(accepted_ptr + pid_b * stride_accepted)
    origin = tl.load(origin_ptr + pid_b * stride_origin)
    new_count = count + accepted
    is_flush = new_count >= BUFFER_LEN
    if is_flush:
        offs_p = pid_p * BLOCK_P + tl.arange(0, BLOCK_P)
        offs_n = tl.arange(0, BLOCK_N)
        mask_p = offs_p < P
        mask_n = offs_n < N
        state_ptrs = (state_ptr + pid_b * stride_s_b + h * stride_s_h
                      + offs_p[:, None] * stride_s_p + offs_n[None, :] * stride_s_n)
        s = tl.load(state_ptrs, mask=mask_p[:, None] & mask_n[None, :], other=0.0).to(tl.float32)
        s = _fold_ring(s, ring_x_ptr + pid_b * stride_rx_b + h * stride_rx_h,
                       ring_dt_ptr + pid_b * stride_rdt_b + h * stride_rdt_h,
                       ring_B_ptr + pid_b * stride_rB_b + group * stride_rB_g, tl.load(A_ptr + h * stride_A),
                       origin, new_count, ring_size, offs_p, mask_p, offs_n, mask_n,
                       stride_rx_r, stride_rx_p, stride_rdt_r, stride_rB_r, stride_rB_n)
        tl.store(state_ptrs, s.to(state_ptr.dtype.element_ty), mask=mask_p[:, None] & mask_n[None, :])

    # Count update: every warp has consumed count (barrier) before this program's ticket; the row's last ticket
    # writes the new count and clears the ticket bits.
    tl.debug_barrier()
    ticket = tl.atomic_add(count_ptr + pid_b * stride_count, 1 << 16, sem="relaxed") >> 16
    if ticket == tl.num_programs(0) * tl.num_programs(2) - 1:
        tl.atomic_xchg(count_ptr + pid_b * stride_count, tl.where(is_flush, 0, new_count), sem="relaxed")


@triton.jit(do_not_specialize=["origin", "count"])  # one compile for every ring position and record count
def _mamba2_fold_kernel(
    state_ptr, out_ptr, ring_x_ptr, ring_dt_ptr, ring_B_ptr, A_ptr, origin, count,
    P, N, ring_size, heads_per_group,
    stride_s_b, stride_s_h, stride_s_p, stride_s_n,
    stride_o_b, stride_o_h, stride_o_p, stride_o_n,
    stride_rx_b, stride_rx_r, stride_rx_h, stride_rx_p,
    stride_rdt_b, stride_rdt_r, stride_rdt_h,
    stride_rB_b, stride_rB_r, stride_rB_g, stride_rB_n,
    stride_A,
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
    tile = mask_p[:, None] & mask_n[None, :]
    s = tl.load(state_ptr + pid_b * stride_s_b + h * stride_s_h + offs_p[:, None] * stride_s_p
                + offs_n[None, :] * stride_s_n, mask=tile, other=0.0).to(tl.float32)
    s = _fold_ring(s, ring_x_ptr + pid_b * stride_rx_b + h * stride_rx_h,
                   ring_dt_ptr + pid_b * stride_rdt_b + h * stride_rdt_h,
                   ring_B_ptr + pid_b * stride_rB_b + group * stride_rB_g, tl.load(A_ptr + h * stride_A),
                   origin, count, ring_size, offs_p, mask_p, offs_n, mask_n,
                   stride_rx_r, stride_rx_p, stride_rdt_r, stride_rB_r, stride_rB_n)
    # each program owns its tile: out may be the state itself
    tl.store(out_ptr + pid_b * stride_o_b + h * stride_o_h + offs_p[:, None] * stride_o_p
             + offs_n[None, :] * stride_o_n, s.to(out_ptr.dtype.element_ty), mask=tile)


# ---------------------------------------------------------------------------------------------------------------
# launch configuration


# The form a window of T tokens gets by default: token by token up to 4 tokens, the tensor-core product form from 5
# on (its window tile is 16 rows whatever T is, so its cost hardly moves with T). H200, batch 256, verify alone
# (run 79, ``benchmarks/gpu/verify_config_sweep.py``): token form [64, 128] x 2 warps 736 / 1218 / 2190 us at
# T = 2 / 4 / 8, product form (tf32x3) [64, 128] x 4 warps 1282 / 1314 / 1358 us.
PRODUCTS_FROM_WINDOW = 5


def default_form(window: int) -> bool | str:
    """The verify form a window of ``window`` tokens gets when ``_products`` is not given: ``"tf32x3"`` (matrix
    products on tensor cores, ``kernels/verify_products.py``) from :data:`PRODUCTS_FROM_WINDOW` tokens on, else
    ``False`` (token by token)."""
    return "tf32x3" if window >= PRODUCTS_FROM_WINDOW else False


def verify_launch_config(batch: int, heads: int, head_dim: int, d_state: int, window: int,
                         products: bool | str = False) -> dict:
    """``block_p`` and ``num_warps`` of the verify kernel: an 8192-element state tile ([64, 128] for d_state 128,
    one program per Nemotron-H head), halved while the grid would have fewer than 2048 programs; 2 warps for the
    token form, 4 for the product form. Every program redoes the per-(row, head) work (records and window keys
    against C), so fewer, wider programs win. H200, batch 256, T = 4 (runs 78 / 79,
    ``benchmarks/gpu/verify_config_sweep.py``): token form [64, 128] x 2 warps 1218 us, x 4 1915 us, [32, 128] x 8
    (the earlier default) 3578 us; product form (tf32x3) [64, 128] x 4 1314 us, x 8 1835 us.
    ``kernels/bench_verify.py`` can sweep it through ``_config``."""
    block_n = next_power_of_2(d_state)
    block_p = min(next_power_of_2(head_dim), max(1, 8192 // block_n))
    while block_p > 16 and batch * heads * cdiv(head_dim, block_p) < 2048:
        block_p //= 2
    return dict(block_p=max(16, block_p), num_warps=4) if products else dict(block_p=block_p, num_warps=2)


# ---------------------------------------------------------------------------------------------------------------
# wrappers


def _check_rings(state, ring_x, ring_dt, ring_B, origin=None, count=None):
    batch, heads, head_dim, d_state = state.shape
    ring_size = ring_x.shape[1]
    assert ring_x.shape == (batch, ring_size, heads, head_dim), f"ring_x must be [B, R, H, P], got {ring_x.shape}"
    assert ring_dt.shape == (batch, ring_size, heads), f"ring_dt must be [B, R, H], got {tuple(ring_dt.shape)}"
    assert ring_B.dim() == 4 and ring_B.shape[:2] == (batch, ring_size) and ring_B.shape[3] == d_state, (
        f"ring_B must be [B, R, G, N], got {tuple(ring_B.shape)}")
    assert heads % ring_B.shape[2] == 0, "heads must be a multiple of groups"
    if origin is not None:  # per-row positions (verify, commit); a fold takes one host position for every row
        assert origin.shape == (batch,) and count.shape == (batch,), "origin and count must be [B]"
        assert origin.dtype == torch.int32 and count.dtype == torch.int32, "origin and count must be int32"
    return batch, heads, head_dim, d_state, ring_B.shape[2], ring_size


def _verify(state, ring_x, ring_dt, ring_B, origin, count, x, dt, B, C, A, D=None, z=None, dt_bias=None,
            dt_softplus=False, out=None, _config=None, _products=None):
    batch, heads, head_dim, d_state, groups, ring_size = _check_rings(state, ring_x, ring_dt, ring_B, origin, count)
    window = x.shape[1]
    assert x.shape == (batch, window, heads, head_dim), f"x must be [B, T, H, P], got {tuple(x.shape)}"
    assert dt.shape == (batch, window, heads), f"dt must be [B, T, H], got {tuple(dt.shape)}"
    assert B.shape == (batch, window, groups, d_state) and C.shape == B.shape, (
        f"B and C must be [B, T, G, N], got {tuple(B.shape)} and {tuple(C.shape)}")
    assert A.shape == (heads,), f"A must be [H], got {tuple(A.shape)}"
    assert D is None or D.shape == (heads,), "D must be [H]"
    assert dt_bias is None or dt_bias.shape == (heads,), "dt_bias must be [H]"
    assert z is None or z.shape == x.shape, "z must be [B, T, H, P]"
    assert 1 <= window <= min(ring_size, MAX_WINDOW), f"window {window} must be in [1, min(R={ring_size}, 16)]"
    y = torch.empty_like(x) if out is None else out
    assert y.shape == x.shape
    _products = default_form(window) if _products is None else _products
    cfg = dict(verify_launch_config(batch, heads, head_dim, d_state, window, _products), **(_config or {}))
    assert cfg["block_p"] >= 16 or not _products, f"block_p {cfg['block_p']} < 16: the matrix products need 16"
    floor = 16 if _products else 2  # tl.dot operands are at least 16 on every side
    grid = (cdiv(head_dim, cfg["block_p"]), batch, heads)
    with _device_guard(x):
        LAST_COMPILED["verify"] = _mamba2_verify_kernel[grid](
            state, ring_x, ring_dt, ring_B, origin, count,
            x, dt, B, C, A, _optional(D, A), _optional(z, x), _optional(dt_bias, A), y,
            head_dim, d_state, ring_size, heads // groups,
            *state.stride(), *ring_x.stride(), *ring_dt.stride(), *ring_B.stride(),
            origin.stride(0), count.stride(0),
            *x.stride(), *dt.stride(), *B.stride(), *C.stride(),
            A.stride(0), _strides(D, 1)[0], _strides(dt_bias, 1)[0],
            *_strides(z, 4), *y.stride(),
            window,
            HAS_D=D is not None,
            HAS_Z=z is not None,
            HAS_DT_BIAS=dt_bias is not None,
            DT_SOFTPLUS=bool(dt_softplus),
            WINDOW_AS_PRODUCTS=bool(_products),
            PRECISION=dot_precision(_products),
            BLOCK_P=cfg["block_p"],
            BLOCK_N=max(floor, next_power_of_2(d_state)),
            BLOCK_R=max(floor, next_power_of_2(max(ring_size - window, 1))),  # count <= R - T if rows fit
            # products: one tile for every width; tokens: 8 or 16 (ptxas, sm_90, [32, 128] x 8 warps: a tile of 4 took
            # 172 registers against 128 for 2 or 8, one program per SM fewer: run 74's T = 4 ran 3x slower than T = 2)
            BLOCK_T=MAX_WINDOW if _products else max(8, next_power_of_2(window)),
            num_warps=cfg["num_warps"],
        )
    return y


def fold_launch_config(batch: int, heads: int, head_dim: int, d_state: int) -> dict:
    """``block_p`` and ``num_warps`` of the commit and the ring fold (a standard step per record): the fold tile of
    ``kernels/mamba2.py`` (:func:`fold_tile_config`, measured for this commit; the batch does not change it)."""
    return fold_tile_config(head_dim, d_state)


def _commit(state, ring_x, ring_dt, ring_B, origin, count, accepted, buffer_len, A, _config=None):
    batch, heads, head_dim, d_state, groups, ring_size = _check_rings(state, ring_x, ring_dt, ring_B, origin, count)
    assert accepted.shape == (batch,) and accepted.dtype == torch.int32, "accepted must be [B] int32"
    assert A.shape == (heads,), f"A must be [H], got {tuple(A.shape)}"
    assert 1 <= buffer_len < (1 << _TICKET_SHIFT), "buffer_len out of range"
    cfg = dict(fold_launch_config(batch, heads, head_dim, d_state), **(_config or {}))
    grid = (cdiv(head_dim, cfg["block_p"]), batch, heads)
    assert grid[0] * heads < (1 << (31 - _TICKET_SHIFT)), "too many programs per row for the count ticket"
    with _device_guard(state):
        LAST_COMPILED["commit"] = _mamba2_commit_kernel[grid](
            state, ring_x, ring_dt, ring_B, origin, count, accepted, A,
            head_dim, d_state, ring_size, heads // groups,
            *state.stride(), *ring_x.stride(), *ring_dt.stride(), *ring_B.stride(),
            origin.stride(0), count.stride(0), accepted.stride(0), A.stride(0),
            BUFFER_LEN=buffer_len,
            BLOCK_P=cfg["block_p"],
            BLOCK_N=next_power_of_2(d_state),
            num_warps=cfg["num_warps"],
        )


def _fold(state, ring_x, ring_dt, ring_B, A, origin, count, out=None, _config=None):
    batch, heads, head_dim, d_state, groups, ring_size = _check_rings(state, ring_x, ring_dt, ring_B)
    assert A.shape == (heads,), f"A must be [H], got {tuple(A.shape)}"
    assert 0 <= origin < ring_size and 0 <= count <= ring_size, f"origin {origin} / count {count} outside the ring"
    out = torch.empty_like(state) if out is None else out
    assert out.shape == state.shape, f"out must be {tuple(state.shape)}, got {tuple(out.shape)}"
    cfg = dict(fold_launch_config(batch, heads, head_dim, d_state), **(_config or {}))
    grid = (cdiv(head_dim, cfg["block_p"]), batch, heads)
    with _device_guard(state):
        LAST_COMPILED["fold"] = _mamba2_fold_kernel[grid](
            state, out, ring_x, ring_dt, ring_B, A, int(origin), int(count),
            head_dim, d_state, ring_size, heads // groups,
            *state.stride(), *out.stride(), *ring_x.stride(), *ring_dt.stride(), *ring_B.stride(), A.stride(0),
            BLOCK_P=cfg["block_p"],
            BLOCK_N=next_power_of_2(d_state),
            num_warps=cfg["num_warps"],
        )
    return out


def mamba2_verify(
    state: torch.Tensor,
    ring_x: torch.Tensor,
    ring_dt: torch.Tensor,
    ring_B: torch.Tensor,
    origin: torch.Tensor,
    count: torch.Tensor,
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
    """Verify a window of T <= 16 tokens per row (one launch; no state write, ``count`` unchanged).

    state [B, H, P, N] float32 checkpoint; ring_x [B, R, H, P], ring_dt [B, R, H] float32, ring_B [B, R, G, N];
    origin, count [B] int32; x, z [B, T, H, P]; dt [B, T, H] raw; B, C [B, T, G, N]; A, D, dt_bias [H].
    Requires ``count[b] + T <= R`` (rows that do not fit get NaN outputs and no records). Token t of row b sees the
    checkpoint, the committed records and window tokens 0..t; the window's records (x, post-softplus dt, B) go to
    slots ``(origin[b] + count[b] + t) % R``. Returns y [B, T, H, P] in x's dtype (or ``out``). Same semantics as
    :func:`mamba2_verify_ref`; windows of 5 tokens or more take the tensor-core product form (tf32x3, float32
    accuracy: on the H200 within 3.6e-7 relative of the reference, against 1.5e-7 token by token).
    """
    return _verify(state, ring_x, ring_dt, ring_B, origin, count, x, dt, B, C, A, D, z, dt_bias, dt_softplus, out)


def mamba2_commit(
    state: torch.Tensor,
    ring_x: torch.Tensor,
    ring_dt: torch.Tensor,
    ring_B: torch.Tensor,
    origin: torch.Tensor,
    count: torch.Tensor,
    accepted: torch.Tensor,
    buffer_len: int,
    A: torch.Tensor,
) -> None:
    """Commit ``accepted[b]`` (int32, 0..T) records of the last verified window per row (one launch, phase decided on
    the device): ``count[b] += accepted[b]``; rows whose new count reaches ``buffer_len`` fold all their committed
    records into ``state[b]`` in place (sequential recurrence, bit-identical to stepping) and set ``count[b] = 0``
    (``origin`` unchanged). ``accepted[b]`` must not exceed the last window's T (not checked on the
    device; the reference raises when the new count exceeds R). Same semantics as :func:`mamba2_commit_ref`."""
    _commit(state, ring_x, ring_dt, ring_B, origin, count, accepted, buffer_len, A)


def mamba2_fold_ring(
    state: torch.Tensor,
    ring_x: torch.Tensor,
    ring_dt: torch.Tensor,
    ring_B: torch.Tensor,
    A: torch.Tensor,
    origin: int,
    count: int,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``state`` with the ``count`` records at ring slots ``(origin + j) % R`` (the same slots in every row) folded
    in, in order (one launch): the commit's sequential recurrence, written to ``out`` (a new tensor by default;
    ``state`` itself for an in-place fold). A flush boundary's checkpoint inside a speculative window (staged), or
    the oldest records of a ring a speculative run left over a period. Same semantics as
    :func:`mamba2_fold_ring_ref`."""
    return _fold(state, ring_x, ring_dt, ring_B, A, origin, count, out)
