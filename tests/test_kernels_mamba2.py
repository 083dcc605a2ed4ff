"""Triton Mamba-2 decode-step kernels (``hf_replayssm.kernels.mamba2``) against their torch references.

Runs without a GPU: every check runs in a subprocess (this file executed as a script) with ``TRITON_INTERPRET=1``
set before triton is imported, on CPU tensors, so an out-of-bounds access (which segfaults the interpreter) fails
one test instead of killing pytest. On a CUDA machine the same checks run on the GPU with
``REPLAYSSM_KERNEL_TEST_DEVICE=cuda`` (same tolerances: the kernels use no tf32). Skipped when triton is not
installed. Shapes are tiny (the interpreter runs each program in numpy).
"""

from __future__ import annotations

import sys

import pytest
from kernel_harness import HAS_TRITON, run_bench_smoke, run_case, worker_main
from kernel_harness import assert_close as _close

CASES = ["replay_mixed_bf16", "replay_launch_variants", "flush_device_grid", "flush_one_round_trip",
         "replay_fp32_plain", "state_update",
         "sequence", "buffer_len_one", "host_phase", "replay_walk", "replay_weights"]


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
@pytest.mark.parametrize("case", CASES)
def test_kernel_matches_reference(case):
    run_case(__file__, case)


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
def test_replay_launch_config():
    """The measured replay tiles (H200, Nemotron-H-8B, run 183): from batch x heads >= 2048 the replay-only launches
    take one warp, a whole head of 64 rows where they read a copy (host or device positions), [32, 128] on the fp32
    checkpoint at host positions; device positions on the fp32 checkpoint keep [32, 128] x 2, small grids [16, 128] x
    2 whatever they read."""
    from hf_replayssm.kernels.mamba2 import replay_launch_config

    shape = (256, 128, 64, 128)

    def tile(*args, **kwargs):
        cfg = replay_launch_config(*args, **kwargs)
        return cfg["block_p"], cfg["num_warps"]

    assert tile(*shape) == tile(*shape, read_format="fp32") == (32, 1)
    assert tile(*shape, device_phase=True) == (32, 2)
    for read_format in ("fp8", "nvfp4"):
        assert tile(*shape, read_format=read_format) == tile(*shape, read_format=read_format,
                                                              device_phase=True) == (64, 1)
        assert tile(8, 128, 64, 128, read_format=read_format) == (16, 2)  # 1024 (row, head) pairs: small
    assert tile(16, 128, 64, 128, read_format="fp8") == (64, 1)  # 2048 pairs
    assert tile(8, 128, 64, 128) == tile(8, 128, 64, 128, device_phase=True) == (16, 2)
    assert tile(256, 128, 64, 256, read_format="fp8") == (32, 1)  # d_state 256: 8192 elements


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
def test_host_flush_launch_config():
    """The host-phase flush tile: 2048 elements on 2 warps ([16, 128] for Nemotron-H), never below the tl.dot's 16
    rows of P where the head has them (d_state 256), whatever the batch."""
    from hf_replayssm.kernels.mamba2 import host_flush_launch_config, replay_launch_config

    for batch in (1, 64, 256):
        assert host_flush_launch_config(batch, 128, 64, 128) == dict(block_p=16, num_warps=2)
    assert replay_launch_config(256, 128, 64, 128)["block_p"] == 32  # the replay tile it differs from
    assert host_flush_launch_config(256, 64, 64, 256)["block_p"] == 16
    assert host_flush_launch_config(4, 2, 8, 256)["block_p"] == 8  # a head of 8 rows: the whole head


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
def test_bench_smoke(tmp_path):
    # one row timed (the interpreter's time goes per program): every arm still runs; the bench's check keeps its rows
    data, stdout = run_bench_smoke("bench", ["--family", "mamba2", "--read-format", "nvfp4", "--diag",
                                             "--walks", "8:1:2:3,4:2:3:5", "--batches", "1"], tmp_path / "bench.json")
    assert data["results"], data
    row = data["results"][0]
    for key in ("replay_mixed_us", "replay_in_phase_us", "standard_us", "torch_us", "speedup_replay_vs_standard",
                *(f"replay_{arm}_read_copy_us" for arm in ("host", "mixed", "in_phase")),
                "replay_mixed_read_copy_no_reencode_us", "speedup_replay_in_phase_read_copy_vs_standard",
                "replay_host_read_copy_nvfp4_nibbles_us", "replay_in_phase_read_copy_nvfp4_nibbles_us",
                "replay_mixed_read_copy_per_tile_reencode_us", "replay_in_phase_read_copy_per_tile_reencode_us",
                "replay_in_phase_read_copy_fused_us", "replay_host_read_copy_reencode_us",
                "replay_host_read_copy_external_reencode_us", "replay_host_read_copy_external_per_tile_reencode_us",
                "replay_in_phase_read_copy_external_reencode_us", "replay_mixed_read_copy_external_reencode_us",
                "replay_host_read_copy_flush_decoded_us", "replay_in_phase_read_copy_flush_decoded_us",
                "replay_host_read_copy_one_flush_launch_us", "replay_in_phase_read_copy_one_flush_launch_us",
                "replay_mixed_read_copy_one_flush_launch_us"):
        assert row[key] > 0, (key, row)
    assert data["checks"]["smoke"]["read_copy_mixed_ok"] and data["checks"]["smoke"]["ok"], data["checks"]
    assert data["checks"]["smoke"]["read_copy_nvfp4_nibbles_rel_err"] < 1e-6, data["checks"]
    assert "replay step" in stdout and "device-phase, mixed replay reading a nvfp4 copy" in stdout
    assert "one fused launch (the former default)" in stdout
    assert "as the cache runs it (the flush's outputs from the copy, the copy re-encoded after it)" in stdout
    assert "a flushing row's output and fold in one flush launch (_flush_outputs_launch=False" in stdout
    assert "its outputs decoding the whole copy tile (_flush_copy_product=False" in stdout
    # the host-phase flush launch runs at its own tile (host_flush_launch_config), printed with the host arm
    from hf_replayssm.kernels.mamba2 import host_flush_launch_config

    flush = host_flush_launch_config(row["batch"], row["heads"], row["head_dim"], row["d_state"])
    assert row["host_flush_default_config"] == f"p{flush['block_p']}w{flush['num_warps']}", row
    assert f"flush {row['host_flush_default_config']}]" in stdout
    # --diag: the host flush at its default and at the replay tile, and the host cycle walking the tiles
    L = row["buffer_len"]
    assert row["diag_host_phase_us"][f"count{L - 1}_flush"] > 0 and row["diag_host_phase_us"][
        f"count{L - 1}_flush_replay_tile"] > 0, row["diag_host_phase_us"]
    assert all(us > 0 for us in row["diag_host_walk_us"].values()), row
    assert set(row["diag_host_walk_us"]) == {"p8w1_s2_x3", "p4w2_s3_x5"}, row["diag_host_walk_us"]  # --walks
    assert "replay launches walking the tiles (_walk)" in stdout
    # the record-coefficient pre-launch, timed with host positions and as a device-phase variant, checked on the way
    assert row["replay_host_weights_us"] > 0 and row["replay_mixed_weights_us"] > 0, row
    assert all(check["variants_equal_default"]["weights"] for check in data["checks"].values())
    assert "record coefficients from a pre-launch (_weights)" in stdout


