"""The delta rule's read-copy launches as callers get them (no launch argument) against the former defaults, side by
side in one run: the host-position cycle (streamed replay-only launches against the whole tile) and the separated
policy's compiled-path step (device positions, the copy re-encoded after flushes; a split step with a streaming
replay launch and its flush on a tile of its own, against one fused launch), rows in mixed phases and in phase, with
our standard step for the ratio. GDN (Qwen3-Next) and KDA (Kimi-Linear), fp8 and nvfp4.

Each timed call is L steps over the bench's rotated state copies (``ReplayInputs``, CUDA graph, cold L2), reported
per step. ``--smoke`` runs tiny shapes on the CPU (Triton's interpreter, one rep each, L = 4, the streaming threshold
lowered to the smoke's batch). Run on the GPU machine after ``source benchmarks/gpu/install.sh``:

    python3 $R/benchmarks/gpu/read_copy_defaults.py --batches 64,256 --out RESULT.json
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json

import torch

from hf_replayssm.kernels import bench_delta, delta_rule, read_copy_encode
from hf_replayssm.kernels.bench_common import Timer

L = 16
SHAPE_NAMES = {"gdn": "qwen3-next", "kda": "kimi-linear"}
# streamed replay tiles (BLOCK_V, num_warps, CHUNK_K) timed where the default does not stream
STREAM_CANDIDATES = [(32, 1, 16), (64, 1, 16)]
# --flush-tiles: the host-phase flush-only launch with the exact fold (BLOCK_V, num_warps)
FLUSH_TILES = [(64, 4), (64, 2), (64, 1), (32, 2), (32, 1), (16, 1)]
# --stream-tiles: the streamed replay launches on other tiles (BLOCK_V, num_warps, CHUNK_K), host cycle as the cache
# runs it and the split step in phase (its flush launch at its default); Mamba-2's copy launches were 1.3-1.4x faster
# on one warp over a whole head (run 183), and these tiles date from before the as-stored nvfp4 read (runs 130-135)
STREAM_TILES = [(64, 1, 16), (128, 1, 16), (128, 2, 16), (64, 2, 16), (64, 1, 32), (32, 1, 16), (32, 1, 32),
                (128, 1, 32), (16, 1, 16)]
# --device-flush-tiles: a split step's flush launch (exact fold, flushing rows' outputs from the copy) on other tiles
DEVICE_FLUSH_TILES = [(16, 1), (32, 1), (64, 2)]
# --solve: the solved exact fold (_exact_solve) with its chain over the records by the per-head pre-launch
# (_solve_weights) on these flush tiles (BLOCK_V, num_warps); offline (sm_90, batch 256, outputs from an fp8 copy)
# GDN [K, 32] x 4 holds 192 registers and no spills with the pre-launch (255 / 72 bytes without), [K, 64] x 4 255 /
# 124; KDA [K, 32] x 4 217 (246 without), [K, 32] x 8 206, [K, 64] x 8 239, none spilled; [K, 64] x 4 and two-warp
# tiles spill. Then the pre-launch's warps (SOLVE_WARPS) at the best tile: KDA's spills on one (offline 255
# registers), holds 204 on two and 117 on four
SOLVE_TILES = [(64, 4), (32, 4), (32, 2), (128, 8), (32, 8), (64, 8)]
SOLVE_WARPS = (1, 2, 4)
# the arms every row has, each also as a ratio to our standard step (x_std_<arm>), in the printed order
ARMS = ("host_default", "host_default_reencode", "host_whole_tile", "device_mixed_default", "device_mixed_fused",
        "device_in_phase_default", "device_in_phase_fused")


def rows_for(family: str, read_format: str, batch: int, timer: Timer, device: torch.device, smoke: bool,
             flush_tiles: bool = False, device_flush_tiles: bool = False, stream_tiles: bool = False,
             stream_late: bool = False, solve: bool = False, newest_first: bool = False,
             flush_weights: bool = False) -> dict:
    per_key = family == "kda"
    shape = bench_delta.SMOKE_SHAPES[family]["smoke"] if smoke else bench_delta.SHAPES[family][SHAPE_NAMES[family]]
    Hv, _, K, V = shape
    cuda = device.type == "cuda"
    row = {"family": family, "shape": "smoke" if smoke else SHAPE_NAMES[family], "read_format": read_format,
           "batch": batch,
           "stream_config": delta_rule.read_copy_stream_config(batch, K, per_key, read_format, value_dim=V),
           "device_stream_config": delta_rule.read_copy_stream_config(batch, K, per_key, read_format, True, V),
           "whole_tile_config": delta_rule.replay_launch_config(batch, Hv, K, V, per_key, read_format)}

    def us(fn):
        return timer(fn)["ms"] * 1e3 / L

    step = delta_rule._replay_step
    bv, nw = row["whole_tile_config"]
    for phase in ("mixed", "in_phase"):
        gen = torch.Generator(device=device).manual_seed(batch)
        inputs = bench_delta.ReplayInputs(batch, shape, per_key, L, device, gen, phase, cuda)
        inputs.add_read_copies(read_format)
        if phase == "in_phase":  # every row at one host-known position: L - 1 replay-only launches, one flush
            row["host_default_us"] = us(inputs.host_fn(step, read_format=read_format))
            # with the copy re-encoded after the flush, as the cache runs it: by the step (reencode_copy; nvfp4 with
            # the flush's amax), and as a launch after it (default compact grid / per-tile grid)
            row["host_default_reencode_us"] = us(inputs.host_fn(step, read_format=read_format, reencode="step"))
            # the flush's outputs from the copy without any re-encode (a no-op after the flush): what the outputs
            # cost beside the plain flush, apart from the re-encode
            row["host_flush_reads_copy_only_us"] = us(inputs.host_fn(
                step, read_format=read_format, reencode=lambda *_: None))
            if read_format == "fp8":  # the flush launch's decoded copy with a scale load per element (before run 188)
                row["host_flush_scale_per_element_us"] = us(inputs.host_fn(
                    step, read_format=read_format, reencode="step", flush_launch=dict(_flush_scale_per_row=False)))
                # its codes at the compiler's widest vector (before _flush_code_vector; run 192)
                row["host_flush_codes16_us"] = us(inputs.host_fn(
                    step, read_format=read_format, reencode="step", flush_launch=dict(_flush_code_vector=0)))
                # the streamed replay launches loading the codes 4 to a vector (_replay_code_vector; off: slower in
                # run 200 although KDA's warp shuffles fall 143 -> 15 offline)
                row["host_replay_code_vector_us"] = us(inputs.host_fn(
                    step, read_format=read_format, reencode="step", flush_launch={}, _replay_code_vector=4))
            # the exact fold holding the token through the records' loop (before run 204; _reload_token, default
            # but for GDN's nvfp4 host step, reads it again after the loop)
            row["host_token_held_us"] = us(inputs.host_fn(
                step, read_format=read_format, reencode="step", flush_launch=dict(_reload_token=False)))
            row["host_token_reloaded_us"] = us(inputs.host_fn(
                step, read_format=read_format, reencode="step", flush_launch=dict(_reload_token=True)))
            row["host_default_external_reencode_us"] = us(inputs.host_fn(
                step, read_format=read_format, reencode=read_copy_encode.reencode_read_copy))
            if newest_first and per_key:  # KDA's weights pre-launch reading the records newest first, beside the
                # default: the fp32 cycle (the walk) and the cycle as the cache runs it
                row["host_fp32_us"] = us(inputs.host_fn(step))
                row["host_fp32_newest_first_us"] = us(inputs.host_fn(step, _newest_first=True))
                row["host_default_reencode_newest_first_us"] = us(inputs.host_fn(
                    step, read_format=read_format, reencode="step", _newest_first=True))
            if flush_weights:  # the flush launch taking the records' weights from the pre-launch (at host
                # positions an extra launch a period), alone and (KDA) with the pre-launch newest first
                row["flush_weights_us"] = us(inputs.host_fn(step, only=L - 1, read_format=read_format,
                                                            reencode="step", _flush_weights=True))
                row["flush_default_reencode_us"] = us(inputs.host_fn(step, only=L - 1, read_format=read_format,
                                                                     reencode="step"))
                row["host_default_reencode_flush_weights_us"] = us(inputs.host_fn(
                    step, read_format=read_format, reencode="step", _flush_weights=True))
                if per_key:
                    row["host_default_reencode_flush_weights_newest_first_us"] = us(inputs.host_fn(
                        step, read_format=read_format, reencode="step", _flush_weights=True, _newest_first=True))
            row["host_default_per_tile_reencode_us"] = us(inputs.host_fn(
                step, read_format=read_format,
                reencode=functools.partial(read_copy_encode.reencode_read_copy, _programs_per_row=None)))
            row["host_whole_tile_us"] = us(inputs.host_fn(step, read_format=read_format, _block_v=bv, _num_warps=nw,
                                                          flush_launch={}))
            if flush_tiles:  # the flush-only launch (exact fold, fp32 checkpoint) at its default and other tiles
                row["flush_default_config"] = delta_rule.host_flush_launch_config(batch, Hv, K, V, per_key,
                                                                                  exact_fold=True)
                row["flush_default_us"] = us(inputs.host_fn(step, only=L - 1, read_format=read_format))
                for fbv, fnw in FLUSH_TILES:
                    if fbv <= max(16, V):
                        row[f"flush_{fbv}x{fnw}_us"] = us(inputs.host_fn(step, only=L - 1, read_format=read_format,
                                                                         _block_v=fbv, _num_warps=fnw))
                best = min((key for key in row if key.startswith("flush_") and key.endswith("_us")), key=row.get)
                row["flush_best"] = best
                if best != "flush_default_us":  # the cycle with the flush launch there
                    fbv, fnw = (int(x) for x in best[len("flush_"):-len("_us")].split("x"))
                    row["host_best_flush_us"] = us(inputs.host_fn(step, read_format=read_format,
                                                                  flush_launch=dict(_block_v=fbv, _num_warps=fnw)))
        if solve and phase == "in_phase":
            # the flush-only launch (exact fold, fp32 checkpoint) stepped (the default), solved, solved with the
            # pre-launch on SOLVE_TILES; the host cycle as the cache runs it and the split step in phase with each
            solved, given = dict(_exact_solve=True), dict(_exact_solve=True, _solve_weights=True)
            row["flush_stepped_us"] = us(inputs.host_fn(step, only=L - 1, read_format=read_format))
            row["flush_solved_us"] = us(inputs.host_fn(step, only=L - 1, read_format=read_format, **solved))
            given_us = {}  # (BLOCK_V, num_warps) -> us; narrower heads: the whole head
            for fbv, fnw in dict.fromkeys((min(fbv, max(16, 1 << (V - 1).bit_length())), fnw)
                                          for fbv, fnw in SOLVE_TILES):
                given_us[fbv, fnw] = us(inputs.host_fn(step, only=L - 1, read_format=read_format, **given,
                                                       _block_v=fbv, _num_warps=fnw))
                row[f"flush_solve_given_{fbv}x{fnw}_us"] = given_us[fbv, fnw]
            fbv, fnw = min(given_us, key=given_us.get)
            row["solve_best_tile"] = [fbv, fnw]
            for warps in SOLVE_WARPS:  # the pre-launch's own warps, at that tile
                row[f"flush_solve_given_pre{warps}_us"] = us(inputs.host_fn(
                    step, only=L - 1, read_format=read_format, **given, _block_v=fbv, _num_warps=fnw,
                    _solve_warps=warps))
            row["host_solved_us"] = us(inputs.host_fn(step, read_format=read_format, reencode="step",
                                                      flush_launch=solved))
            row["host_solve_given_us"] = us(inputs.host_fn(step, read_format=read_format, reencode="step",
                                                           flush_launch=dict(given, _block_v=fbv, _num_warps=fnw)))
            if flush_weights:  # ... its outputs' weights from the weights pre-launch too
                row["host_solve_given_flush_weights_us"] = us(inputs.host_fn(
                    step, read_format=read_format, reencode="step",
                    flush_launch=dict(given, _block_v=fbv, _num_warps=fnw, _flush_weights=True)))
            stream = row["device_stream_config"]
            if stream is not None:  # the split step: its replay launch streams the copy as by default
                split = dict(_split=True, _block_v=stream[0], _num_warps=stream[1], _chunk_k=stream[2])
                row["device_in_phase_solved_us"] = us(inputs.device_read_copy_fn(step, "step", read_format,
                                                                                 **split, **solved))
                row["device_in_phase_solve_given_us"] = us(inputs.device_read_copy_fn(
                    step, "step", read_format, **split, **given, _flush_config=(fbv, fnw)))
        encode = "step"  # the step re-encodes the flushed rows' copy (reencode_copy), as the compiled op does
        row[f"device_{phase}_default_us"] = us(inputs.device_read_copy_fn(step, encode, read_format))
        row[f"device_{phase}_fused_us"] = us(inputs.device_read_copy_fn(step, encode, read_format, _split=False))
        if read_format == "fp8":  # the split step's flush launch with a scale load per element (before run 188)
            row[f"device_{phase}_flush_scale_per_element_us"] = us(inputs.device_read_copy_fn(
                step, encode, read_format, _flush_scale_per_row=False))
            # the split step's flush launch loading the codes at the compiler's widest vector (before run 196)
            row[f"device_{phase}_split_flush_codes16_us"] = us(inputs.device_read_copy_fn(
                step, encode, read_format, _split_flush_code_vector=0))
            row[f"device_{phase}_replay_code_vector_us"] = us(inputs.device_read_copy_fn(
                step, encode, read_format, _replay_code_vector=4))
        row[f"device_{phase}_token_held_us"] = us(inputs.device_read_copy_fn(step, encode, read_format,
                                                                           _reload_token=False))
        if newest_first and per_key:
            row[f"device_{phase}_newest_first_us"] = us(inputs.device_read_copy_fn(step, encode, read_format,
                                                                                 _newest_first=True))
        if flush_weights:  # (KDA's split step runs the pre-launch anyway: its flush launch only reads it)
            row[f"device_{phase}_flush_weights_us"] = us(inputs.device_read_copy_fn(step, encode, read_format,
                                                                                  _flush_weights=True))
            if per_key:
                row[f"device_{phase}_flush_weights_newest_first_us"] = us(inputs.device_read_copy_fn(
                    step, encode, read_format, _flush_weights=True, _newest_first=True))
        if device_flush_tiles and row["device_stream_config"] is not None:
            cbv, cnw, chunk = row["device_stream_config"]
            for fbv, fnw in DEVICE_FLUSH_TILES:
                row[f"device_{phase}_flush_{fbv}x{fnw}_us"] = us(inputs.device_read_copy_fn(
                    step, encode, read_format, _split=True, _block_v=cbv, _num_warps=cnw, _chunk_k=chunk,
                    _flush_config=(fbv, fnw)))
        if stream_tiles and phase == "in_phase":
            # stream_late: each tile also with the records' values loaded after the stream (_late_records)
            for (cbv, cnw, chunk), late in itertools.product(STREAM_TILES, (False, True) if stream_late else (False,)):
                if cbv > max(16, 1 << (V - 1).bit_length()) or chunk > max(16, 1 << (K - 1).bit_length()):
                    continue
                tag = f"tile_{cbv}x{cnw}_c{chunk}{'_late' if late else ''}"
                tile = dict(_block_v=cbv, _num_warps=cnw, _chunk_k=chunk, _late_records=late)
                try:
                    row[f"host_{tag}_us"] = us(inputs.host_fn(step, read_format=read_format, reencode="step",
                                                              flush_launch={}, **tile))
                    row[f"device_in_phase_{tag}_us"] = us(inputs.device_read_copy_fn(
                        step, encode, read_format, _split=True,
                        _flush_config=delta_rule.read_copy_split_flush_config(V, read_format), **tile))
                except Exception as error:  # out of resources for this tile
                    row[f"host_{tag}_error"] = f"{type(error).__name__}: {error}"[:120]
        if row["stream_config"] is None:  # not streamed by default (KDA nvfp4): the candidates, asked for
            for cbv, cnw, chunk in STREAM_CANDIDATES:
                tag = f"stream_{cbv}x{cnw}_c{chunk}"
                tile = dict(_block_v=cbv, _num_warps=cnw, _chunk_k=chunk)
                if phase == "in_phase":
                    row[f"host_{tag}_us"] = us(inputs.host_fn(step, read_format=read_format, flush_launch={}, **tile))
                row[f"device_{phase}_{tag}_us"] = us(inputs.device_read_copy_fn(
                    step, encode, read_format, _split=True,
                    _flush_config=delta_rule.read_copy_split_flush_config(V, read_format),
                    **tile))
        del inputs
    gen = torch.Generator(device=device).manual_seed(batch)
    inputs = bench_delta.StepInputs(batch, shape, per_key, L, device, gen, cuda)
    row["standard_us"] = us(inputs.kernel_fn(delta_rule._state_update))
    for key in ARMS:
        row[f"x_std_{key}"] = row["standard_us"] / row[f"{key}_us"]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", default="64,256")
    parser.add_argument("--specs", default="gdn:fp8,gdn:nvfp4,kda:fp8,kda:nvfp4",
                        help="family:read_format items, comma-separated")
    parser.add_argument("--out", required=True)
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU")
    parser.add_argument("--flush-tiles", action="store_true",
                        help="also time the host-phase flush-only launch (exact fold) at several tiles")
    parser.add_argument("--device-flush-tiles", action="store_true",
                        help="also time the split device step with its flush launch on other tiles")
    parser.add_argument("--stream-tiles", action="store_true",
                        help="also time the streamed replay launches on other tiles (host cycle as the cache runs it, "
                             "split step in phase)")
    parser.add_argument("--tiles", default="", help="VxWxC tiles for --stream-tiles instead of the built-in list")
    parser.add_argument("--stream-late", action="store_true",
                        help="--stream-tiles: each tile also with the records' values loaded after the stream")
    parser.add_argument("--newest-first", action="store_true",
                        help="KDA: also with the weights pre-launch reading the records newest first (_newest_first), "
                        "and the fp32 host cycle with and without it")
    parser.add_argument("--flush-weights", action="store_true",
                        help="also with the flush launches taking the records' weights for their outputs from the "
                        "weights pre-launch (_flush_weights)")
    parser.add_argument("--solve", action="store_true",
                        help="also the solved exact fold, with and without its per-head pre-launch")
    args = parser.parse_args()
    if args.tiles:
        STREAM_TILES[:] = [tuple(int(n) for n in tile.split("x")) for tile in args.tiles.split(",")]
    device = torch.device("cpu" if args.smoke else "cuda")
    global L
    if args.smoke:  # the smoke's batch takes the streamed launches too; a 4-step cycle has every launch kind of 16's
        delta_rule.READ_COPY_STREAM_MIN_BATCH = 1
        L = 4
    timer = Timer(device, reps=1 if args.smoke else None, budget_ms=150.0)
    rows = []
    for batch in [int(b) for b in args.batches.split(",")]:
        for spec in args.specs.split(","):
            family, read_format = spec.split(":")
            row = rows_for(family, read_format, batch, timer, device, args.smoke, args.flush_tiles,
                           args.device_flush_tiles, args.stream_tiles, args.stream_late, args.solve,
                           args.newest_first, args.flush_weights)
            rows.append(row)
            print(f"{family} {read_format} batch {batch} (stream {row['stream_config']}, device "
                  f"{row['device_stream_config']}): "
                  + ", ".join(f"{key[:-3]} {value:.1f}" for key, value in row.items() if key.endswith("_us"))
                  + " us; x std: host {:.2f} (as the cache runs it {:.2f}; whole tile {:.2f}), device mixed "
                    "{:.2f} (fused {:.2f}), in phase {:.2f} (fused {:.2f})".format(
                        *(row[f"x_std_{key}"] for key in ARMS)), flush=True)
            with open(args.out, "w") as f:  # after every row: a timeout keeps what was measured
                json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
