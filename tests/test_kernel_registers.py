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
print(json.dumps(dict(calls=calls, restored=restored)))
"""


def _ptxas_available() -> bool:
    bin_dir = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    return any((bin_dir / name).exists() for name in ("ptxas", "ptxas-blackwell"))


@pytest.mark.skipif(not _ptxas_available(), reason="triton bundles no ptxas here")
def test_registers_of_the_mamba2_replay_launches():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["OMP_NUM_THREADS"] = "1"
    done = subprocess.run([sys.executable, "-c", WORKER], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
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
    # the flush launch carries the fold too: more registers than the replay-only ones
    assert device[0]["registers"] > max(host[0]["registers"], device[1]["registers"]), (host, device)
    assert result["restored"] == "JITFunction"  # the module's kernel is back in place
