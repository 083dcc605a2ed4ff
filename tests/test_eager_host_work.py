"""``benchmarks/offline/eager_host_work.py`` (the host work of an eager decode step besides the kernels, stock
against ReplayCache) counts real operators on the CPU, with ReplayCache on its Triton path and the kernels stubbed."""

from __future__ import annotations

import json
import os

import pytest
from conftest import load_offline_tool

pytest.importorskip("triton")


def test_eager_host_work_counts_both_arms(tmp_path):
    tool = load_offline_tool("eager_host_work")
    before = os.environ.get("TRITON_INTERPRET")
    out = tmp_path / "host.json"
    rows = tool.main(["--models", "qwen3_5_text", "--steps", "4", "--repeats", "1", "--out", str(out)])
    by_arm = {row["arm"]: row for row in rows}
    assert sorted(by_arm) == ["replay", "stock"]
    # the tiny model's three GDN layers took the stubbed kernel step, once a layer a decode step (4 measured steps,
    # 3 warm-up steps and the timed block's 4)
    assert by_arm["replay"]["stubbed_kernel_calls"] == {"delta_replay_step": 3 * (3 + 4 + 4)}
    for row in rows:
        assert row["aten_ops_per_step"] > 50 and row["python_calls_per_step"] > 500 and row["us_per_step"] > 0, row
    # without the kernels, ReplayCache's step dispatches fewer operators than stock's torch decode path
    assert by_arm["replay"]["aten_ops_per_step"] < by_arm["stock"]["aten_ops_per_step"]
    assert json.loads(out.read_text())["results"] == rows
    # the stubs and the interpreter flag are undone
    from hf_replayssm.kernels import delta_rule

    assert delta_rule.delta_replay_step.__name__ == "delta_replay_step"
    assert os.environ.get("TRITON_INTERPRET") == before
