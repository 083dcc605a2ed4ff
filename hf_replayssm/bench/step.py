"""Model-level decode step: stock transformers cache against ReplayCache (torch and Triton backends) on one model.

Every arm prefills the same prompt, then decodes the same tokens one forward at a time (teacher-forced, so every arm
does identical work whatever it predicts); the time of the decode forwards, synchronised once at the end, divided by
their number is the arm's milliseconds per step (CPU launch overhead included: that is what eager decoding costs).
Arms are interleaved and repeated, the best repeat counts; every arm first runs once untimed over the same lengths,
so neither cuDNN's per-KV-length attention graphs (torch 2.11) nor Triton compilation land in a timed run. The stock
arm uses whatever transformers picks (flash-linear-attention kernels when installed). On a GPU use
``hf-replayssm bench step``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence

import torch

from . import default_device

ARMS = ("stock", "replay-torch", "replay-triton")


def _make_cache(arm: str, model, buffer_len: int):
    from transformers import DynamicCache

    from ..cache import ReplayCache

    if arm == "stock":
        return DynamicCache(config=model.config)
    backend = arm.removeprefix("replay-")
    return ReplayCache(buffer_len, backend=backend)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _prefilled(model, ids, arm: str, prompt: int, piece: int, buffer_len: int):
    """A fresh cache of ``arm`` holding the first ``prompt`` tokens of ``ids`` (forwards of ``piece`` tokens,
    synchronised), and ``decode(steps)``: the next ``steps`` one-token forwards, synchronised at the end."""
    from ..cache import cache_argument

    key = cache_argument(model)
    cache = _make_cache(arm, model, buffer_len)

    @torch.no_grad()
    def decode(steps: int) -> None:
        for pos in range(prompt, prompt + steps):
            model(ids[:, pos : pos + 1], **{key: cache}, use_cache=True, logits_to_keep=1)
        _sync(ids.device)

    with torch.no_grad():
        for start in range(0, prompt, piece):
            model(ids[:, start : min(prompt, start + piece)], **{key: cache}, use_cache=True, logits_to_keep=1)
    _sync(ids.device)
    return cache, decode


def _run(model, ids, arm: str, prompt: int, steps: int, piece: int, buffer_len: int) -> dict:
    device = ids.device
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    cache, decode = _prefilled(model, ids, arm, prompt, piece, buffer_len)
    start_time = time.perf_counter()
    decode(steps)
    elapsed = time.perf_counter() - start_time
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0
    backend = getattr(cache, "resolved_backend", None)
    del cache, decode
    return dict(ms_per_step=elapsed * 1e3 / steps, peak_bytes=peak, backend=backend)


def profile_arm(model, ids, arm: str, prompt: int, steps: int, piece: int, buffer_len: int, out_path=None,
                rows: int = 25) -> str:
    """One run of ``arm`` with torch.profiler around its decode forwards (CPU and, on CUDA, GPU activity): the
    operator table sorted by self CPU time (what an eager, CPU-bound step spends) and, on CUDA, a second one sorted by
    self GPU time (where the GPU time goes: the SSM kernels against the matmuls and attention), written to
    ``out_path``."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if ids.device.type == "cuda" else [])
    _, decode = _prefilled(model, ids, arm, prompt, piece, buffer_len)
    with profile(activities=activities) as prof:
        decode(steps)
    averages = prof.key_averages()
    table = averages.table(sort_by="self_cpu_time_total", row_limit=rows)
    if ids.device.type == "cuda":
        table += f"\n\nby self GPU time ({steps} decode steps):\n"
        table += averages.table(sort_by="self_device_time_total", row_limit=rows)
    if out_path is not None:
        with open(out_path, "w") as f:
            f.write(table)
    return table


def host_profile_arm(model, ids, arm: str, prompt: int, steps: int, piece: int, buffer_len: int, out_path=None,
                     rows: int = 40) -> str:
    """One run of ``arm`` with Python's cProfile around its decode forwards: where an eager step's host time goes by
    Python function (the model's modules, the cache adapters, the kernel wrappers and Triton's launcher), which
    torch.profiler's operator table leaves out. Two tables, by cumulative and by own time, headed by the wall time
    per step under the profiler; written to ``out_path``."""
    import cProfile
    import io
    import pstats

    _, decode = _prefilled(model, ids, arm, prompt, piece, buffer_len)
    profiler = cProfile.Profile()
    start_time = time.perf_counter()
    profiler.enable()
    decode(steps)
    profiler.disable()
    elapsed = time.perf_counter() - start_time
    text = io.StringIO()
    text.write(f"{arm}: {steps} decode steps, {elapsed * 1e3 / steps:.3f} ms per step under cProfile\n")
    for order in ("cumulative", "tottime"):
        text.write(f"\nby {order} time:\n")
        pstats.Stats(profiler, stream=text).sort_stats(order).print_stats(rows)
    table = text.getvalue()
    if out_path is not None:
        with open(out_path, "w") as f:
            f.write(table)
    return table