def test_parse_walks():
    """--walks: tile:warps:stages:programs_per_sm items, the default list when absent, a clear error otherwise."""
    from hf_replayssm.kernels.bench_common import parse_walks

    default = [(32, 2, 2, 4)]
    assert parse_walks(None, default) == default and parse_walks("", default) == default
    assert parse_walks("16:1:2:8,32:2:3:4", default) == [(16, 1, 2, 8), (32, 2, 3, 4)]
    for bad in ("16:1:2", "16:1:2:0", "a:1:2:3", "16:1:2:3,"):
        with pytest.raises(ValueError, match="tile:warps:stages:programs_per_sm"):
            parse_walks(bad, default)


# ---------------------------------------------------------------------------------------------------------------
# worker side (runs in the subprocess)


def _make(device, dtype, batch, heads, groups, head_dim, d_state, ring, *, seed=0, options=True):
    """Random step inputs; ``options`` adds D, z and dt_bias (dt raw, softplus on)."""
    import torch

    g = torch.Generator().manual_seed(seed)

    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(device)

    p = dict(
        state=rnd(batch, heads, head_dim, d_state),
        ring_x=rnd(batch, ring, heads, head_dim).to(dtype),
        ring_dt=(torch.rand(batch, ring, heads, generator=g) * 0.9 + 0.05).to(device),
        ring_B=rnd(batch, ring, groups, d_state).to(dtype),
        x=rnd(batch, heads, head_dim).to(dtype),
        B=rnd(batch, groups, d_state).to(dtype),
        C=rnd(batch, groups, d_state).to(dtype),
        A=-(torch.rand(heads, generator=g) * 2 + 0.2).to(device),
    )
    if options:
        p.update(dt=rnd(batch, heads), D=rnd(heads), z=rnd(batch, heads, head_dim).to(dtype),
                 dt_bias=rnd(heads, scale=0.5), dt_softplus=True)
    else:
        p.update(dt=(torch.rand(batch, heads, generator=g) * 0.9 + 0.05).to(device))
    return p


def _cfg(block_p, num_warps=4, fold_unroll=None):
    """Launch configuration override for ``_replay_step`` / ``_state_update``."""
    cfg = dict(block_p=block_p, num_warps=num_warps)
    return cfg if fold_unroll is None else dict(cfg, fold_unroll=fold_unroll)


def _clone(p):
    return {k: (v.clone() if hasattr(v, "clone") else v) for k, v in p.items()}


def _replay_args(p, origin, count):
    keys = ["state", "ring_x", "ring_dt", "ring_B"]
    rest = {k: v for k, v in p.items() if k not in keys}
    return [p[k] for k in keys] + [origin, count], rest


def _poison(p, origins, counts, ring):
    """NaN in every ring slot outside each row's committed window: such slots must never reach an output."""
    for b in range(len(counts)):
        committed = {(origins[b] + j) % ring for j in range(counts[b])}
        for slot in set(range(ring)) - committed:
            for name in ("ring_x", "ring_dt", "ring_B"):
                p[name][b, slot] = float("nan")


