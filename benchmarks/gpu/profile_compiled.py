"""Where a compiled (CUDA-graph) decode step goes: stock static cache against ReplayCache, one model, one batch.

Both arms run ``generate`` once to compile and record their graphs, then again under torch.profiler; the table lists
the GPU kernels by self GPU time with their call counts, so kernels per step and GPU time per step of the two arms
sit side by side (kernels inside CUDA-graph replays are traced like launched ones). Run on the GPU machine after
``source benchmarks/gpu/install.sh``:

    python3 $R/benchmarks/gpu/profile_compiled.py --model nemotron_h --batch 1 --prompt 128 --new 64 --out DIR
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats

import torch
from torch.profiler import ProfilerActivity, profile

from hf_replayssm.bench.generate import Settings, arm_kwargs, build_model, timed_generate


def kernel_totals(prof) -> tuple[int, float]:
    """Kernel launches and GPU microseconds in a profile (its device events)."""
    kernels = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
    return sum(e.count for e in kernels), sum(e.self_device_time_total for e in kernels)


def profiled(model, ids, arm, settings, cache_len, new_tokens):
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        timed_generate(model, ids, new_tokens, arm_kwargs(arm, model, settings, cache_len))
    return prof


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="nemotron_h")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--arms", default="stock-static-compiled,replay-compiled")
    parser.add_argument("--out", required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true", help="tiny shapes (a CPU smoke run)")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    model = build_model(args.model, args.device, torch.bfloat16 if args.device == "cuda" else torch.float32,
                        tiny=args.tiny)
    vocab = model.config.get_text_config(decoder=True).vocab_size
    ids = torch.randint(3, vocab, (args.batch, args.prompt), generator=torch.Generator().manual_seed(0)).to(args.device)
    settings = Settings()
    summaries = {}
    for arm in args.arms.split(","):  # an arm named twice runs twice (the host's speed can drift between arms)
        cache_len, index = args.prompt + args.new, len(summaries)
        for _ in range(2):  # compile, record the graphs, warm every KV length
            run = timed_generate(model, ids, args.new, arm_kwargs(arm, model, settings, cache_len))
        ms = (run["seconds"] - run["prefill_s"]) * 1e3 / (args.new - 1)
        # two generates that differ only in their decode steps: the difference is per decode step, prefill excluded
        short = profiled(model, ids, arm, settings, cache_len, 16)
        prof = profiled(model, ids, arm, settings, cache_len, args.new)
        (count_short, us_short), (count, us) = kernel_totals(short), kernel_totals(prof)
        steps = args.new - 16
        averages = prof.key_averages()
        table = averages.table(sort_by="self_device_time_total", row_limit=40)
        table += "\n\nby self CPU time:\n" + averages.table(sort_by="self_cpu_time_total", row_limit=40)
        python = cProfile.Profile()  # the host's Python work of one generate, by function
        python.enable()
        timed_generate(model, ids, args.new, arm_kwargs(arm, model, settings, cache_len))
        python.disable()
        text = io.StringIO()
        pstats.Stats(python, stream=text).sort_stats("tottime").print_stats(45)
        table += "\n\ncProfile of one generate, by own time:\n" + text.getvalue()
        summary = dict(ms_per_step_unprofiled=ms, compiled=run["compiled"],
                       kernels_per_step=(count - count_short) / steps, gpu_us_per_step=(us - us_short) / steps)
        summaries[f"{arm} ({index})"] = summary
        with open(os.path.join(args.out, f"{args.model}_b{args.batch}_{arm}_{index}.txt"), "w") as f:
            f.write(f"{summary}\n\n{table}\n")
        print(arm, summary, flush=True)
    for arm, summary in summaries.items():
        print(f"{arm:28s} {summary['ms_per_step_unprofiled']:.3f} ms/step  "
              f"{summary['kernels_per_step']:.1f} kernels/step  {summary['gpu_us_per_step']:.1f} GPU us/step")


if __name__ == "__main__":
    main()
