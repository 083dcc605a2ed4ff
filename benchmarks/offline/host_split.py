"""Where a compiled decode step's wall time goes: stock static cache against ReplayCache, split per step.

At batch 1 a compiled (CUDA-graph) decode step is host-bound, and ReplayCache has been 2-4 % slower than the stock
static cache there although its GPU work is smaller (BENCHMARKS.md, runs 149-152). This script times every decode
step of ``generate`` in three parts:

- ``outside``: host time between two compiled calls (the generate loop: logits processing, stopping criteria, input
  preparation and mask building; with a device, the wait for the previous step's results is in here too);
- ``call host``: the compiled call itself on the host (Dynamo's guard check, the input list, AOT and CUDA-graph
  wrappers, the graph launch);
- ``call GPU``: on CUDA, the device time between events recorded before and after the compiled call;
- ``tree host`` and ``replay host``: on CUDA, the part of ``call host`` inside the CUDA-graph tree's ``run`` (input
  checks, launch, outputs) and inside ``CUDAGraph.replay`` alone; ``call host`` less ``tree host`` is Dynamo's
  guard check and transformed bytecode with the AOT / Inductor wrappers;
- ``graph GPU``: on CUDA, the device time from just before the (last) graph launch to the call's end, so the graph's
  own work without the wait for the host to launch it; ``after replay``: host time from the launch's return to the
  call's return.

The arms alternate per repeat (a drifting host reaches both) and each part is reported as the median over steps,
then over repeats, with the median of the paired differences (ReplayCache minus stock, same repeat). With
``--profile-dir`` it then looks inside the compiled call: one more generate per arm under cProfile, enabled only
while a compiled call runs (``DIR/<model>_<arm>_calls.txt``, and the functions whose own time per call differs most
between the arms), and the time of Dynamo's guard check on the last step's frame locals (best of 200 blocks of 20).
On the GPU machine after ``source benchmarks/gpu/install.sh``:

    python3 $R/benchmarks/offline/host_split.py --models nemotron_h,qwen3_5,kimi_linear --repeats 8 --out split.json

and on a CPU (tiny shapes, Dynamo's ``eager`` backend, no CUDA graphs)
``python benchmarks/offline/host_split.py --tiny --device cpu --models nemotron_h``.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import itertools
import json
import os
import pstats
import statistics
import time

import torch
from guard_check import decode_frame  # this folder's guard reader (a script's folder is on its import path)

from hf_replayssm.bench.generate import Settings, arm_kwargs, build_model, timed_generate

ARMS = ("stock-static-compiled", "replay-compiled")
PARTS = ("outside", "call_host", "call_gpu", "step", "tree_host", "replay_host", "graph_gpu", "after_replay",
         "before_aot", "after_aot")


class InnerClock:
    """Host time spent inside the CUDA-graph tree's ``run`` (its input checks, the graph launch, the outputs'
    reconstruction) and inside ``CUDAGraph.replay`` alone during each compiled call, so that the compiled call's host
    part splits into Dynamo + AOT / Inductor wrappers (the rest), the tree's own work and the launch. Patches the two
    methods at class level for the life of the process (a plain pass-through when no call is being timed), once:
    ``shared()`` hands every step clock the same instance, so timing several models does not stack wrappers."""

    _shared: InnerClock | None = None

    @classmethod
    def shared(cls) -> InnerClock:
        if cls._shared is None:
            cls._shared = cls()
        return cls._shared

    def __init__(self):
        self.totals = {"tree_host": 0.0, "replay_host": 0.0}
        self.active = False
        self.replay_event = None  # CUDA event recorded just before the call's last graph launch
        self.replay_end = 0.0  # host clock when the call's last graph launch returned
        self.aot_span: list[float] = []  # host clock at the first entry into, and the last exit from, AOT's call
        try:
            import torch._dynamo  # AOTAutograd's modules import Dynamo's: it goes first
            from torch._functorch._aot_autograd import runtime_wrappers
            from torch._inductor import cudagraph_trees
        except ImportError:  # no Inductor: the parts stay 0
            return
        self._wrap(cudagraph_trees.CUDAGraphTreeManager, "run", "tree_host")
        self._wrap(torch.cuda.CUDAGraph, "replay", "replay_host")
        if hasattr(runtime_wrappers, "call_func_at_runtime_with_args"):  # the compiled graph's call, AOT's runtime
            self._span(runtime_wrappers, "call_func_at_runtime_with_args")  # wrappers on either side of it

    def _span(self, module, name: str) -> None:
        original = getattr(module, name)
        clock = self

        def spanned(*args, **kwargs):
            if not clock.active:
                return original(*args, **kwargs)
            if not clock.aot_span:
                clock.aot_span.append(time.perf_counter())
            try:
                return original(*args, **kwargs)
            finally:
                clock.aot_span[1:] = [time.perf_counter()]

        setattr(module, name, spanned)

    def _wrap(self, cls, name: str, part: str) -> None:
        original = getattr(cls, name)
        clock = self

        def timed(*args, **kwargs):
            if not clock.active:
                return original(*args, **kwargs)
            if part == "replay_host":  # the graph's own device time starts here, not at the call's start
                clock.replay_event = torch.cuda.Event(enable_timing=True)
                clock.replay_event.record()
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                end = time.perf_counter()
                clock.totals[part] += (end - start) * 1e6
                if part == "replay_host":
                    clock.replay_end = end

        setattr(cls, name, timed)

    def start(self) -> None:
        self.totals = dict.fromkeys(self.totals, 0.0)
        self.replay_event, self.replay_end, self.aot_span = None, 0.0, []
        self.active = True

    def stop(self, start: float, end: float) -> dict:
        """The call's inner parts; ``start`` and ``end``: the host clock at the call's start and return.
        ``after_replay``: from the last graph launch's return to the call's return (output reconstruction, AOT's
        epilogue, Dynamo's return); ``before_aot``: from the call's start to the compiled graph's call inside AOT's
        runtime wrapper (the guard check, the transformed bytecode gathering the inputs, AOT's prologue);
        ``after_aot``: from that call's return to the call's return."""
        self.active = False
        parts = dict(self.totals)
        parts["replay_event"] = self.replay_event
        parts["after_replay"] = (end - self.replay_end) * 1e6 if self.replay_event is not None else 0.0
        spanned = len(self.aot_span) == 2
        parts["before_aot"] = (self.aot_span[0] - start) * 1e6 if spanned else 0.0
        parts["after_aot"] = (end - self.aot_span[1]) * 1e6 if spanned else 0.0
        return parts


class StepClock:
    """Wraps ``model.get_compiled_call`` so every compiled call is timed on the host and, on CUDA, on the device.
    ``install`` before each ``timed_generate`` (its compile probe removes the instance attribute on exit)."""

    def __init__(self, model, cuda: bool):
        self.model, self.cuda = model, cuda
        # (start, end, start event, end event, inner parts) of each compiled call
        self.calls: list[tuple[float, float, object, object, dict]] = []
        self.profile: cProfile.Profile | None = None  # enabled only inside compiled calls when set
        self.last_call: tuple | None = None  # (args, kwargs) of the newest compiled call
        self.inner = InnerClock.shared() if cuda else None

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
                if self.profile is not None:
                    self.profile.enable()
                if self.inner is not None:
                    self.inner.start()
                start = time.perf_counter()
                out = compiled(*args, **kwargs)
                end = time.perf_counter()
                inner = self.inner.stop(start, end) if self.inner is not None else {}
                if self.profile is not None:
                    self.profile.disable()
                self.last_call = (args, kwargs)
                if self.cuda:
                    end_event.record()
                self.calls.append((start, end, start_event, end_event, inner))
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
        call_host = [(end - start) * 1e6 for start, end, _, _, _ in calls[:-1]]
        call_gpu = ([s.elapsed_time(e) * 1e3 for _, _, s, e, _ in calls[:-1]] if self.cuda else [0.0] * len(call_host))
        step = [(nxt[0] - cur[0]) * 1e6 for cur, nxt in itertools.pairwise(calls)]
        tree = [inner.get("tree_host", 0.0) for *_, inner in calls[:-1]]
        replay = [inner.get("replay_host", 0.0) for *_, inner in calls[:-1]]
        # the graph's device time alone: from just before its launch to the call's end event
        graph_gpu = [inner["replay_event"].elapsed_time(e) * 1e3 if inner.get("replay_event") is not None else 0.0
                     for _, _, _, e, inner in calls[:-1]]
        after = [inner.get("after_replay", 0.0) for *_, inner in calls[:-1]]
        before_aot = [inner.get("before_aot", 0.0) for *_, inner in calls[:-1]]
        after_aot = [inner.get("after_aot", 0.0) for *_, inner in calls[:-1]]
        return {name: statistics.median(values) for name, values in
                zip(PARTS, (outside, call_host, call_gpu, step, tree, replay, graph_gpu, after, before_aot, after_aot),
                    strict=True)}


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
    # --skip-guards: Dynamo checks only the guards that tell its cached entries apart (unsafe in general; here both
    # arms replay the frames they just compiled), so the guard check's share of the call shows as the difference
    stance = (torch.compiler.set_stance(skip_guard_eval_unsafe=True) if args.skip_guards
              else contextlib.nullcontext())
    with stance:
        for _ in range(args.repeats):
            for arm in ARMS:
                clock.install()
                timed_generate(model, ids, args.new, arm_kwargs(arm, model, settings, cache_len))
                runs[arm].append(clock.parts(skip=2))
    result = {"model": model_name, "batch": args.batch, "prompt": args.prompt, "new": args.new,
              "skip_guards": args.skip_guards, "arms": {}}
    for arm in ARMS:
        result["arms"][arm] = {part: statistics.median(run[part] for run in runs[arm]) for part in PARTS}
    stock, replay = runs[ARMS[0]], runs[ARMS[1]]
    result["paired_excess_us"] = {part: statistics.median(r[part] - s[part] for r, s in zip(replay, stock, strict=True))
                                  for part in PARTS}
    result["repeats"] = runs
    if args.profile_dir:
        result["inside_call"] = look_inside(model, model_name, ids, clock, settings, cache_len, args)
    return result


def guard_check_us(model, call: tuple) -> dict | None:
    """Best time (us) of Dynamo's guard check of the compiled frame on a call's locals: the passing entry's own
    guards, and every entry of the frame's list up to it; None where this torch lacks the private frame cache or
    no single entry passes."""
    if not hasattr(torch._dynamo.eval_frame, "_debug_get_cache_entry_list"):
        return None
    managers, frame_locals, passing = decode_frame(model, *call)
    if passing is None:
        return None
    with torch.no_grad():

        def best_us(checks) -> float:
            best = float("inf")
            for _ in range(200):
                start = time.perf_counter()
                for _ in range(20):
                    for check in checks:
                        check(frame_locals)
                best = min(best, (time.perf_counter() - start) / 20)
            return best * 1e6

        # the entry's own guards, and the entries in the frame's list up to it (a lookup walking the list in order
        # fails the other arm's entries first; Dynamo may reorder the list, so this bounds the walk)
        return {"own": best_us([managers[passing].check]),
                "list_walk": best_us([manager.check for manager in managers[: passing + 1]]),
                "position": passing, "entries": len(managers)}


def look_inside(model, model_name: str, ids, clock: StepClock, settings, cache_len: int, args) -> dict:
    """cProfile inside the compiled calls of one generate per arm, and the guard check's time per arm."""
    os.makedirs(args.profile_dir, exist_ok=True)
    own_us: dict[str, dict[str, float]] = {}
    guards = {}
    for arm in ARMS:
        clock.install()
        clock.profile = cProfile.Profile()
        timed_generate(model, ids, args.new, arm_kwargs(arm, model, settings, cache_len))
        profile, clock.profile = clock.profile, None
        calls = len(clock.calls)
        stats = pstats.Stats(profile)
        own_us[arm] = {f"{os.path.basename(key[0])}:{key[1]}({key[2]})": value[2] / calls * 1e6
                       for key, value in stats.stats.items()}
        text = io.StringIO()
        pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(40)
        with open(os.path.join(args.profile_dir, f"{model_name}_{arm}_calls.txt"), "w") as f:
            f.write(f"cProfile inside {calls} compiled calls of one generate\n{text.getvalue()}")
        guards[arm] = guard_check_us(model, clock.last_call)
    stock, replay = own_us[ARMS[0]], own_us[ARMS[1]]
    diffs = sorted(((replay.get(k, 0.0) - stock.get(k, 0.0), k) for k in set(stock) | set(replay)),
                   key=lambda item: -abs(item[0]))
    return {"guard_check_us": guards, "own_us_per_call": {"stock": sum(stock.values()), "replay": sum(replay.values())},
            "largest_own_time_differences_us": [(k, round(d, 2)) for d, k in diffs[:25]]}


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
    parser.add_argument("--profile-dir", help="also profile inside the compiled calls and time the guard check")
    parser.add_argument("--skip-guards", action="store_true",
                        help="time the repeats under torch.compiler.set_stance(skip_guard_eval_unsafe=True)")
    args = parser.parse_args(argv)
    results = []
    for model_name in args.models.split(","):
        result = measure(model_name, args)
        results.append(result)
        print(f"== {model_name}, batch {args.batch}, prompt {args.prompt}: us per decode step (median over steps, "
              f"then over {args.repeats} interleaved repeats){', guard check skipped' if args.skip_guards else ''}")
        print(f"{'arm':24s} " + " ".join(f"{part:>12s}" for part in PARTS))
        for arm, parts in result["arms"].items():
            print(f"{arm:24s} " + " ".join(f"{parts[part]:12.1f}" for part in PARTS))
        print(f"{'paired excess':24s} " + " ".join(f"{result['paired_excess_us'][part]:+12.1f}" for part in PARTS),
              flush=True)
        inside = result.get("inside_call")
        if inside:
            print(f"inside the compiled call (cProfile, us of own time per call): {inside['own_us_per_call']}; "
                  f"guard check (us): {inside['guard_check_us']}")
            for name, diff in inside["largest_own_time_differences_us"]:
                print(f"  {diff:+8.2f}  {name}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"torch": torch.__version__, "device": args.device, "results": results}, f, indent=1)
    return results


if __name__ == "__main__":
    main()
