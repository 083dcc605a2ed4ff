"""Triton decode-step kernels for gated delta rule layers (Gated DeltaNet and Kimi Delta Attention): the ReplaySSM
replay-or-flush step and the standard step.

Entry points (each with a torch reference of the same signature, re-exported here from
``hf_replayssm.ops.delta_step``):

* :func:`delta_replay_step` / :func:`delta_replay_step_ref`: one decode token per batch row. Rows whose ring is not
  full compute the output and the token's corrected value from the float32 checkpoint plus the buffered records and
  only append a record; rows that reach ``buffer_len`` fold the records and the token into the checkpoint in place.
  Decided per row on the device: one launch whose programs replay or flush by their row's count, then a small
  launch that advances the counts (on request the step as a flush-only launch and a replay-only launch).
* :func:`delta_state_update` / :func:`delta_state_update_ref`: the standard step (read state, update, write in
  place, output), i.e. flash-linear-attention's ``fused_recurrent_gated_delta_rule`` / ``fused_recurrent_kda`` for
  one token with an in-place state.

Shapes (B = batch, Hk = key heads, Hv = value heads, Hv % Hk == 0 and value head h reads key head h // (Hv / Hk),
K = key dim <= 256, V = value dim, R = ring capacity; FLA writes the same tensors as [B, T, H, K] with T = 1):
state [B, Hv, K, V] (key-major, transformers' layout); ring_k [B, R, Hk, K] raw keys; ring_d [B, R, Hv, V] float32;
ring_g [B, R, Hv] (GDN) or [B, R, Hv, K] (KDA) float32; origin, count [B] int32; q, k [B, Hk, K] raw (before l2
normalisation); v [B, Hv, V]; beta [B, Hv]; g [B, Hv] (GDN) or [B, Hv, K] (KDA), log decays. Every stride is passed
to the kernels, so views (slices of a pool, q/k/v split out of one projection) work without copies; only
``origin``/``count`` must be int32. The gate kind is ``g.dim()`` (a constexpr of the kernels).

Math (per value head; keys and queries l2-normalised in float32 on read, queries scaled; c = log decay since the
checkpoint): ``P_t = diag(exp(g_t)) S_{t-1}``, ``d_t = beta_t (v_t - P_t^T k_t)``, ``S_t = P_t + k_t d_t^T``,
``o_t = S_t^T q_t = P_t^T q_t + (k_t . q_t) d_t``, and with records j < count

    P_t^T u = S0^T (exp(c_t) * u) + sum_j ((exp(s_j) * k_j) . u) d_j,   s_j = sum_{j<i<count} g_i + g_t

(``*`` per key channel for KDA, a scalar for GDN). The decays ``s_j`` are direct sums of the terms in between (a
reverse cumulative sum over the records read in logical order, shifted by one record), never differences of two
cumulative sums (see ``hf_replayssm/ops/decay.py``); ``c_t = g_0 + s_0``.

Design notes:

* Grid ``(cdiv(V, BLOCK_V), B, Hv)``: a program owns a ``[next_pow2(K), BLOCK_V]`` float32 tile of one (row, value
  head)'s state in registers; the V tiles of one head are neighbours in launch order, so the records they all read
  (keys, gates) come from L2. No autotuning (the kernels write state); launch configurations come from
  :func:`replay_launch_config` / :func:`state_update_launch_config` and can be overridden through the private
  ``_block_v`` / ``_num_warps`` (and ``_flush_dot``) arguments of ``_replay_step`` / ``_state_update`` (the
  benchmark sweeps them).
* ``K``, ``V`` and every stride except the batch strides are compile-time constants (as FLA does for K and V): the
  masks of full tiles fold away and tile addresses become immediate offsets, which cut the registers per program by
  a quarter to a third (e.g. replay [128, 64] x 4 warps: 231 -> 168, so 3 instead of 2 programs per SM). Views
  still work; each distinct stride set compiles once. Record counts are never specialised on.
* Replay program: reads its S0 tile once and forms ``S0^T (exp(c) u)`` for u in {q, k_t}; the records (``count``
  of them, read in logical order: keys [R, K] normalised on the fly, d [R, BLOCK_V], gates) add
  ``sum_j w_j(u) d_j``. Flush program: also builds ``S = diag(exp(c)) S0 + (exp(s) * K_rec)^T D_rec + k_t d_t^T``
  and stores it in place; the record sum is either one ``tl.dot`` (``FLUSH_PRECISION`` "tf32x3": float32 accuracy
  on tensor cores; the default for GDN) or a loop over the records re-read from L1, newest first (fewer registers;
  the default for KDA, whose per-key tiles would spill with the dot), see :func:`flush_uses_dot`. bf16/fp16 inputs
  are upcast to fp32 right after loading (also required by ``TRITON_INTERPRET=1``).
* Host phases from :data:`HOST_WALK_MIN_BATCH` rows: the replay-only launch (``PHASE`` 1) runs as
  ``_delta_replay_walk_kernel``, a device-sized grid (8 one-warp programs per SM) whose programs walk [K, 32] tiles
  with the next tile's load issued a stage ahead (``tl.range(num_stages=2)``), the same per-tile arithmetic
  (:func:`host_walk_launch_config`; H200, Qwen3-Next batch 256: host cycle 177 us against 212 per tile, 83 % of copy
  bandwidth). A [128, 64] tile on two warps holds 238 registers, so an SM keeps 8 warps with one tile each in flight;
  the walk keeps 8 warps with two.
* Device phases: one fused launch (``PHASE`` 0, the default for tensor positions; H200, batch 256, rows in phase:
  229 us per step, as fast as the phase-specialised host launches' 227 us) or split (``PHASE`` 3 then 4: 257 us
  per tile). From :data:`DEVICE_WALK_MIN_BATCH` rows GDN runs split by default, its replay launch walking the tiles
  (:func:`device_walk_launch_config`; over the replaying rows' items only; H200, Qwen3-Next batch 256, rows in phase:
  210.5 us against the fused 233.0; batch 128 113.1 against 122.9).
  The fused kernel was first the slower (348 us vs 289 us split) while device-read records were read by
  physical slot (``RING_PHYSICAL``: decays as direct sums over an [R, R] mask, so that no address waited for the
  positions); read in logical order, as the host launches do, both got faster and fused won. Split, the flush launch's
  programs of replaying rows
  read ``count[b]`` and exit without touching it; the replay launch (run after it) skips the flushing rows' work;
  a third launch (one program per 1024 rows) then advances every row's count (0 after a flush), so both step
  launches see the same old count. ``PHASE`` 0 keeps both codes in one launch.
* Count tickets (``_count_launch=False``, 10 us per step slower at batch 256 on an H200 than the count launch):
  the per-row phase is read on the device with a variant of the ticket scheme of ``kernels/mamba2.py``: every
  program reads ``count[b]`` with a plain load (low 16 bits) and then takes one ``atomic_add(count[b], 1 << 16)``
  ticket, whose value it only needs at its end; the program that drew the row's last ticket writes the new count
  (an atomic exchange, which also clears the ticket bits). Each read precedes its own ticket (same address) and
  every ticket precedes the exchange, so all programs of the row see the old count, without waiting for an atomic
  before the record loads (a plain L2 read is on that path instead; the atomic on it cost ~13 % at batch 256).
  Hence ``buffer_len < 2**16`` and fewer than ``2**15`` programs per row (asserted), and ``count`` must not be
  shared by two launches that run concurrently.
* Only the committed records are read (loads masked by ``position < count``, so uncommitted slots, whatever they
  hold, never reach the arithmetic and cost no bandwidth). ``origin`` is never modified: after a flush the ring
  restarts at slot ``origin[b]``.
* Records are appended by the programs that own them: d by every V tile, g by V tile 0, the raw key by V tile 0 of
  the first value head of each key group (one writer per key head). The appended slot ``(origin + count) % R``
  differs from every slot read in the same launch because ``count + 1 < buffer_len <= R + 1``.

Read copy (separated precision, ``read_copy``/``read_format``): replaying rows take ``S0^T q`` and ``S0^T k`` from
a low-precision copy of the checkpoint (fp8 / nvfp4, the store's encoding, rows = V), decoded tile by tile in
registers by ``kernels/read_copy.py``; the replay-only kernel then never reads the fp32 checkpoint, and flushing
rows read the checkpoint alone (masked loads in the fused kernel). Hence the appended corrected value ``d_t`` is
computed against the copy, as the torch path's separated policy does for its outputs. A flush that folds those ``d``
records would let the copy's rounding into the checkpoint, so the separated policy also passes ``ring_v`` /
``ring_beta`` (exact fold, ``EXACT_FOLD``): replays append the raw v and beta too, and the flush recomputes every
corrected value against the fp32 checkpoint with the standard step's arithmetic, oldest record first (a serial loop
over at most L - 1 records, once per L steps), as the torch path's ``exact`` fold does. This kernel does not
re-encode the copy: the caller refreshes it after a flush (the ``delta_replay_step_read_copy`` op of
``kernels/ops.py`` does, with ``kernels/read_copy_encode.py``, for the rows that flushed). Measured (H200, Qwen3-Next
shape, batch 256, ``--read-format``): slower than the fp32 replay (host-phase cycle fp8 311 us, nvfp4 673 us, fp32
228 us): the decode's registers and instructions, not bytes, set the time (``BENCHMARKS.md``).

Measured on an H200 (triton 3.6, qwen3-next GDN shape 32/16 heads of 128, batch 256, L = 16, before K/V became
constexpr): standard step 280 us (91-93 % of copy bandwidth; FLA's fused_recurrent 365 us), replay cycle 332 us
(44 %: the replay program is latency/occupancy-bound, not bandwidth-bound; with no records at all it still takes
279 us). KDA (kimi-linear): standard 280 us, replay 518 us. Later (K/V constexpr, host-phase launches): replay
cycle 226.6 us at batch 256; device phase split in two launches 288.6 us, fused 347.0 us; with records in logical
order and a count launch, fused 241 us with rows in mixed phases, 229 us in phase (``BENCHMARKS.md``). KDA with
its decays and record weights computed once per row and head by a pre-launch (the default since run 64): 292 us
with rows in mixed phases, 278 us in phase, against the standard step's 277 us and fla's 300 us at batch 256. See
the benchmark ``kernels/bench_delta.py``.
"""

from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

from hf_replayssm.kernels.counts import advance_counts
from hf_replayssm.kernels.flush_grid import MAX_BATCH as FLUSH_GRID_MAX_BATCH
from hf_replayssm.kernels.flush_grid import (
    due_item,
    due_rows,
    flush_grid_programs,
    replaying_rows,
    use_device_grid,
    walk_item,
    walk_positions,
)
from hf_replayssm.kernels.host_math import cdiv, next_power_of_2
from hf_replayssm.kernels.read_copy import (
    E2M1_PAIR_UNSCALE,
    code_offsets,
    e2m1_pair_to_float,
    load_nvfp4_blocks,
    load_read_tile,
    read_copy_operands,
)
from hf_replayssm.kernels.read_copy_encode import reencode_flushed_rows, store_flushed_tile
from hf_replayssm.ops.delta_step import delta_replay_step_ref, delta_state_update_ref
from hf_replayssm.ops.positions import host_phase

__all__ = [
    "delta_replay_step",
    "delta_replay_step_ref",
    "delta_state_update",
    "delta_state_update_ref",
    "flush_uses_dot",
    "host_flush_launch_config",
    "replay_launch_config",
    "state_update_launch_config",
]

_TICKET_SHIFT = 16
FLUSH_PRECISION = "tf32x3"  # input precision of the flush's tl.dot ("ieee": exact fp32 FMA, more registers)
MAX_KEY_DIM = 256
# Warps of KDA's per-head weights pre-launch (the replay step's ``_kda_weights`` and the verify's ``_weights``): on
# one, its reverse scan over the records stays inside each thread; on four it crossed warps through shared memory.
# H200, Kimi-Linear shape, batch 256 (run 102, BENCHMARKS.md): the pre-launch 45.7 us on one warp, 61.4 on two,
# 94.6 on four (L1 92 % busy); the host-position step 216 vs 261 us, device positions 233 vs 280.
KDA_WEIGHTS_WARPS = 1
# Warps of the solved exact fold's pre-launch (_delta_solve_kernel; untimed): scalar gates one (one [R, K] key block and
# [R, R] tiles a program), per-key gates four (their [R, K] decays and decayed keys spill on one: sm_90, Triton 3.6,
# 255 registers and 20 bytes spilled on one warp, 204 on two, 117 on four)
SOLVE_WARPS = 1
KDA_SOLVE_WARPS = 4
# What ``_replay_step``'s ``_newest_first`` / ``_flush_weights`` ("auto", the default) resolve to (built offline in the
# fortieth session, timed on the H200 in runs 218-219, batch 256; see _replay_step and BENCHMARKS.md). Newest first
# lost (KDA fp32 host cycle 216.7 -> 220.9 us). Flush weights, by gate kind (per-key gates: True): KDA's separated
# cycles gained (nvfp4 device step with rows out of phase 368.0 -> 276.2 us, fp8 host cycle 217.4 -> 210.3), GDN's
# lost (fp8 device step 244.8 -> 264.7, in phase 184.9 -> 204.2).
NEWEST_FIRST_DEFAULT = False
FLUSH_WEIGHTS_DEFAULT = {False: False, True: True}
LAST_COMPILED: dict = {}  # last compiled kernel per entry point (n_regs / n_spills for the benchmark)


@triton.jit
def _l2norm_rows(x, USE_QK_L2NORM: tl.constexpr):
    """x [R, K] float32 -> rows scaled by rsqrt(sum(x^2) + 1e-6) (zero rows stay zero)."""
    if USE_QK_L2NORM:
        x = x * tl.rsqrt(tl.sum(x * x, axis=1) + 1e-6)[:, None]
    return x


@triton.jit
def _load_qk(q_ptr, k_ptr, pid_b, hk, offs_k, mask_k, scale, stride_q_b, stride_q_h, stride_q_k,
             stride_k_b, stride_k_h, stride_k_k, USE_QK_L2NORM: tl.constexpr):
    """The token's raw k (storage dtype), q (normalised, scaled) and k (normalised) [K], float32 but the raw k."""
    k_raw, k_t = _load_key(k_ptr, pid_b, hk, offs_k, mask_k, stride_k_b, stride_k_h, stride_k_k, USE_QK_L2NORM)
    q_t = tl.load(q_ptr + pid_b * stride_q_b + hk * stride_q_h + offs_k * stride_q_k,
                  mask=mask_k, other=0.0).to(tl.float32)
    if USE_QK_L2NORM:
        q_t = q_t * tl.rsqrt(tl.sum(q_t * q_t, axis=0) + 1e-6)
    return k_raw, q_t * scale, k_t


@triton.jit
def _load_key(k_ptr, pid_b, hk, offs_k, mask_k, stride_k_b, stride_k_h, stride_k_k, USE_QK_L2NORM: tl.constexpr):
    """The token's raw k (storage dtype) and k (float32, normalised) [K]."""
    k_raw = tl.load(k_ptr + pid_b * stride_k_b + hk * stride_k_h + offs_k * stride_k_k, mask=mask_k, other=0.0)
    k_t = k_raw.to(tl.float32)
    if USE_QK_L2NORM:
        k_t = k_t * tl.rsqrt(tl.sum(k_t * k_t, axis=0) + 1e-6)
    return k_raw, k_t


@triton.jit
def _load_gate(g_ptr, pid_b, pid_h, offs_k, mask_k, stride_g_b, stride_g_h, stride_g_k, GATE_PER_KEY: tl.constexpr):
    """The token's log decay of value head ``pid_h``, float32: [K] per key channel, else a scalar."""
    if GATE_PER_KEY:
        return tl.load(g_ptr + pid_b * stride_g_b + pid_h * stride_g_h + offs_k * stride_g_k, mask=mask_k,
                       other=0.0).to(tl.float32)
    else:
        return tl.load(g_ptr + pid_b * stride_g_b + pid_h * stride_g_h).to(tl.float32)


@triton.jit
def _load_token(q_ptr, k_ptr, v_ptr, beta_ptr, g_ptr, pid_b, pid_h, hk, offs_k, mask_k, offs_v, mask_v, scale,
                stride_q_b, stride_q_h, stride_q_k, stride_k_b, stride_k_h, stride_k_k,
                stride_v_b, stride_v_h, stride_v_v, stride_beta_b, stride_beta_h, stride_g_b, stride_g_h, stride_g_k,
                GATE_PER_KEY: tl.constexpr, USE_QK_L2NORM: tl.constexpr):
    """The token's raw k (storage dtype), q (normalised, scaled) and k (normalised) [K], v [BLOCK_V], beta and g
    (scalar, or [K] per key channel), all float32 but the raw k."""
    k_raw, q_t, k_t = _load_qk(q_ptr, k_ptr, pid_b, hk, offs_k, mask_k, scale, stride_q_b, stride_q_h, stride_q_k,
                               stride_k_b, stride_k_h, stride_k_k, USE_QK_L2NORM)
    v_t = tl.load(v_ptr + pid_b * stride_v_b + pid_h * stride_v_h + offs_v * stride_v_v,
                  mask=mask_v, other=0.0).to(tl.float32)
    beta_t = tl.load(beta_ptr + pid_b * stride_beta_b + pid_h * stride_beta_h).to(tl.float32)
    g_t = _load_gate(g_ptr, pid_b, pid_h, offs_k, mask_k, stride_g_b, stride_g_h, stride_g_k, GATE_PER_KEY)
    return k_raw, q_t, k_t, v_t, beta_t, g_t


@triton.jit
def _token_update(s, k_t, v_t, beta_t, g_t, GATE_PER_KEY: tl.constexpr):
    """The state tile ``s`` [K, BLOCK_V] after one token of the gated delta rule: decay, then the corrected value
    ``d = beta (v - S^T k)`` written along k. Returns the new tile and d [BLOCK_V]."""
    decay = tl.exp(g_t)
    if GATE_PER_KEY:
        decay = decay[:, None]
    s = s * decay
    d_t = beta_t * (v_t - tl.sum(s * k_t[:, None], axis=0))
    return s + k_t[:, None] * d_t[None, :], d_t


@triton.jit
def _exact_fold(s, rk_base, rg_base, rv_base, rb_base, origin, count, ring_size, offs_k, mask_k, offs_v, mask_v,
                stride_rk_r, stride_rk_k, stride_rg_r, stride_rg_k, stride_rv_r, stride_rv_v, stride_rb_r,
                GATE_PER_KEY: tl.constexpr, USE_QK_L2NORM: tl.constexpr):
    """The checkpoint tile ``s`` [K, BLOCK_V] after the ``count`` records, each corrected value recomputed from its
    raw (k, v, beta, g) against the state it meets (the standard step, oldest record first): what the recurrence
    gives, whatever the ring's ``d`` (computed from a read copy) holds. The flush then applies the token
    (:func:`_token_update`)."""
    for i in range(0, count):
        slot_j = (origin + i) % ring_size
        k_j = tl.load(rk_base + slot_j * stride_rk_r + offs_k * stride_rk_k, mask=mask_k, other=0.0).to(tl.float32)
        if USE_QK_L2NORM:
            k_j = k_j * tl.rsqrt(tl.sum(k_j * k_j, axis=0) + 1e-6)
        v_j = tl.load(rv_base + slot_j * stride_rv_r + offs_v * stride_rv_v, mask=mask_v, other=0.0).to(tl.float32)
        beta_j = tl.load(rb_base + slot_j * stride_rb_r).to(tl.float32)
        if GATE_PER_KEY:
            g_j = tl.load(rg_base + slot_j * stride_rg_r + offs_k * stride_rg_k, mask=mask_k, other=0.0)
            s = s * tl.exp(g_j.to(tl.float32))[:, None]
        else:
            s = s * tl.exp(tl.load(rg_base + slot_j * stride_rg_r).to(tl.float32))
        d_j = beta_j * (v_j - tl.sum(s * k_j[:, None], axis=0))
        s += k_j[:, None] * d_j[None, :]
    return s


@triton.jit
def _substitute_row(inv, a_j, j, offs_r):
    """One step of the forward substitution for T = (I + A)^-1 (A strictly lower triangular): row j of ``inv`` [R, R]
    becomes T_j = e_j - sum_{i<j} A_ji T_i, from A's row ``a_j`` [R] (zero from column j on)."""
    t_j = tl.where(offs_r == j, 1.0, 0.0) - tl.sum(a_j[:, None] * inv, axis=0)
    return tl.where(offs_r[:, None] == j, t_j[None, :], inv)


