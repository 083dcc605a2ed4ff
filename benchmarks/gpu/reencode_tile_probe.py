"""How fast is the read copy's re-encode alone, and over which launch? Times ``reencode_read_copy`` of a
Nemotron-H-8B-shaped checkpoint [256, 128, 64, 128] float32 with every row selected: fp8; nvfp4 with its own amax
pass and with the amax given (what the replay steps' flushes now hand it), over the grids, warps, the strided loads
and the encode's arithmetic (quotients by the block's reciprocal or divisions); against a clone of
the checkpoint and a torch amax of it (copy and read bandwidth). Prints us per call (cold L2, CUDA graph) and the
GB/s of the bytes each must move. (Run 175 also timed the compact loops software-pipelined 2 / 3 deep, ``tl.range``:
nvfp4 659 / 636 us against 595, fp8 371 / 363 against 335, dropped; and 8-64 programs per row, 8-64 rows per tile:
575-619 us against 595.)"""

from __future__ import annotations

import argparse
import json

import torch

from hf_replayssm.kernels import read_copy_encode as enc
from hf_replayssm.kernels.bench_common import Timer
from hf_replayssm.precision.formats import get_format


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="256,128,64,128")
    parser.add_argument("--out", required=True)
    parser.add_argument("--smoke", action="store_true", help="on the CPU (TRITON_INTERPRET=1), --shape small")
    args = parser.parse_args()
    shape = tuple(int(n) for n in args.shape.split(","))
    device = torch.device("cpu" if args.smoke else "cuda")
    gen = torch.Generator(device=device).manual_seed(0)
    state = torch.randn(shape, generator=gen, device=device) * 3
    select = torch.ones(shape[0], dtype=torch.bool, device=device)
    amax = state.abs().amax(dim=(1, 2, 3)).view(torch.int32).contiguous()
    copies = {fmt: get_format(fmt).encode(state) for fmt in ("fp8", "nvfp4")}
    state_bytes = state.numel() * 4
    copy_bytes = {fmt: sum(t.numel() * t.element_size() for t in c.values() if t is not None)
                  for fmt, c in copies.items()}
    timer = Timer(device, reps=1 if args.smoke else None, budget_ms=300.0)
    rows = []

    def arm(name, fn, moved):
        us = timer(fn)["ms"] * 1e3
        rows.append(dict(arm=name, us=us, gbps=moved / us / 1e3))
        print(f"{name:40s} {us:9.1f} us  {moved / us / 1e3:7.0f} GB/s", flush=True)

    arm("clone (read + write)", lambda: state.clone(), 2 * state_bytes)
    arm("torch amax (read)", lambda: state.abs().amax(dim=(1, 2, 3)), state_bytes)
    for fmt in ("fp8", "nvfp4"):
        copy = copies[fmt]
        moved = state_bytes + copy_bytes[fmt]
        arm(f"{fmt} default", lambda copy=copy, fmt=fmt: enc.reencode_read_copy(state, copy, fmt, select), moved)
        arm(f"{fmt} per-tile grid", lambda copy=copy, fmt=fmt: enc.reencode_read_copy(
            state, copy, fmt, select, _programs_per_row=None), moved)
    copy = copies["nvfp4"]
    moved = state_bytes + copy_bytes["nvfp4"]
    variants = [("amax given", {}), ("amax given, per-tile grid", dict(_programs_per_row=None))]
    variants += [("amax given, strided loads", dict(_nvfp4_contiguous_load=False))]
    # the encode's arithmetic: a division per element and the comparisons (before run 178), both grids
    variants += [("amax given, division + comparisons", dict(_nvfp4_reciprocal_quotient=False)),
                 ("amax given, per-tile grid, division + comparisons",
                  dict(_nvfp4_reciprocal_quotient=False, _programs_per_row=None))]
    for name, options in variants:
        arm(f"nvfp4 {name}", lambda options=options: enc.reencode_read_copy(state, copy, "nvfp4", select, amax=amax,
                                                                            **options), moved)
    default_warps = enc.NUM_WARPS
    for warps in (2, 8):
        enc.NUM_WARPS = warps
        arm(f"nvfp4 amax given, {warps} warps", lambda: enc.reencode_read_copy(state, copy, "nvfp4", select,
                                                                               amax=amax), moved)
        arm(f"fp8 {warps} warps", lambda: enc.reencode_read_copy(state, copies["fp8"], "fp8", select),
            state_bytes + copy_bytes["fp8"])
    enc.NUM_WARPS = default_warps
    with open(args.out, "w") as f:
        json.dump(dict(shape=shape, device=torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                       rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
