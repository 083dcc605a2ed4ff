"""Shared pieces of the kernel benchmarks (``bench.py`` for Mamba-2, ``bench_delta.py`` for GDN/KDA): loading a kernels
module from the installed package or a checkout, cold-L2 CUDA-graph timing, the copy-bandwidth ceiling, JSON output."""

from __future__ import annotations

import functools
import importlib
import importlib.util
import math
import os
import sys
import time
from pathlib import Path

import torch

L2_BYTES = 50 * 2**20


def load_kernels(name: str):
    """A kernels module, from the installed package or, in a plain checkout, from the file next to this one."""
    try:
        return importlib.import_module(f"hf_replayssm.kernels.{name}")
    except ImportError:
        root = Path(__file__).resolve().parents[1]
        if str(root) not in sys.path:
            sys.path.insert(0, str(root))
        path = Path(__file__).with_name(f"{name}.py")
        spec = importlib.util.spec_from_file_location(f"_replayssm_kernels_{name}", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        return module


class Timer:
    def __init__(self, device: torch.device, reps: int | None, budget_ms: float):
        self.device, self.reps, self.budget_ms = device, reps, budget_ms
        self.cuda = device.type == "cuda"
        if self.cuda:
            self.flush_buf = torch.empty(256 * 2**20, dtype=torch.int8, device=device)

    def __call__(self, fn) -> dict:
        """Time ``fn`` (cold L2 on GPU); returns milliseconds per call: median, p20, p80, reps."""
        if not self.cuda:
            if os.environ.get("TRITON_INTERPRET") != "1":
                fn()  # compile / warm up (the interpreter compiles nothing: a second run of every arm for nothing)
            times = []
            for _ in range(self.reps or 1):
                start = time.perf_counter()
                fn()
                times.append((time.perf_counter() - start) * 1e3)
            return summary(times)
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(3):
                fn()
        torch.cuda.current_stream(self.device).wait_stream(stream)
        torch.cuda.synchronize(self.device)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                fn()
            replay = graph.replay
        except RuntimeError as error:  # not capturable: time eagerly (CPU launch overhead included)
            print(f"  (CUDA graph capture failed, timing eagerly: {str(error).splitlines()[0]})")
            torch.cuda.synchronize(self.device)
            graph, replay = None, fn
        replay()
        torch.cuda.synchronize(self.device)
        reps = self.reps
        if reps is None:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(3):
                self.flush_buf.zero_()
                replay()
            end.record()
            end.synchronize()
            reps = int(min(max(self.budget_ms / (start.elapsed_time(end) / 3), 10), 200))
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
        for start, end in events:
            self.flush_buf.zero_()
            start.record()
            replay()
            end.record()
        torch.cuda.synchronize(self.device)
        times = [start.elapsed_time(end) for start, end in events]
        del graph, replay
        return summary(times)


def summary(times: list[float]) -> dict:
    ordered = sorted(times)

    def pct(q):
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    return dict(ms=pct(0.5), p20_ms=pct(0.2), p80_ms=pct(0.8), reps=len(times))


def copy_bandwidth(device: torch.device, timer: Timer, nbytes: int) -> dict:
    """Device-to-device copy bandwidth in GB/s (bytes read + written): ``copy_`` (a memcpy) and an elementwise
    kernel (``mul(src, 1, out=dst)``), each timed eagerly (median of 20, buffers far larger than L2) and through
    ``timer``. ``best`` is the largest."""
    src = torch.rand(nbytes // 4, device=device)
    dst = torch.empty_like(src)
    variants = {"copy_": lambda: dst.copy_(src), "mul": lambda: torch.mul(src, 1.0, out=dst)}
    out = {}
    for name, fn in variants.items():
        out[f"{name}_timer"] = 2 * nbytes / (timer(fn)["ms"] * 1e-3) / 1e9
        if device.type == "cuda":
            fn()
            times = []
            for _ in range(20):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end))
            out[f"{name}_eager"] = 2 * nbytes / (summary(times)["ms"] * 1e-3) / 1e9
    out["best"] = max(out.values())
    return out


def compiled_info(k, name: str) -> dict:
    handle = k.LAST_COMPILED.get(name)
    return {key: getattr(handle, key, None) for key in ("n_regs", "n_spills")}