def _check_replay(k, device, dtype, buffer_len, ring, origins, counts, configs, options, rel, poison=False,
                  splits=(None,), launch=None):
    import torch

    batch = len(counts)
    for config, split in [(c, sp) for c in configs for sp in splits]:
        p = _make(device, dtype, batch, heads=4, groups=2, head_dim=24, d_state=20, ring=ring, options=options)
        origin = torch.tensor(origins, dtype=torch.int32, device=device)
        count = torch.tensor(counts, dtype=torch.int32, device=device)
        if poison:
            _poison(p, origins, counts, ring)
        q, origin_ref, count_ref = _clone(p), origin.clone(), count.clone()
        args, kw = _replay_args(p, origin, count)
        out = torch.empty(p["x"].shape, dtype=torch.float32, device=device)  # fp32 output: compare before rounding
        y = k._replay_step(*args, **kw, buffer_len=buffer_len, out=out, _config=config, _split=split, **(launch or {}))
        args_ref, kw_ref = _replay_args(q, origin_ref, count_ref)
        y_ref = k.mamba2_replay_step_ref(*args_ref, **kw_ref, buffer_len=buffer_len, out=torch.empty_like(out))
        print(f" config={config} split={split} {launch or ''} counts={counts} origins={origins}")
        assert y is out
        _close("y", y, y_ref, rel)
        _close("state", p["state"], q["state"], 1e-6)
        for name in ("ring_x", "ring_B"):  # records are copied as is
            torch.testing.assert_close(p[name], q[name], rtol=0, atol=0, equal_nan=True)
        _close("ring_dt", p["ring_dt"].nan_to_num(), q["ring_dt"].nan_to_num(), 1e-6)  # softplus: within an ulp
        assert torch.equal(count, count_ref) and torch.equal(origin, origin_ref), (count, count_ref)
        if config != configs[0] or split != splits[0]:
            continue
        # default output dtype = x's dtype
        p2 = _make(device, dtype, batch, 4, 2, 24, 20, ring, options=options)
        args2, kw2 = _replay_args(p2, origin.clone().fill_(0), torch.tensor(counts, dtype=torch.int32, device=device))
        assert k._replay_step(*args2, **kw2, buffer_len=buffer_len, _config=config).dtype == dtype


def case_replay_mixed_bf16(k, device):
    """bf16 inputs, D/z/dt_bias, counts 0..L-1 in one launch (rows flush and replay together), minimal ring
    R = L - 1 with origins near R - 1 (wrap-around); P=24, N=20 (non powers of two), H=4 > G=2; dot and non-dot
    BLOCK_P 16 / 8; uncommitted ring slots hold NaN; the step as two launches (flush-only, then replay-only with the
    count update) and as one fused launch."""
    import torch

    L = 6
    _check_replay(k, device, torch.bfloat16, L, ring=L - 1, origins=[4, 3, 4, 2, 4, 1], counts=[0, 1, 2, 3, 4, 5],
                  configs=[_cfg(16), _cfg(8, 2, fold_unroll=1)], options=True, rel=2e-6, poison=True,
                  splits=(True, False))


def case_replay_launch_variants(k, device):
    """The device-phase step's launch variants: counts advanced by a launch of their own instead of the tickets,
    records in logical order instead of by physical slot, the flush launch on the batch-sized grid (the default at
    this batch is the device-sized one), each split and fused, and the split step's batch-grid flush launch on a
    tile of its own (``_flush_config``: [16, .] where the replay launch takes [8, .]), against the reference
    (uncommitted ring slots hold NaN)."""
    import torch

    L = 6
    for launch in (dict(_count_launch=True), dict(_ring_physical=False),
                   dict(_count_launch=True, _ring_physical=False), dict(_flush_grid="batch")):
        _check_replay(k, device, torch.bfloat16, L, ring=L - 1, origins=[4, 3, 4, 2, 4, 1], counts=[0, 1, 2, 3, 4, 5],
                      configs=[_cfg(16)], options=True, rel=2e-6, poison=True, splits=(True, False), launch=launch)
    _check_replay(k, device, torch.bfloat16, L, ring=L - 1, origins=[4, 3, 4, 2, 4, 1], counts=[0, 5, 2, 5, 4, 5],
                  configs=[_cfg(8, 2)], options=True, rel=2e-6, poison=True, splits=(True,),
                  launch=dict(_flush_grid="batch", _flush_config=dict(block_p=16, num_warps=2)))


