"""Torch references of the Mamba-2 decode-step kernels in ``hf_replayssm.kernels.mamba2``.

Each function here has exactly the signature and in-place semantics of its Triton counterpart, so the two can be
swapped and compared (``tests/test_kernels_mamba2.py``). They are written for clarity, not speed: the replay
reference loops over batch rows on the host (reading ``origin``/``count``), and all math is float32 whatever the
input dtype.

Shapes (one decode token per batch row; B = batch, H = heads, P = head_dim, G = groups, N = d_state, R = ring
capacity):

* ``state`` [B, H, P, N]: recurrent state (standard step) or float32 checkpoint ``S0`` (replay step);
* ``ring_x`` [B, R, H, P], ``ring_dt`` [B, R, H] (float32, post-softplus), ``ring_B`` [B, R, G, N]: circular ring of
  records. Row ``b`` holds ``count[b]`` committed records in slots ``origin[b], origin[b]+1, ...`` (mod R);
* ``origin``, ``count`` [B] int32;
* ``x`` [B, H, P], ``dt`` [B, H] raw (``dt_bias`` added and softplus applied here when given), ``B``, ``C`` [B, G, N],
  ``A`` [H] (negative), ``D`` [H], ``z`` [B, H, P] (``y *= silu(z)``), ``dt_bias`` [H].
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .mamba2 import _heads, ssd_fold, ssd_replay, ssd_step_reference
from .positions import row_position, set_row_count
from .read_copy import decode_read_copy, reencode_read_copy_ref


def mamba2_dt(dt: torch.Tensor, dt_bias: torch.Tensor | None, dt_softplus: bool) -> torch.Tensor:
    """Post-processed step size in float32: ``softplus(dt + dt_bias)`` (each part optional), like mamba_ssm."""
    dt = dt.float()
    if dt_bias is not None:
        dt = dt + dt_bias.float()
    if dt_softplus:
        dt = F.softplus(dt)
    return dt


def _finish(y: torch.Tensor, z: torch.Tensor | None, x: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    if z is not None:
        y = y * F.silu(z.float())
    if out is None:
        return y.to(x.dtype)
    out.copy_(y)
    return out


def mamba2_state_update_ref(
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
    """Standard Mamba-2 decode step: ``S = exp(A dt) S + dt x B^T`` written back into ``state`` (in place), returns
    ``y = (S C + D x) * silu(z)`` [B, H, P] in x's dtype (or written into ``out``)."""
    dtp = mamba2_dt(dt, dt_bias, dt_softplus)
    y, new_state = ssd_step_reference(state, x[:, None], dtp[:, None], B[:, None], C[:, None], A, D)
    state.copy_(new_state)
    return _finish(y[:, 0], z, x, out)


def mamba2_replay_step_ref(
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
    """One ReplaySSM decode step per batch row (replay or flush, decided per row from ``count``).

    * ``count[b] + 1 < buffer_len`` (replay): ``y`` from the checkpoint and the ``count[b]`` records, no state write;
      the token's record (x, post-softplus dt, B) is written at slot ``(origin[b] + count[b]) % R`` and
      ``count[b] += 1``.
    * ``count[b] + 1 >= buffer_len`` (flush): the records and the token are folded into ``state[b]`` in place,
      ``y = S C + D x``, ``count[b] = 0``; ``origin[b]`` is left unchanged (the next record goes to slot
      ``origin[b]``).

    ``origin``/``count`` may be host ints (every row at that position; nothing is updated: the caller advances its
    own count). Returns y [B, H, P] (``*= silu(z)`` when z is given) in x's dtype, or writes it into ``out``.

    ``read_copy`` / ``read_format`` ("fp8", "nvfp4"): replaying rows read the decoded copy instead of ``state``
    (separated precision, see :mod:`.read_copy`); flushing rows use ``state`` and leave the copy as it is, except
    that with ``flush_reads_copy`` their ``y`` is the replay output from the copy and the records (the separated
    policy's flush step, as ReplayCache's torch path computes it) instead of ``S C + D x`` of the new state;
    ``reencode_copy``: a flushing row's copy is re-encoded from its new checkpoint in the same call.
    """
    batch, ring_size = ring_x.shape[:2]
    num_heads = x.shape[1]
    read_state = decode_read_copy(read_copy, read_format, state)  # ``state`` itself without a copy
    flushed = torch.zeros(batch, dtype=torch.bool)
    dtp = mamba2_dt(dt, dt_bias, dt_softplus)  # [B, H]
    ys = []
    for b in range(batch):
        start, num = row_position(origin, b), row_position(count, b)
        slots = (start + torch.arange(num, device=x.device)) % ring_size
        hist_x, hist_dt, hist_B = ring_x[b, slots][None], ring_dt[b, slots][None], ring_B[b, slots][None]
        tok_x, tok_dt, tok_B = x[b, None, None], dtp[b, None, None], B[b, None, None]
        if num + 1 >= buffer_len:
            new_state = ssd_fold(
                state[b : b + 1],
                torch.cat([hist_x.float(), tok_x.float()], dim=1),
                torch.cat([hist_dt.float(), tok_dt], dim=1),
                torch.cat([hist_B.float(), tok_B.float()], dim=1),
                A,
            )[0]
            state[b].copy_(new_state)
            flushed[b] = True
            if flush_reads_copy and read_copy is not None:
                y = ssd_replay(read_state[b : b + 1], hist_x, hist_dt, hist_B, tok_x, tok_dt, tok_B, C[b, None, None],
                               A, D)[0, 0]
            else:
                y = torch.einsum("hpn,hn->hp", new_state, _heads(C[b].float(), num_heads))
                if D is not None:
                    y = y + D.float()[:, None] * x[b].float()
            set_row_count(count, b, 0)
        else:
            y = ssd_replay(read_state[b : b + 1], hist_x, hist_dt, hist_B, tok_x, tok_dt, tok_B, C[b, None, None], A, D)
            y = y[0, 0]
            slot = (start + num) % ring_size
            ring_x[b, slot] = x[b].to(ring_x.dtype)
            ring_dt[b, slot] = dtp[b].to(ring_dt.dtype)
            ring_B[b, slot] = B[b].to(ring_B.dtype)
            set_row_count(count, b, num + 1)
        ys.append(y)
    if reencode_copy and read_copy is not None and bool(flushed.any()):
        reencode_read_copy_ref(state, read_copy, read_format, flushed.to(state.device))
    return _finish(torch.stack(ys), z, x, out)
