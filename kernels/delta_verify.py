"""Triton speculative-decoding kernels for gated delta rule layers (Gated DeltaNet with a scalar gate per value head,
Kimi Delta Attention with a gate per key channel): verify a window of T tokens against the float32 checkpoint plus
the ring of committed records, then commit the accepted prefix.

Entry points (each with a torch reference of the same signature, re-exported here from
``hf_replayssm.ops.delta_verify``):

* :func:`delta_verify` / :func:`delta_verify_ref`: outputs of T window tokens per row and their corrected values
  ``d_t = beta_t (v_t - P_t^T k_t)``, each against the state implied by the checkpoint, the ``count[b]`` committed
  records and the window tokens before t (what the one-token replay step computes); appends the T records (raw k,
  d, g) at slots ``(origin + count + t) % R``; writes no state and leaves ``count`` unchanged.
* :func:`delta_commit` / :func:`delta_commit_ref`: ``count += accepted``; rows whose new count reaches
  ``buffer_len`` fold all their committed records into the checkpoint (sequential recurrence) and restart the ring
  at ``origin`` with ``count = 0``. Per-row phase decided on the device.
* :func:`delta_fold_ring` / :func:`delta_fold_ring_ref`: the checkpoint with ``count`` records from ring slot
  ``origin`` (host ints, the same for every row) folded in with their recorded d's, out of place or in place: the
  checkpoint at a flush boundary a speculative window crosses (staged), or a complete period a rollback left. The
  commit's loop.

Shapes and ring layout are those of ``kernels/delta_rule.py`` with a window axis on the tokens: state
[B, Hv, K, V]; ring_k [B, R, Hk, K] raw keys; ring_d [B, R, Hv, V] float32; ring_g [B, R, Hv] or [B, R, Hv, K]
float32; origin, count, accepted [B] int32; q, k [B, T, Hk, K] raw; v [B, T, Hv, V]; beta [B, T, Hv]; g [B, T, Hv]
or [B, T, Hv, K]. A window needs ``count[b] + T <= R`` (so ``R >= buffer_len - 1 + T``); the host asserts
``T <= R`` and the kernel returns NaN outputs for a row that does not fit (and appends nothing for it).

Design notes:

* Verify grid ``(cdiv(V, BLOCK_V), B, Hv)`` like the replay step: d and o of a value column depend only on that
  column of the checkpoint and of the recorded d's, so each V tile runs the window on its own. The program reads its
  checkpoint tile once and the committed records (``BLOCK_R = next_pow2(R - T)`` at most, masked by ``j < count``).
  For token t, with decayed keys ``kw_j`` (record or earlier window token j, decayed to t):
  ``P_t^T u = S0^T (exp(c_t) * u) + sum_j (kw_j . u) d_j`` for u in {q_t, k_t}; ``d_t = beta_t (v_t - P_t^T k_t)``;
  ``o_t = P_t^T q_t + (k_t . q_t) d_t``. Three forms, chosen by the constexprs ``WINDOW_AS_PRODUCTS`` and
  ``WINDOW_AS_STEPS`` (``_verify(..., _products=..., _steps=...)``; by default token by token up to 2-token windows
  and as steps from 3, :func:`default_form`):
  - token by token: unrolled over ``BLOCK_T = next_pow2(T)`` with the width T a runtime guard, so one
    compile serves every T of a tile (a constexpr T cost a JIT compile at every new draft count of a speculative
    run: 0.9-9 s per width on a fresh H200; against the loop unrolled over exactly T, same bits: GDN 1.03-1.07x the
    time, KDA 0.99x, run 68). The decays are carried along the window: at token t the checkpoint decay and every
    decayed key are multiplied by ``exp(g_t)`` (the recurrence's own order of operations), starting from the
    records' decays to the end of the committed ring, which are direct sums (reverse cumulative sums over the records
    after j, as in the replay step). Cost per token: two passes over the state tile plus O((count + T)(K + V)), the
    latter redone by every V tile, hence wide tiles (:func:`verify_launch_config`). H200, batch 256, verify + commit
    against per-draft snapshots, both accept modes (run 80): GDN 2.60-2.71x / 2.41-2.55x / 2.28-2.44x at T = 2 / 4 /
    8, KDA 2.24-2.33x / 2.14-2.25x / 1.73-1.81x (run 74 on [128, 32] tiles: GDN 1.89 / 2.01 / 1.70x, KDA 1.29 / 1.15
    / 1.09x; target at T = 4: 3x);
  - as matrix products: everything but the d's is known before the first d, so the checkpoint and record terms of
    every token are products (``[T, K] x [K, BLOCK_V]`` against the state tile, ``[T, K] x [K, R]`` then
    ``[T, R] x [R, BLOCK_V]`` against the records), and so are the window's own key products
    ``a_kk[t, s] = kw_s . k_t`` (s < t) and ``a_qk`` (s <= t) for a scalar gate (a per-key gate's window keys are
    decayed token by token: no differences of cumulative sums); the d's come from ``(I + X)^-1 = (I - X)(I + X^2)
    (I + X^4)(I + X^8)`` and ``o = P^T q + a_qk d`` is one more product. ``BLOCK_T = 16`` (one compile for every
    width). Slower than the token form on the H200 in both precisions: IEEE float32 (``_products=True``) GDN 0.34-1.28x
    and KDA 0.13-0.24x the snapshots' speed at T = 2-8 (run 77), tf32x3 slower still (run 78; 236-1036 B spilled per
    thread at sm_90).
  - as steps (``_steps=True``): the committed records folded into the checkpoint tile in registers by one
    ``[K, R] x [R, BLOCK_V]`` product (tf32x3, as the replay step's flush), then each window token one step of the
    recurrence on that tile (decay, ``d = beta (v - S^T k)``, ``S += k d^T``, ``o = S^T q``), never written back.
    Two reductions over K per token where the token form has eleven that cross warps; on one warp
    (:func:`verify_launch_config`) none crosses warps. Outputs agree with the token form to float32 rounding. H200,
    batch 256, verify alone (runs 84 / 85): GDN T = 4 509 us on [128, 32] x 1 against 926 for the token form's earlier
    default, KDA 705 against 1057; ptxas for sm_90 (Triton 3.6): 255 registers and 0-80 B spilled on [128, 32] x 1.
* Records are appended by the programs that own them (d by every V tile, g by V tile 0, the raw key by V tile 0 of
  the first value head of each key group).
* Commit grid ``(cdiv(V, BLOCK_V), B, Hv)``: flushing programs fold the records (per-key gates: one at a time in order,
  ``S = diag(exp(g_j)) S; S += k_j d_j^T``, the standard step's expressions given d, so folding is split-invariant:
  flushing after more than ``buffer_len`` records (a window can overshoot) gives the bits of two flushes; scalar
  gates: as one product by default, see below). Note that
  the one-token replay step's flush (``kernels/delta_rule.py``) sums the records in unrolled form instead, so the
  checkpoints of the two paths agree to float32 rounding, not bitwise. The product fold (``_fold_dot=True``, in
  ``_commit`` and ``_fold``) loads every record at once and sums them as one tf32x3 ``[K, R] x [R, BLOCK_V]``
  product, as the steps form of verify does, where the record-by-record loop waits one memory round trip per
  record; float32 rounding apart from the loop and split-invariant to rounding only. :func:`default_fold_dot`: the
  product for scalar gates (GDN), the loop for per-key gates (KDA). Compile-only, sm_90, [128, 64] x 4 warps: GDN
  217 registers against 124, KDA 249 against 127, no spills.
* Count update as in ``kernels/mamba2_verify.py`` (read, barrier, ticket, last ticket writes).
* All math is fp32 on CUDA cores (the products form's ``tl.dot`` in IEEE float32, not TF32, unless ``_products`` names
  ``"tf32x3"``: see ``kernels/verify_products.py``); bf16/fp16
  inputs are upcast right after loading. K is at most 256 (one K tile per program). Launch configurations:
  :func:`verify_launch_config` for verify, :func:`fold_launch_config` for commit and the ring fold; both can be
  overridden through the private ``_block_v`` / ``_num_warps`` arguments of ``_verify`` / ``_commit``
  (``kernels/bench_verify.py`` times them).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hf_replayssm.kernels.delta_rule import KDA_WEIGHTS_WARPS
from hf_replayssm.kernels.host_math import cdiv, next_power_of_2
from hf_replayssm.kernels.verify_products import dot_precision
from hf_replayssm.ops.delta_verify import delta_commit_ref, delta_fold_ring_ref, delta_verify_ref

if __package__:
    from . import delta_rule as _delta_rule
    from .delta_rule import (
        MAX_KEY_DIM,
        _device_guard,
        _load_record_keys,
        _load_record_values,
        _load_token,
        _newest_first_decays,
        _newest_first_positions,
        _record_decays,
        _ring_gate_strides,
        _token_update,
        state_update_launch_config,
    )
else:  # loaded from its file outside the package (a checkout without the package installed)
    import importlib.util
    import sys
    from pathlib import Path

    if "_replayssm_kernels_delta_rule" not in sys.modules:  # the name tests/kernel_harness.py gives it
        _spec = importlib.util.spec_from_file_location("_replayssm_kernels_delta_rule",
                                                       Path(__file__).with_name("delta_rule.py"))
        sys.modules[_spec.name] = importlib.util.module_from_spec(_spec)
        _spec.loader.exec_module(sys.modules[_spec.name])
    _m = sys.modules["_replayssm_kernels_delta_rule"]
    MAX_KEY_DIM, _device_guard, _load_token = _m.MAX_KEY_DIM, _m._device_guard, _m._load_token
    _ring_gate_strides, _token_update = _m._ring_gate_strides, _m._token_update
    _load_record_keys, _load_record_values, _record_decays = (_m._load_record_keys, _m._load_record_values,
                                                              _m._record_decays)
    state_update_launch_config = _m.state_update_launch_config
    _newest_first_decays, _newest_first_positions = _m._newest_first_decays, _m._newest_first_positions
    _delta_rule = _m

__all__ = [
    "default_fold_dot",
    "delta_commit",
    "delta_commit_ref",
    "delta_fold_ring",
    "delta_fold_ring_ref",
    "delta_verify",
    "delta_verify_ref",
    "verify_launch_config",
]

_TICKET_SHIFT = 16
MAX_WINDOW = 16  # the window tiles are [BLOCK_T, ...] registers
LAST_COMPILED: dict = {}


@triton.jit
def _store_token(o, d_t, g_t, k_raw, t, fits, o_row, rk_base, rd_base, rg_base, end, ring_size, pid_v, pid_h, kv_ratio,
                 K: tl.constexpr, offs_k, offs_v, mask_v, append_v, stride_o_t, stride_o_v, stride_rk_r, stride_rk_k,
                 stride_rd_r, stride_rd_v, stride_rg_r, stride_rg_k, GATE_PER_KEY: tl.constexpr):
    """Window token t's output (NaN for a row that does not fit) and its record at logical position ``end + t``
    (``end`` = origin + count; rows that fit only): d by every V tile, g by V tile 0, the raw key by V tile 0 of the
    first value head of each key group."""
    o = tl.where(fits, o, float("nan"))
    tl.store(o_row + t * stride_o_t + offs_v * stride_o_v, o.to(o_row.dtype.element_ty), mask=mask_v)
    slot = (end + t) % ring_size
    tl.store(rd_base + slot * stride_rd_r + offs_v * stride_rd_v, d_t.to(rd_base.dtype.element_ty), mask=append_v)
    if pid_v == 0:
        if GATE_PER_KEY:
            tl.store(rg_base + slot * stride_rg_r + offs_k * stride_rg_k, g_t.to(rg_base.dtype.element_ty),
                     mask=offs_k < tl.where(fits, K, 0))
        else:
            tl.store(rg_base + slot * stride_rg_r, g_t.to(rg_base.dtype.element_ty), mask=fits)
        if pid_h % kv_ratio == 0:
            tl.store(rk_base + slot * stride_rk_r + offs_k * stride_rk_k, k_raw.to(rk_base.dtype.element_ty),
                     mask=offs_k < tl.where(fits, K, 0))


@triton.jit
def _committed_values(rd_base, origin, count, ring_size, offs_r, offs_v, mask_v, stride_rd_r, stride_rd_v):
    """The committed records' d's [R, BLOCK_V] in logical order (rows past ``count``: 0)."""
    return _load_record_values(rd_base, (origin + offs_r) % ring_size, offs_r < count, offs_v, mask_v, stride_rd_r,
                               stride_rd_v)


@triton.jit
def _committed_records(rk_base, rd_base, rg_base, origin, count, ring_size, offs_r, offs_k, mask_k, offs_v, mask_v,
                       stride_rk_r, stride_rk_k, stride_rd_r, stride_rd_v, stride_rg_r, stride_rg_k, K: tl.constexpr,
                       GATE_PER_KEY: tl.constexpr, USE_QK_L2NORM: tl.constexpr):
    """The ``count`` committed records from ring slot ``origin`` on, in logical order (rows ``offs_r``; the rest
    masked to 0): normalised keys k_r [R, K], d_r [R, BLOCK_V], the decay from the checkpoint to the end of the
    records (``decay``, [K] for a per-key gate, a scalar otherwise: exp of every record's gate), and each record's
    decay to that end (direct sums of the later gates): the decayed keys [R, K] for a per-key gate, the weights [R]
    for a scalar one. The state after the records is ``decay * S0 + sum_j (decayed k_j) d_j^T``. (Loads in this
    order: ptxas for sm_90 spills less in the verify kernel than with the d's loaded after the decays.)"""
    valid = offs_r < count
    k_r = _load_record_keys(rk_base, (origin + offs_r) % ring_size, valid, offs_k, mask_k, stride_rk_r, stride_rk_k,
                            USE_QK_L2NORM)
    d_r = _committed_values(rd_base, origin, count, ring_size, offs_r, offs_v, mask_v, stride_rd_r, stride_rd_v)
    decay, weights = _record_decays(k_r, rg_base, origin, count, ring_size, offs_r, offs_k, valid, 0.0, stride_rg_r,
                                    stride_rg_k, K, GATE_PER_KEY)
    return k_r, d_r, decay, weights


@triton.jit
def _verify_record_weights_kernel(
    ring_k_ptr, ring_g_ptr, origin_ptr, count_ptr, weights_ptr,
    K: tl.constexpr, ring_size, kv_ratio,
    stride_rk_b, stride_rk_r: tl.constexpr, stride_rk_h: tl.constexpr, stride_rk_k: tl.constexpr,
    stride_rg_b, stride_rg_r: tl.constexpr, stride_rg_h: tl.constexpr, stride_rg_k: tl.constexpr,
    stride_origin, stride_count,
    USE_QK_L2NORM: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_R: tl.constexpr,
    NEWEST_FIRST: tl.constexpr = False,  # the records read newest first (delta_rule._newest_first_decays)
):
    """Per-key gates, once per (row, value head): what :func:`_committed_records` computes in every V tile of the
    verify kernel apart from the d's, the decay from the checkpoint to the end of the records [BLOCK_K] and the
    decayed record keys [BLOCK_R, BLOCK_K] (0 past ``count``; in logical order either way), into ``weights``
    [B, Hv, BLOCK_K + BLOCK_R * BLOCK_K]. Grid (B, Hv); positions as the verify kernel reads them."""
    pid_b = tl.program_id(0).to(tl.int64)
    pid_h = tl.program_id(1)
    hk = pid_h // kv_ratio
    offs_k = tl.arange(0, BLOCK_K)
    offs_r = tl.arange(0, BLOCK_R)
    mask_k = offs_k < K
    origin = tl.load(origin_ptr + pid_b * stride_origin)
    count = tl.load(count_ptr + pid_b * stride_count)
    rk_base = ring_k_ptr + pid_b * stride_rk_b + hk * stride_rk_h
    rg_base = ring_g_ptr + pid_b * stride_rg_b + pid_h * stride_rg_h
    if NEWEST_FIRST:
        decay, kw_r = _newest_first_decays(rk_base, rg_base, origin, count, ring_size, offs_r, offs_k, mask_k, 0.0,
                                           stride_rk_r, stride_rk_k, stride_rg_r, stride_rg_k, K, USE_QK_L2NORM)
        rows = _newest_first_positions(offs_r, count)
    else:
        valid = offs_r < count
        k_r = _load_record_keys(rk_base, (origin + offs_r) % ring_size, valid, offs_k, mask_k, stride_rk_r,
                                stride_rk_k, USE_QK_L2NORM)
        decay, kw_r = _record_decays(k_r, rg_base, origin, count, ring_size, offs_r, offs_k, valid, 0.0, stride_rg_r,
                                     stride_rg_k, K, True)
        rows = offs_r
    w_base = weights_ptr + (pid_b * tl.num_programs(1) + pid_h) * (BLOCK_K + BLOCK_R * BLOCK_K)
    tl.store(w_base + offs_k, decay)
    tl.store(w_base + BLOCK_K + rows[:, None] * BLOCK_K + offs_k[None, :], kw_r)


# One compile per BLOCK_T, not per window width: the width and the batch strides of the window tensors (T times a
# row's size, so 16-divisible for some widths and not others) are not specialised on.
@triton.jit(do_not_specialize=["window", "stride_q_b", "stride_k_b", "stride_v_b", "stride_beta_b", "stride_g_b",
                               "stride_o_b"])
def _delta_verify_kernel(
    state_ptr, ring_k_ptr, ring_d_ptr, ring_g_ptr, origin_ptr, count_ptr,
    q_ptr, k_ptr, v_ptr, beta_ptr, g_ptr, o_ptr, weights_ptr,
    K: tl.constexpr, V: tl.constexpr, ring_size, kv_ratio, scale,
    # strides (all but the batch strides are compile-time constants, as in the replay step)
    stride_s_b, stride_s_h: tl.constexpr, stride_s_k: tl.constexpr, stride_s_v: tl.constexpr,
    stride_rk_b, stride_rk_r: tl.constexpr, stride_rk_h: tl.constexpr, stride_rk_k: tl.constexpr,
    stride_rd_b, stride_rd_r: tl.constexpr, stride_rd_h: tl.constexpr, stride_rd_v: tl.constexpr,
    stride_rg_b, stride_rg_r: tl.constexpr, stride_rg_h: tl.constexpr, stride_rg_k: tl.constexpr,
    stride_origin, stride_count,
    stride_q_b, stride_q_t: tl.constexpr, stride_q_h: tl.constexpr, stride_q_k: tl.constexpr,
    stride_k_b, stride_k_t: tl.constexpr, stride_k_h: tl.constexpr, stride_k_k: tl.constexpr,
    stride_v_b, stride_v_t: tl.constexpr, stride_v_h: tl.constexpr, stride_v_v: tl.constexpr,
    stride_beta_b, stride_beta_t: tl.constexpr, stride_beta_h: tl.constexpr,
    stride_g_b, stride_g_t: tl.constexpr, stride_g_h: tl.constexpr, stride_g_k: tl.constexpr,
    stride_o_b, stride_o_t: tl.constexpr, stride_o_h: tl.constexpr, stride_o_v: tl.constexpr,
    window,  # T, a runtime guard on the loop unrolled over BLOCK_T = next_pow2(T)
    GATE_PER_KEY: tl.constexpr,
    USE_QK_L2NORM: tl.constexpr,
    WINDOW_AS_PRODUCTS: tl.constexpr,
    WINDOW_AS_STEPS: tl.constexpr,
    WEIGHTS_GIVEN: tl.constexpr,  # per-key gates: decay and decayed record keys from _verify_record_weights_kernel
    PRECISION: tl.constexpr,  # tl.dot input precision of the products ("ieee" or "tf32x3") or the steps form's fold
    BLOCK_K: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_T: tl.constexpr,
    CHUNK_K: tl.constexpr,
):
    pid_v = tl.program_id(0)
    pid_b = tl.program_id(1).to(tl.int64)
    pid_h = tl.program_id(2)
    hk = pid_h // kv_ratio

    offs_k = tl.arange(0, BLOCK_K)
    offs_v = pid_v * BLOCK_V + tl.arange(0, BLOCK_V)
    offs_t = tl.arange(0, BLOCK_T)
    mask_k = offs_k < K
    mask_v = offs_v < V

    origin = tl.load(origin_ptr + pid_b * stride_origin)
    count = tl.load(count_ptr + pid_b * stride_count)
    s0 = tl.load(state_ptr + pid_b * stride_s_b + pid_h * stride_s_h + offs_k[:, None] * stride_s_k
                 + offs_v[None, :] * stride_s_v, mask=mask_k[:, None] & mask_v[None, :], other=0.0).to(tl.float32)
    fits = count + window <= ring_size  # else: NaN outputs, nothing appended (see the module docstring)

    # Committed records in logical order, and their decays to the end of the ring (direct sums of later gates).
    offs_r = tl.arange(0, BLOCK_R)
    rk_base = ring_k_ptr + pid_b * stride_rk_b + hk * stride_rk_h
    rd_base = ring_d_ptr + pid_b * stride_rd_b + pid_h * stride_rd_h
    rg_base = ring_g_ptr + pid_b * stride_rg_b + pid_h * stride_rg_h
    if WEIGHTS_GIVEN:  # the head's decay and decayed keys, computed once by the pre-launch; the d's of this tile
        w_base = weights_ptr + (pid_b * tl.num_programs(2) + pid_h) * (BLOCK_K + BLOCK_R * BLOCK_K)
        decay = tl.load(w_base + offs_k)
        weights = tl.load(w_base + BLOCK_K + offs_r[:, None] * BLOCK_K + offs_k[None, :])
        d_r = _committed_values(rd_base, origin, count, ring_size, offs_r, offs_v, mask_v, stride_rd_r, stride_rd_v)
    else:
        k_r, d_r, decay, weights = _committed_records(rk_base, rd_base, rg_base, origin, count, ring_size, offs_r,
                                                      offs_k, mask_k, offs_v, mask_v, stride_rk_r, stride_rk_k,
                                                      stride_rd_r, stride_rd_v, stride_rg_r, stride_rg_k, K,
                                                      GATE_PER_KEY, USE_QK_L2NORM)
    if GATE_PER_KEY:
        kw_r = weights  # [R, K]: record keys decayed to the ring end
    else:
        w_r = weights  # [R]: record weights (scalar gate: kept apart from the keys)

    if WINDOW_AS_PRODUCTS:
        # The window's tokens, all at once: raw keys (appended as they are), q and k normalised (q scaled), v, beta, g.
        mask_t = offs_t < window
        tk = mask_t[:, None] & mask_k[None, :]
        k_w_raw = tl.load(k_ptr + pid_b * stride_k_b + offs_t[:, None] * stride_k_t + hk * stride_k_h
                          + offs_k[None, :] * stride_k_k, mask=tk, other=0.0)
        k_w = k_w_raw.to(tl.float32)
        q_w = tl.load(q_ptr + pid_b * stride_q_b + offs_t[:, None] * stride_q_t + hk * stride_q_h
                      + offs_k[None, :] * stride_q_k, mask=tk, other=0.0).to(tl.float32)
        if USE_QK_L2NORM:  # per-row factors (the K-chunked products below reload rows and scale them alike)
            k_norm = tl.rsqrt(tl.sum(k_w * k_w, axis=1) + 1e-6)
            q_norm = tl.rsqrt(tl.sum(q_w * q_w, axis=1) + 1e-6)
        else:
            k_norm = tl.full([BLOCK_T], 1.0, tl.float32)
            q_norm = tl.full([BLOCK_T], 1.0, tl.float32)
        k_w = k_w * k_norm[:, None]
        q_w = q_w * q_norm[:, None] * scale
        v_w = tl.load(v_ptr + pid_b * stride_v_b + offs_t[:, None] * stride_v_t + pid_h * stride_v_h
                      + offs_v[None, :] * stride_v_v, mask=mask_t[:, None] & mask_v[None, :], other=0.0).to(tl.float32)
        beta_w = tl.load(beta_ptr + pid_b * stride_beta_b + offs_t * stride_beta_t + pid_h * stride_beta_h,
                         mask=mask_t, other=0.0).to(tl.float32)
        earlier = offs_t[None, :] < offs_t[:, None]  # [t, s]: s before t
        # P_t^T u for u in {k_t, q_t} from the checkpoint and the records, every token at once (IEEE float32 products),
        # and the window's own terms: a_kk[t, s] = (k_s decayed to t) . k_t for s < t, a_qk the same with q_t (s <= t).
        if GATE_PER_KEY:
            g_w = tl.load(g_ptr + pid_b * stride_g_b + offs_t[:, None] * stride_g_t + pid_h * stride_g_h
                          + offs_k[None, :] * stride_g_k, mask=tk, other=0.0).to(tl.float32)
            e_w = tl.exp(tl.cumsum(g_w, axis=0))  # [T, K]: decay from the ring end to token t
            pk = tl.dot(k_w * (decay[None, :] * e_w), s0, input_precision=PRECISION)
            pq = tl.dot(q_w * (decay[None, :] * e_w), s0, input_precision=PRECISION)
            pk += tl.dot(tl.dot(k_w * e_w, tl.trans(kw_r), input_precision=PRECISION), d_r, input_precision=PRECISION)
            pq += tl.dot(tl.dot(q_w * e_w, tl.trans(kw_r), input_precision=PRECISION), d_r, input_precision=PRECISION)
            # the window's keys decayed token by token (per-channel decays: no differences of cumulative sums)
            kw_w = tl.zeros([BLOCK_T, BLOCK_K], dtype=tl.float32)
            a_kk = tl.zeros([BLOCK_T, BLOCK_T], dtype=tl.float32)
            a_qk = tl.zeros([BLOCK_T, BLOCK_T], dtype=tl.float32)
            for t in tl.static_range(BLOCK_T):
                if t < window:
                    is_t = offs_t == t
                    kw_w = kw_w * tl.exp(tl.sum(tl.where(is_t[:, None], g_w, 0.0), axis=0))[None, :]
                    k_t = tl.sum(tl.where(is_t[:, None], k_w, 0.0), axis=0)
                    q_t = tl.sum(tl.where(is_t[:, None], q_w, 0.0), axis=0)
                    kw_w = tl.where(is_t[:, None], k_t[None, :], kw_w)  # token t itself, for a_qk's diagonal
                    a_kk = tl.where(is_t[:, None], tl.sum(kw_w * k_t[None, :], axis=1)[None, :], a_kk)
                    a_qk = tl.where(is_t[:, None], tl.sum(kw_w * q_t[None, :], axis=1)[None, :], a_qk)
            a_kk = tl.where(earlier, a_kk, 0.0)
        else:
            g_w = tl.load(g_ptr + pid_b * stride_g_b + offs_t * stride_g_t + pid_h * stride_g_h,
                          mask=mask_t, other=0.0).to(tl.float32)
            e_w = tl.exp(tl.sum(tl.where(offs_t[None, :] <= offs_t[:, None], g_w[None, :], 0.0), axis=1))  # [T]
            pk = (decay * e_w)[:, None] * tl.dot(k_w, s0, input_precision=PRECISION)
            pq = (decay * e_w)[:, None] * tl.dot(q_w, s0, input_precision=PRECISION)
            wr = w_r[None, :] * e_w[:, None]  # [T, R]: record j decayed to token t
            pk += tl.dot(wr * tl.dot(k_w, tl.trans(k_r), input_precision=PRECISION), d_r, input_precision=PRECISION)
            pq += tl.dot(wr * tl.dot(q_w, tl.trans(k_r), input_precision=PRECISION), d_r, input_precision=PRECISION)
            # [t, s]: gates of the window tokens s < i <= t, summed directly
            between = (offs_t[None, None, :] > offs_t[None, :, None]) & (offs_t[None, None, :] <= offs_t[:, None, None])
            ww = tl.where(offs_t[None, :] <= offs_t[:, None],
                          tl.exp(tl.sum(tl.where(between, g_w[None, None, :], 0.0), axis=2)), 0.0)
            # k_s . k_t and q_t . k_s over chunks of K reloaded from memory: a [T, K] x [K, T] product of the
            # register tiles above holds k_w in a second operand layout and spilled (ptxas for sm_90)
            kk = tl.zeros([BLOCK_T, BLOCK_T], dtype=tl.float32)
            qk = tl.zeros([BLOCK_T, BLOCK_T], dtype=tl.float32)
            for c in tl.static_range(BLOCK_K // CHUNK_K):
                offs_c = c * CHUNK_K + tl.arange(0, CHUNK_K)
                tc = mask_t[:, None] & (offs_c[None, :] < K)
                k_c = tl.load(k_ptr + pid_b * stride_k_b + offs_t[:, None] * stride_k_t + hk * stride_k_h
                              + offs_c[None, :] * stride_k_k, mask=tc, other=0.0).to(tl.float32)
                q_c = tl.load(q_ptr + pid_b * stride_q_b + offs_t[:, None] * stride_q_t + hk * stride_q_h
                              + offs_c[None, :] * stride_q_k, mask=tc, other=0.0).to(tl.float32)
                k_c = k_c * k_norm[:, None]
                q_c = q_c * q_norm[:, None] * scale
                kk += tl.dot(k_c, tl.trans(k_c), input_precision=PRECISION)
                qk += tl.dot(q_c, tl.trans(k_c), input_precision=PRECISION)
            a_kk = tl.where(earlier, ww * kk, 0.0)
            a_qk = ww * qk

        # The corrected values d_t = beta_t (v_t - P_t^T k_t - sum_{s<t} a_kk[t, s] d_s) solve the unit lower
        # triangular system (I + X) d = beta (v - P^T k) with X = diag(beta) a_kk strictly lower, so X^16 = 0 and
        # (I + X)^-1 = (I - X)(I + X^2)(I + X^4)(I + X^8): seven [16, 16] products instead of a token loop.
        x = beta_w[:, None] * a_kk
        eye = tl.where(offs_t[:, None] == offs_t[None, :], 1.0, 0.0)
        x2 = tl.dot(x, x, input_precision=PRECISION)
        x4 = tl.dot(x2, x2, input_precision=PRECISION)
        inv = tl.dot(eye - x, eye + x2, input_precision=PRECISION)
        inv = tl.dot(inv, eye + x4, input_precision=PRECISION)
        inv = tl.dot(inv, eye + tl.dot(x4, x4, input_precision=PRECISION), input_precision=PRECISION)
        d_w = tl.dot(inv, beta_w[:, None] * (v_w - pk), input_precision=PRECISION)
        o = pq + tl.dot(a_qk, d_w, input_precision=PRECISION)  # o_t = P_t^T q_t + sum_{s<=t} a_qk[t, s] d_s
        o = tl.where(fits, o, float("nan"))
        tl.store(o_ptr + pid_b * stride_o_b + offs_t[:, None] * stride_o_t + pid_h * stride_o_h
                 + offs_v[None, :] * stride_o_v, o.to(o_ptr.dtype.element_ty), mask=mask_t[:, None] & mask_v[None, :])

        # The window's records at logical positions count + t (rows that fit only).
        slots_w = (origin + count + offs_t) % ring_size
        append = offs_t < tl.where(fits, window, 0)
        tl.store(rd_base + slots_w[:, None] * stride_rd_r + offs_v[None, :] * stride_rd_v,
                 d_w.to(ring_d_ptr.dtype.element_ty), mask=append[:, None] & mask_v[None, :])
        if pid_v == 0:
            if GATE_PER_KEY:
                tl.store(rg_base + slots_w[:, None] * stride_rg_r + offs_k[None, :] * stride_rg_k,
                         g_w.to(ring_g_ptr.dtype.element_ty), mask=append[:, None] & mask_k[None, :])
            else:
                tl.store(rg_base + slots_w * stride_rg_r, g_w.to(ring_g_ptr.dtype.element_ty), mask=append)
            if pid_h % kv_ratio == 0:
                tl.store(rk_base + slots_w[:, None] * stride_rk_r + offs_k[None, :] * stride_rk_k,
                         k_w_raw.to(ring_k_ptr.dtype.element_ty), mask=append[:, None] & mask_k[None, :])
    else:
        # Token by token, or as steps (``WINDOW_AS_STEPS``): the committed records folded into the checkpoint tile in
        # registers (one [K, R] x [R, BLOCK_V] product, the replay step's flush), then the window stepped through the
        # recurrence on that tile, which is never written back: per token two reductions over K (S^T k before its
        # update, S^T q after) where the token form needs eleven across warps (its checkpoint, record and window
        # terms apart, each against k and q).
        if WINDOW_AS_STEPS:
            if GATE_PER_KEY:
                s = s0 * decay[:, None] + tl.dot(tl.trans(kw_r), d_r, input_precision=PRECISION)
            else:
                s = s0 * decay + tl.dot(tl.trans(k_r * w_r[:, None]), d_r, input_precision=PRECISION)
        else:
            if GATE_PER_KEY:
                kw_w = tl.zeros([BLOCK_T, BLOCK_K], dtype=tl.float32)  # earlier window keys, decayed to the token
            else:
                k_w = tl.zeros([BLOCK_T, BLOCK_K], dtype=tl.float32)  # earlier window keys
                w_w = tl.zeros([BLOCK_T], dtype=tl.float32)  # and their decays to the current token
            d_w = tl.zeros([BLOCK_T, BLOCK_V], dtype=tl.float32)  # earlier window d's
        append_v = mask_v & (offs_v < tl.where(fits, V, 0))
        for t in tl.static_range(BLOCK_T):  # unrolled over the tile; the window's width is a runtime guard
            if t < window:
                k_raw, q_t, k_t, v_t, beta_t, g_t = _load_token(
                    q_ptr + t * stride_q_t, k_ptr + t * stride_k_t, v_ptr + t * stride_v_t,
                    beta_ptr + t * stride_beta_t, g_ptr + t * stride_g_t, pid_b, pid_h, hk, offs_k, mask_k, offs_v,
                    mask_v, scale, stride_q_b, stride_q_h, stride_q_k, stride_k_b, stride_k_h, stride_k_k,
                    stride_v_b, stride_v_h, stride_v_v, stride_beta_b, stride_beta_h, stride_g_b, stride_g_h,
                    stride_g_k, GATE_PER_KEY, USE_QK_L2NORM)
                if WINDOW_AS_STEPS:
                    s, d_t = _token_update(s, k_t, v_t, beta_t, g_t, GATE_PER_KEY)
                    o = tl.sum(s * q_t[:, None], axis=0)
                else:  # two passes over the checkpoint tile per token
                    a_t = tl.exp(g_t)
                    if GATE_PER_KEY:
                        decay = decay * a_t
                        kw_r = kw_r * a_t[None, :]
                        kw_w = kw_w * a_t[None, :]
                        pk = tl.sum(s0 * (decay * k_t)[:, None], axis=0)
                        pq = tl.sum(s0 * (decay * q_t)[:, None], axis=0)
                        wk_r = tl.sum(kw_r * k_t[None, :], axis=1)
                        wq_r = tl.sum(kw_r * q_t[None, :], axis=1)
                        wk_w = tl.sum(kw_w * k_t[None, :], axis=1)
                        wq_w = tl.sum(kw_w * q_t[None, :], axis=1)
                    else:
                        decay = decay * a_t
                        w_r = w_r * a_t
                        w_w = w_w * a_t
                        pk = decay * tl.sum(s0 * k_t[:, None], axis=0)
                        pq = decay * tl.sum(s0 * q_t[:, None], axis=0)
                        wk_r = w_r * tl.sum(k_r * k_t[None, :], axis=1)
                        wq_r = w_r * tl.sum(k_r * q_t[None, :], axis=1)
                        wk_w = w_w * tl.sum(k_w * k_t[None, :], axis=1)
                        wq_w = w_w * tl.sum(k_w * q_t[None, :], axis=1)
                    pk += tl.sum(wk_r[:, None] * d_r, axis=0) + tl.sum(wk_w[:, None] * d_w, axis=0)
                    pq += tl.sum(wq_r[:, None] * d_r, axis=0) + tl.sum(wq_w[:, None] * d_w, axis=0)
                    d_t = beta_t * (v_t - pk)
                    o = pq + tl.sum(k_t * q_t, axis=0) * d_t
                    # This token becomes an earlier window token for the next ones.
                    row = offs_t[:, None] == t
                    d_w = tl.where(row, d_t[None, :], d_w)
                    if GATE_PER_KEY:
                        kw_w = tl.where(row, k_t[None, :], kw_w)
                    else:
                        k_w = tl.where(row, k_t[None, :], k_w)
                        w_w = tl.where(offs_t == t, 1.0, w_w)
                _store_token(o, d_t, g_t, k_raw, t, fits, o_ptr + pid_b * stride_o_b + pid_h * stride_o_h,
                             rk_base, rd_base, rg_base, origin + count, ring_size, pid_v, pid_h, kv_ratio, K, offs_k,
                             offs_v, mask_v, append_v, stride_o_t, stride_o_v, stride_rk_r, stride_rk_k, stride_rd_r,
                             stride_rd_v, stride_rg_r, stride_rg_k, GATE_PER_KEY)


@triton.jit
def _fold_ring(s, rk_base, rd_base, rg_base, origin, count, ring_size, offs_k, mask_k, offs_v, mask_v,
               stride_rk_r, stride_rk_k, stride_rd_r, stride_rd_v, stride_rg_r, stride_rg_k,
               GATE_PER_KEY: tl.constexpr, USE_QK_L2NORM: tl.constexpr):
    """The state tile s [BLOCK_K, BLOCK_V] with the ``count`` records from ring slot ``origin`` on folded in, in
    order, with the standard step's expressions given d (split-invariant: two folds give the bits of one)."""
    for j in range(0, count):
        slot = (origin + j) % ring_size
        k_j = tl.load(rk_base + slot * stride_rk_r + offs_k * stride_rk_k, mask=mask_k, other=0.0).to(tl.float32)
        d_j = tl.load(rd_base + slot * stride_rd_r + offs_v * stride_rd_v, mask=mask_v, other=0.0).to(tl.float32)
        if USE_QK_L2NORM:
            k_j = k_j * tl.rsqrt(tl.sum(k_j * k_j, axis=0) + 1e-6)
        if GATE_PER_KEY:
            g_j = tl.load(rg_base + slot * stride_rg_r + offs_k * stride_rg_k, mask=mask_k, other=0.0)
            s = s * tl.exp(g_j.to(tl.float32))[:, None]
        else:
            s = s * tl.exp(tl.load(rg_base + slot * stride_rg_r).to(tl.float32))
        s += k_j[:, None] * d_j[None, :]
    return s


@triton.jit
def _fold_records(s, rk_base, rd_base, rg_base, origin, count, ring_size, offs_k, mask_k, offs_v, mask_v,
                  stride_rk_r, stride_rk_k, stride_rd_r, stride_rd_v, stride_rg_r, stride_rg_k, K: tl.constexpr,
                  GATE_PER_KEY: tl.constexpr, USE_QK_L2NORM: tl.constexpr, FOLD_DOT: tl.constexpr,
                  BLOCK_R: tl.constexpr, PRECISION: tl.constexpr):
    """The commit's and the ring fold's fold: :func:`_fold_ring` (record by record), or with ``FOLD_DOT`` every record
    loaded at once (one memory round trip, not ``count`` dependent ones) and summed as one [K, R] x [R, BLOCK_V]
    product (``PRECISION``, e.g. tf32x3), as the steps form of verify folds them; needs ``count <= BLOCK_R``. The
    product agrees with the loop to float32 rounding, not bitwise (nor split-invariant bitwise)."""
    if FOLD_DOT:
        k_r, d_r, decay, weights = _committed_records(rk_base, rd_base, rg_base, origin, count, ring_size,
                                                      tl.arange(0, BLOCK_R), offs_k, mask_k, offs_v, mask_v,
                                                      stride_rk_r, stride_rk_k, stride_rd_r, stride_rd_v, stride_rg_r,
                                                      stride_rg_k, K, GATE_PER_KEY, USE_QK_L2NORM)
        if GATE_PER_KEY:
            return s * decay[:, None] + tl.dot(tl.trans(weights), d_r, input_precision=PRECISION)
        else:
            return s * decay + tl.dot(tl.trans(k_r * weights[:, None]), d_r, input_precision=PRECISION)
    else:
        return _fold_ring(s, rk_base, rd_base, rg_base, origin, count, ring_size, offs_k, mask_k, offs_v, mask_v,
                          stride_rk_r, stride_rk_k, stride_rd_r, stride_rd_v, stride_rg_r, stride_rg_k, GATE_PER_KEY,
                          USE_QK_L2NORM)


@triton.jit
def _delta_commit_kernel(
    state_ptr, ring_k_ptr, ring_d_ptr, ring_g_ptr, origin_ptr, count_ptr, accepted_ptr,
    K: tl.constexpr, V: tl.constexpr, ring_size, kv_ratio,
    stride_s_b, stride_s_h: tl.constexpr, stride_s_k: tl.constexpr, stride_s_v: tl.constexpr,
    stride_rk_b, stride_rk_r: tl.constexpr, stride_rk_h: tl.constexpr, stride_rk_k: tl.constexpr,
    stride_rd_b, stride_rd_r: tl.constexpr, stride_rd_h: tl.constexpr, stride_rd_v: tl.constexpr,
    stride_rg_b, stride_rg_r: tl.constexpr, stride_rg_h: tl.constexpr, stride_rg_k: tl.constexpr,
    stride_origin, stride_count, stride_accepted,
    BUFFER_LEN: tl.constexpr,
    GATE_PER_KEY: tl.constexpr,
    USE_QK_L2NORM: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_V: tl.constexpr,
    FOLD_DOT: tl.constexpr,  # fold as one product instead of record by record (_fold_records)
    PRECISION: tl.constexpr,  # FOLD_DOT's tl.dot precision
    BLOCK_R: tl.constexpr,  # FOLD_DOT: next_pow2(R), at least 16
):
    pid_v = tl.program_id(0)
    pid_b = tl.program_id(1).to(tl.int64)
    pid_h = tl.program_id(2)
    hk = pid_h // kv_ratio

    # Low 16 bits: the count (high bits: tickets already taken by this row's programs in this launch).
    count = tl.load(count_ptr + pid_b * stride_count, volatile=True) & 0xFFFF
    accepted = tl.load(accepted_ptr + pid_b * stride_accepted)
    origin = tl.load(origin_ptr + pid_b * stride_origin)
    new_count = count + accepted
    is_flush = new_count >= BUFFER_LEN
    if is_flush:
        offs_k = tl.arange(0, BLOCK_K)
        offs_v = pid_v * BLOCK_V + tl.arange(0, BLOCK_V)
        mask_k = offs_k < K
        mask_v = offs_v < V
        state_ptrs = (state_ptr + pid_b * stride_s_b + pid_h * stride_s_h
                      + offs_k[:, None] * stride_s_k + offs_v[None, :] * stride_s_v)
        s = tl.load(state_ptrs, mask=mask_k[:, None] & mask_v[None, :], other=0.0).to(tl.float32)
        s = _fold_records(s, ring_k_ptr + pid_b * stride_rk_b + hk * stride_rk_h,
                          ring_d_ptr + pid_b * stride_rd_b + pid_h * stride_rd_h,
                          ring_g_ptr + pid_b * stride_rg_b + pid_h * stride_rg_h, origin, new_count, ring_size,
                          offs_k, mask_k, offs_v, mask_v, stride_rk_r, stride_rk_k, stride_rd_r, stride_rd_v,
                          stride_rg_r, stride_rg_k, K, GATE_PER_KEY, USE_QK_L2NORM, FOLD_DOT, BLOCK_R, PRECISION)
        tl.store(state_ptrs, s.to(state_ptr.dtype.element_ty), mask=mask_k[:, None] & mask_v[None, :])

    # Count update: every warp has consumed count (barrier) before this program's ticket; the row's last ticket
    # writes the new count and clears the ticket bits.
    tl.debug_barrier()
    ticket = tl.atomic_add(count_ptr + pid_b * stride_count, 1 << 16, sem="relaxed") >> 16
    if ticket == tl.num_programs(0) * tl.num_programs(2) - 1:
        tl.atomic_xchg(count_ptr + pid_b * stride_count, tl.where(is_flush, 0, new_count), sem="relaxed")


@triton.jit(do_not_specialize=["origin", "count"])  # one compile for every ring position and record count
def _delta_fold_kernel(
    state_ptr, out_ptr, ring_k_ptr, ring_d_ptr, ring_g_ptr, origin, count,
    K: tl.constexpr, V: tl.constexpr, ring_size, kv_ratio,
    stride_s_b, stride_s_h: tl.constexpr, stride_s_k: tl.constexpr, stride_s_v: tl.constexpr,
    stride_o_b, stride_o_h: tl.constexpr, stride_o_k: tl.constexpr, stride_o_v: tl.constexpr,
    stride_rk_b, stride_rk_r: tl.constexpr, stride_rk_h: tl.constexpr, stride_rk_k: tl.constexpr,
    stride_rd_b, stride_rd_r: tl.constexpr, stride_rd_h: tl.constexpr, stride_rd_v: tl.constexpr,
    stride_rg_b, stride_rg_r: tl.constexpr, stride_rg_h: tl.constexpr, stride_rg_k: tl.constexpr,
    GATE_PER_KEY: tl.constexpr,
    USE_QK_L2NORM: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_V: tl.constexpr,
    FOLD_DOT: tl.constexpr,  # as in _delta_commit_kernel
    PRECISION: tl.constexpr,
    BLOCK_R: tl.constexpr,
):
    pid_v = tl.program_id(0)
    pid_b = tl.program_id(1).to(tl.int64)
    pid_h = tl.program_id(2)
    hk = pid_h // kv_ratio
    offs_k = tl.arange(0, BLOCK_K)
    offs_v = pid_v * BLOCK_V + tl.arange(0, BLOCK_V)
    mask_k = offs_k < K
    mask_v = offs_v < V
    tile = mask_k[:, None] & mask_v[None, :]
    s = tl.load(state_ptr + pid_b * stride_s_b + pid_h * stride_s_h + offs_k[:, None] * stride_s_k
                + offs_v[None, :] * stride_s_v, mask=tile, other=0.0).to(tl.float32)
    s = _fold_records(s, ring_k_ptr + pid_b * stride_rk_b + hk * stride_rk_h,
                      ring_d_ptr + pid_b * stride_rd_b + pid_h * stride_rd_h,
                      ring_g_ptr + pid_b * stride_rg_b + pid_h * stride_rg_h, origin, count, ring_size,
                      offs_k, mask_k, offs_v, mask_v, stride_rk_r, stride_rk_k, stride_rd_r, stride_rd_v,
                      stride_rg_r, stride_rg_k, K, GATE_PER_KEY, USE_QK_L2NORM, FOLD_DOT, BLOCK_R, PRECISION)
    # each program owns its tile: out may be the state itself
    tl.store(out_ptr + pid_b * stride_o_b + pid_h * stride_o_h + offs_k[:, None] * stride_o_k
             + offs_v[None, :] * stride_o_v, s.to(out_ptr.dtype.element_ty), mask=tile)


# ---------------------------------------------------------------------------------------------------------------
# launch configuration


STEPS_FROM_WINDOW = 3  # the steps form from 3-token windows on (H200, runs 83-85: tokens faster at 2, steps at 3+)
# the steps form's tile halves from these widths (scalar gate, per-key gate): H200, batch 256, runs 85 / 86: GDN
# [128, 16] slower at T = 4-6, faster at 8 (7 not measured); KDA slower at 4, faster at 5, even at 6
NARROW_STEPS_FROM_WINDOW = {False: 7, True: 5}


# KDA's verify computes the committed records' decays and decayed keys once per (row, value head) from 3-token
# windows on (the steps form); H200, batch 256, verify + commit, every draft accepted (runs 96 / 99): T = 3 747 vs
# 799 us, T = 4 863 vs 928, T = 8 1589 vs 1980; at T = 2 (the token form) it loses, 538 vs 507 (batch 64: 159 vs 143)
WEIGHTS_FROM_WINDOW = 3


def default_verify_weights(per_key_gate: bool, window: int) -> bool:
    """Whether ``_verify`` runs the per-head pre-launch of the committed records' decays (``_weights``) when it is
    not given: for per-key gates (KDA) from :data:`WEIGHTS_FROM_WINDOW` tokens on; a scalar gate has no [R, K]
    decays to share."""
    return per_key_gate and window >= WEIGHTS_FROM_WINDOW


def default_form(window: int) -> str:
    """The verify form when neither ``_products`` nor ``_steps`` is given: ``"tokens"`` for windows of up to 2
    tokens, ``"steps"`` from :data:`STEPS_FROM_WINDOW` on. H200, verify alone at the launches of
    :func:`verify_launch_config`, batch 256 (runs 84 / 85): GDN at T = 2 tokens 281 us / steps 414; T = 3 steps 439
    / tokens 711 (the earlier default); KDA T = 2 397 / 533, T = 3 613 / 831. The product form is never the default
    (1.3-9.7x slower in IEEE float32, run 77; slower still with tf32x3, run 78)."""
    return "steps" if window >= STEPS_FROM_WINDOW else "tokens"


def resolve_form(window: int, products: bool | str | None = None,
                 steps: bool | str | None = None) -> tuple[bool | str, bool | str]:
    """(``_products``, ``_steps``) for ``_verify``: :func:`default_form` when neither is given, else the one given
    (the other off). Two forms at once are an error."""
    if products is None and steps is None:
        steps = default_form(window) == "steps"
    products, steps = products or False, steps or False
    if products and steps:
        raise ValueError("_products and _steps name two different verify forms; pass one")
    return products, steps


def verify_launch_config(batch: int, value_heads: int, key_dim: int, value_dim: int, per_key_gate: bool,
                         window: int, products: bool | str = False, steps: bool | str = False) -> tuple[int, int]:
    """(BLOCK_V, num_warps) of the verify kernel, halved (down to 16) while the grid would have fewer than ~8 programs
    per H200 SM:

    * token form: a [K, 8192 / K] tile ([128, 64] for K = 128) on 2 warps where it is the default (windows of up to
      2 tokens); for longer windows (not the default) the earlier choice, 4 warps on [K, 8192 / K], [K, 16384 / K]
      for a per-key gate (T = 4, runs 79 / 83: GDN 925 us, KDA 1056; 2 warps spill 712 B at sm_90). Each token's
      reductions over K cross warps (eleven of them), so fewer warps win; and every V tile of a (row, head) redoes
      the work that does not depend on V (the records' and window keys' products with k and q, per-key decays), so
      wider tiles win. H200, verify alone, batch 256, T = 2 (runs 79 / 84 / 85): GDN [128, 64] x 2 281 us, x 4 469;
      [128, 128] x 4 (the earlier default) 408, x 2 744; [128, 32] x 1 312; KDA [128, 64] x 2 397, [128, 128] x 4 484.
    * steps form: one warp (two for K = 256), a [K, 4096 / K] tile ([128, 32]), [K, 2048 / K] from
      :data:`NARROW_STEPS_FROM_WINDOW` (7 tokens for a scalar gate, 5 for a per-key gate): the window's state tile
      lives in one warp's registers and its two reductions over K per token stay in that warp. Runs 83-86, batch
      256: GDN T = 4 [128, 32] x 1 509 us, [128, 16] x 1 685, [128, 64] x 2 631, x 4 752; T = 6 [128, 32] x 1 798,
      [128, 16] 873; T = 8 [128, 16] x 1 1079, [128, 32] x 1 1316; KDA T = 4 [128, 32] x 1 705, [128, 64] x 2 754;
      T = 5 [128, 16] x 1 1209, [128, 32] 1369; T = 8 [128, 16] x 1 1567, [128, 32] x 1 1938.
    * ``products`` (the window as matrix products; slower on the H200, runs 77 / 78): 8 warps, [K, 4096 / K] tiles,
      [K, 16] for a per-key gate (ptxas for sm_90, Triton 3.6: GDN [128, 32] 182 registers, KDA [128, 16] 255 and
      4 B spilled).

    ``kernels/bench_verify.py`` and ``benchmarks/gpu/verify_config_sweep.py`` sweep it through ``_block_v`` /
    ``_num_warps``."""
    block_k = next_power_of_2(key_dim)
    if products:
        elements, num_warps = 4096, 8
    elif steps:
        # one warp per 128 keys: K = 256 on one warp spills 588-824 B at sm_90, on two none (compile-only, Triton 3.6)
        elements = 2048 if window >= NARROW_STEPS_FROM_WINDOW[per_key_gate] else 4096
        num_warps = max(1, block_k // 128)
    else:
        short = window < STEPS_FROM_WINDOW
        elements, num_warps = (8192 if short or not per_key_gate else 16384), (2 if short else 4)
    block_v = min(next_power_of_2(value_dim), max(16, elements // block_k))
    while block_v > 16 and batch * value_heads * cdiv(value_dim, block_v) < 1024:
        block_v //= 2
    if products and per_key_gate:
        block_v = 16
    return max(block_v, 16), num_warps


# ---------------------------------------------------------------------------------------------------------------
# wrappers


def _check_rings(state, ring_k, ring_d, ring_g, origin=None, count=None):
    batch, value_heads, key_dim, value_dim = state.shape
    ring_size = ring_k.shape[1]
    assert ring_k.dim() == 4 and ring_k.shape[:2] == (batch, ring_size) and ring_k.shape[3] == key_dim, (
        f"ring_k must be [B, R, Hk, K], got {tuple(ring_k.shape)}")
    key_heads = ring_k.shape[2]
    assert value_heads % key_heads == 0, "value heads must be a multiple of key heads"
    assert ring_d.shape == (batch, ring_size, value_heads, value_dim), (
        f"ring_d must be [B, R, Hv, V], got {tuple(ring_d.shape)}")
    assert ring_g.shape in ((batch, ring_size, value_heads), (batch, ring_size, value_heads, key_dim)), (
        f"ring_g must be [B, R, Hv] or [B, R, Hv, K], got {tuple(ring_g.shape)}")
    if origin is not None:  # per-row positions (verify, commit); a fold takes one host position for every row
        assert origin.shape == (batch,) and count.shape == (batch,), "origin and count must be [B]"
        assert origin.dtype == torch.int32 and count.dtype == torch.int32, "origin and count must be int32"
    assert key_dim <= MAX_KEY_DIM, f"key dim {key_dim} > {MAX_KEY_DIM} (one K tile per program)"
    return batch, value_heads, key_heads, key_dim, value_dim, ring_size, ring_g.dim() == 4


def _window_strides(g: torch.Tensor) -> tuple[int, ...]:
    """(b, t, h, k) strides of g [B, T, Hv] / [B, T, Hv, K] (k stride 0 for a scalar gate)."""
    return (*g.stride(), 0) if g.dim() == 3 else tuple(g.stride())


def _verify(state, ring_k, ring_d, ring_g, origin, count, q, k, v, beta, g, use_qk_l2norm=True, scale=None,
            out=None, _block_v=None, _num_warps=None, _products=None, _steps=None, _weights=None, _weights_warps=None,
            _newest_first="auto"):
    """:func:`delta_verify` with launch overrides: ``_block_v`` / ``_num_warps``, the form (``_products`` /
    ``_steps``, :func:`resolve_form`), and ``_weights`` (per-key gates only; :func:`default_verify_weights` when not
    given): a first launch computes each (row, value head)'s decay and decayed record keys once
    (``_verify_record_weights_kernel``), which the verify programs of its V tiles load instead of each loading the
    record keys and gates and computing the [R, K] decays (the replay step's ``_kda_weights``, for verify);
    ``_weights_warps``: that launch's warps (:data:`kernels.delta_rule.KDA_WEIGHTS_WARPS` when not given);
    ``_newest_first`` (``"auto"``: :data:`kernels.delta_rule.NEWEST_FIRST_DEFAULT`, off until timed): it reads the
    records newest first, so their decays are a forward scan (the replay step's ``_newest_first``; sm_90, Triton 3.6:
    944 -> 304 warp shuffles a program, 832 of them the reverse scan)."""
    if _newest_first == "auto":  # (read when called: the replay step's default)
        _newest_first = _delta_rule.NEWEST_FIRST_DEFAULT
    batch, value_heads, key_heads, key_dim, value_dim, ring_size, per_key = _check_rings(
        state, ring_k, ring_d, ring_g, origin, count)
    window = k.shape[1]
    assert k.shape == (batch, window, key_heads, key_dim) and q.shape == k.shape, (
        f"q and k must be [B, T, Hk, K], got {tuple(q.shape)} and {tuple(k.shape)}")
    assert v.shape == (batch, window, value_heads, value_dim), f"v must be [B, T, Hv, V], got {tuple(v.shape)}"
    assert beta.shape == (batch, window, value_heads), f"beta must be [B, T, Hv], got {tuple(beta.shape)}"
    assert g.shape == (batch, window, *ring_g.shape[2:]), (
        f"g must be [B, T, {'Hv, K' if per_key else 'Hv'}] like ring_g, got {tuple(g.shape)}")
    assert 1 <= window <= min(ring_size, MAX_WINDOW), f"window {window} must be in [1, min(R={ring_size}, 16)]"
    o = torch.empty_like(v) if out is None else out
    assert o.shape == v.shape
    scale = key_dim ** -0.5 if scale is None else float(scale)
    _products, _steps = resolve_form(window, _products, _steps)
    block_v, num_warps = verify_launch_config(batch, value_heads, key_dim, value_dim, per_key, window, _products,
                                              _steps)
    block_v, num_warps = _block_v or block_v, _num_warps or num_warps
    assert block_v >= 16 or not (_products or _steps), f"block_v {block_v} < 16: tl.dot needs 16"
    floor = 16 if _products or _steps else 2  # tl.dot operands are at least 16 on every side
    grid = (cdiv(value_dim, block_v), batch, value_heads)
    block_k = max(floor, next_power_of_2(key_dim))
    block_r = max(floor, next_power_of_2(max(ring_size - window, 1)))  # count <= R - T if rows fit
    _weights = default_verify_weights(per_key, window) if _weights is None else _weights
    if _weights and not per_key:
        raise ValueError("_weights needs per-key gates (KDA): a scalar gate's records have no [R, K] decays")
    weights = state  # (unused pointer)
    with _device_guard(v):
        if _weights:
            weights = torch.empty((batch, value_heads, block_k + block_r * block_k), dtype=torch.float32,
                                  device=v.device)
            LAST_COMPILED["verify_weights"] = _verify_record_weights_kernel[(batch, value_heads)](
                ring_k, ring_g, origin, count, weights, key_dim, ring_size, value_heads // key_heads,
                *ring_k.stride(), *_ring_gate_strides(ring_g), origin.stride(0), count.stride(0),
                USE_QK_L2NORM=bool(use_qk_l2norm), BLOCK_K=block_k, BLOCK_R=block_r, NEWEST_FIRST=bool(_newest_first),
                num_warps=_weights_warps or KDA_WEIGHTS_WARPS,
            )
        LAST_COMPILED["verify"] = _delta_verify_kernel[grid](
            state, ring_k, ring_d, ring_g, origin, count, q, k, v, beta, g, o, weights,
            key_dim, value_dim, ring_size, value_heads // key_heads, scale,
            *state.stride(), *ring_k.stride(), *ring_d.stride(), *_ring_gate_strides(ring_g),
            origin.stride(0), count.stride(0),
            *q.stride(), *k.stride(), *v.stride(), *beta.stride(), *_window_strides(g), *o.stride(),
            window,
            GATE_PER_KEY=per_key,
            USE_QK_L2NORM=bool(use_qk_l2norm),
            WINDOW_AS_PRODUCTS=bool(_products),
            WINDOW_AS_STEPS=bool(_steps),
            WEIGHTS_GIVEN=bool(_weights),
            # the steps form's record fold: tf32x3 like the replay step's flush (``_steps=True``) or as named
            PRECISION=dot_precision(_products or ("tf32x3" if _steps is True else _steps)),
            BLOCK_K=block_k,
            BLOCK_V=block_v,
            BLOCK_R=block_r,
            BLOCK_T=MAX_WINDOW if _products else max(2, next_power_of_2(window)),  # products: every width
            CHUNK_K=min(32, block_k),
            num_warps=num_warps,
        )
    return o


def default_fold_dot(per_key_gate: bool) -> bool:
    """Whether the commit and the ring fold sum their records as one tf32x3 product (True) or fold them one by one
    (False) when ``_fold_dot`` is not given: the product for scalar gates, the loop for per-key gates. H200, verify +
    commit per window against the loop (run 89, ``bench_verify --forms fold_dot``): GDN batch 256 T = 4 657 vs 694 us
    (every draft accepted) and 620 vs 637 (mixed), T = 8 1328 vs 1438, batch 64 faster at every T; KDA within +-4 %
    either way (batch 256 T = 4 943 vs 936, T = 8 1978 vs 2007; run 99 with the verify pre-launch: 879 vs 873), so it
    keeps the split-invariant loop."""
    return not per_key_gate


def fold_launch_config(batch: int, value_heads: int, key_dim: int, value_dim: int, per_key_gate: bool,
                       fold_dot: bool | str) -> tuple[int, int]:
    """(BLOCK_V, num_warps) of the commit and the ring fold: the standard step's tile (a fold is a standard step per
    record), at least 16 wide for the product fold, whose scalar-gate form runs on 8 warps. H200, flush with every
    row flushing, batch 256, T = 4 (run 97, ``bench_verify --parts``): GDN product [128, 64] x 8 458 us, x 4 478,
    loop x 4 688; KDA loop [128, 64] x 4 746, product x 4 663, x 8 741. Compile-only, sm_90: GDN product x 8 107
    registers against 217 on 4 warps."""
    block_v, num_warps = state_update_launch_config(batch, value_heads, key_dim, value_dim, per_key_gate)
    if not fold_dot:
        return block_v, num_warps
    return max(block_v, 16), (num_warps if per_key_gate else 8)


def _fold_launch(key_dim: int, ring_size: int, fold_dot: bool | str) -> dict:
    """The fold's constexprs (commit and ring fold): ``fold_dot`` False (record by record), True (one tf32x3
    product) or a ``tl.dot`` precision name; the product's operands are at least 16 on every side."""
    return dict(FOLD_DOT=bool(fold_dot), PRECISION=dot_precision("tf32x3" if fold_dot is True else fold_dot),
                BLOCK_K=max(16 if fold_dot else 1, next_power_of_2(key_dim)),
                BLOCK_R=max(16, next_power_of_2(ring_size)))


def _commit(state, ring_k, ring_d, ring_g, origin, count, accepted, buffer_len, use_qk_l2norm=True, _block_v=None,
            _num_warps=None, _fold_dot=None):
    batch, value_heads, key_heads, key_dim, value_dim, ring_size, per_key = _check_rings(
        state, ring_k, ring_d, ring_g, origin, count)
    _fold_dot = default_fold_dot(per_key) if _fold_dot is None else _fold_dot
    assert accepted.shape == (batch,) and accepted.dtype == torch.int32, "accepted must be [B] int32"
    assert 1 <= buffer_len < (1 << _TICKET_SHIFT), "buffer_len out of range"
    block_v, num_warps = fold_launch_config(batch, value_heads, key_dim, value_dim, per_key, _fold_dot)
    block_v, num_warps = _block_v or block_v, _num_warps or num_warps
    assert block_v >= 16 or not _fold_dot, f"block_v {block_v} < 16: tl.dot needs 16"
    grid = (cdiv(value_dim, block_v), batch, value_heads)
    assert grid[0] * value_heads < (1 << (31 - _TICKET_SHIFT)), "too many programs per row for the count ticket"
    with _device_guard(state):
        LAST_COMPILED["commit"] = _delta_commit_kernel[grid](
            state, ring_k, ring_d, ring_g, origin, count, accepted,
            key_dim, value_dim, ring_size, value_heads // key_heads,
            *state.stride(), *ring_k.stride(), *ring_d.stride(), *_ring_gate_strides(ring_g),
            origin.stride(0), count.stride(0), accepted.stride(0),
            BUFFER_LEN=buffer_len,
            GATE_PER_KEY=per_key,
            USE_QK_L2NORM=bool(use_qk_l2norm),
            BLOCK_V=block_v,
            **_fold_launch(key_dim, ring_size, _fold_dot),
            num_warps=num_warps,
        )


def _fold(state, ring_k, ring_d, ring_g, origin, count, use_qk_l2norm=True, out=None, _fold_dot=None):
    batch, value_heads, key_heads, key_dim, value_dim, ring_size, per_key = _check_rings(state, ring_k, ring_d, ring_g)
    _fold_dot = default_fold_dot(per_key) if _fold_dot is None else _fold_dot
    assert 0 <= origin < ring_size and 0 <= count <= ring_size, f"origin {origin} / count {count} outside the ring"
    out = torch.empty_like(state) if out is None else out
    assert out.shape == state.shape, f"out must be {tuple(state.shape)}, got {tuple(out.shape)}"
    block_v, num_warps = fold_launch_config(batch, value_heads, key_dim, value_dim, per_key, _fold_dot)
    grid = (cdiv(value_dim, block_v), batch, value_heads)
    with _device_guard(state):
        LAST_COMPILED["fold"] = _delta_fold_kernel[grid](
            state, out, ring_k, ring_d, ring_g, int(origin), int(count),
            key_dim, value_dim, ring_size, value_heads // key_heads,
            *state.stride(), *out.stride(), *ring_k.stride(), *ring_d.stride(), *_ring_gate_strides(ring_g),
            GATE_PER_KEY=per_key,
            USE_QK_L2NORM=bool(use_qk_l2norm),
            BLOCK_V=block_v,
            **_fold_launch(key_dim, ring_size, _fold_dot),
            num_warps=num_warps,
        )
    return out


def delta_verify(
    state: torch.Tensor,
    ring_k: torch.Tensor,
    ring_d: torch.Tensor,
    ring_g: torch.Tensor,
    origin: torch.Tensor,
    count: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    g: torch.Tensor,
    use_qk_l2norm: bool = True,
    scale: float | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Verify a window of T <= 16 tokens per row (one launch; no state write, ``count`` unchanged).

    state [B, Hv, K, V] float32 checkpoint; ring_k [B, R, Hk, K] raw keys, ring_d [B, R, Hv, V] float32, ring_g
    [B, R, Hv] (GDN) or [B, R, Hv, K] (KDA) float32; origin, count [B] int32; q, k [B, T, Hk, K] raw; v [B, T, Hv, V];
    beta [B, T, Hv]; g [B, T, Hv] or [B, T, Hv, K] (log decays). Requires ``count[b] + T <= R`` (rows that do not fit
    get NaN outputs and no records). Token t sees the checkpoint, the committed records and window tokens 0..t; its
    record (raw k, d_t, g_t) goes to slot ``(origin[b] + count[b] + t) % R``. Keys and queries are l2-normalised
    in-kernel when ``use_qk_l2norm``; queries are scaled by ``scale`` (default K ** -0.5). Returns o [B, T, Hv, V] in
    v's dtype (or ``out``). Same semantics as :func:`delta_verify_ref`.
    """
    return _verify(state, ring_k, ring_d, ring_g, origin, count, q, k, v, beta, g, use_qk_l2norm, scale, out)


def delta_commit(
    state: torch.Tensor,
    ring_k: torch.Tensor,
    ring_d: torch.Tensor,
    ring_g: torch.Tensor,
    origin: torch.Tensor,
    count: torch.Tensor,
    accepted: torch.Tensor,
    buffer_len: int,
    use_qk_l2norm: bool = True,
) -> None:
    """Commit ``accepted[b]`` (int32, 0..T) records of the last verified window per row (one launch, phase decided on
    the device): ``count[b] += accepted[b]``; rows whose new count reaches ``buffer_len`` fold all their committed
    records into ``state[b]`` in place (the recurrence with the recorded d's; :func:`default_fold_dot`) and set
    ``count[b] = 0`` (``origin`` unchanged). ``accepted[b]`` must not exceed the last window's T (not checked on the
    device; the reference raises when the new count exceeds R). Same semantics as :func:`delta_commit_ref`."""
    _commit(state, ring_k, ring_d, ring_g, origin, count, accepted, buffer_len, use_qk_l2norm)


def delta_fold_ring(
    state: torch.Tensor,
    ring_k: torch.Tensor,
    ring_d: torch.Tensor,
    ring_g: torch.Tensor,
    origin: int,
    count: int,
    use_qk_l2norm: bool = True,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``state`` with the ``count`` records at ring slots ``(origin + j) % R`` (the same slots in every row) folded
    in, in order (one launch): the commit's fold (same bits), written to ``out`` (a new tensor by default;
    ``state`` itself for an in-place fold). A flush boundary's checkpoint inside a speculative window (staged), or
    the oldest records of a ring a speculative run left over a period. Same semantics as
    :func:`delta_fold_ring_ref`."""
    return _fold(state, ring_k, ring_d, ring_g, origin, count, use_qk_l2norm, out)
