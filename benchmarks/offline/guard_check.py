"""What Dynamo's guard check of a compiled decode step costs on the host: stock static cache against ReplayCache.

A compiled batch-1 decode step is host-bound (the H200 does 0.5-1.1 ms of GPU work in a 1.5-2.6 ms step), and the
guard check that runs before every CUDA-graph replay is where the two caches' host work differs (run 150: 256.5
against 174.4 us per step under the profiler, Nemotron-H-like). This script compiles ``generate``'s decode step
on a tiny model (Dynamo's ``eager`` backend: the guards are the same whatever the backend), takes the frame's
guard manager and times ``check`` on the locals of a real decode step, best of ``--blocks`` blocks (the two
arms' blocks alternate). It also counts
the guards by type, split into those on the cache's own objects and the rest. Runs on the CPU in about 20 s per
model:

    python benchmarks/offline/guard_check.py --models nemotron_h,qwen3_5_text --out guards.json

It reads Dynamo's private frame cache (``torch._dynamo.eval_frame._debug_get_cache_entry_list``) and exits with a
message where a torch version lacks it.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections import Counter

import torch
from transformers import PreTrainedModel
from transformers.generation import CompileConfig

from hf_replayssm import ReplayCache
from hf_replayssm.tiny import deeper, tiny_model

CACHE_SOURCES = ("kwargs['cache']", "kwargs['past_key_values']", "kwargs['cache_params']")


def _is_cache_guard(name: str) -> bool:
    return name.startswith(CACHE_SOURCES)


def decode_frame(model, args: tuple, kwargs: dict) -> tuple[list, dict, int | None]:
    """The compiled decode frame (the pass-through hook's ``PreTrainedModel.__call__``) as Dynamo holds it: its
    entries' guard managers in the frame's list order, a call's frame locals, and the index of the one entry whose
    guards pass on them (None where not exactly one passes). Check under ``torch.no_grad()``, generate's grad mode
    (a guard checks it)."""
    call = PreTrainedModel.__call__
    managers = [entry.guard_manager for entry in torch._dynamo.eval_frame._debug_get_cache_entry_list(call.__code__)]
    frame_locals = {"self": model, "args": args, "kwargs": kwargs}
    original = getattr(call, "_replayssm_original", None)
    if original is not None:  # the pass-through hook's closure variable is a frame local too
        frame_locals["original"] = original
    with torch.no_grad():
        passing = [index for index, manager in enumerate(managers) if manager.check(frame_locals)]
    return managers, frame_locals, passing[0] if len(passing) == 1 else None


def compile_decode_step(model_type: str, arm: str, config: CompileConfig, new_tokens: int = 6,
                        device: str = "cpu", layers: int | None = None) -> dict:
    """Run ``generate`` on a tiny model with ``config`` (compiled on any device) for one arm (``replay``: a static
    ReplayCache; ``stock``: transformers' static cache). Returns the compiled decode callable (``fn``), a decode step's
    arguments (``kwargs``), and its frame's passing guard manager (``guards``) and ``locals``. ``layers``: the tiny
    model's layer pattern repeated to that depth (default: the tiny model's own 4 layers)."""
    overrides = deeper(model_type, layers) if layers else {}
    model = tiny_model(model_type, seed=0, initializer_range=0.2, **overrides).to(device)
    prompt = torch.randint(3, model.config.vocab_size, (1, 11), generator=torch.Generator().manual_seed(1)).to(device)
    config._compile_all_devices = True  # transformers compiles the decode step on CUDA only otherwise
    seen = {}
    compiled_call = model.get_compiled_call

    def recording_compiled_call(compile_config):
        fn = compiled_call(compile_config)

        def call(*args, **kwargs):
            seen["fn"], seen["kwargs"] = fn, kwargs
            return fn(*args, **kwargs)

        return call

    model.get_compiled_call = recording_compiled_call
    kwargs = dict(do_sample=False, max_new_tokens=new_tokens, min_new_tokens=new_tokens, compile_config=config)
    if arm == "replay":
        model.generate(prompt, past_key_values=ReplayCache(4, max_cache_len=12 + new_tokens), **kwargs)
    else:
        model.generate(prompt, cache_implementation="static", **kwargs)
    managers, frame_locals, passing = decode_frame(model, (), seen["kwargs"])
    if passing is None:
        raise RuntimeError(f"expected one compiled decode frame whose guards pass on a decode step's locals, among "
                           f"{len(managers)}")
    return {"fn": seen["fn"], "kwargs": seen["kwargs"], "guards": managers[passing], "locals": frame_locals}


def compiled_frame(model_type: str, arm: str, new_tokens: int = 6, device: str = "cpu",
                   layers: int | None = None) -> dict:
    """Compile one arm's decode step on a tiny model (eager backend); its frame's guard manager, a decode step's
    locals, the guard counts by type (on the cache's objects and elsewhere) and every guard as ``(type, source)``
    (the CUDA path of a step can read other objects than the CPU path, so its guards are counted on its device)."""
    counts: dict[str, Counter] = {}
    listed: list[tuple[str, str]] = []

    def record_guards(entries):
        counts["cache"] = Counter(e.guard_type for e in entries if _is_cache_guard(e.name))
        counts["other"] = Counter(e.guard_type for e in entries if not _is_cache_guard(e.name))
        listed.extend((e.guard_type, e.name) for e in entries)
        return [True] * len(entries)  # keeps every guard: only counts them

    config = CompileConfig(fullgraph=True, backend="eager", mode=None, options={"guard_filter_fn": record_guards})
    return dict(compile_decode_step(model_type, arm, config, new_tokens, device, layers), counts=counts,
                listed=listed)


def measure(model_type: str, blocks: int = 30, per_block: int = 300, device: str = "cpu",
            dump: str | None = None, layers: int | None = None) -> list[dict]:
    """Both arms' guard check time (us, best block; the arms' blocks alternate, so a drift of the host's speed
    reaches both) and guard counts; ``dump``: a folder for each arm's guard list (``<model>_<arm>_guards.txt``)."""
    torch._dynamo.reset()
    # two entries of one frame; ReplayCache first: binding it wraps module functions of the model's file (the conv
    # interceptors, pass-through outside a replay step), which a frame compiled before guards against
    frames = {arm: compiled_frame(model_type, arm, device=device, layers=layers) for arm in ("replay", "stock")}
    if dump:
        os.makedirs(dump, exist_ok=True)
        for arm, frame in frames.items():
            with open(os.path.join(dump, f"{model_type}_{arm}_guards.txt"), "w") as f:
                f.writelines(f"{kind}\t{source}\n" for kind, source in sorted(frame["listed"]))
    times = {arm: [] for arm in frames}
    with torch.no_grad():
        for arm, frame in frames.items():
            if not frame["guards"].check(frame["locals"]):
                raise RuntimeError(f"{arm}: its guards no longer pass once the other arm compiled: "
                                   f"{frame['guards'].check_verbose(frame['locals']).verbose_code_parts[:2]}")
        for _ in range(blocks):
            for arm, frame in frames.items():
                check, frame_locals = frame["guards"].check, frame["locals"]
                start = time.perf_counter()
                for _ in range(per_block):
                    check(frame_locals)
                times[arm].append((time.perf_counter() - start) / per_block * 1e6)
    return [{"model": model_type, "arm": arm, "device": device, "layers": layers, "guard_check_us": min(times[arm]),
             "cache_guards": sum(frame["counts"]["cache"].values()),
             "other_guards": sum(frame["counts"]["other"].values()),
             "cache_guard_types": dict(frame["counts"]["cache"].most_common())} for arm, frame in frames.items()]


def frame_tool_args(doc: str, argv: list[str] | None, blocks: int, add_options=None) -> argparse.Namespace:
    """The command line of the frame-reading tools here (``--models``, ``--blocks``, ``--out``, and a tool's own
    options: ``add_options(parser)``); exits where this torch cannot show Dynamo's frame cache."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--models", default="nemotron_h,qwen3_5_text,kimi_linear")
    parser.add_argument("--blocks", type=int, default=blocks, help="timed blocks per arm (the best counts)")
    parser.add_argument("--out", help="JSON results")
    parser.add_argument("--layers", type=int, help="the tiny models' layer pattern repeated to this depth (default: "
                        "their own 4 layers): how the host work grows with the SSM layers")
    if add_options is not None:
        add_options(parser)
    args = parser.parse_args(argv)
    if not hasattr(torch._dynamo.eval_frame, "_debug_get_cache_entry_list"):
        raise SystemExit("this torch has no torch._dynamo.eval_frame._debug_get_cache_entry_list to read guards from")
    return args


def write_rows(path: str | None, rows: list[dict]) -> None:
    if path:
        with open(path, "w") as f:
            json.dump({"torch": torch.__version__, "results": rows}, f, indent=1)


def compare_arms(args: argparse.Namespace, measure, report, **options) -> list[dict]:
    """The frame tools' run: ``measure(model_type, blocks=..., **options)`` (rows of both arms) for each model of
    ``--models``, ``report(model_type, stock_row, replay_row)`` prints the pair; the rows go to ``--out``."""
    rows = []
    for model_type in args.models.split(","):
        pair = {row["arm"]: row for row in measure(model_type, blocks=args.blocks, layers=args.layers, **options)}
        rows.extend(pair.values())
        report(model_type, pair["stock"], pair["replay"])
    write_rows(args.out, rows)
    return rows


def _report(model_type: str, stock: dict, replay: dict) -> None:
    print(f"{model_type:14s} guard check: stock {stock['guard_check_us']:7.1f} us, ReplayCache "
          f"{replay['guard_check_us']:7.1f} us ({replay['guard_check_us'] - stock['guard_check_us']:+.1f}); "
          f"guards on the cache {stock['cache_guards']} / {replay['cache_guards']}, others "
          f"{stock['other_guards']} / {replay['other_guards']}")
    print(f"{'':14s} ReplayCache's cache guards by type: {replay['cache_guard_types']}")


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default="cpu", help="where the tiny model runs (cuda: its GPU path's guards)")
    parser.add_argument("--dump", help="a folder for each arm's guard list, one `type<TAB>source` a line")


def main(argv: list[str] | None = None) -> list[dict]:
    args = frame_tool_args(__doc__, argv, blocks=30, add_options=_options)
    return compare_arms(args, measure, _report, device=args.device, dump=args.dump)


if __name__ == "__main__":
    main()
