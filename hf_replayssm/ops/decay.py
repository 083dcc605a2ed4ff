"""Sums of log decays between tokens, shared by the Mamba-2 and delta-rule replay math.

Decay factors are exponentials of sums of per-token log decays. Summing the tokens in between directly (rather than
subtracting two cumulative sums, which loses precision as the sums grow) keeps replay as accurate as stepping.
"""

from __future__ import annotations

import torch


def sum_after(x: torch.Tensor) -> torch.Tensor:
    """out[:, j] = sum_{t>j} x[:, t] along dim 1 (an exclusive reverse cumulative sum)."""
    reverse = torch.flip(torch.cumsum(torch.flip(x, [1]), dim=1), [1])
    return torch.cat([reverse[:, 1:], torch.zeros_like(reverse[:, :1])], dim=1)


def segment_sums(x: torch.Tensor) -> torch.Tensor:
    """seg[b,h,i,j,...] = sum_{j<t<=i} x[b,t,h,...] for j <= i (entries j > i are 0 and meaningless).
    x [B, M, H, *rest] -> [B, H, M, M, *rest]."""
    steps = x.shape[1]
    terms = x.transpose(1, 2).unsqueeze(3)  # [b, h, t, 1, ...]
    terms = terms.expand(*terms.shape[:3], steps, *terms.shape[4:])  # [b, h, t, j, ...] = x_t
    after_j = torch.ones(steps, steps, dtype=torch.bool, device=x.device).tril(-1)  # t > j
    after_j = after_j.view(steps, steps, *([1] * (x.dim() - 3)))
    return torch.cumsum(terms.masked_fill(~after_j, 0), dim=2)
