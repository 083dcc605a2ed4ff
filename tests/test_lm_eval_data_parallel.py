"""Data-parallel lm-eval under ``accelerate launch``: two CPU ranks (gloo) give the same metrics and the same
per-sample results as one process, on a log-likelihood task scored through the cache and a generation task.

``accelerate launch --cpu`` starts a single process whatever ``--num_processes`` says (its multi-CPU path needs
mpirun), so the ranks are started by the multi-process launcher with ``ACCELERATE_USE_CPU=1``, which makes the
Accelerator a MULTI_CPU (gloo) one."""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("lm_eval", reason="lm-eval is not installed (pip install 'lm-eval==0.4.13')")
pytest.importorskip("accelerate", reason="accelerate is not installed (pip install 'accelerate>=1.0')")

pytestmark = pytest.mark.slow

import hf_replayssm  # noqa: E402

# where the package under test is importable from: the checkout (editable install) or an installed copy. The ranks
# run outside the checkout, whose bare ``hf_replayssm`` folder would otherwise shadow an installed copy's
# ``hf_replayssm.eval`` (mapped from the top-level ``eval`` folder).
PACKAGE_PARENT = Path(hf_replayssm.__file__).resolve().parents[1]
FIXTURE = Path(__file__).parent / "fixtures" / "gpqa_synthetic.csv"
TASKS = ("recall_d16", "gpqa_diamond_zeroshot_local", "gpqa_diamond_cot_zeroshot_local")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _env(gpus: str = "") -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    env["CUDA_VISIBLE_DEVICES"] = gpus  # "" (the default): every run on CPU, comparable on a GPU machine too
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PACKAGE_PARENT), env.get("PYTHONPATH")]))
    return env


def _lm_eval_args(output: Path, recall_seed: int) -> list[str]:
    # batch size 1: every request is scored alone, so the per-sample numbers cannot depend on which other requests
    # share its batch (rank splitting changes that; the decode path prefills a batch up to its shortest context).
    # --limit 5 leaves the ranks unequal (3 and 2 recall documents), so lm-eval pads rank 1.
    metadata = {"gpqa_path": str(FIXTURE), "recall_docs": 5, "recall_seed": recall_seed}
    return [
        "-m", "hf_replayssm.eval.lm_eval_plugin", "run", "--model", "hf-replayssm",
        "--model_args", "pretrained=small-mamba2,precision=fp32,buffer_len=8",
        "--tasks", ",".join(TASKS), "--limit", "5", "--batch_size", "1", "--gen_kwargs", "max_gen_toks=6",
        "--metadata", json.dumps(metadata), "--output_path", str(output), "--log_samples",
    ]


def _run(command: list[str], env: dict[str, str], cwd: Path) -> None:
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]


def _saved(output: Path) -> tuple[dict, dict]:
    """The results JSON and the logged samples, keyed by (task, doc_id, filter): a generation task logs each
    document once per filter."""
    results = sorted(output.rglob("results_*.json"))
    assert len(results) == 1, results  # only rank 0 writes
    samples = {}
    for task in TASKS:
        files = sorted(output.rglob(f"samples_{task}_*.jsonl"))
        assert len(files) == 1, files
        for line in files[0].read_text().splitlines():
            sample = json.loads(line)
            key = (task, sample["doc_id"], sample["filter"])
            assert key not in samples  # no document scored twice (the ranks' padding requests are dropped)
            samples[key] = sample
    return json.loads(results[0].read_text()), samples


def _per_sample(sample: dict) -> tuple:
    """What a sample scored. lm-eval pads a rank that has fewer requests by repeating its last request of each type
    and appends those answers to that request's ``resps`` (its filters take the first), so only the first answer of
    each request is compared; the repeats must be copies of it."""
    resps = sample["resps"]
    assert all(answer == answers[0] for answers in resps for answer in answers)
    return (sample["doc_hash"], sample["arguments"], [answers[0] for answers in resps], sample["filtered_resps"],
            sample["target"], [sample[metric] for metric in sample["metrics"]])


def _launch_two_ranks(output: Path, recall_seed: int, env: dict[str, str]) -> None:
    _run([sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
          "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
          "--main_process_port", str(_free_port()), *_lm_eval_args(output, recall_seed)], env, output.parent)


def test_two_cpu_ranks_match_one_process(tmp_path):
    recall_seed = random.randrange(1 << 30)
    single, ranks = tmp_path / "single", tmp_path / "ranks"
    _run([sys.executable, *_lm_eval_args(single, recall_seed)], _env(), tmp_path)
    _launch_two_ranks(ranks, recall_seed, dict(_env(), ACCELERATE_USE_CPU="1"))
    _assert_same_evaluation(single, ranks, recall_seed)


def _cuda_devices() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.mark.skipif(_cuda_devices() < 2, reason="needs two CUDA GPUs (run on the two-GPU H200 machine)")
def test_two_gpu_ranks_match_one_gpu(tmp_path):
    """The same on GPUs: two ranks under ``accelerate launch`` (NCCL, one GPU each) against one process on one GPU;
    the same GPU model and batch size 1, so every per-sample number must agree exactly."""
    recall_seed = random.randrange(1 << 30)
    single, ranks = tmp_path / "single", tmp_path / "ranks"
    _run([sys.executable, *_lm_eval_args(single, recall_seed)], _env("0"), tmp_path)
    _launch_two_ranks(ranks, recall_seed, _env("0,1"))
    _assert_same_evaluation(single, ranks, recall_seed)


def _assert_same_evaluation(single: Path, ranks: Path, recall_seed: int) -> None:
    (one, one_samples), (two, two_samples) = _saved(single), _saved(ranks)

    assert set(one["results"]) == set(TASKS)
    seed_note = f"recall_seed={recall_seed}"  # to replay a failure
    assert two["results"] == one["results"], seed_note  # every metric and its stderr, exactly
    assert two["n-samples"] == one["n-samples"]
    for task in TASKS:
        assert one["results"][task]["sample_len"] == two["results"][task]["sample_len"] > 0
    assert one["results"]["recall_d16"]["sample_len"] == 5
    assert set(two_samples) == set(one_samples)
    for key, sample in one_samples.items():
        assert _per_sample(two_samples[key]) == _per_sample(sample), (key, seed_note)

    # the ReplayCache scored and generated in both runs; rank 0 of two did only its share of the work
    one_info, two_info = one["config"], two["config"]
    assert (one_info["replayssm_world_size"], two_info["replayssm_world_size"]) == (1, 2)
    assert one_info["replayssm_score_through_cache"] is True
    for info in (one_info, two_info):
        assert info["replayssm_caches_built"] > 0
        assert info["replayssm_cache_stats"]["decode_steps"] > 0 and info["replayssm_cache_stats"]["prefills"] > 0
    assert two_info["replayssm_caches_built"] < one_info["replayssm_caches_built"]
