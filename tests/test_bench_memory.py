"""The memory benchmark on a tiny model (CPU): its ReplayCache figures are memory()'s, its stock figure counts every
tensor of the stock cache, and the table prints."""

import pytest
from conftest import get_model

from hf_replayssm.bench.memory import measure_memory, table
from hf_replayssm.bench.shapes import PREFILL_PIECE, SHAPES, shaped_config

pytestmark = pytest.mark.equivalence


def test_measure_memory_on_a_tiny_model():
    model = get_model("qwen3_5_text")
    result = measure_memory(model, batch=2, prompt=12, new_tokens=5, piece=4, policies=("fp32", "separated-fp8"),
                            buffer_len=4)
    arms = result["arms"]
    assert set(arms) == {"stock", "fp32", "separated-fp8"}
    assert arms["fp32"]["cache_bytes"] == arms["fp32"]["components"]["total"]
    # the stock figure the benchmark counts equals what memory() predicts for a stock cache
    assert arms["stock"]["cache_bytes"] == arms["fp32"]["stock_total"]
    assert arms["separated-fp8"]["cache_vs_stock"] > arms["fp32"]["cache_vs_stock"] > 1.0
    assert "separated-fp8" in table(result, "tiny")


def test_shaped_configs_build():
    for name in SHAPES:
        config = shaped_config(name)
        assert config.get_text_config(decoder=True).hidden_size > 1000
        assert name in PREFILL_PIECE
