"""Speculative verify / commit kernels (``hf_replayssm.kernels.mamba2_verify`` and ``.delta_verify``) against their
torch references, and the property exact speculation rests on: verifying a window, committing an accepted prefix and
stepping on gives the outputs and checkpoints of one-token-at-a-time decoding.

Kernel checks run in subprocesses (this file executed as a script) with ``TRITON_INTERPRET=1`` on CPU tensors, as in
``tests/test_kernels_mamba2.py``; ``REPLAYSSM_KERNEL_TEST_DEVICE=cuda`` runs them on a GPU, where the bitwise
checkpoint comparisons are relaxed to 1e-5 as for the delta rule: on the H200 (run 77) the fused step's flush and the
standard step kernel came out one ulp apart (2.4e-7), the compiler contracting the same expression into FMAs
differently in the two kernels. The references' own sequence checks run in-process. Shapes are tiny; the default set
takes about 75 s of CPU, the ``slow`` variants (8-token windows, buffer length 8, and the benchmark's smoke run)
about two minutes more.

Tolerances: outputs of replayed tokens are compared with 1e-4 x max(|ref|, 1) like the replay-step tests (the replay
sums the same terms in a different order than stepping); kernel vs reference within 2e-6 (outputs), 1e-5 (delta d's) and
one ulp-level 1e-6 (ring dt, checkpoints: numpy's and torch's exp/softplus differ in the last bit). Mamba-2 checkpoints
after a commit are compared bitwise with the standard step kernel (same sequential expression; within 1e-5 on CUDA, see
above); gated delta rule checkpoints within 1e-5, because the d's of the two paths are computed from different
checkpoint/ring splits (and the one-token replay step's flush uses the unrolled sum); their commit is checked to be
split-invariant bitwise instead.
"""

from __future__ import annotations

import functools
import subprocess
import sys

import pytest
import torch
from kernel_harness import HAS_TRITON, ROOT, run_bench_smoke, run_case, subprocess_env, worker_main
from kernel_harness import assert_close as _close

CASES = ["mamba2_verify_bf16", "mamba2_verify_products", "mamba2_verify_fp32_and_commit", "mamba2_speculation",
         "mamba2_fold_ring", "delta_verify_gdn_bf16", "delta_verify_products", "delta_verify_kda_and_commit",
         "delta_speculation_gdn", "delta_speculation_kda", "delta_fold_ring", "mamba2_speculation_products",
         "delta_speculation_products", "delta_verify_steps", "delta_speculation_steps", "delta_commit_fold_dot",
         "delta_speculation_fold_dot", "delta_default_fold", "delta_verify_kda_weights"]
SLOW_CASES = ["mamba2_speculation_long", "delta_speculation_gdn_long", "delta_speculation_kda_long"]


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
@pytest.mark.parametrize("case", CASES)
def test_kernel(case):
    run_case(__file__, case)


@pytest.mark.slow
@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
@pytest.mark.parametrize("case", SLOW_CASES)
def test_kernel_slow(case):
    run_case(__file__, case)


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
def test_delta_verify_form_and_launch_rules():
    """The delta verify's default form (tokens up to 2-token windows, steps from 3; an explicit form wins; two forms
    at once refuse) and its launches as measured on the H200 at batch 256 (runs 84-86): tokens [128, 64] x 2, steps
    [128, 32] x 1, narrowing to [128, 16] from 7 tokens (scalar gate) / 5 (per-key gate), two warps for K = 256 (one
    spills at sm_90); the explicit token form for longer windows keeps the earlier 4-warp tiles; small grids halve
    the tile down to 16."""
    from kernel_harness import load_kernel_module

    k = load_kernel_module("delta_verify")
    assert [k.default_form(t) for t in (1, 2, 3, 16)] == ["tokens", "tokens", "steps", "steps"]
    assert k.resolve_form(2) == (False, False) and k.resolve_form(4) == (False, True)
    assert k.resolve_form(4, products=False) == (False, False) and k.resolve_form(2, steps=True) == (False, True)
    assert k.resolve_form(8, products="tf32x3") == ("tf32x3", False)
    with pytest.raises(ValueError, match="two different verify forms"):
        k.resolve_form(4, products=True, steps=True)
    config = k.verify_launch_config
    assert config(256, 32, 128, 128, False, 2) == (64, 2) and config(256, 32, 128, 128, True, 2) == (64, 2)
    for per_key, narrow_from in ((False, 7), (True, 5)):
        for T in (3, 4, narrow_from - 1):
            assert config(256, 32, 128, 128, per_key, T, steps=True) == (32, 1), (per_key, T)
        for T in (narrow_from, 8, 16):
            assert config(256, 32, 128, 128, per_key, T, steps=True) == (16, 1), (per_key, T)
    assert config(256, 32, 256, 256, False, 4, steps=True) == (16, 2)
    assert config(256, 32, 128, 128, False, 4) == (64, 4) and config(256, 32, 128, 128, True, 4) == (128, 4)
    assert config(1, 32, 128, 128, False, 4, steps=True) == (16, 1)  # 256 programs: the narrowest tile
    # KDA's per-head pre-launch of the record decays from 3-token windows on (H200, runs 96 / 99); not for scalar gates
    assert [k.default_verify_weights(True, t) for t in (1, 2, 3, 4, 16)] == [False, False, True, True, True]
    assert not any(k.default_verify_weights(False, t) for t in (1, 2, 3, 4, 16))
    # commit / ring fold (run 97): the standard step's tile, the scalar-gate product fold on 8 warps, 16 wide at least
    fold = k.fold_launch_config
    assert fold(256, 32, 128, 128, False, True) == (64, 8) and fold(256, 32, 128, 128, True, True) == (64, 4)
    assert fold(256, 32, 128, 128, False, False) == (64, 4) and fold(256, 32, 128, 128, True, False) == (64, 4)
    assert fold(1, 4, 128, 128, False, False) == (8, 4) and fold(1, 4, 128, 128, False, True) == (16, 8)


def test_mamba2_fold_launch_rule():
    """Mamba-2's commit / ring fold: a 2048-element tile on 2 warps (H200, run 97: [16, 128] x 2 fastest of the
    flush sweep, 1.18x the standard step's [32, 128] x 8)."""
    from kernel_harness import load_kernel_module

    k = load_kernel_module("mamba2_verify")
    assert k.fold_launch_config(256, 128, 64, 128) == dict(block_p=16, num_warps=2)
    assert k.fold_launch_config(1, 8, 64, 16) == dict(block_p=64, num_warps=2)
    assert k.fold_launch_config(1, 8, 4, 64) == dict(block_p=4, num_warps=2)


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
def test_bench_imports_and_parses_arguments():
    code = "from kernel_harness import load_kernel_module; load_kernel_module('bench_verify').main(['--help'])"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=subprocess_env(), capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-4000:]
    assert "--windows" in out.stdout and "--batches" in out.stdout


