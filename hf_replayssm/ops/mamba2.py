"""Mamba-2 (SSD, scalar decay per head) replay math in pure torch.

State layout follows transformers: ``S[b, h, p, n]`` (head_dim P x state N per head). One token updates

    S_t = exp(A dt_t) S_{t-1} + dt_t x_t B_t^T,        y_t = S_t C_t + D x_t

Unrolled from a checkpoint ``S0`` over the buffered tokens 1..m (``lam_j = A * sum_{i<=j} dt_i``):

    S_m = exp(lam_m) S0 + sum_j dt_j exp(lam_m - lam_j) x_j B_j^T
    y_m = exp(lam_m) (S0 C_m) + sum_{j<=m} dt_j exp(lam_m - lam_j) (B_j . C_m) x_j + D x_m

so an output needs one read of ``S0`` plus the small buffered records, and no state is written.
All math runs in float32 whatever the input dtype.
"""

from __future__ import annotations

import torch

from .decay import segment_sums, sum_after


def _heads(t: torch.Tensor, num_heads: int) -> torch.Tensor:
    """[..., G, N] per group -> [..., H, N] per head (head h uses group h // (H // G))."""
    groups = t.shape[-2]
    if groups == num_heads:
        return t
    return t.repeat_interleave(num_heads // groups, dim=-2)


def ssd_replay(
    state: torch.Tensor,
    hist_x: torch.Tensor,
    hist_dt: torch.Tensor,
    hist_B: torch.Tensor,
    x: torch.Tensor,
    dt: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    A: torch.Tensor,
    D: torch.Tensor | None = None,
) -> torch.Tensor:
    """Outputs of T new tokens that follow the checkpoint and ``n`` buffered tokens.

    Shapes: state [B,H,P,N]; hist_x [B,n,H,P]; hist_dt [B,n,H]; hist_B [B,n,G,N]; x [B,T,H,P]; dt [B,T,H]
    (already softplus'ed); B, C [B,T,G,N]; A [H]; D [H] or None. Returns y [B,T,H,P] in float32.
    Token i of the window sees the history and window tokens 0..i (causal), exactly as T sequential steps would.
    """
    f32 = torch.float32
    num_hist, window = hist_x.shape[1], x.shape[1]
    num_heads = x.shape[2]
    xs = torch.cat([hist_x.to(f32), x.to(f32)], dim=1)  # [B, M, H, P]
    dts = torch.cat([hist_dt.to(f32), dt.to(f32)], dim=1)  # [B, M, H]
    Bs = torch.cat([hist_B.to(f32), B.to(f32)], dim=1)  # [B, M, G, N]
    C = C.to(f32)
    log_decay = dts * A.to(f32)  # [B, M, H]
    lam_q = torch.cumsum(log_decay, dim=1)[:, num_hist:]  # [B, T, H] log decay since the checkpoint

    # Checkpoint term: exp(lam_i) * S0 C_i  -- the only read of the full state.
    C_heads = _heads(C, num_heads)  # [B, T, H, N]
    y = torch.einsum("bhpn,bthn->bthp", state.to(f32), C_heads) * torch.exp(lam_q)[..., None]

    # Buffered term: causal "attention" over history + window with SSD weights.
    scores = _heads(torch.einsum("btgn,bmgn->btmg", C, Bs).transpose(2, 3), num_heads)  # [B, T, H, M]
    queries = num_hist + torch.arange(window, device=x.device)
    causal = torch.arange(num_hist + window, device=x.device)[None, :] <= queries[:, None]
    seg = segment_sums(log_decay)[:, :, num_hist:]  # [B, H, T, M]
    weight = torch.exp(seg.masked_fill(~causal, float("-inf"))) * dts.transpose(1, 2)[..., None, :]
    y = y + torch.einsum("bthm,bhtm,bmhp->bthp", scores, weight, xs)
    if D is not None:
        y = y + D.to(f32)[:, None] * x.to(f32)
    return y


def ssd_fold(
    state: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, B: torch.Tensor, A: torch.Tensor
) -> torch.Tensor:
    """State after the M tokens (x [B,M,H,P], dt [B,M,H], B [B,M,G,N]) starting from ``state`` [B,H,P,N]."""
    f32 = torch.float32
    if x.shape[1] == 0:
        return state.to(f32).clone()
    dt = dt.to(f32)
    log_decay = dt * A.to(f32)  # [B, M, H]
    lam_last = log_decay.sum(dim=1)  # [B, H]
    weight = torch.exp(sum_after(log_decay)) * dt  # [B, M, H]
    B_heads = _heads(B.to(f32), x.shape[2])  # [B, M, H, N]
    update = torch.einsum("bmh,bmhp,bmhn->bhpn", weight, x.to(f32), B_heads)
    return state.to(f32) * torch.exp(lam_last)[..., None, None] + update


def ssd_step_reference(
    state: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, B: torch.Tensor, C: torch.Tensor, A: torch.Tensor,
    D: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain sequential recurrence (the thing ReplaySSM must reproduce), for tests: returns (y [B,T,H,P], S_T)."""
    f32 = torch.float32
    S = state.to(f32).clone()
    num_heads = x.shape[2]
    B_heads, C_heads = _heads(B.to(f32), num_heads), _heads(C.to(f32), num_heads)
    ys = []
    for t in range(x.shape[1]):
        decay = torch.exp(dt[:, t].to(f32) * A.to(f32))  # [B, H]
        S = S * decay[..., None, None] + (dt[:, t].to(f32)[..., None, None] * x[:, t].to(f32)[..., None]) * B_heads[
            :, t
        ][:, :, None, :]
        y = torch.einsum("bhpn,bhn->bhp", S, C_heads[:, t])
        if D is not None:
            y = y + D.to(f32)[:, None] * x[:, t].to(f32)
        ys.append(y)
    return torch.stack(ys, dim=1), S