def case_flush_device_grid(k, device):
    """The split step's flush launch on a device-sized grid (``_flush_grid="device"``: a few programs walk the due
    rows' tiles) gives the bits of the batch-sized one, state and output, with no row due, one, several and all
    (more items than programs, so each program walks several; bf16 with D/z/dt_bias, NaN in uncommitted slots);
    past ``kernels.flush_grid.MAX_BATCH`` rows the batch grid serves; a wrong name is refused."""
    import torch

    L, R = 5, 4
    for counts in ([0, 1, 2, 3, 0, 1], [0, 4, 2, 3, 1, 1], [4, 1, 4, 3, 4, 0], [4] * 6):
        origins = [3, 0, 2, 1, 3, 2]
        runs = {}
        for grid in ("batch", "device"):
            p = _make(device, torch.bfloat16, len(counts), heads=4, groups=2, head_dim=24, d_state=20, ring=R,
                      options=True)
            _poison(p, origins, counts, R)
            count = torch.tensor(counts, dtype=torch.int32, device=device)
            args, kw = _replay_args(p, torch.tensor(origins, dtype=torch.int32, device=device), count)
            y = k._replay_step(*args, **kw, buffer_len=L, out=torch.empty(p["x"].shape, device=device),
                               _config=_cfg(8, 2), _split=True, _flush_grid=grid)
            runs[grid] = (y, p["state"], count)
        print(f" counts={counts}: device grid == batch grid")
        # the checkpoint is a sequential fold, element by element: the same bits at any tile; y reduces over N in
        # each tile's layout, which a GPU may order differently at the device grid's own tile
        assert torch.equal(runs["device"][1], runs["batch"][1]) and torch.equal(runs["device"][2], runs["batch"][2])
        if str(device) == "cpu":
            assert torch.equal(runs["device"][0], runs["batch"][0])
        _close("y, device grid", runs["device"][0], runs["batch"][0], 1e-6)
        due = [b for b, c in enumerate(counts) if c + 1 >= L]
        assert torch.isfinite(runs["device"][0]).all() and (not due or "flush_due" in k.LAST_COMPILED)
    # past kernels.flush_grid.MAX_BATCH rows the batch-sized grid serves (the same bits)
    from hf_replayssm.kernels import flush_grid

    limit, flush_grid.MAX_BATCH = flush_grid.MAX_BATCH, 4
    try:
        k.LAST_COMPILED.pop("flush_due", None)
        counts = [4, 1, 4, 3, 4, 0]
        p = _make(device, torch.float32, 6, heads=4, groups=2, head_dim=24, d_state=20, ring=R, options=False)
        q = _clone(p)
        outs = []
        for grid, params in (("device", p), ("batch", q)):
            args, kw = _replay_args(params, torch.zeros(6, dtype=torch.int32, device=device),
                                    torch.tensor(counts, dtype=torch.int32, device=device))
            outs.append(k._replay_step(*args, **kw, buffer_len=L, _split=True, _flush_grid=grid))
        assert "flush_due" not in k.LAST_COMPILED and torch.equal(outs[0], outs[1])
        assert torch.equal(p["state"], q["state"])
    finally:
        flush_grid.MAX_BATCH = limit
    # the default: the device-sized grid up to kernels.mamba2.DEVICE_GRID_MAX_BATCH rows, the batch-sized one past it
    limit = k.DEVICE_GRID_MAX_BATCH
    assert k.default_flush_grid(limit) == "device" and k.default_flush_grid(limit + 1) == "batch"
    k.LAST_COMPILED.pop("flush_due", None)
    p = _make(device, torch.float32, 6, heads=4, groups=2, head_dim=24, d_state=20, ring=R, options=False)
    args, kw = _replay_args(p, torch.zeros(6, dtype=torch.int32, device=device),
                            torch.tensor([4, 1, 4, 3, 4, 0], dtype=torch.int32, device=device))
    k._replay_step(*args, **kw, buffer_len=L)
    assert "flush_due" in k.LAST_COMPILED
    p = _make(device, torch.float32, 2, heads=4, groups=2, head_dim=24, d_state=20, ring=R, options=False)
    args, kw = _replay_args(p, torch.zeros(2, dtype=torch.int32, device=device),
                            torch.zeros(2, dtype=torch.int32, device=device))
    with pytest.raises(ValueError, match="_flush_grid"):
        k._replay_step(*args, **kw, buffer_len=L, _flush_grid="persistent")
    # the device-grid flush on a smaller tile with more programs per multiprocessor (_flush_config): the checkpoint
    # bits of the batch grid at the replay tile; a grid of no programs is refused
    counts, origins = [4, 1, 4, 3, 4, 0], [3, 0, 2, 1, 3, 2]
    runs = []
    for launch in (dict(_flush_grid="batch"),
                   dict(_flush_grid="device", _flush_config=dict(block_p=4, num_warps=1, programs_per_sm=24))):
        p = _make(device, torch.bfloat16, 6, heads=4, groups=2, head_dim=24, d_state=20, ring=R, options=True)
        _poison(p, origins, counts, R)
        args, kw = _replay_args(p, torch.tensor(origins, dtype=torch.int32, device=device),
                                torch.tensor(counts, dtype=torch.int32, device=device))
        runs.append((k._replay_step(*args, **kw, buffer_len=L, out=torch.empty(p["x"].shape, device=device),
                                    _config=_cfg(8, 2), _split=True, **launch), p["state"]))
    assert torch.equal(runs[0][1], runs[1][1])
    _close("y, device grid [4, .] x 1", runs[1][0], runs[0][0], 1e-6)
    with pytest.raises(ValueError, match="programs_per_sm"):
        k._replay_step(*args, **kw, buffer_len=L, _split=True, _flush_grid="device",
                       _flush_config=dict(programs_per_sm=0))


