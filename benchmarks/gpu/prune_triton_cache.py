"""Shrink a Triton kernel-cache tarball (``.triton_cache/cache.tgz``) so that it travels with a GPU call beside other
carried files (the device tool carries 64 MiB in all, the tracked files included): drop the entries of named kernels
(verify and commit kernels, launch variants) that the planned calls do not run.

A Triton cache holds one folder per compiled kernel variant, named by its hash, with ``<kernel>.json`` (metadata),
the binaries, and possibly ``__grp__<kernel>.json`` files that list a group's members; an entry whose kernel is
dropped is just compiled again by the call that needs it.

    python3 benchmarks/gpu/prune_triton_cache.py --drop _delta_commit_kernel,_mamba2_verify_kernel \\
        [--cache .triton_cache/cache.tgz] [--out OTHER.tgz]
    python3 benchmarks/gpu/prune_triton_cache.py --list      # entries and megabytes per kernel
"""

from __future__ import annotations

import argparse
import io
import tarfile
from collections import defaultdict
from pathlib import Path


def _kernel_of(names: list[str]) -> str | None:
    """The kernel an entry folder compiled: its metadata file ``<kernel>.json`` (not a group list)."""
    for name in names:
        base = name.rsplit("/", 1)[-1]
        if base.endswith(".json") and not base.startswith("__grp__"):
            return base[: -len(".json")]
    return None


def read_entries(cache: Path) -> tuple[dict[str, list[tarfile.TarInfo]], dict[str, bytes], list[tarfile.TarInfo]]:
    """(members by entry folder, file contents by member name, top-level members) of a cache tarball."""
    folders: dict[str, list[tarfile.TarInfo]] = defaultdict(list)
    data: dict[str, bytes] = {}
    top: list[tarfile.TarInfo] = []
    with tarfile.open(cache, "r:gz") as tar:
        for member in tar.getmembers():
            if member.isfile():
                data[member.name] = tar.extractfile(member).read()
            parts = Path(member.name).parts  # ("HASH", ...) or (".", "HASH", ...)
            parts = parts[1:] if parts[:1] == (".",) else parts
            if not parts or (len(parts) == 1 and member.isfile()):  # the root, loose files
                top.append(member)
            else:  # an entry folder and everything in it
                folders[parts[0]].append(member)
    return folders, data, top


def prune(cache: Path, out: Path, drop: set[str]) -> dict:
    """Write ``out`` without the entries of the kernels in ``drop``; returns counts and sizes."""
    folders, data, top = read_entries(cache)
    kept = dropped = 0
    with tarfile.open(out, "w:gz") as tar:
        for member in top:
            tar.addfile(member, io.BytesIO(data[member.name]) if member.isfile() else None)
        for members in folders.values():
            if _kernel_of([m.name for m in members]) in drop:
                dropped += 1
                continue
            kept += 1
            for member in members:
                tar.addfile(member, io.BytesIO(data[member.name]) if member.isfile() else None)
    return dict(kept=kept, dropped=dropped, bytes_before=cache.stat().st_size, bytes_after=out.stat().st_size)


def listing(cache: Path) -> dict[str, tuple[int, int]]:
    """Entries and uncompressed bytes per kernel name."""
    folders, data, _ = read_entries(cache)
    per_kernel: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for members in folders.values():
        entry = per_kernel[_kernel_of([m.name for m in members]) or "?"]
        entry[0] += 1
        entry[1] += sum(len(data.get(m.name, b"")) for m in members)
    return {name: (n, size) for name, (n, size) in sorted(per_kernel.items(), key=lambda kv: -kv[1][1])}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache", default=".triton_cache/cache.tgz")
    parser.add_argument("--out", default=None, help="where to write (default: replace --cache)")
    parser.add_argument("--drop", default="", help="kernel names, comma-separated")
    parser.add_argument("--list", action="store_true", help="print entries and megabytes per kernel, change nothing")
    args = parser.parse_args(argv)
    cache = Path(args.cache)
    if args.list:
        for name, (entries, size) in listing(cache).items():
            print(f"{entries:5d} entries {size / 2**20:8.1f} MB  {name}")
        return
    drop = {name for name in args.drop.split(",") if name}
    if not drop:
        parser.error("name the kernels to drop (--drop), or --list them")
    out = Path(args.out) if args.out else cache.with_suffix(".pruned.tgz")
    result = prune(cache, out, drop)
    if not args.out:
        out.replace(cache)
    print(f"kept {result['kept']} entries, dropped {result['dropped']}: "
          f"{result['bytes_before'] / 2**20:.1f} -> {result['bytes_after'] / 2**20:.1f} MiB compressed")


if __name__ == "__main__":
    main()
