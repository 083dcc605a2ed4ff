"""Where a delta-rule verify's time goes, H200, batch 256, the default launch: microseconds per verify
(``triton.testing.do_bench``, inputs of ``kernels/bench_verify.py``) against the window width T (1, 2, 4, 8), the
committed records per row (every row at count 0, 8 or 15) and without the q / k L2 normalisation. GDN's token form
cost about one replay step per window token in run 80 (2.41x snapshots at T = 4 against the 3x target); this says
whether the per-token cost, the records or the normalisation dominates.
Run on the GPU machine after ``source benchmarks/gpu/install.sh``: ``python3 $R/benchmarks/gpu/verify_cost_probe.py
[--families gdn,kda]``."""

from __future__ import annotations

import argparse

import torch
from triton.testing import do_bench

from hf_replayssm.kernels import bench_verify as bv
from hf_replayssm.kernels import delta_verify


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", default="gdn,kda")
    parser.add_argument("--batch", type=int, default=256)
    args = parser.parse_args()
    device = torch.device("cuda")
    gen = torch.Generator(device=device).manual_seed(0)
    for family in args.families.split(","):
        shape = next(iter(bv.SHAPES[family].values()))
        for T in (1, 2, 4, 8):
            case = bv.make_case(family, shape, args.batch, T, 16, device, gen, True)
            c = case.copies[0]
            cells = []
            for count, l2norm in ((0, True), (8, True), (15, True), (8, False)):
                c["count"].fill_(count)
                us = do_bench(lambda n=l2norm, case=case, c=c: case.verify(delta_verify, c, use_qk_l2norm=n),
                              warmup=25, rep=100)
                cells.append(f"count {count:>2}{'' if l2norm else ' no-l2norm'}: {us * 1e3:7.1f}")
            print(f"{family:<4} batch {args.batch} T {T} | " + ", ".join(cells), flush=True)
            del case
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
