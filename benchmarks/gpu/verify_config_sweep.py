"""Launch-configuration sweep of the verify kernels (tile width and warps), H200, real shapes, batch 64 / 256,
T = 2, 4, 8: microseconds per verify (``triton.testing.do_bench``, inputs of ``kernels/bench_verify.py``), every
configuration of both forms (token by token, the default; matrix products, ``_products=True``) against the
package's default, best first.
Run on the GPU machine after ``source benchmarks/gpu/install.sh``: ``python3 $R/benchmarks/gpu/verify_config_sweep.py
[FAMILIES]`` (comma-separated, default mamba2,gdn,kda)."""

from __future__ import annotations

import importlib
import sys

import torch
from triton.testing import do_bench

from hf_replayssm.kernels import bench_verify as bv


def configs(family: str):
    for products in (False, True):
        for tile in (16, 32, 64):
            for warps in (4, 8):
                launch = (dict(_config=dict(block_p=tile, num_warps=warps)) if family == "mamba2"
                          else dict(_block_v=tile, _num_warps=warps))
                yield dict(launch, _products=True) if products else launch


def main() -> None:
    device = torch.device("cuda")
    gen = torch.Generator(device=device).manual_seed(0)
    for family in (sys.argv[1].split(",") if len(sys.argv) > 1 else ("mamba2", "gdn", "kda")):
        shape = next(iter(bv.SHAPES[family].values()))
        module = importlib.import_module(
            f"hf_replayssm.kernels.{bv.Mamba2Case.verify_module if family == 'mamba2' else bv.DeltaCase.verify_module}")
        for batch in (64, 256):
            for T in (2, 4, 8):
                case = bv.make_case(family, shape, batch, T, 16, device, gen, True)

                def verify(launch, case=case, module=module):
                    return case.verify(module, case.copies[0], **launch)

                default = do_bench(lambda: verify({}), warmup=25, rep=100) * 1e3
                rows = []
                for launch in configs(family):
                    try:
                        us = do_bench(lambda la=launch: verify(la), warmup=25, rep=100) * 1e3
                    except Exception as error:  # out of resources (shared memory, registers) for this tile
                        rows.append((float("inf"), launch, type(error).__name__))
                        continue
                    rows.append((us, launch, ""))
                rows.sort(key=lambda r: r[0])
                best = ", ".join(f"{label(la)}: {us:.0f}{' ' + err if err else ''}" for us, la, err in rows[:4])
                print(f"{family:<7} batch {batch:>4} T {T:>2} | default {default:8.1f} us | best {best}", flush=True)


def label(launch: dict) -> str:
    cfg = launch.get("_config") or dict(block_v=launch["_block_v"], num_warps=launch["_num_warps"])
    return "/".join(str(v) for v in cfg.values()) + ("/products" if launch.get("_products") else "")

if __name__ == "__main__":
    main()
