"""Where a Mamba-2 replay-only launch reading a read copy spends its time, H200, Nemotron-H-8B shape: microseconds per
launch at record counts 0, 8 and 14 (count 0: the copy's decode and product alone, no records), per launch tile, with
and without the record coefficients from a pre-launch (``_weights``), against the fp32 checkpoint; then the host
cycle as the cache runs it at each tile. Why: a replay launch reading an fp8 copy moves 4x fewer state bytes than the
fp32 one, but each of its programs still loads the records' B [R, N] (twice the tile's fp8 bytes) and reduces them
against C, work the fp32 launch hides behind its larger tile read.

    python3 benchmarks/gpu/copy_replay_probe.py [--batch 256] [--formats fp8,nvfp4] --out RESULT.json
    python3 benchmarks/gpu/copy_replay_probe.py --smoke --out RESULT.json   # CPU, TRITON_INTERPRET=1, tiny shapes
"""

from __future__ import annotations

import argparse
import json

import torch

from hf_replayssm.kernels import bench, mamba2
from hf_replayssm.kernels.bench_common import Timer

CONFIGS = [(32, 2, 4), (64, 2, 4), (64, 4, 4), (32, 1, 4), (16, 1, 4), (32, 4, 4)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--formats", default="fp8,nvfp4")
    parser.add_argument("--counts", default="0,8,14")
    parser.add_argument("--configs", default="", help="PxWxU tiles instead of the built-in list, comma-separated")
    parser.add_argument("--no-weights", action="store_true", help="skip the coefficients pre-launch arms")
    parser.add_argument("--device-steps", action="store_true",
                        help="also the compiled path's split step (rows in phase / mixed) at each replay tile, its "
                             "flush launch kept at the default tile")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU (one tile, one count)")
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    cuda = not args.smoke
    device = torch.device("cuda" if cuda else "cpu")
    timer = Timer(device, reps=None if cuda else 1, budget_ms=60.0)
    L = 16 if cuda else 4
    shape = bench.MAMBA2_SHAPES["nemotron-h-8b"] if cuda else (2, 16, 16, 1)
    if args.smoke:
        args.batch, args.counts, args.configs = 2, "1", args.configs or "16x1x4"
    gen = torch.Generator(device=device).manual_seed(args.batch)
    inputs = bench.ReplayInputs(args.batch, *shape, L, device, gen, "in_phase", cuda)
    counts = [int(c) for c in args.counts.split(",") if c]
    configs = [tuple(int(n) for n in c.split("x")) for c in args.configs.split(",")] if args.configs else CONFIGS
    # the split step's flush launch at its default tile (the fp32 device-positions one) while the replay tile varies
    flush_cfg = mamba2.replay_launch_config(args.batch, *shape[:3], device_phase=True)
    steps = {phase: bench.ReplayInputs(args.batch, *shape, L, device, gen, phase, cuda)
             for phase in (("in_phase", "mixed") if args.device_steps else ())}
    results = {}

    def per_step(fn):
        return timer(fn)["ms"] * 1e3 / L

    standard = bench.StepInputs(args.batch, *shape, L, device, gen, cuda)
    results["standard_us"] = per_step(standard.kernel_fn(mamba2._state_update))
    print(f"standard step {results['standard_us']:.1f} us", flush=True)
    del standard
    for fmt in ["fp32", *args.formats.split(",")]:
        read = None if fmt == "fp32" else fmt
        if read is not None:
            inputs.add_read_copies(fmt)
            for step_inputs in steps.values():
                step_inputs.add_read_copies(fmt)
        for p, w, u in configs:
            cfg = dict(block_p=p, num_warps=w, fold_unroll=u)
            name = f"{fmt} p{p}w{w}u{u}"
            cells = {}
            for weights in (False,) if args.no_weights else (False, True):
                for count in counts:
                    try:
                        cells[f"count{count}{'_weights' if weights else ''}"] = per_step(inputs.host_fn(
                            mamba2._replay_step, only=count, read_format=read, _config=cfg, _weights=weights))
                    except Exception as error:  # out of resources for this tile
                        cells[f"count{count}{'_weights' if weights else ''}"] = f"{type(error).__name__}: {error}"[:80]
            for weights in (False,) if args.no_weights else (False, True):
                name_w = "_weights" if weights else ""
                if read is not None:
                    cells[f"cycle_as_cache{name_w}"] = per_step(inputs.host_fn(
                        mamba2._replay_step, read_format=read, reencode="step", _config=cfg, flush_launch={},
                        _weights=weights))
                else:
                    cells[f"cycle{name_w}"] = per_step(inputs.host_fn(mamba2._replay_step, _config=cfg,
                                                                      flush_launch={}, _weights=weights))
                for phase, step_inputs in steps.items():
                    launch = dict(_config=cfg, _flush_config=flush_cfg, _weights=weights)
                    fn = (step_inputs.fn(mamba2._replay_step, **launch) if read is None
                          else step_inputs.device_read_copy_fn(mamba2._replay_step, "step", read, **launch))
                    cells[f"device_{phase}{name_w}"] = per_step(fn)
            regs = getattr(mamba2.LAST_COMPILED.get("replay_phase1"), "n_regs", None)
            results[name] = dict(cells, n_regs_phase1=regs)
            print(f"{name:<18} " + ", ".join(f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}"
                                             for k, v in cells.items()), flush=True)
            if cuda:
                torch.cuda.empty_cache()
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name() if cuda else "cpu", batch=args.batch, results=results),
                      f, indent=1)


if __name__ == "__main__":
    main()
