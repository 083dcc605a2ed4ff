"""Launch-configuration sweep of the verify kernels (tile width and warps), H200, real shapes: microseconds per
verify (``triton.testing.do_bench``, inputs of ``kernels/bench_verify.py``), every configuration of the chosen forms
(``tokens``, the default token-by-token form; ``ieee`` / ``tf32x3``, the matrix-product form with that ``tl.dot``
precision; ``steps``, the delta rule's records folded then the window stepped in registers; ``tokens_weights`` /
``steps_weights``, KDA only, those two with the record decays computed once per head by a pre-launch) against the
package's default, best six first.
Run on the GPU machine after ``source benchmarks/gpu/install.sh``: ``python3 $R/benchmarks/gpu/verify_config_sweep.py
[--families mamba2,gdn,kda] [--batches 64,256] [--windows 2,4,8] [--forms tokens,ieee] [--tiles 16,32,64]
[--warps 4,8]``."""

from __future__ import annotations

import argparse
import importlib

import torch
from triton.testing import do_bench

from hf_replayssm.kernels import bench_verify as bv

# this sweep's form names -> bench_verify's FORMS (the private arguments of _verify), and whether KDA's per-head
# pre-launch of the record decays (``_weights``) goes with it
FORMS = {"tokens": ("", False), "ieee": ("products", False), "tf32x3": ("tf32x3", False), "steps": ("steps", False),
         "tokens_weights": ("", True), "steps_weights": ("steps", True)}


def configs(family: str, forms: list[str], tiles: list[int], warps_list: list[int]):
    for form in forms:
        name, weights = FORMS[form]
        if (family == "mamba2" and name in bv.DELTA_ONLY_FORMS) or (weights and family != "kda"):
            continue
        # the token form and KDA's pre-launch named explicitly: without them the defaults depend on T
        weights_form = bv.FORMS["weights" if weights else "no_weights"] if family == "kda" else {}
        launch_form = {"_products": False, **bv.FORMS[name], **weights_form, "_form": form}
        for tile in tiles:
            for warps in warps_list:
                launch = (dict(_config=dict(block_p=tile, num_warps=warps)) if family == "mamba2"
                          else dict(_block_v=tile, _num_warps=warps))
                yield dict(launch, **launch_form)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", default="mamba2,gdn,kda")
    parser.add_argument("--batches", default="64,256")
    parser.add_argument("--windows", default="2,4,8")
    parser.add_argument("--forms", default="tokens,ieee", help=f"comma-separated subset of {','.join(FORMS)}")
    parser.add_argument("--tiles", default="16,32,64", help="BLOCK_P (Mamba-2) / BLOCK_V (delta rule) values")
    parser.add_argument("--warps", default="4,8")
    args = parser.parse_args()
    forms = args.forms.split(",")
    unknown = set(forms) - set(FORMS)
    if unknown:
        parser.error(f"unknown forms {sorted(unknown)}; choose from {','.join(FORMS)}")
    device = torch.device("cuda")
    gen = torch.Generator(device=device).manual_seed(0)
    for family in args.families.split(","):
        shape = next(iter(bv.SHAPES[family].values()))
        module = importlib.import_module(
            f"hf_replayssm.kernels.{bv.Mamba2Case.verify_module if family == 'mamba2' else bv.DeltaCase.verify_module}")
        for batch in (int(b) for b in args.batches.split(",")):
            for T in (int(t) for t in args.windows.split(",")):
                case = bv.make_case(family, shape, batch, T, 16, device, gen, True)

                def verify(launch, case=case, module=module):
                    return case.verify(module, case.copies[0], **{k: v for k, v in launch.items() if k != "_form"})

                default = do_bench(lambda: verify({}), warmup=25, rep=100) * 1e3
                rows = []
                for launch in configs(family, forms, [int(t) for t in args.tiles.split(",")],
                                      [int(w) for w in args.warps.split(",")]):
                    try:
                        us = do_bench(lambda la=launch: verify(la), warmup=25, rep=100) * 1e3
                    except Exception as error:  # out of resources (shared memory, registers) for this tile
                        rows.append((float("inf"), launch, type(error).__name__))
                        continue
                    rows.append((us, launch, ""))
                rows.sort(key=lambda r: r[0])
                best = ", ".join(f"{label(la)}: {us:.0f}{' ' + err if err else ''}" for us, la, err in rows[:6])
                print(f"{family:<7} batch {batch:>4} T {T:>2} | default {default:8.1f} us | best {best}", flush=True)


def label(launch: dict) -> str:
    cfg = launch.get("_config") or dict(block_v=launch["_block_v"], num_warps=launch["_num_warps"])
    form = launch["_form"]
    return "/".join(str(v) for v in cfg.values()) + ("" if form == "tokens" else f"/{form}")


if __name__ == "__main__":
    main()