def num_copies(bytes_per_copy: int, L: int, cuda: bool) -> int:
    if not cuda:
        return 1
    n = 1
    while n < L and n * bytes_per_copy < 2 * L2_BYTES and L % (2 * n) == 0:
        n *= 2
    return n


def json_default(obj):
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return str(obj)


def suffixed(times: dict, tag: str) -> dict:
    """``times`` (a bench row's entries) with ``tag`` in every key: before the ``_us`` of a time, after anything
    else (an arm measured again under another launch, beside the default's keys)."""
    return {key.replace("_us", f"_{tag}_us") if key.endswith("_us") else f"{key}_{tag}": value
            for key, value in times.items()}


def device_read_copy_times(k, inputs, timer: Timer, read_format: str, phase: str, per_step_us, compact: bool = True,
                           **launch) -> dict:
    """The separated policy's compiled decode step (device positions, the read copy re-encoded on the device for the
    rows that flush) of a family's kernels module ``k`` over ``inputs`` (a bench's ``ReplayInputs``), with and without
    the re-encode, and (``compact``) with the re-encode's per-tile grid (the default is its compact grid), per step
    in us; adds the read copies to ``inputs``. Where the step re-encodes the copy itself (``inputs.reencode_in_step``,
    Mamba-2's ``reencode_copy``) that is the headline, the re-encode as a launch after it timed beside."""
    encode = load_kernels("read_copy_encode")
    if "read_copy" not in inputs.copies[0]:
        inputs.add_read_copies(read_format)
    in_step = getattr(inputs, "reencode_in_step", False)  # (Mamba-2: the step re-encodes, ``reencode_copy``)
    out = {f"replay_{phase}_read_copy_us": per_step_us(timer(inputs.device_read_copy_fn(
        k._replay_step, "step" if in_step else encode.reencode_read_copy, read_format, **launch)))}
    out[f"replay_{phase}_read_copy_kernel"] = dict(launch=str(launch), **compiled_info(k, "replay"))
    if in_step:  # the re-encode as a launch after the step, as before
        out[f"replay_{phase}_read_copy_external_reencode_us"] = per_step_us(timer(inputs.device_read_copy_fn(
            k._replay_step, encode.reencode_read_copy, read_format, **launch)))
    out[f"replay_{phase}_read_copy_no_reencode_us"] = per_step_us(timer(inputs.device_read_copy_fn(
        k._replay_step, None, read_format, **launch)))
    if compact:  # the former default: one program per row tile, instead of P per batch row looping over its tiles
        per_tile_encode = functools.partial(encode.reencode_read_copy, _programs_per_row=None)
        out[f"replay_{phase}_read_copy_per_tile_reencode_us"] = per_step_us(timer(inputs.device_read_copy_fn(
            k._replay_step, per_tile_encode, read_format, **launch)))
    return out


def host_reencode_times(k, inputs, timer: Timer, read_format: str, per_step_us, in_step: bool = False,
                        **launch) -> dict:
    """The host-position cycle reading the copy (``inputs.host_fn``) as the cache runs it: the flush's outputs from
    the copy and the copy re-encoded after it on every row (``CheckpointStore.refresh_read_copy``), with the
    re-encode's default (compact) grid and with its per-tile grid, per step in us. ``in_step`` (Mamba-2): the cache
    has the step re-encode the copy (``reencode_copy``), which is then the headline arm; the separate re-encode's
    arms are kept beside it (``external``)."""
    encode = load_kernels("read_copy_encode")
    per_tile_encode = functools.partial(encode.reencode_read_copy, _programs_per_row=None)
    external = "_external" if in_step else ""
    out = {f"replay_host_read_copy{external}_reencode_us": per_step_us(timer(inputs.host_fn(
               k._replay_step, read_format=read_format, reencode=encode.reencode_read_copy, **launch))),
           f"replay_host_read_copy{external}_per_tile_reencode_us": per_step_us(timer(inputs.host_fn(
               k._replay_step, read_format=read_format, reencode=per_tile_encode, **launch)))}
    if in_step:
        out["replay_host_read_copy_reencode_us"] = per_step_us(timer(inputs.host_fn(
            k._replay_step, read_format=read_format, reencode="step", **launch)))
    return out


