"""Decode-step kernel benchmark: ReplaySSM replay step vs the standard step vs transformers' torch path.

    python -m hf_replayssm.kernels.bench --family mamba2 --out results.json          # installed package, GPU
    PYTHONPATH=. python kernels/bench.py --family mamba2 --out results.json          # from a checkout
    TRITON_INTERPRET=1 python -m hf_replayssm.kernels.bench --family mamba2 --smoke --out /tmp/smoke.json   # CPU

What is timed (per model shape and batch size; fp32 state/checkpoint, bf16 x/B/C/records, fp32 dt, D and dt_bias
given, softplus on, z absent as in transformers' Mamba-2 mixers):

* ``replay``: :func:`mamba2_replay_step` averaged over whole cycles of ``L`` (= buffer_len, default 16) launches,
  i.e. ``((L-1) replay + 1 flush) / L`` per row. Two phase layouts: ``mixed`` (row b's count starts at b mod L, so
  every launch has rows in every phase, ~1/L of them flushing) and ``in_phase`` (all rows share one count, so one
  launch in L is a full flush).
* ``standard``: :func:`mamba2_state_update` (read state, update, write back, output), with its default launch
  configuration (mamba_ssm's table) and the best of a sweep.
* ``torch``: transformers' pure-torch ``mamba2_selective_state_update`` (nemotron_h; ``__wrapped__`` so a hub or
  mamba_ssm kernel is never picked) called the way the Nemotron-H mixer calls it, or
  :func:`hf_replayssm.ops.mamba2.ssd_step_reference` when transformers lacks it.

Timing (GPU): one CUDA graph holds ``L`` consecutive steps; before each graph replay the L2 cache is flushed by
writing a 256 MB buffer, and the replay is timed with CUDA events (median of the repetitions, 20th/80th percentiles
also stored). Inputs rotate among enough copies (1, 2, 4, 8 or 16, dividing L) that consecutive steps never find
their state in the 50 MB L2 either. CUDA graphs remove the per-launch CPU overhead that would otherwise dominate at
small batch (a decode step runs under CUDA graphs in production too). Device-to-device copy bandwidth (1 GiB
``copy_``, read + write counted) is measured in the same run.

Bytes counted per step (per batch row): standard = 2|S| + io; replay = |S| (checkpoint read) + |S|/L (flush write,
amortised) + (L-1)/2 records read on average + (L-1)/L record appends + io, with |S| = H*P*N*4, a record =
H*P*2 (x) + H*4 (dt) + G*N*2 (B) and io = x, dt, B, C reads + y write. ``GB/s`` = these bytes / time (1 GB = 1e9 B).

Launch configurations: both Triton kernels are timed with their default configuration and with each
configuration of a small sweep (``REPLAY_SWEEP`` / ``STANDARD_SWEEP``; registers per thread are recorded); the
table's "replay" and "standard" columns are the best of each sweep, "std dflt" the standard kernel's default, and
the speedup columns compare best with best and default with default. ``--diag`` adds single-phase launch times
(every row at count 0, L/2, L-2, L-1) and a variant without the count update.

``--read-format fp8|nvfp4`` adds the separated-precision arm ``replay_host_read_copy``: the host-phase cycle whose
L - 1 replay-only launches read a low-precision read copy of the checkpoint (decoded in registers) and whose flush
reads and writes the fp32 checkpoint. The copy's refresh after the flush (an encode of the new checkpoint, done by
the caller) is not timed; its bytes model is ``(L-1)/L |S_lp| + 2|S|/L`` + records + io, |S_lp| the copy's bytes
(fp8: 1 B/element + a 4-byte scale per row; nvfp4: 0.5625 B/element + 4 B per sequence). The correctness check then
also compares one mixed-phase launch with the copy against the torch reference.

A quick correctness check on the device runs first (replay vs standard kernel over 2L+3 steps, and one mixed-phase
launch vs the torch reference); its errors go into the JSON.
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

MAMBA2_SHAPES = {  # name: (heads, head_dim, d_state, groups)
    "nemotron-h-8b": (128, 64, 128, 8),
    "nemotron-3-nano": (64, 64, 128, 8),
}
BATCHES = [1, 8, 32, 64, 128, 256, 512]
# Launch configurations swept: replay (block_p, num_warps, fold_unroll), standard (block_p, num_warps).
REPLAY_SWEEP = [(16, 2, 4), (16, 2, 1), (32, 2, 4), (32, 2, 1), (8, 2, 4), (16, 4, 4), (32, 4, 4), (64, 8, 4),
                (16, 1, 4), (32, 1, 4)]
STANDARD_SWEEP = [(4, 4), (8, 4), (16, 8), (32, 8), (64, 8)]
# --diag: the host-position cycle with its replay-only launches walking the tiles on a device-sized grid, loads
# pipelined (_walk): (block_p, num_warps, pipeline stages, programs per SM); --walks overrides. Run 116 (batch 256,
# per-tile cycle 349 us): [32] x 4 x 2 stages x 2 per SM 706, [32] x 2 x 3 x 2 612, [32] x 2 x 2 x 2 745, [16] x 2
# x 2 x 4 685: faster with every program per SM, so these try more (shared memory: stages x tile <= 228 KB per SM)
WALKS = [(32, 2, 2, 4), (32, 2, 2, 6), (16, 2, 2, 8), (16, 1, 2, 12)]
CONFIG_KEYS = ("block_p", "num_warps", "fold_unroll")


def _cfg_dict(cfg) -> dict:
    return cfg if isinstance(cfg, dict) else dict(zip(CONFIG_KEYS, cfg, strict=False))


def _cfg_name(cfg) -> str:
    c = _cfg_dict(cfg)
    return f"p{c['block_p']}w{c['num_warps']}" + (f"u{c['fold_unroll']}" if "fold_unroll" in c else "")


def _torch_step_fn():
    """(name, fn(state, x, dt, B, C, A, D, dt_bias)) for transformers' torch decode step."""
    try:
        from transformers.models.nemotron_h import modeling_nemotron_h

        ssu = modeling_nemotron_h.mamba2_selective_state_update
        ssu = getattr(ssu, "__wrapped__", ssu)

        def step(state, x, dt, B, C, A, D, dt_bias):
            head_dim, d_state = state.shape[-2:]
            return ssu(state, x, dt[..., None].expand(-1, -1, head_dim), A[:, None, None].expand(-1, head_dim, d_state),
                       B, C, D[:, None].expand(-1, head_dim), z=None, dt_bias=dt_bias[:, None].expand(-1, head_dim),
                       dt_softplus=True)

        return "transformers.nemotron_h.mamba2_selective_state_update (torch)", step
    except (ImportError, AttributeError):
        from hf_replayssm.ops.mamba2 import ssd_step_reference

        def step(state, x, dt, B, C, A, D, dt_bias):
            dtp = torch.nn.functional.softplus(dt.float() + dt_bias.float())
            y, new_state = ssd_step_reference(state, x[:, None], dtp[:, None], B[:, None], C[:, None], A, D)
            state.copy_(new_state)
            return y[:, 0].to(x.dtype)

        return "hf_replayssm.ops.mamba2.ssd_step_reference", step


