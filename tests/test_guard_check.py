"""``benchmarks/offline/guard_check.py`` (the host cost of Dynamo's guard check on a compiled decode step, stock
against ReplayCache) runs on the CPU and reads real guards."""

from __future__ import annotations

import pytest
from conftest import load_offline_tool

# also in the compat run (torch 2.11 + transformers 5.17): the tool reads Dynamo's private frame cache
pytestmark = pytest.mark.equivalence


def _load():
    return load_offline_tool("guard_check")


def test_guard_check_reads_both_caches(tmp_path):
    import json

    tool = _load()
    out = tmp_path / "guards.json"
    rows = tool.main(["--models", "nemotron_h", "--blocks", "2", "--out", str(out), "--dump", str(tmp_path / "g")])
    by_arm = {row["arm"]: row for row in rows}
    assert sorted(by_arm) == ["replay", "stock"]
    for row in rows:
        assert 0 < row["guard_check_us"] < 1e5, row
        assert row["other_guards"] > 100, row  # the model's own guards (modules, parameters, globals)
    # the guards reached the ReplayCache's own tensors: the decode pack's checkpoint, three record rings, conv window
    # and positions (once for the tiny model's two Mamba-2 layers) and the attention layer's keys, values and length;
    # stock's two (or more, by transformers version) per Mamba-2 layer and the same three
    replay_tensors = by_arm["replay"]["cache_guard_types"].get("TENSOR_MATCH", 0)
    assert replay_tensors == 6 + 3, by_arm["replay"]
    assert by_arm["stock"]["cache_guard_types"].get("TENSOR_MATCH", 0) >= 2 * 2 + 3, by_arm["stock"]
    assert json.loads(out.read_text())["results"] == rows
    # the dumped lists hold every guard, one `type<TAB>source` a line: the counts above, and the cache's tensors
    for arm, row in by_arm.items():
        lines = (tmp_path / "g" / f"nemotron_h_{arm}_guards.txt").read_text().splitlines()
        assert len(lines) == row["cache_guards"] + row["other_guards"], arm
        assert all(len(line.split("\t")) == 2 for line in lines), arm
    replay_lines = (tmp_path / "g" / "nemotron_h_replay_guards.txt").read_text().splitlines()
    cache_tensor_lines = [line for line in replay_lines if line.startswith("TENSOR_MATCH\t")
                          and line.split("\t")[1].startswith(tool.CACHE_SOURCES)]  # the cache's keyword varies
    assert len(cache_tensor_lines) == replay_tensors


def test_no_cache_object_is_reached_two_ways(tmp_path):
    """An object the compiled step reaches from the cache by two paths is an aliasing guard per SSM layer, which
    torch 2.11 checks in Python before every CUDA-graph replay: transformers 5.17's mixers read the stock views, whose
    value comes from the positions the replay call reaches (through ``call.layer``), not the view's own schedule."""
    tool = _load()
    tool.main(["--models", "nemotron_h", "--blocks", "1", "--dump", str(tmp_path)])
    lines = (tmp_path / "nemotron_h_replay_guards.txt").read_text().splitlines()
    aliasing = [line for line in lines if line.startswith("DUPLICATE_INPUT\t")
                and line.split("\t")[1].startswith(tool.CACHE_SOURCES)]
    assert aliasing == []


def test_stock_views_add_no_dict_guards(tmp_path):
    """transformers 5.17's mixers read ``layers[i].conv_states[0]`` / ``recurrent_states[0]`` in every decode step;
    inside a compiled plain step the layer's properties hand them a dict made in the trace, so no view is guarded by
    type, length or key (three guards a view a layer before)."""
    tool = _load()
    tool.main(["--models", "nemotron_h", "--blocks", "1", "--dump", str(tmp_path)])
    lines = (tmp_path / "nemotron_h_replay_guards.txt").read_text().splitlines()
    view_guards = [line for line in lines if ("conv_states" in line or "recurrent_states" in line)
                   and not line.split("\t")[1].endswith(".fget")]  # the properties' own closure checks
    assert not [line for line in view_guards if line.startswith(("SEQUENCE_LENGTH", "DICT_KEYS_MATCH", "TYPE_MATCH"))
                or "dict.keys" in line], view_guards


def test_cache_guards_grow_slower_than_stock_with_depth():
    """Deeper tiny models (``--layers``: the layer pattern repeated): ReplayCache's guards on the cache grow by at
    most one more per Mamba-2 layer than stock's (the layer's slot in the decode pack, a constant), and by far fewer
    under transformers 5.25 (4 -> 8 layers: 30 against 54; 5.17: 32 against 30); its tensor guards do not grow."""
    tool = _load()
    counts = {}
    for layers in (4, 8):
        rows = tool.main(["--models", "nemotron_h", "--blocks", "1", "--layers", str(layers)])
        counts[layers] = {row["arm"]: row for row in rows}
    assert all(row["layers"] == 8 for row in counts[8].values())
    growth = {arm: counts[8][arm]["cache_guards"] - counts[4][arm]["cache_guards"] for arm in ("stock", "replay")}
    assert 0 < growth["replay"] <= growth["stock"] + 2, growth  # 4 more layers: 2 Mamba-2, 1 attention, 1 MLP
    tensors = {layers: pair["replay"]["cache_guard_types"].get("TENSOR_MATCH", 0) for layers, pair in counts.items()}
    assert tensors[8] == tensors[4] + 3, tensors  # only the new attention layer's keys, values and length
