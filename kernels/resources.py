"""Registers, stack and shared memory of our Triton kernels on a CUDA target, compiled on this machine (no GPU).

    python -m hf_replayssm.kernels.resources                       # verify kernels, H200 (sm_90), batch 256, T 2,4,8
    python -m hf_replayssm.kernels.resources --products --windows 4 --family gdn

A kernel whose threads need more than 255 registers spills to a per-thread stack in local memory, which costs it
much of its speed; ptxas reports both. This compiles a kernel exactly as a launch would (the wrapper's arguments,
strides, constexprs and launch configuration for the given batch, captured instead of launched) for a target
architecture with Triton's own ``ptxas``, then reads the cubin's resource usage with the bundled ``cuobjdump``.
So a configuration can be judged on a CPU-only machine before GPU time is spent on it (run 76: the verify kernels'
matrix-product form had never run on a GPU; ptxas showed the delta-rule kernel with 2-5 KB of stack per thread).
Numbers belong to the Triton here; the H200 image has its own (``triton.__version__`` is in the output).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import subprocess
import tempfile
import time
from pathlib import Path

import torch
import triton

if __package__:
    from . import bench_verify
    from .bench_common import load_kernels
else:  # run as a script from a checkout
    import bench_verify
    from bench_common import load_kernels

__all__ = ["ResourceUsage", "available", "cubin_resources", "sass_instructions", "verify_kernel_resources"]

_TYPES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.int32: "i32",
          torch.int64: "i64", torch.uint8: "u8"}


class ResourceUsage(dict):
    """{"registers", "stack_bytes", "shared_bytes", "compile_s", "triton", "arch"} of one compiled kernel
    (``compile_s`` near 0 when Triton's on-disk cache already held the kernel)."""


def _tool(name: str) -> Path:
    return Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name


def available() -> str | None:
    """None when kernels can be compiled for CUDA here, else why not."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        return "TRITON_INTERPRET=1 (unset it: the interpreter compiles nothing)"
    for name in ("ptxas", "cuobjdump"):
        if not _tool(name).exists():
            return f"this Triton has no bundled {name}"
    return None


class _Capture:
    """Stands in for a ``@triton.jit`` kernel: ``kernel[grid](*args, **kwargs)`` records the call."""

    def __init__(self):
        self.args, self.kwargs = None, None

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.args, self.kwargs = args, kwargs

        return launch


@contextlib.contextmanager
def _captured(module, name: str):
    real, capture = getattr(module, name), _Capture()
    setattr(module, name, capture)
    try:
        yield real, capture
    finally:
        setattr(module, name, real)


def _signature(value) -> str:
    if isinstance(value, torch.Tensor):
        return "*" + _TYPES[value.dtype]
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        return "i64" if abs(value) >= 2**31 else "i32"
    if isinstance(value, float):
        return "fp32"
    raise TypeError(f"cannot type kernel argument {value!r}")


def compile_resources(kernel, args: tuple, kwargs: dict, arch: int = 90) -> ResourceUsage:
    """Compile ``kernel`` (a ``@triton.jit`` function) for ``sm_<arch>`` with the arguments of one launch and read
    ptxas' resource usage. Integer arguments are typed without Triton's value specialisations (1, multiples of 16),
    which change addressing, not register pressure."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    kwargs = dict(kwargs)
    options = {k: kwargs.pop(k) for k in ("num_warps", "num_stages") if k in kwargs}
    positional = iter(args)
    signature, constexprs = {}, {}
    for index, param in enumerate(kernel.params):
        if param.is_constexpr:
            signature[param.name] = "constexpr"
            constexprs[(index,)] = kwargs[param.name] if param.name in kwargs else next(positional)
        else:
            signature[param.name] = _signature(next(positional))
    start = time.perf_counter()
    compiled = triton.compile(ASTSource(kernel, signature, constexprs), target=GPUTarget("cuda", arch, 32),
                              options=options)
    seconds = time.perf_counter() - start
    return ResourceUsage(**cubin_resources(compiled.asm["cubin"]), compile_s=round(seconds, 2),
                         triton=triton.__version__, arch=f"sm_{arch}")


def _cuobjdump(cubin: bytes, *flags: str) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(cubin)
        return subprocess.run([str(_tool("cuobjdump")), *flags, str(path)], check=True, capture_output=True,
                              text=True).stdout


def cubin_resources(cubin: bytes) -> dict:
    """{"registers", "stack_bytes", "shared_bytes"} of a one-kernel cubin, as ptxas allotted them."""
    fields = dict(re.findall(r"(REG|STACK|SHARED):(\d+)", _cuobjdump(cubin, "--dump-resource-usage")))
    return dict(registers=int(fields["REG"]), stack_bytes=int(fields["STACK"]), shared_bytes=int(fields["SHARED"]))


def sass_instructions(cubin: bytes) -> int:
    """Number of SASS instructions in a cubin (a static count, not a timing)."""
    sass = _cuobjdump(cubin, "-sass")
    return sum(1 for line in sass.splitlines() if line.strip().startswith("/*") and ";" in line)


def verify_kernel_resources(family: str, batch: int, window: int, products: bool = False, arch: int = 90,
                            launch: dict | None = None) -> ResourceUsage:
    """Resource usage of ``family``'s verify kernel ("mamba2", "gdn", "kda") at the real shape of
    ``bench_verify.SHAPES``, with the launch configuration the wrapper picks for ``batch`` rows and a window of
    ``window`` (or ``launch``: ``_config=...`` for Mamba-2, ``_block_v`` / ``_num_warps`` for the delta rule)."""
    name = "mamba2_verify" if family == "mamba2" else "delta_verify"
    module = load_kernels(name)
    shape = next(iter(bench_verify.SHAPES[family].values()))
    if launch is None:  # the configuration of the real batch; the captured tensors only need the real row shape
        if family == "mamba2":
            launch = dict(_config=module.verify_launch_config(batch, shape["heads"], shape["head_dim"],
                                                              shape["d_state"], window, products))
        else:
            block_v, warps = module.verify_launch_config(batch, shape["value_heads"], shape["key_dim"],
                                                         shape["value_dim"], family == "kda", window, products)
            launch = dict(_block_v=block_v, _num_warps=warps)
    case = bench_verify.make_case(family, shape, 1, window, 16, torch.device("cpu"),
                                  torch.Generator().manual_seed(0), False)
    kernel_name = f"_{'mamba2' if family == 'mamba2' else 'delta'}_verify_kernel"
    with _captured(module, kernel_name) as (kernel, capture):
        case.verify(module, case.copies[0], _products=products, **launch)
    usage = compile_resources(kernel, capture.args, capture.kwargs, arch)
    usage.update(family=family, batch=batch, window=window, products=products,
                 launch={k.lstrip("_"): v for k, v in launch.items()})
    return usage


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hf_replayssm.kernels.resources", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--family", default="mamba2,gdn,kda")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--windows", default="2,4,8")
    parser.add_argument("--products", action="store_true", help="the verify kernels' matrix-product form too")
    parser.add_argument("--arch", type=int, default=90, help="compute capability x 10 (90: H100 / H200)")
    args = parser.parse_args(argv)
    reason = available()
    if reason:
        parser.error(reason)
    print(f"triton {triton.__version__}, sm_{args.arch}, batch {args.batch}")
    print(f"{'family':<8}{'form':<10}{'T':>3}  {'launch':<36}{'registers':>10}{'stack B':>9}{'shared B':>9}"
          f"{'compile s':>10}")
    for family in args.family.split(","):
        for window in (int(w) for w in args.windows.split(",")):
            for products in (False, True) if args.products else (False,):
                u = verify_kernel_resources(family, args.batch, window, products, args.arch)
                print(f"{family:<8}{'products' if products else 'tokens':<10}{window:>3}  {u['launch']!s:<36}"
                      f"{u['registers']:>10}{u['stack_bytes']:>9}{u['shared_bytes']:>9}{u['compile_s']:>10}",
                      flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
