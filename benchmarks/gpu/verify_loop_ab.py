"""A/B timing of the verify kernels: the window as a runtime loop (the package's kernels) against the former unrolled
form (``benchmarks/gpu/ab/{delta,mamba2}_verify_unrolled.py``, not committed: ``git show
570d9f3~1:kernels/delta_verify.py > benchmarks/gpu/ab/delta_verify_unrolled.py`` and the same for mamba2_verify;
loaded into the installed package under another name so that their relative imports resolve), same inputs,
interleaved, batch 64 / 256, T = 2, 4, 8, 11.
Run on the GPU machine after ``source benchmarks/gpu/install.sh``: ``python3 $R/benchmarks/gpu/verify_loop_ab.py
[FAMILIES]`` (comma-separated, default mamba2,gdn,kda). Run 67 timed the plain runtime loop of every family; since
then the delta-rule kernel unrolls over ``BLOCK_T`` with the width as a runtime guard (run 68).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

import torch
from triton.testing import do_bench

from hf_replayssm.kernels import bench_verify as bv

HERE = Path(__file__).resolve().parent


def load_unrolled(name: str):
    full = f"hf_replayssm.kernels.{name}_unrolled"
    spec = importlib.util.spec_from_file_location(full, HERE / "ab" / f"{name}_unrolled.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[full] = module
    spec.loader.exec_module(module)
    return module


def main() -> None:
    device = torch.device("cuda")
    gen = torch.Generator(device=device).manual_seed(0)
    print(f"{'family':<7} {'batch':>5} {'T':>3} | {'loop us':>9} {'unrolled us':>12} {'loop/unrolled':>14} | equal")
    for family in (sys.argv[1].split(",") if len(sys.argv) > 1 else ("mamba2", "gdn", "kda")):
        shape = next(iter(bv.SHAPES[family].values()))
        module = bv.Mamba2Case.verify_module if family == "mamba2" else bv.DeltaCase.verify_module
        loop, unrolled = importlib.import_module(f"hf_replayssm.kernels.{module}"), load_unrolled(module)
        for batch in (64, 256):
            for T in (2, 4, 8, 11):
                case = bv.make_case(family, shape, batch, T, 16, device, gen, True)
                c = case.copies[0]
                out_loop = case.verify(loop, c).clone()
                out_unrolled = case.verify(unrolled, c).clone()
                equal = torch.equal(out_loop, out_unrolled)
                times = {"loop": [], "unrolled": []}
                for _ in range(3):  # interleaved
                    for arm, module_ in (("loop", loop), ("unrolled", unrolled)):
                        times[arm].append(do_bench(lambda m=module_, cs=case, cc=c: cs.verify(m, cc), warmup=25,
                                                   rep=100))
                t_loop, t_unrolled = min(times["loop"]) * 1e3, min(times["unrolled"]) * 1e3
                print(f"{family:<7} {batch:>5} {T:>3} | {t_loop:>9.1f} {t_unrolled:>12.1f} "
                      f"{t_loop / t_unrolled:>14.3f} | {equal}", flush=True)


if __name__ == "__main__":
    main()
