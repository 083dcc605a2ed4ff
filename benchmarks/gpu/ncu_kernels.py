"""Hardware counters of the decode-step kernels at batch 256 on the H200, for Nsight Compute (``ncu``).

Each family's standard step (read the state, update, write it back) and replay step (read the checkpoint, replay the
buffered records, write no state), the replay at host positions with 14 buffered records (the cycle's most
expensive replay) and at device positions with rows spread over the cycle (one row in 16 flushes; Mamba-2 also with
the split step's flush launch on a device-sized grid; GDN and KDA split that way too). Shapes: GDN
Qwen3-Next (32 value / 16 key heads of 128), KDA Kimi-Linear (32 heads of 128), Mamba-2 Nemotron-H 8B (128 heads x 64,
state 128, 8 groups); fp32 state, bf16 inputs. Every kernel runs warm first; only the last call of each is inside
``cudaProfilerStart`` / ``Stop``, so ``ncu --profile-from-start off`` sees one launch per arm (KDA's replay: its
per-head weights pre-launch too). Without ncu it prints each arm's time (``triton.testing.do_bench``) and the state
bytes per second it implies, to set beside the counters.

    python3 benchmarks/gpu/ncu_kernels.py [--families gdn,kda,mamba2] [--batch 256] [--kda-weights-warps 1,2]
        [--chunks 16:64:2,32:64:4] [--flush-copies fp8,nvfp4] [--replay-copies fp8,nvfp4]
        [--device-copies fp8,nvfp4]
    ncu --clock-control none --profile-from-start off --set detailed -o OUT python3 benchmarks/gpu/ncu_kernels.py
"""

from __future__ import annotations

import argparse

import torch
from triton.testing import do_bench

from hf_replayssm.kernels import delta_rule, mamba2

RING = 16


def _bf16(*shape, device):
    return torch.randn(*shape, device=device).bfloat16()


