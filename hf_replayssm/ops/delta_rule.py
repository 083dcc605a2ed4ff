"""Gated delta rule replay math (Gated DeltaNet and Kimi Delta Attention) in pure torch.

State layout follows transformers: ``S[b, h, k, v]`` (key-major). One token with log-decay ``g`` (a scalar per
head for GDN, one value per key channel for KDA), strength ``beta``, unit-norm key ``k``, value ``v`` and scaled
query ``q`` does

    P_t = diag(exp(g_t)) S_{t-1}                  (decay)
    d_t = beta_t (v_t - P_t^T k_t)                (corrected value, "delta")
    S_t = P_t + k_t d_t^T                         (rank-one write)
    o_t = S_t^T q_t = P_t^T q_t + (k_t . q_t) d_t

Once ``d_t`` is known the update is decay + rank one, so with ``c_t`` the cumulative log decay since the
checkpoint ``S0``:

    P_t^T u = S0^T (exp(c_t) * u) + sum_{j<t} ((exp(c_t - c_j) * k_j) . u) d_j

An output therefore needs one read of ``S0`` plus the buffered (k, d, g) records. Inside a window of several
new tokens the d's depend on each other only causally; they solve a unit lower-triangular system (the UT
transform), so every accepted prefix of a speculative window has exactly the d's sequential decoding gives.
All math runs in float32. Gates are given as [B, M, H] (scalar) or [B, M, H, K] (per channel).
"""

from __future__ import annotations

import torch

from .decay import segment_sums, sum_after


def _gate(g: torch.Tensor) -> torch.Tensor:
    """Scalar gates [B,M,H] -> [B,M,H,1]; per-channel gates [B,M,H,K] unchanged. Always float32."""
    g = g.to(torch.float32)
    return g[..., None] if g.dim() == 3 else g


def _pair_weights(seg: torch.Tensor, k: torch.Tensor, u: torch.Tensor, mask: torch.Tensor):
    """W[b,h,i,j] = sum_c exp(seg[i, j]) * k_j * u_i over key channels, zero where ``mask`` is False.

    seg [B,H,T,M,Kg] (log decay from token j to query i), k [B,M,H,K], u [B,T,H,K], mask [T, M] -> [B,H,T,M].
    """
    decay = torch.exp(seg.masked_fill(~mask[:, :, None], float("-inf")))
    if decay.shape[-1] == 1:  # scalar gate: factor the decay out of the dot product
        return decay[..., 0] * torch.einsum("bthk,bmhk->bhtm", u, k)
    return torch.einsum("bhtmk,bmhk,bthk->bhtm", decay, k, u)


def delta_replay(
    state: torch.Tensor,
    hist_k: torch.Tensor,
    hist_d: torch.Tensor,
    hist_g: torch.Tensor,
    q: torch.Tensor | None,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    g: torch.Tensor,
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """Outputs and corrected values of T new tokens after the checkpoint and ``n`` buffered records.

    Shapes: state [B,H,K,V]; hist_k [B,n,H,K]; hist_d [B,n,H,V]; hist_g [B,n,H(,K)]; q, k [B,T,H,K] (q already
    normalised and scaled, k normalised); v [B,T,H,V]; beta [B,T,H]; g [B,T,H(,K)].
    Returns (o [B,T,H,V] or None when ``q`` is None, d [B,T,H,V]), both float32.
    """
    f32 = torch.float32
    num_hist, window = hist_k.shape[1], k.shape[1]
    total = num_hist + window
    device = k.device
    k, v, beta = k.to(f32), v.to(f32), beta.to(f32)
    ks = torch.cat([hist_k.to(f32), k], dim=1)  # [B, M, H, K]
    gs = torch.cat([_gate(hist_g), _gate(g)], dim=1)  # [B, M, H, Kg]
    c_new = torch.cumsum(gs, dim=1)[:, num_hist:]  # [B, T, H, Kg] log decay since the checkpoint
    seg = segment_sums(gs)[:, :, num_hist:]  # [B, H, T, M, Kg]
    state = state.to(f32)

    rows = num_hist + torch.arange(window, device=device)[:, None]
    cols = torch.arange(total, device=device)[None, :]
    strictly_before = cols < rows  # [T, M]

    # P_i^T k_i split into checkpoint, history and in-window parts.
    w_k = _pair_weights(seg, ks, k, strictly_before)  # [B, H, T, M]
    pk = torch.einsum("bhkv,bthk->bthv", state, torch.exp(c_new) * k)
    if num_hist:
        pk = pk + torch.einsum("bhtm,bmhv->bthv", w_k[..., :num_hist], hist_d.to(f32))
    rhs = beta[..., None] * (v - pk)  # [B, T, H, V]
    # (I + diag(beta) W_window) d = rhs, unit lower triangular.
    lower = beta.permute(0, 2, 1)[..., None] * w_k[..., num_hist:]  # [B, H, T, T]
    eye = torch.eye(window, device=device, dtype=f32)
    d = torch.linalg.solve_triangular(eye + lower, rhs.permute(0, 2, 1, 3), upper=False, unitriangular=True)
    d = d.permute(0, 2, 1, 3)  # [B, T, H, V]

    if q is None:
        return None, d
    q = q.to(f32)
    w_q = _pair_weights(seg, ks, q, cols <= rows)  # includes the token itself (decay 1)
    ds = torch.cat([hist_d.to(f32), d], dim=1)
    o = torch.einsum("bhkv,bthk->bthv", state, torch.exp(c_new) * q) + torch.einsum("bhtm,bmhv->bthv", w_q, ds)
    return o, d


def delta_fold(state: torch.Tensor, k: torch.Tensor, d: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """State after M records (k [B,M,H,K], d [B,M,H,V], g [B,M,H(,K)]) starting from ``state`` [B,H,K,V]."""
    f32 = torch.float32
    if k.shape[1] == 0:
        return state.to(f32).clone()
    gate = _gate(g)
    c_last = gate.sum(dim=1)  # [B, H, Kg]
    # log decay from each record to the end, summed directly: sum_{t>j} g_t
    after = sum_after(gate)
    k_decayed = torch.exp(after) * k.to(f32)  # [B, M, H, K]
    update = torch.einsum("bmhk,bmhv->bhkv", k_decayed, d.to(f32))
    return state.to(f32) * torch.exp(c_last)[..., None] + update


def delta_step_reference(
    state: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, g: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain sequential recurrence, for tests: returns (o [B,T,H,V], S_T [B,H,K,V])."""
    f32 = torch.float32
    S = state.to(f32).clone()
    gate = _gate(g)
    outs = []
    for t in range(k.shape[1]):
        S = S * torch.exp(gate[:, t])[..., None]
        k_t, v_t, q_t = k[:, t].to(f32), v[:, t].to(f32), q[:, t].to(f32)
        delta = beta[:, t].to(f32)[..., None] * (v_t - torch.einsum("bhkv,bhk->bhv", S, k_t))
        S = S + k_t[..., None] * delta[..., None, :]
        outs.append(torch.einsum("bhkv,bhk->bhv", S, q_t))
    return torch.stack(outs, dim=1), S