def print_read_copy_rows(r: dict, pad: int) -> None:
    """The read-copy lines of a bench's printed table (after the row's own line)."""
    for arm, label in (("host", "host-phase"), ("mixed", "device-phase, mixed"), ("in_phase", "device, in phase")):
        if f"replay_{arm}_read_copy_us" in r:
            print(f"{'':<{pad}}{'':>6} | {label} replay reading a {r['read_format']} copy "
                  f"{r[f'replay_{arm}_read_copy_us']:>9.2f} us "
                  f"{100 * r[f'replay_{arm}_read_copy_frac_of_copy_bw']:>4.0f}% of copy BW (model), "
                  f"x std {r[f'speedup_replay_{arm}_read_copy_vs_standard']:.2f}"
                  + (f" ({r[f'replay_{arm}_read_copy_no_reencode_us']:.2f} us without the re-encode, "
                     + (f"{r[f'replay_{arm}_read_copy_external_reencode_us']:.2f} with it as a launch after the "
                        "step, " if f"replay_{arm}_read_copy_external_reencode_us" in r else "")
                     + f"{r[f'replay_{arm}_read_copy_per_tile_reencode_us']:.2f} us with its per-tile grid)"
                     if arm != "host" else ""), flush=True)
            if arm == "host" and "replay_host_read_copy_reencode_us" in r:
                print(f"{'':<{pad}}{'':>6} |   as the cache runs it (the flush's outputs from the copy, the copy "
                      "re-encoded after it) "
                      f"{r['replay_host_read_copy_reencode_us']:>9.2f} us, x std "
                      f"{r['standard_us'] / r['replay_host_read_copy_reencode_us']:.2f}"
                      + (f" (the re-encode as a launch after the flush: compact grid "
                         f"{r['replay_host_read_copy_external_reencode_us']:.2f} us, per-tile "
                         f"{r['replay_host_read_copy_external_per_tile_reencode_us']:.2f})"
                         if "replay_host_read_copy_external_reencode_us" in r else
                         f" (per-tile grid {r['replay_host_read_copy_per_tile_reencode_us']:.2f} us)"), flush=True)
    if "replay_host_read_copy_encode_in_flush_us" in r:
        print(f"{'':<{pad}}{'':>6} | the plain flush writing the fp8 copy from its registers (_encode_in_flush): host "
              f"as the cache runs it {r['replay_host_read_copy_encode_in_flush_us']:.2f} us", flush=True)
    if "replay_host_read_copy_one_flush_launch_us" in r:
        print(f"{'':<{pad}}{'':>6} | a flushing row's output and fold in one flush launch (_flush_outputs_launch="
              f"False, before run 179): host as the cache runs it {r['replay_host_read_copy_one_flush_launch_us']:.2f}"
              f" us, device, in phase {r['replay_in_phase_read_copy_one_flush_launch_us']:.2f}, mixed "
              f"{r['replay_mixed_read_copy_one_flush_launch_us']:.2f}; its outputs decoding the whole copy tile "
              f"(_flush_copy_product=False, before run 177): host {r['replay_host_read_copy_flush_decoded_us']:.2f} "
              f"us, in phase {r['replay_in_phase_read_copy_flush_decoded_us']:.2f}", flush=True)
    if "replay_in_phase_read_copy_split_us" in r:
        print(f"{'':<{pad}}{'':>6} | device, in phase, two launches (flushes, then replays): "
              f"{r['replay_in_phase_read_copy_split_us']:.2f} us", flush=True)
    if "replay_in_phase_read_copy_fused_us" in r:
        print(f"{'':<{pad}}{'':>6} | device, in phase, one fused launch (the former default): "
              f"{r['replay_in_phase_read_copy_fused_us']:.2f} us", flush=True)
    if "replay_host_read_copy_nvfp4_nibbles_us" in r:
        print(f"{'':<{pad}}{'':>6} | nvfp4 copy loaded per nibble (the former load): host-phase "
              f"{r['replay_host_read_copy_nvfp4_nibbles_us']:.2f} us, device, in phase "
              f"{r['replay_in_phase_read_copy_nvfp4_nibbles_us']:.2f} us", flush=True)


