"""Torch references of the gated delta rule decode-step kernels in ``hf_replayssm.kernels.delta_rule``.

Each function here has exactly the signature and in-place semantics of its Triton counterpart, so the two can be
swapped and compared (``tests/test_kernels_delta.py``). They are written for clarity, not speed: the replay
reference loops over batch rows on the host (reading ``origin``/``count``) and builds on the replay math of
:mod:`hf_replayssm.ops.delta_rule`; all math is float32 whatever the input dtype.

Shapes (one decode token per batch row; B = batch, Hk = key heads, Hv = value heads with Hv % Hk == 0 (value head h
reads key head h // (Hv / Hk)), K = key dim, V = value dim, R = ring capacity):

* ``state`` [B, Hv, K, V] (key-major, transformers' layout): recurrent state (standard step) or float32 checkpoint
  ``S0`` (replay step);
* ``ring_k`` [B, R, Hk, K] raw keys (before l2 normalisation), ``ring_d`` [B, R, Hv, V] float32 corrected values
  ``d_j = beta_j (v_j - P_j^T k_j)``, ``ring_g`` [B, R, Hv] (Gated DeltaNet, one log decay per value head) or
  [B, R, Hv, K] (Kimi Delta Attention, one per key channel) float32: circular ring of records. Row ``b`` holds
  ``count[b]`` committed records in slots ``origin[b], origin[b]+1, ...`` (mod R);
* ``origin``, ``count`` [B] int32;
* ``q``, ``k`` [B, Hk, K] raw; ``v`` [B, Hv, V]; ``beta`` [B, Hv]; ``g`` [B, Hv] or [B, Hv, K] (log decay).

Keys and queries are l2-normalised on read (``x * rsqrt(sum(x^2) + 1e-6)``, in float32) when ``use_qk_l2norm``;
queries are then scaled by ``scale`` (default ``K ** -0.5``).
"""

from __future__ import annotations

import torch

from .delta_rule import delta_fold, delta_replay, delta_step_reference
from .positions import row_position, set_row_count
from .read_copy import decode_read_copy, reencode_read_copy_ref

L2NORM_EPS = 1e-6


def l2norm(x: torch.Tensor) -> torch.Tensor:
    """``x * rsqrt(sum(x^2) + 1e-6)`` over the last dim, in float32 (transformers' / FLA's l2norm)."""
    x = x.float()
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + L2NORM_EPS)


def delta_keys(x: torch.Tensor, value_heads: int, use_qk_l2norm: bool) -> torch.Tensor:
    """Raw keys/queries [..., Hk, K] -> float32 (normalised) per value head [..., Hv, K]."""
    x = l2norm(x) if use_qk_l2norm else x.float()
    ratio = value_heads // x.shape[-2]
    return x.repeat_interleave(ratio, dim=-2) if ratio > 1 else x


def _check_gate(g: torch.Tensor, v: torch.Tensor, key_dim: int) -> None:
    batch, value_heads = v.shape[:2]
    assert g.shape in ((batch, value_heads), (batch, value_heads, key_dim)), (
        f"g must be [B, Hv] (GDN) or [B, Hv, K] (KDA), got {tuple(g.shape)}")


