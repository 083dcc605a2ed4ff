"""``hf-replayssm eval compare``: paired comparison of lm-eval runs (accuracy ± SE, agreement, exact McNemar).

Two real runs of the plugin (tiny-gdn, fp32 vs shared-nvfp4, synthetic GPQA fixture) checked for consistency with
lm-eval's own aggregates, and hand-made runs with known counts checked against hand-computed statistics."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import pytest

pytest.importorskip("lm_eval", reason="lm-eval is not installed (pip install 'lm-eval==0.4.13')")

from hf_replayssm.eval.compare import compare_runs, load_run, main, mcnemar_exact, mean_stderr

pytestmark = pytest.mark.slow

FIXTURE = Path(__file__).parent / "fixtures" / "gpqa_synthetic.csv"
MC_TASK = "gpqa_diamond_zeroshot_local"
COT_TASK = "gpqa_diamond_cot_zeroshot_local"
LIMIT = 4


@pytest.fixture(scope="module")
def real_runs(tmp_path_factory):
    """Two lm-eval output folders as ``lm-eval run ... --output_path DIR --log_samples`` writes them (its evaluation
    tracker), from the plugin's model: fp32 and shared-nvfp4 on the fixture. (The launcher would do the same but
    indexes every lm-eval task first, which takes longer than the runs.)"""
    import lm_eval
    from lm_eval.loggers import EvaluationTracker
    from lm_eval.tasks import TaskManager

    from hf_replayssm.eval.lm_eval_plugin import TASKS_DIR

    root = tmp_path_factory.mktemp("lm_eval_runs")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_HUB_OFFLINE", "1")
        patch.setenv("HF_DATASETS_OFFLINE", "1")
        for precision in ("fp32", "shared-nvfp4"):
            tracker = EvaluationTracker(output_path=str(root / precision))
            results = lm_eval.simple_evaluate(
                model="hf-replayssm", model_args=f"pretrained=tiny-gdn,precision={precision},buffer_len=4",
                tasks=[MC_TASK], limit=LIMIT, batch_size=1, log_samples=True, evaluation_tracker=tracker,
                task_manager=TaskManager(include_path=str(TASKS_DIR), include_defaults=False,
                                         metadata={"gpqa_path": str(FIXTURE)}),
            )
            samples = results.pop("samples")
            tracker.save_results_aggregated(results=results, samples=samples)
            for task in results["configs"]:
                tracker.save_results_samples(task_name=task, samples=samples[task])
    return [root / "fp32", root / "shared-nvfp4"]


def test_compare_real_runs(real_runs, tmp_path, capsys):
    report = compare_runs(real_runs)  # the one task both runs logged; acc under filter none by default
    assert set(report) == {"task", "metric", "filter", "arms", "pairs", "markdown"}
    assert (report["task"], report["metric"], report["filter"]) == (MC_TASK, "acc", "none")
    assert [arm["name"] for arm in report["arms"]] == ["precision=fp32", "precision=shared-nvfp4"]
    for arm, run in zip(report["arms"], real_runs, strict=True):
        assert {"name", "path", "results_file", "samples_file", "model_args", "n", "correct", "accuracy", "stderr",
                "reported", "reported_stderr"} <= set(arm)
        own = json.loads(Path(arm["results_file"]).read_text())["results"][MC_TASK]
        assert Path(arm["results_file"]).parent.parent == run  # <output_path>/<model name>/results_<date>.json
        assert arm["n"] == own["sample_len"] == LIMIT
        assert arm["accuracy"] == pytest.approx(own["acc,none"]) == pytest.approx(arm["reported"])
        assert arm["stderr"] == pytest.approx(own["acc_stderr,none"])
        assert arm["correct"] == round(arm["accuracy"] * arm["n"])
    (pair,) = report["pairs"]
    assert {"a", "b", "n", "agree", "agreement", "both_correct", "both_wrong", "only_a", "only_b", "delta", "p_value",
            "unmatched_a", "unmatched_b"} <= set(pair)
    assert pair["n"] == LIMIT and pair["unmatched_a"] == pair["unmatched_b"] == 0
    assert 0.0 <= pair["agreement"] <= 1.0 and 0.0 <= pair["p_value"] <= 1.0
    assert pair["both_correct"] + pair["both_wrong"] + pair["only_a"] + pair["only_b"] == pair["n"]
    assert pair["p_value"] == mcnemar_exact(pair["only_a"], pair["only_b"])
    assert pair["delta"] == pytest.approx(report["arms"][1]["accuracy"] - report["arms"][0]["accuracy"])
    assert "| `precision=shared-nvfp4` |" in report["markdown"]

    # the command line: same report printed and written; a results file works as well as its folder
    out = tmp_path / "report.md"
    results_file = report["arms"][1]["results_file"]
    assert main([str(real_runs[0]), results_file, "--task", MC_TASK, "--metric", "acc_norm", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert out.read_text() == printed
    assert "`acc_norm` (filter `none`)" in printed and printed.count("| `precision=") == 2


# ---------------------------------------------------------------------- hand-made runs
def _write_run(folder: Path, model_args: dict, per_task: dict, date: str = "2026-01-01T00-00-00.000000") -> Path:
    """An lm-eval-shaped run: ``folder/model/results_<date>.json`` and ``samples_<task>_<date>.jsonl``.

    ``per_task``: {task: {filter: {metric: [0/1 per doc]}}}; doc ids 0.. and hashes derived from the doc id."""
    run = folder / "model"
    run.mkdir(parents=True, exist_ok=True)
    results = {}
    for task, by_filter in per_task.items():
        results[task] = {"alias": task}
        lines = []
        for filter_key, metrics in by_filter.items():
            for metric, scores in metrics.items():
                results[task][f"{metric},{filter_key}"] = sum(scores) / len(scores)
                results[task][f"{metric}_stderr,{filter_key}"] = mean_stderr(scores)
            n_docs = len(next(iter(metrics.values())))
            for doc_id in range(n_docs):
                line = {"doc_id": doc_id, "doc_hash": f"hash{doc_id}", "filter": filter_key, "metrics": list(metrics)}
                line.update({metric: scores[doc_id] for metric, scores in metrics.items()})
                lines.append(json.dumps(line))
        (run / f"samples_{task}_{date}.jsonl").write_text("\n".join(lines) + "\n")
    results_file = run / f"results_{date}.json"
    results_file.write_text(json.dumps({"results": results, "config": {"model": "hf-replayssm",
                                                                       "model_args": model_args}}))
    return results_file


def _paired(both: int, neither: int, only_a: int, only_b: int) -> tuple[list[float], list[float]]:
    a = [1.0] * both + [0.0] * neither + [1.0] * only_a + [0.0] * only_b
    b = [1.0] * both + [0.0] * neither + [0.0] * only_a + [1.0] * only_b
    return a, b


def test_mcnemar_and_stderr_by_hand():
    assert mcnemar_exact(8, 1) == pytest.approx(2 * (math.comb(9, 0) + math.comb(9, 1)) / 2**9)  # 0.0390625
    assert mcnemar_exact(1, 8) == mcnemar_exact(8, 1)
    assert mcnemar_exact(0, 5) == pytest.approx(2 / 32)
    assert mcnemar_exact(0, 0) == mcnemar_exact(4, 4) == mcnemar_exact(3, 4) == 1.0
    assert mcnemar_exact(30, 10) == pytest.approx(2 * sum(math.comb(40, k) for k in range(11)) / 2**40)
    assert 0.0 < mcnemar_exact(2000, 1000) < 1e-50  # exact integer sums, no overflow
    with pytest.raises(ValueError):
        mcnemar_exact(-1, 2)
    assert mean_stderr([1.0] * 7 + [0.0] * 3) == pytest.approx(math.sqrt(0.7 * 0.3 / 9))
    assert mean_stderr([1.0]) is None


def test_compare_hand_made_counts(tmp_path):
    a, b = _paired(both=6, neither=5, only_a=8, only_b=1)  # 20 questions
    run_a = _write_run(tmp_path / "a", {"pretrained": "m", "precision": "fp32"}, {"t": {"none": {"acc": a}}})
    run_b = _write_run(tmp_path / "b", {"pretrained": "m", "precision": "shared-nvfp4"}, {"t": {"none": {"acc": b}}})
    report = compare_runs([tmp_path / "a", run_b])
    arm_a, arm_b = report["arms"]
    assert (arm_a["name"], arm_b["name"]) == ("precision=fp32", "precision=shared-nvfp4")
    assert (arm_a["n"], arm_a["correct"], arm_a["accuracy"]) == (20, 14, pytest.approx(0.7))
    assert arm_a["stderr"] == pytest.approx(math.sqrt(0.7 * 0.3 / 19))  # sqrt(p(1-p)/(n-1)), lm-eval's SE
    assert arm_b["accuracy"] == pytest.approx(7 / 20)
    assert arm_b["stderr"] == pytest.approx(math.sqrt(0.35 * 0.65 / 19))
    assert arm_a["results_file"] == str(run_a)
    (pair,) = report["pairs"]
    assert (pair["n"], pair["agree"], pair["only_a"], pair["only_b"]) == (20, 11, 8, 1)
    assert pair["agreement"] == pytest.approx(11 / 20)
    assert pair["delta"] == pytest.approx(-7 / 20)
    assert pair["p_value"] == pytest.approx(2 * (1 + 9) / 512)
    assert "| `precision=shared-nvfp4` | 0.3500 | 0.1094 | 20 | 20 | -0.3500 | 0.5500 | 1/8 | 0.039 |" in (
        report["markdown"])


def test_compare_reads_gzipped_sample_logs(tmp_path):
    """Runs kept in a repository have their sample logs gzipped; the paired test must still see them (it used to
    find no samples and drop the p-value without a word)."""
    a, b = _paired(both=6, neither=5, only_a=8, only_b=1)
    _write_run(tmp_path / "a", {"pretrained": "m", "precision": "fp32"}, {"t": {"none": {"acc": a}}})
    _write_run(tmp_path / "b", {"pretrained": "m", "precision": "shared-nvfp4"}, {"t": {"none": {"acc": b}}})
    plain = compare_runs([tmp_path / "a", tmp_path / "b"])
    for log in (tmp_path / "b").rglob("samples_*.jsonl"):
        log.with_name(log.name + ".gz").write_bytes(gzip.compress(log.read_bytes()))
        log.unlink()
    zipped = compare_runs([tmp_path / "a", tmp_path / "b"])
    assert zipped["pairs"][0]["p_value"] == plain["pairs"][0]["p_value"] == pytest.approx(2 * (1 + 9) / 512)
    assert zipped["pairs"][0]["only_a"] == 8


def test_compare_matches_docs_and_three_arms(tmp_path):
    """Questions are paired on doc_id + doc_hash (a shorter run pairs on its docs only); every pair is reported."""
    a, b = _paired(both=3, neither=3, only_a=0, only_b=4)
    for name, scores in (("a", a), ("b", b), ("c", a[:6])):
        _write_run(tmp_path / name, {"pretrained": "m", "precision": name}, {"t": {"none": {"acc": scores}}})
    report = compare_runs([tmp_path / "a", tmp_path / "b", tmp_path / "c"], names=["base", "other", "short"])
    assert [arm["name"] for arm in report["arms"]] == ["base", "other", "short"]
    pairs = {(p["a"], p["b"]): p for p in report["pairs"]}
    assert set(pairs) == {("base", "other"), ("base", "short"), ("other", "short")}
    assert pairs["base", "other"]["p_value"] == pytest.approx(2 / 16)
    assert (pairs["base", "short"]["n"], pairs["base", "short"]["unmatched_a"]) == (6, 4)
    assert pairs["base", "short"]["agreement"] == 1.0
    assert "Per-question agreement" in report["markdown"]


def test_compare_generation_filters_and_errors(tmp_path):
    strict_a, strict_b = _paired(both=0, neither=4, only_a=0, only_b=0)
    flex_a, flex_b = _paired(both=1, neither=1, only_a=0, only_b=2)
    for name, strict, flex in (("a", strict_a, flex_a), ("b", strict_b, flex_b)):
        _write_run(tmp_path / name, {"precision": name}, {
            "cot": {"strict-match": {"exact_match": strict}, "flexible-extract": {"exact_match": flex}},
            "mc": {"none": {"acc": [1.0, 0.0], "acc_norm": [0.0, 0.5]}},
        })
    runs = [tmp_path / "a", tmp_path / "b"]
    with pytest.raises(ValueError, match="--task"):
        compare_runs(runs)
    report = compare_runs(runs, task="cot")
    assert (report["metric"], report["filter"]) == ("exact_match", "strict-match")  # the first filter reported
    assert report["arms"][1]["accuracy"] == 0.0
    report = compare_runs(runs, task="cot", metric="exact_match,flexible-extract")
    assert [arm["accuracy"] for arm in report["arms"]] == [0.25, 0.75]
    assert report["pairs"][0]["only_b"] == 2
    assert compare_runs(runs, task="mc")["metric"] == "acc"
    with pytest.raises(ValueError, match="0/1"):
        compare_runs(runs, task="mc", metric="acc_norm")
    with pytest.raises(ValueError, match="no samples file"):
        compare_runs(runs, task="missing")
    with pytest.raises(ValueError, match="no per-sample value"):
        compare_runs(runs, task="cot", metric="acc,strict-match")
    with pytest.raises(ValueError, match="at least two"):
        compare_runs(runs[:1])
    _write_run(tmp_path / "a", {"precision": "a"}, {"mc": {"none": {"acc": [1.0]}}}, date="2026-01-02T00-00-00.0")
    with pytest.raises(ValueError, match="2 results files"):
        load_run(tmp_path / "a")
    # an --output_path ending in .json: <stem>_<date>.json with the samples beside it, found from its folder
    folder = tmp_path / "a" / "model"
    (folder / "results_2026-01-02T00-00-00.0.json").rename(folder / "x_2026-01-02T00-00-00.0.json")
    (folder / "results_2026-01-01T00-00-00.000000.json").unlink()
    assert load_run(tmp_path / "a")["results_file"].endswith("x_2026-01-02T00-00-00.0.json")
    with pytest.raises(SystemExit):
        main([str(tmp_path / "nowhere"), str(tmp_path / "b")])
