"""Triton gated delta rule decode-step kernels (``hf_replayssm.kernels.delta_rule``) against their torch references.

Runs without a GPU: every check runs in a subprocess (this file executed as a script) with ``TRITON_INTERPRET=1``
set before triton is imported, on CPU tensors, so an out-of-bounds access (which segfaults the interpreter) fails
one test instead of killing pytest. On a CUDA machine the same checks can be run on the GPU with
``REPLAYSSM_KERNEL_TEST_DEVICE=cuda``. Skipped when triton is not installed. Shapes are tiny (the interpreter runs
each program in numpy): batch <= 6, 4 value heads, dims 16-32.
"""

from __future__ import annotations

import itertools
import sys

import pytest
from kernel_harness import HAS_TRITON, RecordedKernel, run_bench_smoke, run_case, worker_main
from kernel_harness import assert_close as _close

CASES = ["replay_mixed_gdn_bf16", "replay_launch_variants", "replay_mixed_kda", "replay_options", "state_update",
         "sequence_gdn", "sequence_kda", "buffer_len_one", "host_phase", "kda_weights", "kda_newest_first",
         "gdn_weights",
         "chunked_checkpoint", "flush_device_grid", "replay_walk", "replay_walk_split", "host_walk_default",
         "device_walk_default"]


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
@pytest.mark.parametrize("case", CASES)
def test_kernel_matches_reference(case):
    run_case(__file__, case)


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
@pytest.mark.parametrize("family", ["gdn", "kda"])
def test_bench_smoke(tmp_path, family):
    # the separated-precision arms: nvfp4 on one family, fp8 (its streamed replay too) with the --diag arms on the other
    extra = ["--read-format", "nvfp4"] if family == "gdn" else ["--diag", "--read-format", "fp8"]
    read = extra[-1]
    # one row timed: every arm still runs (the interpreter's time goes per program); the bench's correctness check
    # keeps its own batches of 2 and 4 rows in mixed phases
    data, stdout = run_bench_smoke("bench_delta", ["--family", family, "--batches", "1", *extra],
                                   tmp_path / "bench.json")
    assert data["results"], data
    row = data["results"][0]
    keys = ["replay_mixed_us", "replay_in_phase_us", "standard_us", "torch_us", "speedup_replay_vs_standard",
            "replay_mixed_device_default_us", "replay_in_phase_device_default_us"]
    if read:
        keys += [f"replay_{arm}_read_copy_us" for arm in ("host", "mixed", "in_phase")]
        keys += ["replay_in_phase_read_copy_no_reencode_us", "speedup_replay_mixed_read_copy_vs_standard",
                 "replay_mixed_read_copy_per_tile_reencode_us", "replay_in_phase_read_copy_per_tile_reencode_us",
                 "replay_in_phase_read_copy_split_us", "replay_host_read_copy_reencode_us",
                 "replay_host_read_copy_external_reencode_us", "replay_host_read_copy_external_per_tile_reencode_us",
                 "replay_in_phase_read_copy_external_reencode_us"]
    if read == "nvfp4":
        keys += ["replay_host_read_copy_nvfp4_nibbles_us", "replay_in_phase_read_copy_nvfp4_nibbles_us"]
    if read == "fp8":  # the replay-only launches streaming the copy (_chunk_k): the host cycle, single launches, split
        keys += ["replay_host_read_copy_chunked_us", "replay_in_phase_read_copy_split_chunked_us",
                 "replay_in_phase_read_copy_no_reencode_split_chunked_us", "replay_host_read_copy_chunked_solve_us",
                 "replay_in_phase_read_copy_split_chunked_solve_us"]
        assert row["replay_host_read_copy_chunked"] and all(
            v["us"] > 0 for v in row["replay_host_read_copy_chunked"].values()), row
        assert len(row["diag_host_read_copy_us"]) == 4 and all(us > 0 for us in row["diag_host_read_copy_us"].values())
        assert "replay launches streaming the fp8 copy (_chunk_k" in stdout
        tiles = row["replay_in_phase_read_copy_split_chunked_flush_tiles_us"]
        assert tiles and all(us > 0 for us in tiles.values()), tiles
        assert "its flush launch on a tile of its own (_flush_config)" in stdout
    if family == "gdn":  # the per-head weights pre-launch (off by default for scalar gates), timed
        keys += ["replay_host_gdn_weights_us", "replay_mixed_gdn_weights_us"]
        assert "weights pre-launch (_gdn_weights)" in stdout
    if family == "kda":  # the former per-V-tile decays, timed and checked against the default; the diag arms
        keys += ["replay_mixed_per_tile_decays_us", "replay_in_phase_per_tile_decays_us"]
        L = row["buffer_len"]
        host = row["diag_host_phase_us"]
        assert all(host[f"count{L - 1}_flush{form}"] > 0 for form in ("", "_dot_host_tile", "_dot_device_tile",
                                                                         "_loop_host_tile", "_loop_device_tile")), host
        assert row["diag_host_walk_us"] and all(us > 0 for us in row["diag_host_walk_us"].values()), row
        assert "replay launches walking the tiles (_walk)" in stdout
        assert all(check["variants_equal_default"]["per_tile_decays"] for check in data["checks"].values())
        assert "decays per V tile" in stdout
    for key in keys:
        assert row[key] > 0, (key, row)
    # the host-position arm starts from the host-position launch default (KDA's differs from the device phase's)
    from hf_replayssm.kernels.delta_rule import replay_launch_config

    host_default = replay_launch_config(row["batch"], row["value_heads"], row["key_dim"], row["value_dim"],
                                        family == "kda")
    assert row["replay_host_default_config"] == "x".join(map(str, host_default)), row
    # the host-phase flush launch runs at its own default: KDA's loop fold at the device phase's tile
    from hf_replayssm.kernels.delta_rule import host_flush_launch_config

    flush_v, flush_warps, flush_dot = host_flush_launch_config(row["batch"], row["value_heads"], row["key_dim"],
                                                               row["value_dim"], family == "kda")
    assert flush_dot == (family == "gdn"), (family, flush_dot)
    assert row["host_flush_default_config"] == f"{flush_v}x{flush_warps} {'dot' if flush_dot else 'loop'}", row
    assert f"flush {row['host_flush_default_config']}" in stdout
    assert all(check["ok"] for check in data["checks"].values()), data["checks"]
    if read == "nvfp4":
        assert data["checks"]["smoke"]["read_copy_nvfp4_nibbles_rel_err"] < 1e-6, data["checks"]
    assert row["replay_device_default_launch"] == "fused", row  # the smoke's few rows: below DEVICE_WALK_MIN_BATCH
    assert "device-phase default launch (fused)" in stdout
    assert "device-phase variants, mixed / in phase (us): tickets " in stdout
    assert all(row[f"replay_{arm}_split_walk_32x1_x8_compact_us"] > 0 for arm in ("mixed", "in_phase")), row
    assert "replay step" in stdout  # the printed table
    assert f"device, in phase replay reading a {read} copy" in stdout


