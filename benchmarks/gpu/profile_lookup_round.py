"""Where a compiled prompt-lookup round's time goes against a compiled greedy step, both on a static ReplayCache
(transformers 5.25 compiles the verify forwards): host time by Python function (cProfile over one whole generate,
after the warm-up) and GPU kernel time and launches (torch.profiler over another), per new token. Run on the GPU
machine after ``source benchmarks/gpu/install.sh`` (transformers 5.25 on the path):

    python3 $R/benchmarks/gpu/profile_lookup_round.py --model qwen3_5 --layers 8 --prompt 512 --new 64 --out DIR

``--model`` takes a shaped name (random weights, code-edit prompt) or a bundled one (``tiny-gdn-copy``, passage
prompt). With ``--device cpu --tiny --compile-backend eager`` it runs as a smoke test on the CPU.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import time

import torch
from torch.profiler import ProfilerActivity, profile

from hf_replayssm.bench.generate import (
    DraftCounter,
    Settings,
    _speculative_kwargs,
    _vocab,
    build_model,
    is_saved_model,
    speculative_prompt,
    timed_generate,
)
from hf_replayssm.models import load_model


def kernel_totals(prof) -> tuple[int, float]:
    """Kernel launches (CUDA-graph replays' kernels included) and GPU microseconds in a profile."""
    kernels = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
    return sum(e.count for e in kernels), sum(e.self_device_time_total for e in kernels)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="qwen3_5")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--lookup", type=int, default=10)
    parser.add_argument("--arms", default="greedy-static-compiled,lookup-static-compiled")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--compile-backend", default="inductor")
    parser.add_argument("--processors", action="store_true", help="the bench's old logits processors (exact length "
                        "by suppressed special tokens, a first-token clock), which the assisted loop runs per draft")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    dtype = getattr(torch, args.dtype)
    if is_saved_model(args.model):
        model, tokenizer = load_model(args.model, device=args.device, dtype=dtype)
    else:
        model, tokenizer = build_model(args.model, args.device, dtype, args.tiny, args.layers), None
    kind = "passage" if tokenizer is not None else "code-edit"
    ids = speculative_prompt(kind, _vocab(model), args.prompt, 0, tokenizer).to(args.device)
    mode = "reduce-overhead" if args.compile_backend == "inductor" else None
    settings = Settings(compile_backend=args.compile_backend, compile_mode=mode)
    length = args.prompt + args.new
    summary, report = {}, io.StringIO()

    def run(arm):
        kwargs = _speculative_kwargs(arm, model, None, settings, args.lookup, length)
        with DraftCounter(model) as counter:
            result = timed_generate(model, ids, args.new, kwargs, processors=args.processors)
        return result, counter

    for arm in args.arms.split(","):
        for _ in range(2):  # compile, record graphs, warm every length
            run(arm)
        wall, counter = run(arm)
        timer = cProfile.Profile()
        timer.enable()
        start = time.perf_counter()
        run(arm)
        profiled_s = time.perf_counter() - start
        timer.disable()
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if args.device == "cuda" else [])
        with profile(activities=activities) as prof:
            run(arm)
        launches, gpu_us = kernel_totals(prof) if args.device == "cuda" else (0, 0.0)
        summary[arm] = dict(ms_per_token=wall["seconds"] * 1e3 / args.new, rounds=counter.rounds,
                            drafted=counter.drafted, accepted=counter.accepted, compiled=wall["compiled"],
                            cprofile_ms_per_token=profiled_s * 1e3 / args.new,
                            gpu_ms_per_token=gpu_us / 1e3 / args.new, launches_per_token=launches / args.new)
        print(arm, json.dumps(summary[arm]), flush=True)
        for sort in ("tottime", "cumulative"):
            text = io.StringIO()
            pstats.Stats(timer, stream=text).sort_stats(sort).print_stats(50)
            report.write(f"\n==== {arm} by {sort}\n{text.getvalue()}")
        report.write(f"\n==== {arm}: torch.profiler by self CPU time\n"
                     f"{prof.key_averages().table(sort_by='self_cpu_time_total', row_limit=40)}\n")
        if args.device == "cuda":
            report.write(f"\n==== {arm}: torch.profiler by GPU time\n"
                         f"{prof.key_averages().table(sort_by='self_cuda_time_total', row_limit=30)}\n")
    with open(os.path.join(args.out, f"profile_lookup_round_{args.model}.txt"), "w") as f:
        f.write(json.dumps(summary, indent=2) + "\n" + report.getvalue())
    with open(os.path.join(args.out, f"profile_lookup_round_{args.model}.json"), "w") as f:
        json.dump(summary, f, indent=2)


if __name__ == "__main__":
    main()
