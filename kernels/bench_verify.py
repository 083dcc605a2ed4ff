"""Speculative-decoding kernel benchmark: ReplaySSM verify + commit vs per-draft-token state snapshots.

    python -m hf_replayssm.kernels.bench_verify --out verify.json                 # installed package, GPU
    PYTHONPATH=. python kernels/bench_verify.py --family gdn --out gdn.json       # from a checkout
    TRITON_INTERPRET=1 python -m hf_replayssm.kernels.bench_verify --smoke --out /tmp/s.json   # CPU, code paths only

One speculative step = a window of T tokens per row (the bonus token plus T - 1 drafts) whose outputs are needed,
followed by the acceptance of a prefix of ``accepted`` tokens. Arms, per family, shape, batch and T:

* ``replay``: :func:`mamba2_verify` / :func:`delta_verify` (one read of the checkpoint, T records appended) then
  :func:`mamba2_commit` / :func:`delta_commit` (count advanced on the device; a row whose ring reaches ``L`` =
  ``--buffer-len`` folds its records into the checkpoint). Ring capacity ``R = L - 1 + T``. Timed over ``L``
  consecutive steps (so flushes are included at their steady-state rate; each row's count starts at ``b mod L`` so
  every launch mixes phases) and reported per step. ``accepted`` is either T for every row (``all``: most flushes) or
  ``1 + (b mod T)`` (``mixed``).
* ``snapshot``: the per-draft-token snapshot approach of vLLM / SGLang as T standard steps
  (:func:`mamba2_state_update` / :func:`delta_state_update`, in place) each followed by a copy of the state into that
  token's snapshot slot (the accepted one would become the state; selecting it costs nothing and is not timed).
* ``steps_only``: the T standard steps without the copies: the state traffic of a snapshot kernel that writes each
  token's state out of place (2|S| per token), i.e. the best case of the snapshot approach.
* with ``--parts``: verify alone, and commit alone with every row flushing (counts reset to ``L - T``, ``T``
  accepted) and with none (count only), at the default launches, against one standard step (same state traffic as a
  flush, records apart); ``--commit-tiles`` / ``--commit-warps`` time the flush at other launches (delta rule: both
  folds).

Shapes: Mamba-2 Nemotron-H-8B (128 heads x head_dim 64 x d_state 128, 8 groups), GDN Qwen3-Next (32 value / 16 key
heads of 128), optionally KDA Kimi-Linear (32 / 32 heads of 128, per-key gates). float32 state, bf16 activations and
ring x/B/keys, float32 dt/d/g rings.

Timing (GPU, via ``kernels/bench_common.py``): each measurement is one CUDA graph of ``L`` steps, the L2 cache is
flushed before every replay, CUDA events, median of the repetitions (20th / 80th percentiles stored). Inputs rotate
among enough copies that consecutive steps never find their state in L2. The state-traffic model per step (|S| =
the whole batch's float32 state): replay ``|S| (1 + 2 a / L)`` (one checkpoint read per window; a flush reads and
writes it once every L / a steps), snapshot ``4 |S| T``, steps_only ``2 |S| T``.

A short correctness check runs first on the device (verify + commit against the torch references on two rows of
the real shape); its errors go into the JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
from pathlib import Path

import torch

if __package__:
    from .bench_common import Timer, copy_bandwidth, finish_bench, load_kernels
    from .bench_common import compiled_info as _compiled_info
    from .bench_common import num_copies as _num_copies
else:  # run as a script from a checkout: python kernels/bench_verify.py
    from bench_common import Timer, copy_bandwidth, finish_bench, load_kernels
    from bench_common import compiled_info as _compiled_info
    from bench_common import num_copies as _num_copies

SHAPES = {
    "mamba2": {"nemotron-h-8b": dict(heads=128, head_dim=64, d_state=128, groups=8)},
    "gdn": {"qwen3-next": dict(value_heads=32, key_heads=16, key_dim=128, value_dim=128)},
    "kda": {"kimi-linear": dict(value_heads=32, key_heads=32, key_dim=128, value_dim=128)},
}
SMOKE_SHAPES = {
    "mamba2": {"smoke": dict(heads=4, head_dim=16, d_state=16, groups=2)},
    "gdn": {"smoke": dict(value_heads=4, key_heads=2, key_dim=16, value_dim=16)},
    "kda": {"smoke": dict(value_heads=2, key_heads=2, key_dim=16, value_dim=16)},
}
DEFAULT_FAMILIES = ["mamba2", "gdn"]
WINDOWS = [2, 4, 8]
BATCHES = [64, 256]
ACCEPT = ["all", "mixed"]


# ---------------------------------------------------------------------------------------------------------------
# per-family inputs and calls


class Mamba2Case:
    verify_module, step_module = "mamba2_verify", "mamba2"

    def __init__(self, shape: dict, batch: int, T: int, L: int, device, gen, cuda: bool):
        H, P, N, G = shape["heads"], shape["head_dim"], shape["d_state"], shape["groups"]
        self.state_bytes = batch * H * P * N * 4
        self.n = _num_copies(self.state_bytes, L, cuda)
        R = L - 1 + T
        bf16 = torch.bfloat16

        def rnd(*s, scale=1.0):
            return torch.randn(*s, generator=gen, device=device) * scale

        self.params = dict(A=-(torch.rand(H, generator=gen, device=device) + 0.5), D=rnd(H),
                           dt_bias=rnd(H, scale=0.5), dt_softplus=True)
        rows = torch.arange(batch, device=device, dtype=torch.int32)
        self.copies = []
        for _ in range(self.n):
            self.copies.append(dict(
                state=rnd(batch, H, P, N, scale=0.1), ring_x=rnd(batch, R, H, P).to(bf16),
                ring_dt=torch.rand(batch, R, H, generator=gen, device=device) * 0.1,
                ring_B=rnd(batch, R, G, N).to(bf16), origin=(rows * 7) % R, count=(rows % L).to(torch.int32),
                x=rnd(batch, T, H, P).to(bf16), dt=rnd(batch, T, H), B=rnd(batch, T, G, N).to(bf16),
                C=rnd(batch, T, G, N).to(bf16), z=rnd(batch, T, H, P).to(bf16),
                y=torch.empty(batch, T, H, P, dtype=bf16, device=device)))

    def rings(self, c):
        return [c[n] for n in ("state", "ring_x", "ring_dt", "ring_B", "origin", "count")]

    def verify(self, k, c, **launch):
        return k._verify(*self.rings(c), *[c[n] for n in ("x", "dt", "B", "C")], self.params["A"],
                         self.params["D"], c["z"], self.params["dt_bias"], True, out=c["y"], **launch)

    def commit(self, k, c, accepted, L, **launch):
        k._commit(*self.rings(c), accepted, L, self.params["A"], **launch)

    def step(self, s, c, state, t):
        s.mamba2_state_update(state, c["x"][:, t], c["dt"][:, t], c["B"][:, t], c["C"][:, t], self.params["A"],
                              self.params["D"], c["z"][:, t], self.params["dt_bias"], True, out=c["y"][:, t])


class DeltaCase:
    verify_module, step_module = "delta_verify", "delta_rule"

    def __init__(self, shape: dict, batch: int, T: int, L: int, device, gen, cuda: bool, per_key: bool):
        Hv, Hk, K, V = shape["value_heads"], shape["key_heads"], shape["key_dim"], shape["value_dim"]
        self.state_bytes = batch * Hv * K * V * 4
        self.n = _num_copies(self.state_bytes, L, cuda)
        R = L - 1 + T
        bf16 = torch.bfloat16
        gshape = (Hv, K) if per_key else (Hv,)

        def rnd(*s, scale=1.0):
            return torch.randn(*s, generator=gen, device=device) * scale

        def gate(*s):
            return -(torch.rand(*s, generator=gen, device=device) * 0.3 + 0.01)

        rows = torch.arange(batch, device=device, dtype=torch.int32)
        self.copies = []
        for _ in range(self.n):
            self.copies.append(dict(
                state=rnd(batch, Hv, K, V, scale=0.1), ring_k=rnd(batch, R, Hk, K).to(bf16),
                ring_d=rnd(batch, R, Hv, V, scale=0.1), ring_g=gate(batch, R, *gshape), origin=(rows * 7) % R,
                count=(rows % L).to(torch.int32), q=rnd(batch, T, Hk, K).to(bf16), k=rnd(batch, T, Hk, K).to(bf16),
                v=rnd(batch, T, Hv, V).to(bf16), beta=torch.rand(batch, T, Hv, generator=gen, device=device) * 0.9
                + 0.05, g=gate(batch, T, *gshape), o=torch.empty(batch, T, Hv, V, dtype=bf16, device=device)))

    def rings(self, c):
        return [c[n] for n in ("state", "ring_k", "ring_d", "ring_g", "origin", "count")]

    def verify(self, k, c, **launch):
        return k._verify(*self.rings(c), *[c[n] for n in ("q", "k", "v", "beta", "g")], out=c["o"], **launch)

    def commit(self, k, c, accepted, L, **launch):
        k._commit(*self.rings(c), accepted, L, **launch)

    def step(self, s, c, state, t):
        s.delta_state_update(state, *[c[n][:, t] for n in ("q", "k", "v", "beta", "g")], out=c["o"][:, t])


def make_case(family, shape, batch, T, L, device, gen, cuda):
    if family == "mamba2":
        return Mamba2Case(shape, batch, T, L, device, gen, cuda)
    return DeltaCase(shape, batch, T, L, device, gen, cuda, per_key=family == "kda")


def accepted_counts(mode: str, batch: int, T: int, device) -> torch.Tensor:
    rows = torch.arange(batch, device=device, dtype=torch.int32)
    return torch.full_like(rows, T) if mode == "all" else 1 + rows % T


def _split_launch(launch: dict | None) -> tuple[dict, dict]:
    """A form's private arguments (:data:`FORMS`) as (``_verify``'s, ``_commit``'s: those under ``"_commit"``)."""
    launch = dict(launch or {})
    return launch, launch.pop("_commit", {})