# ---------------------------------------------------------------------------------------------------------------
# worker side (runs in the subprocess)


def _make(device, dtype, batch, key_heads, value_heads, key_dim, value_dim, ring, *, per_key, seed=0):
    """Random step inputs and a random ring (keys raw, gates log decays in [-0.6, -0.02])."""
    import torch

    gen = torch.Generator().manual_seed(seed)

    def rnd(*shape, scale=1.0):
        return torch.randn(*shape, generator=gen) * scale

    def gate(*shape):
        return -(torch.rand(*shape, generator=gen) * 0.58 + 0.02)

    gshape = (value_heads, key_dim) if per_key else (value_heads,)
    p = dict(
        state=rnd(batch, value_heads, key_dim, value_dim) * 0.5,
        ring_k=rnd(batch, ring, key_heads, key_dim).to(dtype),
        ring_d=rnd(batch, ring, value_heads, value_dim) * 0.3,
        ring_g=gate(batch, ring, *gshape),
        q=rnd(batch, key_heads, key_dim).to(dtype),
        k=rnd(batch, key_heads, key_dim).to(dtype),
        v=rnd(batch, value_heads, value_dim).to(dtype),
        beta=torch.rand(batch, value_heads, generator=gen) * 0.9 + 0.05,
        g=gate(batch, *gshape),
    )
    return {name: t.to(device) for name, t in p.items()}


def _clone(p):
    return {k: (v.clone() if hasattr(v, "clone") else v) for k, v in p.items()}


RING = ("state", "ring_k", "ring_d", "ring_g")
TOKEN = ("q", "k", "v", "beta", "g")


def _run_replay(fn, p, origin, count, **kw):
    return fn(*[p[n] for n in RING], origin, count, *[p[n] for n in TOKEN], **kw)


def _check_replay(k, device, dtype, *, key_heads, value_heads, key_dim, value_dim, per_key, buffer_len, ring,
                  origins, counts, block_vs, rel, poison=False, flush_dots=(None,), splits=(None,), launch=None,
                  **options):
    import torch

    batch = len(counts)
    for block_v, flush_dot, split in [(bv, fd, sp) for bv in block_vs for fd in flush_dots for sp in splits]:
        p = _make(device, dtype, batch, key_heads, value_heads, key_dim, value_dim, ring, per_key=per_key)
        origin = torch.tensor(origins, dtype=torch.int32, device=device)
        count = torch.tensor(counts, dtype=torch.int32, device=device)
        if poison:  # slots outside the committed window hold NaN: they must never reach the output
            for b in range(batch):
                committed = {(origins[b] + j) % ring for j in range(counts[b])}
                for slot in set(range(ring)) - committed:
                    for name in ("ring_k", "ring_d", "ring_g"):
                        p[name][b, slot] = float("nan")
        q, origin_ref, count_ref = _clone(p), origin.clone(), count.clone()
        out = torch.empty(p["v"].shape, dtype=torch.float32, device=device)  # fp32 output: compare before rounding
        o = _run_replay(k._replay_step, p, origin, count, buffer_len=buffer_len, out=out, _block_v=block_v,
                        _flush_dot=flush_dot, _split=split, **(launch or {}), **options)
        o_ref = _run_replay(k.delta_replay_step_ref, q, origin_ref, count_ref, buffer_len=buffer_len,
                            out=torch.empty_like(out), **options)
        print(f" block_v={block_v} flush_dot={flush_dot} split={split} {launch or ''} per_key={per_key} "
              f"counts={counts} origins={origins} {options}")
        assert o is out
        _close("o", o, o_ref, rel)
        _close("state", p["state"], q["state"], 1e-6)
        torch.testing.assert_close(p["ring_k"], q["ring_k"], rtol=0, atol=0, equal_nan=True)  # raw keys, as is
        torch.testing.assert_close(p["ring_g"], q["ring_g"], rtol=0, atol=0, equal_nan=True)
        _close("ring_d", p["ring_d"].nan_to_num(), q["ring_d"].nan_to_num(), rel)
        assert torch.equal(count, count_ref) and torch.equal(origin, origin_ref), (count, count_ref)
    # default output dtype = v's dtype
    p = _make(device, dtype, batch, key_heads, value_heads, key_dim, value_dim, ring, per_key=per_key)
    origin = torch.zeros(batch, dtype=torch.int32, device=device)
    count = torch.tensor(counts, dtype=torch.int32, device=device)
    assert _run_replay(k.delta_replay_step, p, origin, count, buffer_len=buffer_len, **options).dtype == dtype


def case_replay_mixed_gdn_bf16(k, device):
    """GDN gate, bf16 q/k/v and ring keys, GVA (Hv=4, Hk=2), V=24 (not a power of two: one full and one partial V
    tile at BLOCK_V=16), counts 0..L-1 in one launch (rows flush and replay together), minimal ring R = L - 1 with
    origins near R - 1 (wrap-around); uncommitted ring slots hold NaN; both flush forms (tl.dot and record loop);
    the step as two launches (flush-only, then replay-only with the count update) and as one fused launch."""
    import torch

    L = 6
    _check_replay(k, device, torch.bfloat16, key_heads=2, value_heads=4, key_dim=32, value_dim=24, per_key=False,
                  buffer_len=L, ring=L - 1, origins=[4, 3, 4, 2, 4, 1], counts=[0, 1, 2, 3, 4, 5], block_vs=[16, 32],
                  rel=1e-5, poison=True, flush_dots=(True, False), splits=(True, False))


def case_replay_launch_variants(k, device):
    """The device-phase step's launch variants besides the default (count launch, records in logical order): count
    tickets instead of the count launch, records read by physical slot, both, and the split step without the tile
    prefetch; split and fused; GDN and KDA gates; uncommitted ring slots hold NaN; against the reference."""
    import torch

    L = 6
    for launch in (dict(_count_launch=False), dict(_ring_physical=True), dict(_count_launch=False, _ring_physical=True),
                   dict(_prefetch=False)):
        _check_replay(k, device, torch.bfloat16, key_heads=2, value_heads=4, key_dim=32, value_dim=24, per_key=False,
                      buffer_len=L, ring=L - 1, origins=[4, 3, 4, 2, 4, 1], counts=[0, 1, 2, 3, 4, 5],
                      block_vs=[16], rel=1e-5, poison=True, splits=(True, False), launch=launch)
    _check_replay(k, device, torch.float32, key_heads=2, value_heads=4, key_dim=24, value_dim=32, per_key=True,
                  buffer_len=5, ring=7, origins=[6, 5, 0, 6, 3], counts=[4, 3, 0, 2, 1], block_vs=[16], rel=1e-5,
                  poison=True, splits=(True, False), launch=dict(_count_launch=False))