def _finish(o: torch.Tensor, v: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    if out is None:
        return o.to(v.dtype)
    out.copy_(o)
    return out


def delta_state_update_ref(
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
    """Standard decode step: ``P = diag(exp(g)) S``, ``d = beta (v - P^T k)``, ``S = P + k d^T`` written back into
    ``state`` (in place); returns ``o = S^T q`` [B, Hv, V] in v's dtype (or written into ``out``)."""
    value_heads, key_dim = v.shape[1], k.shape[-1]
    _check_gate(g, v, key_dim)
    scale = key_dim ** -0.5 if scale is None else scale
    qn = delta_keys(q, value_heads, use_qk_l2norm) * scale
    kn = delta_keys(k, value_heads, use_qk_l2norm)
    o, new_state = delta_step_reference(state, qn[:, None], kn[:, None], v[:, None], beta[:, None], g[:, None])
    state.copy_(new_state)
    return _finish(o[:, 0], v, out)


def delta_replay_step_ref(
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
    """One ReplaySSM decode step per batch row (replay or flush, decided per row from ``count``).

    * ``count[b] + 1 < buffer_len`` (replay): ``o`` and the token's corrected value ``d`` from the checkpoint and the
      ``count[b]`` records, no state write; the token's record (raw k, d, g) is written at slot
      ``(origin[b] + count[b]) % R`` and ``count[b] += 1``.
    * ``count[b] + 1 >= buffer_len`` (flush): the records and the token are folded into ``state[b]`` in place,
      ``o = S^T q``, ``count[b] = 0``; ``origin[b]`` is left unchanged (the next record goes to slot ``origin[b]``).

    ``origin``/``count`` may be host ints (every row at that position; nothing is updated: the caller advances its
    own count). Returns o [B, Hv, V] in v's dtype, or writes it into ``out``.

    ``read_copy`` / ``read_format`` ("fp8", "nvfp4"): replaying rows read the decoded copy instead of ``state`` (for
    ``o`` and the appended ``d``; separated precision, see :mod:`.read_copy`); flushing rows use ``state`` and leave
    the copy as it is.

    ``ring_v`` [B, R, Hv, V] / ``ring_beta`` [B, R, Hv] (exact fold, together): replaying rows also append the
    token's raw v and beta; flushing rows recompute the corrected values of the records and the token from them
    against ``state`` (sequentially, like :meth:`DeltaRuleRecurrence.fold` with ``exact``) instead of folding
    ``ring_d``.

    ``flush_reads_copy`` (with a read copy): a flushing row's ``o`` is the replay output from the copy and the
    records (what the separated policy's flush step outputs, as ReplayCache's torch path computes it) instead of
    ``S^T q`` of the new state; the fold is unchanged. ``reencode_copy``: a flushing row's copy is re-encoded from
    its new checkpoint in the same call.
    """
    if (ring_v is None) != (ring_beta is None):
        raise ValueError("ring_v and ring_beta come together (the raw records of an exact fold)")
    batch, ring_size = ring_k.shape[:2]
    value_heads, key_dim = v.shape[1], k.shape[-1]
    _check_gate(g, v, key_dim)
    assert ring_g.dim() == g.dim() + 1, "ring_g and g must have the same gate kind"
    scale = key_dim ** -0.5 if scale is None else scale
    qn = delta_keys(q, value_heads, use_qk_l2norm) * scale  # [B, Hv, K]
    kn = delta_keys(k, value_heads, use_qk_l2norm)
    g32, beta32 = g.float(), beta.float()
    read_state = decode_read_copy(read_copy, read_format, state)  # ``state`` itself without a copy
    flushed = torch.zeros(batch, dtype=torch.bool)
    outs = []
    for b in range(batch):
        start, num = row_position(origin, b), row_position(count, b)
        slots = (start + torch.arange(num, device=k.device)) % ring_size
        hist_k = delta_keys(ring_k[b, slots], value_heads, use_qk_l2norm)[None]  # [1, n, Hv, K]
        hist_d, hist_g = ring_d[b, slots][None].float(), ring_g[b, slots][None].float()
        tok_k, tok_g = kn[b, None, None], g32[b, None, None]
        flush = num + 1 >= buffer_len
        start_state = (state if flush else read_state)[b : b + 1]
        o, d = delta_replay(start_state, hist_k, hist_d, hist_g, None if flush else qn[b, None, None], tok_k,
                            v[b, None, None], beta32[b, None, None], tok_g)
        if flush:
            all_k, all_g = torch.cat([hist_k, tok_k], dim=1), torch.cat([hist_g, tok_g], dim=1)
            all_d = torch.cat([hist_d, d], dim=1)
            if ring_v is not None:  # every corrected value again, from the raw inputs against the checkpoint
                all_v = torch.cat([ring_v[b, slots][None].float(), v[b, None, None].float()], dim=1)
                all_beta = torch.cat([ring_beta[b, slots][None].float(), beta32[b, None, None]], dim=1)
                _, all_d = delta_replay(state[b : b + 1], all_k[:, :0], all_d[:, :0], all_g[:, :0], None, all_k, all_v,
                                        all_beta, all_g)
            new_state = delta_fold(state[b : b + 1], all_k, all_d, all_g)[0]
            state[b].copy_(new_state)
            flushed[b] = True
            if flush_reads_copy and read_copy is not None:
                o, _ = delta_replay(read_state[b : b + 1], hist_k, hist_d, hist_g, qn[b, None, None], tok_k,
                                    v[b, None, None], beta32[b, None, None], tok_g)
                outs.append(o[0, 0])
            else:
                outs.append(torch.einsum("hkv,hk->hv", new_state, qn[b]))
            set_row_count(count, b, 0)
        else:
            outs.append(o[0, 0])
            slot = (start + num) % ring_size
            ring_k[b, slot] = k[b].to(ring_k.dtype)
            ring_d[b, slot] = d[0, 0].to(ring_d.dtype)
            ring_g[b, slot] = g[b].to(ring_g.dtype)
            if ring_v is not None:
                ring_v[b, slot] = v[b].to(ring_v.dtype)
                ring_beta[b, slot] = beta[b].to(ring_beta.dtype)
            set_row_count(count, b, num + 1)
    if reencode_copy and read_copy is not None and bool(flushed.any()):
        reencode_read_copy_ref(state, read_copy, read_format, flushed.to(state.device))
    return _finish(torch.stack(outs), v, out)
