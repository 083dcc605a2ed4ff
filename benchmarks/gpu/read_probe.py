"""How fast can a Triton program read an fp32 state tile and reduce it against a vector on the H200? The replay step's
core (``S0^T q`` over a [K, BLOCK_V] tile of a [B, H, K, V] state, no records), in three forms:

* ``grid``: one program per tile, plain loads (how the replay kernels load today);
* ``persistent``: a device-sized grid walking the tiles, plain loads, ``tl.range(num_stages=...)``;
* ``tma``: the same walk loading each tile through a tensor descriptor (Hopper's TMA engine), which Triton's pipeliner
  can issue stages ahead.

Each is timed over rotated state copies with a cold L2 (``kernels.bench_common.Timer``) and reported as read
bandwidth against the device's copy bandwidth (read + write), beside a read-modify-write form (the standard step's
traffic) and torch's ``sum`` over the last dim. The question it answers: is the replay launches' 65-79 % of copy
bandwidth (``BENCHMARKS.md``) the ceiling of plain loads, or would loads issued ahead by TMA read faster?

    python3 benchmarks/gpu/read_probe.py [--batch 256] [--heads 32] --out RESULT.json
    python3 benchmarks/gpu/read_probe.py --smoke --out RESULT.json   # CPU, TRITON_INTERPRET=1, tiny shapes
"""

from __future__ import annotations

import argparse
import json

import torch
import triton
import triton.language as tl

from hf_replayssm.kernels.bench_common import Timer, copy_bandwidth


@triton.jit
def _read_tile_grid(s_ptr, q_ptr, o_ptr, keep, K: tl.constexpr, V: tl.constexpr, BLOCK_V: tl.constexpr,
                    WRITE_BACK: tl.constexpr):
    pid_v, bh = tl.program_id(0), tl.program_id(1).to(tl.int64)
    offs_k = tl.arange(0, K)
    offs_v = pid_v * BLOCK_V + tl.arange(0, BLOCK_V)
    ptrs = s_ptr + bh * K * V + offs_k[:, None] * V + offs_v[None, :]
    s = tl.load(ptrs)
    q = tl.load(q_ptr + bh * K + offs_k).to(tl.float32)
    tl.store(o_ptr + bh * V + offs_v, tl.sum(s * q[:, None], axis=0))
    if WRITE_BACK:  # the standard step's traffic: the tile goes back, scaled by a runtime 1.0 (the compiler cannot
        tl.store(ptrs, s * keep)  # drop the store, and the timed states keep their values from rep to rep)


@triton.jit
def _read_tile_persistent(s_ptr, q_ptr, o_ptr, n_items, K: tl.constexpr, V: tl.constexpr, BLOCK_V: tl.constexpr,
                          NUM_STAGES: tl.constexpr):
    tiles: tl.constexpr = V // BLOCK_V
    offs_k = tl.arange(0, K)
    for item in tl.range(tl.program_id(0), n_items, tl.num_programs(0), num_stages=NUM_STAGES):
        bh = item // tiles  # int32 offsets: the probe's states stay under 2**31 elements
        offs_v = (item % tiles) * BLOCK_V + tl.arange(0, BLOCK_V)
        s = tl.load(s_ptr + bh * K * V + offs_k[:, None] * V + offs_v[None, :])
        q = tl.load(q_ptr + bh * K + offs_k).to(tl.float32)
        tl.store(o_ptr + bh * V + offs_v, tl.sum(s * q[:, None], axis=0))


@triton.jit
def _read_tile_tma(s_ptr, q_ptr, o_ptr, n_items, rows, K: tl.constexpr, V: tl.constexpr, BLOCK_V: tl.constexpr,
                   NUM_STAGES: tl.constexpr):
    tiles: tl.constexpr = V // BLOCK_V
    desc = tl.make_tensor_descriptor(s_ptr, shape=[rows, V], strides=[V, 1], block_shape=[K, BLOCK_V])
    offs_k = tl.arange(0, K)
    for item in tl.range(tl.program_id(0), n_items, tl.num_programs(0), num_stages=NUM_STAGES):
        bh = item // tiles
        v0 = (item % tiles) * BLOCK_V
        s = desc.load([bh * K, v0])
        q = tl.load(q_ptr + bh * K + offs_k).to(tl.float32)
        offs_v = v0 + tl.arange(0, BLOCK_V)
        tl.store(o_ptr + bh * V + offs_v, tl.sum(s * q[:, None], axis=0))