def case_replay_mixed_kda(k, device):
    """KDA (per-key-channel) gate, fp32 inputs, K=24 (not a power of two), GVA ratio 2, ring larger than needed
    (R=7 for L=5), counts out of order, wrap-around; uncommitted slots hold NaN; both flush forms."""
    import torch

    L, R = 5, 7
    _check_replay(k, device, torch.float32, key_heads=2, value_heads=4, key_dim=24, value_dim=32, per_key=True,
                  buffer_len=L, ring=R, origins=[6, 5, 0, 6, 3], counts=[4, 3, 0, 2, 1], block_vs=[16], rel=1e-5,
                  poison=True, flush_dots=(False, True), splits=(True, False))


def case_replay_options(k, device):
    """use_qk_l2norm=False with an explicit scale (KDA and GDN), and strided views: the checkpoint a permuted slice
    of a pool, q/k/v split out of one projection, the ring a slice of a larger pool."""
    import torch

    for per_key in (True, False):
        _check_replay(k, device, torch.float32, key_heads=1, value_heads=2, key_dim=16, value_dim=16,
                      per_key=per_key, buffer_len=4, ring=3, origins=[2, 0, 1, 2], counts=[3, 2, 1, 0], block_vs=[16],
                      rel=1e-5, use_qk_l2norm=False, scale=0.3)
    batch, Hk, Hv, K, V, R, L = 3, 2, 4, 16, 24, 5, 6
    p = _make(device, torch.float32, batch, Hk, Hv, K, V, R, per_key=False)
    pool = torch.randn(batch + 2, Hv, V, K, device=device)
    state = pool[1 : batch + 1].transpose(-1, -2)
    state.copy_(p["state"])
    proj = torch.randn(batch, 2 * Hk * K + Hv * V + 3, device=device)
    q = proj[:, : Hk * K].view(batch, Hk, K)
    kk = proj[:, Hk * K : 2 * Hk * K].view(batch, Hk, K)
    v = proj[:, 2 * Hk * K : 2 * Hk * K + Hv * V].view(batch, Hv, V)
    ring_pool = torch.randn(batch, R + 2, Hk + 1, K, device=device)
    ring_k = ring_pool[:, 1 : R + 1, 1:]
    ring_k.copy_(p["ring_k"])
    p.update(q=q, k=kk, v=v)
    assert not state.is_contiguous() and not q.is_contiguous() and not ring_k.is_contiguous()
    origin = torch.tensor([4, 2, 0], dtype=torch.int32, device=device)
    count = torch.tensor([5, 1, 3], dtype=torch.int32, device=device)
    ref = _clone(p)
    ref["state"] = state.clone()
    oref, cref = origin.clone(), count.clone()
    p["state"], p["ring_k"] = state, ring_k
    o = _run_replay(k._replay_step, p, origin, count, buffer_len=L, _block_v=16)
    o_ref = _run_replay(k.delta_replay_step_ref, ref, oref, cref, buffer_len=L)
    print(" strided views")
    _close("o", o, o_ref, 1e-5)
    _close("state", pool[1 : batch + 1].transpose(-1, -2), ref["state"], 1e-6)
    torch.testing.assert_close(ring_k, ref["ring_k"], rtol=0, atol=0)
    _close("ring_d", p["ring_d"], ref["ring_d"], 1e-5)
    assert torch.equal(count, cref)
    assert pool[0].abs().max() > 0 and ring_pool[:, 0].abs().max() > 0  # neighbours untouched (still random)


def case_state_update(k, device):
    """Standard step: GDN and KDA, bf16 and fp32 inputs, GVA, non-power-of-two K and V, several BLOCK_V, l2norm
    off, strided state through the public entry point (bf16 output)."""
    import torch

    for dtype, per_key, block_v, K, V, options in [
        (torch.bfloat16, False, 8, 32, 24, {}),
        (torch.float32, True, 16, 24, 32, {}),
        (torch.float32, False, 32, 16, 16, dict(use_qk_l2norm=False, scale=0.7)),
    ]:
        p = _make(device, dtype, 2, 2, 4, K, V, 1, per_key=per_key)
        q = _clone(p)
        out = torch.empty(p["v"].shape, dtype=torch.float32, device=device)
        o = k._state_update(p["state"], *[p[n] for n in TOKEN], out=out, _block_v=block_v, **options)
        o_ref = k.delta_state_update_ref(q["state"], *[q[n] for n in TOKEN], out=torch.empty_like(out), **options)
        print(f" dtype={dtype} per_key={per_key} block_v={block_v} K={K} V={V} {options}")
        _close("o", o, o_ref, 1e-5)
        _close("state", p["state"], q["state"], 1e-6)
    p = _make(device, torch.bfloat16, 2, 2, 4, 32, 24, 1, per_key=True)
    pool = torch.zeros(4, 4, 24, 32, device=device)
    state = pool[1:3].transpose(-1, -2)
    state.copy_(p["state"])
    ref_state = p["state"].clone()
    o = k.delta_state_update(state, *[p[n] for n in TOKEN])
    o_ref = k.delta_state_update_ref(ref_state, *[p[n] for n in TOKEN])
    assert o.dtype == torch.bfloat16
    _close("o strided (bf16)", o.float(), o_ref.float(), 1e-2)
    _close("state strided", state, ref_state, 1e-6)
    assert pool[0].abs().max() == 0 and pool[3].abs().max() == 0


