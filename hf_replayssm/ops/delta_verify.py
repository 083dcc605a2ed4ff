"""Torch references of the gated delta rule (GDN / KDA) speculative verify / commit kernels in
``hf_replayssm.kernels.delta_verify``.

Same signatures and in-place semantics as the Triton kernels (compared in ``tests/test_kernels_verify.py``); written
for clarity: the batch loop runs on the host (reading ``origin``/``count``) and all math is float32.

A speculative step is one :func:`delta_verify_ref` (outputs and corrected values of a window of T tokens, their
records appended after the committed ones, nothing committed) followed by one :func:`delta_commit_ref` once the
number of accepted tokens per row is known. The corrected value ``d_t`` of window token t depends only on the
checkpoint, the committed records and window tokens before t, so the records of any accepted prefix are exactly what
one-token replay steps would have appended; rejected records stay beyond ``count`` and are overwritten by the next
window.

Shapes (B = batch, T = window, Hk = key heads, Hv = value heads, Hv % Hk == 0, K = key dim, V = value dim, R = ring
capacity): state [B, Hv, K, V] float32 checkpoint; ring_k [B, R, Hk, K] raw keys, ring_d [B, R, Hv, V] float32,
ring_g [B, R, Hv] (GDN) or [B, R, Hv, K] (KDA) float32 (records of row b at slots ``(origin[b] + j) % R``,
j < count[b]); origin, count, accepted [B] int32; q, k [B, T, Hk, K] raw; v [B, T, Hv, V]; beta [B, T, Hv];
g [B, T, Hv] or [B, T, Hv, K] (log decays).

Capacity: a window needs ``count[b] + T <= R``; since a commit leaves at most ``buffer_len - 1`` records, a ring of
``R >= buffer_len - 1 + T`` always fits.
"""

from __future__ import annotations

import torch

from .delta_rule import _gate, delta_replay
from .delta_step import delta_keys
from .positions import into, ring_slots


def _check_window(batch: int, window: int, q, k, v, beta, g) -> None:
    if k.dim() != 4 or k.shape[:2] != (batch, window) or q.shape != k.shape:
        raise ValueError(f"q and k must be [B, T, Hk, K], got {tuple(q.shape)} and {tuple(k.shape)}")
    if v.dim() != 4 or v.shape[:2] != (batch, window) or v.shape[2] % k.shape[2]:
        raise ValueError(f"v must be [B, T, Hv, V] with Hv a multiple of Hk, got {tuple(v.shape)}")
    if beta.shape != v.shape[:3]:
        raise ValueError(f"beta must be [B, T, Hv] = {tuple(v.shape[:3])}, got {tuple(beta.shape)}")
    if g.shape not in (v.shape[:3], (*v.shape[:3], k.shape[3])):
        raise ValueError(f"g must be [B, T, Hv] (GDN) or [B, T, Hv, K] (KDA), got {tuple(g.shape)}")