def measure_steps(model, batch: int, prompt: int = 512, steps: int = 48, piece: int = 128,
                  arms: Sequence[str] = ARMS, buffer_len: int = 16, repeats: int = 2, seed: int = 0) -> dict:
    """Decode ``steps`` tokens after a ``prompt``-token prefill for each arm (interleaved, ``repeats`` times after
    one untimed warm-up run per arm); returns per arm the best ms per step, every repeat, peak memory, and the
    speedup over the stock arm."""
    device = next(model.parameters()).device
    vocab = model.config.get_text_config(decoder=True).vocab_size
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (batch, prompt + steps), generator=generator).to(device)
    for arm in arms:  # warm-up: attention graphs for every KV length, kernel compilation
        _run(model, ids, arm, prompt, steps, piece, buffer_len)
    runs: dict[str, list[dict]] = {arm: [] for arm in arms}
    for _ in range(repeats):
        for arm in arms:
            runs[arm].append(_run(model, ids, arm, prompt, steps, piece, buffer_len))
    result = {"batch": batch, "prompt": prompt, "steps": steps, "buffer_len": buffer_len, "arms": {}}
    for arm, rs in runs.items():
        result["arms"][arm] = dict(ms_per_step=min(r["ms_per_step"] for r in rs),
                                   repeats_ms=[r["ms_per_step"] for r in rs],
                                   peak_bytes=max(r["peak_bytes"] for r in rs), backend=rs[0]["backend"])
    if "stock" in result["arms"]:
        stock = result["arms"]["stock"]["ms_per_step"]
        for entry in result["arms"].values():
            entry["speedup_vs_stock"] = stock / entry["ms_per_step"]
    return result


def table(results: Sequence[dict], title: str = "") -> str:
    arms = list(results[0]["arms"]) if results else []
    lines = [title, f"{'batch':>6} " + " ".join(f"{arm + ' ms':>18}" for arm in arms) + "  "
             + " ".join(f"{'x ' + arm:>16}" for arm in arms if arm != "stock")]
    for r in results:
        lines.append(f"{r['batch']:>6} " + " ".join(f"{r['arms'][a]['ms_per_step']:>18.2f}" for a in arms) + "  "
                     + " ".join(f"{r['arms'][a].get('speedup_vs_stock', 0):>15.2f}x" for a in arms if a != "stock"))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    import argparse

    from .shapes import PREFILL_PIECE, SHAPES, shaped_model

    parser = argparse.ArgumentParser(prog="hf-replayssm bench step", description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="qwen3_5,nemotron_h", help=f"comma-separated, from {sorted(SHAPES)}")
    parser.add_argument("--batches", default="1,64,256")
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--steps", type=int, default=48, help="decode forwards timed per run (3 flush cycles)")
    parser.add_argument("--piece", type=int, help="prefill forwards of this many tokens (default: per model)")
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--buffer-len", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--device", default=default_device(), help="default: cuda where there is a GPU, else cpu")
    parser.add_argument("--out", help="write the results as JSON here")
    parser.add_argument("--profile", help="also write a torch.profiler operator table per model, batch and arm "
                        "(16 decode steps, after the timed runs) into this folder")
    parser.add_argument("--host-profile", help="also write a cProfile table of the decode forwards' Python "
                        "functions per model, batch and arm (16 decode steps, after the timed runs) into this folder")
    args = parser.parse_args(argv)
    try:
        import fla  # noqa: F401

        with_fla = True
    except ImportError:
        with_fla = False
    device_name = torch.cuda.get_device_name() if args.device == "cuda" else args.device
    everything = {"device": device_name, "torch": torch.__version__, "flash_linear_attention": with_fla}
    try:
        import transformers

        everything["transformers"] = transformers.__version__
    except ImportError:
        pass
    for name in args.models.split(","):
        model = shaped_model(name, device=args.device, dtype=getattr(torch, args.dtype))
        piece = args.piece or PREFILL_PIECE.get(name, 64)
        rows = []
        for batch in (int(b) for b in args.batches.split(",")):
            rows.append(measure_steps(model, batch, args.prompt, args.steps, min(piece, args.prompt),
                                      args.arms.split(","), args.buffer_len, args.repeats))
            for folder, profiler in ((args.profile, profile_arm), (args.host_profile, host_profile_arm)):
                if not folder:
                    continue
                import os

                os.makedirs(folder, exist_ok=True)
                vocab = model.config.get_text_config(decoder=True).vocab_size
                ids = torch.randint(3, vocab, (batch, args.prompt + 16), device=args.device)
                for arm in args.arms.split(","):
                    profiler(model, ids, arm, args.prompt, 16, min(piece, args.prompt), args.buffer_len,
                             os.path.join(folder, f"{name}_b{batch}_{arm}.txt"))
            print(table(rows[-1:], "" if len(rows) > 1 else f"== {name}-like ({type(model).__name__}) on "
                        f"{device_name}, fla {'installed' if with_fla else 'absent'}: ms per decode step"),
                  flush=True)
        everything[name] = rows
        del model
        if args.device == "cuda":
            torch.cuda.empty_cache()
    if args.out:
        with open(args.out, "w") as f:
            json.dump(everything, f, indent=2)
    return 0
