"""``benchmarks/offline/launch_diff.py``: which default kernel launches changed between a commit and the working
tree (compiled for sm_90 without a GPU)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import load_offline_tool

ROOT = Path(__file__).resolve().parents[1]
launch_diff = load_offline_tool("launch_diff")


def test_compare_pairs_launches_and_flags_changed_code():
    base = [dict(case="mamba2 fp32 replay", kernel="k", registers=167, spills=0, ptx="aaa"),
            dict(case="mamba2 fp32 device", kernel="k", registers=148, spills=0, ptx="bbb"),
            dict(case="mamba2 fp32 device", kernel="k", registers=196, spills=0, ptx="ccc"),
            dict(case="gdn fp32 replay", error="TypeError: other arguments")]
    head = [dict(case="mamba2 fp32 replay", kernel="k", registers=110, spills=0, ptx="ddd"),
            dict(case="mamba2 fp32 device", kernel="k", registers=148, spills=0, ptx="bbb"),
            dict(case="mamba2 fp32 device", kernel="k", registers=196, spills=8, ptx="ccc"),
            dict(case="gdn fp32 replay", kernel="g", registers=255, spills=0, ptx="eee")]
    rows = launch_diff.compare(base, head)
    by_key = {(row["case"], row["kernel"], row["head"]["registers"] if row["head"] else None): row for row in rows}
    assert not by_key["mamba2 fp32 replay", "k", 110]["same_ptx"]
    assert by_key["mamba2 fp32 device", "k", 148]["same_ptx"]  # the second launch of a case pairs with the second
    assert by_key["mamba2 fp32 device", "k", 196]["same_ptx"]
    errored = [row for row in rows if row["case"] == "gdn fp32 replay"]
    assert len(errored) == 2 and not any(row["same_ptx"] for row in errored)  # an error never counts as the same
    assert launch_diff.describe(errored[0]["base"]).startswith("TypeError")
    assert launch_diff.describe(by_key["mamba2 fp32 device", "k", 196]["head"]) == "196 regs, 8 B spilled"


def _ptxas_available() -> bool:
    triton = pytest.importorskip("triton")
    bin_dir = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    return any((bin_dir / name).exists() for name in ("ptxas", "ptxas-blackwell"))


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(), reason="needs a git checkout")
def test_head_against_the_working_tree(tmp_path):
    if not _ptxas_available():
        pytest.skip("triton bundles no ptxas here")
    if subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--verify", "-q", "HEAD"], capture_output=True).returncode:
        pytest.skip("git cannot read this checkout's HEAD here")
    out = tmp_path / "launches.json"
    try:
        rows = launch_diff.main(["--base", "HEAD", "--families", "mamba2", "--formats", "fp32", "--batch", "2",
                                 "--out", str(out)])
    except subprocess.CalledProcessError as error:  # git worktree refused (a read-only or foreign-owned checkout)
        pytest.skip(f"git worktree is not available here: {error}")
    assert {row["case"] for row in rows} == {"mamba2 fp32 replay", "mamba2 fp32 flush", "mamba2 fp32 device"}
    for row in rows:
        for side in (row["base"], row["head"]):
            assert side is not None and "error" not in side, row
            assert 16 <= side["registers"] <= 255 and len(side["ptx"]) == 12, row
    kernels_clean = subprocess.run(["git", "-C", str(ROOT), "diff", "--quiet", "HEAD", "--", "kernels"]).returncode == 0
    if kernels_clean:  # nothing changed in the kernels since HEAD: every launch compiles to the same PTX
        assert all(row["same_ptx"] for row in rows), rows
    assert out.exists() and "launches" in out.read_text()