def replay_steps(case, kv, accepted: torch.Tensor, L: int, launch: dict | None = None):
    """L speculative steps: verify (``launch``: the verify form's private arguments, see :data:`FORMS`) + commit,
    rotating over the input copies."""
    launch, commit_launch = _split_launch(launch)

    def run():
        for i in range(L):
            c = case.copies[i % case.n]
            case.verify(kv, c, **launch)
            case.commit(kv, c, accepted, L, **commit_launch)

    return run


def snapshot_steps(case, ks, T: int, L: int, copy: bool):
    """L speculative steps of the snapshot approach: T in-place standard steps, each followed (``copy``) by a copy of
    the state into that token's snapshot slot."""
    snaps = [torch.empty_like(case.copies[0]["state"]) for _ in range(T)] if copy else []

    def run():
        for i in range(L):
            c = case.copies[i % case.n]
            for t in range(T):
                case.step(ks, c, c["state"], t)
                if copy:
                    snaps[t].copy_(c["state"])

    return run


def verify_only(case, kv, L: int):
    """L verify calls at the default form and launch (no commit), rotating over the input copies."""
    def run():
        for i in range(L):
            case.verify(kv, case.copies[i % case.n])

    return run


def commit_only(case, kv, count: int, accepted: int, L: int, launch: dict | None = None, fill_only: bool = False):
    """L commit calls, each on counts reset to ``count`` with ``accepted`` records for every row (every row flushes
    where ``count + accepted >= L``, none otherwise), rotating over the input copies; ``fill_only``: the count resets
    alone (their time is subtracted from the commit's)."""
    accepted_rows = torch.full_like(case.copies[0]["count"], accepted)

    def run():
        for i in range(L):
            c = case.copies[i % case.n]
            c["count"].fill_(count)
            if not fill_only:
                case.commit(kv, c, accepted_rows, L, **(launch or {}))

    return run