@triton.jit
def _solved_chain(k_all, beta, g, count, BLOCK_R: tl.constexpr, FLUSH_PRECISION: tl.constexpr):
    """The part of :func:`_exact_fold_solved` that depends on the head alone, not on the value column: from the
    records' and the token's keys [R, K], betas and log decays [R] (rows past ``count`` 0), the unit lower-triangular
    inverse T = (I + A)^-1 [R, R], exp(G_j) [R], the fold's weights exp(G_n - G_j) [R] (0 past ``count``) and
    exp(G_n)."""
    offs_r = tl.arange(0, BLOCK_R)
    rows = offs_r[:, None]
    cum = tl.cumsum(g, axis=0)  # G_j, inclusive (rows past count add 0)
    total = tl.sum(tl.where(offs_r <= count, g, 0.0), axis=0)  # G_n
    gram = tl.dot(k_all, tl.trans(k_all), input_precision=FLUSH_PRECISION)  # [R, R]: k_j . k_i
    lower = (offs_r[None, :] < rows) & (rows <= count)
    a = tl.where(lower, beta[:, None] * tl.exp(tl.minimum(cum[:, None] - cum[None, :], 0.0)) * gram, 0.0)
    inv = tl.zeros([BLOCK_R, BLOCK_R], dtype=tl.float32)  # T = (I + A)^-1, row by row
    for j in range(0, count + 1):
        inv = _substitute_row(inv, tl.sum(tl.where(rows == j, a, 0.0), axis=0), j, offs_r)
    weights = tl.where(offs_r <= count, tl.exp(total - cum), 0.0)
    return inv, tl.exp(cum), weights, tl.exp(total)


@triton.jit
def _solved_chain_per_key(k_all, beta, g, count, BLOCK_R: tl.constexpr):
    """:func:`_solved_chain` for per-key gates (KDA): g [R, K]. A_ji = beta_j sum_k k_j[k] k_i[k] exp(G_j[k] -
    G_i[k]) (i < j) cannot be one Gram product, so each row j of A is taken with its own decays against the earlier
    rows inside the forward substitution (exponents masked to i < j, so no exp of a growing cumulative sum can
    overflow). Returns T diag(beta) [R, R] (the fold's d = T diag(beta) (V - (k o exp G) S0)), the keys decayed since
    the checkpoint k_j o exp(G_j) [R, K], the fold's decayed keys k_j o exp(G_n - G_j) [R, K] (0 past ``count``)
    and exp(G_n) [K]."""
    offs_r = tl.arange(0, BLOCK_R)
    rows = offs_r[:, None]
    cum = tl.cumsum(g, axis=0)  # [R, K]: G_j, inclusive (rows past count add 0)
    total = tl.sum(tl.where(rows <= count, g, 0.0), axis=0)  # [K]: G_n
    inv = tl.zeros([BLOCK_R, BLOCK_R], dtype=tl.float32)  # T = (I + A)^-1, row by row
    for j in range(0, count + 1):
        at_j = rows == j
        cum_j = tl.sum(tl.where(at_j, cum, 0.0), axis=0)  # [K]
        k_j = tl.sum(tl.where(at_j, k_all, 0.0), axis=0)  # [K]
        beta_j = tl.sum(tl.where(offs_r == j, beta, 0.0), axis=0)
        earlier = rows < j
        decayed = tl.where(earlier, k_all * tl.exp(tl.where(earlier, cum_j[None, :] - cum, 0.0)), 0.0)
        inv = _substitute_row(inv, beta_j * tl.sum(decayed * k_j[None, :], axis=1), j, offs_r)
    kg = k_all * tl.exp(cum)
    kw = tl.where(rows <= count, k_all * tl.exp(total[None, :] - cum), 0.0)
    return inv * beta[None, :], kg, kw, tl.exp(total)


@triton.jit
def _solved_operands(rk_base, rg_base, rb_base, origin, count, ring_size, offs_k, mask_k, k_t, beta_t, g_t,
                     stride_rk_r, stride_rk_k, stride_rg_r, stride_rg_k, stride_rb_r, USE_QK_L2NORM: tl.constexpr,
                     BLOCK_R: tl.constexpr, GATE_PER_KEY: tl.constexpr = False):
    """The ``count`` records and the token (row ``count``) as [R, ...] blocks: keys [R, K], betas [R] and log decays
    ([R, K] per key channel, else [R]); rows past ``count`` 0."""
    offs_r = tl.arange(0, BLOCK_R)
    is_token = offs_r == count
    valid = offs_r < count
    slots = (origin + offs_r) % ring_size
    k_r = _load_record_keys(rk_base, slots, valid, offs_k, mask_k, stride_rk_r, stride_rk_k, USE_QK_L2NORM)
    k_all = tl.where(is_token[:, None], k_t[None, :], k_r)  # [R, K]; rows past count 0
    beta = tl.where(is_token, beta_t, tl.load(rb_base + slots * stride_rb_r, mask=valid, other=0.0).to(tl.float32))
    if GATE_PER_KEY:
        g_r = tl.load(rg_base + slots[:, None] * stride_rg_r + offs_k[None, :] * stride_rg_k,
                      mask=valid[:, None] & mask_k[None, :], other=0.0).to(tl.float32)
        g = tl.where(is_token[:, None], g_t[None, :], g_r)
    else:
        g = tl.where(is_token, g_t, tl.load(rg_base + slots * stride_rg_r, mask=valid, other=0.0).to(tl.float32))
    return k_all, beta, g


@triton.jit
def _exact_fold_solved(s, rk_base, rg_base, rv_base, rb_base, origin, count, ring_size, offs_k, mask_k, offs_v,
                       mask_v, q_t, k_t, v_t, beta_t, g_t, stride_rk_r, stride_rk_k, stride_rg_r, stride_rg_k,
                       stride_rv_r, stride_rv_v, stride_rb_r, solve_base, USE_QK_L2NORM: tl.constexpr,
                       BLOCK_K: tl.constexpr, BLOCK_R: tl.constexpr, FLUSH_PRECISION: tl.constexpr,
                       SOLVE_GIVEN: tl.constexpr, GATE_PER_KEY: tl.constexpr):
    """:func:`_exact_fold` and the token's step, solved instead of stepped: the ``count`` records and the token (row
    ``count``) as one [R, K] key block, cumulative log decays G_j, and the corrected values of all at once from
    (I + A) D = diag(beta) (V - (K o exp G) S0), A_ji = beta_j sum_k k_j[k] k_i[k] exp(G_j[k] - G_i[k]) for i < j
    (the standard step's d_j = beta_j (v_j - S_{j-1}^T k_j) written out; a scalar gate's G_j is one number), then
    S = diag(exp(G_n)) S0 + sum_j (k_j o exp(G_n - G_j)) d_j^T. The chain over the records runs on [R, R] (the unit
    lower-triangular inverse by forward substitution, :func:`_solved_chain` / :func:`_solved_chain_per_key`; with
    ``SOLVE_GIVEN`` read from the per-head pre-launch's ``solve_base`` instead, which for per-key gates also holds
    the decayed keys, so the program then reads no record key or gate); the state tile meets three products (with
    the decayed keys, T x rhs and the fold), where the stepped fold makes 2 x count passes over it, each waiting on a
    reduction over K. Needs count + 1 <= BLOCK_R. Same values within float32 rounding."""
    offs_r = tl.arange(0, BLOCK_R)
    valid = offs_r < count
    v_all = tl.load(rv_base + ((origin + offs_r) % ring_size)[:, None] * stride_rv_r + offs_v[None, :] * stride_rv_v,
                    mask=valid[:, None] & mask_v[None, :], other=0.0).to(tl.float32)
    v_all = tl.where((offs_r == count)[:, None], v_t[None, :], v_all)  # [R, BLOCK_V]
    if GATE_PER_KEY:
        if SOLVE_GIVEN:
            m, kg, kw, exp_total = _given_solve_per_key(solve_base, BLOCK_K, BLOCK_R)
        else:
            k_all, beta, g = _solved_operands(rk_base, rg_base, rb_base, origin, count, ring_size, offs_k, mask_k,
                                              k_t, beta_t, g_t, stride_rk_r, stride_rk_k, stride_rg_r, stride_rg_k,
                                              stride_rb_r, USE_QK_L2NORM, BLOCK_R, GATE_PER_KEY)
            m, kg, kw, exp_total = _solved_chain_per_key(k_all, beta, g, count, BLOCK_R)
        ks = tl.dot(kg, s, input_precision=FLUSH_PRECISION)  # [R, BLOCK_V]: (k_j o exp G_j) . S0
        d = tl.dot(m, v_all - ks, input_precision=FLUSH_PRECISION)  # [R, BLOCK_V]; rows past count 0
        s = s * exp_total[:, None] + tl.dot(tl.trans(kw), d, input_precision=FLUSH_PRECISION)
    else:
        k_all, beta, g = _solved_operands(rk_base, rg_base, rb_base, origin, count, ring_size, offs_k, mask_k, k_t,
                                          beta_t, g_t, stride_rk_r, stride_rk_k, stride_rg_r, stride_rg_k,
                                          stride_rb_r, USE_QK_L2NORM, BLOCK_R)
        if SOLVE_GIVEN:
            inv, exp_cum, weights, exp_total = _given_solve(solve_base, BLOCK_R)
        else:
            inv, exp_cum, weights, exp_total = _solved_chain(k_all, beta, g, count, BLOCK_R, FLUSH_PRECISION)
        ks = tl.dot(k_all, s, input_precision=FLUSH_PRECISION)  # [R, BLOCK_V]: k_j . S0
        rhs = beta[:, None] * (v_all - exp_cum[:, None] * ks)
        d = tl.dot(inv, rhs, input_precision=FLUSH_PRECISION)  # [R, BLOCK_V]; rows past count 0
        s = s * exp_total + tl.dot(tl.trans(k_all * weights[:, None]), d, input_precision=FLUSH_PRECISION)
    return s, tl.sum(s * q_t[:, None], axis=0)


@triton.jit
def _solve_entry(solve_ptr, pid_b, heads, pid_h, BLOCK_K: tl.constexpr, BLOCK_R: tl.constexpr,
                 GATE_PER_KEY: tl.constexpr):
    """The address of one (row, value head)'s entry of ``_delta_solve_kernel``'s scratch (:func:`solve_entry_size`
    floats each)."""
    if GATE_PER_KEY:  # noqa: SIM108 (a constexpr branch: no conditional expressions in the kernel code)
        entry = BLOCK_R * BLOCK_R + 2 * BLOCK_R * BLOCK_K + BLOCK_K
    else:
        entry = BLOCK_R * BLOCK_R + 3 * BLOCK_R
    return solve_ptr + (pid_b * heads + pid_h) * entry


@triton.jit
def _store_solve(solve_base, inv, exp_cum, weights, exp_total, BLOCK_R: tl.constexpr):
    """An entry of the solve scratch (scalar gates): T [R, R], exp(G_j) [R], the fold's weights [R], exp(G_n) (first
    of an [R])."""
    offs_r = tl.arange(0, BLOCK_R)
    tl.store(solve_base + offs_r[:, None] * BLOCK_R + offs_r[None, :], inv)
    base = solve_base + BLOCK_R * BLOCK_R
    tl.store(base + offs_r, exp_cum)
    tl.store(base + BLOCK_R + offs_r, weights)
    tl.store(base + 2 * BLOCK_R + offs_r, tl.where(offs_r == 0, exp_total, 0.0))


@triton.jit
def _given_solve(solve_base, BLOCK_R: tl.constexpr):
    """An entry of the solve scratch as :func:`_store_solve` wrote it: (T, exp(G_j), the fold's weights, exp(G_n))."""
    offs_r = tl.arange(0, BLOCK_R)
    inv = tl.load(solve_base + offs_r[:, None] * BLOCK_R + offs_r[None, :])
    base = solve_base + BLOCK_R * BLOCK_R
    return inv, tl.load(base + offs_r), tl.load(base + BLOCK_R + offs_r), tl.load(base + 2 * BLOCK_R)


@triton.jit
def _store_solve_per_key(solve_base, m, kg, kw, exp_total, BLOCK_K: tl.constexpr, BLOCK_R: tl.constexpr):
    """An entry of the solve scratch (per-key gates): T diag(beta) [R, R], k o exp(G) [R, K], k o exp(G_n - G)
    [R, K], exp(G_n) [K]."""
    offs_r = tl.arange(0, BLOCK_R)
    offs_k = tl.arange(0, BLOCK_K)
    tl.store(solve_base + offs_r[:, None] * BLOCK_R + offs_r[None, :], m)
    keys = solve_base + BLOCK_R * BLOCK_R + offs_r[:, None] * BLOCK_K + offs_k[None, :]
    tl.store(keys, kg)
    tl.store(keys + BLOCK_R * BLOCK_K, kw)
    tl.store(solve_base + BLOCK_R * BLOCK_R + 2 * BLOCK_R * BLOCK_K + offs_k, exp_total)


@triton.jit
def _given_solve_per_key(solve_base, BLOCK_K: tl.constexpr, BLOCK_R: tl.constexpr):
    """An entry of the solve scratch as :func:`_store_solve_per_key` wrote it: (T diag(beta), k o exp(G),
    k o exp(G_n - G), exp(G_n))."""
    offs_r = tl.arange(0, BLOCK_R)
    offs_k = tl.arange(0, BLOCK_K)
    m = tl.load(solve_base + offs_r[:, None] * BLOCK_R + offs_r[None, :])
    keys = solve_base + BLOCK_R * BLOCK_R + offs_r[:, None] * BLOCK_K + offs_k[None, :]
    return (m, tl.load(keys), tl.load(keys + BLOCK_R * BLOCK_K),
            tl.load(solve_base + BLOCK_R * BLOCK_R + 2 * BLOCK_R * BLOCK_K + offs_k))


@triton.jit
def _load_record_keys(rk_base, slots, valid, offs_k, mask_k, stride_rk_r, stride_rk_k, USE_QK_L2NORM: tl.constexpr):
    """The record keys [R, K] at ring ``slots`` (rows not ``valid``: 0), float32, l2-normalised when asked."""
    k_r = tl.load(rk_base + slots[:, None] * stride_rk_r + offs_k[None, :] * stride_rk_k,
                  mask=valid[:, None] & mask_k[None, :], other=0.0).to(tl.float32)
    return _l2norm_rows(k_r, USE_QK_L2NORM)


@triton.jit
def _load_record_values(rd_base, slots, valid, offs_v, mask_v, stride_rd_r, stride_rd_v):
    """The records' corrected values d [R, BLOCK_V] at ring ``slots`` (rows not ``valid``: 0), float32."""
    return tl.load(rd_base + slots[:, None] * stride_rd_r + offs_v[None, :] * stride_rd_v,
                   mask=valid[:, None] & mask_v[None, :], other=0.0).to(tl.float32)


@triton.jit
def _record_decays(k_r, rg_base, origin, count, ring_size, offs_r, offs_k, valid, g_t, stride_rg_r, stride_rg_k,
                   K: tl.constexpr, GATE_PER_KEY: tl.constexpr):
    """Records in logical order, decayed through a token of log decay ``g_t`` after them (0: to the end of the
    records): the decay since the checkpoint exp(c) ([K] for a per-key gate, else a scalar) and each record's decay
    exp(s_j), as the decayed keys exp(s_j) * k_j [R, K] for a per-key gate or the weights exp(s_j) [R] for a scalar
    one (0 past ``count``); s_j = sum_{j<i<count} g_i + g_t as a reverse cumsum, c = g_0 + s_0."""
    slots_next = (origin + offs_r + 1) % ring_size
    valid_next = offs_r + 1 < count
    if GATE_PER_KEY:
        g_next = tl.load(rg_base + slots_next[:, None] * stride_rg_r + offs_k[None, :] * stride_rg_k,
                         mask=valid_next[:, None] & (offs_k < K)[None, :], other=0.0).to(tl.float32)
        g_first = tl.load(rg_base + origin * stride_rg_r + offs_k * stride_rg_k,
                          mask=offs_k < tl.where(count > 0, K, 0), other=0.0).to(tl.float32)
        seg = tl.cumsum(g_next, axis=0, reverse=True) + g_t  # [R, K]
        decay = tl.exp(g_first + tl.sum(tl.where(offs_r[:, None] == 0, seg, 0.0), axis=0))  # [K]
        return decay, tl.where(valid[:, None], k_r * tl.exp(seg), 0.0)
    else:
        g_next = tl.load(rg_base + slots_next * stride_rg_r, mask=valid_next, other=0.0).to(tl.float32)
        g_first = tl.load(rg_base + origin * stride_rg_r, mask=count > 0, other=0.0).to(tl.float32)
        seg = tl.cumsum(g_next, axis=0, reverse=True) + g_t  # [R]
        decay = tl.exp(g_first + tl.sum(tl.where(offs_r == 0, seg, 0.0), axis=0))
        return decay, tl.where(valid, tl.exp(seg), 0.0)


@triton.jit
def _record_weights(k_r, rg_base, origin, count, ring_size, offs_r, offs_k, valid, q_t, k_t, g_t, stride_rg_r,
                    stride_rg_k, K: tl.constexpr, GATE_PER_KEY: tl.constexpr):
    """:func:`_record_decays` through the current token, and the records' weights against its q and k [R]:
    (exp(s_j) * k_j) . q and . k_t. Returns (decay, decayed keys [R, K] or weights exp(s_j) [R], wq, wk)."""
    decay, w_r = _record_decays(k_r, rg_base, origin, count, ring_size, offs_r, offs_k, valid, g_t, stride_rg_r,
                                stride_rg_k, K, GATE_PER_KEY)
    if GATE_PER_KEY:
        return decay, w_r, tl.sum(w_r * q_t[None, :], axis=1), tl.sum(w_r * k_t[None, :], axis=1)
    else:
        return decay, w_r, w_r * tl.sum(k_r * q_t[None, :], axis=1), w_r * tl.sum(k_r * k_t[None, :], axis=1)


@triton.jit
def _newest_first_decays(rk_base, rg_base, origin, count, ring_size, offs_r, offs_k, mask_k, g_t, stride_rk_r,
                         stride_rk_k, stride_rg_r, stride_rg_k, K: tl.constexpr, USE_QK_L2NORM: tl.constexpr):
    """:func:`_record_decays` for per-key gates with the records read newest first: row m holds record
    count - 1 - m, so s_j (the gates of the records after j, and ``g_t``) is a forward scan over the rows, where the
    logical order takes a reverse one; Triton 3.6 lowers the reverse scan of an [R, K] tile whose rows span two
    lanes with about four times the warp shuffles (sm_90, the replay's per-head pre-launch: 970 shuffles a program,
    832 of them the scan). Returns (decay [K], the decayed keys exp(s_j) * k_j [R, K] newest first, 0 past
    ``count``); :func:`_newest_first_positions` puts a row back at its record's position."""
    valid = offs_r < count
    slots = (origin + tl.where(valid, count - 1 - offs_r, 0)) % ring_size  # row m: record count - 1 - m
    k_r = _load_record_keys(rk_base, slots, valid, offs_k, mask_k, stride_rk_r, stride_rk_k, USE_QK_L2NORM)
    # row m's s: g_t and the gates of rows 0 .. m - 1, i.e. an inclusive scan of the gates one row later
    newer = (offs_r >= 1) & valid
    g_newer = tl.load(rg_base + ((slots + 1) % ring_size)[:, None] * stride_rg_r + offs_k[None, :] * stride_rg_k,
                      mask=newer[:, None] & mask_k[None, :], other=0.0).to(tl.float32)
    seg = tl.cumsum(g_newer, axis=0) + g_t  # [R, K]
    g_first = tl.load(rg_base + origin * stride_rg_r + offs_k * stride_rg_k,
                      mask=offs_k < tl.where(count > 0, K, 0), other=0.0).to(tl.float32)
    # c = g_0 + s_0, s_0 on the oldest record's row (count - 1; with no records row 0's, g_t alone)
    oldest = tl.maximum(count - 1, 0)
    decay = tl.exp(g_first + tl.sum(tl.where(offs_r[:, None] == oldest, seg, 0.0), axis=0))
    return decay, tl.where(valid[:, None], k_r * tl.exp(seg), 0.0)


@triton.jit
def _newest_first_positions(offs_r, count):
    """The logical position of each newest-first row (:func:`_newest_first_decays`): count - 1 - m for a record, the
    row itself past ``count`` (a permutation of the rows, so a store of every row writes each position once)."""
    return tl.where(offs_r < count, count - 1 - offs_r, offs_r)


@triton.jit
def _checkpoint_products(s0, q_t, k_t, decay, GATE_PER_KEY: tl.constexpr):
    """S0^T (exp(c) q) and S0^T (exp(c) k) [BLOCK_V] from the whole checkpoint tile."""
    if GATE_PER_KEY:
        pq = tl.sum(s0 * (decay * q_t)[:, None], axis=0)
        pk = tl.sum(s0 * (decay * k_t)[:, None], axis=0)
    else:
        pq = decay * tl.sum(s0 * q_t[:, None], axis=0)
        pk = decay * tl.sum(s0 * k_t[:, None], axis=0)
    return pq, pk


