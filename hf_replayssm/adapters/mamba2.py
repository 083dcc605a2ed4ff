"""Mamba-2 family adapter (nemotron_h, falcon_h1, bamba, granitemoehybrid, zamba2, mamba2).

Every Mamba-2 mixer in transformers calls two module-level functions for its recurrence:
``mamba2_selective_state_update`` (one token, writes the state in place) and ``mamba2_chunk_scan`` (T tokens
from an initial state). Inside a replay call both become ``ReplayLayer.forward_tokens``; the mixer keeps its own
in_proj, conv, gated norm and out_proj.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..recurrences import Mamba2Recurrence
from .base import CallArgs, FamilyAdapter, interceptor


def _per_head(t: torch.Tensor | None, dims: int) -> torch.Tensor | None:
    """Undo the mixers' ``expand(..., head_dim[, state])`` (values are tied across the expanded dims)."""
    if t is None:
        return None
    while t.dim() > dims:
        t = t[..., 0]
    return t


@interceptor
def _step(module, call, a: CallArgs, original):
    """``mamba2_selective_state_update``: one token per sequence."""
    x = a["hidden_states"]  # [B, H, P]
    positions = call.positions
    if positions.is_active() or call.layer.schedule.next_step_uses_kernel(1):  # (device positions do)
        # The decode-step kernel applies dt_bias, softplus and the z gate itself and writes y in x's dtype: the step
        # launches what a fused stock kernel would, nothing more.
        tokens = {
            "x": x[:, None],
            "dt": _per_head(a["dt"], 2)[:, None],
            "B": a["B"][:, None],
            "C": a["C"][:, None],
            "A": _per_head(a["A"], 1).float(),
            "D": _per_head(a["D"], 1),
            "dt_bias": _per_head(a["dt_bias"], 1),
            "dt_softplus": bool(a["dt_softplus"]),
            "z": a["z"],
        }
        call.handled_tokens += 1
        if positions.takes(tokens):  # a plain step on device positions: no method looked up on the layer (a guard)
            return positions.step(tokens, x.dtype)[:, 0]
        return call.layer.forward_tokens(tokens, out_dtype=x.dtype)[:, 0]
    dt = _per_head(a["dt"], 2).float()  # [B, H]
    if a["dt_bias"] is not None:
        dt = dt + _per_head(a["dt_bias"], 1).float()
    if a["dt_softplus"]:
        dt = F.softplus(dt)
    tokens = {
        "x": x[:, None],
        "dt": dt[:, None],
        "B": a["B"][:, None],
        "C": a["C"][:, None],
        "A": _per_head(a["A"], 1).float(),
        "D": _per_head(a["D"], 1),
    }
    y = call.layer.forward_tokens(tokens)[:, 0]
    if a["z"] is not None:
        y = y * F.silu(a["z"].float())
    call.handled_tokens += 1
    return y.to(x.dtype)


@interceptor
def _chunk(module, call, a: CallArgs, original):
    """``mamba2_chunk_scan``: T tokens per sequence from an initial state."""
    x, dt_raw = a["hidden_states"], a["dt"]  # [B, T, H, P], [B, T, H]
    dt = dt_raw.float()
    if a["dt_bias"] is not None:
        dt = dt + a["dt_bias"].float()
    if a["dt_softplus"]:
        dt = F.softplus(dt)
    # Stock transformers clamps dt to ``dt_limit`` in its chunk scan (prefill) but not in its single-token update
    # (decode). Buffered tokens follow the same rule: prompt tokens clamped, generated ones not.
    prompt = call.layer.prompt_part(x.shape[1])
    if prompt and a["dt_limit"] is not None:
        dt = torch.cat([dt[:, :prompt].clamp(*a["dt_limit"]), dt[:, prompt:]], dim=1)
    Bm, Cm = a["B"], a["C"]
    tokens = {"x": x, "dt": dt, "B": Bm, "C": Cm, "A": a["A"].float(), "D": a["D"]}

    def chunk_fn(start: int, stop: int, initial_state: torch.Tensor):
        y, state = a.call(
            original,
            hidden_states=x[:, start:stop],
            dt=dt_raw[:, start:stop],
            B=Bm[:, start:stop],
            C=Cm[:, start:stop],
            initial_states=initial_state,
            return_final_states=True,
        )
        return y, state

    y = call.layer.forward_tokens(tokens, chunk_fn, out_dtype=x.dtype)
    call.handled_tokens += x.shape[1]
    y = y.contiguous()  # callers .view() the result
    if a["return_final_states"]:
        return y, call.layer.checkpoint
    return y


ADAPTER = FamilyAdapter(
    name="mamba2",
    recurrence=Mamba2Recurrence,
    mixers={
        "NemotronHMamba2Mixer": ("nemotron_h",),
        "FalconH1Mixer": ("falcon_h1",),
        "BambaMixer": ("bamba",),
        "GraniteMoeHybridMambaLayer": ("granitemoehybrid",),
        "Zamba2MambaMixer": ("zamba2",),
        "Mamba2Mixer": ("mamba2",),
    },
    interceptors={
        "mamba2_selective_state_update": _step,
        "mamba2_chunk_scan": _chunk,
    },
    fused_conv=True,
)