def commit_launches(family: str, tiles: list[int], warps: list[int]) -> dict[str, dict]:
    """``--commit-tiles`` x ``--commit-warps`` as ``_commit`` arguments by label: Mamba-2 ``p<block_p>w<warps>``, the
    delta rule ``<block_v>x<warps>/loop`` and ``/dot`` (records folded one by one, or as one tf32x3 product)."""
    if family == "mamba2":
        return {f"p{t}w{w}": dict(_config=dict(block_p=t, num_warps=w)) for t in tiles for w in warps}
    return {f"{t}x{w}/{fold}": dict(_block_v=t, _num_warps=w, _fold_dot=fold == "dot")
            for t in tiles for w in warps for fold in ("loop", "dot") if t >= 16 or fold == "loop"}


def time_parts(args, family: str, case, kv, T: int, L: int, timer) -> dict:
    """Verify alone, and commit alone on a flush step (every row flushes) and on a count-only step (no row does),
    at the default launches, and the flush at each ``--commit-tiles`` x ``--commit-warps`` launch; microseconds per
    call, the count resets' time subtracted."""
    def us(fn):
        return timer(fn)["ms"] * 1e3 / L

    fill = us(commit_only(case, kv, L - T, T, L, fill_only=True))
    parts = dict(verify_us=us(verify_only(case, kv, L)), count_reset_us=fill,
                 commit_flush_us=us(commit_only(case, kv, L - T, T, L)) - fill,
                 commit_count_only_us=us(commit_only(case, kv, 0, 1, L)) - fill)
    sweep = {}
    for label, launch in commit_launches(family, args.commit_tiles, args.commit_warps).items():
        try:
            sweep[label] = us(commit_only(case, kv, L - T, T, L, launch)) - fill
        except Exception as error:  # out of resources (shared memory, registers) for this launch
            sweep[label] = f"{type(error).__name__}"
    if sweep:
        timed = {k: v for k, v in sweep.items() if isinstance(v, float)}
        parts.update(commit_flush_sweep=sweep, commit_flush_best=min(timed, key=timed.get) if timed else None)
    return parts