def case_flush_one_round_trip(k, device):
    """A flush reading all its records in one round trip (``fold_unroll=16`` >= every count; for the device-grid
    flush alone through ``_flush_config``, where it needs no more registers at sm_90): against the reference in every
    launch that folds sequentially (fused and split device steps, both flush grids), and the same checkpoint and
    output bits as four at a time on the CPU (the device-grid flush, the host-phase loop flush); the slots past each
    row's window hold NaN, loaded by the unrolled reads and discarded."""
    import torch

    L, R = 6, 5
    origins, counts = [4, 3, 0, 2, 4, 1], [5, 1, 5, 3, 5, 0]
    forms = [dict(_split=False), dict(_split=True, _flush_grid="batch"), dict(_split=True, _flush_grid="device")]
    for form in forms:
        _check_replay(k, device, torch.bfloat16, L, ring=R, origins=origins, counts=counts, configs=[_cfg(8, 2, 16)],
                      options=True, rel=2e-6, poison=True, splits=(form["_split"],),
                      launch={key: value for key, value in form.items() if key != "_split"})
    # bit for bit against four at a time: the device-grid flush through _config and through _flush_config (the
    # other forms' sixteen-record reads are checked against the reference above)
    pairs = [(forms[2], dict(_config=_cfg(8, 2, 4))), (forms[2], dict(_config=_cfg(8, 2, 16))),
             (forms[2], dict(_config=_cfg(8, 2, 4), _flush_config=dict(fold_unroll=16)))]
    runs = {}
    for form, launch in pairs:
        p = _make(device, torch.bfloat16, len(counts), heads=4, groups=2, head_dim=24, d_state=20, ring=R, options=True)
        _poison(p, origins, counts, R)
        args, kw = _replay_args(p, torch.tensor(origins, dtype=torch.int32, device=device),
                                torch.tensor(counts, dtype=torch.int32, device=device))
        y = k._replay_step(*args, **kw, buffer_len=L, out=torch.empty(p["x"].shape, device=device), **form, **launch)
        assert torch.isfinite(p["state"]).all() and torch.isfinite(y).all()
        runs.setdefault(str(form), []).append((y, p["state"]))
    for form, results in runs.items():
        (y4, s4), *others = results
        for y, state in others:  # every flush that read its records at once against the four-at-a-time one
            assert torch.equal(state, s4), form
            if str(device) == "cpu":
                assert torch.equal(y, y4), form
    # host positions, every row flushing, the sequential (loop) flush form
    outs = []
    for unroll in (4, 16):
        p = _make(device, torch.float32, 3, heads=4, groups=2, head_dim=24, d_state=20, ring=R, options=False)
        args, kw = _replay_args(p, 2, L - 1)
        outs.append((k._replay_step(*args, **kw, buffer_len=L, _config=dict(_cfg(8, 2, unroll), flush_loop=True)),
                     p["state"]))
    assert torch.equal(outs[0][1], outs[1][1]) and torch.equal(outs[0][0], outs[1][0])


def case_replay_fp32_plain(k, device):
    """fp32 inputs, no D/z/dt_bias/softplus, ring larger than needed (R=7 for L=5), strided (non-contiguous) state,
    and a count that is not in order."""
    import torch

    L, R = 5, 7
    _check_replay(k, device, torch.float32, L, ring=R, origins=[6, 5, 0, 6, 3], counts=[4, 3, 0, 2, 1],
                  configs=[_cfg(32, fold_unroll=3), _cfg(16, 2)], options=False, rel=2e-6)
    # strided views: state as a permuted slice of a pool, x/B/C/dt as slices of one projection
    batch, H, G, P, N = 3, 4, 2, 24, 20
    p = _make(device, torch.float32, batch, H, G, P, N, R, options=True)
    pool = torch.randn(batch + 2, H, N, P, device=device)
    state = pool[1 : batch + 1].transpose(-1, -2)
    state.copy_(p["state"])
    proj = torch.randn(batch, H * P + 2 * G * N + H + 5, device=device)
    x = proj[:, : H * P].view(batch, H, P)
    Bv = proj[:, H * P : H * P + G * N].view(batch, G, N)
    Cv = proj[:, H * P + G * N : H * P + 2 * G * N].view(batch, G, N)
    dtv = proj[:, H * P + 2 * G * N : H * P + 2 * G * N + H]
    p.update(x=x, B=Bv, C=Cv, dt=dtv)
    assert not state.is_contiguous()
    origin = torch.tensor([6, 2, 5], dtype=torch.int32, device=device)
    count = torch.tensor([4, 1, 3], dtype=torch.int32, device=device)
    q = _clone(p)
    q["state"] = state.clone()
    oref, cref = origin.clone(), count.clone()
    p["state"] = state
    args, kw = _replay_args(p, origin, count)
    y = k._replay_step(*args, **kw, buffer_len=L, _config=_cfg(16))
    args, kw = _replay_args(q, oref, cref)
    y_ref = k.mamba2_replay_step_ref(*args, **kw, buffer_len=L)
    print(" strided views")
    _close("y", y, y_ref, 2e-6)
    _close("state", pool[1 : batch + 1].transpose(-1, -2), q["state"], 1e-6)
    assert torch.equal(count, cref)


def case_state_update(k, device):
    """Standard step: bf16 and fp32 inputs, options present/absent, several BLOCK_P, strided state and out."""
    import torch

    for dtype, options, block_p in [(torch.bfloat16, True, 4), (torch.float32, False, 16), (torch.float32, True, 32)]:
        p = _make(device, dtype, 2, 4, 2, 24, 20, 1, options=options)
        for key in ("ring_x", "ring_dt", "ring_B"):
            p.pop(key)
        q = _clone(p)
        state = p.pop("state")
        out = torch.empty(p["x"].shape, dtype=torch.float32, device=device)
        y = k._state_update(state, **p, out=out, _config=_cfg(block_p))
        ref_state = q.pop("state")
        y_ref = k.mamba2_state_update_ref(ref_state, **q, out=torch.empty_like(out))
        print(f" dtype={dtype} options={options} block_p={block_p}")
        _close("y", y, y_ref, 2e-6)
        _close("state", state, ref_state, 1e-6)
    # strided state (permuted pool slice) through the public entry point, bf16 output
    p = _make(device, torch.bfloat16, 2, 4, 2, 24, 20, 1, options=True)
    pool = torch.zeros(4, 4, 20, 24, device=device)
    state = pool[1:3].transpose(-1, -2)
    state.copy_(p["state"])
    ref_state = p["state"].clone()
    rest = {kk: v for kk, v in p.items() if kk not in ("state", "ring_x", "ring_dt", "ring_B")}
    y = k.mamba2_state_update(state, **rest)
    y_ref = k.mamba2_state_update_ref(ref_state, **rest)
    assert y.dtype == torch.bfloat16
    _close("y strided (bf16)", y.float(), y_ref.float(), 8e-3)
    _close("state strided", state, ref_state, 1e-6)
    assert pool[0].abs().max() == 0 and pool[3].abs().max() == 0