def _programs(device: torch.device, per_sm: int) -> int:
    if device.type != "cuda":
        return 2
    return per_sm * torch.cuda.get_device_properties(device).multi_processor_count


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--dim", type=int, default=128, help="K = V")
    parser.add_argument("--out", required=True)
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU (TRITON_INTERPRET=1)")
    args = parser.parse_args()
    if args.batch * args.heads * args.dim * args.dim >= 2**31:
        parser.error("the probe's kernels use int32 offsets: keep batch * heads * dim^2 under 2**31")
    device = torch.device("cpu" if args.smoke else "cuda")
    batch, heads, dim = (2, 2, 32) if args.smoke else (args.batch, args.heads, args.dim)
    timer = Timer(device, reps=1 if args.smoke else None, budget_ms=150.0)
    if device.type == "cuda":  # the descriptors made on the device need a scratch allocation
        triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device=device))
    copies = 1 if args.smoke else 4
    states = [torch.randn(batch, heads, dim, dim, device=device) for _ in range(copies)]
    q = torch.randn(batch, heads, dim, device=device).bfloat16()
    out = torch.empty(batch, heads, dim, device=device)
    state_bytes = states[0].numel() * 4
    rows = batch * heads * dim
    result = dict(batch=batch, heads=heads, dim=dim, state_bytes=state_bytes, device=str(device))
    if device.type == "cuda":
        result["copy_GBps"] = copy_bandwidth(device, timer, state_bytes)["best"]

    want = torch.einsum("bhkv,bhk->bhv", states[0], q.float())

    def check_output(launch, when: str) -> None:
        out.zero_()
        launch(states[0])
        err = ((out - want).abs().max() / want.abs().max()).item()
        assert err < 1e-5, f"the probe kernel's output is off by {err:.2e} (relative) {when}"

    def timed(launch, check: bool = True) -> float:  # us per launch, one launch per state copy
        if check:
            check_output(launch, "before timing")

        def run():
            for s in states:
                launch(s)
        us = timer(run)["ms"] * 1e3 / copies
        if check:  # a form that wrote the states would leave the next forms timing other values
            check_output(launch, "after timing (did a write-back change the states?)")
        return us

    forms = {}
    for block_v, warps in ((32, 2), (64, 2), (64, 4), (128, 4), (128, 8)):
        if block_v > dim:
            continue
        grid = (dim // block_v, batch * heads)
        for write_back in (False, True):
            name = f"grid_{dim}x{block_v}_w{warps}{'_rmw' if write_back else ''}"
            forms[name] = (timed(lambda s, bv=block_v, w=warps, wb=write_back, g=grid: _read_tile_grid[g](
                s, q, out, 1.0, K=dim, V=dim, BLOCK_V=bv, WRITE_BACK=wb, num_warps=w)), 2 if write_back else 1)
    items = batch * heads
    for block_v, warps, per_sm, stages in ((64, 4, 2, 2), (64, 4, 2, 3), (32, 2, 4, 3), (64, 2, 4, 2)):
        if block_v > dim:
            continue
        n_items, programs = items * (dim // block_v), _programs(device, per_sm)
        for form, kernel in (("persistent", _read_tile_persistent), ("tma", _read_tile_tma)):
            name = f"{form}_{dim}x{block_v}_w{warps}_x{per_sm}_s{stages}"
            extra = (rows,) if form == "tma" else ()
            try:
                forms[name] = (timed(lambda s, k=kernel, e=extra, bv=block_v, w=warps, st=stages, n=n_items, p=programs:
                                     k[(p,)](s, q, out, n, *e, K=dim, V=dim, BLOCK_V=bv, NUM_STAGES=st,
                                             num_warps=w)), 1)
            except Exception as error:  # a form this Triton / device cannot build: recorded, not fatal
                forms[name] = (None, 1)
                result.setdefault("errors", {})[name] = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
    forms["torch_sum_last_dim"] = (timed(lambda s: torch.sum(s, dim=-1, out=out), check=False), 1)
    result["forms"] = {}
    for name, (us, passes) in forms.items():
        entry = dict(us=us)
        if us is not None:
            entry["GBps"] = passes * state_bytes / (us * 1e-6) / 1e9
            if "copy_GBps" in result:
                entry["frac_of_copy_bw"] = entry["GBps"] / result["copy_GBps"]
        result["forms"][name] = entry
        shown = "failed" if us is None else f"{us:10.1f} us  {entry['GBps']:7.0f} GB/s" + (
            f"  {100 * entry['frac_of_copy_bw']:3.0f}% of copy" if "frac_of_copy_bw" in entry else "")
        print(f"{name:<34} {shown}", flush=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