# ---------------------------------------------------------------------------------------------------------------
# correctness check on the device


def _rel(got, want) -> float:
    return ((got.float() - want.float()).abs().max() / want.float().abs().max().clamp_min(1)).item()


def check(family, shape, T, L, device, launch: dict | None = None) -> dict:
    """verify + commit kernels vs the torch references on two rows of the real shape (row 0 replays, row 1 flushes on
    commit). Relative max errors and whether counts match."""
    k = load_kernels("mamba2_verify" if family == "mamba2" else "delta_verify")
    gen = torch.Generator(device=device).manual_seed(0)
    case = make_case(family, shape, 2, T, L, device, gen, cuda=False)
    c = case.copies[0]
    c["count"].copy_(torch.tensor([0, L - 1], dtype=torch.int32))
    ref = {n: t.clone() for n, t in c.items()}
    out_name = "y" if family == "mamba2" else "o"
    c[out_name], ref[out_name] = (torch.empty(c[out_name].shape, device=device) for _ in range(2))
    accepted = torch.tensor([T, 1], dtype=torch.int32, device=device)
    launch, commit_launch = _split_launch(launch)
    case.verify(k, c, **launch)
    case.commit(k, c, accepted, L, **commit_launch)
    if family == "mamba2":
        p = case.params
        k.mamba2_verify_ref(*case.rings(ref), *[ref[n] for n in ("x", "dt", "B", "C")], p["A"], p["D"], ref["z"],
                            p["dt_bias"], True, out=ref["y"])
        k.mamba2_commit_ref(*case.rings(ref), accepted, L, p["A"])
    else:
        k.delta_verify_ref(*case.rings(ref), *[ref[n] for n in ("q", "k", "v", "beta", "g")], out=ref["o"])
        k.delta_commit_ref(*case.rings(ref), accepted, L)
    result = dict(out_rel_err=_rel(c[out_name], ref[out_name]), state_rel_err=_rel(c["state"], ref["state"]),
                  counts_ok=bool(torch.equal(c["count"], ref["count"])))
    result["ok"] = result["out_rel_err"] < 1e-4 and result["state_rel_err"] < 1e-5 and result["counts_ok"]
    return result


# ---------------------------------------------------------------------------------------------------------------
# main


