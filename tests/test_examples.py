"""The main job, the quickstart script and the notebook run as they are (on the bundled model, CPU)."""

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

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
    # counted around every forward (40 each: the prefill and 39 single steps). Stock: every SSM layer's state changes
    # on every forward; ReplayCache: its checkpoints change at the prefill and at the flushes, one per 16 steps.
    assert result["forwards_stock"] == result["forwards_replay"] == 40
    assert result["state_writes_stock"] == 2 * 40
    assert result["state_writes_replay"] == 2 * (1 + 39 // 16) == result["checkpoint_writes_stats"]
    assert result["text"]


def test_demo_report_table():
    from hf_replayssm.demo import run_demo

    result = run_demo("tiny-gdn", max_new_tokens=20, buffer_len=4, progress=False)
    assert result["identical_tokens"] and result["identical_tokens_lookup"]
    assert "ReplayCache + prompt lookup" in result["report"] and "SSM state writes" in result["report"]
    assert result["ssm_layers"] == 3 and result["forwards_stock"] == 20
    assert result["state_writes_stock"] == 3 * 20
    assert result["state_writes_replay"] == 3 * (1 + 19 // 4) == result["checkpoint_writes_stats"]


def test_state_write_counter_counts_observed_changes():
    """The demo's counter sees writes, not a formula: no cache, no writes; a stock cache, one write per SSM layer per
    forward; a ReplayCache, one per layer at the prefill and at each flush; and a forward after which the state is
    what it was before (put back by a hook that runs before the counter's) counts none."""
    from transformers import DynamicCache

    from hf_replayssm import ReplayCache
    from hf_replayssm.demo import StateWriteCounter, replay_checkpoints, stock_ssm_states
    from hf_replayssm.tiny import tiny_model

    model = tiny_model("nemotron_h")  # SSM layers 0 and 2
    tokens = torch.randint(3, 120, (1, 12))

    def run(cache, states, steps=range(8, 12)):
        with StateWriteCounter(model, states) as counter, torch.no_grad():
            model(tokens[:, :8], use_cache=cache is not None, past_key_values=cache)
            if cache is not None:
                for pos in steps:
                    model(tokens[:, pos : pos + 1], use_cache=True, past_key_values=cache)
        return counter

    assert run(None, stock_ssm_states).writes == 0
    counter = run(DynamicCache(config=model.config), stock_ssm_states)
    assert counter.forwards == 5 and counter.writes == 2 * 5
    replay = ReplayCache(buffer_len=2)
    counter = run(replay, lambda _: replay_checkpoints(replay))
    assert counter.forwards == 5 and counter.writes == 2 * (1 + 4 // 2) == replay.stats()["checkpoint_writes"]

    # a state that a forward leaves unchanged is not counted
    stock = DynamicCache(config=model.config)
    run(stock, stock_ssm_states, steps=[])
    saved = {idx: [t.clone() for t in ts] for idx, ts in stock_ssm_states(stock).items()}

    def restore(module, args, kwargs, output):
        for idx, tensors in stock_ssm_states(stock).items():
            for tensor, old in zip(tensors, saved[idx], strict=True):
                tensor.copy_(old)

    handle = model.register_forward_hook(restore, with_kwargs=True)  # runs before the counter's hook
    try:
        with StateWriteCounter(model, stock_ssm_states) as counter, torch.no_grad():
            model(tokens[:, 8:9], use_cache=True, past_key_values=stock)
    finally:
        handle.remove()
    assert counter.forwards == 1 and counter.writes == 0


def test_quickstart_script():
    out = subprocess.run([sys.executable, "examples/quickstart.py", "--tokens", "24"], capture_output=True, text=True,
                         check=True, cwd=ROOT)
    assert "same tokens as stock decoding: True" in out.stdout
    assert "prompt lookup, same tokens: True" in out.stdout
    assert "assisted by a hybrid draft, same tokens: True" in out.stdout
    assert "static cache (compiled on CUDA), same tokens: True" in out.stdout


def _load_example(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def parse_precision_tables(text: str) -> dict[str, dict[str, float]]:
    """Mean KL per policy of each ``PrecisionReport.table()`` in ``text``, keyed by the model named in its title."""
    tables = {}
    for block in text.split("KL(fp32 || policy)")[1:]:
        title, _, body = block.partition("\n\n")
        model = re.search(r"decode path: (.*?) \(\d+ SSM layers\)", title).group(1)
        lines = body.strip().splitlines()
        assert lines[0].split()[:3] == ["policy", "B/elem", "mean"] and set(lines[1]) <= {"-", " "}
        tables[model] = {row.split()[0]: float(row.split()[2]) for row in lines[2:] if row.strip()}
    return tables


def test_precision_long_memory_example():
    """A short run of the example (48 positions: two flushes; the README's run is 300 and takes minutes), checked on
    the numbers it prints: the fp32 arm's KL is exactly 0 and the separated low-precision copy beats the shared
    low-precision checkpoint, per format and family."""
    policies = ["fp32", "separated-fp8", "shared-fp8", "separated-nvfp4", "shared-nvfp4"]
    out = subprocess.run([sys.executable, "examples/precision_long_memory.py", "--positions", "48", "--families",
                          "mamba2,gdn,kda", "--policies", ",".join(policies)],
                         capture_output=True, text=True, check=True, cwd=ROOT)
    tables = parse_precision_tables(out.stdout)
    assert list(tables) == [f"tiny {t} ({f}), slow heads"
                            for t, f in [("nemotron_h", "Mamba-2"), ("qwen3_5_text", "GDN"), ("kimi_linear", "KDA")]]
    assert "+ 48 positions" in out.stdout
    for model, kl in tables.items():
        assert list(kl) == policies, model
        assert kl["fp32"] == 0.0, model
        for fmt in ("fp8", "nvfp4"):
            assert 0 < kl[f"separated-{fmt}"] < kl[f"shared-{fmt}"], (model, kl)


def test_precision_long_memory_defaults_are_the_readme_run():
    """The default invocation is the README's: 300 positions, the three families, every preset in the README's order
    (which ``test_precision_long_memory_example`` runs a shorter version of)."""
    example = _load_example("precision_long_memory")
    args = example.build_parser().parse_args([])
    assert args.positions == 300 and args.families == ["mamba2", "gdn", "kda"]
    assert args.policies == ["fp32", "bf16", "fp16-sr", "separated-fp8", "shared-fp8", "separated-nvfp4",
                             "shared-nvfp4", "fp16-sr+nvfp4"]
    readme = (ROOT / "README.md").read_text()
    run = readme[readme.index("tiny nemotron_h (Mamba-2), slow heads"):]
    assert "16 prompt tokens + 300 positions" in run.splitlines()[0]
    lines = run.split("```")[0].strip().splitlines()
    dashes = next(i for i, line in enumerate(lines) if line.startswith("---"))
    readme_rows = [line.split()[0] for line in lines[dashes + 1 :]]
    assert readme_rows == args.policies


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
    assert "static cache: identical tokens: True" in outputs


def test_precision_study_notebook(tmp_path):
    """The precision-study notebook on the bundled small-gdn: a short KL study (fp32 arm exactly 0, JSON and PNG
    written) and GPQA through lm-eval on the synthetic fixture for two policies, compared question by question."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("lm_eval")
    notebook = nbformat.read(ROOT / "examples" / "precision_study.ipynb", as_version=4)
    params = next(cell for cell in notebook.cells if cell.cell_type == "code" and "GPQA_PATH = " in cell.source)
    fixture = ROOT / "tests" / "fixtures" / "gpqa_synthetic.csv"
    params.source += (f"\nKL_TOKENS = 40\nGPQA_PATH = {str(fixture)!r}\nGPQA_POLICIES = ['fp32', 'shared-nvfp4']"
                      f"\nGPQA_LIMIT = 3\nMAX_GEN_TOKS = 8\nOUT = {str(tmp_path)!r}")
    client = nbclient.NotebookClient(notebook, timeout=900, kernel_name="python3",
                                     resources={"metadata": {"path": str(ROOT / "examples")}})
    client.execute()
    outputs = "".join(o.get("text", "") for cell in notebook.cells for o in cell.get("outputs", []))
    kl = json.loads((tmp_path / "kl" / "kl.json").read_text())
    assert kl["meta"]["tokens"] == 40 and kl["meta"]["model"] == "small-gdn"
    assert kl["policies"]["fp32"]["mean_kl"] == 0.0
    assert all(kl["policies"][p]["mean_kl"] > 0 for p in ("separated-nvfp4", "shared-nvfp4"))
    assert (tmp_path / "kl" / "kl.png").stat().st_size > 0
    assert "fp32: mean KL 0.000e+00" in outputs
    for policy in ("fp32", "shared-nvfp4"):
        assert any((tmp_path / "gpqa" / policy).rglob("results_*.json")), policy
        assert f"{policy}: " in outputs and "/3 correct" in outputs
    assert "| arm | exact_match |" in outputs and "| `shared-nvfp4` |" in outputs and "McNemar p" in outputs
