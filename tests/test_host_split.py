"""``benchmarks/offline/host_split.py`` (a compiled decode step's time split into the generate loop, the compiled
call's host part and its GPU part, stock against ReplayCache) times real compiled calls on the CPU."""

from __future__ import annotations

import json

from conftest import load_offline_tool


def _load():
    return load_offline_tool("host_split")


def test_host_split_times_every_compiled_step(tmp_path):
    tool = _load()
    out = tmp_path / "split.json"
    new = 8
    (result,) = tool.main(["--tiny", "--device", "cpu", "--models", "nemotron_h", "--repeats", "2", "--new", str(new),
                           "--prompt", "6", "--out", str(out), "--profile-dir", str(tmp_path / "calls")])
    assert sorted(result["arms"]) == sorted(tool.ARMS)
    for arm, runs in result["repeats"].items():
        assert len(runs) == 2, arm
        for parts in runs:
            # a CPU step has no device part; the step is the loop plus the call (medians of each, so about)
            assert parts["call_gpu"] == 0.0 and parts["outside"] > 0 and parts["call_host"] > 0, parts
            assert 0.5 < (parts["outside"] + parts["call_host"]) / parts["step"] < 2, parts
    assert json.loads(out.read_text())["results"][0]["paired_excess_us"] == result["paired_excess_us"]
    inside = result["inside_call"]
    # the guard check ran on each arm's own compiled frame (one entry passes per arm), and the profiles saw calls
    for guards in inside["guard_check_us"].values():
        assert 0 < guards["own"] <= guards["list_walk"] * 1.5 < 1e5 and guards["entries"] >= 2, inside
    assert all(us > 0 for us in inside["own_us_per_call"].values()), inside
    assert len(inside["largest_own_time_differences_us"]) == 25
    assert {p.name for p in (tmp_path / "calls").iterdir()} == {f"nemotron_h_{arm}_calls.txt" for arm in tool.ARMS}


def test_step_clock_counts_one_call_per_decode_step():
    import torch

    from hf_replayssm.bench.generate import Settings, arm_kwargs, build_model, timed_generate

    tool = _load()
    model = build_model("qwen3_5", torch.device("cpu"), torch.float32, tiny=True)
    ids = torch.randint(3, 50, (1, 5), generator=torch.Generator().manual_seed(0))
    clock = tool.StepClock(model, cuda=False)
    settings = Settings(compile_backend="eager", compile_mode=None)
    for arm in tool.ARMS:
        clock.install()
        timed_generate(model, ids, 6, arm_kwargs(arm, model, settings, 11))
        assert len(clock.calls) == 5, arm  # the prefill runs eagerly; five decode steps run the compiled call
        assert all(start < end for start, end, *_ in clock.calls), arm


def test_inner_clock_times_only_inside_a_timed_call():
    """The CUDA-graph tree's ``run`` and ``CUDAGraph.replay`` are timed through the same wrapper: it adds the time of
    calls made while a compiled call is timed, passes every other call through untimed, and keeps the result."""
    import time

    tool = _load()

    class Slow:
        def work(self, value):
            time.sleep(0.002)
            return value + 1

    clock = tool.InnerClock.__new__(tool.InnerClock)  # no torch classes patched: only the wrapper under test
    clock.totals, clock.active = {"tree_host": 0.0, "replay_host": 0.0}, False
    clock._wrap(Slow, "work", "tree_host")
    assert Slow().work(1) == 2 and clock.totals["tree_host"] == 0.0  # untimed outside a call
    clock.start()
    assert Slow().work(2) == 3 and Slow().work(3) == 4
    parts = clock.stop()
    assert 4000 <= parts["tree_host"] < 1e6 and parts["replay_host"] == 0.0, parts
    assert Slow().work(4) == 5 and clock.totals["tree_host"] == parts["tree_host"]
    clock.start()  # a new call starts from zero
    assert clock.stop() == {"tree_host": 0.0, "replay_host": 0.0}


def test_inner_clock_is_shared(monkeypatch):
    """Every step clock on CUDA gets the same inner clock, so the two methods are wrapped once per process however
    many models a run times (``__init__`` replaced here: it would patch torch's classes in this test process)."""
    tool = _load()
    made = []
    monkeypatch.setattr(tool.InnerClock, "__init__", lambda self: made.append(self))
    monkeypatch.setattr(tool.InnerClock, "_shared", None)
    first = tool.InnerClock.shared()
    assert tool.InnerClock.shared() is first and made == [first]