def bench(args, device, timer, copy_bw) -> tuple[list[dict], dict]:
    cuda = device.type == "cuda"
    L = args.buffer_len
    rows, checks = [], {}
    for family in args.families:
        shapes = SMOKE_SHAPES[family] if args.smoke else SHAPES[family]
        kv = load_kernels("mamba2_verify" if family == "mamba2" else "delta_verify")
        ks = load_kernels("mamba2" if family == "mamba2" else "delta_rule")
        for name, shape in shapes.items():
            if not args.no_check:
                for form in ("", *_family_forms(args, family)):
                    label = f"{family}/{name}" + (f"/{form}" if form else "")
                    checks[label] = check(family, shape, max(args.windows), L, device, FORMS[form])
                    print(f"check {label}: {checks[label]}", flush=True)
            for batch in args.batches:
                for T in args.windows:
                    gen = torch.Generator(device=device).manual_seed(batch * 100 + T)
                    case = make_case(family, shape, batch, T, L, device, gen, cuda)
                    row = dict(family=family, shape=name, **shape, batch=batch, window=T, buffer_len=L,
                               ring=L - 1 + T, copies=case.n, state_MiB=case.state_bytes / 2**20)

                    for mode in _arms(args, family):
                        accept, _, form = mode.partition("_")
                        accepted = accepted_counts(accept, batch, T, device)
                        mean_accepted = accepted.float().mean().item()
                        t = timer(replay_steps(case, kv, accepted, L, FORMS[form]))
                        row[f"replay_{mode}_us"] = t["ms"] * 1e3 / L
                        row[f"replay_{mode}_p20_us"] = t["p20_ms"] * 1e3 / L
                        row[f"replay_{mode}_p80_us"] = t["p80_ms"] * 1e3 / L
                        row[f"replay_{mode}_mean_accepted"] = mean_accepted
                        row[f"replay_{mode}_model_state_bytes"] = case.state_bytes * (1 + 2 * mean_accepted / L)
                    row.update(verify_compiled=_compiled_info(kv, "verify"),
                               commit_compiled=_compiled_info(kv, "commit"))
                    if cuda:
                        torch.cuda.empty_cache()
                    for arm, copy in (("snapshot", True), ("steps_only", False)):
                        t = timer(snapshot_steps(case, ks, T, L, copy))
                        row[f"{arm}_us"] = t["ms"] * 1e3 / L
                        row[f"{arm}_p20_us"] = t["p20_ms"] * 1e3 / L
                        row[f"{arm}_p80_us"] = t["p80_ms"] * 1e3 / L
                        if cuda:
                            torch.cuda.empty_cache()
                    if args.parts:
                        row.update(time_parts(args, family, case, kv, T, L, timer))
                        row["standard_step_us"] = row["steps_only_us"] / T  # reads and writes the state once
                    row["snapshot_model_state_bytes"] = 4 * case.state_bytes * T
                    row["steps_only_model_state_bytes"] = 2 * case.state_bytes * T
                    for mode in _arms(args, family):
                        row[f"speedup_{mode}_vs_snapshot"] = row["snapshot_us"] / row[f"replay_{mode}_us"]
                        row[f"speedup_{mode}_vs_steps_only"] = row["steps_only_us"] / row[f"replay_{mode}_us"]
                        row[f"replay_{mode}_model_GBps"] = (row[f"replay_{mode}_model_state_bytes"]
                                                            / (row[f"replay_{mode}_us"] * 1e-6) / 1e9)
                    row["snapshot_model_GBps"] = row["snapshot_model_state_bytes"] / (row["snapshot_us"] * 1e-6) / 1e9
                    row["copy_bandwidth_GBps"] = copy_bw
                    del case
                    rows.append(row)
                    _print_row(row, _arms(args, family), header=len(rows) == 1 or rows[-2]["family"] != family)
                    if args.parts:
                        _print_parts(row)
    return rows, checks


# Forms timed beside the default (arms ``<accept>_<form>``): the private arguments of ``_verify``, and under
# ``_commit`` those of ``_commit`` (``fold_dot`` / ``fold_loop``: the default verify, the commit's records folded as
# one product / one by one; ``kernels.delta_verify.default_fold_dot`` picks one of them per gate kind).
FORMS = {"": {}, "products": dict(_products=True), "tf32x3": dict(_products="tf32x3"), "steps": dict(_steps=True),
         "fold_dot": dict(_commit=dict(_fold_dot=True)), "fold_loop": dict(_commit=dict(_fold_dot=False)),
         "weights": dict(_weights=True), "no_weights": dict(_weights=False),
         "weights_4warps": dict(_weights=True, _weights_warps=4),
         "weights_newest_first": dict(_weights=True, _newest_first=True)}