def delta_arms(batch: int, per_key: bool, device, weights_warps: tuple[int, ...] = (),
               chunks: tuple[tuple[int, int, int], ...] = (), flush_copies: tuple[str, ...] = (),
               replay_copies: tuple[str, ...] = (), device_copies: tuple[str, ...] = ()) -> dict:
    heads, key_heads, dim = 32, 32 if per_key else 16, 128
    gate = (heads, dim) if per_key else (heads,)
    state = torch.randn(batch, heads, dim, dim, device=device) * 0.1
    token = dict(q=_bf16(batch, key_heads, dim, device=device), k=_bf16(batch, key_heads, dim, device=device),
                 v=_bf16(batch, heads, dim, device=device),
                 beta=torch.rand(batch, heads, device=device).bfloat16(),
                 g=-torch.rand(batch, *gate, device=device) * 0.1)
    rings = (_bf16(batch, RING, key_heads, dim, device=device), torch.randn(batch, RING, heads, dim, device=device),
             -torch.rand(batch, RING, *gate, device=device) * 0.1)
    out = torch.empty(batch, heads, dim, device=device)
    origin = torch.zeros(batch, dtype=torch.int32, device=device)
    counts = (torch.arange(batch, device=device) % RING).to(torch.int32)
    t = [token[n] for n in ("q", "k", "v", "beta", "g")]
    arms = {"standard": (lambda: delta_rule._state_update(state, *t, out=out), 2)}
    for warps in (None, *weights_warps):  # KDA: the per-head weights pre-launch on other warp counts
        launch, tag = ({}, "") if warps is None else (dict(_weights_warps=warps), f"_ww{warps}")
        arms[f"replay_host14{tag}"] = (lambda launch=launch: delta_rule._replay_step(
            state, *rings, 0, 14, *t, buffer_len=RING, out=out, **launch), 1)
        # device positions: the step advances each row's count, so successive calls walk the cycle
        arms[f"replay_device{tag}"] = (lambda launch=launch: delta_rule._replay_step(
            state, *rings, origin, counts, *t, buffer_len=RING, out=out, **launch), 1 + 2 / RING)
    # a split step whose flush launch runs on a device-sized grid (kernels/flush_grid.py), replay launch as is
    arms["replay_device_split_flush_grid"] = (lambda: delta_rule._replay_step(
        state, *rings, origin, counts, *t, buffer_len=RING, out=out, _split=True, _flush_grid="device"), 1 + 2 / RING)
    for chunk, block_v, warps in chunks:  # the replay-only launches streaming the checkpoint (_chunk_k)
        launch, tag = dict(_chunk_k=chunk, _block_v=block_v, _num_warps=warps), f"_chunk{chunk}_{block_v}x{warps}"
        arms[f"replay_host14{tag}"] = (lambda launch=launch: delta_rule._replay_step(
            state, *rings, 0, 14, *t, buffer_len=RING, out=out, **launch), 1)
        # a split step (flush launch, then the chunked replay launch), against the fused default above
        arms[f"replay_device_split{tag}"] = (lambda launch=launch: delta_rule._replay_step(
            state, *rings, origin, counts, *t, buffer_len=RING, out=out, _split=True, **launch), 1 + 2 / RING)
        arms[f"replay_device_split_flush_grid{tag}"] = (lambda launch=launch: delta_rule._replay_step(
            state, *rings, origin, counts, *t, buffer_len=RING, out=out, _split=True, _flush_grid="device",
            **launch), 1 + 2 / RING)
    if flush_copies:  # the separated policy's host flush (exact fold from the raw records), plain and giving its
        # outputs from the copy: run 187 found GDN's fp8 outputs 27 us a step dearer than nvfp4's 1.2 (run 192: the
        # codes' 16-byte loads set the exact fold's layout; _flush_code_vector)
        from hf_replayssm.precision.formats import get_format

        raw = dict(ring_v=_bf16(batch, RING, heads, dim, device=device),
                   ring_beta=torch.rand(batch, RING, heads, device=device))
        for fmt in flush_copies:
            read = dict(read_copy=get_format(fmt).encode(state), read_format=fmt, **raw)
            for outputs in (False, True):
                arms[f"flush15_{fmt}_{'copy_outputs' if outputs else 'plain'}"] = (
                    lambda read=read, outputs=outputs: delta_rule._replay_step(
                        state, *rings, 0, 15, *t, buffer_len=RING, out=out, flush_reads_copy=outputs, **read), 2)
            if fmt == "fp8":  # the codes at the compiler's widest vector, as before _flush_code_vector (run 192)
                arms["flush15_fp8_copy_outputs_codes16"] = (lambda read=read: delta_rule._replay_step(
                    state, *rings, 0, 15, *t, buffer_len=RING, out=out, flush_reads_copy=True, _flush_code_vector=0,
                    **read), 2)
    def encoded(fmt):  # a read copy of the state, and its bytes (codes and scales) over the fp32 state's
        from hf_replayssm.precision.formats import get_format

        copy = get_format(fmt).encode(state)
        return copy, sum(part.numel() * part.element_size() for part in copy.values()) / (state.numel() * 4)

    for fmt in replay_copies:  # the separated policy's replay-only launch (15 of the host cycle's 16 steps) at
        # its default streamed tile, reading the copy at the cycle's most expensive position; passes: the copy's
        # bytes, so the GB/s column is the copy's
        copy, copy_passes = encoded(fmt)

        def replay_copy(copy=copy, fmt=fmt, **launch):
            return lambda: delta_rule._replay_step(state, *rings, 0, 14, *t, buffer_len=RING, out=out,
                                                   read_copy=copy, read_format=fmt, **launch)

        arms[f"replay_host14_{fmt}"] = (replay_copy(), copy_passes)
        # the same tile in chunks of 4 key rows, the records' values loaded after the stream (offline: 146-161
        # registers against 255)
        config = delta_rule.read_copy_stream_config(batch, dim, per_key, fmt)  # (None below the streamed batch)
        if config is not None:
            arms[f"replay_host14_{fmt}_c4_late"] = (replay_copy(_block_v=config[0], _num_warps=config[1], _chunk_k=4,
                                                                _late_records=True), copy_passes)
    for fmt in device_copies:  # the separated policy's compiled-path step (device positions, the flush's outputs
        # from the copy, the copy re-encoded by the step) with every row at one position: at 7 (no row due: the flush
        # launch's programs read a count and exit) and at 15 (every row flushes). Its in-phase step measured 184.6 us
        # against the host cycle's 149.8 (GDN fp8, run 213): which launches the 35 us a step go to
        copy, copy_passes = encoded(fmt)
        read = dict(read_copy=copy, read_format=fmt, flush_reads_copy=True,
                    reencode_copy=True, ring_v=_bf16(batch, RING, heads, dim, device=device),
                    ring_beta=torch.rand(batch, RING, heads, device=device))
        for at in (7, 15):
            def device_step(at=at, read=read):  # the counts set afresh: the step advances them
                delta_rule._replay_step(state, *rings, origin, torch.full((batch,), at, dtype=torch.int32,
                                                                          device=device),
                                        *t, buffer_len=RING, out=out, **read)

            # bytes: the copy read; a flush also reads and writes the checkpoint and writes the copy again
            arms[f"device_in_phase{at}_{fmt}"] = (device_step, copy_passes if at == 7 else 2 + 2 * copy_passes)
    return arms, state.numel() * 4


