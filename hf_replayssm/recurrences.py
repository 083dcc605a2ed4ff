"""Recurrence families as seen by a replay schedule: which records a token leaves, how outputs are read from a
checkpoint plus records, and how records fold into a new checkpoint. Pure torch; the math is in ``ops``.

Token inputs arrive as a dict of [B, T, ...] tensors plus per-layer parameters (the keys not in ``per_token``),
in the form the mixer hands its recurrence function (post-conv; Mamba-2's dt post-softplus). Records are stored
in the model's dtype where that is lossless (Mamba-2 x and B, delta-rule raw k and v) and in float32 where they are
computed (dt, g, beta, the corrected value d); anything derived from them (normalised keys) is recomputed on read.
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
    """Mamba-2 / SSD: records (x, dt, B) after the conv; C is only needed by the token that reads it.

    Tokens: x [B,T,H,P], dt [B,T,H] (post-softplus, float32), B, C [B,T,G,N]; parameters A [H], D [H] or None.
    """

    name = "mamba2"
    per_token = ("x", "dt", "B", "C")
    output_like = "x"  # outputs [B, T, H, P] have this token input's shape
    record_fields = ("x", "dt", "B")
    # A record that leaves the state as it is: dt = 0 decays by exp(0) = 1 and adds dt * x B^T = 0 (exactly)
    neutral_record = (("dt", 0.0),)

    def state_shape(self, tokens: Records) -> tuple[int, ...]:
        batch, _, heads, head_dim = tokens["x"].shape
        return (batch, heads, head_dim, tokens["B"].shape[-1])

    def record_examples(self, tokens: Records, exact: bool = False) -> dict[str, torch.Tensor]:
        # x and B are post-conv activations: kept in the model's dtype; dt (post-softplus) in float32
        return {name: tokens[name][:, :1] if name != "dt" else tokens[name][:, :1].float()
                for name in self.record_fields}

    def outputs(self, state: torch.Tensor, hist: Records, tokens: Records, params: Records) -> tuple[torch.Tensor,
                                                                                                    dict]:
        y = ssd_replay(
            state, hist["x"], hist["dt"], hist["B"], tokens["x"], tokens["dt"], tokens["B"], tokens["C"],
            params["A"], params.get("D"),
        )
        return y, {name: tokens[name] for name in self.record_fields}

    def fold(self, state: torch.Tensor, records: Records, params: Records, exact: bool = False) -> torch.Tensor:
        # Records do not depend on the state, so folding is exact from any checkpoint.
        return ssd_fold(state, records["x"], records["dt"], records["B"], params["A"])

    @staticmethod
    def kernel_step(state, ring: Records, origin, count, tokens: Records, params: Records, buffer_len: int,
                    out_dtype: torch.dtype = torch.float32, read_copy=None, read_format=None):
        """One decode token through the Triton replay-or-flush kernel (``hf_replayssm.kernels.mamba2``), written
        straight in ``out_dtype`` (no cast launch); with ``read_copy`` (fp8 / nvfp4) every output reads it, a flush
        step's too (the separated policy), while the flush folds into the float32 checkpoint, and the step
        re-encodes the copy after a flush (``reencode_copy``)."""
        from .kernels.mamba2 import mamba2_replay_step

        x = tokens["x"][:, 0]
        # A raw dt comes with dt_bias / dt_softplus (and the z gate) for the kernel to apply (see the adapter).
        y = mamba2_replay_step(
            state, ring["x"], ring["dt"], ring["B"], origin, count, x, tokens["dt"][:, 0],
            tokens["B"][:, 0], tokens["C"][:, 0], params["A"], params.get("D"), z=params.get("z"),
            dt_bias=params.get("dt_bias"), dt_softplus=bool(params.get("dt_softplus", False)), buffer_len=buffer_len,
            out=torch.empty(x.shape, dtype=out_dtype, device=x.device), read_copy=read_copy, read_format=read_format,
            flush_reads_copy=read_copy is not None, reencode_copy=read_copy is not None,
        )
        return y[:, None]

    @staticmethod
    def device_step(state, ring: Records, origin, count, tokens: Records, buffer_len: int, read_copy=None,
                    read_format=None) -> torch.Tensor:
        """One decode token on per-row device positions through the ``hf_replayssm::mamba2_replay_step`` op (the
        fused replay-or-flush kernel on CUDA, the reference elsewhere): what a compiled step traces. ``tokens``
        carries the per-layer constants too (A, D, dt_bias, dt_softplus, z); y [B, 1, H, P] in x's dtype. With a
        read copy (separated precision) the ``..._read_copy`` op, which also re-encodes the copy of flushed rows."""
        token = (tokens["x"][:, 0], tokens["dt"][:, 0], tokens["B"][:, 0], tokens["C"][:, 0], tokens["A"],
                 tokens.get("D"), tokens.get("z"), tokens.get("dt_bias"), bool(tokens.get("dt_softplus", False)))
        positions = (state, ring["x"], ring["dt"], ring["B"], origin, count)
        if read_copy is None:
            y = torch.ops.hf_replayssm.mamba2_replay_step(*positions, *token, buffer_len)
        else:
            from .kernels.ops import read_copy_parts

            y = torch.ops.hf_replayssm.mamba2_replay_step_read_copy(
                *positions, *read_copy_parts(read_copy, read_format), read_format, *token, buffer_len)
        return y[:, None]

    @staticmethod
    def device_verify(state, ring: Records, origin, count, tokens: Records) -> torch.Tensor:
        """A speculative window on per-row device positions through the ``hf_replayssm::mamba2_verify`` op (the
        Triton verify kernel on CUDA, the reference elsewhere): what a compiled verify forward traces. ``tokens`` as
        :meth:`device_step`'s (a raw dt with dt_bias / dt_softplus and the z gate, or a processed dt without them);
        y [B, T, H, P] float32; the window's records written after the ``count`` committed ones."""
        z = tokens.get("z")
        if z is not None and z.dim() == tokens["x"].dim() - 1:  # a one-token window from the step's call: [B, H, P]
            z = z[:, None]
        return torch.ops.hf_replayssm.mamba2_verify(
            state, ring["x"], ring["dt"], ring["B"], origin, count, tokens["x"], tokens["dt"], tokens["B"],
            tokens["C"], tokens["A"], tokens.get("D"), z, tokens.get("dt_bias"), bool(tokens.get("dt_softplus", False)))

    @staticmethod
    def kernel_verify(state, ring: Records, origin: torch.Tensor, count: torch.Tensor, tokens: Records,
                      params: Records, out: torch.Tensor | None = None) -> torch.Tensor:
        """A speculative window of T <= 16 tokens through the Triton verify kernel (``hf_replayssm.kernels.
        mamba2_verify``): outputs [B, T, H, P] (float32, or into ``out`` in its dtype) from the checkpoint, the
        ``count`` buffered records and the window's earlier tokens; the window's records appended after them in the
        ring; no state write. What :meth:`outputs` plus ``ring.append`` give, in one launch."""
        from .kernels.mamba2_verify import mamba2_verify

        x = tokens["x"]
        return mamba2_verify(state, ring["x"], ring["dt"], ring["B"], origin, count, x, tokens["dt"], tokens["B"],
                             tokens["C"], params["A"], params.get("D"),
                             out=torch.empty(x.shape, dtype=torch.float32, device=x.device) if out is None else out)

    @staticmethod
    def kernel_fold(state, ring: Records, origin: int, count: int, params: Records, out=None) -> torch.Tensor:
        """``state`` with the ``count`` ring records from slot ``origin`` folded in (``hf_replayssm.kernels.
        mamba2_verify.mamba2_fold_ring``, one launch), into ``out`` (default a new tensor; ``state`` for in place):
        what :meth:`fold` gives, with the commit kernel's rounding."""
        from .kernels.mamba2_verify import mamba2_fold_ring

        return mamba2_fold_ring(state, ring["x"], ring["dt"], ring["B"], params["A"], origin, count, out=out)

    def slice(self, tokens: Records, start: int, stop: int) -> dict:
        return _slice(tokens, self.per_token, start, stop)