def _sequence(k, device, per_key):
    """2L+3 consecutive steps of the replay kernel == the same steps of the standard kernel and of the sequential
    recurrence ``delta_step_reference`` (fp32): outputs within 1e-4 relative, checkpoint after the last flush
    within 1e-5. Row 0 starts with an empty ring, row 1 with one record already buffered (so the rows flush on
    different steps); ring of the minimal capacity L - 1 starting at its last slot (wrap-around); GVA ratio 2."""
    import torch

    from hf_replayssm.ops.delta_rule import delta_step_reference
    from hf_replayssm.ops.delta_step import delta_keys

    L, Hk, Hv, K, V = 4, 1, 2, 16, 24
    steps, R, batch = 2 * L + 3, L - 1, 2
    gen = torch.Generator().manual_seed(1)
    gshape = (Hv, K) if per_key else (Hv,)
    S0 = torch.randn(batch, Hv, K, V, generator=gen) * 0.5
    qs = torch.randn(batch, steps + 1, Hk, K, generator=gen)
    ks = torch.randn(batch, steps + 1, Hk, K, generator=gen)
    vs = torch.randn(batch, steps + 1, Hv, V, generator=gen)
    betas = torch.rand(batch, steps + 1, Hv, generator=gen) * 0.9 + 0.05
    gs = -(torch.rand(batch, steps + 1, *gshape, generator=gen) * 0.5 + 0.02)

    def step_ref(state, t, rows=slice(None)):
        qn = delta_keys(qs[rows, t], Hv, True) * K ** -0.5
        kn = delta_keys(ks[rows, t], Hv, True)
        o, new = delta_step_reference(state, qn[:, None], kn[:, None], vs[rows, t, None], betas[rows, t, None],
                                      gs[rows, t, None])
        return o[:, 0], new

    ckpt = S0.clone().to(device)
    ring_k = torch.zeros(batch, R, Hk, K, device=device)
    ring_d = torch.zeros(batch, R, Hv, V, device=device)
    ring_g = torch.zeros(batch, R, *gshape, device=device)
    origin = torch.full((batch,), R - 1, dtype=torch.int32, device=device)
    count = torch.tensor([0, 1], dtype=torch.int32, device=device)
    # row 1's token 0 is already buffered: its record, and the reference / standard states one token later
    _, s1 = step_ref(S0[1:2], 0, slice(1, 2))
    ring_k[1, R - 1] = ks[1, 0].to(device)
    ring_g[1, R - 1] = gs[1, 0].to(device)
    decayed = S0[1] * torch.exp(gs[1, 0]).reshape(Hv, -1, 1)  # P_0 = diag(exp(g_0)) S0
    kn0 = delta_keys(ks[1, 0], Hv, True)
    ring_d[1, R - 1] = (betas[1, 0, :, None] * (vs[1, 0] - torch.einsum("hkv,hk->hv", decayed, kn0))).to(device)
    ref_state = S0.clone()
    ref_state[1] = s1[0]
    std_state = ref_state.clone().to(device)

    last_flush_state = [None, None]
    for t in range(1, steps + 1):
        tok = dict(q=qs[:, t], k=ks[:, t], v=vs[:, t], beta=betas[:, t], g=gs[:, t])
        tok_dev = {n: x.to(device) for n, x in tok.items()}
        flushing = (count + 1 >= L).cpu().tolist()
        o = k.delta_replay_step(ckpt, ring_k, ring_d, ring_g, origin, count, **tok_dev, buffer_len=L)
        o_std = k.delta_state_update(std_state, **tok_dev)
        o_seq, ref_state = step_ref(ref_state, t)
        print(f" step {t}: flush rows {[b for b in range(batch) if flushing[b]]}, count -> {count.tolist()}")
        _close("o vs sequential", o.cpu(), o_seq, 1e-4)
        _close("o vs standard kernel", o.cpu(), o_std.cpu(), 1e-4)
        _close("standard state vs sequential", std_state.cpu(), ref_state, 1e-5)
        for b in range(batch):
            if flushing[b]:
                last_flush_state[b] = ref_state[b].clone()
    assert all(s is not None for s in last_flush_state)
    for b in range(batch):
        _close(f"row {b} checkpoint after its last flush", ckpt[b].cpu(), last_flush_state[b], 1e-5)
    assert count.tolist() == [steps % L, (steps + 1) % L]
    assert origin.tolist() == [R - 1, R - 1]


def case_sequence_gdn(k, device):
    _sequence(k, device, per_key=False)


def case_sequence_kda(k, device):
    _sequence(k, device, per_key=True)


def case_buffer_len_one(k, device):
    """buffer_len=1: every step flushes (no records) and equals the standard kernel."""
    import torch

    for per_key in (False, True):
        p = _make(device, torch.bfloat16, 2, 2, 4, 16, 16, 1, per_key=per_key)
        origin = torch.zeros(2, dtype=torch.int32, device=device)
        count = torch.zeros(2, dtype=torch.int32, device=device)
        state_std = p["state"].clone()
        for _ in range(2):
            out = torch.empty(p["v"].shape, dtype=torch.float32, device=device)
            o = _run_replay(k._replay_step, p, origin, count, buffer_len=1, out=out, _block_v=16)
            o_std = k._state_update(state_std, *[p[n] for n in TOKEN], out=torch.empty_like(out), _block_v=16)
            _close("o", o, o_std, 1e-6)
            _close("state", p["state"], state_std, 1e-6)
            assert count.tolist() == [0, 0]


def case_host_phase(k, device):
    """Host-int positions (every row at one position: the phase-specialised kernels) == the reference with those
    positions as per-row tensors, for every count 0..L-1 (replay-only and flush-only programs), GDN and KDA, GVA,
    ring wrap-around, bf16 inputs; the flush-only launch at its default (host_flush_launch_config: GDN the product,
    KDA the loop at the device phase's tile, from the weights pre-launch) and with each fold forced. And the
    device-phase GDN kernel reads the ring in physical and in logical order with the same result."""
    import torch

    L, R, batch = 5, 4, 2
    for per_key in (False, True):
        for count, flush_dot in [(c, None) for c in range(L)] + [(L - 1, False), (L - 1, True)]:
            origin = (3 * count + 1) % R
            p = _make(device, torch.bfloat16, batch, 2, 4, 24, 20, R, per_key=per_key, seed=count)
            q = _clone(p)
            out = torch.empty(p["v"].shape, dtype=torch.float32, device=device)
            o = _run_replay(k._replay_step, p, origin, count, buffer_len=L, out=out, _flush_dot=flush_dot)
            full = [torch.full((batch,), x, dtype=torch.int32, device=device) for x in (origin, count)]
            o_ref = _run_replay(k.delta_replay_step_ref, q, *full, buffer_len=L, out=torch.empty_like(out))
            print(f" host phase: per_key={per_key} origin={origin} count={count} flush_dot={flush_dot}")
            _close("o", o, o_ref, 2e-5)
            _close("state", p["state"], q["state"], 2e-6)
            assert torch.equal(p["ring_k"], q["ring_k"]) and torch.equal(p["ring_g"], q["ring_g"])
            _close("ring_d", p["ring_d"], q["ring_d"], 2e-5)
    results = []
    for physical in (True, False):
        p = _make(device, torch.float32, 3, 2, 4, 24, 20, R, per_key=False, seed=7)
        origin = torch.tensor([3, 0, 2], dtype=torch.int32, device=device)
        count = torch.tensor([2, 0, 3], dtype=torch.int32, device=device)
        results.append((_run_replay(k._replay_step, p, origin, count, buffer_len=L, _ring_physical=physical),
                        p["ring_d"], count))
    print(" ring read order")
    _close("o physical vs logical", results[0][0], results[1][0], 2e-6)
    _close("ring_d physical vs logical", results[0][1], results[1][1], 2e-6)
    assert torch.equal(results[0][2], results[1][2])


