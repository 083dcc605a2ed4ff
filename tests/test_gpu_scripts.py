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


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
def test_read_copy_defaults_smoke(tmp_path):
    """The read-copy defaults script times every arm (GDN fp8 on the smoke's shape, streaming lowered to its batch),
    the streamed launches on a tile asked for (``--stream-tiles --tiles``, with ``--stream-late`` also with the
    records' values loaded after the stream), the solved exact fold with and without its pre-launch (``--solve``,
    the pre-launch on one, two and four warps), the flush launches taking the records' weights from the weights
    pre-launch (``--flush-weights``), and reports the streamed launches it timed."""
    _interpreter_usable()
    result = tmp_path / "defaults.json"
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu" / "read_copy_defaults.py"), "--smoke",
                          "--batches", "2", "--specs", "gdn:fp8", "--stream-tiles", "--tiles", "16x1x16,256x1x16",
                          "--stream-late", "--solve", "--flush-weights",
                          "--out", str(result)], cwd=ROOT, env=subprocess_env(), capture_output=True, text=True,
                         timeout=900)
    assert out.returncode == 0, f"exit {out.returncode}\n{out.stdout[-4000:]}\n{out.stderr[-4000:]}"
    (row,) = json.loads(result.read_text())
    # a whole head of the smoke's V = 16 (read_copy_stream_config)
    assert row["stream_config"] == [16, 1, 16] and row["device_stream_config"] == [16, 1, 16], row
    timed = {key: value for key, value in row.items() if key.endswith("_us")}
    assert sorted(timed) == sorted([
        "host_default_us", "host_default_reencode_us", "host_flush_reads_copy_only_us",
        "host_flush_scale_per_element_us", "host_default_external_reencode_us", "host_default_per_tile_reencode_us",
        "host_whole_tile_us", "device_mixed_default_us", "device_mixed_fused_us",
        "device_mixed_flush_scale_per_element_us", "device_in_phase_default_us", "device_in_phase_fused_us",
        "device_in_phase_flush_scale_per_element_us", "host_tile_16x1_c16_us", "device_in_phase_tile_16x1_c16_us",
        "host_tile_16x1_c16_late_us", "device_in_phase_tile_16x1_c16_late_us",
        "host_flush_codes16_us", "device_mixed_split_flush_codes16_us",
        "device_in_phase_split_flush_codes16_us", "host_replay_code_vector_us", "device_mixed_replay_code_vector_us",
        "device_in_phase_replay_code_vector_us", "host_token_held_us", "host_token_reloaded_us",
        "device_mixed_token_held_us", "device_in_phase_token_held_us", "standard_us",
        # --solve: the flush-only launch stepped / solved / with the pre-launch on each tile (the smoke's V = 16
        # narrows them to the whole head), the host cycle and the split step with the solved fold
        "flush_stepped_us", "flush_solved_us", "flush_solve_given_16x4_us", "flush_solve_given_16x2_us",
        "flush_solve_given_16x8_us", "flush_solve_given_pre1_us", "flush_solve_given_pre2_us",
        "flush_solve_given_pre4_us", "host_solved_us", "host_solve_given_us", "device_in_phase_solved_us",
        "device_in_phase_solve_given_us",
        # --flush-weights: the flush launch alone with and without, the cycle, the device steps, the solved fold
        "flush_weights_us", "flush_default_reencode_us", "host_default_reencode_flush_weights_us",
        "device_mixed_flush_weights_us", "device_in_phase_flush_weights_us", "host_solve_given_flush_weights_us"]), \
        sorted(timed)
    assert tuple(row["solve_best_tile"]) in {(16, 4), (16, 2), (16, 8)}, row["solve_best_tile"]
    # (the 256-wide tile: wider than the head, skipped)
    assert all(value > 0 for value in timed.values()), timed
    assert "gdn fp8 batch 2 (stream (16, 1, 16)" in out.stdout


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
def test_read_copy_defaults_kda_smoke(tmp_path):
    """KDA's arms of the read-copy defaults script (nvfp4 on the smoke's shape): the solved exact fold with its
    per-head pre-launch (``--solve``, per-key gates) and the weights pre-launch reading the records newest first
    (``--newest-first``: the fp32 host cycle and the cycle as the cache runs it with and without it, the device
    step in both phases) and the flush launches taking the records' weights from that pre-launch
    (``--flush-weights``, alone, with the pre-launch newest first, with the solved fold), each timed."""
    _interpreter_usable()
    result = tmp_path / "defaults.json"
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu" / "read_copy_defaults.py"), "--smoke",
                          "--batches", "2", "--specs", "kda:nvfp4", "--solve", "--newest-first", "--flush-weights",
                          "--out", str(result)], cwd=ROOT, env=subprocess_env(), capture_output=True, text=True,
                         timeout=900)
    assert out.returncode == 0, f"exit {out.returncode}\n{out.stdout[-4000:]}\n{out.stderr[-4000:]}"
    (row,) = json.loads(result.read_text())
    asked = ["host_fp32_us", "host_fp32_newest_first_us", "host_default_reencode_newest_first_us",
             "device_mixed_newest_first_us", "device_in_phase_newest_first_us", "flush_stepped_us", "flush_solved_us",
             "flush_solve_given_pre1_us", "flush_solve_given_pre4_us", "host_solve_given_us",
             "device_in_phase_solve_given_us", "flush_weights_us", "flush_default_reencode_us",
             "host_default_reencode_flush_weights_us", "host_default_reencode_flush_weights_newest_first_us",
             "device_mixed_flush_weights_us", "device_in_phase_flush_weights_newest_first_us",
             "host_solve_given_flush_weights_us"]
    assert all(row.get(key, 0) > 0 for key in asked), {key: row.get(key) for key in asked}
    assert tuple(row["solve_best_tile"]) in {(16, 4), (16, 2), (16, 8)}, row["solve_best_tile"]


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
def test_copy_replay_probe_smoke(tmp_path):
    """The Mamba-2 copy-launch probe times every arm (a launch at a record count, the host cycle, the split step in
    phase and mixed, each with and without the coefficients pre-launch) for fp32, fp8 and nvfp4 on a tiny shape."""
    _interpreter_usable()
    result = tmp_path / "probe.json"
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu" / "copy_replay_probe.py"), "--smoke",
                          "--device-steps", "--out", str(result)], cwd=ROOT, env=subprocess_env(),
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, f"exit {out.returncode}\n{out.stdout[-4000:]}\n{out.stderr[-4000:]}"
    results = json.loads(result.read_text())["results"]
    assert results["standard_us"] > 0
    arms = ["count1", "device_in_phase", "device_mixed"]
    for fmt in ("fp32", "fp8", "nvfp4"):
        cells = results[f"{fmt} p16w1u4"]
        want = [*arms, "cycle" if fmt == "fp32" else "cycle_as_cache"]
        want += [f"{arm}_weights" for arm in want]
        timed = {key: value for key, value in cells.items() if key != "n_regs_phase1"}
        assert sorted(timed) == sorted(want), (fmt, sorted(timed))
        assert all(isinstance(value, float) and value > 0 for value in timed.values()), (fmt, timed)


