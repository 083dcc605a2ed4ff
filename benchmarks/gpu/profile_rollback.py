"""Where the host time of a per-row rollback goes: ``hf-replayssm bench speculative`` in this process with every
``ReplayCache.drop_rows`` call under cProfile (calls that drop nothing and calls that drop are counted apart).
Run on the GPU machine after ``source benchmarks/gpu/install.sh``, with the bench's arguments:

    python3 $R/benchmarks/gpu/profile_rollback.py speculative --models qwen3_5 --batches 64 --prompt 512 --new 32
"""

from __future__ import annotations

import contextlib
import cProfile
import pstats
import sys
import time

from hf_replayssm.cache import ReplayCache
from hf_replayssm.cli import main

original = ReplayCache.drop_rows
profiler = cProfile.Profile()
calls = {"dropping": [0, 0.0], "nothing": [0, 0.0]}


def profiled(self, dropped):
    kind = "dropping" if max(dropped, default=0) else "nothing"
    start = time.perf_counter()
    profiler.enable()
    try:
        return original(self, dropped)
    finally:
        profiler.disable()
        calls[kind][0] += 1
        calls[kind][1] += time.perf_counter() - start


ReplayCache.drop_rows = profiled
sys.argv = ["hf-replayssm", "bench", *sys.argv[1:]]
with contextlib.suppress(SystemExit):
    main()
for kind, (count, seconds) in calls.items():
    print(f"drop_rows calls {kind}: {count}, {seconds * 1e3 / max(count, 1):.3f} ms each (under cProfile)")
stats = pstats.Stats(profiler)
stats.sort_stats("tottime").print_stats(30)
stats.sort_stats("cumulative").print_stats(30)
