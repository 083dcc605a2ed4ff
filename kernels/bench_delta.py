"""Decode-step kernel benchmark for gated delta rule layers (Gated DeltaNet, Kimi Delta Attention): ReplaySSM replay
step vs our standard step vs flash-linear-attention's fused recurrent kernels vs transformers' torch path.

    python -m hf_replayssm.kernels.bench_delta --family gdn --out gdn.json          # installed package, GPU
    python -m hf_replayssm.kernels.bench_delta --family kda --out kda.json
    PYTHONPATH=. python kernels/bench_delta.py --family gdn --out gdn.json           # from a checkout
    TRITON_INTERPRET=1 python -m hf_replayssm.kernels.bench_delta --family gdn --smoke --out /tmp/s.json   # CPU

What is timed (per model shape and batch size; float32 state/checkpoint, bf16 q/k/v and ring keys, float32 beta,
gates and ring d/g, in-kernel l2 norm of q and k as the models use it):

* ``replay``: :func:`delta_replay_step` averaged over whole cycles of ``L`` (= buffer_len, default 16) launches,
  i.e. ``((L-1) replay + 1 flush) / L`` per row. Two phase layouts: ``mixed`` (row b's count starts at b mod L, so
  every launch has rows in every phase, ~1/L of them flushing) and ``in_phase`` (all rows share one count, so one
  launch in L is a full flush).
* ``standard``: :func:`delta_state_update` (read state, update, write back, output), default launch configuration
  and the best of a sweep.
* ``fla``: flash-linear-attention (when ``import fla`` works): GDN ``fused_recurrent_gated_delta_rule`` (T=1,
  initial state in, a new final state out: the public API has no in-place state), KDA ``fused_recurrent_kda_fwd``
  with ``inplace_final_state=True`` (the serving path; the public ``fused_recurrent_kda`` forces out-of-place).
* ``torch``: transformers' torch recurrence (``torch_recurrent_gated_delta_rule`` of qwen3_next,
  ``recurrent_kimi_delta_attention`` of kimi_linear, unwrapped from the hub/FLA dispatch), its final state copied
  back into the cache tensor, or :func:`hf_replayssm.ops.delta_rule.delta_step_reference` when transformers lacks
  them.

Timing (GPU): one CUDA graph holds ``L`` consecutive steps; before each graph replay the L2 cache is flushed by
writing a 256 MB buffer, and the replay is timed with CUDA events (median of the repetitions, 20th/80th percentiles
also stored). Inputs rotate among enough copies (1, 2, 4, 8 or 16, dividing L) that together they exceed twice the
50 MB L2, so consecutive steps never find their state in L2 either. Device-to-device copy bandwidth (1 GiB
``copy_``, read + write counted) is measured in the same run.

Bytes counted per step (per batch row): standard = 2|S| + io; replay = |S| (checkpoint read) + |S|/L (flush write,
amortised) + (L-1)/2 records read on average + (L-1)/L record appends + io, with |S| = Hv*K*V*4, a record =
Hk*K*2 (raw k) + Hv*V*4 (d) + Hv*4 (GDN g) or Hv*K*4 (KDA g), and io = q, k, v, beta, g reads + o write.
``GB/s`` = these bytes / time (1 GB = 1e9 B); ``%cp`` = that over the measured copy bandwidth.

``--read-format fp8|nvfp4`` adds the separated-precision arm ``replay_host_read_copy``: the host-phase cycle whose
L - 1 replay-only launches read a low-precision read copy of the checkpoint (decoded in registers) and whose flush
reads and writes the fp32 checkpoint with the exact fold (ring_v / ring_beta: replays also append raw v and beta,
bytes not in the model below). The copy's refresh after the flush (an encode of the new checkpoint, done by
the caller) is not timed; its bytes model is ``(L-1)/L |S_lp| + 2|S|/L`` + records + io, |S_lp| the copy's bytes
(fp8: 1 B/element + a 4-byte scale per row; nvfp4: 0.5625 B/element + 4 B per sequence). The correctness check then
also compares one mixed-phase launch with the copy against the torch reference.

A correctness check on the device runs first (replay vs standard kernel over 2L+3 steps, one mixed-phase launch vs
the torch reference, and the standard kernel vs fla on one step when fla is there); its errors go into the JSON.
"""

from __future__ import annotations

import argparse
import contextlib

import torch

if __package__:
    from .bench_common import (
        Timer,
        add_cycle_arguments,
        cycle_environment,
        device_read_copy_times,
        finish_bench,
        host_reencode_times,
        load_kernels,
        parse_walks,
        print_read_copy_rows,
        suffixed,
    )
    from .bench_common import compiled_info as _compiled_info
    from .bench_common import num_copies as _num_copies
else:  # run as a script from a checkout: python kernels/bench.py
    from bench_common import (
        Timer,
        add_cycle_arguments,
        cycle_environment,
        device_read_copy_times,
        finish_bench,
        host_reencode_times,
        load_kernels,
        parse_walks,
        print_read_copy_rows,
        suffixed,
    )
    from bench_common import compiled_info as _compiled_info
    from bench_common import num_copies as _num_copies

SHAPES = {  # family: {name: (value heads, key heads, key dim, value dim)}
    "gdn": {"qwen3-next": (32, 16, 128, 128), "qwen3.5-large": (64, 16, 128, 128)},
    "kda": {"kimi-linear": (32, 32, 128, 128)},
}
SMOKE_SHAPES = {"gdn": {"smoke": (4, 2, 16, 16)}, "kda": {"smoke": (2, 2, 16, 16)}}
BATCHES = [1, 8, 32, 64, 128, 256, 512]
# one- and two-warp tiles since run 86 (GDN 64 x 2 and KDA's device-phase 16 x 1 were the fastest fp32 replays)
REPLAY_SWEEP = [(16, 1), (16, 2), (16, 4), (32, 1), (32, 2), (32, 4), (32, 8), (64, 2), (64, 4), (64, 8), (128, 8)]
STANDARD_SWEEP = [(8, 1), (8, 2), (16, 1), (16, 2), (16, 4), (32, 1), (32, 2), (32, 4), (64, 4), (64, 8)]
# --diag: the host-position cycle with its replay-only launches walking the tiles on a device-sized grid, loads
# pipelined (_walk): (BLOCK_V, num_warps, pipeline stages, programs per SM); --walks overrides. Run 117 (batch 256):
# GDN 64 x 4 x 3 stages x 2 per SM 323, 64 x 4 x 2 x 2 324, 32 x 2 x 2 x 3 302, 32 x 1 x 2 x 4 228 against the
# per-tile cycle's 212 us; KDA 293 / 311 / 291 / 247 against 227: the one-warp tile with the most programs per SM
# came closest, so these go further (32 x 1 at two stages is 32 KB of shared memory per program); runs
# 119-121 found 8 per SM at 32 x 1, 2 stages best, the host-phase default since (host_walk_launch_config)
WALKS = [(32, 1, 2, 6), (32, 1, 3, 4), (16, 1, 2, 8), (16, 1, 2, 12)]
# --read-format: the host cycle with its replay-only launches streaming the copy CHUNK_K rows of K at a time (fp8:
# the row scales folded into q and k; nvfp4 decoded per chunk) (_chunk_k): (BLOCK_V, num_warps, CHUNK_K). The
# whole-tile fp8 replay holds a [128, 64] tile and a per-element scale load (run 93: 254.6 us, 1.08x the standard
# step, 23 % of copy bandwidth); streamed, [128, 32] x 1 in chunks of 16 was the fastest (run 130: 225.0 us)
READ_COPY_CHUNKS = [(32, 1, 16), (32, 1, 8), (32, 1, 32), (16, 1, 16), (64, 1, 16), (64, 2, 16), (32, 2, 32)]


