"""Which decode-step kernel launches changed between a commit and the working tree: each family's default launches
(the ones callers get, at host positions replaying and flushing, and at device positions) compiled for sm_90 on this
machine, with their registers, spills and a fingerprint of the PTX. A GPU timing describes the code it ran; a launch
whose PTX changed since then needs timing again. (Found this way: ``30711f8`` changed Mamba-2's fp32 replay launches,
167 -> 110 registers, and the next timings were 6 % slower; BENCHMARKS.md, thirtieth session.)

    python benchmarks/offline/launch_diff.py --base 3f3e064 --families mamba2 --formats fp32,fp8

Each side runs in a subprocess on a copy of its package laid out as installed (``kernels/`` and ``eval/`` inside
``hf_replayssm``; the base comes from ``git worktree``), with this checkout's ``kernels/registers.py`` building the
launches (its real-shape calls of the wrappers, its sm_90 compile). Needs Triton with its bundled ptxas (no GPU); a
base whose wrappers took other arguments shows the error in its column. Counts and fingerprints, not times.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Runs with the side's package on the path and this checkout's ``kernels/registers.py`` (its launch recorder and the
# real-shape calls, which import the kernel modules from the side's package): prints one JSON list of launches.
WORKER = r"""
import hashlib, importlib.util, json, sys
import triton

spec = json.loads(sys.argv[1])
loader = importlib.util.spec_from_file_location("head_registers", spec["registers"])
registers = importlib.util.module_from_spec(loader)
loader.loader.exec_module(registers)
calls = {"mamba2": registers._mamba2_call, "gdn": registers._gdn_call, "kda": registers._kda_call}


def fingerprint(ptx):
    body = "\n".join(line for line in ptx.splitlines() if not line.strip().startswith((".loc", ".file", "//")))
    return hashlib.md5(body.split(".section")[0].encode()).hexdigest()[:12]


report = registers._ptxas_report
registers._ptxas_report = lambda ptx, arch: dict(report(ptx, arch), ptx=fingerprint(ptx))
rows = []
for family in spec["families"]:
    for fmt in spec["formats"]:
        for case in ("replay", "flush", "device"):  # host positions replaying / flushing, device positions
            key = f"{family} {fmt} {case}"
            try:
                module, _, call = calls[family](fmt, case == "device", batch=spec["batch"], flush=case == "flush")
                kernels = [name for name, value in vars(module).items()
                           if isinstance(value, triton.runtime.JITFunction) and name.endswith("_kernel")]
                for launch in registers.compile_launches(module, kernels, call, arch=90, skip=("advance_counts",)):
                    rows.append(dict(case=key, kernel=launch["kernel"], registers=launch["registers"],
                                     spills=launch["spill_store_bytes"], ptx=launch["ptx"]))
            except Exception as error:  # this side's wrappers take other arguments, or the launch fails to build
                rows.append(dict(case=key, error=f"{type(error).__name__}: {str(error)[:160]}"))
print(json.dumps(rows))
"""


def package_copy(source: Path, into: Path) -> Path:
    """``source``'s package laid out as installed, under ``into``; returns the folder to put on the path."""
    package = into / "hf_replayssm"
    shutil.copytree(source / "hf_replayssm", package, ignore=shutil.ignore_patterns("__pycache__"))
    for sub in ("kernels", "eval"):
        shutil.copytree(source / sub, package / sub, ignore=shutil.ignore_patterns("__pycache__"))
    return into


def side_launches(root: Path, spec: dict, scratch: Path) -> list[dict]:
    path = package_copy(root, scratch)
    spec = dict(spec, registers=str(ROOT / "kernels" / "registers.py"))
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env.update(PYTHONPATH=str(path), OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-c", WORKER, json.dumps(spec)], env=env, cwd=scratch,
                          capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"the compile worker failed on {root}:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def compare(base: list[dict], head: list[dict]) -> list[dict]:
    """One row per launch (case, kernel, its position among that case's launches): registers / spills on both
    sides and whether the PTX is the same."""

    def keyed(rows):
        out, counts = {}, {}
        for row in rows:
            index = counts[row["case"], row.get("kernel")] = counts.get((row["case"], row.get("kernel")), -1) + 1
            out[row["case"], row.get("kernel"), index] = row
        return out

    base_rows, head_rows = keyed(base), keyed(head)
    result = []
    for key in list(dict.fromkeys([*base_rows, *head_rows])):
        old, new = base_rows.get(key), head_rows.get(key)
        same = bool(old and new and "ptx" in old and "ptx" in new and old["ptx"] == new["ptx"])
        result.append(dict(case=key[0], kernel=key[1], base=old, head=new, same_ptx=same))
    return result


def describe(row: dict | None) -> str:
    if row is None:
        return "-"
    if "error" in row:
        return row["error"][:60]
    return f"{row['registers']} regs" + (f", {row['spills']} B spilled" if row["spills"] else "")


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="a commit (the code a timing ran on)")
    parser.add_argument("--families", default="mamba2,gdn,kda")
    parser.add_argument("--formats", default="fp32")
    parser.add_argument("--batch", type=int, default=256, help="rows (launch configurations depend on it)")
    parser.add_argument("--out", help="JSON results")
    args = parser.parse_args(argv)
    spec = dict(families=args.families.split(","), formats=args.formats.split(","), batch=args.batch)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        worktree = tmp / "base"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(worktree), args.base],
                       check=True)
        try:
            base = side_launches(worktree, spec, tmp / "base_package")
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(worktree)], check=False)
        head = side_launches(ROOT, spec, tmp / "head_package")
    rows = compare(base, head)
    print(f"sm_90 launches at batch {args.batch}: {args.base} against the working tree")
    for row in rows:
        print(f"  {row['case']:22s} {row['kernel']!s:34s} {describe(row['base']):>24s} -> "
              f"{describe(row['head']):24s} {'same PTX' if row['same_ptx'] else 'CHANGED'}")
    if args.out:
        Path(args.out).write_text(json.dumps(dict(base=args.base, batch=args.batch, launches=rows), indent=1))
    return rows


if __name__ == "__main__":
    main()
