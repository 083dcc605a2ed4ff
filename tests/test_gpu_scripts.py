"""The GPU machine's measurement scripts (``benchmarks/gpu/``) run end to end on tiny shapes on the CPU (Triton's
interpreter), so that a session's planned GPU calls do not fail on a renamed argument."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from kernel_harness import HAS_TRITON, ROOT, _interpreter_usable, subprocess_env


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
def test_host_flush_sweep_smoke(tmp_path):
    _interpreter_usable()
    result = tmp_path / "sweep.json"
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu" / "host_flush_sweep.py"), "--smoke",
                          "--batches", "2", "--out", str(result)], cwd=ROOT, env=subprocess_env(),
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, f"exit {out.returncode}\n{out.stdout[-4000:]}\n{out.stderr[-4000:]}"
    rows = {row["family"]: row for row in json.loads(result.read_text())}
    assert sorted(rows) == ["gdn", "kda", "mamba2"]
    for family, row in rows.items():
        timed = {key: value for key, value in row.items() if key.endswith("_us")}
        assert "flush_default_us" in timed and "cycle_default_us" in timed, (family, row)
        assert len(timed) >= 3 and all(value > 0 for value in timed.values()), (family, timed)
    from hf_replayssm.kernels.delta_rule import host_flush_launch_config

    assert rows["kda"]["default_flush_config"] == [16, 1, False]  # the loop fold: [K, 16] for the smoke's V = 16
    assert rows["kda"]["default_flush_config"] == list(host_flush_launch_config(2, 2, 16, 16, True))
    assert rows["gdn"]["default_flush_config"][2] is True  # GDN keeps the product
    assert "kda batch 2: {'flush_default_us'" in out.stdout


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
def test_read_probe_smoke(tmp_path):
    """Every form of the read-bandwidth probe builds and computes S0^T q (checked inside against einsum)."""
    _interpreter_usable()
    result = tmp_path / "probe.json"
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu" / "read_probe.py"), "--smoke", "--out",
                          str(result)], cwd=ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, f"exit {out.returncode}\n{out.stdout[-4000:]}\n{out.stderr[-4000:]}"
    data = json.loads(result.read_text())
    assert "errors" not in data, data["errors"]
    forms = data["forms"]
    assert {name.split("_")[0] for name in forms} == {"grid", "persistent", "tma", "torch"}, sorted(forms)
    assert all(entry["us"] > 0 and entry["GBps"] > 0 for entry in forms.values()), forms