def delta_verify_ref(
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
    """Outputs of a window of T tokens per row; the state is not written and ``count`` is not changed.

    Token t of row b sees the checkpoint, the row's ``count[b]`` committed records and window tokens 0..t. Its
    corrected value ``d_t = beta_t (v_t - P_t^T k_t)`` is taken against the state implied by the checkpoint, the
    committed records and window tokens before t, and its record (raw k, d, g) is written at slot
    ``(origin[b] + count[b] + t) % R``. Raises ValueError if ``count[b] + T > R`` for some row (the Triton kernel
    instead returns NaN for that row and writes nothing). Returns o [B, T, Hv, V] in v's dtype, or writes it into
    ``out``.
    """
    batch, ring_size = ring_k.shape[:2]
    window = k.shape[1]
    _check_window(batch, window, q, k, v, beta, g)
    if ring_g.dim() != g.dim():
        raise ValueError("ring_g and g must have the same gate kind ([B, R, Hv] with [B, T, Hv], or with K)")
    value_heads, key_dim = v.shape[2], k.shape[-1]
    scale = key_dim ** -0.5 if scale is None else scale
    qn = delta_keys(q, value_heads, use_qk_l2norm) * scale  # [B, T, Hv, K]
    kn = delta_keys(k, value_heads, use_qk_l2norm)
    outs = []
    for b in range(batch):
        start, num = int(origin[b]), int(count[b])
        if num < 0 or num + window > ring_size:
            raise ValueError(f"row {b}: count {num} + window {window} exceeds the ring capacity {ring_size}")
        slots = ring_slots(start, num, ring_size, k.device)
        hist_k = delta_keys(ring_k[b, slots], value_heads, use_qk_l2norm)[None]
        o, d = delta_replay(state[b : b + 1], hist_k, ring_d[b, slots][None].float(), ring_g[b, slots][None].float(),
                            qn[b : b + 1], kn[b : b + 1], v[b : b + 1], beta[b : b + 1].float(), g[b : b + 1].float())
        outs.append(o[0])
        new = (start + num + torch.arange(window, device=k.device)) % ring_size
        ring_k[b, new] = k[b].to(ring_k.dtype)
        ring_d[b, new] = d[0].to(ring_d.dtype)
        ring_g[b, new] = g[b].to(ring_g.dtype)
    o = torch.stack(outs)
    if out is None:
        return o.to(v.dtype)
    out.copy_(o)
    return out


def delta_fold_records(state_row: torch.Tensor, k: torch.Tensor, d: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """The sequential recurrence ``S = diag(exp(g_j)) S; S += k_j d_j^T`` over records k [M, Hv, K] (normalised, per
    value head), d [M, Hv, V], g [M, Hv] or [M, Hv, K] from state_row [Hv, K, V], in float32 (the arithmetic of the
    standard step given d)."""
    S = state_row.float()
    gate = _gate(g[None])[0]  # [M, Hv, Kg]
    for j in range(k.shape[0]):
        S = S * torch.exp(gate[j])[..., None]
        S = S + k[j].float()[..., None] * d[j].float()[:, None, :]
    return S


def delta_commit_ref(
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
    """Commit the first ``accepted[b]`` records of the last window: ``count[b] += accepted[b]``; a row whose new
    count reaches ``buffer_len`` folds all its committed records into ``state[b]`` in place (sequential recurrence
    with the recorded d's) and sets ``count[b] = 0`` (``origin`` unchanged: the ring restarts there). Raises
    ValueError if ``accepted[b] < 0`` or the new count exceeds the ring capacity."""
    ring_size = ring_k.shape[1]
    value_heads = ring_d.shape[2]
    for b in range(ring_k.shape[0]):
        start, num = int(origin[b]), int(count[b]) + int(accepted[b])
        if int(accepted[b]) < 0 or num > ring_size:
            raise ValueError(f"row {b}: count {int(count[b])} + accepted {int(accepted[b])} is not in [0, {ring_size}]")
        if num >= buffer_len:
            slots = ring_slots(start, num, ring_size, ring_k.device)
            keys = delta_keys(ring_k[b, slots], value_heads, use_qk_l2norm)
            state[b].copy_(delta_fold_records(state[b], keys, ring_d[b, slots], ring_g[b, slots]))
            num = 0
        count[b] = num


def delta_fold_ring_ref(
    state: torch.Tensor,
    ring_k: torch.Tensor,
    ring_d: torch.Tensor,
    ring_g: torch.Tensor,
    origin: int,
    count: int,
    use_qk_l2norm: bool = True,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``state`` with the ``count`` records at ring slots ``(origin + j) % R`` of every row folded in, in order
    (the sequential recurrence of :func:`delta_commit_ref`), into ``out`` (default a new tensor; may be ``state``).
    Raises ValueError for a position outside the ring."""
    slots = ring_slots(origin, count, ring_k.shape[1], ring_k.device)
    folded = torch.stack([
        delta_fold_records(state[b], delta_keys(ring_k[b, slots], ring_d.shape[2], use_qk_l2norm), ring_d[b, slots],
                           ring_g[b, slots]) for b in range(state.shape[0])])
    return into(out, folded, state)
