"""``benchmarks/offline/cache_questions.py`` (what generate's per-step cache questions cost, stock against
ReplayCache) times both caches after a real generate."""

from __future__ import annotations

import json

from conftest import load_offline_tool


def test_cache_questions_times_both_caches(tmp_path):
    tool = load_offline_tool("cache_questions")
    out = tmp_path / "questions.json"
    (row,) = tool.main(["--models", "nemotron_h", "--repeats", "1", "--out", str(out)])
    for name in tool.QUESTIONS:
        for arm in ("stock", "replay"):
            assert 0 < row[f"{name}_{arm}_us"] < 1e4, row
    assert json.loads(out.read_text())["results"] == [row]
