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


def test_host_profile_arm_writes_a_python_profile(tmp_path):
    import torch

    from hf_replayssm.bench.step import host_profile_arm

    model = get_model("qwen3_5_text")
    ids = torch.randint(3, 120, (1, 14))
    table = host_profile_arm(model, ids, "replay-torch", prompt=10, steps=4, piece=5, buffer_len=4,
                             out_path=tmp_path / "host.txt")
    assert table.startswith("replay-torch: 4 decode steps, ") and "ms per step under cProfile" in table
    assert "by cumulative time:" in table and "by tottime time:" in table
    assert "adapters/base.py" in table  # the cache's own layer code shows up by name
    assert (tmp_path / "host.txt").read_text() == table


def test_bench_step_cli_writes_both_profiles(tmp_path, monkeypatch):
    from hf_replayssm.bench import shapes
    from hf_replayssm.bench.step import main

    # the tiny model in place of the real-shaped one (gigabytes on a CPU)
    monkeypatch.setattr(shapes, "shaped_model", lambda name, device, dtype: get_model("qwen3_5_text"))
    assert main(["--models", "qwen3_5", "--batches", "1", "--prompt", "6", "--steps", "3", "--arms",
                 "stock,replay-torch", "--repeats", "1", "--device", "cpu", "--dtype", "float32",
                 "--profile", str(tmp_path / "ops"), "--host-profile", str(tmp_path / "host")]) == 0
    for arm in ("stock", "replay-torch"):
        assert "Self CPU" in (tmp_path / "ops" / f"qwen3_5_b1_{arm}.txt").read_text()
        assert "cProfile" in (tmp_path / "host" / f"qwen3_5_b1_{arm}.txt").read_text()


def test_benches_run_on_the_cpu_by_default_without_a_gpu(monkeypatch, capsys):
    """Without a GPU the benches' --device defaults to the CPU (it was "cuda", an AssertionError from torch on a CPU
    machine): `bench step` and `bench memory` with no --device run the tiny model on the CPU."""
    import torch

    from hf_replayssm.bench import memory, shapes, step

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    placed = []

    def tiny(name, device, dtype=None):
        placed.append(device)
        return get_model("qwen3_5_text")

    monkeypatch.setattr(shapes, "shaped_model", tiny)
    assert step.main(["--models", "qwen3_5", "--batches", "1", "--prompt", "6", "--steps", "2", "--arms",
                      "stock,replay-torch", "--repeats", "1", "--dtype", "float32"]) == 0
    memory.main(["--models", "qwen3_5", "--batch", "1", "--prompt", "8", "--new-tokens", "2", "--piece", "4",
                 "--policies", "fp32"])
    assert placed == ["cpu", "cpu"]
    assert "fp32" in capsys.readouterr().out
