"""The host work of one eager decode step besides the kernels: stock cache against ReplayCache, on the CPU.

An eager decode step at batch 1 is host-bound on a GPU: its time is the Python and the operator dispatch that launch
its kernels. This script counts that work on a tiny model where it can be counted exactly: the aten operators one
decode step dispatches (a ``TorchDispatchMode``) and the Python calls it makes (``sys.setprofile``), per arm, and
times the steps (best of ``--repeats`` blocks, the arms alternating). ReplayCache runs its GPU path
(``backend="triton"`` under ``TRITON_INTERPRET=1``) with the Triton replay-step entry points stubbed out (each hands
back its output buffer), so its count is everything its GPU step does on the host except the kernel wrapper and the
launch (``--wrapper`` times that wrapper alone, its launch stubbed). Stock runs transformers' own decode path (on the
CPU: its torch reference, as on a GPU without fla / mamba_ssm). About 20 s a model:

    python benchmarks/offline/eager_host_work.py --models qwen3_5_text,nemotron_h,kimi_linear --out host.json
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import os
import sys
import time

import torch

# this folder's result writer (a script's folder is on its import path)
from guard_check import write_rows
from torch.utils._python_dispatch import TorchDispatchMode

from hf_replayssm import ReplayCache
from hf_replayssm.tiny import tiny_model

STUBBED = (("delta_rule", "delta_replay_step"), ("mamba2", "mamba2_replay_step"))


class _OpCounter(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.counts: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def stubbed_replay_kernels(calls: collections.Counter):
    """The Triton replay-step entry points replaced by stubs that return their ``out`` (counted in ``calls``), and
    ``TRITON_INTERPRET=1`` so that a CPU model binds the Triton backend; both restored on exit."""
    import importlib

    modules = {name: importlib.import_module(f"hf_replayssm.kernels.{name}") for name, _ in STUBBED}
    originals = {(name, entry): getattr(modules[name], entry) for name, entry in STUBBED}
    previous = os.environ.get("TRITON_INTERPRET")

    def stub(entry):
        def step(*args, out=None, **kwargs):
            calls[entry] += 1
            return out
        return step

    os.environ["TRITON_INTERPRET"] = "1"
    for name, entry in STUBBED:
        setattr(modules[name], entry, stub(entry))
    try:
        yield
    finally:
        for (name, entry), original in originals.items():
            setattr(modules[name], entry, original)
        if previous is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = previous


def _count_calls(counts: collections.Counter, frame, event, arg) -> None:
    counts[event] += 1  # "call": a Python function entered


def _new_cache(model, arm: str):
    from transformers import DynamicCache

    return DynamicCache(config=model.config) if arm == "stock" else ReplayCache(backend="triton")


def measure(model_type: str, steps: int = 20, repeats: int = 5, prompt: int = 64) -> list[dict]:
    """Per arm: aten operators and Python calls per eager decode step, and the best block's time per step."""
    model = tiny_model(model_type, seed=0, initializer_range=0.2)
    ids = torch.randint(3, model.config.vocab_size, (1, prompt), generator=torch.Generator().manual_seed(1))
    kernel_calls: collections.Counter = collections.Counter()
    runs = {}
    with stubbed_replay_kernels(kernel_calls), torch.no_grad():
        for arm in ("stock", "replay"):
            cache = _new_cache(model, arm)
            token = model(ids, past_key_values=cache).logits[:, -1:].argmax(-1)
            for _ in range(3):  # past the first steps (lazy allocations)
                model(token, past_key_values=cache)
            counter, python_calls = _OpCounter(), collections.Counter()
            with counter:
                sys.setprofile(functools.partial(_count_calls, python_calls))
                try:
                    for _ in range(steps):
                        model(token, past_key_values=cache)
                finally:
                    sys.setprofile(None)
            runs[arm] = dict(cache=cache, ops=sum(counter.counts.values()) / steps, calls=python_calls["call"] / steps,
                             times=[])
        for _ in range(repeats):
            for run in runs.values():
                start = time.perf_counter()
                for _ in range(steps):
                    model(token, past_key_values=run["cache"])
                run["times"].append((time.perf_counter() - start) / steps * 1e6)
    if not kernel_calls:
        raise RuntimeError("ReplayCache's decode steps called no stubbed kernel: they did not take the Triton path")
    return [{"model": model_type, "arm": arm, "aten_ops_per_step": run["ops"], "python_calls_per_step": run["calls"],
             "us_per_step": min(run["times"]), "stubbed_kernel_calls": dict(kernel_calls) if arm == "replay" else {}}
            for arm, run in runs.items()]


def wrapper_cost(batch: int = 1, calls: int = 2000) -> float:
    """Microseconds per call of the delta rule's replay-step wrapper at Qwen3.5's shape (32 value / 16 key heads of
    128), its Triton launch stubbed (best of five blocks)."""
    from triton.runtime import interpreter, jit

    from hf_replayssm.kernels.delta_rule import delta_replay_step

    def no_launch(self, grid):
        return lambda *args, **kwargs: None

    hv, hk, k, v, ring = 32, 16, 128, 128, 16
    state, ring_k = torch.randn(batch, hv, k, v), torch.randn(batch, ring, hk, k)
    ring_d, ring_g = torch.randn(batch, ring, hv, v), torch.randn(batch, ring, hv)
    q, key, value = torch.randn(batch, hk, k), torch.randn(batch, hk, k), torch.randn(batch, hv, v)
    beta, gate, out = torch.rand(batch, hv), -torch.rand(batch, hv), torch.empty(batch, hv, v)
    saved = interpreter.InterpretedFunction.__getitem__, jit.JITFunction.__getitem__
    interpreter.InterpretedFunction.__getitem__ = jit.JITFunction.__getitem__ = no_launch
    try:
        best = float("inf")
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(calls):
                delta_replay_step(state, ring_k, ring_d, ring_g, 0, 3, q, key, value, beta, gate, buffer_len=16,
                                  out=out)
            best = min(best, (time.perf_counter() - start) / calls * 1e6)
    finally:
        interpreter.InterpretedFunction.__getitem__, jit.JITFunction.__getitem__ = saved
    return best


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="qwen3_5_text,nemotron_h,kimi_linear")
    parser.add_argument("--steps", type=int, default=20, help="decode steps per block")
    parser.add_argument("--repeats", type=int, default=5, help="timed blocks per arm (the best counts)")
    parser.add_argument("--wrapper", action="store_true", help="also time the delta rule's kernel wrapper alone")
    parser.add_argument("--out", help="JSON results")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rows = []
    for model_type in args.models.split(","):
        pair = {row["arm"]: row for row in measure(model_type, args.steps, args.repeats)}
        rows.extend(pair.values())
        stock, replay = pair["stock"], pair["replay"]
        print(f"{model_type:14s} aten ops per step: stock {stock['aten_ops_per_step']:.1f}, ReplayCache "
              f"{replay['aten_ops_per_step']:.1f}; Python calls {stock['python_calls_per_step']:.0f} / "
              f"{replay['python_calls_per_step']:.0f}; us per step {stock['us_per_step']:.0f} / "
              f"{replay['us_per_step']:.0f} (kernels stubbed: {replay['stubbed_kernel_calls']})")
    if args.wrapper:
        cost = wrapper_cost()
        rows.append({"wrapper_us_per_call": cost})
        print(f"delta rule replay-step wrapper, launch stubbed: {cost:.1f} us per call")
    write_rows(args.out, rows)
    return rows


if __name__ == "__main__":
    main()