def test_prune_triton_cache(tmp_path):
    """The cache pruner drops the named kernels' entry folders (found by their metadata file, not the group lists)
    and keeps every byte of the others."""
    import io
    import tarfile

    sys.path.insert(0, str(ROOT / "benchmarks" / "gpu"))
    try:
        import prune_triton_cache as prune
    finally:
        sys.path.pop(0)
    files = {"./AAA/_keep_kernel.json": b"{}", "./AAA/_keep_kernel.cubin": b"\x00keep" * 100,
             "./AAA/__grp___keep_kernel.json": b"{}", "./BBB/_drop_kernel.json": b"{}",
             "./BBB/_drop_kernel.cubin": b"\x01drop" * 100, "./CCC/_other_kernel.json": b"{}"}
    cache = tmp_path / "cache.tgz"
    with tarfile.open(cache, "w:gz") as tar:
        top = tarfile.TarInfo(".")
        top.type = tarfile.DIRTYPE
        tar.addfile(top)
        for folder in ("./AAA", "./BBB", "./CCC"):  # entry folders as members of their own, as tar writes them
            info = tarfile.TarInfo(folder)
            info.type = tarfile.DIRTYPE
            tar.addfile(info)
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    listed = prune.listing(cache)
    assert set(listed) == {"_keep_kernel", "_drop_kernel", "_other_kernel"} and listed["_drop_kernel"][0] == 1
    out = tmp_path / "pruned.tgz"
    result = prune.prune(cache, out, {"_drop_kernel"})
    assert (result["kept"], result["dropped"]) == (2, 1)
    with tarfile.open(out, "r:gz") as tar:
        got = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}
        folders = {m.name for m in tar.getmembers() if m.isdir()}
    assert got == {name: data for name, data in files.items() if "/BBB/" not in name}
    assert folders == {".", "./AAA", "./CCC"}, folders  # the dropped entry's folder goes too
    prune.main(["--cache", str(cache), "--drop", "_other_kernel"])  # in place
    with tarfile.open(cache, "r:gz") as tar:
        assert not any("CCC" in m.name for m in tar.getmembers())
    with pytest.raises(SystemExit):
        prune.main(["--cache", str(cache)])  # nothing named: a usage error


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
def test_separated_rows_probe_smoke(tmp_path):
    """The per-row probe of two separated-precision decodings (Triton backend against torch, static against dynamic
    cache, the fp32 policy and the format's own error as scales) runs a tiny Nemotron-H on the CPU and reports every
    comparison and each layer's copy codes."""
    _interpreter_usable()
    result = tmp_path / "rows.json"
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu" / "separated_rows_probe.py"), "--device",
                          "cpu", "--rows", "2", "--models", "nemotron_h", "--policies", "separated-fp8", "--out",
                          str(result)], cwd=ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, f"exit {out.returncode}\n{out.stdout[-4000:]}\n{out.stderr[-4000:]}"
    (row,) = json.loads(result.read_text())
    assert (row["model"], row["policy"], row["rows"], row["same_tokens"]) == ("nemotron_h", "separated-fp8", 2, True)
    for key in ("fp32_triton_vs_torch", "triton_vs_torch", "static_vs_dynamic"):  # summation order only
        assert row[key]["max"] < 1e-4 and row[key]["rows_over_1e4"] == 0, (key, row[key])
    assert row["format_vs_fp32"]["p50"] > 1e-3  # the copy's own rounding shows
    assert row["copies"] and all(layer["codes_codes"] > 0 and layer["ckpt_rel"] < 1e-4 for layer in row["copies"])
