"""``benchmarks/offline/frame_overhead.py`` (the host cost of the compiled decode step's frame outside the graph,
stock against ReplayCache) runs on the CPU, compiles both arms with its null backend and counts real graph inputs."""

from __future__ import annotations

import json

import pytest
from conftest import load_offline_tool

# also in the compat run (torch 2.11 + transformers 5.17, the GPU image's versions): the tool reads Dynamo's frame
pytestmark = pytest.mark.equivalence


@pytest.mark.parametrize("through", ["frame", "aot"])
def test_frame_overhead_times_both_arms(tmp_path, through):
    """Both arms timed through Dynamo's frame alone and behind AOTAutograd (``--through aot``: functionalized, input
    mutations kept in the graph, as Inductor compiles it)."""
    tool = load_offline_tool("frame_overhead")
    out = tmp_path / "frames.json"
    rows = tool.main(["--models", "nemotron_h", "--blocks", "2", "--through", through, "--out", str(out)])
    by_arm = {row["arm"]: row for row in rows}
    assert sorted(by_arm) == ["replay", "stock"]
    for row in rows:  # (no order between the two: each is the best of two noisy blocks)
        assert row["through"] == through, row
        assert 0 < row["guard_check_us"] < 1e5 and 0 < row["call_us"] < 1e5, row
    # the tiny model's two Mamba-2 layers hand the graph the decode pack's conv window, checkpoint, positions and three
    # record fields once (stock: conv and recurrent state per layer, 4), and the step writes all of them in place
    # through its layer slices; both write the attention layer's keys and values
    replay, stock = by_arm["replay"], by_arm["stock"]
    assert replay["tensor_inputs"] <= stock["tensor_inputs"] + 6 - 4 and replay["mutated_inputs"] >= 6, replay
    assert stock["mutated_inputs"] >= 2 * 2, stock
    assert json.loads(out.read_text())["results"] == rows