@pytest.mark.slow
@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
def test_bench_smoke(tmp_path):
    # one row timed (the interpreter's time goes per program): every arm and form still runs, its commits flushing
    # too; the correctness checks keep their two rows
    data, stdout = run_bench_smoke("bench_verify", ["--family", "mamba2,gdn,kda", "--forms",
                                                    "ieee,tf32x3,steps,fold_dot,fold_loop,weights,no_weights,"
                                                    "weights_newest_first",
                                                    "--parts", "--commit-tiles", "8,16", "--commit-warps", "1",
                                                    "--batches", "1"],
                                   tmp_path / "bench.json")
    assert [r["family"] for r in data["results"]] == ["mamba2", "gdn", "kda"]
    for row in data["results"]:
        forms = ["products", "tf32x3"] + (["steps", "fold_dot", "fold_loop"] if row["family"] != "mamba2" else [])
        forms += ["weights", "no_weights", "weights_newest_first"] if row["family"] == "kda" else []
        keys = ["replay_all_us", "replay_mixed_us", "snapshot_us", "steps_only_us", "speedup_all_vs_snapshot"]
        keys += [f"replay_{mode}_{form}_us" for form in forms for mode in ("all", "mixed")]
        keys += [f"speedup_all_{form}_vs_snapshot" for form in forms]
        for key in keys:
            assert row[key] > 0, (key, row)
        assert row["family"] != "mamba2" or "replay_all_steps_us" not in row  # no steps form for Mamba-2
        # --parts: verify and commit alone, the flush at each named launch (delta rule: both folds from 16 on)
        for key in ("verify_us", "count_reset_us", "commit_flush_us", "standard_step_us"):
            assert row[key] > 0, (key, row)
        assert isinstance(row["commit_count_only_us"], float), row  # a difference of two timings: any sign on CPU
        want = {"p8w1", "p16w1"} if row["family"] == "mamba2" else {"8x1/loop", "16x1/loop", "16x1/dot"}
        assert set(row["commit_flush_sweep"]) == want and row["commit_flush_best"] in want, row["commit_flush_sweep"]
        assert all(isinstance(v, float) for v in row["commit_flush_sweep"].values()), row["commit_flush_sweep"]
    assert len(data["checks"]) == 18 and all(check["ok"] for check in data["checks"].values()), data["checks"]
    assert {label.rsplit("/", 1)[1] for label in data["checks"]} >= {"products", "tf32x3", "steps", "fold_dot",
                                                                       "fold_loop", "weights", "weights_newest_first"}
    assert [label.split("/")[0] for label in data["checks"] if label.endswith("/weights")] == ["kda"]
    assert "snapshot us" in stdout and "commit flushing every row" in stdout  # the printed tables


# ---------------------------------------------------------------------------------------------------------------
# in-process checks of the references


@pytest.mark.parametrize("family", ["mamba2", "gdn", "kda"])
def test_reference_speculation(family):
    """verify_ref + commit_ref + replay_step_ref give the outputs and checkpoints of the sequential recurrence
    (within 1e-5, not bitwise: the replay step reference's flush folds in unrolled form, and torch's CPU exp /
    softplus round vectorised and tail lanes differently, so reference results depend on tensor shapes in the last
    bit)."""
    _speculation(_family(family, "cpu", refs=True), "cpu", L=4, windows=[4, 2, 1, 4, 3, 4], steps=5,
                 bitwise=False)


def test_reference_rejects_overfull_window():
    from hf_replayssm.ops.delta_verify import delta_commit_ref, delta_verify_ref
    from hf_replayssm.ops.mamba2_verify import mamba2_commit_ref, mamba2_verify_ref

    fam = _family("mamba2", "cpu", refs=True)
    st = fam["init"](2, R=5)
    st["count"][1] = 3
    with pytest.raises(ValueError, match="exceeds the ring capacity"):
        mamba2_verify_ref(*fam["rings"](st), **fam["window"](2, 3, None, None))
    with pytest.raises(ValueError, match="accepted"):
        mamba2_commit_ref(*fam["rings"](st), torch.tensor([0, 3], dtype=torch.int32), 4, fam["params"]["A"])
    fam = _family("kda", "cpu", refs=True)
    st = fam["init"](2, R=5)
    st["count"][0] = 4
    with pytest.raises(ValueError, match="exceeds the ring capacity"):
        delta_verify_ref(*fam["rings"](st), **fam["window"](2, 2, None, None))
    with pytest.raises(ValueError, match="accepted"):
        delta_commit_ref(*fam["rings"](st), torch.tensor([-1, 0], dtype=torch.int32), 4)


def test_fold_ring_references_refuse_positions_outside_the_ring():
    from hf_replayssm.ops.delta_verify import delta_fold_ring_ref
    from hf_replayssm.ops.mamba2_verify import mamba2_fold_ring_ref

    for family, fold in (("mamba2", mamba2_fold_ring_ref), ("gdn", delta_fold_ring_ref)):
        fam = _family(family, "cpu", refs=True)
        st = fam["init"](2, 5)
        rings = fam["rings"](st)[:4]
        extra = (fam["params"]["A"],) if family == "mamba2" else ()
        for origin, count in ((5, 1), (-1, 1), (0, 6)):
            with pytest.raises(ValueError, match="outside a ring of 5"):
                fold(*rings, *extra, origin, count)
        assert torch.equal(fold(*rings, *extra, 4, 0), st["state"])  # nothing to fold: a copy


# ---------------------------------------------------------------------------------------------------------------
# the speculation property, shared by the kernel (worker) and reference (in-process) checks