@triton.jit
def _token_output(pq, pk, wq, wk, d_r, q_t, k_t, v_t, beta_t):
    """The token's corrected value d_t and output o [BLOCK_V] from the checkpoint's products and the records'
    weighted values (S_{t-1}^T k = pk + sum_j wk_j d_j, likewise for q)."""
    pq += tl.sum(wq[:, None] * d_r, axis=0)
    pk += tl.sum(wk[:, None] * d_r, axis=0)
    d_t = beta_t * (v_t - pk)
    return d_t, pq + tl.sum(k_t * q_t, axis=0) * d_t


@triton.jit
def _given_weights(w_base, offs_k, offs_r, BLOCK_K: tl.constexpr, BLOCK_R: tl.constexpr, GATE_PER_KEY: tl.constexpr):
    """One (row, value head)'s entry of the per-head pre-launch (``_kda_weights_kernel``): the decay since the
    checkpoint ([K] for a per-key gate, else a scalar) and the records' weights against q and k [R]."""
    if GATE_PER_KEY:  # noqa: SIM108 (a constexpr branch: no conditional expressions in the kernel code)
        decay = tl.load(w_base + offs_k)
    else:
        decay = tl.load(w_base)  # a scalar gate's decay fills every slot
    return decay, tl.load(w_base + BLOCK_K + offs_r), tl.load(w_base + BLOCK_K + BLOCK_R + offs_r)


@triton.jit
def _append_record(rd_base, rg_base, rk_base, slot, d_t, g_t, k_raw, offs_v, mask_v, offs_k, mask_k, first_tile,
                   pid_h, kv_ratio, stride_rd_r, stride_rd_v, stride_rg_r, stride_rg_k, stride_rk_r, stride_rk_k,
                   GATE_PER_KEY: tl.constexpr):
    """Append the token's record at ring ``slot``: d by every V tile (``mask_v``), g by the ``first_tile`` of value
    head ``pid_h``, the raw key by the ``first_tile`` of the first value head of its key group."""
    tl.store(rd_base + slot * stride_rd_r + offs_v * stride_rd_v, d_t.to(rd_base.dtype.element_ty), mask=mask_v)
    if first_tile:
        if GATE_PER_KEY:
            tl.store(rg_base + slot * stride_rg_r + offs_k * stride_rg_k, g_t.to(rg_base.dtype.element_ty),
                     mask=mask_k)
        else:
            tl.store(rg_base + slot * stride_rg_r, g_t.to(rg_base.dtype.element_ty))
        if pid_h % kv_ratio == 0:
            tl.store(rk_base + slot * stride_rk_r + offs_k * stride_rk_k, k_raw.to(rk_base.dtype.element_ty),
                     mask=mask_k)


@triton.jit
def _decayed_with_token(s, decay, k_t, d_t, GATE_PER_KEY: tl.constexpr):
    """diag(exp(c)) S + k_t d_t^T: a flush's checkpoint before the records' sum is added."""
    if GATE_PER_KEY:
        return s * decay[:, None] + k_t[:, None] * d_t[None, :]
    else:
        return s * decay + k_t[:, None] * d_t[None, :]


@triton.jit
def _load_chunk(s_base, scale_base, tensor_scale_base, offs_c, offs_v, mask_v, v_start, K, V, stride_s_k, stride_s_v,
                stride_scale_k, stride_scale_v, READ_FORMAT: tl.constexpr, BLOCK_V: tl.constexpr,
                CODE_VECTOR: tl.constexpr = 0):
    """Rows ``offs_c`` of a state tile [len(offs_c), BLOCK_V] (0 past K / V): raw for the fp32 checkpoint and an fp8
    copy's codes (their scales are folded elsewhere; at most ``CODE_VECTOR`` to a vector, :func:`code_offsets`),
    decoded for an nvfp4 copy (:func:`load_read_tile` on bases already offset to the row and head)."""
    mask = (offs_c < K)[:, None] & mask_v[None, :]
    if READ_FORMAT == "fp8":
        return tl.load(s_base + offs_c[:, None] * stride_s_k + code_offsets(offs_v, CODE_VECTOR)[None, :] * stride_s_v,
                       mask=mask, other=0.0)
    elif READ_FORMAT == "fp32":
        return tl.load(s_base + offs_c[:, None] * stride_s_k + offs_v[None, :] * stride_s_v, mask=mask, other=0.0)
    else:
        return load_read_tile(s_base, scale_base, tensor_scale_base, 0, 0, offs_c, offs_v, mask, offs_c < K, v_start,
                              V, 0, 0, stride_s_k, stride_s_v, 0, 0, stride_scale_k, stride_scale_v, 0, READ_FORMAT,
                              BLOCK_V, False)


@triton.jit
def _scaled_qk_chunk(q_base, k_base, decay_base, offs_c, K, q_factor, k_factor, stride_q_k, stride_k_k,
                     GATE_PER_KEY: tl.constexpr):
    """Rows ``offs_c`` of q and k (raw, 0 past K) times their normalising factors and, for a per-key gate, the
    decays."""
    mask_c = offs_c < K
    q_c = tl.load(q_base + offs_c * stride_q_k, mask=mask_c, other=0.0).to(tl.float32) * q_factor
    k_c = tl.load(k_base + offs_c * stride_k_k, mask=mask_c, other=0.0).to(tl.float32) * k_factor
    if GATE_PER_KEY:
        decay_c = tl.load(decay_base + offs_c, mask=mask_c, other=0.0)
        q_c = q_c * decay_c
        k_c = k_c * decay_c
    return q_c, k_c