class DeltaRuleRecurrence:
    """Gated DeltaNet (scalar gate) and Kimi Delta Attention (per-channel gate).

    Tokens: q, k [B,T,Hk,K] raw (as the mixer passes them, before l2 normalisation; one per key head), v [B,T,Hv,V],
    beta [B,T,Hv], g [B,T,Hv] or [B,T,Hv,K] (float32 log decay); parameters ``normalize`` (the model's own l2norm, or
    None when the model normalises itself) and ``value_heads`` (Hv; key heads serve Hv / Hk value heads each).
    Records: raw k (per key head), g and the corrected value d; plus v and beta when flushes must recompute d from
    raw inputs against a high-precision checkpoint (``exact``: separated precision), so no error of a low-precision
    read copy ever enters the recurrence.
    """

    name = "delta_rule"
    per_token = ("q", "k", "v", "beta", "g")
    output_like = "v"  # outputs [B, T, Hv, V] have this token input's shape
    # A record that leaves the state as it is: log decay g = 0 and corrected value d = 0 (beta = 0 where the exact
    # fold recomputes d from raw v and beta)
    neutral_record = (("g", 0.0), ("d", 0.0), ("beta", 0.0))

    def state_shape(self, tokens: Records) -> tuple[int, ...]:
        batch, _, value_heads, value_dim = tokens["v"].shape
        return (batch, value_heads, tokens["k"].shape[-1], value_dim)

    def record_examples(self, tokens: Records, exact: bool = False) -> dict[str, torch.Tensor]:
        examples = {"k": tokens["k"][:, :1], "g": tokens["g"][:, :1].float(), "d": tokens["v"][:, :1].float()}
        if exact:
            examples["v"] = tokens["v"][:, :1]
            examples["beta"] = tokens["beta"][:, :1].float()
        return examples

    @staticmethod
    def _keys(k: torch.Tensor, params: Records) -> torch.Tensor:
        """Raw keys/queries [B,M,Hk,K] -> normalised float32 per value head [B,M,Hv,K]."""
        k = k.float()
        if params.get("normalize") is not None:
            k = params["normalize"](k, dim=-1, eps=1e-6)
        ratio = params["value_heads"] // k.shape[2]
        return k.repeat_interleave(ratio, dim=2) if ratio > 1 else k

    def outputs(self, state: torch.Tensor, hist: Records, tokens: Records, params: Records) -> tuple[torch.Tensor,
                                                                                                    dict]:
        q = self._keys(tokens["q"], params)
        q = q / (q.shape[-1] ** 0.5)
        o, d = delta_replay(
            state, self._keys(hist["k"], params), hist["d"], hist["g"], q, self._keys(tokens["k"], params),
            tokens["v"], tokens["beta"], tokens["g"],
        )
        records = {name: tokens[name] for name in ("k", "v", "beta", "g")}
        records["d"] = d
        return o, records

    def fold(self, state: torch.Tensor, records: Records, params: Records, exact: bool = False) -> torch.Tensor:
        k, d = self._keys(records["k"], params), records["d"]
        if exact and "v" in records:  # recompute the corrected values against this checkpoint
            empty_k, empty_d, empty_g = k[:, :0], d[:, :0], records["g"][:, :0]
            _, d = delta_replay(state, empty_k, empty_d, empty_g, None, k, records["v"], records["beta"], records["g"])
        return delta_fold(state, k, d, records["g"])

    @staticmethod
    def kernel_step(state, ring: Records, origin, count, tokens: Records, params: Records, buffer_len: int,
                    out_dtype: torch.dtype = torch.float32, read_copy=None, read_format=None):
        """One decode token through the Triton replay-or-flush kernel (``hf_replayssm.kernels.delta_rule``), written
        straight in ``out_dtype`` (no cast launch). With a read copy (separated precision) every output reads it, a
        flush step's too, and the ring's raw v / beta records let the flush recompute the corrected values against
        the float32 checkpoint; the step re-encodes the copy after a flush (``reencode_copy``)."""
        from .kernels.delta_rule import delta_replay_step

        v = tokens["v"][:, 0]
        o = delta_replay_step(
            state, ring["k"], ring["d"], ring["g"], origin, count, tokens["q"][:, 0], tokens["k"][:, 0],
            v, tokens["beta"][:, 0], tokens["g"][:, 0], buffer_len=buffer_len,
            use_qk_l2norm=params.get("normalize") is not None,
            out=torch.empty(v.shape, dtype=out_dtype, device=v.device), read_copy=read_copy, read_format=read_format,
            ring_v=ring.get("v"), ring_beta=ring.get("beta"), flush_reads_copy=read_copy is not None,
            reencode_copy=read_copy is not None,
        )
        return o[:, None]

    @staticmethod
    def device_step(state, ring: Records, origin, count, tokens: Records, buffer_len: int, read_copy=None,
                    read_format=None) -> torch.Tensor:
        """One decode token on per-row device positions through the ``hf_replayssm::delta_replay_step`` op (see
        ``Mamba2Recurrence.device_step``); o [B, 1, Hv, V] in v's dtype. With a read copy the ring keeps the raw
        v / beta records too (the exact fold of the separated policy)."""
        token = (tokens["q"][:, 0], tokens["k"][:, 0], tokens["v"][:, 0], tokens["beta"][:, 0], tokens["g"][:, 0],
                 buffer_len, tokens.get("normalize") is not None, None)
        if read_copy is None:
            o = torch.ops.hf_replayssm.delta_replay_step(state, ring["k"], ring["d"], ring["g"], origin, count, *token)
        else:
            from .kernels.ops import read_copy_parts

            o = torch.ops.hf_replayssm.delta_replay_step_read_copy(
                state, ring["k"], ring["d"], ring["g"], ring["v"], ring["beta"], origin, count,
                *read_copy_parts(read_copy, read_format), read_format, *token)
        return o[:, None]

    @staticmethod
    def device_verify(state, ring: Records, origin, count, tokens: Records) -> torch.Tensor:
        """A speculative window on per-row device positions through the ``hf_replayssm::delta_verify`` op (see
        ``Mamba2Recurrence.device_verify``); o [B, T, Hv, V] float32."""
        return torch.ops.hf_replayssm.delta_verify(
            state, ring["k"], ring["d"], ring["g"], origin, count, tokens["q"], tokens["k"], tokens["v"],
            tokens["beta"], tokens["g"], tokens.get("normalize") is not None, None)

    @staticmethod
    def kernel_verify(state, ring: Records, origin: torch.Tensor, count: torch.Tensor, tokens: Records,
                      params: Records, out: torch.Tensor | None = None) -> torch.Tensor:
        """A speculative window of T <= 16 tokens through the Triton verify kernel (``hf_replayssm.kernels.
        delta_verify``); outputs [B, T, Hv, V] (float32, or into ``out``); see ``Mamba2Recurrence.kernel_verify``."""
        from .kernels.delta_verify import delta_verify

        v = tokens["v"]
        return delta_verify(state, ring["k"], ring["d"], ring["g"], origin, count, tokens["q"], tokens["k"], v,
                            tokens["beta"], tokens["g"], use_qk_l2norm=params.get("normalize") is not None,
                            out=torch.empty(v.shape, dtype=torch.float32, device=v.device) if out is None else out)

    @staticmethod
    def kernel_fold(state, ring: Records, origin: int, count: int, params: Records, out=None) -> torch.Tensor:
        """``state`` with the ``count`` ring records from slot ``origin`` folded in with their recorded d's
        (``hf_replayssm.kernels.delta_verify.delta_fold_ring``); see ``Mamba2Recurrence.kernel_fold``."""
        from .kernels.delta_verify import delta_fold_ring

        return delta_fold_ring(state, ring["k"], ring["d"], ring["g"], origin, count,
                               use_qk_l2norm=params.get("normalize") is not None, out=out)

    def slice(self, tokens: Records, start: int, stop: int) -> dict:
        return _slice(tokens, self.per_token, start, stop)