def case_sequence(k, device):
    """2L+3 consecutive steps of the replay kernel == the same steps of the standard kernel and of the sequential
    recurrence (fp32): outputs within 1e-4 relative, checkpoint after the last flush within 1e-5. Row 0 starts with
    an empty ring, row 1 with one record already buffered (so the rows flush on different steps), ring of the
    minimal capacity L - 1 starting at its last slot (wrap-around)."""
    import torch

    from hf_replayssm.ops.mamba2 import ssd_step_reference
    from hf_replayssm.ops.mamba2_step import mamba2_dt

    L, H, G, P, N = 4, 4, 2, 24, 20
    steps, R, batch = 2 * L + 3, L - 1, 2
    g = torch.Generator().manual_seed(1)
    A = -(torch.rand(H, generator=g) * 1.5 + 0.1)
    D, dt_bias = torch.randn(H, generator=g), torch.randn(H, generator=g) * 0.5
    S0 = torch.randn(batch, H, P, N, generator=g)
    # tokens 0..steps; row 1 has token 0 already in its ring, row 0 starts at token 1
    xs = torch.randn(batch, steps + 1, H, P, generator=g)
    dts = torch.randn(batch, steps + 1, H, generator=g)
    Bs = torch.randn(batch, steps + 1, G, N, generator=g)
    Cs = torch.randn(batch, steps + 1, G, N, generator=g)
    zs = torch.randn(batch, steps + 1, H, P, generator=g)
    dev = {n: t.to(device) for n, t in dict(A=A, D=D, dt_bias=dt_bias).items()}

    ckpt = S0.clone().to(device)
    ring_x = torch.zeros(batch, R, H, P, device=device)
    ring_dt = torch.zeros(batch, R, H, device=device)
    ring_B = torch.zeros(batch, R, G, N, device=device)
    origin = torch.full((batch,), R - 1, dtype=torch.int32, device=device)
    count = torch.tensor([0, 1], dtype=torch.int32, device=device)
    ring_x[1, R - 1], ring_B[1, R - 1] = xs[1, 0].to(device), Bs[1, 0].to(device)
    ring_dt[1, R - 1] = mamba2_dt(dts[1, 0], dt_bias, True).to(device)
    # row 1's reference and standard-kernel state start one token earlier
    std_state = S0.clone()
    _, s1 = ssd_step_reference(S0[1:2], xs[1:2, :1], mamba2_dt(dts[1:2, :1], dt_bias, True), Bs[1:2, :1],
                               Cs[1:2, :1], A)
    std_state[1] = s1[0]
    std_state = std_state.to(device)
    ref_state = std_state.clone().cpu()

    last_flush_state = [None, None]
    for t in range(1, steps + 1):
        tok = dict(x=xs[:, t], dt=dts[:, t], B=Bs[:, t], C=Cs[:, t], z=zs[:, t])
        tok_dev = {n: v.to(device) for n, v in tok.items()}
        flushing = (count + 1 >= L).cpu().tolist()
        y = k.mamba2_replay_step(ckpt, ring_x, ring_dt, ring_B, origin, count, **tok_dev, **dev, dt_softplus=True,
                                 buffer_len=L)
        y_std = k.mamba2_state_update(std_state, **tok_dev, **dev, dt_softplus=True)
        dtp = mamba2_dt(tok["dt"], dt_bias, True)
        y_seq, ref_state = ssd_step_reference(ref_state, tok["x"][:, None], dtp[:, None], tok["B"][:, None],
                                              tok["C"][:, None], A, D)
        y_seq = y_seq[:, 0] * torch.nn.functional.silu(tok["z"])
        print(f" step {t}: flush rows {[b for b in range(batch) if flushing[b]]}, count -> {count.tolist()}")
        _close("y vs sequential", y.cpu(), y_seq, 1e-4)
        _close("y vs standard kernel", y.cpu(), y_std.cpu(), 1e-4)
        _close("standard state vs sequential", std_state.cpu(), ref_state, 1e-5)
        for b in range(batch):
            if flushing[b]:
                last_flush_state[b] = ref_state[b].clone()
    assert all(s is not None for s in last_flush_state)
    for b in range(batch):
        _close(f"row {b} checkpoint after its last flush", ckpt[b].cpu(), last_flush_state[b], 1e-5)
    assert count.tolist() == [(steps) % L, (steps + 1) % L]
    assert origin.tolist() == [R - 1, R - 1]