def _host_phase_with_and_without(k, device, *, per_key, option, flush_dot=None):
    """Host positions at every count of a period (replay-only and flush-only launches, bf16 inputs): the replay step
    with the private ``option`` on equals it off, bit for bit on the CPU (within 2e-6 on CUDA), outputs and rings.
    ``flush_dot``: the flush-only launch's fold in both runs (None: each run's default)."""
    import torch

    L, R, batch = 5, 4, 2
    for count in range(L):
        origin = (3 * count + 1) % R
        runs = []
        for on in (True, False):
            p = _make(device, torch.bfloat16, batch, 2, 4, 24, 20, R, per_key=per_key, seed=count)
            out = torch.empty(p["v"].shape, dtype=torch.float32, device=device)
            fold = dict(_flush_dot=flush_dot) if count == L - 1 else {}
            runs.append((_run_replay(k._replay_step, p, origin, count, buffer_len=L, out=out, _block_v=16,
                                     **fold, **{option: on}), p))
        print(f" host phase: origin={origin} count={count} {option}")
        (o, p), (o_off, p_off) = runs
        assert torch.isfinite(o).all()
        exact = dict(rtol=0, atol=0) if device == "cpu" else dict(rtol=2e-6, atol=2e-6)
        torch.testing.assert_close(o, o_off, **exact)
        for name in RING:
            torch.testing.assert_close(p[name], p_off[name], **exact)


def case_gdn_weights(k, device):
    """``_gdn_weights`` (scalar gates: the per-head pre-launch of the decay and record weights for the launches with
    replaying programs; off by default): against the reference with device positions (fused steps, whose flushing
    programs compute their record decays themselves, with both flush forms; split steps, whose replay launch takes
    the weights), NaN in uncommitted slots, two V tiles per head, GVA; with host positions at every count equal to
    the launch without it, bit for bit on the CPU (the same expressions), and the pre-launch ran."""
    import torch

    k.LAST_COMPILED.pop("kda_weights", None)
    _check_replay(k, device, torch.float32, key_heads=2, value_heads=4, key_dim=24, value_dim=32, per_key=False,
                  buffer_len=5, ring=7, origins=[6, 5, 0, 6, 3], counts=[4, 3, 0, 2, 1], block_vs=[16], rel=1e-5,
                  poison=True, flush_dots=(True, False), splits=(True, False), launch=dict(_gdn_weights=True))
    _host_phase_with_and_without(k, device, per_key=False, option="_gdn_weights")
    assert "kda_weights" in k.LAST_COMPILED  # the pre-launch ran


def case_kda_weights(k, device):
    """``_kda_weights`` (per-key gates: the decays and record weights computed once per row and head by a first
    launch; the default) and its opposite: against the reference with device positions (rows in mixed phases,
    fused and split, count launch and tickets, NaN in uncommitted slots, both flush forms, two V tiles per head) and
    host positions (every count, replay-only and flush-only launches), and equal to each other bit for bit on the
    CPU."""
    import torch

    for launch in (dict(_kda_weights=True), dict(_kda_weights=True, _count_launch=False), dict(_kda_weights=False),
                   dict(_kda_weights=True, _weights_warps=4)):  # the pre-launch on four warps (the default: one)
        _check_replay(k, device, torch.float32, key_heads=2, value_heads=4, key_dim=24, value_dim=32, per_key=True,
                      buffer_len=5, ring=7, origins=[6, 5, 0, 6, 3], counts=[4, 3, 0, 2, 1], block_vs=[16],
                      rel=1e-5, poison=True, flush_dots=(False, True), splits=(True, False), launch=launch)
    # the flush with the loop in both runs (by default the launch with the weights loops, the one without takes
    # the product: different sums)
    _host_phase_with_and_without(k, device, per_key=True, option="_kda_weights", flush_dot=False)
    assert "kda_weights" in k.LAST_COMPILED


def case_kda_newest_first(k, device):
    """``_newest_first`` (per-key gates; off by default, untimed): the per-head pre-launch reads the records newest
    first, so their decays are a forward scan (Triton 3.6 lowers the reverse one with about four times the warp
    shuffles), and stores the weights in logical order. Against the reference with device positions (rows in mixed
    phases, fused and split, NaN in uncommitted slots, both flush forms, an empty ring, GVA) and with host positions
    at every count (origins wrapping); every pre-launch compiled with NEWEST_FIRST; and planted in the reference
    order's place, the newest-first weights would be wrong (the check can fail)."""
    import torch

    saved = k._kda_weights_kernel
    recorded = k._kda_weights_kernel = RecordedKernel(saved)
    try:
        _check_replay(k, device, torch.float32, key_heads=2, value_heads=4, key_dim=24, value_dim=32, per_key=True,
                      buffer_len=5, ring=7, origins=[6, 5, 0, 6, 3], counts=[4, 3, 0, 2, 1], block_vs=[16],
                      rel=1e-5, poison=True, flush_dots=(False, True), splits=(True, False),
                      launch=dict(_newest_first=True))
        # (the launches it made with the option; its dtype check calls the public entry, the default order)
        assert sum(kw["NEWEST_FIRST"] for kw in recorded.launches) == 2, recorded.launches  # (the loop folds)
        recorded.launches.clear()
        L, R, batch = 5, 4, 2
        for count in range(L):
            origin = (3 * count + 1) % R
            p = _make(device, torch.bfloat16, batch, 2, 4, 24, 20, R, per_key=True, seed=count)
            q = _clone(p)
            out = torch.empty(p["v"].shape, dtype=torch.float32, device=device)
            o = _run_replay(k._replay_step, p, origin, count, buffer_len=L, out=out, _newest_first=True,
                            _flush_dot=False)
            full = [torch.full((batch,), x, dtype=torch.int32, device=device) for x in (origin, count)]
            o_ref = _run_replay(k.delta_replay_step_ref, q, *full, buffer_len=L, out=torch.empty_like(out))
            print(f" host phase, newest first: origin={origin} count={count}")
            _close("o", o, o_ref, 2e-5)
            _close("state", p["state"], q["state"], 2e-6)
            _close("ring_d", p["ring_d"], q["ring_d"], 2e-5)
        assert len(recorded.launches) == L and all(kw["NEWEST_FIRST"] for kw in recorded.launches), recorded.launches
    finally:
        k._kda_weights_kernel = saved
    # the positions matter: the newest-first weights stored as computed (row m at position m) fail the reference
    p = _make(device, torch.float32, 1, 2, 4, 24, 32, 7, per_key=True, seed=3)
    q = _clone(p)
    count = torch.tensor([3], dtype=torch.int32, device=device)
    unpermuted = k._kda_weights_kernel = _UnpermutedWeights(saved)
    try:
        o = _run_replay(k._replay_step, p, torch.tensor([2], dtype=torch.int32, device=device), count,
                        buffer_len=5, out=torch.empty(p["v"].shape, dtype=torch.float32, device=device),
                        _newest_first=True)
    finally:
        k._kda_weights_kernel = saved
    o_ref = _run_replay(k.delta_replay_step_ref, q, torch.tensor([2], dtype=torch.int32, device=device),
                        count.clone(), buffer_len=5, out=torch.empty_like(o))
    assert unpermuted.calls and (o - o_ref).abs().max() > 1e-3 * o_ref.abs().max(), (o - o_ref).abs().max()


