"""Registers and spills of the decode-step kernels, compiled for a GPU on a machine without one.

A kernel's register count decides how many of its programs an SM holds, and a spill puts its tile in local memory;
on the H200 both explained why the read-copy kernels are slow (``BENCHMARKS.md``). They are decided at compile
time, so they can be read without a GPU: :func:`compile_launches` runs a kernel module's Python wrapper on CPU
tensors with the module's Triton kernels replaced by recorders, compiles every recorded launch for ``sm_<arch>``
(Triton's ``warmup`` under a stand-in driver that reports that target; the wrapper's arguments give the same
specialisation as on the device: dtypes, 16-byte alignment, ints equal to 1), assembles the PTX with the ptxas that
Triton bundles (``-v``; the build Triton itself uses for that architecture first) and parses its report. With the
Triton version of the GPU machine (3.6) the counts are the bench's on the H200 within one register (GDN replay,
rows in mixed phases, 166 vs 167; GDN replay-only reading an fp8 copy 168 = 168, nvfp4 254 vs 255; Mamba-2 fused
step reading an fp8 copy 200 = 200). Counts, not times: what a configuration costs in occupancy and spills, to
choose which ones the GPU should time.

Uses Triton internals (``triton.runtime.driver.set_active``, ``JITFunction.warmup``, the bundled ptxas); a Triton
without them raises a clear error. Command line (a table over launch configurations and read formats)::

    python -m hf_replayssm.kernels.registers --family gdn --arch 90   # or kda, mamba2
    python -m hf_replayssm.kernels.registers --family gdn --verify    # the verify kernel, both forms, batch 256
    python -m hf_replayssm.kernels.registers --reencode               # the nvfp4 re-encode, both arithmetics
    python -m hf_replayssm.kernels.registers --family gdn --host-flush  # the host flush, plain / outputs from a copy
    python -m hf_replayssm.kernels.registers --family kda --solve       # the solved fold, with / without pre-launch
    python -m hf_replayssm.kernels.registers --weights-order            # KDA's weights pre-launch, both record orders
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
import subprocess
import tempfile
from collections.abc import Callable
from types import ModuleType

import torch
import triton

__all__ = ["compile_launches", "main", "verify_registers"]


class _TargetDriver:
    """Stands in for Triton's active driver while compiling: the target and a device / stream number only."""

    def __init__(self, arch: int):
        from triton.backends.compiler import GPUTarget

        self.target = GPUTarget("cuda", arch, 32)

    def get_current_target(self):
        return self.target

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0


class _Recorder:
    """Takes a kernel's place in its module: ``kernel[grid](*args, **kwargs)`` records the launch instead."""

    def __init__(self, kernel, launches: list):
        self.kernel, self.launches = kernel, launches

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.launches.append((self.kernel, args, kwargs))


def _ptxas_report(ptx: str, arch: int) -> dict:
    """Registers and spill bytes from the bundled ptxas (-v); the first of its ptxas builds that takes this PTX."""
    bin_dir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    errors = []
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernel.ptx")
        with open(path, "w") as f:
            f.write(ptx)
        for name in ("ptxas", "ptxas-blackwell"):
            exe = os.path.join(bin_dir, name)
            if not os.path.exists(exe):
                continue
            done = subprocess.run([exe, f"-arch=sm_{arch}a" if arch >= 90 else f"-arch=sm_{arch}", "-v", path, "-o",
                                   os.path.join(tmp, "kernel.cubin")], capture_output=True, text=True)
            text = done.stdout + done.stderr
            regs = re.search(r"Used (\d+) registers", text)
            if done.returncode == 0 and regs:
                spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", text)
                return dict(registers=int(regs.group(1)), spill_store_bytes=int(spills.group(1)) if spills else 0,
                            spill_load_bytes=int(spills.group(2)) if spills else 0, ptxas=name,
                            sass_instructions=_sass_instructions(os.path.join(tmp, "kernel.cubin"), bin_dir))
            errors.append(f"{name}: {text.strip()[-300:]}")
    raise RuntimeError("no bundled ptxas assembled the kernel: " + " | ".join(errors or [f"none in {bin_dir}"]))