DELTA_ONLY_FORMS = ("steps", "fold_dot", "fold_loop")  # the delta rule's forms with no Mamba-2 counterpart
# KDA's per-head pre-launch of the record decays (``_verify``'s ``_weights``) on and off; the default turns it on from
# ``kernels.delta_verify.WEIGHTS_FROM_WINDOW`` tokens on
# (weights_4warps: that pre-launch on four warps, default 1; weights_newest_first: reading the records newest first)
PER_KEY_ONLY_FORMS = ("weights", "no_weights", "weights_4warps", "weights_newest_first")


def _family_forms(args, family: str) -> list[str]:
    return [form for form in args.forms if (family != "mamba2" or form not in DELTA_ONLY_FORMS)
            and (family == "kda" or form not in PER_KEY_ONLY_FORMS)]


def _arms(args, family: str) -> list[str]:
    """Replay arms: each accept mode (the default form), and with ``--forms`` the same with each named form of the
    verify kernel (``<mode>_products`` for IEEE float32 products, ``<mode>_tf32x3``, ``<mode>_steps``) or commit
    (``<mode>_fold_dot``, ``<mode>_fold_loop``), or KDA's record decays computed once per head or not
    (``<mode>_weights``, ``<mode>_no_weights``), timed in the same run."""
    return [*args.accept, *(f"{mode}_{form}" for form in _family_forms(args, family) for mode in args.accept)]


def _forms(text: str) -> list[str]:
    """--forms: ``ieee`` (or empty) -> "products", ``tf32x3``, ``steps``, ``fold_dot``, ``fold_loop``, ``weights``,
    ``no_weights``, ``weights_4warps``, ``weights_newest_first``."""
    forms = ["products" if f in ("", "ieee", "products") else f for f in text.split(",")]
    for form in forms:
        if form not in FORMS or not form:
            raise argparse.ArgumentTypeError(f"unknown verify form {form!r}; use ieee, tf32x3, steps, fold_dot, "
                                             "fold_loop, weights, no_weights, weights_4warps and/or "
                                             "weights_newest_first")
    return forms


def _print_row(r, modes, header):
    if header:
        cols = "".join(f" {'replay ' + m + ' us':>17} {'x snap':>7} {'x steps':>8}" for m in modes)
        print(f"\n{'family':<8}{'shape':<15}{'batch':>6}{'T':>3} |{cols} | {'snapshot us':>12} {'steps-only us':>14}")
    cols = "".join(f" {r[f'replay_{m}_us']:>17.1f} {r[f'speedup_{m}_vs_snapshot']:>7.2f} "
                   f"{r[f'speedup_{m}_vs_steps_only']:>8.2f}" for m in modes)
    print(f"{r['family']:<8}{r['shape']:<15}{r['batch']:>6}{r['window']:>3} |{cols} | {r['snapshot_us']:>12.1f} "
          f"{r['steps_only_us']:>14.1f}", flush=True)


def _print_parts(r):
    sweep = r.get("commit_flush_sweep") or {}
    best = r.get("commit_flush_best")
    print(f"{'':<32}| verify alone {r['verify_us']:.1f} us; commit flushing every row {r['commit_flush_us']:.1f} us "
          f"({r['commit_flush_us'] / r['standard_step_us']:.2f} standard steps of {r['standard_step_us']:.1f}), "
          f"count only {r['commit_count_only_us']:.1f} us"
          + (f"; flush at {best} {sweep[best]:.1f} us" if best else ""), flush=True)
    if sweep:
        ranked = sorted(sweep.items(), key=lambda kv: kv[1] if isinstance(kv[1], float) else float("inf"))
        print(f"{'':<32}| flush launches: " + ", ".join(
            f"{label} {v:.1f}" if isinstance(v, float) else f"{label} {v}" for label, v in ranked), flush=True)