class _UnpermutedWeights(RecordedKernel):
    """The (recorded) pre-launch, then its newest-first record weights put back in the order computed (row m at
    position m): what storing them unpermuted would hand the replay programs."""

    def __getitem__(self, grid):
        recorded = super().__getitem__(grid)

        def launch(*args, **kwargs):
            recorded(*args, **kwargs)
            weights, count = args[7], args[3]  # (ring_k, ring_g, origin, count, q, k, g, weights, ...)
            block_k, block_r = kwargs["BLOCK_K"], kwargs["BLOCK_R"]
            for b in range(weights.shape[0]):
                n = int(count[b])
                for start in (block_k, block_k + block_r):
                    weights[b, :, start:start + n] = weights[b, :, start:start + n].flip(-1)

        return launch


def case_replay_walk(k, device):
    """``_walk`` (replay-only launches on a device-sized grid walking the tiles, loads pipelined): the outputs and
    rings of the per-tile launch, bit for bit on the CPU (within 2e-6 on CUDA), GDN with GVA and KDA with and without
    the weights pre-launch, two V tiles per head: host positions at every replaying count, pipelines 2 and 3 deep
    (a split step's replay launch walking, and the launches it cannot serve: :func:`case_replay_walk_split`)."""
    import torch

    L, R, batch = 5, 4, 3
    for per_key, launch in ((False, {}), (True, {}), (True, dict(_kda_weights=False))):
        for count in range(L - 1):
            origin = (3 * count + 1) % R
            runs = []  # the per-tile launch once, then each walk on the same inputs
            for use in (None, dict(programs_per_sm=2, num_stages=2), dict(programs_per_sm=3, num_stages=3)):
                p = _make(device, torch.bfloat16, batch, 2, 4, 24, 20, R, per_key=per_key, seed=count)
                out = torch.empty(p["v"].shape, dtype=torch.float32, device=device)
                runs.append((_run_replay(k._replay_step, p, origin, count, buffer_len=L, out=out, _block_v=16,
                                         _walk=use, **launch), p, use))
            (o, p, _), *walks = runs
            exact = dict(rtol=0, atol=0) if device == "cpu" else dict(rtol=2e-6, atol=2e-6)
            for o_walk, p_walk, walk in walks:
                print(f" walk: per_key={per_key} {launch} count={count} {walk}")
                assert torch.isfinite(o_walk).all()
                torch.testing.assert_close(o_walk, o, **exact)
                for name in RING:
                    torch.testing.assert_close(p_walk[name], p[name], **exact)
    assert "replay_phase1" in k.LAST_COMPILED


def case_replay_walk_split(k, device):
    """``_walk`` on a split step's replay launch (device positions, rows in mixed phases, some due to flush; every
    row due; none due), over every item or only the replaying rows' (compact), also on a tile of its own (one V tile
    of 32 where the step's flush launch keeps two of 16): the per-tile launch's outputs and rings, bit for bit on the
    CPU; the launches it cannot serve are refused. (A case of its own: the longest of this file otherwise.)"""
    import torch

    L, R, batch = 5, 4, 3
    layouts = [([3, 0, 2, 1, 3, 2], [4, 1, 4, 3, 0, 2]), ([1, 2, 0], [4, 4, 4]), ([1, 2, 0], [2, 0, 3])]
    for (origins, counts), (per_key, launch) in itertools.product(
            layouts, ((False, {}), (True, {}), (True, dict(_kda_weights=False)))):
        if len(counts) == 3 and per_key and launch:
            continue
        runs = []
        for use in (None, dict(programs_per_sm=2, num_stages=2), dict(programs_per_sm=2, num_stages=2, compact=True),
                    dict(programs_per_sm=3, num_stages=2, compact=True, block_v=32, num_warps=1)):  # its own tile
            p = _make(device, torch.bfloat16, len(counts), 2, 4, 24, 20, R, per_key=per_key, seed=3)
            count = torch.tensor(counts, dtype=torch.int32, device=device)
            origin = torch.tensor(origins, dtype=torch.int32, device=device)
            out = torch.full(p["v"].shape, float("nan"), dtype=torch.float32, device=device)
            runs.append((_run_replay(k._replay_step, p, origin, count, buffer_len=L, out=out, _block_v=16,
                                     _split=True, _walk=use, **launch), p, count))
        print(f" walk, device positions: per_key={per_key} {launch} counts={counts}")
        (o, p, count), *walks = runs
        exact = dict(rtol=0, atol=0) if device == "cpu" else dict(rtol=2e-6, atol=2e-6)
        assert torch.isfinite(o).all()  # every row's output written, by the flush launch or the replay launch
        for o_walk, p_walk, count_walk in walks:
            assert torch.equal(count_walk, count)
            torch.testing.assert_close(o_walk, o, **exact)
            for name in RING:
                torch.testing.assert_close(p_walk[name], p[name], **exact)
    p = _make(device, torch.float32, batch, 2, 4, 24, 20, R, per_key=False)
    for count, extra in ((L - 1, {}), (1, dict(_walk=dict(stages=2))), (1, dict(_chunk_k=8))):
        with pytest.raises(ValueError, match="_walk"):
            _run_replay(k._replay_step, p, 0, count, buffer_len=L, **{"_walk": {}, **extra})
    positions = [torch.zeros(batch, dtype=torch.int32, device=device) for _ in range(2)]
    for extra in (dict(_split=False), dict(_split=True, _count_launch=False)):  # fused, or tickets: refused
        with pytest.raises(ValueError, match="_walk"):
            _run_replay(k._replay_step, p, *positions, buffer_len=L, _walk={}, **extra)


