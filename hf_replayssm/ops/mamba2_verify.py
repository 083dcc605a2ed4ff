"""Torch references of the Mamba-2 speculative verify / commit kernels in ``hf_replayssm.kernels.mamba2_verify``.

Same signatures and in-place semantics as the Triton kernels (compared in ``tests/test_kernels_verify.py``); written
for clarity: the batch loop runs on the host (reading ``origin``/``count``) and all math is float32.

A speculative step is one :func:`mamba2_verify_ref` (outputs of a window of T tokens, their records appended after
the committed ones, nothing committed) followed, once the number of accepted tokens per row is known, by one
:func:`mamba2_commit_ref` (the accepted records become committed; a row whose ring reaches ``buffer_len`` folds
them into its checkpoint). Rejected records stay in the ring beyond ``count`` and are overwritten by the next
window, so rollback costs nothing.

Shapes (B = batch, T = window, H = heads, P = head_dim, G = groups, N = d_state, R = ring capacity):
state [B, H, P, N] float32 checkpoint; ring_x [B, R, H, P], ring_dt [B, R, H] float32 (post-softplus), ring_B
[B, R, G, N] (records of row b at slots ``(origin[b] + j) % R``, j < count[b]); origin, count, accepted [B] int32;
x, z [B, T, H, P]; dt [B, T, H] raw; B, C [B, T, G, N]; A, D, dt_bias [H].

Capacity: a window needs ``count[b] + T <= R``; since a commit leaves at most ``buffer_len - 1`` records, a ring of
``R >= buffer_len - 1 + T`` always fits.
"""

from __future__ import annotations

import torch

from .mamba2 import _heads, ssd_replay
from .mamba2_step import _finish, mamba2_dt
from .positions import into, ring_slots


def _check_window(batch: int, window: int, x, dt, B, C, z) -> None:
    if x.dim() != 4 or x.shape[:2] != (batch, window):
        raise ValueError(f"x must be [B, T, H, P], got {tuple(x.shape)}")
    if dt.shape != x.shape[:3]:
        raise ValueError(f"dt must be [B, T, H] = {tuple(x.shape[:3])}, got {tuple(dt.shape)}")
    if B.dim() != 4 or B.shape[:2] != (batch, window) or C.shape != B.shape:
        raise ValueError(f"B and C must be [B, T, G, N], got {tuple(B.shape)} and {tuple(C.shape)}")
    if z is not None and z.shape != x.shape:
        raise ValueError(f"z must be [B, T, H, P] like x, got {tuple(z.shape)}")


def mamba2_verify_ref(
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
    """Outputs of a window of T tokens per row; the state is not written and ``count`` is not changed.

    Token t of row b sees the checkpoint, the row's ``count[b]`` committed records and window tokens 0..t (what t+1
    sequential steps would give). The window's records (x, post-softplus dt, B) are written at slots
    ``(origin[b] + count[b] + t) % R``. Raises ValueError if ``count[b] + T > R`` for some row (the Triton kernel
    instead returns NaN for that row and writes nothing). Returns y [B, T, H, P] (``*= silu(z)``) in x's dtype, or
    writes it into ``out``.
    """
    batch, ring_size = ring_x.shape[:2]
    window = x.shape[1]
    _check_window(batch, window, x, dt, B, C, z)
    dtp = mamba2_dt(dt, dt_bias, dt_softplus)  # [B, T, H]
    ys = []
    for b in range(batch):
        start, num = int(origin[b]), int(count[b])
        if num < 0 or num + window > ring_size:
            raise ValueError(f"row {b}: count {num} + window {window} exceeds the ring capacity {ring_size}")
        slots = ring_slots(start, num, ring_size, x.device)
        ys.append(ssd_replay(state[b : b + 1], ring_x[b, slots][None], ring_dt[b, slots][None],
                             ring_B[b, slots][None], x[b : b + 1], dtp[b : b + 1], B[b : b + 1], C[b : b + 1], A,
                             D)[0])
        new = (start + num + torch.arange(window, device=x.device)) % ring_size
        ring_x[b, new] = x[b].to(ring_x.dtype)
        ring_dt[b, new] = dtp[b].to(ring_dt.dtype)
        ring_B[b, new] = B[b].to(ring_B.dtype)
    return _finish(torch.stack(ys), z, x, out)


def mamba2_fold_records(state_row: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, B: torch.Tensor,
                        A: torch.Tensor) -> torch.Tensor:
    """The sequential recurrence ``S = exp(A dt_j) S + (dt_j x_j) B_j^T`` over records x [M, H, P], dt [M, H],
    B [M, G, N] from state_row [H, P, N], in float32 with the standard step's rounding order."""
    S = state_row.float()
    B_heads = _heads(B.float(), x.shape[1])
    for j in range(x.shape[0]):
        dt_j = dt[j].float()
        S = S * torch.exp(A.float() * dt_j)[:, None, None] + (dt_j[:, None] * x[j].float())[..., None] * B_heads[j][
            :, None, :]
    return S


def mamba2_commit_ref(
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
    """Commit the first ``accepted[b]`` records of the last window: ``count[b] += accepted[b]``; a row whose new
    count reaches ``buffer_len`` folds all its committed records into ``state[b]`` in place (sequential recurrence,
    the arithmetic of the standard step) and sets ``count[b] = 0`` (``origin`` unchanged: the ring restarts there).
    Raises ValueError if ``accepted[b] < 0`` or the new count exceeds the ring capacity."""
    ring_size = ring_x.shape[1]
    for b in range(ring_x.shape[0]):
        start, num = int(origin[b]), int(count[b]) + int(accepted[b])
        if int(accepted[b]) < 0 or num > ring_size:
            raise ValueError(f"row {b}: count {int(count[b])} + accepted {int(accepted[b])} is not in [0, {ring_size}]")
        if num >= buffer_len:
            slots = ring_slots(start, num, ring_size, ring_x.device)
            state[b].copy_(mamba2_fold_records(state[b], ring_x[b, slots], ring_dt[b, slots], ring_B[b, slots], A))
            num = 0
        count[b] = num


def mamba2_fold_ring_ref(
    state: torch.Tensor,
    ring_x: torch.Tensor,
    ring_dt: torch.Tensor,
    ring_B: torch.Tensor,
    A: torch.Tensor,
    origin: int,
    count: int,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``state`` with the ``count`` records at ring slots ``(origin + j) % R`` of every row folded in, in order
    (the sequential recurrence of :func:`mamba2_commit_ref`), into ``out`` (default a new tensor; may be ``state``).
    Raises ValueError for a position outside the ring."""
    slots = ring_slots(origin, count, ring_x.shape[1], ring_x.device)
    folded = torch.stack([mamba2_fold_records(state[b], ring_x[b, slots], ring_dt[b, slots], ring_B[b, slots], A)
                          for b in range(state.shape[0])])
    return into(out, folded, state)
