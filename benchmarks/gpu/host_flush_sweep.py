"""The host-phase flush-only launch (every row at its last buffered position) at several tiles and folds, and the
host-position cycle at the defaults, for Mamba-2 (Nemotron-H 8B shape), KDA (Kimi-Linear) and GDN (Qwen3-Next).

Each timed call is L launches over the bench's rotated state copies (``ReplayInputs.host_fn``, CUDA graph, cold L2),
reported per launch. ``--smoke`` runs tiny shapes on the CPU (one rep each, L = 4, one tile per tile width and fold:
the interpreter ignores num_warps). Run on the GPU machine after
``source benchmarks/gpu/install.sh``:

    python3 $R/benchmarks/gpu/host_flush_sweep.py --batches 64,256 --out RESULT.json
"""

from __future__ import annotations

import argparse
import json

import torch

from hf_replayssm.kernels import bench as mamba2_bench
from hf_replayssm.kernels import bench_delta, delta_rule, mamba2
from hf_replayssm.kernels.bench_common import Timer

L = 16
# Mamba-2 flush tiles: (block_p, num_warps, fold with the record product?) ; delta: (block_v, num_warps, dot?)
MAMBA2_FLUSH = [(16, 1, True), (16, 2, True), (16, 4, True), (32, 2, True), (32, 4, True), (32, 8, True),
                (64, 4, True), (64, 8, True), (16, 2, False), (32, 2, False)]
DELTA_FLUSH = {"kda": [(16, 1, False), (16, 2, False), (32, 1, False), (32, 2, False), (64, 4, False),
                       (64, 4, True), (32, 2, True)],
               "gdn": [(64, 2, True), (32, 2, True), (64, 4, True), (128, 4, True), (128, 8, True), (32, 1, True),
                       (64, 2, False)]}


def _tiles(tiles, smoke):
    """``tiles``, or with ``smoke`` the first of each (tile, fold): the interpreter runs every num_warps alike."""
    if not smoke:
        return tiles
    first = {}
    for tile, warps, dot in tiles:
        first.setdefault((tile, dot), (tile, warps, dot))
    return list(first.values())


def mamba2_rows(batch, timer, device, smoke):
    heads, head_dim, d_state, groups = (2, 16, 16, 1) if smoke else mamba2_bench.MAMBA2_SHAPES["nemotron-h-8b"]
    gen = torch.Generator(device=device).manual_seed(batch)
    inputs = mamba2_bench.ReplayInputs(batch, heads, head_dim, d_state, groups, L, device, gen, "in_phase",
                                       device.type == "cuda")
    row = {"family": "mamba2", "batch": batch,
           "default_replay_config": mamba2.replay_launch_config(batch, heads, head_dim, d_state)}
    row["flush_default_us"] = timer(inputs.host_fn(mamba2._replay_step, only=L - 1))["ms"] * 1e3 / L
    for block_p, warps, dot in _tiles(MAMBA2_FLUSH, smoke):
        if block_p > head_dim:
            continue
        cfg = dict(block_p=block_p, num_warps=warps, flush_loop=not dot)
        row[f"flush_p{block_p}w{warps}_{'dot' if dot else 'loop'}_us"] = timer(inputs.host_fn(
            mamba2._replay_step, only=L - 1, _config=cfg))["ms"] * 1e3 / L
    row["cycle_default_us"] = timer(inputs.host_fn(mamba2._replay_step))["ms"] * 1e3 / L
    row["replay_only_default_us"] = timer(inputs.host_fn(mamba2._replay_step, only=L // 2))["ms"] * 1e3 / L
    return row


def delta_rows(family, batch, timer, device, smoke):
    per_key = family == "kda"
    shape = bench_delta.SMOKE_SHAPES[family]["smoke"] if smoke else bench_delta.SHAPES[family][
        "kimi-linear" if per_key else "qwen3-next"]
    Hv, _, K, V = shape
    gen = torch.Generator(device=device).manual_seed(batch)
    inputs = bench_delta.ReplayInputs(batch, shape, per_key, L, device, gen, "in_phase", device.type == "cuda")
    row = {"family": family, "batch": batch,
           "default_replay_config": delta_rule.replay_launch_config(batch, Hv, K, V, per_key),
           "default_flush_config": delta_rule.host_flush_launch_config(batch, Hv, K, V, per_key)}
    row["flush_default_us"] = timer(inputs.host_fn(delta_rule._replay_step, only=L - 1))["ms"] * 1e3 / L
    for block_v, warps, dot in _tiles(DELTA_FLUSH[family], smoke):
        if block_v > max(16, V):
            continue
        row[f"flush_{block_v}x{warps}_{'dot' if dot else 'loop'}_us"] = timer(inputs.host_fn(
            delta_rule._replay_step, only=L - 1, _block_v=block_v, _num_warps=warps, _flush_dot=dot))["ms"] * 1e3 / L
    row["cycle_default_us"] = timer(inputs.host_fn(delta_rule._replay_step))["ms"] * 1e3 / L
    bv, nw = row["default_replay_config"]
    row["cycle_flush_at_replay_tile_dot_us"] = timer(inputs.host_fn(
        delta_rule._replay_step, flush_launch=dict(_block_v=bv, _num_warps=nw, _flush_dot=True)))["ms"] * 1e3 / L
    return row


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", default="64,256")
    parser.add_argument("--families", default="mamba2,kda,gdn")
    parser.add_argument("--out", required=True)
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU")
    args = parser.parse_args()
    device = torch.device("cpu" if args.smoke else "cuda")
    global L
    if args.smoke:  # a 4-launch cycle has every launch kind of 16's (the interpreter's time is per launch)
        L = 4
    timer = Timer(device, reps=1 if args.smoke else None, budget_ms=150.0)
    rows = []
    for batch in [int(b) for b in args.batches.split(",")]:
        for family in args.families.split(","):
            row = (mamba2_rows(batch, timer, device, args.smoke) if family == "mamba2"
                   else delta_rows(family, batch, timer, device, args.smoke))
            rows.append(row)
            timings = {k: round(v, 1) for k, v in row.items() if k.endswith("_us")}
            print(f"{family} batch {batch}: {timings}", flush=True)
    with open(args.out, "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