def case_host_walk_default(k, device):
    """From ``HOST_WALK_MIN_BATCH`` rows (lowered here to reach it on tiny shapes) the host-phase replay-only launch
    walks the tiles by default at ``host_walk_launch_config``: bit for bit the explicit walk, the per-tile launch's
    outputs and rings within float32 rounding (GDN with GVA, KDA with and without the weights pre-launch, every
    replaying count); a forced tile, the flush launch and device positions run per tile, an unknown ``_walk`` is
    refused."""
    import torch

    def walked(**kw) -> bool:
        before = walk_kernel.calls
        _run_replay(k._replay_step, **kw)
        return walk_kernel.calls > before

    L, R, batch = 5, 4, 3
    saved = k.HOST_WALK_MIN_BATCH, k._delta_replay_walk_kernel
    walk_kernel = k._delta_replay_walk_kernel = RecordedKernel(saved[1])
    try:
        k.HOST_WALK_MIN_BATCH = 1
        block_v, warps, walk = k.host_walk_launch_config(batch, 24, 20)
        assert (block_v, warps) == (32, 1) and walk == dict(programs_per_sm=8, num_stages=2)
        for per_key, launch in ((False, {}), (True, {}), (True, dict(_kda_weights=False))):
            for count in range(L - 1):
                origin = (3 * count + 2) % R
                runs = []
                for use in ({}, dict(_block_v=block_v, _num_warps=warps, _walk=walk), dict(_walk=None)):
                    p = _make(device, torch.bfloat16, batch, 2, 4, 24, 20, R, per_key=per_key, seed=count + 7)
                    out = torch.empty(p["v"].shape, dtype=torch.float32, device=device)
                    before = walk_kernel.calls
                    _run_replay(k._replay_step, p, origin, count, buffer_len=L, out=out, **use, **launch)
                    runs.append((out, p, walk_kernel.calls > before))
                print(f" host walk default: per_key={per_key} {launch} count={count}")
                (o, p, walk_used), (o_walk, p_walk, _), (o_tile, p_tile, tile_walked) = runs
                assert walk_used and not tile_walked
                assert torch.isfinite(o).all()
                exact = dict(rtol=0, atol=0) if device == "cpu" else dict(rtol=2e-6, atol=2e-6)
                torch.testing.assert_close(o, o_walk, **exact)
                torch.testing.assert_close(o, o_tile, rtol=2e-6, atol=2e-6)
                for name_ in RING:
                    torch.testing.assert_close(p[name_], p_walk[name_], **exact)
                    torch.testing.assert_close(p[name_], p_tile[name_], rtol=2e-6, atol=2e-6)
        p = _make(device, torch.float32, batch, 2, 4, 24, 20, R, per_key=False)
        assert walked(p=p, origin=0, count=1, buffer_len=L)
        assert not walked(p=p, origin=0, count=1, buffer_len=L, _block_v=16)  # a forced tile: per tile
        assert not walked(p=p, origin=0, count=L - 1, buffer_len=L)  # the flush launch
        positions = [torch.zeros(batch, dtype=torch.int32, device=device) for _ in range(2)]
        assert not walked(p=p, origin=positions[0], count=positions[1], buffer_len=L)  # device positions
        with pytest.raises(ValueError, match="_walk must be"):
            _run_replay(k._replay_step, p, 0, 1, buffer_len=L, _walk="always")
    finally:
        k.HOST_WALK_MIN_BATCH, k._delta_replay_walk_kernel = saved
    assert k.host_walk_launch_config(k.HOST_WALK_MIN_BATCH - 1, 128, 128) is None
    assert k.host_walk_launch_config(k.HOST_WALK_MIN_BATCH, 128, 128)[:2] == (32, 1)
    assert k.host_walk_launch_config(k.HOST_WALK_MIN_BATCH, 256, 128) is None  # wider keys: per tile


def case_device_walk_default(k, device):
    """From ``DEVICE_WALK_MIN_BATCH`` rows (lowered here to reach it on tiny shapes) a GDN step with device positions
    runs split by default, its replay launch walking the tiles at ``device_walk_launch_config``: bit for bit the
    explicit split walk, the fused launch's outputs, rings and counts within float32 rounding (GVA, rows in mixed
    phases with some due to flush, NaN in uncommitted slots, and rows in phase at every count); KDA, a forced tile,
    tickets, records by physical slot and host positions keep their launches; a bad ``_split`` is refused."""
    import torch

    L, R = 5, 4
    walk = dict(programs_per_sm=4, num_stages=2, compact=True)
    saved = k.DEVICE_WALK_MIN_BATCH, k._delta_replay_walk_kernel
    walk_kernel = k._delta_replay_walk_kernel = RecordedKernel(saved[1])

    def run(p, origins, counts, **kw):
        origin = torch.tensor(origins, dtype=torch.int32, device=device)
        count = torch.tensor(counts, dtype=torch.int32, device=device)
        out = torch.empty(p["v"].shape, dtype=torch.float32, device=device)
        before = walk_kernel.calls
        _run_replay(k._replay_step, p, origin, count, buffer_len=L, out=out, **kw)
        return out, count, walk_kernel.calls > before

    try:
        k.DEVICE_WALK_MIN_BATCH = 1
        assert k.device_walk_launch_config(4, 24, False) == walk
        layouts = [([3, 0, 2, 1, 3, 2], [4, 1, 4, 3, 0, 2])]  # mixed phases, rows 0 and 2 due
        layouts += [([(3 * c + 1) % R] * 3, [c] * 3) for c in range(L)]  # in phase, every count (L - 1: all flush)
        for origins, counts in layouts:
            runs = []
            for use in ({}, dict(_split=True, _walk=walk), dict(_split=False)):
                p = _make(device, torch.bfloat16, len(counts), 2, 4, 24, 20, R, per_key=False, seed=sum(counts))
                for b in range(len(counts)):  # slots outside the committed window must never reach the output
                    for slot in set(range(R)) - {(origins[b] + j) % R for j in range(counts[b])}:
                        for name in ("ring_k", "ring_d", "ring_g"):
                            p[name][b, slot] = float("nan")
                runs.append((*run(p, origins, counts, **use), p))
            print(f" device walk default: origins={origins} counts={counts}")
            (o, count, walked, p), (o_walk, count_walk, _, p_walk), (o_fused, count_fused, fused_walked, p_fused) = runs
            assert walked and not fused_walked
            assert torch.isfinite(o).all()
            assert torch.equal(count, count_walk) and torch.equal(count, count_fused)
            exact = dict(rtol=0, atol=0) if device == "cpu" else dict(rtol=2e-6, atol=2e-6)
            torch.testing.assert_close(o, o_walk, **exact)
            torch.testing.assert_close(o, o_fused, rtol=2e-6, atol=2e-6)
            for name in RING:
                torch.testing.assert_close(p[name], p_walk[name], **exact, equal_nan=True)
                torch.testing.assert_close(p[name], p_fused[name], rtol=2e-6, atol=2e-6, equal_nan=True)
        origins, counts = [3, 0, 2], [4, 1, 2]
        for per_key, kw in ((True, {}), (False, dict(_block_v=16)), (False, dict(_count_launch=False)),
                            (False, dict(_ring_physical=True)), (False, dict(_walk=None)), (False, dict(_chunk_k=8))):
            p = _make(device, torch.float32, len(counts), 2, 4, 24, 20, R, per_key=per_key)
            if "_chunk_k" in kw:  # the streamed checkpoint needs a split step: refused, as before, not walked
                with pytest.raises(ValueError, match="_chunk_k"):
                    run(p, origins, counts, **kw)
                continue
            assert not run(p, origins, counts, **kw)[2], (per_key, kw)
        p = _make(device, torch.float32, 3, 2, 4, 24, 20, R, per_key=False)
        before = walk_kernel.calls  # host positions, 3 rows: below the host walk's own threshold, per tile
        _run_replay(k._replay_step, p, 0, 1, buffer_len=L)
        assert walk_kernel.calls == before
        with pytest.raises(ValueError, match="_split must be"):
            run(p, origins, counts, _split="always")
    finally:
        k.DEVICE_WALK_MIN_BATCH, k._delta_replay_walk_kernel = saved
    assert k.device_walk_launch_config(k.DEVICE_WALK_MIN_BATCH - 1, 128, False) is None
    assert k.device_walk_launch_config(k.DEVICE_WALK_MIN_BATCH, 128, False) == walk
    assert k.device_walk_launch_config(k.DEVICE_WALK_MIN_BATCH, 128, True) is None  # KDA: fused
    assert k.device_walk_launch_config(k.DEVICE_WALK_MIN_BATCH, 256, False) is None  # wider keys: fused