@triton.jit
def _chunked_checkpoint_products(s_base, q_base, k_base, decay_base, row_scale_base, tensor_scale_base, offs_v, mask_v,
                                 v_start, decay, scale, K, V, stride_s_k, stride_s_v, stride_q_k, stride_k_k,
                                 stride_row_scale, stride_scale_v,
                                 GATE_PER_KEY: tl.constexpr, USE_QK_L2NORM: tl.constexpr, BLOCK_K: tl.constexpr,
                                 BLOCK_V: tl.constexpr, CHUNK_K: tl.constexpr, READ_FORMAT: tl.constexpr,
                                 CODE_VECTOR: tl.constexpr = 0):
    """S0^T (exp(c) q) and S0^T (exp(c) k) [BLOCK_V] with the checkpoint tile streamed CHUNK_K rows at a time
    instead of held whole in registers: a replaying program never writes the checkpoint, so these two products are
    all it needs of it. Accumulators of [CHUNK_K, BLOCK_V] elements, reduced over K once at the end; each chunk's
    load is issued one chunk ahead. The chunks of q and k are read again (raw) and scaled by the factors the whole
    vectors are normalised with; per-key decays come from the weights pre-launch (``decay_base``, [BLOCK_K]), a
    scalar gate's ``decay`` scales the sums. READ_FORMAT "fp8": ``s_base`` / its strides are the read copy's E4M3
    codes and ``row_scale_base`` its per-row (per K) float32 scales, folded into the chunk's q and k (S0 = codes x
    row scale, so S0^T q = codes^T (scale * q)): the decode is the hardware conversion alone, and a chunk costs a
    quarter of the fp32 checkpoint's bytes. "nvfp4_pairs": an nvfp4 copy's packed codes (``s_base``), block scales
    (``row_scale_base``, strides over K and V) and the batch row's tensor scale; the tensor scale folds into the
    factors and each byte's block scale into its row's q and k (one product per byte, not two per element), and the
    even and odd elements (low and high nibbles) keep accumulators of their own, interleaved once at the end, so a
    chunk is never shuffled into element order. "nvfp4": each chunk decoded as it is loaded (:func:`_load_chunk`)."""
    offs_k = tl.arange(0, BLOCK_K)
    mask_k = offs_k < K
    q_factor = scale
    k_factor = 1.0
    if USE_QK_L2NORM:
        q_all = tl.load(q_base + offs_k * stride_q_k, mask=mask_k, other=0.0).to(tl.float32)
        k_all = tl.load(k_base + offs_k * stride_k_k, mask=mask_k, other=0.0).to(tl.float32)
        q_factor = scale * tl.rsqrt(tl.sum(q_all * q_all, axis=0) + 1e-6)
        k_factor = tl.rsqrt(tl.sum(k_all * k_all, axis=0) + 1e-6)
    if READ_FORMAT == "nvfp4_pairs":
        tensor_scale = tl.load(tensor_scale_base) * E2M1_PAIR_UNSCALE  # (the pair decode's 2^-14, undone exactly)
        q_factor = q_factor * tensor_scale
        k_factor = k_factor * tensor_scale
        # by scale block: [CHUNK_K, BLOCK_V // 16, 8] bytes, one block scale per 8 bytes (a load and a product
        # each, not one per byte); v_start is a multiple of BLOCK_V, so of 16
        tl.static_assert(BLOCK_V >= 16, "an nvfp4 copy is streamed by 16-element scale blocks")
        offs_b = v_start // 16 + tl.arange(0, BLOCK_V // 16)
        acc_q_even = tl.zeros([CHUNK_K, BLOCK_V // 16, 8], dtype=tl.float32)
        acc_q_odd = tl.zeros([CHUNK_K, BLOCK_V // 16, 8], dtype=tl.float32)
        acc_k_even = tl.zeros([CHUNK_K, BLOCK_V // 16, 8], dtype=tl.float32)
        acc_k_odd = tl.zeros([CHUNK_K, BLOCK_V // 16, 8], dtype=tl.float32)
        byte_next, scale_next = load_nvfp4_blocks(s_base, row_scale_base, tl.arange(0, CHUNK_K),
                                                  tl.arange(0, CHUNK_K) < K, offs_b, V, stride_s_k, stride_s_v,
                                                  stride_row_scale, stride_scale_v)
        for k0 in range(0, BLOCK_K, CHUNK_K):
            byte = byte_next.to(tl.int32)
            block_scale = scale_next.to(tl.float32)
            offs_next = k0 + CHUNK_K + tl.arange(0, CHUNK_K)
            byte_next, scale_next = load_nvfp4_blocks(s_base, row_scale_base, offs_next, offs_next < K, offs_b, V,
                                                      stride_s_k, stride_s_v, stride_row_scale, stride_scale_v)
            q_c, k_c = _scaled_qk_chunk(q_base, k_base, decay_base, k0 + tl.arange(0, CHUNK_K), K, q_factor,
                                        k_factor, stride_q_k, stride_k_k, GATE_PER_KEY)
            q_s = (q_c[:, None] * block_scale)[:, :, None]
            k_s = (k_c[:, None] * block_scale)[:, :, None]
            even, odd = e2m1_pair_to_float(byte)
            acc_q_even += even * q_s
            acc_q_odd += odd * q_s
            acc_k_even += even * k_s
            acc_k_odd += odd * k_s
        pq_even = tl.reshape(tl.sum(acc_q_even, axis=0), [BLOCK_V // 2])
        pq_odd = tl.reshape(tl.sum(acc_q_odd, axis=0), [BLOCK_V // 2])
        pk_even = tl.reshape(tl.sum(acc_k_even, axis=0), [BLOCK_V // 2])
        pk_odd = tl.reshape(tl.sum(acc_k_odd, axis=0), [BLOCK_V // 2])
        pq = tl.reshape(tl.join(pq_even, pq_odd), [BLOCK_V])
        pk = tl.reshape(tl.join(pk_even, pk_odd), [BLOCK_V])
    else:
        acc_q = tl.zeros([CHUNK_K, BLOCK_V], dtype=tl.float32)
        acc_k = tl.zeros([CHUNK_K, BLOCK_V], dtype=tl.float32)
        s_next = _load_chunk(s_base, row_scale_base, tensor_scale_base, tl.arange(0, CHUNK_K), offs_v, mask_v, v_start,
                             K, V, stride_s_k, stride_s_v, stride_row_scale, stride_scale_v, READ_FORMAT, BLOCK_V,
                             CODE_VECTOR)
        for k0 in range(0, BLOCK_K, CHUNK_K):
            # the next chunk's load is issued before this chunk's arithmetic (two chunks live: a double buffer)
            s_c = s_next.to(tl.float32)
            s_next = _load_chunk(s_base, row_scale_base, tensor_scale_base, k0 + CHUNK_K + tl.arange(0, CHUNK_K),
                                 offs_v, mask_v, v_start, K, V, stride_s_k, stride_s_v, stride_row_scale,
                                 stride_scale_v, READ_FORMAT, BLOCK_V, CODE_VECTOR)
            offs_c = k0 + tl.arange(0, CHUNK_K)
            q_c, k_c = _scaled_qk_chunk(q_base, k_base, decay_base, offs_c, K, q_factor, k_factor, stride_q_k,
                                        stride_k_k, GATE_PER_KEY)
            if READ_FORMAT == "fp8":
                row_scale = tl.load(row_scale_base + offs_c * stride_row_scale, mask=offs_c < K, other=0.0)
                q_c = q_c * row_scale
                k_c = k_c * row_scale
            acc_q += s_c * q_c[:, None]
            acc_k += s_c * k_c[:, None]
        pq = tl.sum(acc_q, axis=0)
        pk = tl.sum(acc_k, axis=0)
    if not GATE_PER_KEY:
        pq = decay * pq
        pk = decay * pk
    return pq, pk


@triton.jit
def _head_positions(origin_ptr, count_ptr, row, stride_origin, stride_count, origin_host, count_host,
                    DEVICE_POSITIONS: tl.constexpr):
    """A per-head pre-launch's (origin, count) of batch ``row``: the host's, or read on the device (the count's low
    16 bits, as the step's launches read it before the count launch advances it)."""
    if DEVICE_POSITIONS:
        origin = tl.load(origin_ptr + row * stride_origin)
        count = tl.load(count_ptr + row * stride_count, cache_modifier=".cg") & 0xFFFF
    else:
        origin = origin_host
        count = count_host
    return origin, count


@triton.jit(do_not_specialize=["origin_host", "count_host"])  # as the replay step below
def _kda_weights_kernel(
    ring_k_ptr, ring_g_ptr, origin_ptr, count_ptr, q_ptr, k_ptr, g_ptr, weights_ptr,
    K: tl.constexpr, ring_size, kv_ratio, scale, origin_host, count_host,
    stride_rk_b, stride_rk_r: tl.constexpr, stride_rk_h: tl.constexpr, stride_rk_k: tl.constexpr,
    stride_rg_b, stride_rg_r: tl.constexpr, stride_rg_h: tl.constexpr, stride_rg_k: tl.constexpr,
    stride_origin, stride_count,
    stride_q_b, stride_q_h: tl.constexpr, stride_q_k: tl.constexpr,
    stride_k_b, stride_k_h: tl.constexpr, stride_k_k: tl.constexpr,
    stride_g_b, stride_g_h: tl.constexpr, stride_g_k: tl.constexpr,
    DEVICE_POSITIONS: tl.constexpr,
    USE_QK_L2NORM: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_R: tl.constexpr,
    GATE_PER_KEY: tl.constexpr,
    NEWEST_FIRST: tl.constexpr = False,  # per-key gates: the records read newest first (_newest_first_decays)
):
    """A head's replay quantities that do not depend on the value column, once per (row, value head): the decay
    since the checkpoint exp(c) ([BLOCK_K]; a scalar gate's in every slot) and the records' weights
    (exp(s_j) * k_j) . q and . k_t [BLOCK_R] each, into ``weights`` [B, Hv, BLOCK_K + 2 BLOCK_R]. The replay
    kernel's V tiles of one head then read them instead of each recomputing them (for per-key gates the [R, K]
    decays, their exponentials and registers; for a scalar gate the records' reductions over K). Grid (B, Hv);
    positions as the replay kernel reads them (the counts before the step)."""
    pid_b = tl.program_id(0).to(tl.int64)
    pid_h = tl.program_id(1)
    hk = pid_h // kv_ratio
    offs_k = tl.arange(0, BLOCK_K)
    offs_r = tl.arange(0, BLOCK_R)
    mask_k = offs_k < K
    origin, count = _head_positions(origin_ptr, count_ptr, pid_b, stride_origin, stride_count, origin_host,
                                    count_host, DEVICE_POSITIONS)
    _, q_t, k_t = _load_qk(q_ptr, k_ptr, pid_b, hk, offs_k, mask_k, scale, stride_q_b, stride_q_h, stride_q_k,
                           stride_k_b, stride_k_h, stride_k_k, USE_QK_L2NORM)
    g_t = _load_gate(g_ptr, pid_b, pid_h, offs_k, mask_k, stride_g_b, stride_g_h, stride_g_k, GATE_PER_KEY)
    rk_base = ring_k_ptr + pid_b * stride_rk_b + hk * stride_rk_h
    rg_base = ring_g_ptr + pid_b * stride_rg_b + pid_h * stride_rg_h
    if NEWEST_FIRST:  # (per-key gates) row m holds record count - 1 - m
        decay, w_r = _newest_first_decays(rk_base, rg_base, origin, count, ring_size, offs_r, offs_k, mask_k, g_t,
                                          stride_rk_r, stride_rk_k, stride_rg_r, stride_rg_k, K, USE_QK_L2NORM)
        wq, wk = tl.sum(w_r * q_t[None, :], axis=1), tl.sum(w_r * k_t[None, :], axis=1)
        positions = _newest_first_positions(offs_r, count)
    else:
        valid = offs_r < count
        k_r = _load_record_keys(rk_base, (origin + offs_r) % ring_size, valid, offs_k, mask_k, stride_rk_r,
                                stride_rk_k, USE_QK_L2NORM)
        decay, _, wq, wk = _record_weights(k_r, rg_base, origin, count, ring_size, offs_r, offs_k, valid, q_t, k_t,
                                           g_t, stride_rg_r, stride_rg_k, K, GATE_PER_KEY)
        positions = offs_r
    if not GATE_PER_KEY:
        decay = decay + tl.zeros([BLOCK_K], dtype=tl.float32)  # a scalar gate's decay in every slot
    w_base = weights_ptr + (pid_b * tl.num_programs(1) + pid_h) * (BLOCK_K + 2 * BLOCK_R)
    tl.store(w_base + offs_k, decay)
    tl.store(w_base + BLOCK_K + positions, wq)  # in logical order (0 past count) whichever order computed them
    tl.store(w_base + BLOCK_K + BLOCK_R + positions, wk)


def solve_entry_size(block_r: int, block_k: int = 0) -> int:
    """Floats per (row, value head) of the solved exact fold's pre-launch (``_delta_solve_kernel``). Scalar gates
    (``block_k`` 0): T [R, R], exp(G_j) [R], the fold's weights [R], exp(G_n) (padded to a third [R]). Per-key gates
    (``block_k`` the key tile): T diag(beta) [R, R], the keys decayed since the checkpoint and to the flush [R, K]
    each, exp(G_n) [K]."""
    if block_k:
        return block_r * block_r + 2 * block_r * block_k + block_k
    return block_r * block_r + 3 * block_r


@triton.jit(do_not_specialize=["origin_host", "count_host"])  # as the replay step below
def _delta_solve_kernel(
    ring_k_ptr, ring_g_ptr, ring_beta_ptr, origin_ptr, count_ptr, k_ptr, beta_ptr, g_ptr, solve_ptr,
    K: tl.constexpr, ring_size, kv_ratio, origin_host, count_host,
    stride_rk_b, stride_rk_r: tl.constexpr, stride_rk_h: tl.constexpr, stride_rk_k: tl.constexpr,
    stride_rg_b, stride_rg_r: tl.constexpr, stride_rg_h: tl.constexpr, stride_rg_k: tl.constexpr,
    stride_rb_b, stride_rb_r: tl.constexpr, stride_rb_h: tl.constexpr,
    stride_origin, stride_count,
    stride_k_b, stride_k_h: tl.constexpr, stride_k_k: tl.constexpr,
    stride_beta_b, stride_beta_h: tl.constexpr,
    stride_g_b, stride_g_h: tl.constexpr, stride_g_k: tl.constexpr,
    DEVICE_POSITIONS: tl.constexpr,
    USE_QK_L2NORM: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_R: tl.constexpr,
    FLUSH_PRECISION: tl.constexpr,
    GATE_PER_KEY: tl.constexpr = False,
):
    """The solved exact fold's chain over the records (:func:`_solved_chain`, per-key gates
    :func:`_solved_chain_per_key`), once per (row, value head) instead of once per V tile, into ``solve`` [B, Hv,
    solve_entry_size(BLOCK_R, BLOCK_K if GATE_PER_KEY else 0)], which the flush programs of that head read
    (``SOLVE_GIVEN``). Grid (B, Hv); positions as the flush reads them (the counts before the step); a row not due to
    flush computes an entry nobody reads."""
    pid_b = tl.program_id(0).to(tl.int64)
    pid_h = tl.program_id(1)
    hk = pid_h // kv_ratio
    offs_k = tl.arange(0, BLOCK_K)
    mask_k = offs_k < K
    origin, count = _head_positions(origin_ptr, count_ptr, pid_b, stride_origin, stride_count, origin_host,
                                    count_host, DEVICE_POSITIONS)
    _, k_t = _load_key(k_ptr, pid_b, hk, offs_k, mask_k, stride_k_b, stride_k_h, stride_k_k, USE_QK_L2NORM)
    beta_t = tl.load(beta_ptr + pid_b * stride_beta_b + pid_h * stride_beta_h).to(tl.float32)
    g_t = _load_gate(g_ptr, pid_b, pid_h, offs_k, mask_k, stride_g_b, stride_g_h, stride_g_k, GATE_PER_KEY)
    k_all, beta, g = _solved_operands(
        ring_k_ptr + pid_b * stride_rk_b + hk * stride_rk_h, ring_g_ptr + pid_b * stride_rg_b + pid_h * stride_rg_h,
        ring_beta_ptr + pid_b * stride_rb_b + pid_h * stride_rb_h, origin, count, ring_size, offs_k, mask_k, k_t,
        beta_t, g_t, stride_rk_r, stride_rk_k, stride_rg_r, stride_rg_k, stride_rb_r, USE_QK_L2NORM, BLOCK_R,
        GATE_PER_KEY)
    entry = _solve_entry(solve_ptr, pid_b, tl.num_programs(1), pid_h, BLOCK_K, BLOCK_R, GATE_PER_KEY)
    if GATE_PER_KEY:
        m, kg, kw, exp_total = _solved_chain_per_key(k_all, beta, g, count, BLOCK_R)
        _store_solve_per_key(entry, m, kg, kw, exp_total, BLOCK_K, BLOCK_R)
    else:
        inv, exp_cum, weights, exp_total = _solved_chain(k_all, beta, g, count, BLOCK_R, FLUSH_PRECISION)
        _store_solve(entry, inv, exp_cum, weights, exp_total, BLOCK_R)


# The host's positions change every step: not specialised on (a value of 1 or a multiple of 16 would each
# compile another variant, seconds apiece on a fresh H200, during the first periods of a decode).
@triton.jit(do_not_specialize=["origin_host", "count_host"])
def _delta_replay_step_kernel(
    # pointers
    state_ptr, ring_k_ptr, ring_d_ptr, ring_g_ptr, origin_ptr, count_ptr,
    q_ptr, k_ptr, v_ptr, beta_ptr, g_ptr, o_ptr,
    rc_values_ptr, rc_scales_ptr, rc_tensor_scale_ptr,  # the read copy (READ_FORMAT fp8 / nvfp4)
    ring_v_ptr, ring_beta_ptr,  # raw v and beta records (EXACT_FOLD)
    weights_ptr,  # per (row, value head): exp(c) [BLOCK_K], then the records' q and k weights [BLOCK_R] each
    solve_ptr,  # SOLVE_GIVEN: per (row, value head), the solved exact fold's chain (_delta_solve_kernel)
    amax_ptr,  # FLUSH_AMAX: int32 [B], each flushing row's max |new checkpoint| (for the nvfp4 re-encode)
    # sizes; the host's positions (PHASE 1/2: every row at origin_host / count_host)
    K: tl.constexpr, V: tl.constexpr, ring_size, kv_ratio, scale, origin_host, count_host,
    # strides (all but the batch strides are compile-time constants: tile addresses become immediate offsets)
    stride_s_b, stride_s_h: tl.constexpr, stride_s_k: tl.constexpr, stride_s_v: tl.constexpr,
    stride_rk_b, stride_rk_r: tl.constexpr, stride_rk_h: tl.constexpr, stride_rk_k: tl.constexpr,
    stride_rd_b, stride_rd_r: tl.constexpr, stride_rd_h: tl.constexpr, stride_rd_v: tl.constexpr,
    stride_rg_b, stride_rg_r: tl.constexpr, stride_rg_h: tl.constexpr, stride_rg_k: tl.constexpr,
    stride_origin, stride_count,
    stride_q_b, stride_q_h: tl.constexpr, stride_q_k: tl.constexpr,
    stride_k_b, stride_k_h: tl.constexpr, stride_k_k: tl.constexpr,
    stride_v_b, stride_v_h: tl.constexpr, stride_v_v: tl.constexpr,
    stride_beta_b, stride_beta_h: tl.constexpr,
    stride_g_b, stride_g_h: tl.constexpr, stride_g_k: tl.constexpr,
    stride_o_b, stride_o_h: tl.constexpr, stride_o_v: tl.constexpr,
    stride_rcv_b, stride_rcv_h: tl.constexpr, stride_rcv_k: tl.constexpr, stride_rcv_v: tl.constexpr,
    stride_rcs_b, stride_rcs_h: tl.constexpr, stride_rcs_k: tl.constexpr, stride_rcs_v: tl.constexpr,
    stride_rct_b,
    stride_rv_b, stride_rv_r: tl.constexpr, stride_rv_h: tl.constexpr, stride_rv_v: tl.constexpr,
    stride_rb_b, stride_rb_r: tl.constexpr, stride_rb_h: tl.constexpr,
    # meta
    BUFFER_LEN: tl.constexpr,
    # 0: per row, read on the device; 1: every row replays; 2: every row flushes; 3 / 4: per row, read on the
    # device, flushing rows only / replaying rows only (one device-phase step as two launches, 3 then 4)
    PHASE: tl.constexpr,
    GATE_PER_KEY: tl.constexpr,
    USE_QK_L2NORM: tl.constexpr,
    TICKET: tl.constexpr,
    RING_PHYSICAL: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_R: tl.constexpr,
    FLUSH_DOT: tl.constexpr,
    FLUSH_PRECISION: tl.constexpr,
    READ_FORMAT: tl.constexpr,  # what replay reads: "fp32" the checkpoint, "fp8" / "nvfp4" the read copy
    EXACT_FOLD: tl.constexpr,  # flushes recompute d from the raw v / beta records; replays append them
    PREFETCH_STATE: tl.constexpr,  # PHASE 4 with READ_FORMAT "fp32" only: load the tile before the phase test
    FLUSH_READS_COPY: tl.constexpr,  # PHASE 0 / 2 / 3 with a read copy: a flushing row's o from the copy, as replays
    WEIGHTS_GIVEN: tl.constexpr,  # decay and record weights from _kda_weights_kernel (_replay_step's `weighted`)
    EXACT_SOLVE: tl.constexpr = False,  # EXACT_FOLD: the records' d solved at once (_exact_fold_solved)
    CHUNK_K: tl.constexpr = 0,  # PHASE 1 / 4, any READ_FORMAT: the checkpoint (or the copy) streamed CHUNK_K rows
    # of K at a time (0: the whole tile)
    FLUSH_AMAX: tl.constexpr = False,  # PHASE 0 / 2 / 3: flushes fold max |new checkpoint| into amax_ptr[b]
    # an fp8 copy's decoded tile takes one scale load per row instead of one per element (_flush_scale_per_row:
    # the host-positions flush-only launch reading the copy for its outputs)
    COPY_SCALE_PER_ROW: tl.constexpr = False,
    # PHASE 2 / 3 reading an fp8 copy: its codes loaded at most CODE_VECTOR to a vector (0: the compiler's widest);
    # see _replay_step's _flush_code_vector
    CODE_VECTOR: tl.constexpr = 0,
    # EXACT_FOLD (not solved): the token's q, k, v, beta, g read again after the records' loop instead of held
    # through it (registers; see _replay_step's _reload_token)
    RELOAD_TOKEN: tl.constexpr = False,
    # PHASE 1 / 4 with CHUNK_K: the records' values loaded after the streamed products instead of before (see
    # _late_records)
    LATE_RECORDS: tl.constexpr = False,
    # EXACT_SOLVE, PHASE 2 / 3: the chain over the records from _delta_solve_kernel, in solve_ptr (see _solve_weights)
    SOLVE_GIVEN: tl.constexpr = False,
):
    pid_v = tl.program_id(0)
    pid_b = tl.program_id(1).to(tl.int64)
    pid_h = tl.program_id(2)
    hk = pid_h // kv_ratio

    offs_k = tl.arange(0, BLOCK_K)
    offs_v = pid_v * BLOCK_V + tl.arange(0, BLOCK_V)
    mask_k = offs_k < K
    mask_v = offs_v < V
    mask_kv = mask_k[:, None] & mask_v[None, :]

    # Row phase (see the module docstring): a plain read of count[b] (low 16 bits; the high bits count the tickets
    # already taken), then this program's ticket. The ticket's value is only needed at the end, so neither read
    # waits for the other; the read is ordered before the ticket (same address), which is ordered before the
    # final exchange, so every program of the row sees the old count.
    if PHASE == 0 or PHASE == 3 or PHASE == 4:
        origin = tl.load(origin_ptr + pid_b * stride_origin)
        count = tl.load(count_ptr + pid_b * stride_count, cache_modifier=".cg") & 0xFFFF
        if TICKET and PHASE != 3:  # relaxed: nothing but count[b] itself is communicated between the programs
            ticket = tl.atomic_add(count_ptr + pid_b * stride_count, 1 << 16, sem="relaxed") >> 16
        due = count + 1 >= BUFFER_LEN
    else:
        origin = origin_host
        count = count_host
        due = PHASE == 2
    # PHASE 3 / 4 (a device-phase step split in two launches, flush then replay): each program of a row whose
    # phase is the other launch's skips everything; the replay launch alone updates count (see _replay_step).
    # (Triton 3.6 turns any bool assigned to a variable into a tensor: `if run` and `if is_flush` are runtime branches
    # that test a constant where the phase is known at compile time, and the compiler folds the dead branch away;
    # so every value used after them is defined before them.)
    if PHASE == 3:
        run = due
        is_flush = True
    elif PHASE == 4:
        run = count + 1 < BUFFER_LEN
        is_flush = False
    else:
        run = True
        is_flush = due

    # The one large read: the checkpoint tile. PREFETCH_STATE (replay launch of a split step): issued before the
    # row's phase is known, so that it does not wait a round trip for count[b]; a flushing row's tile is then read
    # for nothing, once per L steps.
    state_ptrs = (state_ptr + pid_b * stride_s_b + pid_h * stride_s_h
                  + offs_k[:, None] * stride_s_k + offs_v[None, :] * stride_s_v)
    if PREFETCH_STATE:
        s_pre = tl.load(state_ptrs, mask=mask_kv, other=0.0)
    offs_r = tl.arange(0, BLOCK_R)
    rk_base = ring_k_ptr + pid_b * stride_rk_b + hk * stride_rk_h
    rd_base = ring_d_ptr + pid_b * stride_rd_b + pid_h * stride_rd_h
    rg_base = ring_g_ptr + pid_b * stride_rg_b + pid_h * stride_rg_h
    if run:
        if CHUNK_K > 0:  # streamed below (_chunked_checkpoint_products); this tile only types the dead flush code
            s0 = tl.zeros([BLOCK_K, BLOCK_V], dtype=tl.float32)
        elif PREFETCH_STATE:
            s0 = s_pre.to(tl.float32)
        elif READ_FORMAT == "fp32" or ((PHASE == 2 or PHASE == 3) and not FLUSH_READS_COPY):
            s0 = tl.load(state_ptrs, mask=mask_kv, other=0.0).to(tl.float32)
        else:
            # Replaying rows read the decoded read copy (S0^T q and S0^T k come from it), flushing rows the
            # checkpoint: masked loads, so only one of the two costs bandwidth.
            if PHASE == 0 and not FLUSH_READS_COPY:  # (row masks from comparisons on the tile offsets: a tensor
                # mask & a scalar bool is not a valid mask under TRITON_INTERPRET=1)
                v_flush = tl.where(is_flush, V, 0)  # value columns of the checkpoint to read: all or none
                s0 = tl.load(state_ptrs, mask=mask_kv & (offs_v[None, :] < v_flush), other=0.0).to(tl.float32)
                read_mask = mask_kv & (offs_v[None, :] < V - v_flush)
                read_rows = offs_k < tl.where(is_flush, 0, K)
            else:
                s0 = tl.zeros([BLOCK_K, BLOCK_V], dtype=tl.float32)
                read_mask = mask_kv
                read_rows = mask_k
            s0 += load_read_tile(rc_values_ptr, rc_scales_ptr, rc_tensor_scale_ptr, pid_b, pid_h, offs_k, offs_v,
                                 read_mask, read_rows, pid_v * BLOCK_V, V,
                                 stride_rcv_b, stride_rcv_h, stride_rcv_k, stride_rcv_v,
                                 stride_rcs_b, stride_rcs_h, stride_rcs_k, stride_rcs_v, stride_rct_b,
                                 READ_FORMAT, BLOCK_V, COPY_SCALE_PER_ROW, CODE_VECTOR)  # fp8 scales per element unless
            # asked (faster for the whole-tile replay launches, see load_read_tile; the host flush: per row)

        k_raw, q_t, k_t, v_t, beta_t, g_t = _load_token(
            q_ptr, k_ptr, v_ptr, beta_ptr, g_ptr, pid_b, pid_h, hk, offs_k, mask_k, offs_v, mask_v, scale,
            stride_q_b, stride_q_h, stride_q_k, stride_k_b, stride_k_h, stride_k_k,
            stride_v_b, stride_v_h, stride_v_v, stride_beta_b, stride_beta_h, stride_g_b, stride_g_h, stride_g_k,
            GATE_PER_KEY, USE_QK_L2NORM)

        # Committed records: in logical order (position r < count at slot (origin + r) % R), or, for scalar gates read
        # on the device, by physical slot (addresses that need not wait for origin/count; position (slot - origin) % R).
        # Masked loads: nothing but the committed records is read.
        if RING_PHYSICAL:
            slots = offs_r
            pos = (offs_r - origin + ring_size) % ring_size
            valid = (offs_r < ring_size) & (pos < count)
        else:
            valid = offs_r < count
            slots = (origin + offs_r) % ring_size
        if not WEIGHTS_GIVEN:
            k_r = _load_record_keys(rk_base, slots, valid, offs_k, mask_k, stride_rk_r, stride_rk_k, USE_QK_L2NORM)
        if not LATE_RECORDS:
            d_r = _load_record_values(rd_base, slots, valid, offs_v, mask_v, stride_rd_r, stride_rd_v)
        # Decays from the gates one record later (s_r = sum_{r<i<count} g_i + g_t; c = g_0 + s_0) and the records'
        # weights: from the per-head pre-launch (WEIGHTS_GIVEN: once per (row, head), not once per V tile) or here.
        if WEIGHTS_GIVEN:
            decay, wq, wk = _given_weights(weights_ptr + (pid_b * tl.num_programs(2) + pid_h) * (BLOCK_K + 2 * BLOCK_R),
                                           offs_k, offs_r, BLOCK_K, BLOCK_R, GATE_PER_KEY)
        elif RING_PHYSICAL:  # scalar gates only
            g_r = tl.load(rg_base + slots * stride_rg_r, mask=valid, other=0.0).to(tl.float32)
            after = pos[None, :] > pos[:, None]  # [j, i]: record i comes after record j (invalid g_i are 0)
            seg = tl.sum(tl.where(after, g_r[None, :], 0.0), axis=1) + g_t  # [R], direct sums
            decay = tl.exp(tl.sum(g_r, axis=0) + g_t)
            w_r = tl.where(valid, tl.exp(seg), 0.0)
            wq = w_r * tl.sum(k_r * q_t[None, :], axis=1)
            wk = w_r * tl.sum(k_r * k_t[None, :], axis=1)
        else:  # w_r: the decayed record keys [R, K] for a per-key gate, the weights [R] for a scalar one
            decay, w_r, wq, wk = _record_weights(k_r, rg_base, origin, count, ring_size, offs_r, offs_k, valid, q_t,
                                                 k_t, g_t, stride_rg_r, stride_rg_k, K, GATE_PER_KEY)
        if CHUNK_K > 0 and READ_FORMAT != "fp32":  # the copy's codes (fp8: its row scales folded into q and k)
            pq, pk = _chunked_checkpoint_products(
                rc_values_ptr + pid_b * stride_rcv_b + pid_h * stride_rcv_h,
                q_ptr + pid_b * stride_q_b + hk * stride_q_h, k_ptr + pid_b * stride_k_b + hk * stride_k_h,
                weights_ptr + (pid_b * tl.num_programs(2) + pid_h) * (BLOCK_K + 2 * BLOCK_R),
                rc_scales_ptr + pid_b * stride_rcs_b + pid_h * stride_rcs_h, rc_tensor_scale_ptr + pid_b * stride_rct_b,
                offs_v, mask_v, pid_v * BLOCK_V, decay, scale, K, V, stride_rcv_k, stride_rcv_v, stride_q_k,
                stride_k_k, stride_rcs_k, stride_rcs_v, GATE_PER_KEY, USE_QK_L2NORM, BLOCK_K, BLOCK_V, CHUNK_K,
                READ_FORMAT, CODE_VECTOR)
        elif CHUNK_K > 0:
            pq, pk = _chunked_checkpoint_products(
                state_ptr + pid_b * stride_s_b + pid_h * stride_s_h, q_ptr + pid_b * stride_q_b + hk * stride_q_h,
                k_ptr + pid_b * stride_k_b + hk * stride_k_h,
                weights_ptr + (pid_b * tl.num_programs(2) + pid_h) * (BLOCK_K + 2 * BLOCK_R), state_ptr, state_ptr,
                offs_v, mask_v, pid_v * BLOCK_V, decay, scale, K, V, stride_s_k, stride_s_v, stride_q_k, stride_k_k,
                0, 0, GATE_PER_KEY, USE_QK_L2NORM, BLOCK_K, BLOCK_V, CHUNK_K, "fp32")
        else:
            pq, pk = _checkpoint_products(s0, q_t, k_t, decay, GATE_PER_KEY)
        if LATE_RECORDS:  # the records' values read after the stream, not held through it
            d_r = _load_record_values(rd_base, slots, valid, offs_v, mask_v, stride_rd_r, stride_rd_v)
        d_t, o = _token_output(pq, pk, wq, wk, d_r, q_t, k_t, v_t, beta_t)
        tl.store(o_ptr + pid_b * stride_o_b + pid_h * stride_o_h + offs_v * stride_o_v,
                 o.to(o_ptr.dtype.element_ty), mask=mask_v)

        rv_base = ring_v_ptr + pid_b * stride_rv_b + pid_h * stride_rv_h
        rb_base = ring_beta_ptr + pid_b * stride_rb_b + pid_h * stride_rb_h
        if is_flush:
            s_fold = s0
            if FLUSH_READS_COPY:  # o (stored above) came from the copy; the fold starts from the checkpoint
                s_fold = tl.load(state_ptrs, mask=mask_kv, other=0.0).to(tl.float32)
            if EXACT_FOLD and EXACT_SOLVE:  # (see _exact_fold_solved)
                s, o_new = _exact_fold_solved(s_fold, rk_base, rg_base, rv_base, rb_base, origin, count, ring_size,
                                              offs_k, mask_k, offs_v, mask_v, q_t, k_t, v_t, beta_t, g_t, stride_rk_r,
                                              stride_rk_k, stride_rg_r, stride_rg_k, stride_rv_r, stride_rv_v,
                                              stride_rb_r,
                                              _solve_entry(solve_ptr, pid_b, tl.num_programs(2), pid_h, BLOCK_K,
                                                           BLOCK_R, GATE_PER_KEY),
                                              USE_QK_L2NORM, BLOCK_K, BLOCK_R, FLUSH_PRECISION, SOLVE_GIVEN,
                                              GATE_PER_KEY)
            elif EXACT_FOLD:
                s = _exact_fold(s_fold, rk_base, rg_base, rv_base, rb_base, origin, count, ring_size, offs_k, mask_k,
                                offs_v, mask_v, stride_rk_r, stride_rk_k, stride_rg_r, stride_rg_k, stride_rv_r,
                                stride_rv_v, stride_rb_r, GATE_PER_KEY, USE_QK_L2NORM)
                if RELOAD_TOKEN:  # read again rather than held through the records' loop (registers)
                    _, q_t, k_t, v_t, beta_t, g_t = _load_token(
                        q_ptr, k_ptr, v_ptr, beta_ptr, g_ptr, pid_b, pid_h, hk, offs_k, mask_k, offs_v, mask_v, scale,
                        stride_q_b, stride_q_h, stride_q_k, stride_k_b, stride_k_h, stride_k_k,
                        stride_v_b, stride_v_h, stride_v_v, stride_beta_b, stride_beta_h, stride_g_b, stride_g_h,
                        stride_g_k, GATE_PER_KEY, USE_QK_L2NORM)
                s, _ = _token_update(s, k_t, v_t, beta_t, g_t, GATE_PER_KEY)
                o_new = tl.sum(s * q_t[:, None], axis=0)
            if EXACT_FOLD:
                store_flushed_tile(s, state_ptrs, mask_kv, amax_ptr, pid_b, FLUSH_AMAX)
                if not FLUSH_READS_COPY:
                    tl.store(o_ptr + pid_b * stride_o_b + pid_h * stride_o_h + offs_v * stride_o_v,
                             o_new.to(o_ptr.dtype.element_ty), mask=mask_v)  # replaces the output stored above
            else:
                # S = diag(exp(c)) S0 + sum_j (exp(s_j) * k_j) d_j^T + k_t d_t^T, stored in place.
                s = _decayed_with_token(s_fold, decay, k_t, d_t, GATE_PER_KEY)
                if FLUSH_DOT:
                    # The record sum as one [K, R] x [R, BLOCK_V] product (FLUSH_PRECISION "tf32x3": three tensor-core
                    # passes, float32 accuracy; "ieee": exact fp32 FMA, many more registers).
                    if GATE_PER_KEY:
                        kw_r = w_r  # the decayed record keys
                    else:
                        if WEIGHTS_GIVEN:  # the replaying programs took the pre-launch's weights; a flushing one
                            # loads the record keys and their decays here, once per L steps
                            k_r = _load_record_keys(rk_base, slots, valid, offs_k, mask_k, stride_rk_r, stride_rk_k,
                                                    USE_QK_L2NORM)
                            _, w_r = _record_decays(k_r, rg_base, origin, count, ring_size, offs_r, offs_k, valid,
                                                    g_t, stride_rg_r, stride_rg_k, K, GATE_PER_KEY)
                        kw_r = k_r * w_r[:, None]
                    s += tl.dot(tl.trans(kw_r), d_r, input_precision=FLUSH_PRECISION)
                else:
                    # The records read again one at a time (L1 hits: this program just loaded them), newest first,
                    # so that s_j accumulates as a direct sum; no [R, K] tile stays live in registers.
                    seg_j = g_t
                    for i in range(0, count):
                        slot_j = (origin + count - 1 - i) % ring_size
                        k_j = tl.load(rk_base + slot_j * stride_rk_r + offs_k * stride_rk_k, mask=mask_k, other=0.0)
                        k_j = k_j.to(tl.float32)
                        if USE_QK_L2NORM:
                            k_j = k_j * tl.rsqrt(tl.sum(k_j * k_j, axis=0) + 1e-6)
                        d_j = tl.load(rd_base + slot_j * stride_rd_r + offs_v * stride_rd_v, mask=mask_v, other=0.0)
                        if GATE_PER_KEY:
                            g_j = tl.load(rg_base + slot_j * stride_rg_r + offs_k * stride_rg_k, mask=mask_k, other=0.0)
                        else:
                            g_j = tl.load(rg_base + slot_j * stride_rg_r)
                        s += (tl.exp(seg_j) * k_j)[:, None] * d_j.to(tl.float32)[None, :]
                        seg_j += g_j.to(tl.float32)
                store_flushed_tile(s, state_ptrs, mask_kv, amax_ptr, pid_b, FLUSH_AMAX)
        else:
            # Append the token's record at logical position count: d by every V tile, g by V tile 0, the raw key by
            # V tile 0 of the first value head of its key group.
            slot = (origin + count) % ring_size
            _append_record(rd_base, rg_base, rk_base, slot, d_t, g_t, k_raw, offs_v, mask_v, offs_k, mask_k,
                           pid_v == 0, pid_h, kv_ratio, stride_rd_r, stride_rd_v, stride_rg_r, stride_rg_k,
                           stride_rk_r, stride_rk_k, GATE_PER_KEY)
            if EXACT_FOLD:  # the raw inputs a flush recomputes d from: v by every V tile, beta by V tile 0
                tl.store(rv_base + slot * stride_rv_r + offs_v * stride_rv_v, v_t.to(ring_v_ptr.dtype.element_ty),
                         mask=mask_v)
                if pid_v == 0:
                    tl.store(rb_base + slot * stride_rb_r, beta_t.to(ring_beta_ptr.dtype.element_ty))

    if (PHASE == 0 or PHASE == 4) and TICKET:  # noqa: SIM102 (a constexpr test and a runtime test: not one `if`)
        # The program that drew the row's last ticket writes the new count, clearing the ticket bits. An atomic
        # exchange, so that it is ordered after every ticket by coherence of count[b] alone.
        if ticket == tl.num_programs(0) * tl.num_programs(2) - 1:
            tl.atomic_xchg(count_ptr + pid_b * stride_count, tl.where(due, 0, count + 1), sem="relaxed")


@triton.jit(do_not_specialize=["origin_host", "count_host"])
def _delta_replay_walk_kernel(
    state_ptr, ring_k_ptr, ring_d_ptr, ring_g_ptr, origin_ptr, count_ptr,
    q_ptr, k_ptr, v_ptr, beta_ptr, g_ptr, o_ptr, weights_ptr,
    n_items, batch, heads, K: tl.constexpr, V: tl.constexpr, ring_size, kv_ratio, scale, origin_host, count_host,
    stride_origin, stride_count,
    stride_s_b, stride_s_h: tl.constexpr, stride_s_k: tl.constexpr, stride_s_v: tl.constexpr,
    stride_rk_b, stride_rk_r: tl.constexpr, stride_rk_h: tl.constexpr, stride_rk_k: tl.constexpr,
    stride_rd_b, stride_rd_r: tl.constexpr, stride_rd_h: tl.constexpr, stride_rd_v: tl.constexpr,
    stride_rg_b, stride_rg_r: tl.constexpr, stride_rg_h: tl.constexpr, stride_rg_k: tl.constexpr,
    stride_q_b, stride_q_h: tl.constexpr, stride_q_k: tl.constexpr,
    stride_k_b, stride_k_h: tl.constexpr, stride_k_k: tl.constexpr,
    stride_v_b, stride_v_h: tl.constexpr, stride_v_v: tl.constexpr,
    stride_beta_b, stride_beta_h: tl.constexpr,
    stride_g_b, stride_g_h: tl.constexpr, stride_g_k: tl.constexpr,
    stride_o_b, stride_o_h: tl.constexpr, stride_o_v: tl.constexpr,
    GATE_PER_KEY: tl.constexpr,
    USE_QK_L2NORM: tl.constexpr,
    WEIGHTS_GIVEN: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_R: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    BUFFER_LEN: tl.constexpr,
    DEVICE_POSITIONS: tl.constexpr,
    COMPACT: tl.constexpr,
    BLOCK_B: tl.constexpr,
):
    """A replay-only launch reading the fp32 checkpoint on a device-sized grid: each program walks the (row, value
    head, V tile) items with a stride of the grid, and ``tl.range(num_stages=NUM_STAGES)`` lets Triton's pipeliner
    issue the next items' loads (the checkpoint tile above all) while this one computes (asynchronous copies on
    sm_90). Host positions (``PHASE`` 1: every row at ``origin_host`` / ``count_host``), or ``DEVICE_POSITIONS`` (a
    split step's replay launch, ``PHASE`` 4, the counts advanced by a launch of their own): each row's origin / count
    read on the device, the items of rows due to flush (served by the step's flush launch) masked off, loads and
    stores alike; with ``COMPACT`` (device positions, up to ``BLOCK_B`` rows) the programs walk only the replaying
    rows' items (every program ranks the rows from their counts, as the device-grid flush ranks the due ones), so a
    step where every row flushes costs the launch nothing. Each item is the ``_delta_replay_step_kernel`` program of
    that tile, the same expressions."""
    v_tiles = tl.cdiv(V, BLOCK_V)
    offs_k = tl.arange(0, BLOCK_K)
    mask_k = offs_k < K
    offs_r = tl.arange(0, BLOCK_R)
    if COMPACT:
        replaying, rank, n_rows = replaying_rows(count_ptr, stride_count, batch, BUFFER_LEN, BLOCK_B)
        n_walk = n_rows * heads * v_tiles
    else:
        n_walk = n_items
    for item in tl.range(tl.program_id(0), n_walk, tl.num_programs(0), num_stages=NUM_STAGES):
        if COMPACT:
            pid_b, pid_h, pid_v = due_item(replaying, rank, item, heads, v_tiles, BLOCK_B)
        else:
            pid_v, pid_h, pid_b = walk_item(item, heads, v_tiles)
        hk = pid_h // kv_ratio
        origin, count, run, v_limit = walk_positions(origin_ptr, count_ptr, pid_b, stride_origin, stride_count,
                                                     origin_host, count_host, V, BUFFER_LEN, DEVICE_POSITIONS)
        valid = offs_r < count
        slots = (origin + offs_r) % ring_size
        slot = (origin + count) % ring_size
        offs_v = pid_v * BLOCK_V + tl.arange(0, BLOCK_V)
        mask_v = offs_v < v_limit
        state_ptrs = (state_ptr + pid_b * stride_s_b + pid_h * stride_s_h
                      + offs_k[:, None] * stride_s_k + offs_v[None, :] * stride_s_v)
        s0 = tl.load(state_ptrs, mask=mask_k[:, None] & mask_v[None, :], other=0.0).to(tl.float32)
        rk_base = ring_k_ptr + pid_b * stride_rk_b + hk * stride_rk_h
        rd_base = ring_d_ptr + pid_b * stride_rd_b + pid_h * stride_rd_h
        rg_base = ring_g_ptr + pid_b * stride_rg_b + pid_h * stride_rg_h
        k_raw, q_t, k_t, v_t, beta_t, g_t = _load_token(
            q_ptr, k_ptr, v_ptr, beta_ptr, g_ptr, pid_b, pid_h, hk, offs_k, mask_k, offs_v, mask_v, scale,
            stride_q_b, stride_q_h, stride_q_k, stride_k_b, stride_k_h, stride_k_k,
            stride_v_b, stride_v_h, stride_v_v, stride_beta_b, stride_beta_h, stride_g_b, stride_g_h, stride_g_k,
            GATE_PER_KEY, USE_QK_L2NORM)
        d_r = _load_record_values(rd_base, slots, valid, offs_v, mask_v, stride_rd_r, stride_rd_v)
        if WEIGHTS_GIVEN:
            decay, wq, wk = _given_weights(weights_ptr + (pid_b * heads + pid_h) * (BLOCK_K + 2 * BLOCK_R), offs_k,
                                           offs_r, BLOCK_K, BLOCK_R, GATE_PER_KEY)
        else:
            k_r = _load_record_keys(rk_base, slots, valid, offs_k, mask_k, stride_rk_r, stride_rk_k, USE_QK_L2NORM)
            decay, _, wq, wk = _record_weights(k_r, rg_base, origin, count, ring_size, offs_r, offs_k, valid, q_t,
                                               k_t, g_t, stride_rg_r, stride_rg_k, K, GATE_PER_KEY)
        pq, pk = _checkpoint_products(s0, q_t, k_t, decay, GATE_PER_KEY)
        d_t, o = _token_output(pq, pk, wq, wk, d_r, q_t, k_t, v_t, beta_t)
        tl.store(o_ptr + pid_b * stride_o_b + pid_h * stride_o_h + offs_v * stride_o_v,
                 o.to(o_ptr.dtype.element_ty), mask=mask_v)
        _append_record(rd_base, rg_base, rk_base, slot, d_t, g_t, k_raw, offs_v, mask_v, offs_k, mask_k,
                       (pid_v == 0) & run, pid_h, kv_ratio, stride_rd_r, stride_rd_v, stride_rg_r, stride_rg_k,
                       stride_rk_r, stride_rk_k, GATE_PER_KEY)


@triton.jit
def _delta_flush_due_kernel(
    state_ptr, ring_k_ptr, ring_d_ptr, ring_g_ptr, origin_ptr, count_ptr,
    q_ptr, k_ptr, v_ptr, beta_ptr, g_ptr, o_ptr, amax_ptr,
    batch, heads, K: tl.constexpr, V: tl.constexpr, ring_size, kv_ratio, scale,
    stride_s_b, stride_s_h: tl.constexpr, stride_s_k: tl.constexpr, stride_s_v: tl.constexpr,
    stride_rk_b, stride_rk_r: tl.constexpr, stride_rk_h: tl.constexpr, stride_rk_k: tl.constexpr,
    stride_rd_b, stride_rd_r: tl.constexpr, stride_rd_h: tl.constexpr, stride_rd_v: tl.constexpr,
    stride_rg_b, stride_rg_r: tl.constexpr, stride_rg_h: tl.constexpr, stride_rg_k: tl.constexpr,
    stride_origin, stride_count,
    stride_q_b, stride_q_h: tl.constexpr, stride_q_k: tl.constexpr,
    stride_k_b, stride_k_h: tl.constexpr, stride_k_k: tl.constexpr,
    stride_v_b, stride_v_h: tl.constexpr, stride_v_v: tl.constexpr,
    stride_beta_b, stride_beta_h: tl.constexpr,
    stride_g_b, stride_g_h: tl.constexpr, stride_g_k: tl.constexpr,
    stride_o_b, stride_o_h: tl.constexpr, stride_o_v: tl.constexpr,
    BUFFER_LEN: tl.constexpr,
    GATE_PER_KEY: tl.constexpr,
    USE_QK_L2NORM: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_B: tl.constexpr,
    FLUSH_PRECISION: tl.constexpr,
    FLUSH_AMAX: tl.constexpr = False,
):
    """The split device-phase step's flush launch on a grid sized to the GPU (``kernels/flush_grid.py``): the
    (due row, value head, V tile) items, each folded as the replay kernel's ``PHASE`` 3 program of that tile (fp32
    checkpoint, records decayed here, one tf32x3 product; no exact fold, no read copy): the same expressions in the
    same order. Counts are read, not written (the replay launch after it advances them)."""
    due, rank, n_due = due_rows(count_ptr, stride_count, batch, BUFFER_LEN, BLOCK_B)
    v_tiles = tl.cdiv(V, BLOCK_V)
    offs_k = tl.arange(0, BLOCK_K)
    offs_r = tl.arange(0, BLOCK_R)
    mask_k = offs_k < K
    for item in range(tl.program_id(0), n_due * v_tiles * heads, tl.num_programs(0)):
        pid_b, pid_h, pid_v = due_item(due, rank, item, heads, v_tiles, BLOCK_B)
        hk = pid_h // kv_ratio
        offs_v = pid_v * BLOCK_V + tl.arange(0, BLOCK_V)
        mask_v = offs_v < V
        mask_kv = mask_k[:, None] & mask_v[None, :]
        origin = tl.load(origin_ptr + pid_b * stride_origin)
        count = tl.load(count_ptr + pid_b * stride_count) & 0xFFFF
        state_ptrs = (state_ptr + pid_b * stride_s_b + pid_h * stride_s_h
                      + offs_k[:, None] * stride_s_k + offs_v[None, :] * stride_s_v)
        s0 = tl.load(state_ptrs, mask=mask_kv, other=0.0).to(tl.float32)
        _, q_t, k_t, v_t, beta_t, g_t = _load_token(
            q_ptr, k_ptr, v_ptr, beta_ptr, g_ptr, pid_b, pid_h, hk, offs_k, mask_k, offs_v, mask_v, scale,
            stride_q_b, stride_q_h, stride_q_k, stride_k_b, stride_k_h, stride_k_k,
            stride_v_b, stride_v_h, stride_v_v, stride_beta_b, stride_beta_h, stride_g_b, stride_g_h, stride_g_k,
            GATE_PER_KEY, USE_QK_L2NORM)
        valid = offs_r < count
        slots = (origin + offs_r) % ring_size
        rg_base = ring_g_ptr + pid_b * stride_rg_b + pid_h * stride_rg_h
        k_r = _load_record_keys(ring_k_ptr + pid_b * stride_rk_b + hk * stride_rk_h, slots, valid, offs_k, mask_k,
                                stride_rk_r, stride_rk_k, USE_QK_L2NORM)
        d_r = _load_record_values(ring_d_ptr + pid_b * stride_rd_b + pid_h * stride_rd_h, slots, valid, offs_v,
                                  mask_v, stride_rd_r, stride_rd_v)
        decay, w_r, wq, wk = _record_weights(k_r, rg_base, origin, count, ring_size, offs_r, offs_k, valid, q_t,
                                             k_t, g_t, stride_rg_r, stride_rg_k, K, GATE_PER_KEY)
        pq, pk = _checkpoint_products(s0, q_t, k_t, decay, GATE_PER_KEY)
        d_t, o = _token_output(pq, pk, wq, wk, d_r, q_t, k_t, v_t, beta_t)
        tl.store(o_ptr + pid_b * stride_o_b + pid_h * stride_o_h + offs_v * stride_o_v,
                 o.to(o_ptr.dtype.element_ty), mask=mask_v)
        s = _decayed_with_token(s0, decay, k_t, d_t, GATE_PER_KEY)
        if GATE_PER_KEY:  # noqa: SIM108 (a constexpr branch: no conditional expressions in the kernel code)
            kw_r = w_r  # the decayed record keys
        else:
            kw_r = k_r * w_r[:, None]
        s += tl.dot(tl.trans(kw_r), d_r, input_precision=FLUSH_PRECISION)
        store_flushed_tile(s, state_ptrs, mask_kv, amax_ptr, pid_b, FLUSH_AMAX)


@triton.jit
def _delta_state_update_kernel(
    state_ptr, q_ptr, k_ptr, v_ptr, beta_ptr, g_ptr, o_ptr,
    K: tl.constexpr, V: tl.constexpr, kv_ratio, scale,
    stride_s_b, stride_s_h: tl.constexpr, stride_s_k: tl.constexpr, stride_s_v: tl.constexpr,
    stride_q_b, stride_q_h: tl.constexpr, stride_q_k: tl.constexpr,
    stride_k_b, stride_k_h: tl.constexpr, stride_k_k: tl.constexpr,
    stride_v_b, stride_v_h: tl.constexpr, stride_v_v: tl.constexpr,
    stride_beta_b, stride_beta_h: tl.constexpr,
    stride_g_b, stride_g_h: tl.constexpr, stride_g_k: tl.constexpr,
    stride_o_b, stride_o_h: tl.constexpr, stride_o_v: tl.constexpr,
    GATE_PER_KEY: tl.constexpr,
    USE_QK_L2NORM: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    pid_v = tl.program_id(0)
    pid_b = tl.program_id(1).to(tl.int64)
    pid_h = tl.program_id(2)
    hk = pid_h // kv_ratio

    offs_k = tl.arange(0, BLOCK_K)
    offs_v = pid_v * BLOCK_V + tl.arange(0, BLOCK_V)
    mask_k = offs_k < K
    mask_v = offs_v < V
    mask_kv = mask_k[:, None] & mask_v[None, :]

    state_ptrs = (state_ptr + pid_b * stride_s_b + pid_h * stride_s_h
                  + offs_k[:, None] * stride_s_k + offs_v[None, :] * stride_s_v)
    s = tl.load(state_ptrs, mask=mask_kv, other=0.0).to(tl.float32)
    _, q_t, k_t, v_t, beta_t, g_t = _load_token(
        q_ptr, k_ptr, v_ptr, beta_ptr, g_ptr, pid_b, pid_h, hk, offs_k, mask_k, offs_v, mask_v, scale,
        stride_q_b, stride_q_h, stride_q_k, stride_k_b, stride_k_h, stride_k_k,
        stride_v_b, stride_v_h, stride_v_v, stride_beta_b, stride_beta_h, stride_g_b, stride_g_h, stride_g_k,
        GATE_PER_KEY, USE_QK_L2NORM)

    s, _ = _token_update(s, k_t, v_t, beta_t, g_t, GATE_PER_KEY)
    tl.store(state_ptrs, s.to(state_ptr.dtype.element_ty), mask=mask_kv)
    o = tl.sum(s * q_t[:, None], axis=0)
    tl.store(o_ptr + pid_b * stride_o_b + pid_h * stride_o_h + offs_v * stride_o_v,
             o.to(o_ptr.dtype.element_ty), mask=mask_v)


# ---------------------------------------------------------------------------------------------------------------
# launch configuration


def replay_launch_config(batch: int, value_heads: int, key_dim: int, value_dim: int,
                         per_key_gate: bool = False, read_format: str | None = None,
                         device_phase: bool = False, kda_weights: bool = True) -> tuple[int, int]:
    """(BLOCK_V, num_warps) for the replay step. Wide V tiles amortise the per-program record work (the keys and
    gates of the ring are normalised / decayed by every V tile of a head); 64 x 4 warps measured best on an H200
    for K = V = 128 at batch 256 (GDN and KDA). The tile is halved (down to 16) while the grid would have fewer than
    ~8 programs per H200 SM.

    Scalar-gate launches that read a low-precision copy (``read_format`` fp8 / nvfp4) decode it in registers and
    take a 32 x 2 tile instead (H200, Qwen3-Next, batch 256, host-phase cycle: fp8 278 vs 314 us, nvfp4 487 vs
    667 us; the nvfp4 64 x 4 kernel sits at 255 registers). With device positions (one fused launch that also
    flushes) only nvfp4 does (in-phase cycle 681 vs 802 us); fp8 keeps 64 x 4 there (364 vs 438 us).

    Per-key gates whose decays come from the per-head pre-launch (``kda_weights``, the default) take 32 x 2 as
    well with device positions or a read copy (H200, Kimi-Linear, rows in mixed phases: batch 256 292 us against 341
    at 64 x 4, batch 64 89 vs 102), but keep 64 x 4 with host positions and the fp32 checkpoint (run 81, batch 256,
    host-phase cycle: 295 us against 339 at 32 x 2; ``benchmarks/gpu/replay_config_sweep.py``).

    Fewer warps where the reads are the fp32 checkpoint (run 86, batch 256, per step): scalar gates 64 x 2 (GDN rows
    in mixed phases 227 us against 241 at 64 x 4, host positions 211 against 227); per-key gates with device
    positions 16 x 1 (275 against 292 at 32 x 2; host positions keep 64 x 4: 295 against 473 at 32 x 1)."""
    block_k = next_power_of_2(key_dim)
    block_v = min(next_power_of_2(value_dim), max(16, 8192 // block_k))
    while block_v > 16 and batch * value_heads * cdiv(value_dim, block_v) < 1024:
        block_v //= 2
    reads_copy = read_format not in (None, "fp32")
    block_v, num_warps = max(block_v, 16), (2 if not per_key_gate and not reads_copy else 4)
    if per_key_gate and kda_weights and device_phase and not reads_copy and block_v > 16:
        block_v, num_warps = 16, 1
    elif per_key_gate and kda_weights and (device_phase or reads_copy) and block_v > 32:
        block_v, num_warps = 32, 2
    if reads_copy and not per_key_gate and (not device_phase or read_format == "nvfp4") and block_v > 32:
        block_v, num_warps = 32, 2
    return block_v, num_warps


def flush_due_launch_config(key_dim: int, value_dim: int) -> tuple[int, int]:
    """(BLOCK_V, num_warps) of the device-grid flush launch (``_delta_flush_due_kernel``): a [K, 4096 / K] tile
    ([128, 32]) on 4 warps, the widest launch that compiles without spills at batch 256 (sm_90, Triton 3.6: GDN 177
    registers, KDA 251; [128, 64] x 4 and the split step's [128, 64] x 2 / KDA's [128, 16] x 1 sit at 255, some
    spilling). H200, batch 256 (run 104): the launch 59.7 us for GDN with one row in 16 due, but the split step it
    serves is slower than the fused default (``_replay_step``'s ``_flush_grid``)."""
    block_k = next_power_of_2(key_dim)
    return min(next_power_of_2(value_dim), max(16, 4096 // block_k)), 4


def flush_uses_dot(per_key_gate: bool) -> bool:
    """Whether the replay step's flush sums the records with one tl.dot (fast, more registers) or a loop over the
    records (fewer registers; per-key gates would spill with the dot)."""
    return not per_key_gate


def _code_vector(kernel_phase: int, kernel_read_format: str, flush_reads_copy: bool, streamed: bool,
                 flush_vector, split_flush_vector, replay_vector) -> int:
    """The launch's CODE_VECTOR: an fp8 copy's codes at most that many to a vector (0: the compiler's widest) where
    the launch reads them, i.e. a flush launch giving its outputs from the copy (host 2, split 3) and a streamed
    replay launch (host 1, split 4)."""
    if kernel_read_format != "fp8":
        return 0
    if kernel_phase in (2, 3):
        return int((flush_vector if kernel_phase == 2 else split_flush_vector) or 0) if flush_reads_copy else 0
    return int(replay_vector or 0) if kernel_phase in (1, 4) and streamed else 0


def reload_token_default(read_format: str | None, per_key_gate: bool, device_positions: bool) -> bool:
    """Whether the exact fold reads the token again after the records' loop (``_replay_step``'s ``_reload_token``):
    on, except a host-phase step of a scalar gate (GDN) reading an nvfp4 copy, the one case it was slower on the
    H200 (run 204: 181.2 -> 183.7 us per step at batch 256)."""
    return device_positions or per_key_gate or read_format != "nvfp4"


def host_flush_launch_config(batch: int, value_heads: int, key_dim: int, value_dim: int, per_key_gate: bool = False,
                             kda_weights: bool = True, exact_fold: bool = False, exact_solve: bool = False,
                             solve_given: bool = False) -> tuple[int, int, bool]:
    """(BLOCK_V, num_warps, flush_dot) of the host-phase flush-only launch (every row at its last buffered position).
    Scalar gates: the replay tile with the record sum as one tl.dot. Per-key gates with the per-head weights
    pre-launch: the loop over the records, reading the pre-launch's decays, on a [K, 32] tile and one warp. H200,
    Kimi-Linear shape, per flush launch: batch 256 (run 111, ``bench_delta --diag``) 706.8 us at the device phase's
    [128, 16] x 1 against 945.5 with the dot at the host tile [128, 64] x 4 and 962.7 with the loop there; run 114
    (``benchmarks/gpu/host_flush_sweep.py``) [128, 32] x 1 614.2 against [128, 16] x 1 694.3, [128, 32] x 2 897.4,
    [128, 16] x 2 1000.0, batch 64 170.4 against 189.1. GDN keeps the dot at its replay tile ([128, 64] x 2: 512.1,
    the loop 587.2, [128, 64] x 4 549.2). The exact fold of the separated policies (``ring_v`` / ``ring_beta``: a
    serial loop of its own whatever the flag) runs on one warp, [K, 16] for scalar gates, [K, 32] for per-key ones
    (H200, batch 256, per flush launch, run 140 ``benchmarks/gpu/read_copy_defaults.py --flush-tiles``): Qwen3-Next
    809.9 us against 1003.5 at the former replay tile [K, 64] x 2, 993.2 at [K, 32] x 2, 1089.5 at [K, 32] x 1,
    1144.1 at [K, 64] x 4 (batch 64 218.7 against 266.0); Kimi-Linear 1167.3 against 1520.8 at [K, 64] x 4, 1159.6 at
    [K, 64] x 2, 1383.0 at [K, 32] x 2, 1399.1 at [K, 16] x 1 (batch 64 308.2 against 395.4); [K, 64] x 1 spills
    (14.8 / 2.5 ms). Solved at once (``exact_solve``) it takes [K, 64] x 4, its fastest tile (Qwen3-Next batch 256,
    run 131: 1403.6 us per flush launch, [K, 32] x 4 1949.4, [K, 64] x 8 2223.1, [K, 32] x 2 2559.8, [K, 16] x 4
    4192.2; all slower than the stepped fold). Per-key gates (KDA, untimed) take [K, 32] x 4, their widest tile that
    compiles without spills (sm_90, Triton 3.6, batch 256: 246 registers, 217 with the pre-launch; [K, 64] x 4 spills
    372 / 228 bytes), and so does a scalar gate's fold with its chain from the pre-launch (``solve_given``, untimed:
    192 registers, none spilled, against 255 / 124 bytes on [K, 64] x 4)."""
    if exact_solve:
        return min(32 if per_key_gate or solve_given else 64, max(16, next_power_of_2(value_dim))), 4, True
    if exact_fold:
        return min(32 if per_key_gate else 16, max(16, next_power_of_2(value_dim))), 1, True
    if per_key_gate and kda_weights and not exact_fold:
        return min(32, max(16, next_power_of_2(value_dim))), 1, False
    block_v, num_warps = replay_launch_config(batch, value_heads, key_dim, value_dim, per_key_gate,
                                              kda_weights=kda_weights)
    return block_v, num_warps, True


HOST_WALK_MIN_BATCH = 64  # the walk measured faster at batch 64 and 256 (run 122); per-tile launches below
# GDN's split device-phase step with a replay launch walking the replaying rows' items: faster than the fused launch
# at batch 128, 256 and 512 (Qwen3-Next, rows in phase and mixed, runs 129 / 130), slower mixed at batch 64 (run 130);
# the fused launch below
DEVICE_WALK_MIN_BATCH = 128


def host_walk_launch_config(batch: int, key_dim: int, value_dim: int) -> tuple[int, int, dict] | None:
    """(BLOCK_V, num_warps, walk) of the host-phase replay-only launch when it walks the tiles
    (``_delta_replay_walk_kernel``: 8 programs per SM, each walking [K, 32] tiles on one warp with the next tile's
    load issued a stage ahead), or None (the per-tile launch at :func:`replay_launch_config`) below
    :data:`HOST_WALK_MIN_BATCH` rows or past 128 key channels (a [256, 32] tile on one warp would spill; not
    measured). H200, host-phase cycle per step (run 122, ``bench_delta``): Qwen3-Next batch
    256 176.6 us against the per-tile [128, 64] x 2's 211.8 (batch 64 52.0 vs 59.3); Kimi-Linear 216.5 against
    227.0 at [128, 64] x 4 (62.0 vs 65.1). Programs per SM decided it (runs 117-121, ``--diag --walks``; GDN at 256,
    2 stages: 4 / 5 / 6 / 7 / 8 per SM 228 / 217 / 195 / 182 / 175 us); 16-wide tiles, two warps or three stages
    were slower. Mamba-2 keeps its per-tile launch (every walk slower, see ``BENCHMARKS.md``)."""
    if batch < HOST_WALK_MIN_BATCH or key_dim > 128:
        return None
    return min(32, max(16, next_power_of_2(value_dim))), 1, dict(programs_per_sm=8, num_stages=2)


READ_COPY_STREAM_MIN_BATCH = 64


def read_copy_stream_config(batch: int, key_dim: int, per_key_gate: bool, read_format: str,
                            device_phase: bool = False, value_dim: int = 128) -> tuple[int, int, int] | None:
    """(BLOCK_V, num_warps, CHUNK_K) of the replay-only launches reading a read copy when they stream it K rows at a
    time (``_chunk_k``: an fp8 copy's row scales folded into q and k, an nvfp4 copy's scales too, its nibbles
    accumulated apart: :func:`_chunked_checkpoint_products`), or None
    (the whole-tile launch). From :data:`READ_COPY_STREAM_MIN_BATCH` rows, up to 128 key channels, in chunks of 16:
    GDN on [K, V] x 1 (V up to 128: a whole head per program), KDA fp8 on [K, V] x 1 and nvfp4 on [K, 32] x 1,
    with host positions and with device positions
    (``device_phase``: the replay launch of a split step, whose flush launch takes
    :func:`read_copy_split_flush_config`'s tile). H200, batch 256, per step (``bench_delta --read-format``; the
    device step is the separated policy's, re-encode included, rows in phase; runs 134 / 135 from
    ``benchmarks/gpu/read_copy_defaults.py``):

    * Qwen3-Next fp8 (runs 130 / 131 / 133): host cycle 194.1-196.9 us against the whole tile's 254.5 (batch 64 51.9
      against 68.3); device split 236.1 against the fused launch's 348.5 (run 131's split on [K, 32] x 1 for both
      launches: 267.2);
    * Qwen3-Next nvfp4: host cycle 282.8-285.3 against 467.9; device split 369.6 against the fused 532.4 (its flush
      launch on the replay launch's one-warp [K, 64] tile: 896.5);
    * Kimi-Linear fp8 (run 133): host cycle 250.3 against the whole tile's 296.9 ([K, 64] x 1 254.1); device split
      291.1 against the fused 338.3 (the flush on [K, 64] x 2: 289.0);
    * Kimi-Linear nvfp4 (run 135): host cycle 351.5 against 490.2 ([K, 64] x 1 353.5); device split 412.3 against
      538.5 in phase, 570.6 against 627.6 in mixed phases.
    * nvfp4 read as stored (twenty-fifth session, runs 143 / 144, the split flush on [K, 16] x 1): Qwen3-Next host
      cycle 229.1, device split 333.3-334.2 in phase; Kimi-Linear host 268.1-268.4, device split 391.0-391.7.

    At batch 64 (runs 134 / 135) every streamed host cycle and in-phase device step is faster too (GDN fp8 51.7 /
    66.8 us against 74.0 / 95.1); in mixed phases KDA's split loses a little (fp8 151.3 against the fused 133.3,
    nvfp4 230.8 against 219.2) where GDN's wins (fp8 116.7 against 125.4): plain batched decoding keeps its rows in
    phase.

    A whole head per program since run 185 (``read_copy_defaults.py --stream-tiles``, batch 256, host cycle as the
    cache runs it / split step in phase, against the former [K, 64] x 1 for GDN and [K, 32] x 1 for KDA): Qwen3-Next
    fp8 218.7 / 236.0 -> 199.0 / 215.8 us, nvfp4 185.1 / 236.8 -> 181.2 / 233.7; Kimi-Linear fp8 255.1 / 289.1 ->
    247.7 / 276.5; Kimi-Linear nvfp4 keeps [K, 32] (230.0 / 297.1 on [K, 128] against 224.2 / 295.7). Two warps, or
    chunks of 32 key rows, were slower on every shape (e.g. GDN fp8 [K, 128] x 2 270.5, [K, 64] x 1 in chunks of 32
    224.3).

    Since run 212 these launches load the records' values after the stream (``_replay_step``'s ``_late_records``)
    and Kimi-Linear's nvfp4 copy streams a whole head in chunks of 8 key rows (batch 256, host cycle as the cache runs
    it / split step in phase, us per step, against the tile before with the records loaded first): Qwen3-Next fp8
    170.8 / 206.7 -> 149.8 / 184.6, nvfp4 181.4 / 233.8 -> 161.4 / 211.0; Kimi-Linear fp8 233.4 / 256.7 -> 207.8 /
    232.8, nvfp4 ([K, 32] in chunks of 16) 222.4 / 294.6 -> 197.7 / 274.3. Chunks of 4 or 8 (fewer registers:
    offline 146-243 against 255) lost or tied elsewhere, as did [K, 32] tiles (``--stream-tiles --stream-late``)."""
    if batch < READ_COPY_STREAM_MIN_BATCH or key_dim > 128 or read_format not in ("fp8", "nvfp4"):
        return None
    whole_head = min(128, max(16, next_power_of_2(value_dim)))
    return (whole_head, 1, 8) if per_key_gate and read_format == "nvfp4" else (whole_head, 1, 16)


def read_copy_split_flush_config(value_dim: int, read_format: str = "fp8") -> tuple[int, int]:
    """(BLOCK_V, num_warps) of a split step's flush launch when its replay launch streams a read copy
    (:func:`read_copy_stream_config`): nvfp4 [K, 16] x 1, fp8 [K, 64] x 2 (the flush launch decodes the copy's whole
    tile for the due rows' outputs: a wide nvfp4 tile spills). H200, the separated policy's step, re-encode included
    (``read_copy_defaults.py --device-flush-tiles``), us per step at batch 256 in phase / mixed phases:

    * Since the flush loads an fp8 copy's codes 4 to a vector (``_split_flush_code_vector``), run 201: Qwen3-Next fp8
      [K, 64] x 2 206.9 / 267.5, [K, 32] x 1 (its former default) 211.5 / 289.0, [K, 16] x 1 226.6 / 265.2; batch 64
      (run 202) 59.2 / 90.9 against 59.9 / 106.1 and 63.9 / 96.8. Kimi-Linear fp8 [K, 64] x 2 260.1 / 329.9, [K, 32]
      x 1 268.2 / 363.8, [K, 16] x 1 296.6 / 380.0.

    Before that load (GDN then on [K, 32] x 1, KDA on [K, 64] x 2):

    * Qwen3-Next nvfp4 (run 143): [K, 16] x 1 334.2 / 427.3, [K, 64] x 2 339.7 / 470.7 (run 141, before the nvfp4
      fold: 368.7 / 466.4 against [K, 32] x 1's 370.0 / 508.4); batch 64 93.1 / 170.2 vs 94.2 / 183.5.
    * Kimi-Linear nvfp4 (run 143): [K, 16] x 1 391.7 / 529.3, [K, 64] x 2 604.7 / 769.1, fused 538.9 / 626.2;
      batch 64 109.6 / 204.2 vs 162.1 / 240.4.
    * Kimi-Linear fp8 (runs 141, 143): [K, 64] x 2 289.0-289.6 / 361.0-361.7, [K, 32] x 1 291.4 / 396.3, [K, 16] x 1
      341.3 / 447.8; batch 64 83.7 / 121.1 vs 83.9 / 149.0.
    * Qwen3-Next fp8 (run 141): [K, 32] x 1 236.0 / 318.7, [K, 64] x 2 241.7 / 307.1, [K, 16] x 1 268.0 / 316.1
      (plain batched decoding keeps its rows in phase); run 133: 236.1 against 288.1 on the replay launch's
      [K, 64] x 1."""
    if read_format == "nvfp4":
        return 16, 1
    block_v = min(64, max(16, next_power_of_2(value_dim)))
    return block_v, 2 if block_v == 64 else 1


def device_walk_launch_config(batch: int, key_dim: int, per_key_gate: bool) -> dict | None:
    """The walk (``_walk``) of the replay launch when a device-phase step runs split (a flush-only launch for the
    rows due, then a replay-only launch on a device-sized grid whose programs walk the replaying rows' items at the
    device phase's :func:`replay_launch_config` tiles, 4 per SM, the next tile's load a stage ahead), or None (one
    fused launch). Scalar gates (GDN) only, from :data:`DEVICE_WALK_MIN_BATCH` rows, up to 128 key channels. H200,
    per step (``bench_delta``): the walk over every item (variant ``split_walk_s2_x4``, runs 124 and 128) Qwen3-Next
    batch 256 219.2-219.7 us with rows in phase against the fused launch's 232.3-234.0, 229.2-229.6 against
    228.2-228.4 in mixed phases, batch 512 421.4 vs 476.3 and 434.6 vs 454.3; Qwen3.5-large batch 256 420.5 vs 459.2
    and 434.3 vs 443.1; at batch 64 Qwen3-Next 68.0 vs 65.9 (slower).
    Walking only the replaying rows' items (``compact``, variant ``split_walk_s2_x4_compact``, run 129, Qwen3-Next
    batch 256): 210.7 us in phase, 222.6 mixed (the flush step's replay launch, every row due, had cost about 170 us
    over masked items: run 128, 685 us for that step against the fused launch's 477). Run 130 (Qwen3-Next, the
    compacting walk against the fused launch, mixed / in phase): batch 128 121.9 / 113.1 vs 124.3 / 122.9 (so the
    split from 128 rows), 256 223.3 / 210.5 vs 228.2 / 233.0, 512 427.3 / 411.2 vs 453.4 / 478.9; batch 64 72.6 / 65.4
    vs 66.9 / 65.9 (slower in mixed phases: fused below 128). The walk on [128, 32] x 1 at 8 per SM (variant
    ``split_walk_32x1_x8_compact``) is 1-2 % faster at 64 and 128 rows, 6-8 % slower at 256 and 512. KDA's split
    step is slower than its fused one (run 123: 312 vs 226 us)."""
    if per_key_gate or batch < DEVICE_WALK_MIN_BATCH or key_dim > 128:
        return None
    return dict(programs_per_sm=4, num_stages=2, compact=True)


def state_update_launch_config(batch: int, value_heads: int, key_dim: int, value_dim: int,
                               per_key_gate: bool = False) -> tuple[int, int]:
    """(BLOCK_V, num_warps) for the standard step: a [K, 64] tile with 4 warps measured best on an H200 for
    K = V = 128 (93 % of copy bandwidth at batch 256); halved while the grid would have fewer than ~8 programs per
    SM."""
    block_k = next_power_of_2(key_dim)
    block_v = min(next_power_of_2(value_dim), max(8, 8192 // block_k))
    while block_v > 8 and batch * value_heads * cdiv(value_dim, block_v) < 1024:
        block_v //= 2
    return block_v, 4


# ---------------------------------------------------------------------------------------------------------------
# wrappers


def _device_guard(t: torch.Tensor):
    return torch.cuda.device(t.device) if t.is_cuda else contextlib.nullcontext()


def _check_step_inputs(state, q, k, v, beta, g):
    batch, value_heads, key_dim, value_dim = state.shape
    key_heads = k.shape[1]
    assert k.dim() == 3 and k.shape[0] == batch and k.shape[2] == key_dim, f"k must be [B, Hk, K], got {k.shape}"
    assert q.shape == k.shape, f"q {tuple(q.shape)} vs k {tuple(k.shape)}"
    assert v.shape == (batch, value_heads, value_dim), f"v {tuple(v.shape)} vs state {tuple(state.shape)}"
    assert value_heads % key_heads == 0, "value heads must be a multiple of key heads"
    assert beta.shape == (batch, value_heads), f"beta must be [B, Hv], got {tuple(beta.shape)}"
    assert g.shape in ((batch, value_heads), (batch, value_heads, key_dim)), (
        f"g must be [B, Hv] (GDN) or [B, Hv, K] (KDA), got {tuple(g.shape)}")
    assert key_dim <= MAX_KEY_DIM, f"key dim {key_dim} > {MAX_KEY_DIM} (one K tile per program)"
    return batch, value_heads, key_heads, key_dim, value_dim, g.dim() == 3


def _gate_strides(g: torch.Tensor) -> tuple[int, ...]:
    """(b, h, k) strides of g [B, H] / [B, H, K] (k stride 0 for a scalar gate)."""
    return (*g.stride(), 0) if g.dim() == 2 else tuple(g.stride())


def _ring_gate_strides(ring_g: torch.Tensor) -> tuple[int, ...]:
    return (*ring_g.stride(), 0) if ring_g.dim() == 3 else tuple(ring_g.stride())


def _replay_step(
    state, ring_k, ring_d, ring_g, origin, count, q, k, v, beta, g, buffer_len=16, use_qk_l2norm=True, scale=None,
    out=None, read_copy=None, read_format=None, ring_v=None, ring_beta=None, _block_v=None, _num_warps=None,
    _flush_dot=None, _ticket=True, _ring_physical=False, _split="auto", _prefetch=True,
    _count_launch=True, flush_reads_copy=False,
    _nvfp4_pairs=True, _kda_weights=True, _gdn_weights=False, _weights_warps=None, _chunk_k=0, _flush_grid="batch",
    _flush_config=None, _walk="auto", _exact_solve=False, reencode_copy=False, _flush_amax=True,
    _flush_scale_per_row=True, _flush_code_vector=4, _split_flush_code_vector=4, _replay_code_vector=0,
    _reload_token="auto", _late_records="auto", _solve_weights=False, _solve_warps=None, _newest_first="auto",
    _flush_weights="auto",
):
    """:func:`delta_replay_step` with launch overrides for the benchmark: ``_block_v`` / ``_num_warps`` /
    ``_flush_dot``; ``_split`` (device positions only): the step as a flush-only launch for the rows due (the others
    exit after reading their count) and then a replay-only one, instead of one fused program that carries both codes
    (H200, batch 256: 263 vs 241 us per step with rows in mixed phases, both per tile); ``"auto"`` (the default):
    split with the replay launch walking the tiles where :func:`device_walk_launch_config` says so (GDN from
    :data:`DEVICE_WALK_MIN_BATCH` rows, fp32 checkpoint, count launch, records in logical order, no exact fold,
    ``_walk="auto"`` and no forced tile or ``_chunk_k``), fused otherwise. ``_count_launch`` (device
    positions; default on): the step's kernels read the counts plainly and a third, one-program-per-1024-rows launch
    advances them; off, the replay program of each row that draws the last count ticket writes its new count (H200,
    batch 256, the step 10 us slower). ``_ring_physical`` (scalar gates): records read by physical slot, the
    decays as direct sums over an [R, R] mask, so that no address waits for origin/count (H200, batch 256, 14-22 us
    slower than reading in logical order). ``_prefetch`` (split): the replay launch loads each checkpoint tile before
    its row's count arrives (a flushing row's tile is then read for nothing). ``_ticket=False`` (diagnostics): count
    read plainly and left unchanged. ``_nvfp4_pairs`` (an nvfp4 read copy; default on): load the copy's bytes once
    as a byte tile and interleave the decoded nibbles; off, one byte load per nibble (same values; H200, batch 256,
    host-phase cycle 712 vs 673 us). ``_kda_weights`` (per-key gates; default on): a small launch first computes
    each (row, value head)'s decay since the checkpoint and record weights once (``_kda_weights_kernel``), which the
    replay programs of its V tiles read instead of each recomputing the [R, K] decays (launches that fold with the
    flush dot still compute their own); off, every V tile computes them (H200, Kimi-Linear, rows in mixed phases,
    each at its best tile: batch 256 292 vs 500 us, batch 64 89 vs 136). ``_gdn_weights`` (scalar gates; off by
    default): the same pre-launch for the launches with replaying programs (host positions, device positions fused
    or the replay launch of a split step), so that those programs skip the records' keys and their reductions over K
    (a flushing program computes its record decays itself; compile-only counts for sm_90 in ``BENCHMARKS.md``). H200,
    Qwen3-Next at [64, 2] (runs 89 / 95): host positions 208-211 vs 211-212 us at batch 256 (0.3-1 %), device
    positions with rows in mixed phases 241.6 vs 227.9 (6 % slower; batch 64 70.9 vs 66.9), so it stays off.
    ``_weights_warps``: the warps of that pre-launch (:data:`KDA_WEIGHTS_WARPS` when not given). ``_chunk_k`` (0:
    off; the fp32 checkpoint or a read copy, the replay-only launches: host positions, or a split step's replay
    launch): stream the checkpoint (an fp8 copy's codes with its row scales folded into q and k, an nvfp4 copy decoded
    chunk by chunk) ``_chunk_k`` rows of K at a time (:func:`_chunked_checkpoint_products`) instead of holding the whole
    tile in registers (GDN's [128, 64] x 2 replay needs 238 registers, 12.5 % occupancy); sm_90: chunks of 16 at
    [128, 64] x 2 155 registers, of 32 at [128, 64] x 4 94. It stays off: H200, batch 256, host positions (run 104)
    GDN 206.5 us unchunked against 209.5-306.7 over five chunk / tile pairs, KDA 261.0 against 264.0-343.8 (the
    chunks' loads serialise with the products they feed). ``_flush_grid`` (split steps with the fp32 checkpoint, no
    exact fold, records in logical order, the flush folding with the product (KDA's folds with the loop unless
    ``_flush_dot=True``), up to ``kernels.flush_grid.MAX_BATCH`` rows): ``"batch"`` (a program per
    tile of every row; those of rows not due exit after reading their count) or ``"device"``
    (``_delta_flush_due_kernel`` on a device-sized grid walks the due rows' tiles at :func:`flush_due_launch_config`
    or ``_flush_config`` ``(BLOCK_V, num_warps)``, which with ``"batch"`` is the split step's flush launch tile; the
    same expressions). Run 104, batch 256, rows in mixed phases: the split step with it GDN
    261.3 us, KDA 355.3 (four-warp weights), against the fused default's 236.4 / 281.2, so the default stays "batch"
    (and fused). ``_walk`` (replay-only launches reading the fp32 checkpoint: host positions, or a split step's
    replay launch): ``dict(programs_per_sm=..., num_stages=...)`` runs them as ``_delta_replay_walk_kernel``, a
    device-sized grid whose programs walk the tiles with their loads pipelined ``num_stages`` deep, and with
    ``compact=True`` a split step's replay launch (up to ``kernels.flush_grid.MAX_BATCH`` rows; past it the key is
    ignored) walks only the replaying rows' items; ``block_v`` / ``num_warps``: the walk's own tile (a split step's
    flush launch keeps the step's); ``None``: the per-tile launch; ``"auto"`` (the default): the
    host-phase replay-only launch of the fp32 checkpoint walks at :func:`host_walk_launch_config` when no tile is
    forced (``_block_v`` / ``_num_warps``), and with device positions GDN's step runs split with a walking replay
    launch where :func:`device_walk_launch_config` says so (see ``_split``); everything else runs per tile (a
    split step's replay launch walking at 2 programs per SM: run 116, GDN 306 us against 227). ``_exact_solve``
    (an exact fold, ``buffer_len`` up to the ring's tile; off by default): a flushing program
    solves the records' corrected values at once (:func:`_exact_fold_solved`) instead of stepping them one record at
    a time over its state tile, its flush launches (host positions, or a split step's) on
    :func:`host_flush_launch_config`'s tile for it. It stays off: slower (H200, Qwen3-Next batch 256, run 131, fp8
    copy: the flush-only launch 1403.6 us at its best tile against the stepped fold's 1015.1; batch 64 360.1 against
    267.3): the three small products and the [R, R] inverse cost more than the 2 x 15 passes they replace.
    ``_solve_weights`` (with ``_exact_solve``, the flush-only launches: host positions or a split step; off,
    untimed): a pre-launch (``_delta_solve_kernel``, one program per (row, value head)) computes the [R, R] inverse,
    the decays and the fold's weights once per head, and the flush programs of every V tile read them
    (``SOLVE_GIVEN``) instead of each repeating the Gram product and the forward substitution; what is left per tile
    is the three products with the state tile (tf32x3 tensor-core passes). Same values within float32 rounding.
    Per-key gates (KDA, built offline in the fortieth session, untimed): A's rows take each its own decays
    (:func:`_solved_chain_per_key`), and the pre-launch hands the flush programs T diag(beta) and the keys decayed
    since the checkpoint and to the flush, so they load no record key or gate; sm_90, Triton 3.6, batch 256, outputs
    from an fp8 copy: the flush program on [K, 32] x 4 246 registers in-program, 217 given, none spilled (the stepped
    fold's [K, 32] x 1: 255 and spills). ``_solve_warps``: the pre-launch's warps (default :data:`SOLVE_WARPS`, per-key
    gates :data:`KDA_SOLVE_WARPS`). ``_newest_first`` (per-key gates; ``"auto"``: :data:`NEWEST_FIRST_DEFAULT`, off:
    slower on the H200, run 218): the weights pre-launch reads the records newest first (:func:`_newest_first_decays`),
    so their decays are a forward scan over the rows, and stores the weights in logical order (same values within
    float32 rounding: the scan sums in another order). Why: its gate tile's rows span two lanes and Triton 3.6 lowers
    the reverse scan with 832 of the launch's 970 warp shuffles (sm_90, batch 256); newest first 330 (2680 -> 2152
    instructions, 128 -> 156 registers). At a shuffle a clock per SM, 8192 programs x 970 are about 34 us of the
    launch's 45.7 (H200, run 102). ``_flush_weights`` (exact fold, ``flush_reads_copy``; ``"auto"``:
    :data:`FLUSH_WEIGHTS_DEFAULT`, by gate kind: on for per-key gates since run 218): the flush-only launches (host
    phase 2, a split step's 3) take the decay and the records' weights for their outputs from the weights pre-launch
    (KDA's split step runs it anyway for its replay launch; otherwise it is one more launch a period) instead of every V
    tile loading the record keys and, for per-key gates, scanning their [R, K] decays; same expressions. Offline, sm_90,
    Triton 3.6, batch 256 (registers / spilled bytes / warp shuffles / static instructions): KDA's host flush reading an
    fp8 copy 255 / 216 / 1337 / 6216 -> 244 / 0 / 377 / 3400; its split step's flush launch fp8 255 / 192 / 858 / 5688
    -> 255 / 0 / 374 / 4032, nvfp4 255 / 0 / 1201 / 4776 -> 128 / 0 / 233 / 2192; GDN's host flush fp8 128 / 0 / 355 /
    2912 -> 128 / 0 / 233 / 2024, nvfp4 168 -> 128 registers.
    ``_flush_scale_per_row`` (default on; ``flush_reads_copy`` with an fp8 copy): the host-positions flush-only
    launch decodes the copy's tile with one scale load per row instead of one per element (H200, batch 256, run 188,
    host cycle as the cache runs it: Qwen3-Next 201.6 -> 200.0 us, Kimi-Linear 250.7 -> 245.8); a split step's flush
    launch keeps the per-element loads (per row it measured slower: in phase 218.5 -> 220.5 / 279.6 -> 285.7, mixed
    300.8 -> 303.4 / 353.4 -> 367.9). Either way GDN's flush giving its outputs from an fp8 copy cost 25 us per
    step more than the plain flush (nvfp4 1.2; run 187). ``_flush_code_vector`` (default 4; 0: off) answers the
    cause: Nsight Compute (run 192, batch 256) put that launch at 1.24 ms against the plain flush's 0.80 (nvfp4 0.85
    / 0.85), with twice the shared-memory pipe load and 512 bytes of shared memory against 256. Triton 3.6 loads the
    [K, 16] fp8 codes 16 bytes to a thread (sizePerThread [1, 16]: one thread per key row), and that layout carried
    over to the exact fold, whose reductions over the keys then take warp shuffles where the plain flush reduces in
    registers, then a conversion at the store; loading the codes 4 to a vector keeps the fold in the plain flush's
    layout (offline, sm_90: PTX shuffles 486 -> 350 as nvfp4's; KDA 1444 -> 1332). H200, batch 256 (run 196): that
    launch 1240 -> 859 us (plain 807; KDA 1360 -> 1220, plain 1200); the host cycle with the flush's outputs from
    the fp8 copy, not re-encoded, 4.0 us over the plain flush's cycle (162.2; run 188: 25.6); as the cache runs it
    (the copy re-encoded after the flush) Qwen3-Next 197.6 -> 176.1 us (1.39x -> 1.56x our standard step),
    Kimi-Linear 242.7 -> 234.1 (1.14x -> 1.19x). ``_split_flush_code_vector`` (default 4; 0: off) does the same for
    a split step's flush launch (phase 3) reading an fp8 copy (offline: GDN shuffles 622 -> 510; KDA 940 -> 852
    but spills 308 -> 468 bytes) and gains there too (run 196, device step: GDN mixed 297.2 -> 288.9 us, in phase
    216.0 -> 211.8; KDA 349.5 -> 329.3, 276.5 -> 259.9). ``_replay_code_vector`` (default 0: off) does it for the
    streamed replay launches reading an fp8 copy (host phase 1, a split step's 4); offline, sm_90, batch 256: KDA's
    shuffles 143 -> 15, spills 212 -> 192 bytes; GDN's spills 292 -> 360. Slower on the H200 (run 200, batch 256,
    us per step: host cycle as the cache runs it GDN 176.1 -> 184.0, KDA 233.9 -> 239.9; device step in phase
    211.7 -> 215.6, 259.9 -> 267.8; mixed 289.1 -> 292.4, 329.4 -> 338.5): the replay launches' shuffles were not
    what held them, so it stays off. ``_reload_token`` (the exact fold, stepped): the flush reads the token's q, k, v,
    beta, g again after the records' loop instead of holding them through it (same values, bit for bit); offline,
    sm_90, batch 256, the host flush giving its outputs from an fp8 copy: KDA spills 336 -> 216 bytes (plain
    464 -> 364), GDN 168 -> 128 registers. H200, batch 256 (run 204, us per step): host cycle as the cache runs it
    GDN fp8 176.0 -> 170.7, KDA fp8 234.2 -> 233.5, KDA nvfp4 224.2 -> 222.5, but GDN nvfp4 181.2 -> 183.7; device
    step (mixed / in phase) GDN fp8 267.6 / 206.9 -> 266.6 / 206.7, KDA fp8 329.1 / 260.1 -> 326.0 / 257.0, nvfp4
    GDN 278.1 -> 275.8 mixed, KDA 386.2 -> 384.0. ``"auto"`` (the default): on, except a host-phase step of a
    scalar gate reading an nvfp4 copy (:func:`reload_token_default`). ``_late_records`` (``_chunk_k`` launches;
    ``"auto"``, the default: on for those streaming a read copy, off for the fp32 checkpoint, whose streaming was never
    the default): the records' values [R, BLOCK_V] are loaded after the streamed checkpoint products instead of before,
    so they are not held through the stream; offline, sm_90, batch 256, the host replay-only launch reading a copy
    (registers / spilled bytes, chunks of 16 -> with it; chunks of 8; chunks of 4 with it): GDN fp8 255 / 292 ->
    255 / 56, 254 / 0 -> 229 / 0, 160; nvfp4 255 / 516 -> 255 / 92, 254 -> 243, 161; KDA fp8 255 / 212 -> 253 / 0,
    228 -> 185, 146; KDA nvfp4 on [K, 32] 117 -> 111, 90 -> 72, 63. Fewer registers let more programs share an SM
    (255: 8 one-warp programs; 160: 12), while smaller chunks keep fewer bytes in flight per program. H200, batch
    256 (run 212, ``read_copy_defaults.py --stream-tiles --stream-late``): the default chunks of 16 with it won on
    three of four copies (host cycle as the cache runs it GDN fp8 170.8 -> 149.8 us, 1.83x our standard step; KDA
    fp8 233.4 -> 207.8; GDN nvfp4 181.4 -> 161.4), chunks of 8 with it on Kimi-Linear's nvfp4 copy (222.4 -> 197.7
    on a whole head; :func:`read_copy_stream_config`); chunks of 4 lost (GDN fp8 171.8, KDA fp8 224.1) though they
    hold no more than 160 registers: the Nsight Compute run 211 has the replay launch at 14 records on 41 % of DRAM
    bandwidth at 12 % achieved occupancy (GDN fp8), 17 % with chunks of 4, and still 124.5 against 125.7 us."""
    batch, value_heads, key_heads, key_dim, value_dim, per_key = _check_step_inputs(state, q, k, v, beta, g)
    _flush_weights = FLUSH_WEIGHTS_DEFAULT[per_key] if _flush_weights == "auto" else bool(_flush_weights)
    phase = host_phase(origin, count, buffer_len)
    ring_size = ring_k.shape[1]
    _newest_first = NEWEST_FIRST_DEFAULT if _newest_first == "auto" else bool(_newest_first)
    assert ring_k.shape == (batch, ring_size, key_heads, key_dim), f"ring_k must be [B, R, Hk, K], got {ring_k.shape}"
    assert ring_d.shape == (batch, ring_size, value_heads, value_dim), (
        f"ring_d must be [B, R, Hv, V], got {ring_d.shape}")
    assert ring_g.shape == (batch, ring_size, *g.shape[1:]), (
        f"ring_g must be [B, R, {'Hv, K' if per_key else 'Hv'}] like g, got {tuple(ring_g.shape)}")
    if phase == 0:
        assert origin.shape == (batch,) and count.shape == (batch,), "origin and count must be [B]"
        assert origin.dtype == torch.int32 and count.dtype == torch.int32, "origin and count must be int32"
    assert 1 <= buffer_len < (1 << _TICKET_SHIFT), "buffer_len out of range"
    assert ring_size >= max(buffer_len - 1, 1), f"ring capacity {ring_size} < max(buffer_len - 1, 1)"
    read_format, read_operands = read_copy_operands(read_copy, read_format, state)
    # the nvfp4 tile loaded byte by byte per nibble, or as whole bytes (see kernels/read_copy.py)
    kernel_read_format = "nvfp4_pairs" if read_format == "nvfp4" and _nvfp4_pairs else read_format
    reload_token = (reload_token_default(read_format, per_key, device_positions=phase == 0)
                    if _reload_token == "auto" else bool(_reload_token))
    # streamed launches of a read copy load the records' values after the stream (run 212)
    late_records = read_format != "fp32" if _late_records == "auto" else bool(_late_records)
    exact_fold = ring_v is not None or ring_beta is not None
    if exact_fold:
        if ring_v is None or ring_beta is None:
            raise ValueError("ring_v and ring_beta come together (the raw records of an exact fold)")
        if tuple(ring_v.shape) != (batch, ring_size, value_heads, value_dim):
            raise ValueError(f"ring_v must be [B, R, Hv, V] like ring_d, got {list(ring_v.shape)}")
        if tuple(ring_beta.shape) != (batch, ring_size, value_heads):
            raise ValueError(f"ring_beta must be [B, R, Hv], got {list(ring_beta.shape)}")
    raw_records = (ring_v, ring_beta, *ring_v.stride(), *ring_beta.stride()) if exact_fold else (
        ring_d, ring_d, *(0,) * 7)  # unused pointers
    o = torch.empty_like(v) if out is None else out
    assert o.shape == v.shape
    scale = key_dim ** -0.5 if scale is None else float(scale)

    # the flush-only launches' fold (host phase 2, a split step's 3): the product, or for per-key gates with the
    # weights pre-launch the loop (the product's per-key tiles spill: sm_90, KDA [128, 16] x 1, 6124 B)
    host_flush_v, host_flush_warps, flush_only_dot = host_flush_launch_config(
        batch, value_heads, key_dim, value_dim, per_key, kda_weights=bool(_kda_weights), exact_fold=exact_fold,
        exact_solve=bool(_exact_solve), solve_given=bool(_exact_solve) and bool(_solve_weights))
    if phase == 2:  # the host-phase flush reads the fp32 checkpoint alone, at its own tile
        block_v, num_warps = host_flush_v, host_flush_warps
    else:
        block_v, num_warps = replay_launch_config(batch, value_heads, key_dim, value_dim, per_key, read_format,
                                                  device_phase=phase == 0, kda_weights=bool(_kda_weights))
    if isinstance(_split, str) and _split != "auto":
        raise ValueError(f"_split must be a bool or 'auto', got {_split!r}")
    if isinstance(_walk, str):
        if _walk != "auto":
            raise ValueError(f"_walk must be a dict, None or 'auto', got {_walk!r}")
        auto = (read_format == "fp32" and not exact_fold and not _chunk_k and _block_v is None
                and _num_warps is None)
        walk_cfg = host_walk_launch_config(batch, key_dim, value_dim) if auto and phase == 1 else None
        _walk = None
        if walk_cfg is not None:
            block_v, num_warps, _walk = walk_cfg
        if (auto and phase == 0 and _split == "auto" and bool(_count_launch) and bool(_ticket)
                and not _ring_physical):
            _walk = device_walk_launch_config(batch, key_dim, per_key)
            _split = _walk is not None
    stream = None  # a read copy's replay-only launches streaming it (read_copy_stream_config)
    stream_flush_tile = None  # ... and a split step's flush launch then (read_copy_split_flush_config)
    if read_format != "fp32" and not _chunk_k and _block_v is None and _num_warps is None and _walk is None:
        stream = read_copy_stream_config(batch, key_dim, per_key, read_format, device_phase=phase == 0,
                                         value_dim=value_dim)
    if stream is not None and phase == 1:
        block_v, num_warps, _chunk_k = stream
    elif (stream is not None and phase == 0 and _split in ("auto", True) and bool(_count_launch) and bool(_ticket)
          and not _ring_physical):
        block_v, num_warps, _chunk_k = stream
        stream_flush_tile = read_copy_split_flush_config(value_dim, read_format)
        _split = True
    if _split == "auto":
        _split = False
    block_v, num_warps = _block_v or block_v, _num_warps or num_warps
    grid = (cdiv(value_dim, block_v), batch, value_heads)
    assert grid[0] * value_heads < (1 << (31 - _TICKET_SHIFT)), "too many programs per row for the count ticket"
    positions, strides, host = ((origin, count), (origin.stride(0), count.stride(0)), (0, 0)) if phase == 0 else (
        (state, state), (0, 0), (origin, count))  # host phase: the pointers are unused
    # Kernel phases: the host's phase, or on the device one fused launch (0) or two (3: flushes, then 4: replays).
    flush_reads_copy = bool(flush_reads_copy) and read_format != "fp32"
    split = phase == 0 and bool(_split)
    launches = (3, 4) if split else (phase,)
    count_launch = phase == 0 and bool(_count_launch) and bool(_ticket)
    block_k, block_r = max(16, next_power_of_2(key_dim)), max(16, next_power_of_2(ring_size))

    def uses_dot(kernel_phase):
        # Flush-only programs (their registers do not throttle replay programs) as host_flush_launch_config says
        if _flush_dot is not None:
            return bool(_flush_dot)
        if kernel_phase in (2, 3):
            return flush_only_dot
        return flush_uses_dot(per_key)

    # per-key gates: every launch that folds without the dot; scalar gates: the launches with replaying programs
    # (a flushing program of the fused launch computes its record decays itself), reading the ring in logical order
    # like the pre-launch
    # (_flush_weights: also an exact fold's flush-only launch whose outputs come from the copy)
    weighted = {phase_: (per_key and bool(_kda_weights) and not uses_dot(phase_))
                or ((bool(_kda_weights) or not per_key) and bool(_flush_weights) and exact_fold and flush_reads_copy
                    and not _ring_physical and phase_ in (2, 3))
                or (not per_key and bool(_gdn_weights) and not _ring_physical and phase_ in (0, 1, 4))
                for phase_ in launches}
    weights = state  # (unused pointer)
    if any(weighted.values()):
        weights = torch.empty((batch, value_heads, block_k + 2 * block_r), dtype=torch.float32, device=v.device)

    exact_solve = bool(_exact_solve)
    if exact_solve and (not exact_fold or buffer_len > block_r):
        raise ValueError("_exact_solve solves the exact fold's records at once: it needs the raw records (ring_v, "
                         f"ring_beta) and buffer_len <= {block_r} (the ring's tile); got exact fold {exact_fold}, "
                         f"buffer_len {buffer_len}")
    if _chunk_k:  # the replay-only launches (host phase 1, a split step's 4) stream the fp32 checkpoint
        if _chunk_k & (_chunk_k - 1) or not 1 <= _chunk_k <= block_k:
            raise ValueError(f"_chunk_k must be a power of two up to {block_k}, got {_chunk_k}")
        if per_key and not _kda_weights:
            raise ValueError("_chunk_k streams the checkpoint (or the read copy) of replay-only launches: it needs "
                             "the weights pre-launch for per-key gates")
        if phase == 0 and not split:
            raise ValueError("_chunk_k needs the replay-only launches: host positions or a split step (_split=True)")
    # _solve_weights: the solved fold's chain over the records by a per-head pre-launch, read by the flush-only
    # launches (host phase 2, a split step's 3); a replay-only host step has no flush to serve
    solve = state  # (unused pointer)
    if _solve_weights:
        if not exact_solve or (phase == 0 and not split):
            raise ValueError("_solve_weights serves the solved exact fold (_exact_solve=True) of a flush-only launch: "
                             "host positions, or a split step (_split=True)")
        if phase != 1:
            solve = torch.empty((batch, value_heads, solve_entry_size(block_r, block_k if per_key else 0)),
                                dtype=torch.float32, device=v.device)

    # a split step's flush launch (per-row grid): _flush_config, a solved exact fold's own tile, a streamed read
    # copy's; else the step's
    split_flush_tile = tuple(_flush_config) if _flush_config is not None else (
        (host_flush_v, host_flush_warps) if exact_solve else stream_flush_tile)
    # (the device-grid flush kernel folds with the product alone)
    flush_on_device_grid = (use_device_grid(_flush_grid, batch) and split and not exact_fold and not flush_reads_copy
                            and not _ring_physical and uses_dot(3))
    if _walk is not None:
        unknown = set(_walk) - {"programs_per_sm", "num_stages", "compact", "block_v", "num_warps"}
        serves = phase == 1 or (split and count_launch and not flush_reads_copy and not _ring_physical)
        if unknown or not serves or read_format != "fp32" or exact_fold or _chunk_k:
            raise ValueError("_walk (keys programs_per_sm, num_stages, compact, block_v, num_warps) serves the "
                             "replay-only launches reading the fp32 checkpoint without an exact fold or _chunk_k: "
                             "host positions, or a split step (_split=True) with the count launch; got "
                             f"{dict(_walk)} at host phase "
                             f"{phase} (0: device positions), split {split}, count launch {count_launch}, read format "
                             f"{read_format}")

    def launch_walk(kernel_phase):
        compact = kernel_phase == 4 and bool(_walk.get("compact", False)) and batch <= FLUSH_GRID_MAX_BATCH
        # the walk's own tile where given (a split step's flush launch keeps the step's)
        walk_v, walk_warps = int(_walk.get("block_v", block_v)), int(_walk.get("num_warps", num_warps))
        items = cdiv(value_dim, walk_v) * batch * value_heads
        programs = flush_grid_programs(v.device, items, _walk.get("programs_per_sm", 2))
        LAST_COMPILED[f"replay_phase{kernel_phase}"] = LAST_COMPILED["replay"] = _delta_replay_walk_kernel[
            (programs,)](
            state, ring_k, ring_d, ring_g, *positions, q, k, v, beta, g, o, weights,
            items, batch, value_heads, key_dim, value_dim, ring_size, value_heads // key_heads,
            scale, *host, *strides,
            *state.stride(), *ring_k.stride(), *ring_d.stride(), *_ring_gate_strides(ring_g),
            *q.stride(), *k.stride(), *v.stride(), *beta.stride(), *_gate_strides(g), *o.stride(),
            GATE_PER_KEY=per_key,
            USE_QK_L2NORM=bool(use_qk_l2norm),
            WEIGHTS_GIVEN=weighted[kernel_phase],
            BLOCK_K=block_k,
            BLOCK_V=walk_v,
            BLOCK_R=block_r,
            NUM_STAGES=int(_walk.get("num_stages", 2)),
            BUFFER_LEN=buffer_len,
            DEVICE_POSITIONS=kernel_phase == 4,
            COMPACT=compact,
            BLOCK_B=next_power_of_2(batch) if compact else 1,
            num_warps=walk_warps,
        )

    def launch_flush_due():
        flush_v, flush_warps = _flush_config or flush_due_launch_config(key_dim, value_dim)
        LAST_COMPILED["replay_phase3"] = LAST_COMPILED["flush_due"] = _delta_flush_due_kernel[
            (flush_grid_programs(v.device, batch * cdiv(value_dim, flush_v) * value_heads),)](
            state, ring_k, ring_d, ring_g, origin, count, q, k, v, beta, g, o, flush_amax,
            batch, value_heads, key_dim, value_dim, ring_size, value_heads // key_heads, scale,
            *state.stride(), *ring_k.stride(), *ring_d.stride(), *_ring_gate_strides(ring_g),
            origin.stride(0), count.stride(0),
            *q.stride(), *k.stride(), *v.stride(), *beta.stride(), *_gate_strides(g), *o.stride(),
            BUFFER_LEN=buffer_len,
            GATE_PER_KEY=per_key,
            USE_QK_L2NORM=bool(use_qk_l2norm),
            BLOCK_K=block_k,
            BLOCK_V=flush_v,
            BLOCK_R=block_r,
            BLOCK_B=next_power_of_2(batch),
            FLUSH_PRECISION=FLUSH_PRECISION,
            FLUSH_AMAX=flush_amax is not state,
            num_warps=flush_warps,
        )

    def launch(kernel_phase):
        if kernel_phase == 3 and flush_on_device_grid:
            return launch_flush_due()
        if kernel_phase in (1, 4) and _walk is not None:
            return launch_walk(kernel_phase)
        flush_only = kernel_phase in (2, 3)
        flush_dot = uses_dot(kernel_phase)
        ring_physical = bool(_ring_physical) and not per_key
        launch_v, launch_warps, launch_grid = block_v, num_warps, grid
        if kernel_phase == 3 and split_flush_tile is not None:  # a split step's flush launch on a tile of its own
            launch_v, launch_warps = split_flush_tile
            launch_grid = (cdiv(value_dim, launch_v), batch, value_heads)
        solve_given = solve is not state and kernel_phase in (2, 3)  # the flush-only launches read the solve scratch
        kernel = _delta_replay_step_kernel[launch_grid](
            state, ring_k, ring_d, ring_g, *positions, q, k, v, beta, g, o, *read_operands[:3], *raw_records[:2],
            weights, solve, flush_amax,
            key_dim, value_dim, ring_size, value_heads // key_heads, scale, *host,
            *state.stride(), *ring_k.stride(), *ring_d.stride(), *_ring_gate_strides(ring_g),
            *strides,
            *q.stride(), *k.stride(), *v.stride(), *beta.stride(), *_gate_strides(g), *o.stride(),
            *read_operands[3:], *raw_records[2:],
            BUFFER_LEN=buffer_len,
            PHASE=kernel_phase,
            GATE_PER_KEY=per_key,
            USE_QK_L2NORM=bool(use_qk_l2norm),
            TICKET=bool(_ticket) and not count_launch,
            RING_PHYSICAL=bool(ring_physical),
            BLOCK_K=block_k,
            BLOCK_V=launch_v,
            BLOCK_R=block_r,  # >= 16: the flush's tl.dot needs it on the GPU
            FLUSH_DOT=flush_dot,
            FLUSH_PRECISION=FLUSH_PRECISION,
            # a flush-only launch (host phase 2, a split step's 3) reads the copy only for a flushing row's output
            # (flush_reads_copy)
            READ_FORMAT="fp32" if flush_only and not flush_reads_copy else kernel_read_format,
            EXACT_FOLD=exact_fold,
            PREFETCH_STATE=kernel_phase == 4 and read_format == "fp32" and bool(_prefetch) and not _chunk_k,
            FLUSH_READS_COPY=flush_reads_copy and kernel_phase in (0, 2, 3),
            EXACT_SOLVE=exact_solve,
            WEIGHTS_GIVEN=weighted[kernel_phase],
            CHUNK_K=_chunk_k if kernel_phase in (1, 4) else 0,
            FLUSH_AMAX=flush_amax is not state and kernel_phase in (0, 2, 3),
            COPY_SCALE_PER_ROW=bool(_flush_scale_per_row) and kernel_phase == 2,
            CODE_VECTOR=_code_vector(kernel_phase, kernel_read_format, flush_reads_copy, bool(_chunk_k),
                                     _flush_code_vector, _split_flush_code_vector, _replay_code_vector),
            RELOAD_TOKEN=reload_token and exact_fold and not exact_solve,
            LATE_RECORDS=late_records and bool(_chunk_k) and kernel_phase in (1, 4),
            SOLVE_GIVEN=solve_given,
            num_warps=launch_warps,
        )
        LAST_COMPILED[f"replay_phase{kernel_phase}"] = LAST_COMPILED["replay"] = kernel

    # reencode_copy: a flushing row's copy re-encoded from its new checkpoint by the re-encode launch after the
    # step; nvfp4 (_flush_amax): the flush launches fold each flushing row's max |new checkpoint| into a zeroed [B]
    # scratch as they store it, and the re-encode takes it instead of reading the checkpoint once more for it
    # (state stands in as the unused pointer otherwise)
    reencode_copy = bool(reencode_copy) and read_format != "fp32" and phase != 1
    flush_amax = state
    if reencode_copy and read_format == "nvfp4" and _flush_amax:
        flush_amax = torch.zeros(batch, dtype=torch.int32, device=state.device)
    with _device_guard(v):
        if weights is not state:  # before the step's launches: the counts they read are the old ones
            LAST_COMPILED["kda_weights"] = _kda_weights_kernel[(batch, value_heads)](
                ring_k, ring_g, *positions, q, k, g, weights,
                key_dim, ring_size, value_heads // key_heads, scale, *host,
                *ring_k.stride(), *_ring_gate_strides(ring_g), *strides,
                *q.stride(), *k.stride(), *_gate_strides(g),
                DEVICE_POSITIONS=phase == 0,
                USE_QK_L2NORM=bool(use_qk_l2norm),
                BLOCK_K=block_k,
                BLOCK_R=block_r,
                GATE_PER_KEY=per_key,
                NEWEST_FIRST=per_key and bool(_newest_first),
                num_warps=_weights_warps or KDA_WEIGHTS_WARPS,
            )
        if solve is not state:  # before the flush launch, from the same counts
            LAST_COMPILED["delta_solve"] = _delta_solve_kernel[(batch, value_heads)](
                ring_k, ring_g, ring_beta, *positions, k, beta, g, solve,
                key_dim, ring_size, value_heads // key_heads, *host,
                *ring_k.stride(), *_ring_gate_strides(ring_g), *ring_beta.stride(), *strides,
                *k.stride(), *beta.stride(), *_gate_strides(g),
                DEVICE_POSITIONS=phase == 0,
                USE_QK_L2NORM=bool(use_qk_l2norm),
                BLOCK_K=block_k,
                BLOCK_R=block_r,
                FLUSH_PRECISION=FLUSH_PRECISION,
                GATE_PER_KEY=per_key,
                num_warps=_solve_warps or (KDA_SOLVE_WARPS if per_key else SOLVE_WARPS),
            )
        for kernel_phase in launches:  # in stream order: the replay launch (4) reads the counts the flush one read
            launch(kernel_phase)
        if count_launch:
            advance_counts(count, buffer_len)
        if reencode_copy:
            reencode_flushed_rows(state, read_copy, read_format, count if phase == 0 else None,
                                  None if flush_amax is state else flush_amax)
    return o


def _state_update(state, q, k, v, beta, g, use_qk_l2norm=True, scale=None, out=None, _block_v=None,
                  _num_warps=None):
    batch, value_heads, key_heads, key_dim, value_dim, per_key = _check_step_inputs(state, q, k, v, beta, g)
    o = torch.empty_like(v) if out is None else out
    assert o.shape == v.shape
    scale = key_dim ** -0.5 if scale is None else float(scale)
    block_v, num_warps = state_update_launch_config(batch, value_heads, key_dim, value_dim, per_key)
    block_v, num_warps = _block_v or block_v, _num_warps or num_warps
    grid = (cdiv(value_dim, block_v), batch, value_heads)
    with _device_guard(v):
        LAST_COMPILED["state_update"] = _delta_state_update_kernel[grid](
            state, q, k, v, beta, g, o,
            key_dim, value_dim, value_heads // key_heads, scale,
            *state.stride(), *q.stride(), *k.stride(), *v.stride(), *beta.stride(), *_gate_strides(g), *o.stride(),
            GATE_PER_KEY=per_key,
            USE_QK_L2NORM=bool(use_qk_l2norm),
            BLOCK_K=next_power_of_2(key_dim),
            BLOCK_V=block_v,
            num_warps=num_warps,
        )
    return o


def delta_replay_step(
    state: torch.Tensor,
    ring_k: torch.Tensor,
    ring_d: torch.Tensor,
    ring_g: torch.Tensor,
    origin: torch.Tensor | int,
    count: torch.Tensor | int,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    g: torch.Tensor,
    buffer_len: int = 16,
    use_qk_l2norm: bool = True,
    scale: float | None = None,
    out: torch.Tensor | None = None,
    read_copy: dict[str, torch.Tensor] | None = None,
    read_format: str | None = None,
    ring_v: torch.Tensor | None = None,
    ring_beta: torch.Tensor | None = None,
    flush_reads_copy: bool = False,
    reencode_copy: bool = False,
) -> torch.Tensor:
    """Fused ReplaySSM decode step for a gated delta rule layer (one launch, phase decided per row on the device).

    state [B, Hv, K, V] checkpoint (float32 recommended; any float dtype is loaded/stored as such);
    ring_k [B, R, Hk, K] raw keys, ring_d [B, R, Hv, V] float32, ring_g [B, R, Hv] (GDN) or [B, R, Hv, K] (KDA)
    float32; origin, count [B] int32; q, k [B, Hk, K] raw; v [B, Hv, V]; beta [B, Hv]; g [B, Hv] or [B, Hv, K]
    (log decay). R >= buffer_len - 1 and 0 <= count[b] < buffer_len.

    Row b replays when ``count[b] + 1 < buffer_len`` (output from checkpoint + records, record (raw k, d, g)
    appended at slot ``(origin[b] + count[b]) % R``, ``count[b] += 1``, state untouched) and flushes otherwise
    (records + token folded into ``state[b]`` in place, ``count[b] = 0``, ``origin[b]`` unchanged). Keys and queries
    are l2-normalised in-kernel when ``use_qk_l2norm``; queries are scaled by ``scale`` (default K ** -0.5).
    Returns o [B, Hv, V] in v's dtype (or ``out``). Same semantics as :func:`delta_replay_step_ref`.

    ``origin`` and ``count`` may instead be host ints (every row at the same position, e.g. plain batched decoding
    with the positions mirrored on the host): the launch is then a kernel specialised to that phase (a replay-only
    or flush-only program: fewer registers, no position load, no count update) and the caller advances its own
    count.

    Separated precision: ``read_copy`` (with ``read_format`` "fp8" or "nvfp4") is a low-precision copy of ``state``
    in the checkpoint store's encoding (layouts in :mod:`hf_replayssm.ops.read_copy`; rows = the value dim).
    Replaying rows then take ``S0^T q`` and ``S0^T k`` from the copy, decoded in registers, and never read
    ``state``; so the corrected value ``d`` they append is the copy's. Flushing rows read and write ``state`` as
    without a copy (folding the ring's ``d`` records as they are) and do **not** re-encode the copy unless
    ``reencode_copy``: after a flush the caller must refresh the copy from the new checkpoint before the next replay
    step. ``reencode_copy`` (with a copy): a flushing row's copy is re-encoded from its new checkpoint in the same
    call (the re-encode launch after the step's launches; nvfp4: taking the batch row's amax from the flush
    launches, which fold it as they store), bit-identical to the store's encoding
    (:func:`hf_replayssm.kernels.read_copy_encode.reencode_read_copy`).

    Exact fold (what the separated policy needs, since the ring's ``d`` then saw the copy): with ``ring_v``
    [B, R, Hv, V] (v's dtype) and ``ring_beta`` [B, R, Hv] float32, replaying rows also append the token's raw v
    and beta, and flushing rows recompute every record's corrected value from (k, v, beta, g) against the fp32
    checkpoint, oldest first (the standard step's arithmetic), so no rounding of the copy enters the recurrence;
    ``o`` of a flushing row is then ``S^T q`` of that state, or with ``flush_reads_copy`` (device or host
    positions) the replay output from the copy and the records (the separated policy's flush step output), the fold
    unchanged.
    """
    return _replay_step(state, ring_k, ring_d, ring_g, origin, count, q, k, v, beta, g, buffer_len, use_qk_l2norm,
                        scale, out, read_copy, read_format, ring_v, ring_beta, flush_reads_copy=flush_reads_copy,
                        reencode_copy=reencode_copy)


def delta_state_update(
    state: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    g: torch.Tensor,
    use_qk_l2norm: bool = True,
    scale: float | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Standard gated delta rule decode step: ``P = diag(exp(g)) S``, ``d = beta (v - P^T k)``, ``S = P + k d^T``
    in place; returns ``o = S^T q`` [B, Hv, V] in v's dtype (or ``out``). Shapes as :func:`delta_replay_step`.
    Same semantics as :func:`delta_state_update_ref`."""
    return _state_update(state, q, k, v, beta, g, use_qk_l2norm, scale, out)