def _fla_step_fn(family: str):
    """(name, version, fn(state, q, k, v, beta, g, out)) for flash-linear-attention's decode kernel, or None."""
    try:
        import fla

        version = getattr(fla, "__version__", "?")
        if family == "gdn":
            from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule

            def step(state, q, k, v, beta, g, out):
                o, _ = fused_recurrent_gated_delta_rule(q[:, None], k[:, None], v[:, None], g=g[:, None],
                                                        beta=beta[:, None], initial_state=state,
                                                        output_final_state=True, use_qk_l2norm_in_kernel=True)
                return o

            return "fla.ops.gated_delta_rule.fused_recurrent_gated_delta_rule (out-of-place state)", version, step
        from fla.ops.kda.fused_recurrent import fused_recurrent_kda_fwd

        def step(state, q, k, v, beta, g, out):
            o, _ = fused_recurrent_kda_fwd(q[:, None], k[:, None], v[:, None], g[:, None], beta[:, None],
                                           initial_state=state, inplace_final_state=True,
                                           use_qk_l2norm_in_kernel=True, out=out[:, None])
            return o

        return "fla.ops.kda.fused_recurrent.fused_recurrent_kda_fwd (inplace_final_state)", version, step
    except Exception as error:  # any import or attribute failure means: no fla arm
        print(f"  (no fla arm: {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''})")
        return None


def _torch_step_fn(family: str):
    """(name, fn(state, q, k, v, beta, g)) for transformers' torch decode recurrence (state updated in place)."""
    try:
        if family == "gdn":
            from transformers.models.qwen3_next import modeling_qwen3_next as mod

            fn, name = mod.torch_recurrent_gated_delta_rule, "transformers.qwen3_next.torch_recurrent_gated_delta_rule"
        else:
            from transformers.models.kimi_linear import modeling_kimi_linear as mod

            fn, name = mod.recurrent_kimi_delta_attention, "transformers.kimi_linear.recurrent_kimi_delta_attention"
        fn = getattr(fn, "__wrapped__", fn)

        def step(state, q, k, v, beta, g):
            ratio = v.shape[1] // q.shape[1]  # transformers repeats the key heads up to the value heads first
            q, k = q.repeat_interleave(ratio, dim=1), k.repeat_interleave(ratio, dim=1)
            o, new_state = fn(q[:, None], k[:, None], v[:, None], g[:, None], beta[:, None], initial_state=state,
                              output_final_state=True, use_qk_l2norm_in_kernel=True)
            state.copy_(new_state)
            return o

        return name + " (torch)", step
    except (ImportError, AttributeError):
        from hf_replayssm.ops.delta_step import delta_state_update_ref

        return "hf_replayssm.ops.delta_step.delta_state_update_ref", delta_state_update_ref


# ---------------------------------------------------------------------------------------------------------------
# timing


# ---------------------------------------------------------------------------------------------------------------
# inputs


def _gate_shape(value_heads: int, key_dim: int, per_key: bool) -> tuple[int, ...]:
    return (value_heads, key_dim) if per_key else (value_heads,)


def _tokens(batch, Hv, Hk, K, V, per_key, device, gen, dtype=torch.bfloat16):
    def rnd(*shape):
        return torch.randn(*shape, generator=gen, device=device)

    return dict(q=rnd(batch, Hk, K).to(dtype), k=rnd(batch, Hk, K).to(dtype), v=rnd(batch, Hv, V).to(dtype),
                beta=torch.rand(batch, Hv, generator=gen, device=device) * 0.9 + 0.05,
                g=-(torch.rand(batch, *_gate_shape(Hv, K, per_key), generator=gen, device=device) * 0.3 + 0.01),
                out=torch.empty(batch, Hv, V, dtype=dtype, device=device))


TOKEN = ("q", "k", "v", "beta", "g")
RING = ("state", "ring_k", "ring_d", "ring_g", "origin", "count")


def _state_bytes(batch, Hv, K, V):
    return batch * Hv * K * V * 4


def _read_copy_bytes(batch, Hv, K, V, read_format):
    if read_format is None:
        return 0
    from hf_replayssm.precision.formats import get_format

    extra = 4 * batch if read_format == "nvfp4" else 0  # the per-sequence scale
    return int(batch * Hv * K * V * get_format(read_format).bytes_per_element(V)) + extra


def _byte_model(batch, Hv, Hk, K, V, per_key, L, read_format=None):
    S = _state_bytes(batch, Hv, K, V)
    S_lp = _read_copy_bytes(batch, Hv, K, V, read_format)
    gate = Hv * K * 4 if per_key else Hv * 4
    record = batch * (Hk * K * 2 + Hv * V * 4 + gate)
    io = batch * (2 * Hk * K * 2 + Hv * V * 2 + Hv * 4 + gate + Hv * V * 2)
    return dict(state=S, record=record, io=io, standard=2 * S + io,
                replay=S * (1 + 1 / L) + record * ((L - 1) / 2 + (L - 1) / L) + io,
                replay_read_copy=S_lp * (L - 1) / L + 2 * S / L + record * ((L - 1) / 2 + (L - 1) / L) + io)