def _family(name, device, refs=False, k=None, dtype=torch.float32, seed=0, products=False, steps=False,
            fold_dot=None):
    """Token stream, ring state and step / verify / commit functions of one layer family, as a dict.

    ``stream(batch, n)``: per-token tensors [batch, n, ...]; ``init(batch, R)``: checkpoint + empty rings;
    ``fused`` / ``standard`` / ``verify`` / ``commit``: the kernels (``k`` is the verify module) or the refs."""
    from hf_replayssm.ops import delta_step, delta_verify, mamba2_step, mamba2_verify

    gen = torch.Generator().manual_seed(seed)

    def rnd(*shape, scale=1.0):
        return torch.randn(*shape, generator=gen) * scale

    if name == "mamba2":
        H, G, P, N = 2, 1, 24, 20
        if refs:
            fused, standard = mamba2_step.mamba2_replay_step_ref, mamba2_step.mamba2_state_update_ref
            verify, commit = mamba2_verify.mamba2_verify_ref, mamba2_verify.mamba2_commit_ref
        else:
            from kernel_harness import load_kernel_module

            step = load_kernel_module("mamba2")
            fused, standard, verify, commit = (step.mamba2_replay_step, step.mamba2_state_update, k.mamba2_verify,
                                               k.mamba2_commit)
        params = dict(A=-(torch.rand(H, generator=gen) * 1.5 + 0.1), D=rnd(H), dt_bias=rnd(H, scale=0.5))
        params = {n: t.to(device) for n, t in params.items()}
        shapes = dict(x=(H, P), dt=(H,), B=(G, N), C=(G, N), z=(H, P))
        low = {"x", "B", "C", "z"}  # stored / passed in `dtype`
        ring_names = ("state", "ring_x", "ring_dt", "ring_B")

        def init(batch, R):
            return dict(state=rnd(batch, H, P, N).to(device),
                        ring_x=torch.zeros(batch, R, H, P, dtype=dtype, device=device),
                        ring_dt=torch.zeros(batch, R, H, device=device),
                        ring_B=torch.zeros(batch, R, G, N, dtype=dtype, device=device),
                        origin=torch.zeros(batch, dtype=torch.int32, device=device),
                        count=torch.zeros(batch, dtype=torch.int32, device=device))

        extra = dict(dt_softplus=True)
        commit_extra = (params["A"],)
    else:
        per_key = name == "kda"
        Hk, Hv, K, V = 1, 2, 24 if per_key else 16, 16  # one V tile per head (the interpreter runs per program)
        if refs:
            fused, standard = delta_step.delta_replay_step_ref, delta_step.delta_state_update_ref
            verify, commit = delta_verify.delta_verify_ref, delta_verify.delta_commit_ref
        else:
            from kernel_harness import load_kernel_module

            step = load_kernel_module("delta_rule")
            fused, standard, verify, commit = (step.delta_replay_step, step.delta_state_update, k.delta_verify,
                                               k.delta_commit)
        params = {}
        gshape = (Hv, K) if per_key else (Hv,)
        shapes = dict(q=(Hk, K), k=(Hk, K), v=(Hv, V), beta=(Hv,), g=gshape)
        low = {"q", "k", "v"}
        ring_names = ("state", "ring_k", "ring_d", "ring_g")

        def init(batch, R):
            return dict(state=(rnd(batch, Hv, K, V) * 0.5).to(device),
                        ring_k=torch.zeros(batch, R, Hk, K, dtype=dtype, device=device),
                        ring_d=torch.zeros(batch, R, Hv, V, device=device),
                        ring_g=torch.zeros(batch, R, *gshape, device=device),
                        origin=torch.zeros(batch, dtype=torch.int32, device=device),
                        count=torch.zeros(batch, dtype=torch.int32, device=device))

        extra = {}
        commit_extra = ()

    def token_values(*lead):
        out = {}
        for n, shape in shapes.items():
            if n == "beta":
                t = torch.rand(*lead, *shape, generator=gen) * 0.9 + 0.05
            elif n == "g":
                t = -(torch.rand(*lead, *shape, generator=gen) * 0.5 + 0.02)
            else:
                t = rnd(*lead, *shape)
            out[n] = t.to(dtype if n in low else torch.float32).to(device)
        return out

    def window(batch, T, stream, pos, accepted=None):
        """Window tokens [batch, T, ...]: row b's first accepted[b] tokens follow its stream from pos[b], the rest
        are fresh random drafts (to be rejected)."""
        drafts = token_values(batch, T)
        if stream is None:
            return {**drafts, **params, **extra}
        rows = torch.arange(batch)[:, None]
        length = next(iter(stream.values())).shape[1]
        idx = (torch.tensor(pos)[:, None] + torch.arange(T)[None, :]).clamp(max=length - 1)
        keep = (torch.arange(T)[None, :] < torch.tensor(accepted)[:, None]).to(device)
        out = {}
        for n, d in drafts.items():
            true = stream[n][rows, idx]
            out[n] = torch.where(keep.view(batch, T, *([1] * (d.dim() - 2))), true, d)
        return {**out, **params, **extra}

    def token(stream, pos):
        rows = torch.arange(len(pos))
        return {**{n: s[rows, torch.tensor(pos)] for n, s in stream.items()}, **params, **extra}

    def rings(st):
        return [st[n] for n in ring_names] + [st["origin"], st["count"]]

    if products:  # the verify kernel's matrix-product form
        verify = functools.partial(k._verify, _products=True)
    if steps:  # the delta-rule verify kernel's steps form
        verify = functools.partial(k._verify, _steps=True)
    if fold_dot is not None:  # the delta-rule commit's fold named (one product / record by record), not the default
        commit = functools.partial(k._commit, _fold_dot=fold_dot)
    return dict(name=name, stream=lambda batch, n: token_values(batch, n), init=init, window=window, token=token,
                rings=rings, params=params, extra=extra,
                fused=lambda st, tok, L: fused(*rings(st), **tok, buffer_len=L, out=_out(tok, name)),
                standard=lambda state, tok: standard(state, **tok, out=_out(tok, name)),
                verify=lambda st, win: verify(*rings(st), **win, out=_out(win, name)),
                commit=lambda st, acc, L: commit(*rings(st), acc, L, *commit_extra))


def _out(tokens, name):
    ref = tokens["x"] if name == "mamba2" else tokens["v"]
    return torch.empty(ref.shape, dtype=torch.float32, device=ref.device)