def _int_list(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--family", default=",".join(DEFAULT_FAMILIES),
                        help=f"comma-separated subset of {','.join(SHAPES)} (default {','.join(DEFAULT_FAMILIES)})")
    parser.add_argument("--windows", type=_int_list, default=None, help=f"comma-separated T (default {WINDOWS})")
    parser.add_argument("--batches", type=_int_list, default=None, help=f"comma-separated batch sizes (default "
                        f"{BATCHES})")
    parser.add_argument("--buffer-len", type=int, default=None, help="L (default 16; 4 with --smoke)")
    parser.add_argument("--accept", default=",".join(ACCEPT), help="accepted tokens per step: 'all' (T per row) "
                        "and/or 'mixed' (1 + row mod T)")
    parser.add_argument("--forms", "--products", dest="forms", nargs="?", type=_forms, const=["products"], default=[],
                        help="also time other forms of the verify kernels, comma-separated: 'ieee' (the default: "
                        "matrix products in IEEE float32, arms '<accept>_products'), 'tf32x3' (products on tensor "
                        "cores, '<accept>_tf32x3'), 'steps' (delta rule: records folded, then the window stepped in "
                        "registers, '<accept>_steps'), 'fold_dot' (delta rule: the default verify, the commit's "
                        "records folded as one tf32x3 product, '<accept>_fold_dot'), 'fold_loop' (the same, records "
                        "folded one by one, '<accept>_fold_loop'; the default picks one per gate kind), 'weights' "
                        "(KDA: the default form with the record decays computed once per head by a pre-launch, "
                        "'<accept>_weights'), 'no_weights' (KDA: the same without it; the default uses it from 3 "
                        "tokens on), 'weights_4warps' (KDA: the pre-launch on four warps), 'weights_newest_first' "
                        "(KDA: the pre-launch reading the records newest first)")
    parser.add_argument("--parts", action="store_true", help="also time verify alone and commit alone (every row "
                        "flushing, and count only) at the default launches, against one standard step")
    parser.add_argument("--commit-tiles", type=_int_list, default=[], help="with --parts: flush launches to time, "
                        "BLOCK_P (Mamba-2) / BLOCK_V (delta rule, both folds) values")
    parser.add_argument("--commit-warps", type=_int_list, default=[4], help="with --parts and --commit-tiles: warps")
    parser.add_argument("--out", type=Path, default=None, help="write all numbers as JSON here")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes, one repetition (CPU / TRITON_INTERPRET)")
    parser.add_argument("--no-check", action="store_true", help="skip the on-device correctness check")
    parser.add_argument("--budget-ms", type=float, default=150.0, help="GPU time per measurement")
    args = parser.parse_args(argv)
    args.families = [f for f in args.family.split(",") if f]
    unknown = [f for f in args.families if f not in SHAPES]
    if unknown:
        parser.error(f"unknown family {unknown}; choose from {sorted(SHAPES)}")
    if args.commit_tiles and not args.parts:
        parser.error("--commit-tiles needs --parts")
    args.accept = [m for m in args.accept.split(",") if m]
    if not args.accept or any(m not in ACCEPT for m in args.accept):
        parser.error(f"--accept must be a comma-separated subset of {ACCEPT}")
    args.windows = args.windows or ([2] if args.smoke else WINDOWS)
    args.batches = args.batches or ([2] if args.smoke else BATCHES)
    if args.buffer_len is None:
        args.buffer_len = 4 if args.smoke else 16
    if any(T < 1 or T > 16 for T in args.windows):
        parser.error("windows must be in [1, 16]")

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        raise SystemExit("no CUDA device: set TRITON_INTERPRET=1 (and use --smoke) to run the kernels on the CPU")
    timer = Timer(device, reps=1 if args.smoke else None, budget_ms=args.budget_ms)
    copy_bw = copy_bandwidth(device, timer, 2**20 if args.smoke else 2**30)["best"]
    import triton

    info = dict(
        device=torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({platform.processor()})",
        torch=torch.__version__, triton=triton.__version__, python=platform.python_version(),
        triton_interpret=os.environ.get("TRITON_INTERPRET") == "1", smoke=args.smoke, families=args.families,
        windows=args.windows, batches=args.batches, buffer_len=args.buffer_len, accept=args.accept,
        copy_bandwidth_GBps=copy_bw,
        timing="CUDA graph of L steps, L2 flushed before each replay, CUDA events, median" if device.type == "cuda"
        else "perf_counter (interpreter; not meaningful)",
    )
    print(f"{info['device']}  torch {info['torch']}  triton {info['triton']}")
    print(f"device-to-device copy bandwidth: {copy_bw:.0f} GB/s (read + write)")
    with torch.inference_mode() if device.type == "cpu" else contextlib.nullcontext():
        rows, checks = bench(args, device, timer, copy_bw)
    return finish_bench(args, dict(info, checks=checks, results=rows))


if __name__ == "__main__":
    main()
