"""Compile the replay kernels for an H100/H200 (sm_90) on a machine without a GPU and print each compiled kernel's
SASS instruction count and resource use (registers, spills as local memory, shared memory), e.g. to compare two
versions of a kernel before GPU time is spent on timing them. Static counts, not a timing.

    python benchmarks/offline/sass.py gdn fp32,nvfp4 [BATCH]
    python benchmarks/offline/sass.py mamba2 fp32,fp8,nvfp4

How: Triton's active driver is replaced by a stand-in that names the target, and launches become warm-ups (compile
only), on CPU tensors built by the read-copy kernel tests (``tests/test_kernels_read_copy.py``) at real shapes
(Qwen3-Next GDN 32 / 16 heads of 128, Nemotron-H-8B Mamba-2 128 heads x 64 x 128), device positions, batch 64 by
default (the launch configuration depends on the grid's size).
Uses Triton internals (``driver.set_active``, ``JITFunction.run(warmup=True)``), checked with Triton 3.9.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.runtime import driver
from triton.runtime.jit import JITFunction

ROOT = Path(__file__).resolve().parents[2]
COMPILED: list = []


class TargetOnlyDriver:
    """Enough of a driver for Triton to compile for sm_90: a device, a stream and a target; nothing launches."""

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_current_target(self):
        return GPUTarget("cuda", 90, 32)

    def get_active_torch_device(self):
        return torch.device("cpu")

    def is_active(self):
        return True


def _compile_only(self, grid):
    def launch(*args, **kwargs):
        COMPILED.append((self.fn.__name__, self.run(*args, grid=grid, warmup=True, **kwargs)))

    return launch


def report(label: str) -> None:
    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    for name, kernel in COMPILED:
        path = Path(os.environ.get("TMPDIR", "/tmp")) / f"{name}.cubin"
        path.write_bytes(kernel.asm["cubin"])
        sass = subprocess.run([cuobjdump, "-sass", path], capture_output=True, text=True).stdout
        instructions = sum(1 for line in sass.splitlines() if line.strip().startswith("/*") and ";" in line)
        usage = subprocess.run([cuobjdump, "-res-usage", path], capture_output=True, text=True).stdout
        resources = " ".join(line.strip().split("Function")[0] for line in usage.splitlines() if "REG" in line)
        print(f"{label:14s} {name}: {instructions} SASS instructions, {resources.strip()}")
    COMPILED.clear()


def compile_family(family: str, read_format: str, batch: int) -> None:
    import test_kernels_read_copy as cases

    if family == "mamba2":
        p = cases._mamba2_inputs("cpu", batch, 1, heads=128, groups=8, head_dim=64, d_state=128, ring=16)
    else:
        p = cases._delta_inputs("cpu", batch, 1, per_key=family == "kda", key_heads=16, value_heads=32, key_dim=128,
                                value_dim=128, ring=16)
    read = {}
    if read_format != "fp32":
        copy, _ = cases._store_copy(p["state"], read_format)
        read = dict(read_copy=copy, read_format=read_format)
    origin, count = cases._positions([0] * batch, [3] * batch, "cpu")
    try:
        cases._Family(family).kernel(p, origin, count, 16, **read)
    except Exception as error:  # the entry point reads results that a compile-only launch never produced
        if not COMPILED:
            raise
        print(f"({family} {read_format}: stopped after compiling: {type(error).__name__})")
    report(f"{family} {read_format}")


def main(argv: list[str]) -> None:
    family, formats = argv[0], argv[1].split(",") if len(argv) > 1 else ["fp32"]
    batch = int(argv[2]) if len(argv) > 2 else 64
    sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]
    driver.set_active(TargetOnlyDriver())
    JITFunction.__getitem__ = _compile_only
    for read_format in formats:
        compile_family(family, read_format, batch)


if __name__ == "__main__":
    main(sys.argv[1:])