def case_buffer_len_one(k, device):
    """buffer_len=1: every step flushes (count stays 0), writes no record and equals the standard kernel."""
    import torch

    for block_p in (16, 8):
        p = _make(device, torch.bfloat16, 2, 4, 2, 24, 20, 1, options=True)
        origin = torch.zeros(2, dtype=torch.int32, device=device)
        count = torch.zeros(2, dtype=torch.int32, device=device)
        state_std = p["state"].clone()
        rest = {kk: v for kk, v in p.items() if kk not in ("state", "ring_x", "ring_dt", "ring_B")}
        ring_before = [p[name].clone() for name in ("ring_x", "ring_dt", "ring_B")]
        for _ in range(2):
            out = torch.empty(p["x"].shape, dtype=torch.float32, device=device)
            y = k._replay_step(p["state"], p["ring_x"], p["ring_dt"], p["ring_B"], origin, count, **rest,
                               buffer_len=1, out=out, _config=_cfg(block_p))
            y_std = k._state_update(state_std, **rest, out=torch.empty_like(out), _config=_cfg(block_p))
            print(f" block_p={block_p}")
            _close("y", y, y_std, 1e-6)
            _close("state", p["state"], state_std, 1e-6)
            assert count.tolist() == [0, 0]
        for before, name in zip(ring_before, ("ring_x", "ring_dt", "ring_B"), strict=True):
            assert torch.equal(before, p[name]), f"{name} written although every step flushes"


def case_host_phase(k, device):
    """Host-int positions (every row at one position: the phase-specialised kernels) == the reference with those
    positions as per-row tensors, for every count 0..L-1 (replay-only and flush-only programs), ring wrap-around,
    bf16 inputs with D/z/dt_bias; nothing is advanced on the host side. Also the device-phase kernel reads the ring
    in physical and in logical order with the same result."""
    import torch

    L, R, batch = 6, 5, 3
    for count in range(L):
        origin = (3 * count + 2) % R
        p = _make(device, torch.bfloat16, batch, 4, 2, 24, 20, R, seed=count, options=True)
        q = _clone(p)
        args, kw = _replay_args(p, origin, count)
        out = torch.empty(p["x"].shape, dtype=torch.float32, device=device)
        y = k._replay_step(*args, **kw, buffer_len=L, out=out)
        args_ref, kw_ref = _replay_args(q, torch.full((batch,), origin, dtype=torch.int32, device=device),
                                        torch.full((batch,), count, dtype=torch.int32, device=device))
        y_ref = k.mamba2_replay_step_ref(*args_ref, **kw_ref, buffer_len=L, out=torch.empty_like(out))
        print(f" host phase: origin={origin} count={count}")
        _close("y", y, y_ref, 2e-6)
        _close("state", p["state"], q["state"], 1e-6)
        for name in ("ring_x", "ring_B"):
            assert torch.equal(p[name], q[name]), name
        _close("ring_dt", p["ring_dt"], q["ring_dt"], 1e-6)
    # the flush-only launch on a tile of its own (host_flush_launch_config's smaller P tile: two per head, the last
    # one masked), against the reference
    origin = 1
    p = _make(device, torch.bfloat16, batch, 4, 2, 24, 20, R, seed=11, options=True)
    q = _clone(p)
    args, kw = _replay_args(p, origin, L - 1)
    out = torch.empty(p["x"].shape, dtype=torch.float32, device=device)
    y = k._replay_step(*args, **kw, buffer_len=L, out=out, _flush_config=dict(block_p=16, num_warps=2))
    full = [torch.full((batch,), x, dtype=torch.int32, device=device) for x in (origin, L - 1)]
    args_ref, kw_ref = _replay_args(q, *full)
    y_ref = k.mamba2_replay_step_ref(*args_ref, **kw_ref, buffer_len=L, out=torch.empty_like(out))
    print(" host phase flush on its own tile")
    _close("y", y, y_ref, 2e-6)
    _close("state", p["state"], q["state"], 1e-6)
    origins, counts = [4, 0, 2], [3, 0, 4]
    results = []
    for physical in (True, False):
        p = _make(device, torch.float32, batch, 4, 2, 24, 20, R, seed=9, options=True)
        origin = torch.tensor(origins, dtype=torch.int32, device=device)
        count = torch.tensor(counts, dtype=torch.int32, device=device)
        args, kw = _replay_args(p, origin, count)
        results.append((k._replay_step(*args, **kw, buffer_len=L, _ring_physical=physical), p["ring_x"], count))
    print(" ring read order")
    _close("y physical vs logical", results[0][0], results[1][0], 1e-6)
    assert torch.equal(results[0][1], results[1][1]) and torch.equal(results[0][2], results[1][2])


def _assert_launch_unchanged(k, device, launch, L, R, origins, counts, seed, options=True, **common):
    """The step with and without the launch override ``launch`` on the same fresh inputs (bf16, [24, 20] heads in two
    P tiles of 16, the last masked): outputs, checkpoint and rings equal, bit for bit on the CPU (within 2e-6 on
    CUDA), the output finite. ``origins`` / ``counts``: host ints (3 rows), or per-row lists (device positions,
    NaN in uncommitted slots; the counts after the step equal too). Returns the launch's inputs as made (for a
    reference), its output and its counts after the step."""
    import torch

    device_positions = isinstance(counts, list)
    batch = len(counts) if device_positions else 3
    runs = []
    for extra in ({}, launch):
        p = _make(device, torch.bfloat16, batch, 4, 2, 24, 20, R, seed=seed, options=options)
        if device_positions:
            _poison(p, origins, counts, R)
        fresh = _clone(p)
        origin, count = ((torch.tensor(origins, dtype=torch.int32, device=device),
                          torch.tensor(counts, dtype=torch.int32, device=device)) if device_positions
                         else (origins, counts))
        args, kw = _replay_args(p, origin, count)
        out = torch.empty(p["x"].shape, dtype=torch.float32, device=device)
        runs.append((k._replay_step(*args, **kw, buffer_len=L, out=out, _config=_cfg(16), **common, **extra), p,
                     count))
    (y, p, count), (y_var, p_var, count_var) = runs
    exact = dict(rtol=0, atol=0) if device == "cpu" else dict(rtol=2e-6, atol=2e-6)
    exact["equal_nan"] = device_positions  # the poisoned slots stay NaN in both
    assert torch.isfinite(y_var).all()
    if device_positions:
        assert torch.equal(count_var, count)
    torch.testing.assert_close(y_var, y, **exact)
    for name in ("state", "ring_x", "ring_dt", "ring_B"):
        torch.testing.assert_close(p_var[name], p[name], **exact)
    return fresh, y_var, count_var


