"""The main job, the quickstart script and the notebook run as they are (on the bundled model, CPU)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def test_demo_command():
    out = subprocess.run(
        [sys.executable, "-m", "hf_replayssm.cli", "demo", "--tokens", "40", "--no-progress", "--json"],
        capture_output=True, text=True, check=True, cwd=ROOT,
    )
    result = json.loads(out.stdout)
    assert result["identical_tokens"] and result["identical_tokens_lookup"]
    assert result["max_logit_diff"] < 1e-4
    assert result["ssm_layers"] == 2
    # stock: one write per step per SSM layer; ReplayCache: prefill + one per 16 steps
    assert result["state_writes_stock"] == 2 * 40
    assert result["state_writes_replay"] == 2 * (1 + 39 // 16)
    assert result["text"]


def test_demo_report_table():
    from hf_replayssm.demo import run_demo

    result = run_demo("tiny-gdn", max_new_tokens=20, progress=False)
    assert result["identical_tokens"] and result["identical_tokens_lookup"]
    assert "ReplayCache + prompt lookup" in result["report"] and "SSM state writes" in result["report"]


def test_quickstart_script():
    out = subprocess.run([sys.executable, "examples/quickstart.py", "--tokens", "24"], capture_output=True, text=True,
                         check=True, cwd=ROOT)
    assert "same tokens as stock decoding: True" in out.stdout
    assert "prompt lookup, same tokens: True" in out.stdout
    assert "assisted by a hybrid draft, same tokens: True" in out.stdout


def test_precision_long_memory_example():
    out = subprocess.run([sys.executable, "examples/precision_long_memory.py"], capture_output=True, text=True,
                         check=True, cwd=ROOT)
    assert out.stdout.count("KL(fp32 || policy)") == 3 and "separated-nvfp4" in out.stdout


def test_quickstart_notebook():
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    notebook = nbformat.read(ROOT / "examples" / "quickstart.ipynb", as_version=4)
    client = nbclient.NotebookClient(notebook, timeout=600, kernel_name="python3",
                                     resources={"metadata": {"path": str(ROOT / "examples")}})
    client.execute()
    outputs = "".join(o.get("text", "") for cell in notebook.cells for o in cell.get("outputs", []))
    assert "identical tokens: True" in outputs
    assert "assisted by a hybrid draft model: identical tokens" in outputs
