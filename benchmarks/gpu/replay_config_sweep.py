"""Wider tiles for the replay step, H200, real shapes: microseconds per decode step (a cycle of L steps / L; rows in
mixed phases through the device-phase launch, and all rows at one host-known position through the phase-specialised
launches), the package default against one program per (row, head) or half of it. Why: the verify kernels ran
1.2-2.9x faster with fewer, wider programs (runs 78 / 79), since each program redoes the per-(row, head) record work.
Run on the GPU machine after ``source benchmarks/gpu/install.sh``: ``python3 $R/benchmarks/gpu/replay_config_sweep.py
[--batches 256] [--families mamba2,gdn,kda] [--configs 32x1,16x1]`` (``--configs``: launches instead of the built-in
list, ``VxW`` for the delta rule, ``PxWxU`` for Mamba-2; with several families, each takes the entries of its
arity)."""

from __future__ import annotations

import argparse

import torch

from hf_replayssm.kernels import bench, bench_delta, delta_rule, mamba2
from hf_replayssm.kernels.bench_common import Timer

# Mamba-2 (block_p, num_warps, fold_unroll); delta rule (block_v, num_warps)
CONFIGS = {"mamba2": [(64, 2, 4), (64, 4, 4), (64, 2, 1), (32, 4, 4)],
           "gdn": [(128, 4), (32, 4)], "kda": [(128, 4), (64, 4)]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", default="256")
    parser.add_argument("--families", default="mamba2,gdn,kda")
    parser.add_argument("--configs", default="", help="VxW (delta rule) / PxWxU (Mamba-2) launches, comma-separated")
    args = parser.parse_args()
    configs = dict(CONFIGS)
    if args.configs:
        given = [tuple(int(n) for n in c.split("x")) for c in args.configs.split(",")]
        configs = {family: [c for c in given if len(c) == (3 if family == "mamba2" else 2)] for family in CONFIGS}
    device = torch.device("cuda")
    timer = Timer(device, reps=None, budget_ms=80.0)
    L = 16
    for family in args.families.split(","):
        for batch in (int(b) for b in args.batches.split(",")):
            gen = torch.Generator(device=device).manual_seed(batch)
            for phase in ("mixed", "host"):
                if family == "mamba2":
                    name, shape = "nemotron-h-8b", bench.MAMBA2_SHAPES["nemotron-h-8b"]
                    inputs = bench.ReplayInputs(batch, *shape, L, device, gen, "mixed" if phase == "mixed"
                                                else "in_phase", True)
                    # "default": no launch argument (what callers get: the tile by positions, the walks)
                    launches = [("default", {})] + [
                        (f"p{p}w{w}u{u}", dict(_config=dict(block_p=p, num_warps=w, fold_unroll=u)))
                        for p, w, u in configs[family]]
                    step = mamba2._replay_step
                else:
                    name, shape = next(iter(bench_delta.SHAPES[family].items()))
                    inputs = bench_delta.ReplayInputs(batch, shape, family == "kda", L, device, gen,
                                                      "mixed" if phase == "mixed" else "in_phase", True)
                    launches = [("default", {})] + [
                        (f"v{v}w{w}", dict(_block_v=v, _num_warps=w)) for v, w in configs[family]]
                    step = delta_rule._replay_step
                cells = []
                for label, launch in launches:
                    # host positions: the flush-only launch at its own default tile, only the replay launches vary
                    fn = (inputs.fn(step, **launch) if phase == "mixed"
                          else inputs.host_fn(step, flush_launch={}, **launch))
                    try:
                        us = timer(fn)["ms"] * 1e3 / L
                    except Exception as error:  # out of resources for this tile
                        cells.append(f"{label}: {type(error).__name__}")
                        continue
                    cells.append(f"{label}: {us:.1f}")
                print(f"{family:<7}{name:<15} batch {batch:>4} {phase:<6}| " + ", ".join(cells), flush=True)
                del inputs
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