def _sass_instructions(cubin: str, bin_dir: str) -> int | None:
    """Instructions in the kernel's machine code (static count, loops counted once: what a change to a loop body's
    arithmetic saves), from the bundled cuobjdump; None where it is missing or fails."""
    exe = os.path.join(bin_dir, "cuobjdump")
    if not os.path.exists(exe):
        return None
    done = subprocess.run([exe, "-sass", cubin], capture_output=True, text=True)
    if done.returncode != 0:
        return None
    return len(re.findall(r"^\s+/\*[0-9a-f]{4,}\*/\s+\S", done.stdout, flags=re.M))


def shuffles_by_line(ptx: str, top: int = 6) -> list[tuple[str, int]]:
    """The PTX's warp shuffles by the source line they come from (``file:line`` of its ``.loc`` debug lines), most
    first: e.g. a scan or reduction inside ``triton/language/standard.py`` and the kernel line that asked for it."""
    files = {number: os.path.basename(path) for number, path in re.findall(r'^\s*\.file\s+(\d+)\s+"([^"]+)"', ptx,
                                                                          flags=re.M)}
    counts, where = {}, "?"
    for line in ptx.splitlines():
        found = re.match(r"\s*\.loc\s+(\d+)\s+(\d+)", line)
        if found:
            where = f"{files.get(found.group(1), '?')}:{found.group(2)}"
        elif re.search(r"\bshfl\.", line):
            counts[where] = counts.get(where, 0) + 1
    return sorted(counts.items(), key=lambda item: -item[1])[:top]


def compile_launches(module: ModuleType, kernel_names: list[str], call: Callable[[], object], arch: int = 90,
                     skip: tuple[str, ...] = ()) -> list[dict]:
    """Run ``call()`` (which calls ``module``'s wrapper on CPU tensors) with the Triton kernels ``kernel_names`` of
    ``module`` recording their launches, and module functions named in ``skip`` (e.g. a count-update launch) doing
    nothing; compile each launch for ``sm_<arch>``. Returns, per launch: the kernel's name, its constexpr arguments
    (and ``num_warps``), registers, spill store / load bytes and the ptxas used."""
    from triton.runtime import driver

    if not hasattr(driver, "set_active") or not hasattr(triton.runtime.JITFunction, "warmup"):
        raise RuntimeError(f"triton {triton.__version__} lacks driver.set_active / JITFunction.warmup")
    launches: list = []
    saved = {name: getattr(module, name) for name in (*kernel_names, *skip)}
    try:
        for name in kernel_names:
            setattr(module, name, _Recorder(saved[name], launches))
        for name in skip:
            setattr(module, name, lambda *args, **kwargs: None)
        call()
    finally:
        for name, value in saved.items():
            setattr(module, name, value)
    results = []
    previous = driver._active
    driver.set_active(_TargetDriver(arch))
    try:
        for kernel, args, kwargs in launches:
            compiled = kernel.warmup(*args, grid=(1,), **kwargs)
            kernel.device_caches.clear()  # nothing compiled for the stand-in target stays behind
            constexprs = {k: v for k, v in kwargs.items() if k.isupper() or k == "num_warps"}
            ptx = compiled.asm["ptx"]
            results.append(dict(kernel=kernel.__name__, **constexprs, **_ptxas_report(ptx, arch),
                                shared_bytes=getattr(compiled.metadata, "shared", None),
                                ptx_barriers=len(re.findall(r"\bbar\.sync|\bbarrier\.sync", ptx)),
                                ptx_shuffles=len(re.findall(r"\bshfl\.", ptx)),
                                shuffles_by_line=shuffles_by_line(ptx)))
    finally:
        driver.set_active(previous)
    return results


# ---------------------------------------------------------------------------------------------------------------
# the replay kernels of each family over launch configurations and read formats


def _read(state: torch.Tensor, fmt: str) -> dict:
    from hf_replayssm.precision.formats import get_format

    return {} if fmt == "fp32" else dict(read_copy=get_format(fmt).encode(state), read_format=fmt)


