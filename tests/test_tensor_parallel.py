"""Tensor parallelism through transformers' own machinery (``DistributedConfig(tp_plan="auto")``) with a ReplayCache.

One ``torchrun --nproc-per-node 2`` launch on CPU (transformers picks gloo there; CUDA is hidden from the ranks)
loads three tiny hybrids, one per recurrence family, with their shipped TP plans, and generates greedily with a
stock cache and with ReplayCaches: dynamic (no flush / flushing), static (``max_cache_len``, device positions) and
prompt-lookup speculation (``tests/tp_worker.py``). Every rank must give the tokens of a single-process stock run, its
logits within float32 rounding and the single-process ReplayCache's schedule. The shipped plans keep each recurrence
whole on every rank: Qwen3.5 shards attention, MLP, embeddings and lm_head and gathers its linear-attention
projections' outputs; Kimi-Linear shards MLP, embeddings and lm_head; Nemotron-H its embeddings (5.24; 5.17 ships no
plan and replicates everything). So each rank's ReplayCache holds the full SSM state and its share of KV heads.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
import transformers
from tp_worker import generations, replay_caches

from hf_replayssm.tiny import tiny_model

pytestmark = pytest.mark.skipif(
    not (torch.distributed.is_available() and torch.distributed.is_gloo_available()),
    reason="torch.distributed with the gloo backend is not available in this torch build",
)

WORLD_SIZE = 2
WORKER = Path(__file__).with_name("tp_worker.py")
# Mamba-2 (Nemotron-H: embeddings sharded), Gated DeltaNet (Qwen3.5: attention, MLP, lm_head sharded, GDN
# projections gathered), KDA (Kimi-Linear: MLP, embeddings, lm_head sharded).
MODEL_TYPES = ["nemotron_h", "qwen3_5_text", "kimi_linear"]
LOGIT_TOL = 1e-4  # float32 rounding of the sharded matmuls and all-reduces; observed <= 2e-5
LAUNCH_TIMEOUT_S = 240


def _require_tp_support() -> None:
    if not hasattr(transformers, "DistributedConfig"):
        pytest.skip(f"transformers {transformers.__version__} has no DistributedConfig (native tensor parallelism)")


def _save_models(root: Path) -> list[Path]:
    """Each tiny model saved with a fresh random prompt [2, 15] next to it: 5 tokens thrice, so prompt lookup finds
    matches and drafts."""
    model_dirs = []
    for model_type in MODEL_TYPES:
        model_dir = root / model_type
        tiny_model(model_type, seed=0, initializer_range=0.2).save_pretrained(model_dir)
        torch.save(torch.randint(3, 128, (2, 5)).repeat(1, 3), model_dir / "prompt.pt")
        model_dirs.append(model_dir)
    return model_dirs


def _start_ranks(out_dir: Path, model_dirs: list[Path], gpus: bool = False) -> subprocess.Popen:
    """Start the worker on WORLD_SIZE ranks, CPU (gloo) or, with ``gpus``, one GPU each (NCCL); the caller computes
    its references on the CPU meanwhile. Their output goes to ``out_dir/torchrun.log`` (a pipe nobody reads could
    fill and stall them)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH", "")])}
    if not gpus:
        env["CUDA_VISIBLE_DEVICES"] = ""  # CPU ranks (gloo) even on a GPU machine: the references run on the CPU
    else:
        env["REPLAYSSM_TP_BACKEND"] = "torch"  # NCCL is under test here; the kernels have GPU tests of their own
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={WORLD_SIZE}",
               str(WORKER), str(out_dir), *map(str, model_dirs)]
    with open(out_dir / "torchrun.log", "w") as log:
        return subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def _wait_ranks(proc: subprocess.Popen, out_dir: Path) -> None:
    """Wait for the ranks (killing their process group past the timeout); fail with their tracebacks."""
    try:
        proc.wait(timeout=LAUNCH_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    if proc.returncode == 0:
        return
    # every rank's traceback, and torchrun's own log (a rank that died without one: signal, OOM, timeout)
    errors = "\n".join(f"{path.name}:\n{path.read_text()}" for path in sorted(out_dir.glob("rank*.err")))
    log = (out_dir / "torchrun.log").read_text()[-4000:]
    passed = [(out_dir / f"rank{r}.barrier").exists() for r in range(WORLD_SIZE)]
    missing = [name for name in _result_files() if not (out_dir / name).exists()]
    if any(passed) and not missing and not errors:
        # a rank passes the closing barrier only once every rank saved every result: what failed is torch's
        # process-group teardown afterwards (a native abort, torchrun then killing the peer), which cannot touch
        # the results checked here
        warnings.warn(f"torchrun exited {proc.returncode} after the ranks passed their closing barrier (a native "
                      f"abort in torch's process-group teardown); their results are checked. torchrun.log "
                      f"(tail):\n{log[-1000:]}", stacklevel=2)
        return
    pytest.fail(f"torchrun exited {proc.returncode} (closing barrier passed: {passed}; results missing: "
                f"{missing})\n{errors}\ntorchrun.log (tail):\n{log}")


def _result_files() -> list[str]:
    return [f"{model_type}.rank{r}.pt" for model_type in MODEL_TYPES for r in range(WORLD_SIZE)]


def _run_tp(root: Path, gpus: bool = False) -> dict:
    """{model_type: {"single": single-process generations, "model": that model, "ranks": [rank 0, rank 1 results]}}."""
    out_dir = root / "out"
    out_dir.mkdir()
    model_dirs = _save_models(root)
    proc = _start_ranks(out_dir, model_dirs, gpus)
    results = {}
    try:
        for model_type, model_dir in zip(MODEL_TYPES, model_dirs, strict=True):
            model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
            results[model_type] = {"model": model, "single": generations(model, torch.load(model_dir / "prompt.pt"))}
    finally:
        _wait_ranks(proc, out_dir)
    for model_type in MODEL_TYPES:
        results[model_type]["ranks"] = [
            torch.load(out_dir / f"{model_type}.rank{r}.pt", weights_only=False) for r in range(WORLD_SIZE)]
    return results


def _sharded(model, rank_result) -> set[str]:
    full = {name: tuple(param.shape) for name, param in model.named_parameters()}
    return {name for name, shape in rank_result["local_shapes"].items() if shape != full[name]}


def _check_matches_single_process(model_type: str, entry: dict) -> None:
    """Every rank's stock and ReplayCache generations equal a single-process stock run."""
    single = entry["single"]
    reference_tokens, reference_logits = single["stock"]
    assert torch.equal(single["replay"][0], reference_tokens), f"{model_type}: single-process baseline"
    for rank, result in enumerate(entry["ranks"]):
        where = f"{model_type} rank {rank}"
        assert result["tp_size"] == WORLD_SIZE, where
        if entry["model"].config.base_model_tp_plan:  # nemotron_h ships none in 5.17: every weight replicated
            assert _sharded(entry["model"], result), f"{where}: the TP plan sharded no weight"
        for name in ("stock", *replay_caches(1)):
            tokens, logits = result[name]
            rows = len(tokens)  # the prompt-lookup run uses row 0 only
            assert torch.equal(tokens, reference_tokens[:rows]), f"{where} {name}: tokens differ"
            diff = (logits - reference_logits[:rows]).abs().max().item()
            assert diff < LOGIT_TOL, f"{where} {name}: logits differ by {diff}"
            if name != "stock":
                assert result[f"{name}_stats"] == single[f"{name}_stats"], f"{where} {name}: another schedule"
        for name in ("replay_l4", "replay_static"):
            assert result[f"{name}_stats"]["flushes"] > 0, f"{where} {name}: buffer_len=4 folded no records"
        assert result["replay_lookup_stats"]["rolled_back_tokens"] > 0, f"{where}: no draft was rolled back"


def _check_qwen3_5_cache_shapes(entry: dict) -> None:
    """Under TP each rank's ReplayCache checkpoint is the full GDN state (the projections gather their outputs)
    and its attention keys hold this rank's half of the KV heads."""
    config = entry["model"].config
    for result in entry["ranks"]:
        shapes = result["replay_shapes"]
        checkpoints = [shape for key, shape in shapes.items() if key.startswith("checkpoint.")]
        keys = [shape for key, shape in shapes.items() if key.startswith("keys.")]
        assert checkpoints and all(shape[1] == config.linear_num_value_heads for shape in checkpoints), shapes
        assert keys and all(shape[1] == config.num_key_value_heads // WORLD_SIZE for shape in keys), shapes


# One test, not one per model type: under pytest-xdist a shared fixture would launch torchrun once per worker.
@pytest.mark.equivalence
def test_tensor_parallel_generation_with_replay_cache(tmp_path):
    _require_tp_support()
    results = _run_tp(tmp_path)
    for model_type, entry in results.items():
        _check_matches_single_process(model_type, entry)
    _check_qwen3_5_cache_shapes(results["qwen3_5_text"])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < WORLD_SIZE
                    or not torch.distributed.is_nccl_available(), reason="needs two CUDA devices and NCCL")
def test_tensor_parallel_on_two_gpus(tmp_path):
    """The same on two GPUs (one rank each, NCCL), against the single-process CPU reference: the tokens, logits
    within float32 rounding (TF32 off in the ranks), the same schedules. The ranks' ReplayCaches run the torch
    backend (the kernels have GPU tests of their own); the static-cache arm runs with ``disable_compile`` (on CUDA
    generate() would compile the forward by itself, which outlasted the 240 s limit on the H200)."""
    _require_tp_support()
    results = _run_tp(tmp_path, gpus=True)
    for model_type, entry in results.items():
        _check_matches_single_process(model_type, entry)
    _check_qwen3_5_cache_shapes(results["qwen3_5_text"])


class _ExitedProcess:
    """Stands in for torchrun's Popen after it exited with ``returncode``."""

    def __init__(self, returncode: int):
        self.returncode = returncode

    def wait(self, timeout=None):
        return self.returncode


def test_a_teardown_abort_after_the_closing_barrier_warns_and_anything_else_fails(tmp_path):
    (tmp_path / "torchrun.log").write_text("terminate called without an active exception\n")
    with pytest.raises(pytest.fail.Exception, match=r"barrier passed: \[False, False\]"):
        _wait_ranks(_ExitedProcess(1), tmp_path)
    (tmp_path / "rank0.barrier").write_text("done\n")
    with pytest.raises(pytest.fail.Exception, match=r"results missing: .*kimi_linear\.rank1\.pt"):
        _wait_ranks(_ExitedProcess(1), tmp_path)  # a marker without the results is no finished run
    for name in _result_files():
        (tmp_path / name).write_text("")
    with pytest.warns(UserWarning, match="passed their closing barrier"):
        _wait_ranks(_ExitedProcess(-6), tmp_path)  # rank 1 was killed before its own marker: still fine
    (tmp_path / "rank1.err").write_text("Traceback: boom\n")  # a traceback always fails, markers or not
    with pytest.raises(pytest.fail.Exception, match="boom"):
        _wait_ranks(_ExitedProcess(1), tmp_path)
