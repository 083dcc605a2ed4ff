"""benchmarks/offline/lookup_search.py: both prompt-lookup searches over a real generate() call's rounds."""

import json

import pytest
from conftest import load_offline_tool

from hf_replayssm import host_lookup


def test_lookup_search_times_both_searches(tmp_path, capsys):
    tool = load_offline_tool("lookup_search")
    out = tmp_path / "search.json"
    assert tool.main(["--device", "cpu", "--prompt", "96", "--new", "24", "--passes", "1", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["rounds"] > 0 and result["rounds_with_drafts"] > 0 and result["drafted"] > 0
    assert set(result["us_per_round"]) == {"transformers", "host"}
    assert all(us > 0 for us in result["us_per_round"].values())
    assert "search per round" in capsys.readouterr().out


def test_lookup_search_refuses_searches_that_differ(monkeypatch):
    """The timing is only reported for searches that drafted the same tokens every round."""
    tool = load_offline_tool("lookup_search")
    model, tokenizer = tool.load_model("tiny-gdn-copy", device="cpu")
    ids = tool.speculative_prompt("passage", model.config.vocab_size, 96, 0, tokenizer)
    rounds, settings = tool.recorded_rounds(model, ids, 16, 4)
    monkeypatch.setattr(host_lookup, "earliest_lookup", lambda tokens, *args, **kwargs: (0, 1))
    with pytest.raises(AssertionError, match="drafted differently"):
        tool.measure(model, rounds, settings, passes=1)
