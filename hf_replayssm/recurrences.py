"""Recurrence families as seen by a replay layer: which records a token leaves, how outputs are read from a
checkpoint plus records, and how records fold into a new checkpoint. Pure torch; the math is in ``ops``.

Token inputs arrive as a dict of [B, T, ...] tensors (plus per-layer parameters), already in the form the
recurrence consumes (post-conv, post-softplus, normalised), so every family treats a window of T tokens alike.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from .ops.delta_rule import delta_fold, delta_replay
from .ops.mamba2 import ssd_fold, ssd_replay

Records = Mapping[str, torch.Tensor]


def _slice(tokens: Mapping[str, torch.Tensor], per_token: tuple[str, ...], start: int, stop: int) -> dict:
    return {name: (value[:, start:stop] if name in per_token else value) for name, value in tokens.items()}


class Mamba2Recurrence:
    """Mamba-2 / SSD: records (x, dt, B) after the conv; C is only needed by the token that reads it."""

    name = "mamba2"
    per_token = ("x", "dt", "B", "C")
    record_fields = ("x", "dt", "B")

    def state_shape(self, tokens: Records) -> tuple[int, ...]:
        batch, _, heads, head_dim = tokens["x"].shape
        return (batch, heads, head_dim, tokens["B"].shape[-1])

    def record_examples(self, tokens: Records) -> dict[str, torch.Tensor]:
        # x and B are post-conv activations: stored losslessly in the model's dtype; dt (post-softplus) in float32
        return {name: tokens[name][:, :1] if name != "dt" else tokens[name][:, :1].float()
                for name in self.record_fields}

    def outputs(self, state: torch.Tensor, hist: Records, tokens: Records) -> tuple[torch.Tensor, dict]:
        y = ssd_replay(
            state, hist["x"], hist["dt"], hist["B"], tokens["x"], tokens["dt"], tokens["B"], tokens["C"],
            tokens["A"], tokens.get("D"),
        )
        return y, {name: tokens[name] for name in self.record_fields}

    def fold(self, state: torch.Tensor, records: Records, params: Records, exact: bool = False) -> torch.Tensor:
        # Records do not depend on the state, so folding is exact from any checkpoint.
        return ssd_fold(state, records["x"], records["dt"], records["B"], params["A"])

    def slice(self, tokens: Records, start: int, stop: int) -> dict:
        return _slice(tokens, self.per_token, start, stop)


class DeltaRuleRecurrence:
    """Gated DeltaNet (scalar gate) and Kimi Delta Attention (per-channel gate).

    Records keep the raw inputs (k, v, beta, g) and the corrected value d. Reads use d; a flush can recompute d
    exactly from the raw inputs against the high-precision checkpoint (``exact=True``), so no error of a
    low-precision read copy ever enters the recurrence.
    """

    name = "delta_rule"
    per_token = ("q", "k", "v", "beta", "g")
    record_fields = ("k", "v", "beta", "g", "d")

    def state_shape(self, tokens: Records) -> tuple[int, ...]:
        batch, _, heads, key_dim = tokens["k"].shape
        return (batch, heads, key_dim, tokens["v"].shape[-1])

    def record_examples(self, tokens: Records) -> dict[str, torch.Tensor]:
        examples = {name: tokens[name][:, :1].float() for name in ("k", "v", "beta", "g")}
        examples["d"] = tokens["v"][:, :1].float()
        return examples

    def outputs(self, state: torch.Tensor, hist: Records, tokens: Records) -> tuple[torch.Tensor, dict]:
        o, d = delta_replay(
            state, hist["k"], hist["d"], hist["g"], tokens["q"], tokens["k"], tokens["v"], tokens["beta"], tokens["g"]
        )
        records = {name: tokens[name] for name in ("k", "v", "beta", "g")}
        records["d"] = d
        return o, records

    def fold(self, state: torch.Tensor, records: Records, params: Records, exact: bool = False) -> torch.Tensor:
        d = records["d"]
        if exact:
            empty = {name: records[name][:, :0] for name in ("k", "d", "g")}
            _, d = delta_replay(
                state, empty["k"], empty["d"], empty["g"], None, records["k"], records["v"], records["beta"],
                records["g"],
            )
        return delta_fold(state, records["k"], d, records["g"])

    def slice(self, tokens: Records, start: int, stop: int) -> dict:
        return _slice(tokens, self.per_token, start, stop)