def case_replay_weights(k, device):
    """``_weights`` (a per-(row, head) launch computes the records' coefficients once; the replay programs read them):
    the outputs and rings of the launch without it, bit for bit on the CPU (within 2e-6 on CUDA), bf16 with D / z /
    dt_bias and without them, two P tiles per head (the last masked): host positions at every replaying count, and a
    split step with rows in mixed phases (some due, NaN in uncommitted slots, ring wrap-around) with count tickets
    and with the count launch, also against the reference; the launches it cannot serve are refused. (With a read
    copy: ``tests/test_kernels_read_copy.py``, case ``mamba2_copy_tiles``.)"""
    import torch

    L, R, batch = 6, 5, 3
    for options in (True, False):
        for count in range(L - 1):
            print(f" weights: options={options} count={count}")
            _assert_launch_unchanged(k, device, dict(_weights=True), L, R, (3 * count + 2) % R, count, seed=count,
                                     options=options)
    assert "weights" in k.LAST_COMPILED
    origins, counts = [4, 3, 0, 2, 4, 1], [5, 1, 5, 3, 0, 4]
    for count_launch in (False, True):
        print(f" weights, device positions: counts={counts} count launch {count_launch}")
        ref, y_w, count = _assert_launch_unchanged(k, device, dict(_weights=True), L, R, origins, counts, seed=5,
                                                   _split=True, _ring_physical=False, _count_launch=count_launch)
        assert count.tolist() == [0 if c + 1 >= L else c + 1 for c in counts]
        args_ref, kw_ref = _replay_args(ref, torch.tensor(origins, dtype=torch.int32, device=device),
                                        torch.tensor(counts, dtype=torch.int32, device=device))
        y_ref = k.mamba2_replay_step_ref(*args_ref, **kw_ref, buffer_len=L, out=torch.empty_like(y_w))
        _close("y", y_w, y_ref, 2e-6)
    p = _make(device, torch.float32, batch, 4, 2, 24, 20, R, options=False)
    positions = [torch.zeros(batch, dtype=torch.int32, device=device), torch.ones(batch, dtype=torch.int32,
                                                                                  device=device)]
    for extra in (dict(_split=False), dict(_split=True, _count_launch=True, _walk=dict(programs_per_sm=2))):
        args, kw = _replay_args(p, *positions)
        with pytest.raises(ValueError, match="_weights"):
            k._replay_step(*args, **kw, buffer_len=L, _weights=True, **extra)


def case_replay_walk(k, device):
    """``_walk`` (replay-only launches on a device-sized grid walking the tiles, loads pipelined): the outputs and
    rings of the per-tile launch, bit for bit on the CPU (within 2e-6 on CUDA), bf16 with D/z/dt_bias, two P tiles
    per head (the last masked), pipelines 2 and 3 deep: with host positions at every replaying count, and as a split
    step's replay launch with the counts advanced by their own launch (rows in mixed phases, some due, NaN in
    uncommitted slots); the launches it cannot serve are refused."""
    import torch

    L, R, batch = 6, 5, 3
    walks = (dict(programs_per_sm=2, num_stages=2), dict(programs_per_sm=3, num_stages=3))
    for count in range(L - 1):
        for walk in walks:
            print(f" walk: count={count} {walk}")
            _assert_launch_unchanged(k, device, dict(_walk=walk), L, R, (3 * count + 2) % R, count, seed=count)
    assert "replay_phase1" in k.LAST_COMPILED
    origins, counts = [4, 3, 0, 2, 4, 1], [5, 1, 5, 3, 0, 4]
    for walk in walks:
        print(f" walk, device positions: counts={counts} {walk}")
        _assert_launch_unchanged(k, device, dict(_walk=walk), L, R, origins, counts, seed=5, _split=True,
                                 _count_launch=True)
    p = _make(device, torch.float32, batch, 4, 2, 24, 20, R, options=False)
    for count, walk in ((L - 1, {}), (1, dict(stages=2))):
        args, kw = _replay_args(p, 0, count)
        with pytest.raises(ValueError, match="_walk"):
            k._replay_step(*args, **kw, buffer_len=L, _walk=walk)
    args, kw = _replay_args(p, torch.zeros(batch, dtype=torch.int32, device=device),
                            torch.ones(batch, dtype=torch.int32, device=device))
    with pytest.raises(ValueError, match="_count_launch"):  # device positions: tickets would need every program
        k._replay_step(*args, **kw, buffer_len=L, _split=True, _walk={})


if __name__ == "__main__":
    worker_main("mamba2", globals(), sys.argv[1])
