"""``hf_replayssm.kernels.registers``: the decode-step kernels compiled for a Hopper GPU (sm_90) on a machine without
one, with their register and spill counts from the ptxas Triton bundles.

Runs in a subprocess without ``TRITON_INTERPRET`` (under the interpreter ``triton.jit`` gives functions that do not
compile). Skipped without triton or without a bundled ptxas."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

triton = pytest.importorskip("triton")

WORKER = r"""
import json, sys
import torch
from hf_replayssm.kernels import mamba2, registers

calls = {}
for name, device_phase in (("host", False), ("device", True)):
    module, kernels, call = registers._mamba2_call("fp8", device_phase, 8, 2)
    calls[name] = registers.compile_launches(module, kernels, call, arch=90, skip=("advance_counts",))
restored = type(mamba2._mamba2_replay_step_kernel).__name__
import os, triton
has_cuobjdump = os.path.exists(os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump"))
print(json.dumps(dict(calls=calls, restored=restored, has_cuobjdump=has_cuobjdump)))
"""


def _ptxas_available() -> bool:
    bin_dir = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    return any((bin_dir / name).exists() for name in ("ptxas", "ptxas-blackwell"))


def _run_worker(source: str, timeout: int = 600) -> dict:
    """Run ``source`` in a fresh interpreter without ``TRITON_INTERPRET`` (kernels must compile) and return the JSON
    object its last output line prints."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["OMP_NUM_THREADS"] = "1"
    done = subprocess.run([sys.executable, "-c", source], env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not _ptxas_available(), reason="triton bundles no ptxas here")
def test_registers_of_the_mamba2_replay_launches():
    result = _run_worker(WORKER)
    host, device = result["calls"]["host"], result["calls"]["device"]
    # host positions, a replay-only launch; device positions: two launches, the flushing rows (their output read
    # from the copy, then the fold) and the replaying rows
    assert [(r["kernel"], r["PHASE"], r["READ_FORMAT"]) for r in host] == [("_mamba2_replay_step_kernel", 1, "fp8")]
    assert [(r["kernel"], r["PHASE"], r["READ_FORMAT"]) for r in device] == [
        ("_mamba2_replay_step_kernel", 3, "fp8"), ("_mamba2_replay_step_kernel", 4, "fp8")]
    for r in host + device:
        assert 16 <= r["registers"] <= 255, r
        assert r["spill_store_bytes"] >= 0 and r["spill_load_bytes"] >= 0, r
        assert r["num_warps"] == 2 and r["BLOCK_P"] == 8, r
        # the machine code's static instruction count, from the bundled cuobjdump (a kernel of this size: hundreds)
        # (None only where this Triton bundles no cuobjdump)
        assert (r["sass_instructions"] is None) == (not result["has_cuobjdump"]), r
        assert r["sass_instructions"] is None or 200 <= r["sass_instructions"] <= 20000, r
    # the flush launch carries the fold too: more registers than the replay-only ones
    assert device[0]["registers"] > max(host[0]["registers"], device[1]["registers"]), (host, device)
    assert result["restored"] == "JITFunction"  # the module's kernel is back in place


VERIFY_WORKER = r"""
import json
from hf_replayssm.kernels import delta_verify, registers
rows = [registers.verify_registers(family, 256, window, None) for family in ("mamba2", "gdn", "kda")
        for window in (2, 8)]
print(json.dumps(dict(rows=rows, restored=type(delta_verify._delta_verify_kernel).__name__)))
"""

# What the wrappers pick at batch 256 (runs 78 / 79 / 84 / 85 on the H200, the fastest measured launches):
# (family, window) -> (form, tile, warps, BLOCK_T)
VERIFY_DEFAULTS = {("mamba2", 2): ("tokens", 64, 2, 8), ("mamba2", 8): ("tf32x3", 64, 4, 16),
                   ("gdn", 2): ("tokens", 64, 2, 2), ("gdn", 8): ("steps", 16, 1, 8),
                   ("kda", 2): ("tokens", 64, 2, 2), ("kda", 8): ("steps", 16, 1, 8)}


@pytest.mark.skipif(not _ptxas_available(), reason="triton bundles no ptxas here")
def test_verify_kernels_default_launches_at_batch_256():
    """The speculative verify kernels at the form and launch configuration their wrappers pick for 256 rows and
    windows of 2 and 8 tokens: at 8 Mamba-2 switches to the tensor-core product form (tf32x3) and the delta rule to
    the steps form (one warp); tiles as chosen on the H200. They compile within 255 registers, spilling at most 512 B
    per thread: the fastest measured launches spill a little (Triton 3.6 for sm_90: 100-376 B) where the first product
    form spilled 3.6-13.2 KB."""
    result = _run_worker(VERIFY_WORKER)
    rows = result["rows"]
    assert [(r["family"], r["window"], r["kernel"]) for r in rows] == [
        (family, window, f"_{'mamba2' if family == 'mamba2' else 'delta'}_verify_kernel")
        for family in ("mamba2", "gdn", "kda") for window in (2, 8)]
    for r in rows:
        print(r)
        form, tile, warps, block_t = VERIFY_DEFAULTS[r["family"], r["window"]]
        assert r["WINDOW_AS_PRODUCTS"] == (form == "tf32x3") and r.get("WINDOW_AS_STEPS", False) == (form == "steps"), r
        assert r["BLOCK_T"] == block_t, r
        assert r.get("BLOCK_P", r.get("BLOCK_V")) == tile and r["num_warps"] == warps, r
        if form != "tokens":  # the product form's tl.dot and the steps form's record fold: tf32x3
            assert r["PRECISION"] == "tf32x3", r
        assert 16 <= r["registers"] <= 255 and r["spill_store_bytes"] <= 512, r
        # KDA's per-head pre-launch of the record decays runs from 3-token windows on, and compiles as well
        assert ("weights_registers" in r) == (r["family"] == "kda" and r["window"] >= 3), r
        assert r.get("weights_spill_store_bytes", 0) == 0, r
    assert result["restored"] == "JITFunction"


REENCODE_WORKER = r"""
import json
from hf_replayssm.kernels import read_copy_encode, registers
rows = registers.reencode_registers(grids=(None,))
print(json.dumps(dict(rows=rows, restored=type(read_copy_encode._nvfp4_encode_kernel).__name__)))
"""


@pytest.mark.skipif(not _ptxas_available(), reason="triton bundles no ptxas here")
def test_registers_of_the_nvfp4_reencode():
    """``--reencode``: the per-tile encode launch compiled in both arithmetics, at the Nemotron-H-8B checkpoint's
    tile, without spills; the module's kernel restored afterwards."""
    result = _run_worker(REENCODE_WORKER)
    rows = result["rows"]
    assert [(r["kernel"], r["RECIPROCAL_QUOTIENT"], r["grid"]) for r in rows] == [
        ("_nvfp4_encode_kernel", False, "per-tile"), ("_nvfp4_encode_kernel", True, "per-tile")]
    for r in rows:
        assert 16 <= r["registers"] <= 255 and r["spill_store_bytes"] == 0, r
        assert r["sass_instructions"] is None or 200 <= r["sass_instructions"] <= 20000, r
    assert result["restored"] == "JITFunction"


HOST_FLUSH_WORKER = r"""
import json
from hf_replayssm.kernels import delta_rule, registers

rows = registers.host_flush_registers("gdn", arch=90, batch=256)
print(json.dumps(dict(rows=rows, restored=type(delta_rule._delta_replay_step_kernel).__name__)))
"""


@pytest.mark.skipif(not _ptxas_available(), reason="triton bundles no ptxas here")
def test_host_flush_code_vector():
    """``--host-flush``: GDN's host flush at batch 256 (exact fold, [128, 16] x 1 warp), plain and giving its outputs
    from a copy. The fp8 arm loads its codes 4 to a vector by default and then needs fewer warp shuffles than with
    the compiler's widest load (Triton 3.9, the token reloaded: 355 against 491; 3.6 and held: 350 against 486), as
    many as nvfp4's with the token handled alike (its default holds it: ``reload_token_default``), where that load's
    layout carried over to the fold; every arm without spills."""
    result = _run_worker(HOST_FLUSH_WORKER, timeout=900)
    rows = {r["arm"]: r for r in result["rows"]}
    assert list(rows) == ["plain", "fp8 outputs", "fp8 outputs, widest codes", "nvfp4 outputs",
                          "nvfp4 outputs, token reloaded"]
    assert [(r["PHASE"], r["BLOCK_V"], r["num_warps"], r["CODE_VECTOR"], r["FLUSH_READS_COPY"], r["RELOAD_TOKEN"])
            for r in rows.values()] == [(2, 16, 1, 0, False, True), (2, 16, 1, 4, True, True),
                                        (2, 16, 1, 0, True, True), (2, 16, 1, 0, True, False),
                                        (2, 16, 1, 0, True, True)]
    assert rows["fp8 outputs"]["ptx_shuffles"] < rows["fp8 outputs, widest codes"]["ptx_shuffles"], rows
    assert rows["fp8 outputs"]["ptx_shuffles"] <= rows["nvfp4 outputs, token reloaded"]["ptx_shuffles"], rows
    for r in rows.values():
        assert 16 <= r["registers"] <= 255 and r["spill_store_bytes"] == 0 and r["shared_bytes"] is not None, r
    assert result["restored"] == "JITFunction"


SOLVE_WORKER = r"""
import json
from hf_replayssm.kernels import delta_rule, registers

rows = {family: registers.solve_registers(family, arch=90, batch=256) for family in ("gdn", "kda")}
print(json.dumps(dict(rows=rows, restored=type(delta_rule._delta_solve_kernel).__name__)))
"""


@pytest.mark.skipif(not _ptxas_available(), reason="triton bundles no ptxas here")
def test_solve_pre_launch_registers():
    """``--solve``: the host flush with the solved exact fold (outputs from an fp8 copy, batch 256) without and with
    the per-head pre-launch that computes its chain over the records (``_solve_weights``). GDN: with it the flush
    program reads that chain (SOLVE_GIVEN) and on [K, 32] x 4 drops below 255 registers without spilling (Triton 3.9:
    194 against 255 with 56 spilled bytes; 3.6: 192 against 255 / 72), [K, 64] x 4 spills less (108 against 576
    bytes); the pre-launch itself: one warp, no spills. KDA (per-key gates; the pre-launch also hands over the decayed
    keys): [K, 32] x 4 spills neither way and holds fewer registers given (3.6: 217 against 246), [K, 64] x 4 spills
    less; its pre-launch on four warps, no spills (on one it spills)."""
    result = _run_worker(SOLVE_WORKER, timeout=900)
    for family, rows in result["rows"].items():
        assert [r["arm"] for r in rows] == ["[K, 64] x 4", "pre-launch", "[K, 64] x 4, pre-launch given",
                                            "[K, 32] x 4", "pre-launch", "[K, 32] x 4, pre-launch given"], rows
        flush = {r["arm"]: r for r in rows if r["arm"] != "pre-launch"}
        assert [(r["PHASE"], r["BLOCK_V"], r["num_warps"], r["EXACT_SOLVE"], r["SOLVE_GIVEN"], r["GATE_PER_KEY"])
                for r in flush.values()] == [(2, 64, 4, True, False, family == "kda"), (2, 64, 4, True, True,
                                              family == "kda"), (2, 32, 4, True, False, family == "kda"),
                                             (2, 32, 4, True, True, family == "kda")], (family, flush)
        given = flush["[K, 32] x 4, pre-launch given"]
        assert given["registers"] < 255 and given["spill_store_bytes"] == 0, given
        if family == "gdn":
            assert flush["[K, 32] x 4"]["registers"] == 255 or flush["[K, 32] x 4"]["spill_store_bytes"] > 0, flush
        else:
            assert given["registers"] < flush["[K, 32] x 4"]["registers"], flush
        assert (flush["[K, 64] x 4, pre-launch given"]["spill_store_bytes"]
                < flush["[K, 64] x 4"]["spill_store_bytes"]), flush
        for r in rows:
            if r["arm"] == "pre-launch":
                assert (r["kernel"], r["num_warps"], r["spill_store_bytes"], r["GATE_PER_KEY"]) == (
                    "_delta_solve_kernel", 4 if family == "kda" else 1, 0, family == "kda"), r
    assert result["restored"] == "JITFunction"


WEIGHTS_ORDER_WORKER = r"""
import json
from hf_replayssm.kernels import registers

print(json.dumps(dict(rows=registers.weights_order_registers(arch=90, batch=256))))
"""


@pytest.mark.skipif(not _ptxas_available(), reason="triton bundles no ptxas here")
def test_weights_pre_launch_newest_first():
    """``--weights-order``: KDA's per-head weights pre-launch reading the records newest first (``_newest_first``)
    takes their decays by a forward scan and compiles to fewer warp shuffles than the logical order's reverse scan
    (sm_90: Triton 3.6 970 -> 330, the H200 image's; 3.9 466 -> 338), without spilling."""
    rows = {r["arm"]: r for r in _run_worker(WEIGHTS_ORDER_WORKER, timeout=600)["rows"]}
    assert sorted(rows) == ["logical order", "newest first"], rows
    assert [rows[arm]["NEWEST_FIRST"] for arm in ("logical order", "newest first")] == [False, True], rows
    assert rows["newest first"]["ptx_shuffles"] < rows["logical order"]["ptx_shuffles"], rows
    assert all(r["spill_store_bytes"] == 0 and r["kernel"] == "_kda_weights_kernel" for r in rows.values()), rows


def test_shuffles_by_line_reads_the_debug_lines():
    """Warp shuffles counted by the ``.loc`` line before them, with the file names of the ``.file`` directives that
    PTX puts after the code."""
    from hf_replayssm.kernels.registers import shuffles_by_line

    ptx = "\n".join([
        ".loc 1 10 3", "shfl.sync.bfly.b32 %r1, %r2, 16, 31, -1;", "add.f32 %f1, %f2, %f3;",
        ".loc 2 343 12", "shfl.sync.up.b32 %r3, %r4, 1, 0, -1;", "shfl.sync.up.b32 %r5, %r6, 2, 0, -1;",
        ".loc 1 11 1", "st.global.f32 [%rd1], %f1;",
        '.file 1 "/src/kernels/delta_rule.py"', '.file 2 "/site/triton/language/standard.py"'])
    assert shuffles_by_line(ptx) == [("standard.py:343", 2), ("delta_rule.py:10", 1)]