def parse_walks(text: str | None, default: list[tuple[int, int, int, int]]) -> list[tuple[int, int, int, int]]:
    """``--walks``: "tile:warps:stages:per_sm,..." (tile is block_p for Mamba-2, BLOCK_V for the delta rule), or the
    bench's default list when not given."""
    if not text:
        return list(default)
    walks = []
    for item in text.split(","):
        parts = item.split(":")
        if len(parts) != 4 or not all(p.isdigit() and int(p) > 0 for p in parts):
            raise ValueError(f"--walks takes tile:warps:stages:programs_per_sm items, comma-separated; got {item!r}")
        walks.append(tuple(int(p) for p in parts))
    return walks


def add_cycle_arguments(parser, batches: list[int]) -> None:
    """The command-line options of the decode-cycle benches (``bench.py``, ``bench_delta.py``) besides ``--family``,
    ``--shapes`` and their own arms; ``batches``: the bench's default batch sizes."""
    parser.add_argument("--out", type=Path, default=None, help="write all numbers as JSON here")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes, one repetition (CPU / TRITON_INTERPRET)")
    parser.add_argument("--batches", default=None, help=f"comma-separated batch sizes (default {batches})")
    parser.add_argument("--buffer-len", type=int, default=None, help="L (default 16; 4 with --smoke)")
    parser.add_argument("--no-sweep", action="store_true", help="time only the default launch configurations")
    parser.add_argument("--read-copy-sweep", action="store_true",
                        help="with --read-format: time the read-copy replay over the replay launch sweep too")
    parser.add_argument("--no-check", action="store_true", help="skip the on-device correctness check")
    parser.add_argument("--diag", action="store_true", help="also time single phases and a no-ticket variant")
    parser.add_argument("--walks", default=None,
                        help="--diag's host walks as tile:warps:stages:programs_per_sm items, comma-separated")
    parser.add_argument("--read-format", choices=["fp8", "nvfp4"], default=None,
                        help="also time the host-phase cycle whose replay launches read a read copy in this format")
    parser.add_argument("--budget-ms", type=float, default=150.0, help="GPU time per measurement")


def cycle_environment(args, copy_bytes: int):
    """``(device, timer, copy bandwidth in GB/s, info)`` for a decode-cycle bench: CUDA, or the CPU under the Triton
    interpreter (refused otherwise); ``info`` (the JSON's header) names the machine, the versions and the timing, and
    is printed. Fills in ``args.buffer_len`` where it was not given."""
    import platform

    import triton

    if args.buffer_len is None:
        args.buffer_len = 4 if args.smoke else 16
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        raise SystemExit("no CUDA device: set TRITON_INTERPRET=1 (and use --smoke) to run the kernels on the CPU")
    timer = Timer(device, reps=1 if args.smoke else None, budget_ms=args.budget_ms)
    copy = copy_bandwidth(device, timer, 2**20 if args.smoke else copy_bytes)
    try:
        import transformers

        tf_version = transformers.__version__
    except ImportError:
        tf_version = None
    info = dict(
        device=torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({platform.processor()})",
        torch=torch.__version__, triton=triton.__version__, transformers=tf_version, python=platform.python_version(),
        triton_interpret=os.environ.get("TRITON_INTERPRET") == "1", smoke=args.smoke, family=args.family,
        copy_bandwidth_GBps=copy["best"], copy_bandwidth_variants_GBps=copy, buffer_len=args.buffer_len,
        read_format=args.read_format,
        timing="CUDA graph of L steps, L2 flushed before each replay, CUDA events, median" if device.type == "cuda"
        else "perf_counter (interpreter; not meaningful)",
    )
    print(f"{info['device']}  torch {info['torch']}  triton {info['triton']}  transformers {tf_version}")
    print(f"device-to-device copy bandwidth: {copy['best']:.0f} GB/s (read + write)")
    return device, timer, copy["best"], info


def finish_bench(args, result: dict) -> dict:
    """The end of a kernel bench (cycle or verify): warn when the on-device check failed, write ``result`` as JSON to
    ``args.out`` where given; returns it."""
    import json

    checks = result.get("checks")
    if checks and not all(c["ok"] for c in checks.values()):
        print("WARNING: the on-device correctness check failed:", checks)
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=1, default=json_default))
        print(f"wrote {args.out}")
    return result