# ---------------------------------------------------------------------------------------------------------------
# timing


def _phase_times(k, inputs: ReplayInputs, timer: Timer, L: int, cfg) -> dict:
    """Single-launch replay time with every row at one count (0, L/2, L-2: replay; L-1: flush), in us. Each timed
    graph resets ``count`` first (a tiny copy, timed alone and subtracted)."""
    c = inputs.copies[0]
    saved = {name: c[name].clone() for name in ("count",)}
    target = torch.empty_like(c["count"])
    reset_only = timer(lambda: c["count"].copy_(target))["ms"]
    out = {}
    for count in sorted({0, L // 2, max(L - 2, 0), L - 1}):
        target.fill_(count)

        def run():
            c["count"].copy_(target)
            k._replay_step(c["state"], c["ring_x"], c["ring_dt"], c["ring_B"], c["origin"], c["count"], c["x"],
                           c["dt"], c["B"], c["C"], inputs.params["A"], D=inputs.params["D"],
                           dt_bias=inputs.params["dt_bias"], dt_softplus=True, buffer_len=L, out=c["out"],
                           _config=_cfg_dict(cfg))

        out[f"count{count}{'_flush' if count == L - 1 else ''}"] = (timer(run)["ms"] - reset_only) * 1e3
    c["count"].copy_(saved["count"])
    return out


# ---------------------------------------------------------------------------------------------------------------
# inputs


def _tokens(batch, heads, head_dim, d_state, groups, device, gen):
    def rnd(*shape):
        return torch.randn(*shape, generator=gen, device=device)

    return dict(x=rnd(batch, heads, head_dim).bfloat16(), dt=rnd(batch, heads) - 1.0,
                B=rnd(batch, groups, d_state).bfloat16(), C=rnd(batch, groups, d_state).bfloat16(),
                out=torch.empty(batch, heads, head_dim, dtype=torch.bfloat16, device=device))


def _params(heads, device, gen):
    return dict(A=-torch.exp(torch.rand(heads, generator=gen, device=device)),
                D=torch.randn(heads, generator=gen, device=device),
                dt_bias=torch.randn(heads, generator=gen, device=device) * 0.5)


def _state_bytes(batch, heads, head_dim, d_state):
    return batch * heads * head_dim * d_state * 4


def _read_copy_bytes(batch, heads, head_dim, d_state, read_format):
    if read_format is None:
        return 0
    from hf_replayssm.precision.formats import get_format

    elements = batch * heads * head_dim * d_state
    extra = 4 * batch if read_format == "nvfp4" else 0  # the per-sequence scale
    return int(elements * get_format(read_format).bytes_per_element(d_state)) + extra


def _byte_model(batch, heads, head_dim, d_state, groups, L, read_format=None):
    S = _state_bytes(batch, heads, head_dim, d_state)
    S_lp = _read_copy_bytes(batch, heads, head_dim, d_state, read_format)
    record = batch * (heads * head_dim * 2 + heads * 4 + groups * d_state * 2)
    io = batch * (heads * head_dim * 2 + heads * 4 + 2 * groups * d_state * 2 + heads * head_dim * 2)
    return dict(
        state=S,
        record=record,
        io=io,
        standard=2 * S + io,
        replay=S * (1 + 1 / L) + record * ((L - 1) / 2 + (L - 1) / L) + io,
        replay_read_copy=S_lp * (L - 1) / L + 2 * S / L + record * ((L - 1) / 2 + (L - 1) / L) + io,
    )


class ReplayInputs:
    def __init__(self, batch, heads, head_dim, d_state, groups, L, device, gen, phase, cuda):
        R = max(L - 1, 1)
        per_copy = _state_bytes(batch, heads, head_dim, d_state)
        self.n = _num_copies(per_copy, L, cuda)
        self.L = L
        self.params = _params(heads, device, gen)
        self.copies = []
        rows = torch.arange(batch, device=device, dtype=torch.int32)
        for c in range(self.n):
            start = c * (L // self.n)
            count = (rows + start) % L if phase == "mixed" else torch.full_like(rows, start % L)
            self.copies.append(dict(
                state=torch.randn(batch, heads, head_dim, d_state, generator=gen, device=device) * 0.1,
                ring_x=torch.randn(batch, R, heads, head_dim, generator=gen, device=device).bfloat16(),
                ring_dt=torch.rand(batch, R, heads, generator=gen, device=device) * 0.1,
                ring_B=torch.randn(batch, R, groups, d_state, generator=gen, device=device).bfloat16(),
                origin=(rows % R).to(torch.int32),
                count=count.to(torch.int32).contiguous(),
                **_tokens(batch, heads, head_dim, d_state, groups, device, gen),
            ))

    def fn(self, step, per_copy=None, after=None, **launch):
        """L device-phase steps over the rotated copies; ``per_copy(c)``: extra arguments of each call, ``after(c)``:
        run after each call."""
        def run():
            for i in range(self.L):
                c = self.copies[i % self.n]
                step(c["state"], c["ring_x"], c["ring_dt"], c["ring_B"], c["origin"], c["count"], c["x"], c["dt"],
                     c["B"], c["C"], self.params["A"], D=self.params["D"], dt_bias=self.params["dt_bias"],
                     dt_softplus=True, buffer_len=self.L, out=c["out"], **launch, **(per_copy(c) if per_copy else {}))
                if after is not None:
                    after(c)

        return run

    def add_read_copies(self, read_format: str) -> None:
        """Give every copy a read copy of its checkpoint in ``read_format`` (the store's encoding)."""
        from hf_replayssm.precision.formats import get_format

        for c in self.copies:
            c["read_copy"] = get_format(read_format).encode(c["state"])

    # the separated policy's compiled step re-encodes the copy in the step (reencode_copy; see device_read_copy_fn)
    reencode_in_step = True

    def device_read_copy_fn(self, step, reencode, read_format: str, **launch):
        """The compiled decode step of the separated policy (``mamba2_replay_step_read_copy``): the device-phase
        launch reading the copy (a flushing row's output from the copy too) and the re-encode of the copy of the
        rows that flushed (``count`` 0 after the step): ``"step"`` by the step itself (``reencode_copy``: the op's
        way), a callable as a launch after it, None skipped."""
        in_step = reencode == "step"
        return self.fn(step, per_copy=lambda c: dict(read_copy=c["read_copy"], read_format=read_format,
                                                     flush_reads_copy=True, reencode_copy=in_step),
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
        the flush re-encodes it (``reencode_copy``: as the cache runs it). None: a plain flush, the copy not
        refreshed."""
        def run():
            for j in range(self.L):
                i = j if only is None else only
                c = self.copies[j % self.n]
                read = (dict(read_copy=c["read_copy"], read_format=read_format)
                        if read_format is not None and i + 1 < self.L else {})
                if reencode is not None and i + 1 == self.L:  # the cache's flush: outputs from the copy
                    read = dict(read_copy=c["read_copy"], read_format=read_format, flush_reads_copy=True,
                                reencode_copy=reencode == "step")
                overrides = flush_launch if flush_launch is not None and i == self.L - 1 else launch
                step(c["state"], c["ring_x"], c["ring_dt"], c["ring_B"], 0, i, c["x"], c["dt"],
                     c["B"], c["C"], self.params["A"], D=self.params["D"], dt_bias=self.params["dt_bias"],
                     dt_softplus=True, buffer_len=self.L, out=c["out"], **overrides, **read)
                if reencode is not None and reencode != "step" and i == self.L - 1:
                    reencode(c["state"], c["read_copy"], read_format, every_row)

        every_row = torch.ones(self.copies[0]["state"].shape[0], dtype=torch.bool,
                               device=self.copies[0]["state"].device)
        return run


class StepInputs:
    def __init__(self, batch, heads, head_dim, d_state, groups, L, device, gen, cuda):
        self.n = _num_copies(_state_bytes(batch, heads, head_dim, d_state), L, cuda)
        self.L = L
        self.params = _params(heads, device, gen)
        self.copies = [dict(state=torch.randn(batch, heads, head_dim, d_state, generator=gen, device=device) * 0.1,
                            **_tokens(batch, heads, head_dim, d_state, groups, device, gen)) for _ in range(self.n)]

    def kernel_fn(self, step, **launch):
        def run():
            for i in range(self.L):
                c = self.copies[i % self.n]
                step(c["state"], c["x"], c["dt"], c["B"], c["C"], self.params["A"], D=self.params["D"],
                     dt_bias=self.params["dt_bias"], dt_softplus=True, out=c["out"], **launch)

        return run

    def torch_fn(self, step):
        def run():
            for i in range(self.L):
                c = self.copies[i % self.n]
                step(c["state"], c["x"], c["dt"], c["B"], c["C"], self.params["A"], self.params["D"],
                     self.params["dt_bias"])

        return run


# ---------------------------------------------------------------------------------------------------------------
# correctness check on the device


# launch variants of the device-phase step timed by every run next to the default (split, tickets, physical ring
# slots) and checked against it on the device: bit for bit (count launch) or to 1e-5
VARIANTS = {
    "count_launch": (dict(_count_launch=True), True),
    "prefetch": (dict(_prefetch=True), True),
    "fused_count_launch": (dict(_split=False, _count_launch=True), False),
    "fused_count_launch_logical_ring": (dict(_split=False, _count_launch=True, _ring_physical=False), False),
    # the flush launch on a device-sized grid: the same checkpoint bits; y within 1e-5 (its own tile's reductions)
    "flush_device_grid": (dict(_flush_grid="device"), False),
    "flush_batch_grid": (dict(_flush_grid="batch"), False),  # the default past kernels.mamba2.DEVICE_GRID_MAX_BATCH
    # (run 116, batch 256, against the default 433 us mixed: the batch-grid flush on fold_tile_config's tile 436,
    # the device-grid flush on [8, 128] x 2 x 12 / [4, 128] x 1 x 24 per SM 495 / 525, the replay launch walking the
    # tiles at 2 programs per SM 956 / 846 (2 / 3 stages); run 109: the device-grid flush reading 16 records per round
    # trip 475 vs 476; all dropped from the list). The replay launch walking at 6 programs per SM, 2 stages (the
    # walks got faster with every program added per SM, run 116's diag; 16 KB per stage: 192 KB of shared memory)
    "walk_s2_x6": (dict(_count_launch=True, _walk=dict(num_stages=2, programs_per_sm=6)), False),
    # the split step's replay launch reading each (row, head)'s record coefficients from a pre-launch (_weights;
    # sm_90 compile-only on these inputs, batch 64 and 256: 96 registers against 128, records in logical order
    # instead of by slot; run 124: slower, 452.0 / 440.6 us against 434.9 / 417.0 at batch 256)
    "weights": (dict(_weights=True), False),
}


def check(k, heads, head_dim, d_state, groups, L, device, batch=4, read_format=None) -> dict:
    """Replay kernel vs standard kernel over 2L+3 in-phase steps (fp32 tokens), and one mixed-phase launch vs the
    torch reference (also with a read copy in ``read_format``). Returns max errors relative to the output / state
    scale."""
    gen = torch.Generator(device=device).manual_seed(0)
    R = max(L - 1, 1)
    p = _params(heads, device, gen)
    ckpt = torch.randn(batch, heads, head_dim, d_state, generator=gen, device=device)
    std = ckpt.clone()
    ring_x = torch.zeros(batch, R, heads, head_dim, device=device)
    ring_dt = torch.zeros(batch, R, heads, device=device)
    ring_B = torch.zeros(batch, R, groups, d_state, device=device)
    origin = torch.arange(batch, dtype=torch.int32, device=device) % R
    count = torch.zeros(batch, dtype=torch.int32, device=device)
    err_y = err_s = 0.0
    for t in range(2 * L + 3):
        tok = {kk: v.float() for kk, v in _tokens(batch, heads, head_dim, d_state, groups, device, gen).items()
               if kk != "out"}
        y = k.mamba2_replay_step(ckpt, ring_x, ring_dt, ring_B, origin, count, **tok, **p, dt_softplus=True,
                                 buffer_len=L)
        y_std = k.mamba2_state_update(std, **tok, **p, dt_softplus=True)
        err_y = max(err_y, ((y - y_std).abs().max() / y_std.abs().max().clamp_min(1)).item())
        if (t + 1) % L == 0:
            err_s = max(err_s, ((ckpt - std).abs().max() / std.abs().max().clamp_min(1)).item())
    counts_ok = count.tolist() == [(2 * L + 3) % L] * batch
    # one mixed-phase launch (counts 0..L-1 across rows) against the torch reference
    batch = max(L, 2)
    mix = ReplayInputs(batch, heads, head_dim, d_state, groups, L, device, gen, "mixed", cuda=False).copies[0]
    ref = {kk: v.clone() for kk, v in mix.items()}
    base = {kk: v.clone() for kk, v in mix.items()}
    args = ["state", "ring_x", "ring_dt", "ring_B", "origin", "count", "x", "dt", "B", "C"]
    y = k.mamba2_replay_step(*[mix[a] for a in args], **p, dt_softplus=True, buffer_len=L,
                             out=torch.empty(mix["x"].shape, device=device))
    variants = {}
    for name, (launch, bitwise) in VARIANTS.items():  # each launch variant against the default on the same inputs
        copy = {kk: v.clone() for kk, v in base.items()}
        y_var = k._replay_step(*[copy[a] for a in args], **p, dt_softplus=True, buffer_len=L,
                               out=torch.empty(copy["x"].shape, device=device), **launch)
        exact = ("ring_x", "ring_dt", "ring_B", "count") + (("state",) if bitwise else ())
        close = max(((y_var - y).abs().max() / y.abs().max().clamp_min(1)).item(),
                    ((copy["state"] - mix["state"]).abs().max() / mix["state"].abs().max()).item())
        variants[name] = bool(all(torch.equal(copy[a], mix[a]) for a in exact)
                              and (torch.equal(y_var, y) if bitwise else close < 1e-5))
    y_ref = k.mamba2_replay_step_ref(*[ref[a] for a in args], **p, dt_softplus=True, buffer_len=L,
                                     out=torch.empty(mix["x"].shape, device=device))
    mixed_y = ((y - y_ref).abs().max() / y_ref.abs().max().clamp_min(1)).item()
    mixed_state = ((mix["state"] - ref["state"]).abs().max() / ref["state"].abs().max()).item()
    mixed_ok = torch.equal(mix["count"], ref["count"]) and torch.equal(mix["ring_x"], ref["ring_x"])
    result = dict(seq_y_rel_err=err_y, seq_checkpoint_rel_err=err_s, seq_counts_ok=counts_ok,
                  mixed_y_rel_err=mixed_y, mixed_state_rel_err=mixed_state, mixed_counts_and_records_ok=mixed_ok,
                  variants_equal_default=variants,
                  ok=bool(err_y < 1e-4 and err_s < 1e-5 and counts_ok and mixed_y < 1e-4 and mixed_state < 1e-5
                          and mixed_ok and all(variants.values())))
    if read_format is not None:  # one mixed-phase launch reading a read copy, against the torch reference
        mix = ReplayInputs(batch, heads, head_dim, d_state, groups, L, device, gen, "mixed", cuda=False)
        mix.add_read_copies(read_format)
        mix = mix.copies[0]
        ref = {kk: v.clone() for kk, v in mix.items() if kk != "read_copy"}
        pre = {kk: v.clone() for kk, v in mix.items() if kk != "read_copy"}
        read = dict(read_copy=mix.pop("read_copy"), read_format=read_format)
        y = k.mamba2_replay_step(*[mix[a] for a in args], **p, dt_softplus=True, buffer_len=L,
                                 out=torch.empty(mix["x"].shape, device=device), **read)
        y_ref = k.mamba2_replay_step_ref(*[ref[a] for a in args], **p, dt_softplus=True, buffer_len=L,
                                         out=torch.empty(mix["x"].shape, device=device), **read)
        err = ((y - y_ref).abs().max() / y_ref.abs().max().clamp_min(1)).item()
        same = torch.equal(mix["count"], ref["count"]) and torch.equal(mix["ring_x"], ref["ring_x"])
        result.update(read_copy_format=read_format, read_copy_mixed_y_rel_err=err, read_copy_mixed_ok=same,
                      ok=bool(result["ok"] and err < 1e-4 and same))
        if read_format == "nvfp4":  # the per-nibble load: the same values, so the same step
            y_nibbles = k._replay_step(*[pre[a] for a in args], **p, dt_softplus=True, buffer_len=L,
                                     out=torch.empty(mix["x"].shape, device=device), _nvfp4_pairs=False, **read)
            err = ((y_nibbles - y).abs().max() / y.abs().max().clamp_min(1)).item()
            result.update(read_copy_nvfp4_nibbles_rel_err=err, ok=bool(result["ok"] and err < 1e-6))
    return result


# ---------------------------------------------------------------------------------------------------------------
# main


def bench_mamba2(args, device, timer, copy_bw) -> tuple[list[dict], dict]:
    k = load_kernels("mamba2")
    torch_name, torch_step = _torch_step_fn()
    cuda = device.type == "cuda"
    shapes = {"smoke": (2, 16, 16, 1)} if args.smoke else MAMBA2_SHAPES
    if args.shapes:
        shapes = {name: shapes[name] for name in args.shapes.split(",")}
    batches = [int(b) for b in args.batches.split(",")] if args.batches else ([2] if args.smoke else BATCHES)
    L = args.buffer_len
    replay_sweep = [(8, 4, 1)] if args.smoke else REPLAY_SWEEP
    standard_sweep = [] if args.smoke else STANDARD_SWEEP
    if args.no_sweep:
        replay_sweep = standard_sweep = []
    checks, rows = {}, []
    for name, (heads, head_dim, d_state, groups) in shapes.items():
        if not args.no_check:
            checks[name] = check(k, heads, head_dim, d_state, groups, L, device, batch=2 if args.smoke else 4,
                                 read_format=args.read_format)
            print(f"check {name}: {checks[name]}", flush=True)
        for batch in batches:
            gen = torch.Generator(device=device).manual_seed(batch)
            nbytes = _byte_model(batch, heads, head_dim, d_state, groups, L, args.read_format)
            row = dict(shape=name, heads=heads, head_dim=head_dim, d_state=d_state, groups=groups, batch=batch,
                       buffer_len=L, bytes_per_step=nbytes)

            def per_step_us(t):
                return t["ms"] * 1e3 / L

            # replay, mixed phases: default config and sweep
            inputs = ReplayInputs(batch, heads, head_dim, d_state, groups, L, device, gen, "mixed", cuda)
            # the split step's replay-launch tile (device positions, the fp32 checkpoint); host positions and read
            # copies take their own defaults (replay_launch_config)
            default_cfg = tuple(k.replay_launch_config(batch, heads, head_dim, d_state, device_phase=True)[key]
                                for key in CONFIG_KEYS)
            host_default_cfg = tuple(k.replay_launch_config(batch, heads, head_dim, d_state)[key]
                                     for key in CONFIG_KEYS)
            if args.read_format is not None:  # the split step reading a copy: its replay launch at the format's
                # default, its flush launch at the fp32 tile (what the defaults give; explicit for the sweeps)
                read_device = dict(
                    _config=k.replay_launch_config(batch, heads, head_dim, d_state, args.read_format, True),
                    _flush_config=_cfg_dict(default_cfg))
            sweep, configs = {}, {}
            for cfg in dict.fromkeys([default_cfg, *replay_sweep]):
                t = timer(inputs.fn(k._replay_step, _config=_cfg_dict(cfg)))
                sweep[_cfg_name(cfg)] = dict(us=per_step_us(t), **t, **_compiled_info(k, "replay"))
                configs[_cfg_name(cfg)] = cfg
            best_cfg = min(sweep, key=lambda c: sweep[c]["us"])
            default_key = _cfg_name(default_cfg)
            best = _cfg_dict(configs[best_cfg])
            row.update(replay_copies=inputs.n, replay_default_config=default_key, replay_best_config=best_cfg,
                       replay_sweep=sweep, replay_mixed_default_us=sweep[default_key]["us"],
                       replay_mixed_us=sweep[best_cfg]["us"])
            # the same step as one fused launch carrying both phases' code (the layout before the split)
            row["replay_mixed_fused_us"] = per_step_us(timer(inputs.fn(k._replay_step, _config=best, _split=False)))
            for variant, (launch, _) in VARIANTS.items():
                row[f"replay_mixed_{variant}_us"] = per_step_us(timer(inputs.fn(
                    k._replay_step, _config=best, **launch)))
            if args.diag:
                row["diag_replay_mixed_no_ticket_us"] = per_step_us(timer(inputs.fn(
                    k._replay_step, _config=best, _ticket=False)))
                row["diag_replay_phase_us"] = _phase_times(k, inputs, timer, L, best)
            if args.read_format is not None:
                row.update(device_read_copy_times(k, inputs, timer, args.read_format, "mixed", per_step_us,
                                                   **read_device))
                # a flushing row's output and fold in one flush launch (_flush_outputs_launch=False; the default
                # gives its output by the split step's replay launch and folds by a plain flush launch)
                row["replay_mixed_read_copy_one_flush_launch_us"] = per_step_us(timer(inputs.device_read_copy_fn(
                    k._replay_step, "step", args.read_format, **read_device, _flush_outputs_launch=False)))
            del inputs
            # replay, all rows in phase
            inputs = ReplayInputs(batch, heads, head_dim, d_state, groups, L, device, gen, "in_phase", cuda)
            row["replay_in_phase_us"] = per_step_us(timer(inputs.fn(k._replay_step, _config=best)))
            row["replay_in_phase_fused_us"] = per_step_us(timer(inputs.fn(k._replay_step, _config=best, _split=False)))
            for variant, (launch, _) in VARIANTS.items():
                row[f"replay_in_phase_{variant}_us"] = per_step_us(timer(inputs.fn(
                    k._replay_step, _config=best, **launch)))
            row["replay_in_phase_default_us"] = (
                per_step_us(timer(inputs.fn(k.mamba2_replay_step))) if best_cfg != default_key
                else row["replay_in_phase_us"])
            # replay with the positions on the host (phase-specialised launches): default config and sweep of the
            # replay-only launches' tile, the flush launch at its own default (host_flush_launch_config)
            flush_cfg = k.host_flush_launch_config(batch, heads, head_dim, d_state)
            row["host_flush_default_config"] = f"p{flush_cfg['block_p']}w{flush_cfg['num_warps']}"
            sweep = {}
            for cfg in dict.fromkeys([host_default_cfg, *replay_sweep]):
                t = timer(inputs.host_fn(k._replay_step, _config=_cfg_dict(cfg), flush_launch={}))
                sweep[_cfg_name(cfg)] = dict(us=per_step_us(t), **t, **_compiled_info(k, "replay"))
                configs[_cfg_name(cfg)] = cfg
            best_host = min(sweep, key=lambda c: sweep[c]["us"])
            best_host_cfg = configs[best_host]
            row.update(replay_host_sweep=sweep, replay_host_best_config=best_host,
                       replay_host_us=sweep[best_host]["us"],
                       replay_host_default_us=sweep[_cfg_name(host_default_cfg)]["us"])
            # the record coefficients once per (row, head) by a pre-launch (_weights), at the best host tile
            row["replay_host_weights_us"] = per_step_us(timer(inputs.host_fn(
                k._replay_step, _config=_cfg_dict(best_host_cfg), flush_launch={}, _weights=True)))
            if args.diag:  # single launches of the host-phase kernels: replay-only at count L/2, flush-only
                cfg = _cfg_dict(best_host_cfg)
                row["diag_host_phase_us"] = {
                    f"count{L // 2}": per_step_us(timer(inputs.host_fn(k._replay_step, only=L // 2, _config=cfg))),
                    f"count{L - 1}_flush": per_step_us(timer(inputs.host_fn(k._replay_step, only=L - 1))),
                    f"count{L - 1}_flush_replay_tile": per_step_us(timer(inputs.host_fn(
                        k._replay_step, only=L - 1, _config=cfg)))}
                walks = {(min(bp, 1 << (head_dim - 1).bit_length()), *rest)
                         for bp, *rest in parse_walks(args.walks, WALKS)}
                row["diag_host_walk_us"] = {
                    f"p{bp}w{nw}_s{stages}_x{per_sm}": per_step_us(timer(inputs.host_fn(
                        k._replay_step, _config=dict(block_p=bp, num_warps=nw), flush_launch={},
                        _walk=dict(num_stages=stages, programs_per_sm=per_sm))))
                    for bp, nw, stages, per_sm in sorted(walks, reverse=True)}
            if args.read_format is not None:  # separated precision: replay launches read the low-precision copy
                inputs.add_read_copies(args.read_format)
                row["read_format"] = args.read_format
                read_sweep, read_cfgs = {}, {}  # the format's default tile, and with --read-copy-sweep the sweep
                read_default = tuple(read_device["_config"][key] for key in CONFIG_KEYS)
                for cfg in dict.fromkeys([read_default, *(REPLAY_SWEEP if args.read_copy_sweep else [])]):
                    t = timer(inputs.host_fn(k._replay_step, read_format=args.read_format, _config=_cfg_dict(cfg),
                                             flush_launch={}))
                    read_sweep[_cfg_name(cfg)] = dict(us=per_step_us(t), **t, **_compiled_info(k, "replay_phase1"))
                    read_cfgs[_cfg_name(cfg)] = cfg
                best_read = min(read_sweep, key=lambda c: read_sweep[c]["us"])
                row.update(replay_host_read_copy_sweep=read_sweep, replay_host_read_copy_best_config=best_read,
                           replay_host_read_copy_us=read_sweep[best_read]["us"])
                read_cfg = _cfg_dict(read_cfgs[best_read])
                read_device["_config"] = read_cfg
                row.update(host_reencode_times(k, inputs, timer, args.read_format, per_step_us, in_step=True,
                                               _config=read_cfg, flush_launch={}))
                row.update(device_read_copy_times(k, inputs, timer, args.read_format, "in_phase", per_step_us,
                                                   **read_device))
                # a flushing row's output and fold in one flush launch (_flush_outputs_launch=False, before run 179),
                # taking the copy's product with C as stored (run 177) or decoding the whole copy tile (before)
                one = {"_flush_outputs_launch": False}
                decoded = {**one, "_flush_copy_product": False}
                for arm, options in (("one_flush_launch", one), ("flush_decoded", decoded)):
                    row[f"replay_host_read_copy_{arm}_us"] = per_step_us(timer(inputs.host_fn(
                        k._replay_step, read_format=args.read_format, reencode="step", _config=read_cfg,
                        flush_launch=options)))
                    row[f"replay_in_phase_read_copy_{arm}_us"] = per_step_us(timer(inputs.device_read_copy_fn(
                        k._replay_step, "step", args.read_format, **read_device, **options)))
                if args.read_format == "fp8":  # the plain flush writing the fp8 copy from its registers
                    row["replay_host_read_copy_encode_in_flush_us"] = per_step_us(timer(inputs.host_fn(
                        k._replay_step, read_format="fp8", reencode="step", _config=read_cfg,
                        flush_launch={"_encode_in_flush": True})))
                # the former default: one fused launch carrying both the replay and the flush code
                fused = device_read_copy_times(k, inputs, timer, args.read_format, "in_phase", per_step_us,
                                               compact=False, _config=_cfg_dict(default_cfg), _split=False)
                row.update(suffixed(fused, "fused"))
                if args.read_format == "nvfp4":  # the former load: a byte load per nibble
                    row["replay_host_read_copy_nvfp4_nibbles_us"] = per_step_us(timer(inputs.host_fn(
                        k._replay_step, read_format="nvfp4", _config=read_cfg, _nvfp4_pairs=False,
                        flush_launch={})))
                    row["replay_host_read_copy_nvfp4_nibbles_kernel"] = _compiled_info(k, "replay_phase1")
                    nibbles = device_read_copy_times(k, inputs, timer, "nvfp4", "in_phase", per_step_us,
                                                      compact=False, **read_device, _nvfp4_pairs=False)
                    row.update(suffixed(nibbles, "nvfp4_nibbles"))
            del inputs
            # standard kernel
            inputs = StepInputs(batch, heads, head_dim, d_state, groups, L, device, gen, cuda)
            default_std = tuple(k.state_update_launch_config(batch, heads, head_dim, d_state)[key]
                                for key in CONFIG_KEYS[:2])
            sweep = {}
            for cfg in dict.fromkeys([default_std, *standard_sweep]):
                t = timer(inputs.kernel_fn(k._state_update, _config=_cfg_dict(cfg)))
                sweep[_cfg_name(cfg)] = dict(us=per_step_us(t), **t, **_compiled_info(k, "state_update"))
            best_std = min(sweep, key=lambda c: sweep[c]["us"])
            row.update(standard_default_config=_cfg_name(default_std), standard_best_config=best_std,
                       standard_sweep=sweep, standard_default_us=sweep[_cfg_name(default_std)]["us"],
                       standard_us=sweep[best_std]["us"])
            # transformers' torch path
            row["torch_path"] = torch_name
            row["torch_us"] = per_step_us(timer(inputs.torch_fn(torch_step)))
            del inputs
            if cuda:
                torch.cuda.empty_cache()
            arms = [("replay_mixed", "replay"), ("replay_in_phase", "replay"), ("replay_host", "replay"),
                    ("standard", "standard"), ("torch", "standard")]
            if args.read_format is not None:
                arms += [(f"replay_{arm}_read_copy", "replay_read_copy") for arm in ("host", "mixed", "in_phase")]
            for key, model in arms:
                gbps = nbytes[model] / (row[f"{key}_us"] * 1e-6) / 1e9
                row[f"{key}_GBps"] = gbps
                row[f"{key}_frac_of_copy_bw"] = gbps / copy_bw
            row["ideal_replay_us_at_copy_bw"] = nbytes["replay"] / (copy_bw * 1e9) * 1e6
            row["ideal_standard_us_at_copy_bw"] = nbytes["standard"] / (copy_bw * 1e9) * 1e6
            row["speedup_replay_vs_standard"] = row["standard_us"] / row["replay_mixed_us"]
            row["speedup_replay_vs_standard_default"] = row["standard_default_us"] / row["replay_mixed_default_us"]
            row["speedup_replay_in_phase_vs_standard"] = row["standard_us"] / row["replay_in_phase_us"]
            row["speedup_replay_vs_torch"] = row["torch_us"] / row["replay_mixed_us"]
            row["speedup_replay_host_vs_standard"] = row["standard_us"] / row["replay_host_us"]
            if args.read_format is not None:
                for arm in ("host", "mixed", "in_phase"):
                    row[f"speedup_replay_{arm}_read_copy_vs_standard"] = (row["standard_us"]
                                                                          / row[f"replay_{arm}_read_copy_us"])
            rows.append(row)
            _print_row(row, header=len(rows) == 1)
    return rows, checks


def _print_row(r, header):
    if header:
        print(f"\n{'shape':<16}{'batch':>6} | {'replay step (mixed)':>22} {'in-phase':>9} | "
              f"{'standard':>20} {'std dflt':>9} | {'torch':>9} | {'x std':>6} {'x std dflt':>10} {'x torch':>8}")
        print(f"{'':<16}{'':>6} | {'us':>9} {'GB/s':>6} {'%cp':>5} {'us':>9} | {'us':>9} {'GB/s':>6} {'%cp':>4} "
              f"{'us':>9} | {'us':>9} |")
    print(f"{r['shape']:<16}{r['batch']:>6} | {r['replay_mixed_us']:>9.2f} {r['replay_mixed_GBps']:>6.0f} "
          f"{100 * r['replay_mixed_frac_of_copy_bw']:>4.0f}% {r['replay_in_phase_us']:>9.2f} | "
          f"{r['standard_us']:>9.2f} {r['standard_GBps']:>6.0f} {100 * r['standard_frac_of_copy_bw']:>3.0f}% "
          f"{r['standard_default_us']:>9.2f} | {r['torch_us']:>9.1f} | {r['speedup_replay_vs_standard']:>6.2f} "
          f"{r['speedup_replay_vs_standard_default']:>10.2f} {r['speedup_replay_vs_torch']:>8.2f}   "
          f"[replay {r['replay_best_config']}, std {r['standard_best_config']}]", flush=True)
    print(f"{'':<16}{'':>6} | host-phase replay {r['replay_host_us']:>9.2f} us "
          f"{100 * r['replay_host_frac_of_copy_bw']:>4.0f}% of copy BW, "
          f"x std {r['speedup_replay_host_vs_standard']:.2f} "
          f"[{r['replay_host_best_config']}, flush {r['host_flush_default_config']}]", flush=True)
    if r.get("diag_host_walk_us"):
        walks = ", ".join(f"{key} {us:.2f}" for key, us in r["diag_host_walk_us"].items())
        print(f"{'':<16}{'':>6} | host-phase cycle, replay launches walking the tiles (_walk): {walks} us", flush=True)
    if r.get("replay_host_weights_us"):
        w = r["replay_host_weights_us"]
        print(f"{'':<16}{'':>6} | with the record coefficients from a pre-launch (_weights): host phase {w:>9.2f} us, "
              f"x std {r['standard_us'] / w:.2f}; device phase, mixed {r['replay_mixed_weights_us']:>9.2f} us, "
              f"in phase {r['replay_in_phase_weights_us']:>9.2f}", flush=True)
    print_read_copy_rows(r, 16)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--family", choices=["mamba2"], default="mamba2")
    parser.add_argument("--shapes", default=None, help=f"comma-separated subset of {','.join(MAMBA2_SHAPES)}")
    add_cycle_arguments(parser, BATCHES)
    args = parser.parse_args(argv)
    device, timer, copy_bw, info = cycle_environment(args, 2**31)
    with torch.inference_mode() if device.type == "cpu" else contextlib.nullcontext():
        rows, checks = bench_mamba2(args, device, timer, copy_bw)
    result = dict(info, checks=checks, results=rows)
    if rows:
        best = max(rows, key=lambda r: r["speedup_replay_vs_standard"])
        print(f"\nbest replay vs standard: {best['speedup_replay_vs_standard']:.2f}x ({best['shape']}, batch "
              f"{best['batch']}); state-only ideal 2L/(L+1) = {2 * args.buffer_len / (args.buffer_len + 1):.2f}x")
    return finish_bench(args, result)


if __name__ == "__main__":
    main()