def _speculation(fam, device, L, windows, steps, batch=3, seed=5, bitwise=True):
    """One-token decoding (``fused`` replay steps, and ``standard`` steps for the states at every position) vs
    speculative decoding (``verify`` a window, ``commit`` a per-row accepted prefix, windows of the sizes in
    ``windows``), then ``steps`` more fused steps on the speculative cache. Checks the accepted outputs, that verify
    writes no state and keeps ``count``, the counts after each commit, and the checkpoint after every flush (bitwise
    for Mamba-2 where ``bitwise``, else within 1e-5)."""
    gen = torch.Generator().manual_seed(seed)
    bitwise = bitwise and fam["name"] == "mamba2" and str(device) == "cpu"  # compiled kernels: within 1e-5
    R = L - 1 + max(windows)
    n = sum(windows) + steps + 1
    stream = fam["stream"](batch, n)

    # one token at a time: fused replay steps (ring of the minimal capacity L - 1) and standard steps
    one = fam["init"](batch, max(L - 1, 1))
    one["origin"].copy_(torch.arange(batch, dtype=torch.int32) % max(L - 1, 1))
    start = one["state"].clone()
    std = start.clone()
    y_one, std_states = [], []
    for p in range(n):
        tok = fam["token"](stream, [p] * batch)
        flushing = (one["count"] + 1 >= L).tolist()
        y_one.append(fam["fused"](one, tok, L).cpu())
        y_std = fam["standard"](std, tok)
        std_states.append(std.cpu().clone())
        _close(f"one-token: fused vs standard step at {p}", y_one[-1], y_std.cpu(), 1e-4)
        for b in range(batch):
            if flushing[b]:  # the replay step's flush vs the standard step
                _check_ckpt(f"one-token flush row {b} at {p}", one["state"][b], std_states[p][b], bitwise)

    # speculative: verify + commit rounds, then plain steps
    spec = fam["init"](batch, R)
    spec["state"].copy_(start)
    spec["origin"].copy_(torch.tensor([R - 1, R // 2, 0][:batch], dtype=torch.int32))
    pos = [0] * batch
    flushes = [0] * batch
    for T in windows:
        accepted = [int(a) for a in torch.randint(0, T + 1, (batch,), generator=gen)]
        accepted[0] = T  # row 0 always accepts all (fills the ring fastest)
        win = fam["window"](batch, T, stream, pos, accepted)
        before_state, before_count = spec["state"].clone(), spec["count"].clone()
        y = fam["verify"](spec, win).cpu()
        assert torch.equal(spec["state"], before_state), "verify wrote the state"
        assert torch.equal(spec["count"], before_count), "verify changed count"
        for b in range(batch):
            for t in range(accepted[b]):
                _close(f"window T={T} row {b} token {t} (position {pos[b] + t})", y[b, t], y_one[pos[b] + t][b],
                       1e-4)
        fam["commit"](spec, torch.tensor(accepted, dtype=torch.int32, device=device), L)
        print(f" T={T} accepted {accepted} count {before_count.tolist()} -> {spec['count'].tolist()}")
        for b in range(batch):
            expect = int(before_count[b]) + accepted[b]
            pos[b] += accepted[b]
            if expect >= L:
                flushes[b] += 1
                expect = 0
                _check_ckpt(f"commit flush row {b} at {pos[b]}", spec["state"][b], std_states[pos[b] - 1][b],
                            bitwise)
            else:
                assert torch.equal(spec["state"][b], before_state[b]), f"row {b} state written without a flush"
            assert int(spec["count"][b]) == expect, (b, spec["count"].tolist(), expect)
    assert flushes[0] > 0, "row 0 never flushed during speculation"
    for _ in range(steps):
        flushing = (spec["count"] + 1 >= L).tolist()
        y = fam["fused"](spec, fam["token"](stream, pos), L).cpu()
        for b in range(batch):
            _close(f"step after speculation row {b} (position {pos[b]})", y[b], y_one[pos[b]][b], 1e-4)
            if flushing[b]:
                flushes[b] += 1
                _check_ckpt(f"step flush row {b} at {pos[b]}", spec["state"][b], std_states[pos[b]][b],
                            bitwise)
            pos[b] += 1
    print(f" flushes per row {flushes}, positions {pos}")


def _check_ckpt(name, got, want, bitwise):
    got = got.cpu()
    if bitwise:
        assert torch.equal(got, want), f"{name}: checkpoint differs, max {(got - want).abs().max().item():.3e}"
    else:
        _close(name, got, want, 1e-5)


# ---------------------------------------------------------------------------------------------------------------
# worker side (runs in the subprocess)


def _poison(p, names, origins, counts, ring):
    """Ring slots outside the committed window hold NaN: they must never reach an output."""
    for b in range(len(counts)):
        committed = {(origins[b] + j) % ring for j in range(counts[b])}
        for slot in set(range(ring)) - committed:
            for name in names:
                p[name][b, slot] = float("nan")


def _clone(p):
    return {n: (v.clone() if hasattr(v, "clone") else v) for n, v in p.items()}


def _mamba2_inputs(device, dtype, batch, T, ring, *, options=True, H=4, G=2, P=24, N=20, seed=0):
    gen = torch.Generator().manual_seed(seed)

    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).to(device)

    p = dict(state=rnd(batch, H, P, N), ring_x=rnd(batch, ring, H, P).to(dtype),
             ring_dt=(torch.rand(batch, ring, H, generator=gen) * 0.9 + 0.05).to(device),
             ring_B=rnd(batch, ring, G, N).to(dtype), x=rnd(batch, T, H, P).to(dtype),
             B=rnd(batch, T, G, N).to(dtype), C=rnd(batch, T, G, N).to(dtype),
             A=-(torch.rand(H, generator=gen) * 2 + 0.2).to(device))
    if options:
        p.update(dt=rnd(batch, T, H), D=rnd(H), z=rnd(batch, T, H, P).to(dtype), dt_bias=rnd(H, scale=0.5),
                 dt_softplus=True)
    else:
        p.update(dt=(torch.rand(batch, T, H, generator=gen) * 0.9 + 0.05).to(device))
    return p


M_RING = ("ring_x", "ring_dt", "ring_B")


def _check_row_that_does_not_fit(verify, p, ring_names, counts):
    """Row 1's count plus the window exceeds the ring: NaN outputs and none of its ring slots written; row 0 fits.
    Returns the outputs and the inputs before the call."""
    p["origin"] = torch.tensor([3, 5], dtype=torch.int32, device=p["state"].device)
    p["count"] = torch.tensor(counts, dtype=torch.int32, device=p["state"].device)
    before = _clone(p)
    out = verify(**p)
    assert torch.isnan(out[1]).all() and torch.isfinite(out[0].float()).all()
    for name in ring_names:
        assert torch.equal(p[name][1], before[name][1]), f"{name} written for a row that does not fit"
    return out, before


def _check_mamba2_verify(k, device, dtype, T, ring, origins, counts, config, options=True, poison=True,
                         products=False):
    batch = len(counts)
    p = _mamba2_inputs(device, dtype, batch, T, ring, options=options)
    if poison:
        _poison(p, M_RING, origins, counts, ring)
    p["origin"] = torch.tensor(origins, dtype=torch.int32, device=device)
    p["count"] = torch.tensor(counts, dtype=torch.int32, device=device)
    q = _clone(p)
    out = torch.empty(p["x"].shape, dtype=torch.float32, device=device)
    y = k._verify(**p, out=out, _config=config, _products=products)
    y_ref = k.mamba2_verify_ref(**q, out=torch.empty_like(out))
    print(f" T={T} R={ring} counts={counts} origins={origins} config={config} options={options} products={products}")
    assert y is out
    _close("y", y, y_ref, 2e-6)
    assert torch.equal(p["state"], q["state"]) and torch.equal(p["count"], q["count"])
    for name in ("ring_x", "ring_B"):  # records are copied as is
        torch.testing.assert_close(p[name], q[name], rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(p["ring_dt"], q["ring_dt"], rtol=1e-6, atol=1e-6, equal_nan=True)  # softplus ulp
    return p


def case_mamba2_verify_bf16(k, device):
    """bf16 x/B/C/z with D, z, dt_bias and softplus; P=24, N=20 (not powers of two), H=4 > G=2; T=4 with counts
    0..R-T in one launch and T=2 with counts 0..R-T (origins near R-1: wrap-around); uncommitted slots NaN; a row
    that does not fit (count + T > R) gets NaN outputs and no records, the other rows are unaffected."""
    R = 7
    _check_mamba2_verify(k, device, torch.bfloat16, 4, R, [6, 5, 4, 6], [0, 1, 2, 3], dict(block_p=16, num_warps=2))
    _check_mamba2_verify(k, device, torch.bfloat16, 2, R, [6, 5, 3, 6, 0, 2], [0, 1, 2, 3, 4, 5],
                         dict(block_p=8, num_warps=2))
    y, before = _check_row_that_does_not_fit(k.mamba2_verify, _mamba2_inputs(device, torch.bfloat16, 2, 4, R),
                                             M_RING, [2, 4])  # row 1: 4 + 4 > 7
    q = _clone(before)
    q["origin"], q["count"] = q["origin"][:1], q["count"][:1]
    q = {n: (v[:1] if hasattr(v, "dim") and v.dim() > 1 else v) for n, v in q.items()}
    _close("fitting row unaffected", y[:1].float(), k.mamba2_verify_ref(**q).float(), 1e-2)  # bf16 outputs


def case_mamba2_verify_products(k, device):
    """The window as matrix products (``_products=True``): bf16 with D, z, dt_bias and softplus, P=24, N=20, T=4 and
    a full window of 16 (wrapping origins, NaN in uncommitted slots, a row that does not fit), fp32 T=1 and T=7."""
    _check_mamba2_verify(k, device, torch.bfloat16, 4, 7, [6, 5, 4, 6], [0, 1, 2, 3], dict(block_p=16, num_warps=4),
                         products=True)
    _check_mamba2_verify(k, device, torch.bfloat16, 16, 21, [20, 3, 9], [0, 5, 4], dict(block_p=32, num_warps=8),
                         products=True)
    _check_mamba2_verify(k, device, torch.float32, 1, 5, [4, 3, 2, 0, 4], [0, 1, 2, 3, 4],
                         dict(block_p=16, num_warps=4), options=False, products=True)
    _check_mamba2_verify(k, device, torch.float32, 7, 12, [11, 0, 6], [5, 0, 4], dict(block_p=16, num_warps=4),
                         options=False, products=True)
    _check_row_that_does_not_fit(functools.partial(k._verify, _products=True),
                                 _mamba2_inputs(device, torch.bfloat16, 2, 4, 7), M_RING, [2, 4])


def case_mamba2_verify_fp32(k, device):
    """fp32, no D/z/dt_bias/softplus, T=1 (counts 0..R-1) and T=2 with a larger ring; strided views: the
    checkpoint a permuted slice of a pool, x/B/C/dt slices of one projection, through the public entry point."""
    _check_mamba2_verify(k, device, torch.float32, 1, 5, [4, 3, 2, 0, 4], [0, 1, 2, 3, 4],
                         dict(block_p=32, num_warps=4), options=False)
    _check_mamba2_verify(k, device, torch.float32, 2, 9, [8, 1, 7], [7, 0, 5], dict(block_p=16, num_warps=2),
                         options=False, poison=False)
    batch, T, H, G, P, N, R = 2, 3, 4, 2, 24, 20, 6
    p = _mamba2_inputs(device, torch.float32, batch, T, R)
    pool = torch.randn(batch + 2, H, N, P, device=device)
    state = pool[1 : batch + 1].transpose(-1, -2)
    state.copy_(p["state"])
    proj = torch.randn(batch, T, H * P + 2 * G * N + H + 3, device=device)
    p.update(x=proj[..., : H * P].unflatten(-1, (H, P)), B=proj[..., H * P : H * P + G * N].unflatten(-1, (G, N)),
             C=proj[..., H * P + G * N : H * P + 2 * G * N].unflatten(-1, (G, N)),
             dt=proj[..., H * P + 2 * G * N : H * P + 2 * G * N + H])
    p["origin"] = torch.tensor([5, 2], dtype=torch.int32, device=device)
    p["count"] = torch.tensor([3, 1], dtype=torch.int32, device=device)
    q = _clone(p)
    p["state"] = state
    assert not state.is_contiguous() and not p["x"].is_contiguous()
    y = k.mamba2_verify(**p)
    y_ref = k.mamba2_verify_ref(**q)
    print(" strided views")
    _close("y strided", y, y_ref, 2e-6)
    assert torch.equal(state, q["state"])
    for name in M_RING:
        torch.testing.assert_close(p[name], q[name], rtol=1e-6, atol=1e-6)


def _split_invariance(commit, rings, total, first, R):
    """Folding ``total`` records in one commit == folding the first ``first`` of them, then (origin moved on) the
    rest, bitwise. ``rings`` = [state, ring..., origin, count]; ``commit(*rings, accepted, buffer_len)``."""
    one = [t.clone() for t in rings]
    one[-1].zero_()
    commit(*one, torch.full_like(one[-1], total), total)
    two = [t.clone() for t in rings]
    two[-1].zero_()
    commit(*two, torch.full_like(two[-1], first), first)
    assert two[-1].tolist() == [0] * len(two[-1])
    two[-2].copy_((two[-2] + first) % R)
    commit(*two, torch.full_like(two[-1], total - first), total - first)
    assert one[-1].tolist() == two[-1].tolist() == [0] * len(one[-1])
    assert not torch.equal(one[0], rings[0]), "nothing was folded"
    assert torch.equal(one[0], two[0]), "commit is not split-invariant"


def case_mamba2_verify_fp32_and_commit(k, device):
    case_mamba2_verify_fp32(k, device)
    _mamba2_commit(k, device)


def _mamba2_commit(k, device):
    """Per-row accepted (0..T) with counts such that some rows flush (new count >= L, including overshoot past L)
    and some do not; checkpoint vs the reference, untouched rows bitwise, counts and origin; the fold is
    split-invariant bitwise. bf16 ring."""
    L, R = 4, 7
    counts, accepted, origins = [0, 3, 2, 3, 1, 0], [4, 1, 0, 4, 2, 0], [6, 5, 0, 4, 2, 3]
    for config in (dict(block_p=16, num_warps=2), dict(block_p=8, num_warps=4)):
        p = _mamba2_inputs(device, torch.bfloat16, len(counts), 1, R)
        rings = dict(state=p["state"], ring_x=p["ring_x"], ring_dt=p["ring_dt"], ring_B=p["ring_B"],
                     origin=torch.tensor(origins, dtype=torch.int32, device=device),
                     count=torch.tensor(counts, dtype=torch.int32, device=device))
        q = _clone(rings)
        before = rings["state"].clone()
        acc = torch.tensor(accepted, dtype=torch.int32, device=device)
        k._commit(*rings.values(), acc, L, p["A"], _config=config)
        k.mamba2_commit_ref(*q.values(), acc, L, p["A"])
        print(f" config={config} counts {counts} + accepted {accepted} -> {rings['count'].tolist()}")
        assert rings["count"].tolist() == [0 if c + a >= L else c + a for c, a in zip(counts, accepted, strict=True)]
        assert torch.equal(rings["count"], q["count"]) and rings["origin"].tolist() == origins
        _close("state", rings["state"], q["state"], 1e-6)
        for b, (c, a) in enumerate(zip(counts, accepted, strict=True)):
            if c + a < L:
                assert torch.equal(rings["state"][b], before[b]), f"row {b} written without a flush"
    p = _mamba2_inputs(device, torch.bfloat16, 2, 1, R)
    rings = [p["state"], p["ring_x"], p["ring_dt"], p["ring_B"],
             torch.tensor([5, 1], dtype=torch.int32, device=device), torch.zeros(2, dtype=torch.int32, device=device)]
    _split_invariance(lambda *args: k.mamba2_commit(*args, p["A"]), rings, 6, 2, R)


def case_mamba2_speculation(k, device):
    """The key property on bf16 tokens (ring dtypes = token dtypes): windows of 4, 2, 1, 4, 3 tokens, per-row
    accepted prefixes (row 0 all), then plain steps; outputs vs one-token fused replay steps, every checkpoint
    bitwise equal to the standard step kernel's state at the same position (and the one-token path's flushes
    too)."""
    _speculation(_family("mamba2", device, k=k, dtype=torch.bfloat16), device, L=4, windows=[4, 2, 1, 4, 3],
                 steps=4)


def case_mamba2_speculation_long(k, device):
    _speculation(_family("mamba2", device, k=k, dtype=torch.bfloat16, seed=1), device, L=8,
                 windows=[8, 4, 8, 2, 8, 1, 8], steps=9, seed=6)


# -- gated delta rule ---------------------------------------------------------------------------------------------


def _delta_inputs(device, dtype, batch, T, ring, *, per_key, Hk=2, Hv=4, K=32, V=24, seed=0):
    gen = torch.Generator().manual_seed(seed)

    def rnd(*shape):
        return torch.randn(*shape, generator=gen)

    def gate(*shape):
        return -(torch.rand(*shape, generator=gen) * 0.58 + 0.02)

    gshape = (Hv, K) if per_key else (Hv,)
    p = dict(state=rnd(batch, Hv, K, V) * 0.5, ring_k=rnd(batch, ring, Hk, K).to(dtype),
             ring_d=rnd(batch, ring, Hv, V) * 0.3, ring_g=gate(batch, ring, *gshape),
             q=rnd(batch, T, Hk, K).to(dtype), k=rnd(batch, T, Hk, K).to(dtype), v=rnd(batch, T, Hv, V).to(dtype),
             beta=torch.rand(batch, T, Hv, generator=gen) * 0.9 + 0.05, g=gate(batch, T, *gshape))
    return {n: t.to(device) for n, t in p.items()}


D_RING = ("ring_k", "ring_d", "ring_g")


def _check_delta_verify(k, device, dtype, T, ring, origins, counts, block_v, *, per_key, shape=None, products=False,
                        steps=False, **options):
    batch = len(counts)
    p = _delta_inputs(device, dtype, batch, T, ring, per_key=per_key, **(shape or {}))
    _poison(p, D_RING, origins, counts, ring)
    p["origin"] = torch.tensor(origins, dtype=torch.int32, device=device)
    p["count"] = torch.tensor(counts, dtype=torch.int32, device=device)
    q = _clone(p)
    out = torch.empty(p["v"].shape, dtype=torch.float32, device=device)
    o = k._verify(**p, **options, out=out, _block_v=block_v, _products=products, _steps=steps)
    o_ref = k.delta_verify_ref(**q, **options, out=torch.empty_like(out))
    print(f" T={T} R={ring} per_key={per_key} counts={counts} origins={origins} block_v={block_v} {options} "
          f"products={products} steps={steps}")
    assert o is out
    _close("o", o, o_ref, 2e-6)
    assert torch.equal(p["state"], q["state"]) and torch.equal(p["count"], q["count"])
    for name in ("ring_k", "ring_g"):
        torch.testing.assert_close(p[name], q[name], rtol=0, atol=0, equal_nan=True)
    _close("ring_d", p["ring_d"].nan_to_num(), q["ring_d"].nan_to_num(), 1e-5)
    assert torch.isnan(p["ring_d"]).sum() == torch.isnan(q["ring_d"]).sum()


def case_delta_verify_gdn_bf16(k, device):
    """GDN gate, bf16 q/k/v and ring keys, GVA (Hv=4, Hk=2), V=24 (a full and a partial V tile at BLOCK_V=16);
    T=4 with counts 0..R-T and T=2 with counts 0..R-T, wrap-around, NaN in uncommitted slots; a row that does not
    fit gets NaN outputs and no records."""
    R = 7
    _check_delta_verify(k, device, torch.bfloat16, 4, R, [6, 5, 4, 6], [0, 1, 2, 3], 16, per_key=False)
    _check_delta_verify(k, device, torch.bfloat16, 2, R, [6, 5, 3, 6, 0, 2], [0, 1, 2, 3, 4, 5], 32,
                        per_key=False)
    _check_row_that_does_not_fit(k.delta_verify, _delta_inputs(device, torch.bfloat16, 2, 3, R, per_key=False),
                                 D_RING, [4, 5])  # row 1: 5 + 3 > 7


def _check_delta_form(k, device, **form):
    """One verify form (``products=True`` or ``steps=True``) of GDN and KDA against the reference: bf16 GVA T=4
    (wrapping origins, NaN in uncommitted slots), a full window of 16, fp32 K=24 T=1 and T=7, no l2norm with a scale;
    a row that does not fit."""
    launch = {f"_{name}": value for name, value in form.items()}
    for per_key in (False, True):
        _check_delta_verify(k, device, torch.bfloat16, 4, 7, [6, 5, 4, 6], [0, 1, 2, 3], 16, per_key=per_key, **form)
        _check_delta_verify(k, device, torch.bfloat16, 16, 21, [20, 3, 9], [0, 5, 4], 16, per_key=per_key, **form)
        _check_delta_verify(k, device, torch.float32, 1, 5, [4, 3, 2, 0, 4], [0, 1, 2, 3, 4], 16, per_key=per_key,
                            shape=dict(K=24, V=32), **form)
        _check_delta_verify(k, device, torch.float32, 7, 12, [11, 0, 6], [5, 0, 4], 32, per_key=per_key,
                            shape=dict(K=24, V=32), **form)
        _check_delta_verify(k, device, torch.float32, 3, 5, [4, 0], [2, 1], 16, per_key=per_key,
                            shape=dict(Hk=1, Hv=2, K=16, V=16), use_qk_l2norm=False, scale=0.3, **form)
        _check_row_that_does_not_fit(functools.partial(k._verify, **launch),
                                     _delta_inputs(device, torch.bfloat16, 2, 3, 7, per_key=per_key), D_RING, [4, 5])


def case_delta_verify_products(k, device):
    """The window as matrix products (``_products=True``), GDN and KDA: the checks of :func:`_check_delta_form`, and
    a full window whose triangular system is hard (nearly parallel keys, beta near 1, some strong gates)."""
    _check_delta_form(k, device, products=True)
    for per_key in (False, True):
        # A hard system for the d's solved by (I + X)^-1 = (I - X)(I + X^2)(I + X^4)(I + X^8): 16 nearly parallel
        # keys, beta near 1, a fifth of the gates 21x stronger.
        p = _delta_inputs(device, torch.float32, 3, 16, 20, per_key=per_key, seed=3)
        gen = torch.Generator().manual_seed(4)
        p["k"] = torch.randn(3, 1, *p["k"].shape[2:], generator=gen).to(device) + 0.05 * p["k"]
        p["beta"] = 0.95 + 0.05 * torch.rand(p["beta"].shape, generator=gen).to(device)
        p["g"] = p["g"] * (1 + 20 * (torch.rand(p["g"].shape, generator=gen) > 0.8).to(device))
        p["origin"] = torch.tensor([19, 3, 7], dtype=torch.int32, device=device)
        p["count"] = torch.tensor([0, 4, 3], dtype=torch.int32, device=device)
        q = _clone(p)
        o = k._verify(**p, out=torch.empty(p["v"].shape, device=device), _products=True)
        _close("o, a hard window", o, k.delta_verify_ref(**q, out=torch.empty(p["v"].shape, device=device)), 2e-6)
        _close("ring_d, a hard window", p["ring_d"].nan_to_num(), q["ring_d"].nan_to_num(), 1e-5)


def case_delta_verify_steps(k, device):
    """The steps form (``_steps=True``: the records folded into the checkpoint tile by one product, then the window
    stepped through the recurrence in registers), GDN and KDA: the checks of :func:`_check_delta_form`."""
    _check_delta_form(k, device, steps=True)


def case_delta_verify_kda(k, device):
    """KDA (per-key-channel) gate, fp32, K=24 (not a power of two), GVA ratio 2; T=1 with counts 0..R-1 and T=2;
    use_qk_l2norm=False with an explicit scale (GDN and KDA)."""
    shape = dict(K=24, V=32)
    _check_delta_verify(k, device, torch.float32, 1, 5, [4, 3, 2, 0, 4], [0, 1, 2, 3, 4], 16, per_key=True,
                        shape=shape)
    _check_delta_verify(k, device, torch.float32, 2, 6, [5, 1, 4], [4, 0, 3], 32, per_key=True, shape=shape)
    for per_key in (True, False):
        _check_delta_verify(k, device, torch.float32, 3, 5, [4, 0], [2, 1], 16, per_key=per_key,
                            shape=dict(Hk=1, Hv=2, K=16, V=16), use_qk_l2norm=False, scale=0.3)


def case_delta_verify_kda_weights(k, device):
    """The per-head pre-launch of KDA's record decays (``_weights=True``) in the token, steps and products forms:
    outputs and appended records bitwise equal to the plain launch (the same expressions, computed once per head),
    and against the reference (bf16 wrapping rings with NaN in uncommitted slots, fp32 K=24 with counts 0..R-T, no
    l2norm with a scale); the pre-launch reading the records newest first (``_newest_first``) within float32
    rounding of both; a scalar gate is refused."""
    forms = dict(tokens=dict(_products=False, _steps=False), steps=dict(_steps=True), products=dict(_products=True))
    cases = [(torch.bfloat16, 4, 7, [6, 5, 4, 6], [0, 1, 2, 3], {}, {}),
             (torch.float32, 2, 9, [8, 0, 3, 5], [7, 0, 4, 1], dict(K=24, V=32), {}),
             (torch.float32, 3, 5, [4, 0], [2, 1], dict(Hk=1, Hv=2, K=16, V=16), dict(use_qk_l2norm=False, scale=0.3))]
    for name, form in forms.items():
        for dtype, T, R, origins, counts, shape, options in cases:
            p = _delta_inputs(device, dtype, len(counts), T, R, per_key=True, **shape)
            _poison(p, D_RING, origins, counts, R)
            p["origin"] = torch.tensor(origins, dtype=torch.int32, device=device)
            p["count"] = torch.tensor(counts, dtype=torch.int32, device=device)
            plain, ref = _clone(p), _clone(p)
            out = torch.empty(p["v"].shape, dtype=torch.float32, device=device)
            warps = dict(_weights_warps=4) if name == "steps" else {}  # the pre-launch on four warps too
            o = k._verify(**p, **options, out=out, _block_v=16, _weights=True, **warps, **form)
            o_plain = k._verify(**plain, **options, out=torch.empty_like(out), _block_v=16, _weights=False, **form)
            o_ref = k.delta_verify_ref(**ref, **options, out=torch.empty_like(out))
            # the pre-launch reading the records newest first (a forward scan; the same values within rounding)
            newest = _clone(plain)
            o_newest = k._verify(**newest, **options, out=torch.empty_like(out), _block_v=16, _weights=True,
                                 _newest_first=True, **form)
            _close("o newest first vs the reference", o_newest, o_ref, 2e-6)
            _close("o newest first vs the plain launch", o_newest, o_plain, 1e-6)
            print(f" {name}: T={T} R={R} counts={counts} origins={origins} {shape} {options}")
            assert torch.isfinite(o).all() and o.abs().max() > 0
            bitwise = str(device) == "cpu"  # compiled kernels may contract differently around the loads: 1e-6
            for label, got, want in [("o", o, o_plain), *((n, p[n], plain[n]) for n in D_RING)]:
                got, want = got.nan_to_num(), want.nan_to_num()
                assert not bitwise or torch.equal(got, want), f"{label} differs from the plain launch"
                _close(f"{label} vs the plain launch", got, want, 1e-6)
            _close("o vs the reference", o, o_ref, 2e-6)
            _close("ring_d vs the reference", p["ring_d"].nan_to_num(), ref["ring_d"].nan_to_num(), 1e-5)
    p = _delta_inputs(device, torch.float32, 2, 2, 5, per_key=False)
    with pytest.raises(ValueError, match="per-key gates"):
        k._verify(**p, origin=torch.zeros(2, dtype=torch.int32, device=device),
                  count=torch.ones(2, dtype=torch.int32, device=device), _weights=True)


def case_delta_verify_kda_and_commit(k, device):
    case_delta_verify_kda(k, device)
    _delta_commit(k, device)


def _delta_commit(k, device, **options):
    """GDN and KDA: per-row accepted with flushing (incl. overshoot) and non-flushing rows vs the reference, counts,
    untouched rows bitwise (``options``: ``_commit``'s private arguments); within 1e-6 of the reference for the
    record-by-record fold, 1e-5 for the product fold (``_fold_dot``, GDN's default); the loop's folds are
    split-invariant bitwise."""
    L, R = 4, 7
    counts, accepted, origins = [0, 3, 2, 3, 1], [4, 1, 0, 4, 2], [6, 5, 0, 4, 2]
    for per_key, dtype in ((False, torch.bfloat16), (True, torch.float32)):
        fold_dot = options.get("_fold_dot", k.default_fold_dot(per_key))
        p = _delta_inputs(device, dtype, len(counts), 1, R, per_key=per_key)
        rings = dict(state=p["state"], ring_k=p["ring_k"], ring_d=p["ring_d"], ring_g=p["ring_g"],
                     origin=torch.tensor(origins, dtype=torch.int32, device=device),
                     count=torch.tensor(counts, dtype=torch.int32, device=device))
        q = _clone(rings)
        before = rings["state"].clone()
        acc = torch.tensor(accepted, dtype=torch.int32, device=device)
        k._commit(*rings.values(), acc, L, _block_v=16, **options)
        k.delta_commit_ref(*q.values(), acc, L)
        print(f" per_key={per_key} counts {counts} + accepted {accepted} -> {rings['count'].tolist()} {options}")
        assert torch.equal(rings["count"], q["count"]) and rings["origin"].tolist() == origins
        assert rings["count"].tolist() == [0 if c + a >= L else c + a for c, a in zip(counts, accepted, strict=True)]
        _close("state", rings["state"], q["state"], 1e-5 if fold_dot else 1e-6)
        for b, (c, a) in enumerate(zip(counts, accepted, strict=True)):
            if c + a < L:
                assert torch.equal(rings["state"][b], before[b]), f"row {b} written without a flush"
        if fold_dot:
            continue
        p = _delta_inputs(device, dtype, 2, 1, R, per_key=per_key)
        ring_list = [p["state"], p["ring_k"], p["ring_d"], p["ring_g"],
                     torch.tensor([5, 1], dtype=torch.int32, device=device),
                     torch.zeros(2, dtype=torch.int32, device=device)]
        _split_invariance(functools.partial(k._commit, _fold_dot=False), ring_list, 6, 2, R)


def case_delta_commit_fold_dot(k, device):
    """The commit with each fold named, the default's other one included (GDN's loop, KDA's product: checkpoint vs
    the reference, split invariance of the loop), and the ring fold as one tf32x3 product (``_fold_dot=True``):
    against the references within 1e-5 (GDN bf16, KDA fp32), out of place and in place, NaN in the slots it does not
    fold."""
    _delta_commit(k, device, _fold_dot=True)
    _delta_commit(k, device, _fold_dot=False)
    R = 7
    for per_key, dtype, origin, count in ((False, torch.bfloat16, 5, 4), (True, torch.float32, 1, 6)):
        p = _delta_inputs(device, dtype, 3, 1, R, per_key=per_key)
        _poison(p, D_RING, [origin] * 3, [count] * 3, R)
        rings = [p[n] for n in D_RING]
        want = k.delta_fold_ring_ref(p["state"].clone(), *[r.clone() for r in rings], origin, count)
        got = k._fold(p["state"], *rings, origin, count, _fold_dot=True)
        print(f" per_key={per_key} origin={origin} count={count}")
        assert torch.isfinite(got).all() and not torch.equal(got, p["state"])
        _close("fold (product)", got, want, 1e-5)
        in_place = p["state"].clone()
        k._fold(in_place, *rings, origin, count, out=in_place, _fold_dot=True)
        assert torch.equal(in_place, got), "in-place fold differs"
        assert torch.equal(k._fold(p["state"], *rings, origin, 0, _fold_dot=True), p["state"])


def case_delta_speculation_fold_dot(k, device):
    """The key property with the fold the default does not pick (GDN record by record, KDA one product; fp32,
    checkpoints within 1e-5)."""
    for family in ("gdn", "kda"):
        _speculation(_family(family, device, k=k, fold_dot=family == "kda"), device, L=4, windows=[4, 2, 1, 4, 3],
                     steps=4)


def case_delta_default_fold(k, device):
    """``default_fold_dot``: the product for scalar gates, the loop for per-key gates; the public commit and ring
    fold follow it (bitwise equal to the named fold, and not to the other one)."""
    assert k.default_fold_dot(False) is True and k.default_fold_dot(True) is False
    R, L = 7, 4
    for per_key, dtype in ((False, torch.bfloat16), (True, torch.float32)):
        p = _delta_inputs(device, dtype, 3, 1, R, per_key=per_key)
        rings = [p[n] for n in D_RING]
        folds = {fold_dot: k._fold(p["state"], *rings, 2, 6, _fold_dot=fold_dot) for fold_dot in (True, False)}
        public = k.delta_fold_ring(p["state"], *rings, 2, 6)
        print(f" per_key={per_key}: fold default == {'product' if not per_key else 'loop'}")
        assert not torch.equal(folds[True], folds[False]), "the two folds gave the same bits: the check is blind"
        assert torch.equal(public, folds[not per_key])
        commits = {}
        for fold_dot in (None, True, False):
            state = p["state"].clone()
            count = torch.zeros(3, dtype=torch.int32, device=device)
            origin = torch.full((3,), 2, dtype=torch.int32, device=device)
            accepted = torch.full((3,), L, dtype=torch.int32, device=device)
            if fold_dot is None:
                k.delta_commit(state, *rings, origin, count, accepted, L)
            else:
                k._commit(state, *rings, origin, count, accepted, L, _fold_dot=fold_dot)
            assert count.tolist() == [0, 0, 0]
            commits[fold_dot] = state
        assert torch.equal(commits[None], commits[not per_key])
        assert not torch.equal(commits[True], commits[False])


def case_delta_speculation_gdn(k, device):
    """The key property for GDN (fp32 tokens): windows of 4, 2, 1, 4, 3 tokens, per-row accepted prefixes, then
    plain steps; outputs vs one-token fused replay steps, checkpoints within 1e-5 of the standard step kernel's
    states."""
    _speculation(_family("gdn", device, k=k), device, L=4, windows=[4, 2, 1, 4, 3], steps=4)


def case_delta_speculation_kda(k, device):
    _speculation(_family("kda", device, k=k), device, L=4, windows=[4, 1, 2, 4, 3], steps=4)


def case_mamba2_speculation_products(k, device):
    """The key property with the verify kernel's matrix-product form (bf16, checkpoints bitwise)."""
    _speculation(_family("mamba2", device, k=k, dtype=torch.bfloat16, products=True), device, L=4,
                 windows=[4, 2, 1, 4, 3], steps=4)


def case_delta_speculation_products(k, device):
    """The key property with the verify kernel's matrix-product form, GDN and KDA (fp32, checkpoints within 1e-5)."""
    for family in ("gdn", "kda"):
        _speculation(_family(family, device, k=k, products=True), device, L=4, windows=[4, 2, 1, 4, 3], steps=4)


def case_delta_speculation_steps(k, device):
    """The key property with the verify kernel's steps form, GDN and KDA (fp32, checkpoints within 1e-5)."""
    for family in ("gdn", "kda"):
        _speculation(_family(family, device, k=k, steps=True), device, L=4, windows=[4, 2, 1, 4, 3], steps=4)


def case_delta_speculation_gdn_long(k, device):
    _speculation(_family("gdn", device, k=k, dtype=torch.bfloat16, seed=1), device, L=8,
                 windows=[8, 4, 8, 2, 8, 1, 8], steps=9, seed=6)


def case_delta_speculation_kda_long(k, device):
    _speculation(_family("kda", device, k=k, seed=2), device, L=8, windows=[8, 8, 3, 8, 8], steps=9, seed=7)


# -- folding ring records at one host position (staged and left-over checkpoints of speculative runs) -------------


def _check_fold_ring(fold, fold_ref, commit, state, rings, extra, R, origin, count, tol=1e-6):
    """``fold`` (out of place, then in place) vs ``fold_ref`` and, bitwise, vs ``commit`` of the same records (one
    shared loop); slots outside the folded ones hold NaN, which must not leak; ``count = 0`` copies."""
    device = state.device
    before = state.clone()
    got = fold(state, *rings, *extra, origin, count)
    want = fold_ref(state.clone(), *[r.clone() for r in rings], *extra, origin, count)
    print(f" R={R} origin={origin} count={count}")
    assert torch.equal(state, before), "an out-of-place fold wrote the state"
    assert torch.isfinite(got).all() and not torch.equal(got, before)
    _close("fold", got, want, tol)
    committed = before.clone()
    batch = state.shape[0]
    commit(committed, *rings, torch.full((batch,), origin, dtype=torch.int32, device=device),
           torch.zeros(batch, dtype=torch.int32, device=device),
           torch.full((batch,), count, dtype=torch.int32, device=device), count, *extra)
    assert torch.equal(got, committed), "fold and commit differ"
    in_place = before.clone()
    assert fold(in_place, *rings, *extra, origin, count, out=in_place) is in_place
    assert torch.equal(in_place, got), "in-place fold differs"
    assert torch.equal(fold(before, *rings, *extra, origin, 0), before)


def case_mamba2_fold_ring(k, device):
    """bf16 ring, H=4 > G=2, P=24, N=20; a wrapping window (origin 5, 4 records of a 7-slot ring), one from slot 0."""
    R = 7
    for origin, count in ((5, 4), (0, 6)):
        p = _mamba2_inputs(device, torch.bfloat16, 3, 1, R)
        _poison(p, M_RING, [origin] * 3, [count] * 3, R)
        _check_fold_ring(k.mamba2_fold_ring, k.mamba2_fold_ring_ref, k.mamba2_commit, p["state"],
                         [p[n] for n in M_RING], [p["A"]], R, origin, count)


def case_delta_fold_ring(k, device):
    """GDN (bf16 ring keys, GVA) and KDA (fp32, per-key gates): wrapping and non-wrapping windows."""
    R = 7
    for per_key, dtype, origin, count in ((False, torch.bfloat16, 5, 4), (True, torch.float32, 1, 6)):
        p = _delta_inputs(device, dtype, 3, 1, R, per_key=per_key)
        _poison(p, D_RING, [origin] * 3, [count] * 3, R)
        tol = 1e-5 if k.default_fold_dot(per_key) else 1e-6  # the product fold: float32 rounding apart
        _check_fold_ring(k.delta_fold_ring, k.delta_fold_ring_ref, k.delta_commit, p["state"],
                         [p[n] for n in D_RING], [], R, origin, count, tol=tol)


if __name__ == "__main__":
    worker_main("mamba2_verify" if sys.argv[1].startswith("mamba2") else "delta_verify", globals(), sys.argv[1])
