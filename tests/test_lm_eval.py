"""lm-evaluation-harness integration: the ``hf-replayssm`` model, the local GPQA tasks and the launcher.

Runs offline on the bundled tiny-gdn and a synthetic GPQA-format fixture (no real GPQA data anywhere)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

pytest.importorskip("lm_eval", reason="lm-eval is not installed (pip install 'lm-eval==0.4.13')")

import lm_eval
from lm_eval.models.huggingface import HFLM
from lm_eval.tasks import TaskManager

from hf_replayssm.eval import lm_eval_plugin
from hf_replayssm.eval.lm_eval_plugin import TASKS_DIR, ReplaySSMLM, main
from hf_replayssm.precision import resolve_policy

pytestmark = pytest.mark.slow

FIXTURE = Path(__file__).parent / "fixtures" / "gpqa_synthetic.csv"
MC_TASK = "gpqa_diamond_zeroshot_local"
COT_TASK = "gpqa_diamond_cot_zeroshot_local"


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")


@pytest.fixture(scope="module")
def built_caches():
    """Every ReplayCache the plugin constructs, with its policy (the plugin's module-level name is patched)."""
    made = []
    original = lm_eval_plugin.ReplayCache

    class CountingCache(original):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    lm_eval_plugin.ReplayCache = CountingCache
    yield made
    lm_eval_plugin.ReplayCache = original


@pytest.fixture(scope="module")
def fp32_lm(built_caches):
    return ReplaySSMLM(pretrained="tiny-gdn", precision="fp32", buffer_len="4", batch_size=1)


def _task_manager():
    return TaskManager(include_path=str(TASKS_DIR), include_defaults=False, metadata={"gpqa_path": str(FIXTURE)})


def _hashes(samples):
    return [(s["doc_id"], s["doc_hash"], s["prompt_hash"], s["target_hash"], s["target"],
             [a[0] for a in s["arguments"]]) for s in samples]


def test_tasks_load_fixture_with_seeded_shuffle(monkeypatch):
    """Choices are shuffled per question, independently of the global RNG; the answer letter tracks the correct one."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpqa_local_utils", TASKS_DIR / "utils.py")
    utils = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(utils)
    monkeypatch.delenv("GPQA_PATH", raising=False)
    with pytest.raises(ValueError, match="gpqa_path"):
        utils.load(version=1.0)
    layouts = []
    for seed in (0, 1):
        random.seed(seed)
        docs = utils.process_docs(utils.load(gpqa_path=str(FIXTURE), version=1.0, pretrained="ignored")["train"])
        layouts.append([(d["choices"], d["answer"]) for d in docs])
        for doc in docs:
            assert sorted(doc["choices"]) == sorted(doc[c].strip() for c in utils.ANSWER_COLUMNS)
            assert doc["choices"]["ABCD".index(doc["answer"][1])] == doc["Correct Answer"].strip()
            assert [doc[f"choice{i}"] for i in range(1, 5)] == doc["choices"]
    assert layouts[0] == layouts[1]
    assert len({answer for _, answer in layouts[0]}) > 1  # the shuffle does move the correct answer around


def test_simple_evaluate_two_policies(fp32_lm, built_caches):
    """fp32 and shared-nvfp4 arms: metrics present, identical prompts and shuffles, and a ReplayCache in every run."""
    nvfp4_lm = ReplaySSMLM(pretrained="tiny-gdn", precision="shared-nvfp4", buffer_len=4, batch_size=1)
    outs, made = {}, {}
    for lm, seed in ((fp32_lm, 0), (nvfp4_lm, 123)):  # a different global seed must not change the prompts
        start = len(built_caches)
        outs[lm.precision] = lm_eval.simple_evaluate(
            model=lm, tasks=[MC_TASK, COT_TASK], task_manager=_task_manager(), gen_kwargs={"max_gen_toks": 4},
            log_samples=True, bootstrap_iters=0, random_seed=seed,
        )
        made[lm.precision] = built_caches[start:]
    fp32, nvfp4 = outs["fp32"], outs["shared-nvfp4"]
    for out in (fp32, nvfp4):
        assert {"results", "samples", "configs", "versions", "n-samples", "config"} <= set(out)
        assert {"acc,none", "acc_norm,none"} <= set(out["results"][MC_TASK])
        assert {"exact_match,flexible-extract", "exact_match,strict-match"} <= set(out["results"][COT_TASK])
        assert out["results"][MC_TASK]["sample_len"] == out["results"][COT_TASK]["sample_len"] == 6
    for task in (MC_TASK, COT_TASK):
        assert _hashes(fp32["samples"][task]) == _hashes(nvfp4["samples"][task])
        choices = [[s["doc"]["choices"] for s in out["samples"][task]] for out in (fp32, nvfp4)]
        assert choices[0] == choices[1]

    # a cache per scoring batch (6 questions x 4 choices at batch size 1) and per generate call (6), each with the
    # arm's policy, each bound to the model and fed tokens
    for precision, caches in made.items():
        assert len(caches) == 6 * 4 + 6
        assert all(cache.policy == resolve_policy(precision) for cache in caches)
        assert all(cache.bound_model is not None and cache.stats()["tokens"] > 0 for cache in caches)
    assert nvfp4_lm.cache_stats["decode_steps"] > 0 and fp32_lm.cache_stats["decode_steps"] > 0

    # the state precision reaches the multiple-choice scores (they go through the decode path)
    fp32_ll = [r[0][0] for s in fp32["samples"][MC_TASK] for r in s["resps"]]
    nvfp4_ll = [r[0][0] for s in nvfp4["samples"][MC_TASK] for r in s["resps"]]
    assert max(abs(float(a) - float(b)) for a, b in zip(fp32_ll, nvfp4_ll, strict=True)) > 1e-4


@pytest.mark.parametrize(("batch_size", "prefill_chunk"), [(1, 0), (3, 0), (3, 5)])
def test_decode_path_scoring_matches_one_forward(fp32_lm, batch_size, prefill_chunk):
    """Under fp32, scoring through the cache (prefill + one token at a time, right-padded batches of mixed lengths)
    equals HFLM's one-forward scoring."""
    import torch

    gen = torch.Generator().manual_seed(batch_size * 10 + prefill_chunk)
    requests = []
    for i in range(7):
        ctx = torch.randint(3, 2000, (int(torch.randint(2, 30, (1,), generator=gen)),), generator=gen).tolist()
        cont = torch.randint(3, 2000, (int(torch.randint(1, 5, (1,), generator=gen)),), generator=gen).tolist()
        requests.append(((f"ctx{i}", f"cont{i}"), ctx, cont))
    requests.append((("ctx0", "first token"), requests[0][1], requests[0][2][:1]))
    old = fp32_lm.batch_size_per_gpu, fp32_lm.prefill_chunk
    fp32_lm.batch_size_per_gpu, fp32_lm.prefill_chunk = batch_size, prefill_chunk
    try:
        steps_before = fp32_lm.cache_stats["decode_steps"]
        through_cache = fp32_lm._loglikelihood_tokens(requests, disable_tqdm=True)
        assert fp32_lm.cache_stats["decode_steps"] > steps_before
        one_forward = HFLM._loglikelihood_tokens(fp32_lm, requests, disable_tqdm=True)
    finally:
        fp32_lm.batch_size_per_gpu, fp32_lm.prefill_chunk = old
    assert len(through_cache) == len(one_forward) == len(requests)
    for (ll_cache, greedy_cache), (ll_ref, greedy_ref) in zip(through_cache, one_forward, strict=True):
        assert ll_cache == pytest.approx(ll_ref, abs=1e-5)
        assert greedy_cache == greedy_ref


def test_model_args_are_cast():
    lm = ReplaySSMLM.__new__(ReplaySSMLM)
    with pytest.raises(ValueError, match="buffer_len"):
        ReplaySSMLM.__init__(lm, pretrained="tiny-gdn", buffer_len="sixteen")
    with pytest.raises(ValueError, match="score_through_cache"):
        ReplaySSMLM.__init__(lm, pretrained="tiny-gdn", score_through_cache="maybe")
    with pytest.raises(ValueError):
        ReplaySSMLM.__init__(lm, pretrained="tiny-gdn", precision="no-such-policy")


def test_launcher_runs_multiple_choice_task(tmp_path, built_caches):
    """``main(argv)`` is lm-eval's CLI with the model registered and the task folder included (no --include_path)."""
    start = len(built_caches)
    output = tmp_path / "results"
    main([
        "run", "--model", "hf-replayssm",
        "--model_args", "pretrained=tiny-gdn,precision=shared-fp8,buffer_len=4,score_through_cache=true",
        "--tasks", MC_TASK, "--metadata", json.dumps({"gpqa_path": str(FIXTURE)}),
        "--limit", "2", "--batch_size", "1", "--output_path", str(output), "--log_samples",
    ])
    results = sorted(output.rglob("results_*.json"))
    assert len(results) == 1
    data = json.loads(results[0].read_text())
    assert data["results"][MC_TASK]["sample_len"] == 2
    assert "acc,none" in data["results"][MC_TASK]
    assert data["config"]["model"] == "hf-replayssm"
    assert sorted(output.rglob(f"samples_{MC_TASK}_*.jsonl"))
    assert len(built_caches) - start == 2 * 4  # 2 questions x 4 choices, one cache each
    assert lm_eval.tasks.TaskManager is TaskManager  # the launcher put lm-eval's own class back


def test_cli_hands_lm_evals_own_options_through(monkeypatch):
    """``hf-replayssm lm-eval --model ...`` (lm-eval's options first, no ``run``) reaches lm-eval unchanged."""
    from hf_replayssm import cli
    from hf_replayssm.eval import lm_eval_plugin

    seen = []
    monkeypatch.setattr(lm_eval_plugin, "main", lambda argv: seen.append(argv) or 0)
    argv = ["--model", "hf-replayssm", "--model_args", "pretrained=tiny-gdn", "--tasks", "recall_d16"]
    assert cli.main(["lm-eval", *argv]) == 0
    assert cli.main(["lm-eval", "run", *argv]) == 0
    assert seen == [argv, ["run", *argv]]
