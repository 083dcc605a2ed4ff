"""Where a compiled decode step's wall time goes: stock static cache against ReplayCache, split per step.

At batch 1 a compiled (CUDA-graph) decode step is host-bound, and ReplayCache has been 2-4 % slower than the stock
static cache there although its GPU work is smaller (BENCHMARKS.md, runs 149-152). This script times every decode
step of ``generate`` in three parts:

- ``outside``: host time between two compiled calls (the generate loop: logits processing, stopping criteria, input
  preparation and mask building; with a device, the wait for the previous step's results is in here too);
- ``call host``: the compiled call itself on the host (Dynamo's guard check, the input list, AOT and CUDA-graph
  wrappers, the graph launch);
- ``call GPU``: on CUDA, the device time between events recorded before and after the compiled call.

The arms alternate per repeat (a drifting host reaches both) and each part is reported as the median over steps,
then over repeats, with the median of the paired differences (ReplayCache minus stock, same repeat). On the GPU
machine after ``source benchmarks/gpu/install.sh``:

    python3 $R/benchmarks/offline/host_split.py --models nemotron_h,qwen3_5,kimi_linear --repeats 8 --out split.json

and on a CPU (tiny shapes, Dynamo's ``eager`` backend, no CUDA graphs)
``python benchmarks/offline/host_split.py --tiny --device cpu --models nemotron_h``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import time

import torch

from hf_replayssm.bench.generate import Settings, arm_kwargs, build_model, timed_generate

ARMS = ("stock-static-compiled", "replay-compiled")
PARTS = ("outside", "call_host", "call_gpu", "step")


class StepClock:
    """Wraps ``model.get_compiled_call`` so every compiled call is timed on the host and, on CUDA, on the device.
    ``install`` before each ``timed_generate`` (its compile probe removes the instance attribute on exit)."""

    def __init__(self, model, cuda: bool):
        self.model, self.cuda = model, cuda
        self.calls: list[tuple[float, float, object, object]] = []

    def install(self) -> None:
        self.calls.clear()
        original = type(self.model).get_compiled_call.__get__(self.model)

        def timed_compiled_call(compile_config):
            compiled = original(compile_config)

            def call(*args, **kwargs):
                start_event = end_event = None
                if self.cuda:
                    start_event, end_event = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start_event.record()
                start = time.perf_counter()
                out = compiled(*args, **kwargs)
                end = time.perf_counter()
                if self.cuda:
                    end_event.record()
                self.calls.append((start, end, start_event, end_event))
                return out

            return call

        self.model.get_compiled_call = timed_compiled_call

    def parts(self, skip: int) -> dict[str, float]:
        """Median microseconds per decode step of each part, past the first ``skip`` compiled calls."""
        if self.cuda:
            torch.cuda.synchronize()
        calls = self.calls[skip:]
        if len(calls) < 3:
            raise ValueError(f"only {len(calls)} timed decode steps: generate more tokens")
        outside = [(nxt[0] - cur[1]) * 1e6 for cur, nxt in itertools.pairwise(calls)]
        call_host = [(end - start) * 1e6 for start, end, _, _ in calls[:-1]]
        call_gpu = ([s.elapsed_time(e) * 1e3 for _, _, s, e in calls[:-1]] if self.cuda else [0.0] * len(call_host))
        step = [(nxt[0] - cur[0]) * 1e6 for cur, nxt in itertools.pairwise(calls)]
        return {name: statistics.median(values) for name, values in
                zip(PARTS, (outside, call_host, call_gpu, step), strict=True)}


def measure(model_name: str, args) -> dict:
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    model = build_model(model_name, device, torch.bfloat16 if cuda else torch.float32, tiny=args.tiny)
    vocab = model.config.get_text_config(decoder=True).vocab_size
    ids = torch.randint(3, vocab, (args.batch, args.prompt), generator=torch.Generator().manual_seed(0)).to(device)
    settings = Settings() if cuda else Settings(compile_backend="eager", compile_mode=None)
    clock = StepClock(model, cuda)
    cache_len = args.prompt + args.new
    for _ in range(2):  # compile, record the graphs, warm every KV length, both arms
        for arm in ARMS:
            clock.install()
            timed_generate(model, ids, args.new, arm_kwargs(arm, model, settings, cache_len))
    runs = {arm: [] for arm in ARMS}
    for _ in range(args.repeats):
        for arm in ARMS:
            clock.install()
            timed_generate(model, ids, args.new, arm_kwargs(arm, model, settings, cache_len))
            runs[arm].append(clock.parts(skip=2))
    result = {"model": model_name, "batch": args.batch, "prompt": args.prompt, "new": args.new, "arms": {}}
    for arm in ARMS:
        result["arms"][arm] = {part: statistics.median(run[part] for run in runs[arm]) for part in PARTS}
    stock, replay = runs[ARMS[0]], runs[ARMS[1]]
    result["paired_excess_us"] = {part: statistics.median(r[part] - s[part] for r, s in zip(replay, stock, strict=True))
                                  for part in PARTS}
    result["repeats"] = runs
    return result


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="nemotron_h,qwen3_5,kimi_linear")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true", help="tiny shapes (a CPU run)")
    parser.add_argument("--out", help="JSON results")
    args = parser.parse_args(argv)
    results = []
    for model_name in args.models.split(","):
        result = measure(model_name, args)
        results.append(result)
        print(f"== {model_name}, batch {args.batch}, prompt {args.prompt}: us per decode step (median over steps, "
              f"then over {args.repeats} interleaved repeats)")
        print(f"{'arm':24s} " + " ".join(f"{part:>10s}" for part in PARTS))
        for arm, parts in result["arms"].items():
            print(f"{arm:24s} " + " ".join(f"{parts[part]:10.1f}" for part in PARTS))
        print(f"{'paired excess':24s} " + " ".join(f"{result['paired_excess_us'][part]:+10.1f}" for part in PARTS),
              flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"torch": torch.__version__, "device": args.device, "results": results}, f, indent=1)
    return results


if __name__ == "__main__":
    main()
