"""Synthetic recall task: seeded generation, distances in bundled-tokenizer tokens, lm-eval loading, a tiny run
through the hf-replayssm model, and the accuracy-against-distance table."""

from __future__ import annotations

import json

import pytest

from hf_replayssm.eval import recall
from hf_replayssm.models import bundled_path


@pytest.fixture(scope="module")
def bundled_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(bundled_path("tiny-gdn"))


def _n_tokens(tokenizer, text: str) -> int:
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def test_generation_is_deterministic_and_seeded():
    first = recall.make_docs(256, n_docs=6, seed=7)
    assert first == recall.make_docs(256, n_docs=6, seed=7)
    other = recall.make_docs(256, n_docs=6, seed=8)
    assert [d["context"] for d in other] != [d["context"] for d in first]
    for doc in first:
        assert len(set(doc["choices"])) == recall.NUM_CHOICES
        assert doc["choices"][doc["answer"]] == doc["key"]
        assert doc["context"].startswith(recall.STATEMENT.format(key=doc["key"]))
        assert doc["context"].endswith(recall.QUESTION)
        body = doc["context"][len(recall.STATEMENT.format(key=doc["key"])):]
        assert not any(name in body for name in recall.NAMES)  # the only name in the text is the stated one
    # the stated name is spread over the candidate positions (a position-only guess is not rewarded)
    many = recall.make_docs(16, n_docs=40, seed=7)
    assert len({d["answer"] for d in many}) == recall.NUM_CHOICES
    # paired across distances: same names, and the shorter filler is a prefix of the longer one
    short, long = recall.make_doc(3, 64, seed=7), recall.make_doc(3, 1024, seed=7)
    assert (short["key"], short["choices"]) == (long["key"], long["choices"])
    short_filler = short["context"][: -len(recall.QUESTION)].rstrip(".")
    assert long["context"].startswith(short_filler)


@pytest.mark.parametrize("distance", recall.DISTANCES)
def test_distances_in_bundled_tokens(bundled_tokenizer, distance):
    """The filler between the statement and the question is the stated number of tokens (within 4) and exactly the
    recorded ``filler_tokens``, measured on the whole context with the bundled tokenizer."""
    for doc in recall.make_docs(distance, n_docs=5, seed=11):
        statement = recall.STATEMENT.format(key=doc["key"])
        measured = (_n_tokens(bundled_tokenizer, doc["context"]) - _n_tokens(bundled_tokenizer, statement)
                    - _n_tokens(bundled_tokenizer, recall.QUESTION))
        assert measured == doc["filler_tokens"]
        assert abs(measured - distance) <= 4, (distance, measured)


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="distance"):
        recall.load(recall_docs=2)
    with pytest.raises(ValueError, match="integers"):
        recall.load(distance="far")
    with pytest.raises(ValueError, match="at least 2"):
        recall.make_doc(0, 1)
    with pytest.raises(FileNotFoundError, match="recall_tokenizer"):
        recall.load(distance=16, recall_docs=1, recall_tokenizer="/no/such/tokenizer")


def test_load_returns_dataset_with_metadata_extras():
    pytest.importorskip("datasets", reason="datasets is not installed (it comes with lm-eval)")
    dataset = recall.load(distance=64, recall_docs=3, recall_seed=5, version=1.0, pretrained="tiny-gdn")["test"]
    assert len(dataset) == 3
    assert dataset[1] == recall.make_doc(1, 64, seed=5)


@pytest.mark.slow
def test_lm_eval_run_and_distance_table(tmp_path, monkeypatch):
    """The tasks load in lm-eval; two policies run through the hf-replayssm model on the bundled tiny-gdn (saved as
    the CLI saves them) and give an accuracy per distance; the table has a row per distance and a column per arm,
    paired on the same documents."""
    pytest.importorskip("lm_eval", reason="lm-eval is not installed (pip install 'lm-eval==0.4.13')")
    import lm_eval
    from lm_eval.loggers import EvaluationTracker
    from lm_eval.tasks import TaskManager

    from hf_replayssm.eval.lm_eval_plugin import TASKS_DIR

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    manager = TaskManager(include_path=str(TASKS_DIR), include_defaults=False,
                          metadata={"recall_docs": 3, "recall_seed": 2})
    assert {f"recall_d{d}" for d in recall.DISTANCES} | {"recall"} <= set(manager.all_tasks)

    runs, prompts = [], []
    for precision in ("fp32", "shared-nvfp4"):
        out = tmp_path / precision
        tracker = EvaluationTracker(output_path=str(out))
        result = lm_eval.simple_evaluate(
            model="hf-replayssm", model_args=f"pretrained=tiny-gdn,precision={precision},buffer_len=4",
            tasks=["recall_d16", "recall_d64"], task_manager=manager, batch_size=12, log_samples=True,
            bootstrap_iters=0, evaluation_tracker=tracker,
        )
        samples = result.pop("samples")
        tracker.save_results_aggregated(results=result, samples=samples)
        for task in result["configs"]:
            tracker.save_results_samples(task_name=task, samples=samples[task])
        for task in ("recall_d16", "recall_d64"):
            assert result["results"][task]["sample_len"] == 3
            assert 0.0 <= result["results"][task]["acc,none"] <= 1.0
        prompts.append([(s["doc_hash"], s["arguments"]) for task in sorted(samples) for s in samples[task]])
        runs.append(out)
    assert prompts[0] == prompts[1]

    table = recall.recall_table(runs)
    assert table["distances"] == [16, 64]
    assert table["arms"] == ["precision=fp32", "precision=shared-nvfp4"]
    for distance in (16, 64):
        for arm in table["arms"]:
            cell = table["cells"][(distance, arm)]
            assert cell["n"] == 3 and 0.0 <= cell["accuracy"] <= 1.0
        assert table["cells"][(distance, table["arms"][1])]["p_value"] is not None
    lines = table["markdown"].splitlines()
    assert "| distance (tokens) | precision=fp32 | precision=shared-nvfp4 |" in lines
    assert sum(line.startswith(("| 16 |", "| 64 |")) for line in lines) == 2
    other = tmp_path / "results_2026-01-01T00-00-00.json"
    other.write_text(json.dumps({"results": {"gpqa_diamond_zeroshot_local": {"acc,none": 0.5}}, "config": {}}))
    with pytest.raises(ValueError, match="no recall_dN task"):
        recall.recall_table(other)