def _positions(device_phase: bool, batch: int, flush: bool = False):
    """Host positions (a replay-only launch with 3 records; ``flush``: the flush with 15) or device ones (rows
    alternately replaying and flushing)."""
    if not device_phase:
        return 0, 15 if flush else 3
    return torch.zeros(batch, dtype=torch.int32), torch.tensor([3, 15] * (batch // 2), dtype=torch.int32)


def _launch(**options) -> dict:
    """The wrapper's private launch options that are set (None / False: the wrapper's own choice), so that a call
    also fits wrappers that predate an option (``benchmarks/offline/launch_diff.py`` calls older commits' ones)."""
    return {name: value for name, value in options.items() if value is not None and value is not False}


def _delta_call(fmt: str, device_phase: bool, block_v: int | None = None, num_warps: int | None = None,
                per_key: bool = False, gdn_weights: bool = False, batch: int = 2, flush: bool = False,
                flush_outputs: bool | None = None, code_vector: int | None = None, reload_token: bool | None = None,
                exact_solve: bool = False, solve_weights: bool = False, newest_first: bool = False,
                flush_weights: bool | None = None):
    """``delta_rule._replay_step`` on ``batch`` rows at a real shape (launch options None: the wrapper's defaults);
    ``flush``: at host positions, the flush instead of a replay. With a copy, ``flush_outputs`` (default: with device
    positions or ``flush``) gives flushing rows' outputs from it; ``code_vector``: the host flush's
    ``_flush_code_vector``; ``reload_token=True``: the exact fold reads the token again after its records whatever
    the default (``_reload_token``); ``exact_solve`` / ``solve_weights``: the solved exact fold, with its per-head
    pre-launch (``_exact_solve`` / ``_solve_weights``); ``newest_first``: KDA's weights pre-launch reads the records
    newest first (``_newest_first``); ``flush_weights``: a KDA flush giving its outputs from a copy takes the records'
    weights from that pre-launch (``_flush_weights``; None: the wrapper's default, ``FLUSH_WEIGHTS_DEFAULT``, on for
    per-key gates; False is passed on, unlike the other options)."""
    from hf_replayssm.kernels import delta_rule

    # Qwen3-Next's GDN shape; Kimi-Linear's KDA: 32 heads of 128, a decay per key channel
    value_heads, key_heads, dim, ring = 32, 32 if per_key else 16, 128, 15
    gate = (value_heads, dim) if per_key else (value_heads,)

    def call():
        state = torch.randn(batch, value_heads, dim, dim)
        read = _read(state, fmt)
        if read:  # the separated policy's exact fold, and (flushes) the flush output from the copy
            read.update(ring_v=torch.randn(batch, ring, value_heads, dim).bfloat16(),
                        ring_beta=torch.rand(batch, ring, value_heads),
                        flush_reads_copy=(device_phase or flush) if flush_outputs is None else flush_outputs)
        delta_rule._replay_step(
            state, torch.randn(batch, ring, key_heads, dim).bfloat16(), torch.randn(batch, ring, value_heads, dim),
            -torch.rand(batch, ring, *gate), *_positions(device_phase, batch, flush),
            torch.randn(batch, key_heads, dim).bfloat16(), torch.randn(batch, key_heads, dim).bfloat16(),
            torch.randn(batch, value_heads, dim).bfloat16(), torch.rand(batch, value_heads).bfloat16(),
            -torch.rand(batch, *gate), buffer_len=16, out=torch.empty(batch, value_heads, dim),
            **_launch(_block_v=block_v, _num_warps=num_warps, _gdn_weights=gdn_weights,
                      _flush_code_vector=code_vector, _reload_token=reload_token, _exact_solve=exact_solve,
                      _solve_weights=solve_weights, _newest_first=newest_first),
            **({} if flush_weights is None else dict(_flush_weights=flush_weights)), **read)

    # the per-head pre-launches (weights: per-key gates, scalar ones with gdn_weights; the solved fold's chain) come
    # first (compiled, not run)
    pre = (["_kda_weights_kernel"] if per_key or gdn_weights else []) + (["_delta_solve_kernel"] if solve_weights
                                                                          else [])
    return delta_rule, [*pre, "_delta_replay_step_kernel"], call


def _mamba2_call(fmt: str, device_phase: bool, block_p: int | None = None, num_warps: int | None = None,
                 batch: int = 2, flush: bool = False):
    """``mamba2._replay_step`` on ``batch`` rows at Nemotron-H-8B's shape (``block_p`` None: the wrapper's launch);
    ``flush``: at host positions, the flush instead of a replay."""
    from hf_replayssm.kernels import mamba2

    heads, head_dim, d_state, groups, ring = 128, 64, 128, 8, 15  # Nemotron-H-8B's Mamba-2 shape
    config = None if block_p is None else dict(block_p=block_p, num_warps=num_warps)

    def call():
        state = torch.randn(batch, heads, head_dim, d_state)
        read = _read(state, fmt)
        if read:
            read["flush_reads_copy"] = device_phase or flush
        mamba2._replay_step(
            state, torch.randn(batch, ring, heads, head_dim).bfloat16(), torch.rand(batch, ring, heads),
            torch.randn(batch, ring, groups, d_state).bfloat16(), *_positions(device_phase, batch, flush),
            torch.randn(batch, heads, head_dim).bfloat16(), torch.rand(batch, heads).bfloat16(),
            torch.randn(batch, groups, d_state).bfloat16(), torch.randn(batch, groups, d_state).bfloat16(),
            -torch.rand(heads), D=torch.rand(heads), dt_bias=torch.rand(heads), dt_softplus=True, buffer_len=16,
            out=torch.empty(batch, heads, head_dim), **_launch(_config=config), **read)

    # device positions: the flush launch for the rows due walks them on a device-sized grid at some batch sizes
    return mamba2, ["_mamba2_replay_step_kernel", "_mamba2_flush_due_kernel"], call


def _gdn_call(fmt: str, device_phase: bool, block_v: int | None = None, num_warps: int | None = None,
              gdn_weights: bool = False, **rows):
    return _delta_call(fmt, device_phase, block_v, num_warps, per_key=False, gdn_weights=gdn_weights, **rows)


def _kda_call(fmt: str, device_phase: bool, block_v: int | None = None, num_warps: int | None = None, **rows):
    return _delta_call(fmt, device_phase, block_v, num_warps, per_key=True, **rows)


def _verify_call(family: str, batch: int, window: int, products: bool | str | None, launch: dict | None,
                 steps: bool = False):
    """The speculative verify kernel of ``family`` (bench_verify's real shapes, one row of tensors) with the launch
    configuration its wrapper picks for ``batch`` rows (or ``launch``: ``_config`` for Mamba-2, ``_block_v`` /
    ``_num_warps`` for the delta rule); ``products``: the kernel's matrix-product form (``True``, or ``"tf32x3"`` for
    its tensor-core products, ``kernels/verify_products.py``), ``None``: the form the wrapper picks for ``window``;
    ``steps``: the delta rule's steps form (with ``products=None``, the wrapper's choice of the two)."""
    from hf_replayssm.kernels import bench_verify

    name = "mamba2_verify" if family == "mamba2" else "delta_verify"
    module = __import__(f"hf_replayssm.kernels.{name}", fromlist=["_verify"])
    shape = next(iter(bench_verify.SHAPES[family].values()))
    if family == "mamba2":
        products, form = module.default_form(window) if products is None else products, {}
        if launch is None:
            launch = dict(_config=module.verify_launch_config(batch, shape["heads"], shape["head_dim"],
                                                              shape["d_state"], window, products))
    else:
        products, steps = module.resolve_form(window, products, steps or (None if products is None else False))
        form = dict(_steps=steps)
        if launch is None:
            block_v, warps = module.verify_launch_config(batch, shape["value_heads"], shape["key_dim"],
                                                         shape["value_dim"], family == "kda", window, products, steps)
            launch = dict(_block_v=block_v, _num_warps=warps)
    case = bench_verify.make_case(family, shape, 1, window, 16, torch.device("cpu"), torch.Generator().manual_seed(0),
                                  False)

    def call():
        case.verify(module, case.copies[0], _products=products, **launch, **form)

    # KDA's per-head pre-launch of the record decays (from 3-token windows on) is recorded too, not run
    return module, [f"_{'mamba2' if family == 'mamba2' else 'delta'}_verify_kernel",
                    *(["_verify_record_weights_kernel"] if family != "mamba2" else [])], call


def verify_registers(family: str, batch: int = 256, window: int = 4, products: bool | str | None = False,
                     arch: int = 90, launch: dict | None = None, steps: bool = False) -> dict:
    """Registers and spills of ``family``'s verify kernel ("mamba2", "gdn", "kda") at a batch's launch
    configuration (see :func:`_verify_call`), compiled for ``sm_<arch>``."""
    rows = compile_launches(*_verify_call(family, batch, window, products, launch, steps), arch=arch)
    (row,) = [r for r in rows if r["kernel"].endswith("_verify_kernel")]
    weights = {f"weights_{key}": r[key] for r in rows if r["kernel"] == "_verify_record_weights_kernel"
               for key in ("registers", "spill_store_bytes")}  # KDA's pre-launch, where the wrapper runs it
    return dict(row, **weights, family=family, batch=batch, window=window, products=products, steps=steps)


def reencode_registers(arch: int = 90, batch: int = 2, grids: tuple = (None, "compact")) -> list[dict]:
    """The nvfp4 re-encode's encode launch at a Nemotron-H-8B checkpoint's shape [B, 128, 64, 128] with the amax
    given (as the flushes hand it) and CUDA's constants, on the per-tile grid (None) and the compact one, in each
    arithmetic: a division per element (``_nvfp4_reciprocal_quotient=False``) and the block's reciprocal (the
    default). Static SASS counts: the reciprocal form's include the division it falls back to for tiles with
    subnormal block scales, so they are not what a tile executes."""
    from hf_replayssm.kernels import read_copy_encode
    from hf_replayssm.precision.formats import get_format

    rows = []
    for grid in grids:
        programs = None if grid is None else read_copy_encode.COMPACT_PROGRAMS_PER_ROW
        for quotient in (False, True):
            def call(programs=programs, quotient=quotient):
                state = torch.randn(batch, 128, 64, 128)
                amax = state.abs().amax(dim=(1, 2, 3)).view(torch.int32).contiguous()
                read_copy_encode.reencode_read_copy(
                    state, get_format("nvfp4").encode(state), "nvfp4", torch.ones(batch, dtype=torch.bool),
                    amax=amax, _programs_per_row=programs, _scalar_reciprocal=True,
                    _nvfp4_reciprocal_quotient=quotient)

            for r in compile_launches(read_copy_encode, ["_nvfp4_encode_kernel", "_nvfp4_encode_compact_kernel"],
                                      call, arch):
                rows.append(dict(r, grid="per-tile" if grid is None else "compact"))
    return rows


def host_flush_registers(family: str, arch: int = 90, batch: int = 256) -> list[dict]:
    """The delta rule's host flush (every row at its last position, the separated policy's exact fold) at ``batch``:
    plain (outputs from the new checkpoint), outputs from an fp8 copy with the codes 4 to a vector (the default) and
    at the compiler's widest (``_flush_code_vector=0``), outputs from an nvfp4 copy at its default (GDN: the token
    held through the records' loop, :func:`delta_rule.reload_token_default`) and with the token reloaded as the
    others. Why: Nsight Compute put the fp8 arm at 1.24 ms against the plain flush's 0.80 (H200, GDN, run 192); the
    counts here show where (shuffles, shared memory)."""
    rows = []
    for fmt, outputs, vector, reload, arm in (("fp8", False, None, None, "plain"),
                                              ("fp8", True, None, None, "fp8 outputs"),
                                              ("fp8", True, 0, None, "fp8 outputs, widest codes"),
                                              ("nvfp4", True, None, None, "nvfp4 outputs"),
                                              ("nvfp4", True, None, True, "nvfp4 outputs, token reloaded")):
        module, kernels, call = _delta_call(fmt, False, per_key=family == "kda", batch=batch, flush=True,
                                            flush_outputs=outputs, code_vector=vector, reload_token=reload)
        for r in compile_launches(module, kernels, call, arch, skip=("advance_counts",)):
            if r["kernel"] == "_delta_replay_step_kernel":
                rows.append(dict(r, arm=arm))
    return rows


def solve_registers(family: str = "gdn", arch: int = 90, batch: int = 256,
                    tiles: tuple = ((64, 4), (32, 4))) -> list[dict]:
    """The host flush with the solved exact fold (``_exact_solve``) of ``family`` ("gdn" or "kda"), outputs from an
    fp8 copy, on ``tiles`` (BLOCK_V, num_warps): without and with its per-head pre-launch (``_solve_weights``; that
    launch's own row too, arm "pre-launch"). Why: solved in every flush program GDN's measured slower than the
    stepped fold (H200, run 131); the pre-launch takes the chain over the records out of the programs that hold the
    state tile (for KDA also the decayed keys)."""
    rows = []
    for (block_v, num_warps), given in itertools.product(tiles, (False, True)):
        # the solved fold alone: its flush reads no weights pre-launch (KDA's default since run 218)
        module, kernels, call = _delta_call("fp8", False, block_v, num_warps, per_key=family == "kda", batch=batch,
                                            flush=True, flush_outputs=True, exact_solve=True, solve_weights=given,
                                            flush_weights=False)
        for r in compile_launches(module, kernels, call, arch, skip=("advance_counts",)):
            arm = f"[K, {block_v}] x {num_warps}{', pre-launch given' if given else ''}"
            rows.append(dict(r, arm="pre-launch" if r["kernel"] == "_delta_solve_kernel" else arm))
    return rows


def weights_order_registers(arch: int = 90, batch: int = 256) -> list[dict]:
    """KDA's per-head weights pre-launch (``_kda_weights_kernel``, host positions) with the records in logical order
    (the default) and newest first (``_newest_first``). Why: on one warp its [R, K] gate tile's rows span two lanes,
    and Triton 3.6 lowers the reverse scan over them with 832 of the launch's 970 warp shuffles; a warp shuffle a
    clock per SM at 8192 programs is about 34 us, most of the launch's 45.7 (H200, run 102)."""
    rows = []
    for newest_first in (False, True):
        module, kernels, call = _delta_call("fp32", False, per_key=True, batch=batch, newest_first=newest_first)
        for r in compile_launches(module, [*kernels, "_delta_replay_walk_kernel"], call, arch,
                                  skip=("advance_counts",)):
            if r["kernel"] == "_kda_weights_kernel":
                rows.append(dict(r, arm="newest first" if newest_first else "logical order"))
    return rows


FAMILIES = {"gdn": (_gdn_call, [(64, 4), (64, 2), (32, 4), (32, 2), (16, 2)]),
            "kda": (_kda_call, [(64, 4), (32, 4), (32, 2), (16, 2), (16, 1)]),
            "mamba2": (_mamba2_call, [(32, 2), (16, 2), (16, 4), (8, 2)])}


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--family", choices=sorted(FAMILIES), default="gdn")
    parser.add_argument("--arch", type=int, default=90, help="compute capability x 10 (90: Hopper, the H200)")
    parser.add_argument("--formats", default="fp32,fp8,nvfp4")
    parser.add_argument("--verify", action="store_true",
                        help="the speculative verify kernel instead, at --batch's launch configuration: tokens, "
                        "products (IEEE), products (tf32x3) and (delta rule) steps")
    parser.add_argument("--batch", type=int, default=256, help="with --verify: the batch whose launch to compile")
    parser.add_argument("--windows", default="2,4,8", help="with --verify: window widths")
    parser.add_argument("--reencode", action="store_true",
                        help="the nvfp4 re-encode's encode launch instead, both grids, both arithmetics")
    parser.add_argument("--host-flush", action="store_true",
                        help="gdn / kda: the host flush (exact fold), plain and giving its outputs from a copy, at "
                        "--batch")
    parser.add_argument("--solve", action="store_true",
                        help="gdn / kda: the host flush with the solved exact fold, without and with its per-head "
                        "pre-launch (_exact_solve / _solve_weights), at --batch")
    parser.add_argument("--weights-order", action="store_true",
                        help="kda: the per-head weights pre-launch with the records in logical order and newest first "
                        "(_newest_first), at --batch")
    parser.add_argument("--gdn-weights", action="store_true",
                        help="gdn replay launches with the per-head weights pre-launch (_replay_step's _gdn_weights)")
    args = parser.parse_args(argv)
    if args.gdn_weights and (args.family != "gdn" or args.verify):
        parser.error("--gdn-weights applies to the gdn replay launches only")
    rows = []
    if args.weights_order:
        print(f"kda weights pre-launch, batch {args.batch}, sm_{args.arch}, triton {triton.__version__}")
        rows = weights_order_registers(args.arch, args.batch)
        for r in rows:
            print(f"  {r['arm']:>14}  {r['registers']:>3} registers  {r['spill_store_bytes']:>4} B spilled  "
                  f"{r['ptx_shuffles']:>4} shuffles  {r['sass_instructions'] or '-':>5} instructions; shuffles by "
                  f"source line: {r['shuffles_by_line']}", flush=True)
        return rows
    if args.host_flush or args.solve:
        if args.family == "mamba2":
            parser.error("--host-flush applies to gdn and kda")
        what = "solved exact fold, outputs from an fp8 copy" if args.solve else "host flush"
        print(f"{args.family} {what}, batch {args.batch}, sm_{args.arch}, triton {triton.__version__}")
        rows = (solve_registers(args.family, args.arch, args.batch) if args.solve
                else host_flush_registers(args.family, args.arch, args.batch))
        for r in rows:
            tile = f"[{r['BLOCK_K']}, {r.get('BLOCK_V', r.get('BLOCK_R'))}]"  # (the solve pre-launch: [K, R])
            print(f"  {r['arm']:>30}  {tile} x {r['num_warps']}  {r['registers']:>3} "
                  f"registers  {r['spill_store_bytes']:>4} B spilled  {r['shared_bytes']:>5} B shared  "
                  f"{r['ptx_shuffles']:>4} shuffles  {r['sass_instructions'] or '-':>5} instructions", flush=True)
        return rows
    if args.reencode:
        print(f"nvfp4 re-encode, Nemotron-H-8B checkpoint, sm_{args.arch}, triton {triton.__version__} (SASS: static, "
              "the reciprocal form's division fallback included)")
        rows = reencode_registers(args.arch)
        for r in rows:
            arithmetic = "reciprocal" if r["RECIPROCAL_QUOTIENT"] else "division"
            print(f"  {r['grid']:>8} grid  {arithmetic:>10}  {r['registers']:>3} registers  "
                  f"{r['spill_store_bytes']:>4} B spilled  {r['sass_instructions'] or '-':>5} instructions", flush=True)
        return rows
    if args.verify:
        print(f"{args.family} verify, sm_{args.arch}, triton {triton.__version__}, batch {args.batch}")
        for window in (int(w) for w in args.windows.split(",")):
            forms = [(False, False), (True, False), ("tf32x3", False)] + ([(False, True)] if args.family != "mamba2"
                                                                           else [])
            for products, steps in forms:
                r = verify_registers(args.family, args.batch, window, products, args.arch, steps=steps)
                rows.append(r)
                tile = r.get("BLOCK_P", r.get("BLOCK_V"))
                form = "steps" if steps else {False: "tokens", True: "products"}.get(products, products)
                print(f"  T {window:>2}  {form:>8}  tile {tile:>3} x "
                      f"{r['num_warps']} warps  {r['registers']:>3} registers  {r['spill_store_bytes']:>5} B spilled",
                      flush=True)
        return rows
    make_call, configs = FAMILIES[args.family]
    print(f"{args.family}, sm_{args.arch}, triton {triton.__version__}: registers, spill bytes, PTX barriers and "
          "shuffles, SASS instructions (static) per launch")
    for tile, num_warps in configs:
        for fmt in args.formats.split(","):
            for device_phase in (False, True):
                module, kernels, call = make_call(fmt, device_phase, tile, num_warps,
                                                  **(dict(gdn_weights=True) if args.gdn_weights else {}))
                for r in compile_launches(module, kernels, call, args.arch, skip=("advance_counts",)):
                    r.update(tile=tile, read=fmt, positions="device" if device_phase else "host")
                    rows.append(r)
                    launch = f"phase {r['PHASE']}" if "PHASE" in r else r["kernel"]
                    print(f"  tile {tile:>3} x {num_warps} warps  {fmt:>5}  {r['positions']:>6} positions  {launch}  "
                          f"{r['registers']:>3} registers  {r['spill_store_bytes']:>4} B spilled  "
                          f"{r['ptx_barriers']:>3} barriers  {r['ptx_shuffles']:>3} shuffles  "
                          f"{r['sass_instructions'] or '-':>5} instructions", flush=True)
    return rows


if __name__ == "__main__":
    main()