def case_chunked_checkpoint(k, device):
    """``_chunk_k`` (the replay-only launches stream the fp32 checkpoint K rows at a time): GDN and KDA against the
    reference with device positions (split steps, NaN in uncommitted slots, K = 24 so the last chunk is masked,
    GVA, with and without l2norm) and host positions at every count equal to the whole-tile launch (within float32
    rounding: the sums over K are grouped by chunk); launches it cannot serve are refused."""
    import torch

    for per_key in (False, True):
        for chunk, options in ((8, {}), (16, dict(use_qk_l2norm=False, scale=0.3))):
            _check_replay(k, device, torch.float32, key_heads=2, value_heads=4, key_dim=24, value_dim=32,
                          per_key=per_key, buffer_len=5, ring=7, origins=[6, 5, 0, 6, 3], counts=[4, 3, 0, 2, 1],
                          block_vs=[16], rel=1e-5, poison=True, splits=(True,), launch=dict(_chunk_k=chunk), **options)
        L, R = 5, 4
        for count in range(L):
            runs = []
            for chunk in (8, 0):
                p = _make(device, torch.bfloat16, 2, 2, 4, 24, 20, R, per_key=per_key, seed=count)
                out = torch.empty(p["v"].shape, dtype=torch.float32, device=device)
                runs.append((_run_replay(k._replay_step, p, (3 * count + 1) % R, count, buffer_len=L, out=out,
                                         _block_v=16, _chunk_k=chunk), p))
            (o, p), (o_whole, p_whole) = runs
            print(f" host phase: count={count} per_key={per_key} chunk 8 vs whole tile")
            assert torch.isfinite(o).all() and o.abs().max() > 0
            _close("o, chunked", o, o_whole, 1e-5)
            for name in RING:
                _close(f"{name}, chunked", p[name].float(), p_whole[name].float(), 1e-5)
    p = _make(device, torch.float32, 2, 2, 4, 24, 20, 4, per_key=False)
    for bad, match in ((dict(_chunk_k=12), "power of two"), (dict(_chunk_k=8, _split=False), "split")):
        with pytest.raises(ValueError, match=match):
            _run_replay(k._replay_step, p, torch.zeros(2, dtype=torch.int32, device=device),
                        torch.zeros(2, dtype=torch.int32, device=device), buffer_len=5, **bad)
    p = _make(device, torch.float32, 2, 2, 4, 24, 20, 4, per_key=True)
    with pytest.raises(ValueError, match="weights pre-launch"):
        _run_replay(k._replay_step, p, 0, 1, buffer_len=5, _chunk_k=8, _kda_weights=False)


def case_flush_device_grid(k, device):
    """``_flush_grid="device"`` (a split step's flush launch on a device-sized grid walking the due rows' tiles):
    GDN and KDA against the reference at its own tile (NaN in uncommitted slots, GVA), and at the batch grid's
    tile equal to the batch-sized launch, bit for bit on the CPU (within 1e-6 on CUDA), with no row, one, several and
    every row due (more items than programs); a wrong name is refused."""
    import torch

    for per_key in (False, True):
        # (per-key gates: the split step's flush folds with the loop by default, which the device grid does not
        # serve; the product asked for)
        product = dict(_flush_dot=True) if per_key else {}
        _check_replay(k, device, torch.float32, key_heads=2, value_heads=4, key_dim=24, value_dim=32, per_key=per_key,
                      buffer_len=5, ring=7, origins=[6, 5, 0, 6, 3], counts=[4, 3, 0, 2, 4], block_vs=[16],
                      rel=1e-5, poison=True, splits=(True,), flush_dots=(True,) if per_key else (None,),
                      launch=dict(_flush_grid="device"))
        for counts in ([0, 1, 2, 3], [4, 1, 2, 3], [4, 0, 4, 2], [4, 4, 4, 4]):
            runs = {}
            for grid in ("batch", "device"):
                p = _make(device, torch.bfloat16, 4, 2, 4, 24, 20, 4, per_key=per_key, seed=sum(counts))
                count = torch.tensor(counts, dtype=torch.int32, device=device)
                out = torch.empty(p["v"].shape, dtype=torch.float32, device=device)
                k.LAST_COMPILED.pop("flush_due", None)
                # the device grid at the batch grid's tile: the same products, hence the same bits
                o = _run_replay(k._replay_step, p, torch.tensor([3, 0, 2, 1], dtype=torch.int32, device=device),
                                count, buffer_len=5, out=out, _block_v=16, _split=True, _flush_grid=grid,
                                _flush_config=(16, 2), **product)
                runs[grid] = (o, p, count, "flush_due" in k.LAST_COMPILED)
            print(f" per_key={per_key} counts={counts}: device grid == batch grid")
            (o, p, count, ran), (o_b, p_b, count_b, ran_b) = runs["device"], runs["batch"]
            assert ran and not ran_b  # the device-grid kernel served the flush launch (finding no row due, or some)
            exact = dict(rtol=0, atol=0) if str(device) == "cpu" else dict(rtol=1e-6, atol=1e-6)
            torch.testing.assert_close(o, o_b, **exact)
            for name in RING:
                torch.testing.assert_close(p[name], p_b[name], equal_nan=True, **exact)
            assert torch.equal(count, count_b)
    p = _make(device, torch.float32, 2, 2, 4, 24, 20, 4, per_key=False)
    with pytest.raises(ValueError, match="_flush_grid"):
        _run_replay(k._replay_step, p, torch.zeros(2, dtype=torch.int32, device=device),
                    torch.zeros(2, dtype=torch.int32, device=device), buffer_len=5, _flush_grid="persistent")


if __name__ == "__main__":
    worker_main("delta_rule", globals(), sys.argv[1])
