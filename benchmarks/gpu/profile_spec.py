"""Where a speculative round's host time goes on the H200: tiny-gdn-copy, batch 16, prompt 512, 128 new tokens.
Python-level profile (cProfile) of the main model's forwards by width (plain greedy's width-1 steps against batched
prompt lookup's verify windows), and the CUDA launches per forward (torch.profiler). Run from /tmp/w after
benchmarks/gpu/install.sh: ``python3 $R/benchmarks/gpu/profile_spec.py OUTDIR``."""

import collections
import cProfile
import io
import pstats
import sys
import time

import torch

from hf_replayssm.batched import batched_prompt_lookup
from hf_replayssm.bench.speculative import repetitive_batch
from hf_replayssm.cache import ReplayCache
from hf_replayssm.models import load_model

out_dir = sys.argv[1]
start = time.perf_counter()
stamp = lambda what: print(f"[{time.perf_counter() - start:7.1f} s] {what}", flush=True)  # noqa: E731
model, tok = load_model("tiny-gdn-copy", device="cuda", dtype=torch.bfloat16)
batch = int(sys.argv[2]) if len(sys.argv) > 2 else 16
ids = repetitive_batch(model.config.vocab_size, batch, 512, 0, tok).cuda()
stamp("loaded")


def run(kind):
    if kind == "greedy":
        return model.generate(ids, do_sample=False, max_new_tokens=128, past_key_values=ReplayCache(16))
    return batched_prompt_lookup(model, ids, max_new_tokens=128, num_draft_tokens=10, cache=ReplayCache(16))


for kind in ("greedy", "lookup"):
    run(kind)
    stamp(f"warm {kind}")
    run(kind)
    stamp(f"second {kind}")

original = model.forward
profiles = collections.defaultdict(cProfile.Profile)
walls = collections.defaultdict(list)
launches = collections.defaultdict(list)


def forward(*args, **kwargs):
    width = (args[0] if args else kwargs["input_ids"]).shape[1]
    key = (current, width)
    if len(launches[key]) < 3:  # a few forwards under torch.profiler: CUDA launches per forward
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            out = original(*args, **kwargs)
        n = sum(e.count for e in prof.key_averages() if "LaunchKernel" in e.key or "cuLaunch" in e.key)
        launches[key].append(n)
        return out
    torch.cuda.synchronize()
    t = time.perf_counter()
    profiles[key].enable()
    out = original(*args, **kwargs)
    profiles[key].disable()
    torch.cuda.synchronize()
    walls[key].append(time.perf_counter() - t)
    return out


model.forward = forward
for current in ("greedy", "lookup"):
    run(current)
    stamp(f"profiled {current}")
with open(f"{out_dir}/profile_spec_b{batch}.txt", "w") as f:
    for key in sorted(walls):
        w = walls[key]
        f.write(f"{key}: {len(w)} forwards, mean {1e3 * sum(w) / len(w):.2f} ms, launches {launches[key]}\n")
    for key in sorted(walls):
        if len(walls[key]) < 3:
            continue
        for sort in ("cumulative", "tottime"):
            s = io.StringIO()
            pstats.Stats(profiles[key], stream=s).sort_stats(sort).print_stats(45)
            f.write(f"\n==== {key} by {sort}\n{s.getvalue()}")
stamp("written")
