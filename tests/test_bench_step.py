"""The model-level decode-step benchmark (``hf-replayssm bench step``) on a tiny model on CPU: every arm decodes the
same tokens, reports a time per step and its resolved backend, and the speedups are relative to the stock arm."""

from conftest import get_model

from hf_replayssm.bench.step import measure_steps, table


def test_measure_steps_on_a_tiny_model():
    model = get_model("nemotron_h")
    result = measure_steps(model, batch=2, prompt=9, steps=5, piece=4, arms=("stock", "replay-torch"),
                           buffer_len=4, repeats=1)
    arms = result["arms"]
    assert set(arms) == {"stock", "replay-torch"}
    assert arms["replay-torch"]["backend"] == "torch" and arms["stock"]["backend"] is None
    for entry in arms.values():
        assert entry["ms_per_step"] > 0 and len(entry["repeats_ms"]) == 1
    assert arms["stock"]["speedup_vs_stock"] == 1.0
    assert abs(arms["replay-torch"]["speedup_vs_stock"]
               - arms["stock"]["ms_per_step"] / arms["replay-torch"]["ms_per_step"]) < 1e-12
    assert "replay-torch" in table([result])


def test_profile_arm_writes_an_operator_table(tmp_path):
    import torch

    from hf_replayssm.bench.step import profile_arm

    model = get_model("qwen3_5_text")
    ids = torch.randint(3, 120, (1, 14))
    table = profile_arm(model, ids, "replay-torch", prompt=10, steps=4, piece=5, buffer_len=4,
                        out_path=tmp_path / "prof.txt")
    assert "Self CPU" in table and (tmp_path / "prof.txt").read_text() == table