class ReplayInputs:
    def __init__(self, batch, shape, per_key, L, device, gen, phase, cuda):
        Hv, Hk, K, V = shape
        R = max(L - 1, 1)
        self.n = _num_copies(_state_bytes(batch, Hv, K, V), L, cuda)
        self.L = L
        self.copies = []
        rows = torch.arange(batch, device=device, dtype=torch.int32)
        for c in range(self.n):
            start = c * (L // self.n)
            count = (rows + start) % L if phase == "mixed" else torch.full_like(rows, start % L)
            self.copies.append(dict(
                state=torch.randn(batch, Hv, K, V, generator=gen, device=device) * 0.1,
                ring_k=torch.randn(batch, R, Hk, K, generator=gen, device=device).bfloat16(),
                ring_d=torch.randn(batch, R, Hv, V, generator=gen, device=device) * 0.1,
                ring_g=-(torch.rand(batch, R, *_gate_shape(Hv, K, per_key), generator=gen, device=device) * 0.3
                         + 0.01),
                origin=(rows % R).to(torch.int32),
                count=count.to(torch.int32).contiguous(),
                **_tokens(batch, Hv, Hk, K, V, per_key, device, gen),
            ))

    def fn(self, step, per_copy=None, after=None, **launch):
        """L device-phase steps over the rotated copies; ``per_copy(c)``: extra arguments of each call, ``after(c)``:
        run after each call."""
        def run():
            for i in range(self.L):
                c = self.copies[i % self.n]
                step(*[c[n] for n in RING], *[c[n] for n in TOKEN], buffer_len=self.L, out=c["out"], **launch,
                     **(per_copy(c) if per_copy else {}))
                if after is not None:
                    after(c)

        return run

    def add_read_copies(self, read_format: str) -> None:
        """Give every copy a read copy of its checkpoint in ``read_format`` (the store's encoding) and the raw
        v / beta rings of the exact fold the separated policy needs."""
        from hf_replayssm.precision.formats import get_format

        for c in self.copies:
            c["read_copy"] = get_format(read_format).encode(c["state"])
            c["ring_v"] = torch.randn(c["ring_d"].shape, device=c["ring_d"].device).bfloat16()
            c["ring_beta"] = torch.rand(c["ring_d"].shape[:3], device=c["ring_d"].device)

    # the separated policy's steps re-encode the copy in the step (reencode_copy; see device_read_copy_fn)
    reencode_in_step = True

    def device_read_copy_fn(self, step, reencode, read_format: str, **launch):
        """The compiled decode step of the separated policy (``delta_replay_step_read_copy``): the device-phase
        launch reading the copy (a flushing row's output from the copy too) and the re-encode of the copy of the
        rows that flushed (``count`` 0 after the step): ``"step"`` by the step itself (``reencode_copy``: the op's
        way; nvfp4 with the flush's amax), a callable as a launch after it, None skipped."""
        in_step = reencode == "step"
        return self.fn(step, per_copy=lambda c: dict(read_copy=c["read_copy"], read_format=read_format,
                                                     flush_reads_copy=True, ring_v=c["ring_v"],
                                                     ring_beta=c["ring_beta"], reencode_copy=in_step),
                       after=None if reencode is None or in_step else
                       lambda c: reencode(c["state"], c["read_copy"], read_format, c["count"] == 0), **launch)

    def host_fn(self, step, only: int | None = None, read_format: str | None = None, flush_launch: dict | None = None,
                reencode=None, **launch):
        """A cycle with every row at one position known on the host (plain batched decoding): L - 1 replay-only
        launches and one flush-only launch (the phase-specialised kernels); ``only``: L launches at that count.
        ``read_format``: the replay-only launches read the copies' read copy (see :meth:`add_read_copies`).
        ``flush_launch``: the flush-only launch's overrides instead of ``launch`` (``{}``: its defaults, e.g. while
        a sweep varies the replay-only launches' tile). ``reencode(state, read_copy, read_format, select)``: run after
        the flush launch on every row, whose outputs then come from the copy (``flush_reads_copy``): the step as the
        cache ran it before the step re-encoded the copy itself (``CheckpointStore.refresh_read_copy``); ``"step"``:
        the flush re-encodes it (``reencode_copy``, nvfp4 with the flush's amax: as the cache runs it). None: a
        plain flush, the copy not refreshed."""
        def run():
            for j in range(self.L):
                i = j if only is None else only
                c = self.copies[j % self.n]
                read = {}
                if read_format is not None:  # the copy on replay launches, the exact fold's raw records always
                    read = dict(ring_v=c["ring_v"], ring_beta=c["ring_beta"])
                    if i + 1 < self.L:
                        read.update(read_copy=c["read_copy"], read_format=read_format)
                    elif reencode is not None:  # the cache's flush: outputs from the copy
                        read.update(read_copy=c["read_copy"], read_format=read_format, flush_reads_copy=True,
                                    reencode_copy=reencode == "step")
                overrides = flush_launch if flush_launch is not None and i == self.L - 1 else launch
                step(*[c[n] for n in RING[:4]], 0, i, *[c[n] for n in TOKEN], buffer_len=self.L, out=c["out"],
                     **overrides, **read)
                if reencode is not None and reencode != "step" and i == self.L - 1:
                    reencode(c["state"], c["read_copy"], read_format, every_row)

        every_row = torch.ones(self.copies[0]["state"].shape[0], dtype=torch.bool,
                               device=self.copies[0]["state"].device)
        return run


class StepInputs:
    def __init__(self, batch, shape, per_key, L, device, gen, cuda):
        Hv, Hk, K, V = shape
        self.n = _num_copies(_state_bytes(batch, Hv, K, V), L, cuda)
        self.L = L
        self.copies = [dict(state=torch.randn(batch, Hv, K, V, generator=gen, device=device) * 0.1,
                            **_tokens(batch, Hv, Hk, K, V, per_key, device, gen)) for _ in range(self.n)]

    def kernel_fn(self, step, **launch):
        def run():
            for i in range(self.L):
                c = self.copies[i % self.n]
                step(c["state"], *[c[n] for n in TOKEN], out=c["out"], **launch)

        return run

    def fla_fn(self, step):
        def run():
            for i in range(self.L):
                c = self.copies[i % self.n]
                step(c["state"], *[c[n] for n in TOKEN], c["out"])

        return run

    def torch_fn(self, step):
        def run():
            for i in range(self.L):
                c = self.copies[i % self.n]
                step(c["state"], *[c[n] for n in TOKEN])

        return run


def _phase_times(k, inputs: ReplayInputs, timer: Timer, L: int, cfg, **launch) -> dict:
    """Single-step replay time with every row at one count (0, L/2, L-2: replay; L-1: flush), in us, at the tile
    ``cfg`` (None: the step's default launch) with ``launch``'s overrides. Each timed graph resets ``count`` first (a
    tiny copy, timed alone and subtracted)."""
    c = inputs.copies[0]
    saved = c["count"].clone()
    target = torch.empty_like(c["count"])
    reset_only = timer(lambda: c["count"].copy_(target))["ms"]
    out = {}
    for count in sorted({0, L // 2, max(L - 2, 0), L - 1}):
        target.fill_(count)

        def run():
            c["count"].copy_(target)
            tile = {} if cfg is None else dict(_block_v=cfg[0], _num_warps=cfg[1])
            k._replay_step(*[c[n] for n in RING], *[c[n] for n in TOKEN], buffer_len=L, out=c["out"], **tile,
                           **launch)

        out[f"count{count}{'_flush' if count == L - 1 else ''}"] = (timer(run)["ms"] - reset_only) * 1e3
    c["count"].copy_(saved)
    return out


# ---------------------------------------------------------------------------------------------------------------
# correctness check on the device


def _rel(got, want) -> float:
    return ((got.float() - want.float()).abs().max() / want.float().abs().max().clamp_min(1)).item()


# launch variants of the device-phase step timed by every run next to the default (one fused launch, count launch,
# records in logical order) and checked against it on the device: bit for bit, or to 1e-5 where the summation order
# differs (records by physical slot; a split step's flush always folds with tl.dot, KDA's fused flush with a loop)
VARIANTS = {
    "tickets": (dict(_count_launch=False), True),
    "split_no_prefetch": (dict(_split=True, _prefetch=False), False),
    "physical_ring": (dict(_ring_physical=True), False),
    # the split step's replay launch walking the tiles on a device-sized grid, loads pipelined (_walk): at 2 programs
    # per SM (run 117, batch 256) GDN 306 / 294 us (2 / 3 stages) and KDA 515 / 430 against the default's 227 / 226;
    # more programs per SM were faster in every host walk, so 4 now
    "split_walk_s2_x4": (dict(_split=True, _walk=dict(num_stages=2, programs_per_sm=4)), False),
    # the same at the host walk's default ([K, 32] x 1 warp, 8 per SM; host cycle GDN 212 -> 177 us, run 122)
    "split_walk_32x1_x8": (dict(_split=True, _block_v=32, _num_warps=1,
                                _walk=dict(num_stages=2, programs_per_sm=8)), False),
    # the first with the flush on a device-sized grid that walks only the due rows' tiles (with rows in phase 15
    # steps in 16 have none; the batch grid launches a program per tile that reads its row's count and exits)
    "split_walk_s2_x4_flush_device": (dict(_split=True, _walk=dict(num_stages=2, programs_per_sm=4),
                                           _flush_grid="device"), False),
    # the first with the replay launch walking only the replaying rows' items (run 128: with every row due, the
    # split step's replay launch over masked items cost about 170 us of the flush step's 685 at batch 256)
    "split_walk_s2_x4_compact": (dict(_split=True, _walk=dict(num_stages=2, programs_per_sm=4, compact=True)),
                                 False),
    # compacting, on the host walk's [K, 32] x 1 x 8 per SM (sm_90 compile-only: GDN 168 registers, no spills, where
    # the [128, 64] x 2 walk sits at 255), the flush launch on the step's tile
    "split_walk_32x1_x8_compact": (dict(_split=True, _walk=dict(num_stages=2, programs_per_sm=8, compact=True,
                                                                 block_v=32, num_warps=1)), False),
}


def check(k, shape, per_key, L, device, fla_step=None, batch=4, read_format=None) -> dict:
    """Replay kernel vs standard kernel over 2L+3 in-phase steps (fp32 tokens), one mixed-phase launch vs the torch
    reference (also with a read copy in ``read_format``), and (when given) the standard kernel vs fla on one step.
    Returns max errors relative to the output / state scale."""
    Hv, Hk, K, V = shape
    gen = torch.Generator(device=device).manual_seed(0)
    R = max(L - 1, 1)
    ckpt = torch.randn(batch, Hv, K, V, generator=gen, device=device) * 0.1
    std = ckpt.clone()
    ring_k = torch.zeros(batch, R, Hk, K, device=device)
    ring_d = torch.zeros(batch, R, Hv, V, device=device)
    ring_g = torch.zeros(batch, R, *_gate_shape(Hv, K, per_key), device=device)
    origin = torch.arange(batch, dtype=torch.int32, device=device) % R
    count = torch.zeros(batch, dtype=torch.int32, device=device)
    err_o = err_s = 0.0
    for t in range(2 * L + 3):
        tok = _tokens(batch, Hv, Hk, K, V, per_key, device, gen, dtype=torch.float32)
        del tok["out"]
        o = k.delta_replay_step(ckpt, ring_k, ring_d, ring_g, origin, count, **tok, buffer_len=L)
        o_std = k.delta_state_update(std, **tok)
        err_o = max(err_o, _rel(o, o_std))
        if (t + 1) % L == 0:
            err_s = max(err_s, _rel(ckpt, std))
    counts_ok = count.tolist() == [(2 * L + 3) % L] * batch
    # one mixed-phase launch (counts 0..L-1 across rows) against the torch reference
    mix_batch = max(L, 2)
    mix = ReplayInputs(mix_batch, shape, per_key, L, device, gen, "mixed", cuda=False).copies[0]
    ref = {name: t.clone() for name, t in mix.items()}
    base = {name: t.clone() for name, t in mix.items()}
    o = k.delta_replay_step(*[mix[n] for n in RING], *[mix[n] for n in TOKEN], buffer_len=L,
                            out=torch.empty(mix["v"].shape, device=device))
    o_default, after = o.clone(), {name: t.clone() for name, t in mix.items()}
    o_ref = k.delta_replay_step_ref(*[ref[n] for n in RING], *[ref[n] for n in TOKEN], buffer_len=L,
                                    out=torch.empty(mix["v"].shape, device=device))
    result = dict(seq_o_rel_err=err_o, seq_checkpoint_rel_err=err_s, seq_counts_ok=counts_ok,
                  mixed_o_rel_err=_rel(o, o_ref), mixed_state_rel_err=_rel(mix["state"], ref["state"]),
                  mixed_ring_d_rel_err=_rel(mix["ring_d"], ref["ring_d"]),
                  mixed_counts_and_keys_ok=bool(torch.equal(mix["count"], ref["count"])
                                                and torch.equal(mix["ring_k"], ref["ring_k"])
                                                and torch.equal(mix["ring_g"], ref["ring_g"])))
    # the launch variants (records loaded before the positions, counts advanced by their own launch) against the
    # default launch on the same inputs: bit for bit, outputs, checkpoints, rings and counts
    variants = {}
    for name, (launch, bitwise) in VARIANTS.items():
        copy = {n: t.clone() for n, t in base.items()}
        o_var = k._replay_step(*[copy[n] for n in RING], *[copy[n] for n in TOKEN], buffer_len=L,
                               out=torch.empty(copy["v"].shape, device=device), **launch)
        exact = ("ring_k", "ring_g", "count") + (("state", "ring_d") if bitwise else ())
        close = max([_rel(o_var, o_default)] + [_rel(copy[n], after[n]) for n in ("state", "ring_d")])
        variants[name] = bool(all(torch.equal(copy[n], after[n]) for n in exact)
                              and (torch.equal(o_var, o_default) if bitwise else close < 1e-5))
    if per_key:  # the decays and record weights computed by every V tile (the former default)
        copy = {n: t.clone() for n, t in base.items()}
        o_var = k._replay_step(*[copy[n] for n in RING], *[copy[n] for n in TOKEN], buffer_len=L,
                               out=torch.empty(copy["v"].shape, device=device), _kda_weights=False)
        close = max([_rel(o_var, o_default)] + [_rel(copy[n], after[n]) for n in ("state", "ring_d")])
        variants["per_tile_decays"] = bool(all(torch.equal(copy[n], after[n]) for n in ("ring_k", "ring_g", "count"))
                                       and close < 1e-5)
    result["variants_equal_default"] = variants
    ok = (err_o < 1e-4 and err_s < 1e-5 and counts_ok and result["mixed_o_rel_err"] < 1e-4 and all(variants.values())
          and result["mixed_state_rel_err"] < 1e-5 and result["mixed_ring_d_rel_err"] < 1e-4
          and result["mixed_counts_and_keys_ok"])
    if read_format is not None:  # one mixed-phase launch reading a read copy, against the torch reference
        mix = ReplayInputs(mix_batch, shape, per_key, L, device, gen, "mixed", cuda=False)
        mix.add_read_copies(read_format)
        mix = mix.copies[0]
        read = dict(read_copy=mix.pop("read_copy"), read_format=read_format)
        ref = {name: t.clone() for name, t in mix.items()}
        pre = {name: t.clone() for name, t in mix.items()}
        o = k.delta_replay_step(*[mix[n] for n in RING], *[mix[n] for n in TOKEN], buffer_len=L,
                                out=torch.empty(mix["v"].shape, device=device), **read)
        o_ref = k.delta_replay_step_ref(*[ref[n] for n in RING], *[ref[n] for n in TOKEN], buffer_len=L,
                                        out=torch.empty(mix["v"].shape, device=device), **read)
        result.update(read_copy_format=read_format, read_copy_mixed_o_rel_err=_rel(o, o_ref),
                      read_copy_mixed_ring_d_rel_err=_rel(mix["ring_d"], ref["ring_d"]))
        if read_format == "nvfp4":  # the per-nibble load: the same values, so the same step
            o_nibbles = k._replay_step(*[pre[n] for n in RING], *[pre[n] for n in TOKEN], buffer_len=L,
                                     out=torch.empty(mix["v"].shape, device=device), _nvfp4_pairs=False, **read)
            result["read_copy_nvfp4_nibbles_rel_err"] = _rel(o_nibbles, o)
            ok = ok and result["read_copy_nvfp4_nibbles_rel_err"] < 1e-6
        ok = ok and result["read_copy_mixed_o_rel_err"] < 1e-4 and result["read_copy_mixed_ring_d_rel_err"] < 1e-4
    if fla_step is not None:
        tok = _tokens(batch, Hv, Hk, K, V, per_key, device, gen)
        state = torch.randn(batch, Hv, K, V, generator=gen, device=device) * 0.1
        state_fla = state.clone()
        out = torch.empty(tok["v"].shape, device=device)
        o = k.delta_state_update(state, *[tok[n] for n in TOKEN], out=out)
        if per_key:  # in place
            o_fla = fla_step(state_fla, *[tok[n] for n in TOKEN], torch.empty_like(tok["out"]))
        else:  # new final state: rerun through fla's own API to get it
            from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule

            o_fla, state_fla = fused_recurrent_gated_delta_rule(
                *[tok[n][:, None] for n in ("q", "k", "v")], g=tok["g"][:, None], beta=tok["beta"][:, None],
                initial_state=state_fla, output_final_state=True, use_qk_l2norm_in_kernel=True)
        result.update(fla_o_rel_err=_rel(o, o_fla.reshape(o.shape)), fla_state_rel_err=_rel(state, state_fla))
        ok = ok and result["fla_o_rel_err"] < 2e-2 and result["fla_state_rel_err"] < 1e-4  # fla's o is bf16
    result["ok"] = bool(ok)
    return result


# ---------------------------------------------------------------------------------------------------------------
# main


def _key(cfg) -> str:
    return f"{cfg[0]}x{cfg[1]}"


def bench_family(args, device, timer, copy_bw) -> tuple[list[dict], dict, dict]:
    k = load_kernels("delta_rule")
    torch_name, torch_step = _torch_step_fn(args.family)
    fla = None if args.no_fla else _fla_step_fn(args.family)
    per_key = args.family == "kda"
    cuda = device.type == "cuda"
    shapes = SMOKE_SHAPES[args.family] if args.smoke else SHAPES[args.family]
    if args.shapes:
        shapes = {name: shapes[name] for name in args.shapes.split(",")}
    batches = [int(b) for b in args.batches.split(",")] if args.batches else ([2] if args.smoke else BATCHES)
    L = args.buffer_len
    replay_sweep = [] if (args.smoke or args.no_sweep) else REPLAY_SWEEP
    standard_sweep = [] if (args.smoke or args.no_sweep) else STANDARD_SWEEP
    checks, rows = {}, []
    arms = dict(torch=torch_name, fla=fla[0] if fla else None, fla_version=fla[1] if fla else None)
    for name, shape in shapes.items():
        Hv, Hk, K, V = shape
        if not args.no_check:
            checks[name] = check(k, shape, per_key, L, device, fla[2] if fla else None, batch=2 if args.smoke else 4,
                                 read_format=args.read_format)
            print(f"check {name}: {checks[name]}", flush=True)
        for batch in batches:
            gen = torch.Generator(device=device).manual_seed(batch)
            nbytes = _byte_model(batch, Hv, Hk, K, V, per_key, L, args.read_format)
            row = dict(shape=name, value_heads=Hv, key_heads=Hk, key_dim=K, value_dim=V, gate="per-key" if per_key
                       else "scalar", batch=batch, buffer_len=L, bytes_per_step=nbytes)

            def per_step_us(t):
                return t["ms"] * 1e3 / L

            # replay, mixed phases: default config and sweep
            inputs = ReplayInputs(batch, shape, per_key, L, device, gen, "mixed", cuda)
            # rows in mixed phases run the device-phase launch: its default (KDA's differs from host positions')
            default_cfg = k.replay_launch_config(batch, Hv, K, V, per_key, device_phase=True)
            sweep = {}
            for cfg in dict.fromkeys([default_cfg, *[c for c in replay_sweep if c[0] <= max(16, V)]]):
                t = timer(inputs.fn(k._replay_step, _block_v=cfg[0], _num_warps=cfg[1]))
                sweep[_key(cfg)] = dict(us=per_step_us(t), **t, **_compiled_info(k, "replay"))
            best_cfg = min(sweep, key=lambda c: sweep[c]["us"])
            bv, nw = (int(x) for x in best_cfg.split("x"))
            row.update(replay_copies=inputs.n, replay_default_config=_key(default_cfg), replay_best_config=best_cfg,
                       replay_sweep=sweep, replay_mixed_default_us=sweep[_key(default_cfg)]["us"],
                       replay_mixed_us=sweep[best_cfg]["us"])
            # the same step as two launches, flush-only then replay-only
            row["replay_mixed_split_us"] = per_step_us(timer(inputs.fn(k._replay_step, _block_v=bv, _num_warps=nw,
                                                                      _split=True)))
            # the device-phase launch as callers get it (no override): fused, or GDN's split walk from
            # DEVICE_WALK_MIN_BATCH rows (device_walk_launch_config)
            device_walk = k.device_walk_launch_config(batch, K, per_key)
            row["replay_device_default_launch"] = "fused" if device_walk is None else (
                f"split_walk_x{device_walk['programs_per_sm']}_s{device_walk['num_stages']}"
                f"{'_compact' if device_walk.get('compact') else ''}")
            row["replay_mixed_device_default_us"] = per_step_us(timer(inputs.fn(k._replay_step)))
            for variant, (launch, _) in VARIANTS.items():
                row[f"replay_mixed_{variant}_us"] = per_step_us(timer(inputs.fn(
                    k._replay_step, **{"_block_v": bv, "_num_warps": nw, **launch})))  # a variant's tile wins
            if per_key:  # the former default: every V tile computes its head's decays; its own tile sweep
                kda = {}
                for cfg in dict.fromkeys([(bv, nw), *[c for c in replay_sweep if c[0] <= max(16, V)]]):
                    kda[_key(cfg)] = per_step_us(timer(inputs.fn(k._replay_step, _block_v=cfg[0], _num_warps=cfg[1],
                                                                 _kda_weights=False)))
                best_kda = min(kda, key=kda.get)
                row.update(replay_mixed_per_tile_decays_sweep=kda, replay_mixed_per_tile_decays_config=best_kda,
                           replay_mixed_per_tile_decays_us=kda[best_kda])
            if not per_key:  # the per-head pre-launch of decays and record weights, rows in mixed phases
                row["replay_mixed_gdn_weights_us"] = per_step_us(timer(inputs.fn(
                    k._replay_step, _block_v=bv, _num_warps=nw, _gdn_weights=True)))
            if args.diag:
                row["diag_replay_mixed_no_ticket_us"] = per_step_us(timer(inputs.fn(
                    k._replay_step, _block_v=bv, _num_warps=nw, _ticket=False)))
                row["diag_replay_phase_us"] = _phase_times(k, inputs, timer, L, (bv, nw))
                if row["replay_device_default_launch"] != "fused":  # the step callers get, one count at a time
                    row["diag_replay_phase_device_default_us"] = _phase_times(k, inputs, timer, L, None)
                    row["diag_replay_phase_device_default_flush_device_us"] = _phase_times(
                        k, inputs, timer, L, None, _flush_grid="device")
                other = not k.flush_uses_dot(per_key)
                row[f"diag_replay_mixed_flush_{'dot' if other else 'loop'}_us"] = per_step_us(timer(inputs.fn(
                    k._replay_step, _block_v=bv, _num_warps=nw, _flush_dot=other)))
            if args.read_format is not None:  # the read-copy kernels at their device-phase default launch
                dbv, dnw = k.replay_launch_config(batch, Hv, K, V, per_key, args.read_format, device_phase=True)
                row["replay_device_read_copy_config"] = _key((dbv, dnw))
                row.update(device_read_copy_times(k, inputs, timer, args.read_format, "mixed", per_step_us,
                                                   _block_v=dbv, _num_warps=dnw))
            del inputs
            # replay, all rows in phase
            inputs = ReplayInputs(batch, shape, per_key, L, device, gen, "in_phase", cuda)
            row["replay_in_phase_us"] = per_step_us(timer(inputs.fn(k._replay_step, _block_v=bv, _num_warps=nw)))
            row["replay_in_phase_split_us"] = per_step_us(timer(inputs.fn(k._replay_step, _block_v=bv, _num_warps=nw,
                                                                         _split=True)))
            row["replay_in_phase_device_default_us"] = per_step_us(timer(inputs.fn(k._replay_step)))
            for variant, (launch, _) in VARIANTS.items():
                row[f"replay_in_phase_{variant}_us"] = per_step_us(timer(inputs.fn(
                    k._replay_step, **{"_block_v": bv, "_num_warps": nw, **launch})))  # a variant's tile wins
            if per_key:
                kbv, knw = (int(x) for x in row["replay_mixed_per_tile_decays_config"].split("x"))
                row["replay_in_phase_per_tile_decays_us"] = per_step_us(timer(inputs.fn(
                    k._replay_step, _block_v=kbv, _num_warps=knw, _kda_weights=False)))
            # replay with the positions on the host (phase-specialised launches): their own default config (KDA's
            # differs from the device phase's) and sweep of the replay-only launches' tile, the flush launch at its
            # own default (host_flush_launch_config)
            host_cfg = k.replay_launch_config(batch, Hv, K, V, per_key)
            fbv, fnw, fdot = k.host_flush_launch_config(batch, Hv, K, V, per_key)
            row["host_flush_default_config"] = f"{fbv}x{fnw} {'dot' if fdot else 'loop'}"
            sweep = {}
            for cfg in dict.fromkeys([host_cfg, *[c for c in replay_sweep if c[0] <= max(16, V)]]):
                t = timer(inputs.host_fn(k._replay_step, _block_v=cfg[0], _num_warps=cfg[1], flush_launch={}))
                sweep[_key(cfg)] = dict(us=per_step_us(t), **t, **_compiled_info(k, "replay"))
            best_tile = min(sweep, key=lambda c: sweep[c]["us"])  # the best per-tile launch
            host_key = _key(host_cfg)
            walk_cfg = k.host_walk_launch_config(batch, K, V)
            if walk_cfg is not None:  # from HOST_WALK_MIN_BATCH rows the default launch walks the tiles
                walk = walk_cfg[2]
                host_key = f"{_key(walk_cfg[:2])}_walk_x{walk['programs_per_sm']}_s{walk['num_stages']}"
                t = timer(inputs.host_fn(k._replay_step, flush_launch={}))
                sweep[host_key] = dict(us=per_step_us(t), **t, **_compiled_info(k, "replay"))
            best_host = min(sweep, key=lambda c: sweep[c]["us"])
            row.update(replay_host_sweep=sweep, replay_host_default_config=host_key,
                       replay_host_best_config=best_host, replay_host_us=sweep[best_host]["us"],
                       replay_host_default_us=sweep[host_key]["us"], replay_host_best_tile_config=best_tile)
            if not per_key:  # the per-head pre-launch of decays and record weights (off by default for GDN)
                hbv, hnw = (int(x) for x in best_tile.split("x"))
                row["replay_host_gdn_weights_us"] = per_step_us(timer(inputs.host_fn(
                    k._replay_step, _block_v=hbv, _num_warps=hnw, _gdn_weights=True, flush_launch={})))
            if args.diag:  # single launches of the host-phase kernels: replay-only at count L/2, flush-only
                hbv, hnw = (int(x) for x in best_tile.split("x"))
                row["diag_host_phase_us"] = {
                    f"count{L // 2}": per_step_us(timer(inputs.host_fn(
                        k._replay_step, only=L // 2, _block_v=hbv, _num_warps=hnw))),
                    f"count{L - 1}_flush": per_step_us(timer(inputs.host_fn(k._replay_step, only=L - 1)))}
                # the host flush-only launch with each fold (the record sum as one product, or the loop), at the
                # host tile and at the device phase's
                for fold, dot in (("dot", True), ("loop", False)):
                    for tag, (fbv, fnw) in (("host_tile", (hbv, hnw)), ("device_tile", (bv, nw))):
                        row["diag_host_phase_us"][f"count{L - 1}_flush_{fold}_{tag}"] = per_step_us(timer(
                            inputs.host_fn(k._replay_step, only=L - 1, _block_v=fbv, _num_warps=fnw, _flush_dot=dot)))
                walks = {(min(wbv, max(16, 1 << (V - 1).bit_length())), *rest)
                         for wbv, *rest in parse_walks(args.walks, WALKS)}
                row["diag_host_walk_us"] = {
                    f"{wbv}x{wnw}_s{stages}_x{per_sm}": per_step_us(timer(inputs.host_fn(
                        k._replay_step, _block_v=wbv, _num_warps=wnw, flush_launch={},
                        _walk=dict(num_stages=stages, programs_per_sm=per_sm))))
                    for wbv, wnw, stages, per_sm in sorted(walks, reverse=True)}
            if args.read_format is not None:  # separated precision: replay launches read the low-precision copy
                inputs.add_read_copies(args.read_format)
                row["read_format"] = args.read_format
                # the read-copy default, the fp32 host-phase best, and with --read-copy-sweep the replay sweep
                read_default = _key(k.replay_launch_config(batch, Hv, K, V, per_key, args.read_format))
                read_sweep = {}
                candidates = [_key(c) for c in REPLAY_SWEEP if c[0] <= max(16, V)] if args.read_copy_sweep else []
                for key in dict.fromkeys([read_default, best_tile, *candidates]):
                    rbv, rnw = (int(x) for x in key.split("x"))
                    t = timer(inputs.host_fn(k._replay_step, read_format=args.read_format, _block_v=rbv,
                                             _num_warps=rnw, flush_launch={}))
                    read_sweep[key] = dict(us=per_step_us(t), **t, **_compiled_info(k, "replay_phase1"))
                best_read = min(read_sweep, key=lambda c: read_sweep[c]["us"])
                row.update(replay_host_read_copy_sweep=read_sweep, replay_host_read_copy_best_config=best_read,
                           replay_host_read_copy_us=read_sweep[best_read]["us"],
                           replay_host_read_copy_default_config=read_default,
                           replay_host_read_copy_default_us=read_sweep[read_default]["us"])
                rbv, rnw = (int(x) for x in best_read.split("x"))
                fmt = args.read_format  # the replay-only launches streaming the copy (_chunk_k)
                chunked = {}
                tile_v, tile_k = max(16, 1 << (V - 1).bit_length()), max(16, 1 << (K - 1).bit_length())
                for cbv, cnw, chunk in dict.fromkeys((min(cbv, tile_v), cnw, min(chunk, tile_k))
                                                     for cbv, cnw, chunk in READ_COPY_CHUNKS):
                    t = timer(inputs.host_fn(k._replay_step, read_format=fmt, _block_v=cbv, _num_warps=cnw,
                                             _chunk_k=chunk, flush_launch={}))
                    chunked[f"{cbv}x{cnw}_c{chunk}"] = dict(us=per_step_us(t), **t,
                                                            **_compiled_info(k, "replay_phase1"))
                best_chunked = min(chunked, key=lambda c: chunked[c]["us"])
                row.update(replay_host_read_copy_chunked=chunked, replay_host_read_copy_chunked_best=best_chunked,
                           replay_host_read_copy_chunked_us=chunked[best_chunked]["us"])
                cbv, cnw, chunk = (int(x) for x in best_chunked.replace("_c", "x").split("x"))
                # the callers' launch (streamed at serving batches) with the copy re-encoded after each flush
                row.update(host_reencode_times(k, inputs, timer, fmt, per_step_us, in_step=True))
                if not per_key:  # the best with the per-head weights pre-launch: one record-key pass per head
                    row["replay_host_read_copy_chunked_gdn_weights_us"] = per_step_us(timer(inputs.host_fn(
                        k._replay_step, read_format=fmt, _block_v=cbv, _num_warps=cnw, _chunk_k=chunk,
                        _gdn_weights=True, flush_launch={})))
                # one launch at a time: replay-only at count L/2 (whole tile, best chunked), the flush alone
                row["diag_host_read_copy_us"] = {
                    f"count{L // 2}_{best_read}": per_step_us(timer(inputs.host_fn(
                        k._replay_step, only=L // 2, read_format=fmt, _block_v=rbv, _num_warps=rnw))),
                    f"count{L // 2}_{best_chunked}": per_step_us(timer(inputs.host_fn(
                        k._replay_step, only=L // 2, read_format=fmt, _block_v=cbv, _num_warps=cnw,
                        _chunk_k=chunk))),
                    f"count{L - 1}_flush_exact_fold": per_step_us(timer(inputs.host_fn(
                        k._replay_step, only=L - 1, read_format=fmt))),
                    f"count{L - 1}_flush_exact_solve": per_step_us(timer(inputs.host_fn(
                        k._replay_step, only=L - 1, read_format=fmt, _exact_solve=not per_key)))}
                # (the solved fold on other tiles, run 131: [K, 64] x 8, [K, 32] x 4 / x 2, [K, 16] x 4 all slower
                # than its default [K, 64] x 4, itself slower than the stepped fold)
                # the cycle with the streamed replays and the solved exact fold (scalar gates)
                row["replay_host_read_copy_chunked_solve_us"] = per_step_us(timer(inputs.host_fn(
                    k._replay_step, read_format=fmt, _block_v=cbv, _num_warps=cnw, _chunk_k=chunk,
                    flush_launch=dict(_exact_solve=not per_key))))
                # the compiled path's step (device positions, re-encode after flushes) split, its replay launch
                # streaming the copy at that tile (which the split step's flush launch then takes too)
                split = device_read_copy_times(k, inputs, timer, fmt, "in_phase", per_step_us, compact=False,
                                               _block_v=cbv, _num_warps=cnw, _split=True, _chunk_k=chunk)
                row.update(suffixed(split, "split_chunked"))
                # ... with the split step's flush launch on a tile of its own (_flush_config): the fused launch's
                # two-warp tile, or the streamed replay's [K, 32] x 1
                dv = min(64, tile_v)
                row["replay_in_phase_read_copy_split_chunked_flush_tiles_us"] = {
                    f"{fbv}x{fnw}": per_step_us(timer(inputs.device_read_copy_fn(
                        k._replay_step, load_kernels("read_copy_encode").reencode_read_copy, fmt, _block_v=cbv,
                        _num_warps=cnw, _split=True, _chunk_k=chunk, _flush_config=(fbv, fnw))))
                    for fbv, fnw in dict.fromkeys(((dv, 2), (min(32, dv), 1)))}
                split = device_read_copy_times(k, inputs, timer, fmt, "in_phase", per_step_us, compact=False,
                                               _block_v=cbv, _num_warps=cnw, _split=True, _chunk_k=chunk,
                                               _exact_solve=not per_key)
                row.update(suffixed(split, "split_chunked_solve"))
                row.update(device_read_copy_times(k, inputs, timer, args.read_format, "in_phase", per_step_us,
                                                   _block_v=dbv, _num_warps=dnw))
                # two launches (flushing rows, then replaying rows) at the host-phase read-copy tile: the replay
                # launch is then the host-phase one plus the count (168 registers for fp8 at 32 x 2 on sm_90,
                # the fused launch 214)
                hbv, hnw = (int(x) for x in read_default.split("x"))
                split = device_read_copy_times(k, inputs, timer, args.read_format, "in_phase", per_step_us,
                                               compact=False, _block_v=hbv, _num_warps=hnw, _split=True)
                row.update(suffixed(split, "split"))
                if args.read_format == "nvfp4":  # the former load: a byte load per nibble
                    row["replay_host_read_copy_nvfp4_nibbles_us"] = per_step_us(timer(inputs.host_fn(
                        k._replay_step, read_format="nvfp4", _block_v=rbv, _num_warps=rnw, _nvfp4_pairs=False,
                        flush_launch={})))
                    row["replay_host_read_copy_nvfp4_nibbles_kernel"] = _compiled_info(k, "replay_phase1")
                    nibbles = device_read_copy_times(k, inputs, timer, "nvfp4", "in_phase", per_step_us,
                                                      compact=False, _block_v=rbv, _num_warps=rnw,
                                                      _nvfp4_pairs=False)
                    row.update(suffixed(nibbles, "nvfp4_nibbles"))
            del inputs
            # standard kernel, fla, torch
            inputs = StepInputs(batch, shape, per_key, L, device, gen, cuda)
            default_std = k.state_update_launch_config(batch, Hv, K, V, per_key)
            sweep = {}
            for cfg in dict.fromkeys([default_std, *[c for c in standard_sweep if c[0] <= max(8, V)]]):
                t = timer(inputs.kernel_fn(k._state_update, _block_v=cfg[0], _num_warps=cfg[1]))
                sweep[_key(cfg)] = dict(us=per_step_us(t), **t, **_compiled_info(k, "state_update"))
            best_std = min(sweep, key=lambda c: sweep[c]["us"])
            row.update(standard_default_config=_key(default_std), standard_best_config=best_std,
                       standard_sweep=sweep, standard_default_us=sweep[_key(default_std)]["us"],
                       standard_us=sweep[best_std]["us"])
            row["fla_us"] = per_step_us(timer(inputs.fla_fn(fla[2]))) if fla else None
            if not args.no_torch:
                row["torch_us"] = per_step_us(timer(inputs.torch_fn(torch_step)))
            del inputs
            if cuda:
                torch.cuda.empty_cache()
            arms_bytes = [("replay_mixed", "replay"), ("replay_in_phase", "replay"), ("replay_host", "replay"),
                          ("standard", "standard"), ("fla", "standard"), ("torch", "standard")]
            if args.read_format is not None:
                arms_bytes += [(f"replay_{arm}_read_copy", "replay_read_copy") for arm in ("host", "mixed", "in_phase")]
            for key, model in arms_bytes:
                if row.get(f"{key}_us"):
                    gbps = nbytes[model] / (row[f"{key}_us"] * 1e-6) / 1e9
                    row[f"{key}_GBps"] = gbps
                    row[f"{key}_frac_of_copy_bw"] = gbps / copy_bw
            row["ideal_replay_us_at_copy_bw"] = nbytes["replay"] / (copy_bw * 1e9) * 1e6
            row["ideal_standard_us_at_copy_bw"] = nbytes["standard"] / (copy_bw * 1e9) * 1e6
            row["ideal_speedup_bytes"] = nbytes["standard"] / nbytes["replay"]
            row["speedup_replay_vs_standard"] = row["standard_us"] / row["replay_mixed_us"]
            row["speedup_replay_vs_standard_default"] = row["standard_default_us"] / row["replay_mixed_default_us"]
            row["speedup_replay_in_phase_vs_standard"] = row["standard_us"] / row["replay_in_phase_us"]
            row["speedup_replay_host_vs_standard"] = row["standard_us"] / row["replay_host_us"]
            row["speedup_replay_host_vs_fla"] = row["fla_us"] / row["replay_host_us"] if row["fla_us"] else None
            row["speedup_standard_vs_fla"] = row["fla_us"] / row["standard_us"] if row["fla_us"] else None
            row["speedup_replay_vs_fla"] = row["fla_us"] / row["replay_mixed_us"] if row["fla_us"] else None
            if row.get("torch_us"):
                row["speedup_replay_vs_torch"] = row["torch_us"] / row["replay_mixed_us"]
            if args.read_format is not None:
                for arm in ("host", "mixed", "in_phase"):
                    row[f"speedup_replay_{arm}_read_copy_vs_standard"] = (row["standard_us"]
                                                                          / row[f"replay_{arm}_read_copy_us"])
            rows.append(row)
            _print_row(row, header=len(rows) == 1)
    return rows, checks, arms


def _fmt(x, width, prec=2):
    return f"{x:>{width}.{prec}f}" if x else f"{'-':>{width}}"


def _print_row(r, header):
    if header:
        print(f"\n{'shape':<14}{'batch':>6} | {'replay step (mixed)':>21} {'in-phase':>9} | {'standard':>20} "
              f"{'std dflt':>9} | {'fla':>15} | {'torch':>9} | {'x std':>6} {'x fla':>6} {'x torch':>7} "
              f"{'ideal':>6}")
        print(f"{'':<14}{'':>6} | {'us':>9} {'GB/s':>6} {'%cp':>4} {'us':>9} | {'us':>9} {'GB/s':>6} {'%cp':>4} "
              f"{'us':>9} | {'us':>9} {'%cp':>4} | {'us':>9} |")
    fla_pct = 100 * r["fla_frac_of_copy_bw"] if r.get("fla_us") else None
    print(f"{r['shape']:<14}{r['batch']:>6} | {r['replay_mixed_us']:>9.2f} {r['replay_mixed_GBps']:>6.0f} "
          f"{100 * r['replay_mixed_frac_of_copy_bw']:>3.0f}% {r['replay_in_phase_us']:>9.2f} | "
          f"{r['standard_us']:>9.2f} {r['standard_GBps']:>6.0f} {100 * r['standard_frac_of_copy_bw']:>3.0f}% "
          f"{r['standard_default_us']:>9.2f} | {_fmt(r['fla_us'], 9)} {_fmt(fla_pct, 3, 0)}% | "
          f"{_fmt(r.get('torch_us'), 9, 1)} | {r['speedup_replay_vs_standard']:>6.2f} "
          f"{_fmt(r['speedup_replay_vs_fla'], 6)} {_fmt(r.get('speedup_replay_vs_torch'), 7)} "
          f"{r['ideal_speedup_bytes']:>6.2f}   [replay {r['replay_best_config']}, std {r['standard_best_config']}]",
          flush=True)
    print(f"{'':<14}{'':>6} | host-phase replay {r['replay_host_us']:>9.2f} us "
          f"{100 * r['replay_host_frac_of_copy_bw']:>4.0f}% of copy BW, "
          f"x std {r['speedup_replay_host_vs_standard']:.2f}, x fla {_fmt(r['speedup_replay_host_vs_fla'], 5)} "
          f"[{r['replay_host_best_config']}, flush {r['host_flush_default_config']}]", flush=True)
    if r.get("replay_mixed_device_default_us"):
        m, i = r["replay_mixed_device_default_us"], r["replay_in_phase_device_default_us"]
        print(f"{'':<14}{'':>6} | device-phase default launch ({r['replay_device_default_launch']}): mixed {m:>9.2f} "
              f"us, in phase {i:>9.2f} us, x std {r['standard_us'] / m:.2f} / {r['standard_us'] / i:.2f}", flush=True)
    variants = [name for name in VARIANTS if r.get(f"replay_mixed_{name}_us")]
    if variants:  # the device-phase launch variants, rows in mixed phases / in phase
        cells = ", ".join(f"{name} {r[f'replay_mixed_{name}_us']:.2f} / {r[f'replay_in_phase_{name}_us']:.2f}"
                          for name in variants)
        print(f"{'':<14}{'':>6} | device-phase variants, mixed / in phase (us): {cells}", flush=True)
    if r.get("diag_host_walk_us"):
        walks = ", ".join(f"{key} {us:.2f}" for key, us in r["diag_host_walk_us"].items())
        print(f"{'':<14}{'':>6} | host-phase cycle, replay launches walking the tiles (_walk): {walks} us", flush=True)
    if r.get("replay_host_gdn_weights_us"):
        w, m = r["replay_host_gdn_weights_us"], r["replay_mixed_gdn_weights_us"]
        print(f"{'':<14}{'':>6} | host-phase replay with the per-head weights pre-launch (_gdn_weights): {w:>9.2f} us, "
              f"x std {r['standard_us'] / w:.2f} [{r['replay_host_best_tile_config']}]; "
              f"device phase, mixed {m:>9.2f} us, "
              f"x std {r['standard_us'] / m:.2f}", flush=True)
    if r.get("replay_mixed_per_tile_decays_us"):
        w = r["replay_mixed_per_tile_decays_us"]
        print(f"{'':<14}{'':>6} | decays per V tile (_kda_weights=False, the former default): mixed {w:>9.2f} us, "
              f"in phase {r['replay_in_phase_per_tile_decays_us']:>9.2f} us, x std {r['standard_us'] / w:.2f} "
              f"[{r['replay_mixed_per_tile_decays_config']}]", flush=True)
    print_read_copy_rows(r, 14)
    if r.get("replay_host_read_copy_chunked"):
        cells = ", ".join(f"{key} {v['us']:.2f}" for key, v in r["replay_host_read_copy_chunked"].items())
        best = r["replay_host_read_copy_chunked_us"]
        print(f"{'':<14}{'':>6} | host-phase cycle, replay launches streaming the {r['read_format']} copy (_chunk_k: "
              f"tile x warps "
              f"_c chunk): {cells} us; best x std {r['standard_us'] / best:.2f}", flush=True)
        cells = ", ".join(f"{key} {us:.2f}" for key, us in r["diag_host_read_copy_us"].items())
        print(f"{'':<14}{'':>6} | one launch at a time, {r['read_format']} copy: {cells} us", flush=True)
        if r.get("replay_host_read_copy_chunked_gdn_weights_us"):
            print(f"{'':<14}{'':>6} | the best streamed cycle with the per-head weights pre-launch (_gdn_weights): "
                  f"{r['replay_host_read_copy_chunked_gdn_weights_us']:.2f} us", flush=True)
        print(f"{'':<14}{'':>6} | device, in phase, two launches, the replay one streaming the copy "
              f"[{r['replay_host_read_copy_chunked_best']}]: {r['replay_in_phase_read_copy_split_chunked_us']:.2f} us "
              f"({r['replay_in_phase_read_copy_no_reencode_split_chunked_us']:.2f} us without the re-encode)",
              flush=True)
        cells = ", ".join(f"{key} {us:.2f}" for key, us in r["replay_in_phase_read_copy_split_chunked_flush_tiles_us"]
                          .items())
        print(f"{'':<14}{'':>6} | the same, its flush launch on a tile of its own (_flush_config): {cells} us",
              flush=True)
        print(f"{'':<14}{'':>6} | the same with the exact fold solved at once (_exact_solve; scalar gates): host cycle "
              f"{r['replay_host_read_copy_chunked_solve_us']:.2f} us, device in phase "
              f"{r['replay_in_phase_read_copy_split_chunked_solve_us']:.2f} us "
              f"({r['replay_in_phase_read_copy_no_reencode_split_chunked_solve_us']:.2f} us without the re-encode)",
              flush=True)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--family", choices=sorted(SHAPES), default="gdn")
    parser.add_argument("--shapes", default=None, help="comma-separated subset of "
                        + "; ".join(f"{f}: {','.join(s)}" for f, s in SHAPES.items()))
    parser.add_argument("--no-fla", action="store_true", help="skip the flash-linear-attention arm")
    parser.add_argument("--no-torch", action="store_true", help="skip the transformers torch arm")
    add_cycle_arguments(parser, BATCHES)
    args = parser.parse_args(argv)
    device, timer, copy_bw, info = cycle_environment(args, 2**30)
    with torch.inference_mode() if device.type == "cpu" else contextlib.nullcontext():
        rows, checks, arms = bench_family(args, device, timer, copy_bw)
    info.update(arms=arms, fla=arms["fla_version"])
    result = dict(info, checks=checks, results=rows)
    if rows:
        best = max(rows, key=lambda r: r["speedup_replay_vs_standard"])
        print(f"\nbest replay vs standard: {best['speedup_replay_vs_standard']:.2f}x ({best['shape']}, batch "
              f"{best['batch']}); byte-model ideal {best['ideal_speedup_bytes']:.2f}x")
        fla_rows = [r for r in rows if r["speedup_replay_vs_fla"]]
        if fla_rows:
            best = max(fla_rows, key=lambda r: r["speedup_replay_vs_fla"])
            print(f"best replay vs fla: {best['speedup_replay_vs_fla']:.2f}x ({best['shape']}, batch {best['batch']})")
    return finish_bench(args, result)


if __name__ == "__main__":
    main()