def mamba2_arms(batch: int, device) -> dict:
    heads, head_dim, d_state, groups = 128, 64, 128, 8
    state = torch.randn(batch, heads, head_dim, d_state, device=device) * 0.1
    token = (_bf16(batch, heads, head_dim, device=device), torch.rand(batch, heads, device=device).bfloat16(),
             _bf16(batch, groups, d_state, device=device), _bf16(batch, groups, d_state, device=device))
    params = dict(A=-torch.rand(heads, device=device), D=torch.rand(heads, device=device),
                  dt_bias=torch.rand(heads, device=device), dt_softplus=True)
    rings = (_bf16(batch, RING, heads, head_dim, device=device), torch.rand(batch, RING, heads, device=device),
             _bf16(batch, RING, groups, d_state, device=device))
    out = torch.empty(batch, heads, head_dim, device=device)
    origin = torch.zeros(batch, dtype=torch.int32, device=device)
    counts = (torch.arange(batch, device=device) % RING).to(torch.int32)
    return {
        "standard": (lambda: mamba2._state_update(state, *token, out=out, **params), 2),
        "replay_host14": (lambda: mamba2._replay_step(state, *rings, 0, 14, *token, buffer_len=RING, out=out,
                                                      **params), 1),
        "replay_device": (lambda: mamba2._replay_step(state, *rings, origin, counts, *token, buffer_len=RING,
                                                      out=out, **params), 1 + 2 / RING),
        # the split step's flush launch on a device-sized grid instead of the batch-sized one
        "replay_device_flush_grid": (lambda: mamba2._replay_step(state, *rings, origin, counts, *token,
                                                                 buffer_len=RING, out=out, _flush_grid="device",
                                                                 **params), 1 + 2 / RING),
        # the same, each item's records read in one round trip (fold_unroll 16 >= every count)
        "replay_device_flush_grid_u16": (lambda: mamba2._replay_step(
            state, *rings, origin, counts, *token, buffer_len=RING, out=out, _flush_grid="device",
            _flush_config=dict(fold_unroll=16), **params), 1 + 2 / RING),
        "replay_device_batch_grid": (lambda: mamba2._replay_step(state, *rings, origin, counts, *token,
                                                                 buffer_len=RING, out=out, _flush_grid="batch",
                                                                 **params), 1 + 2 / RING),
    }, state.numel() * 4


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", default="gdn,kda,mamba2")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--no-time", action="store_true", help="skip the do_bench timings (under ncu)")
    parser.add_argument("--chunks", default="", help="comma-separated CHUNK:BLOCK_V:WARPS launches of the GDN / KDA "
                        "replay-only step streaming the checkpoint (_chunk_k), added as arms")
    parser.add_argument("--kda-weights-warps", default="", help="comma-separated warp counts of KDA's weights "
                        "pre-launch to add as arms beside the default (4)")
    parser.add_argument("--flush-copies", default="", help="comma-separated read formats (fp8, nvfp4): the GDN / KDA "
                        "host flush with the exact fold, plain and giving its outputs from the copy, added as arms")
    parser.add_argument("--replay-copies", default="", help="comma-separated read formats (fp8, nvfp4): the GDN / "
                        "KDA host replay-only launch reading a copy at its default streamed tile, added as arms")
    parser.add_argument("--device-copies", default="", help="comma-separated read formats (fp8, nvfp4): the GDN / "
                        "KDA separated step at device positions, every row replaying (count 7) or flushing (15)")
    args = parser.parse_args(argv)
    weights_warps = tuple(int(w) for w in args.kda_weights_warps.split(",") if w)
    chunks = tuple(tuple(int(n) for n in c.split(":")) for c in args.chunks.split(",") if c)
    device = torch.device("cuda")
    torch.manual_seed(0)
    arms = {}
    for family in args.families.split(","):
        built, state_bytes = (mamba2_arms(args.batch, device) if family == "mamba2"
                              else delta_arms(args.batch, family == "kda", device, weights_warps, chunks,
                                              tuple(f for f in args.flush_copies.split(",") if f),
                                              tuple(f for f in args.replay_copies.split(",") if f),
                                              tuple(f for f in args.device_copies.split(",") if f)))
        for name, (fn, passes) in built.items():
            arms[f"{family}_{name}"] = (fn, passes * state_bytes)
    for fn, _ in arms.values():  # compile and warm every kernel before the profiled window
        for _ in range(3):
            fn()
    torch.cuda.synchronize()
    if not args.no_time:
        for name, (fn, state_bytes) in arms.items():
            us = do_bench(fn, warmup=25, rep=200) * 1e3
            print(f"{name:<22} {us:8.1f} us  state {state_bytes / 1e6:7.1f} MB  {state_bytes / us / 1e3:6.0f} GB/s",
                  flush=True)
    torch.cuda.cudart().cudaProfilerStart()
    for name, (fn, _) in arms.items():
        torch.cuda.nvtx.range_push(name)
        fn()
        torch.cuda.nvtx.range_pop()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


if __name__ == "__main__":
    main()
