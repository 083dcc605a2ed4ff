"""Data loading and document processing for the local-file GPQA tasks (``gpqa_diamond_*_local``).

``load`` reads GPQA's own file format (the Hub CSV, or JSON/JSONL with the same columns: ``Question``,
``Correct Answer``, ``Incorrect Answer 1..3``, and optionally ``Record ID``, ``High-level domain``, ...) from the path
given as ``--metadata '{"gpqa_path": "PATH"}'`` (or ``$GPQA_PATH``). GPQA is gated on the Hub and its authors ask
that questions not be published in plain text, so nothing here ships or downloads any of it.

``process_docs`` follows lm-eval's gpqa zeroshot/cot_zeroshot ``process_docs`` (same text clean-up, same output
fields), except for the shuffle of the four answers: upstream uses the global ``random`` module, so the answer
letters depend on which tasks loaded before and in what order. Here each question's choices are shuffled by a
``random.Random`` seeded from a hash of the question text, so every run, arm and precision policy sees identical
prompts and targets.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import random
from pathlib import Path

ANSWER_COLUMNS = ("Incorrect Answer 1", "Incorrect Answer 2", "Incorrect Answer 3", "Correct Answer")
REQUIRED_COLUMNS = ("Question", *ANSWER_COLUMNS)


def preprocess(text) -> str:
    """lm-eval's gpqa clean-up of one answer."""
    if text is None:
        return " "
    text = text.strip()
    text = text.replace(" [title]", ". ")
    return text.replace("  ", " ")


def shuffle_seed(question: str) -> int:
    """A seed that depends only on the question text (stable across processes, unlike ``hash``)."""
    return int.from_bytes(hashlib.sha256(question.encode("utf-8")).digest()[:8], "big")


def shuffled_choices(doc: dict) -> tuple[list[str], int]:
    """The four cleaned answers in this question's fixed shuffled order, and the index of the correct one."""
    choices = [preprocess(doc[column]) for column in ANSWER_COLUMNS]
    correct = choices[-1]
    random.Random(shuffle_seed(doc["Question"])).shuffle(choices)
    return choices, choices.index(correct)


def _read_rows(path: Path) -> list[dict]:
    suffix = path.suffix.lower()
    if suffix == ".csv":
        with path.open(newline="", encoding="utf-8") as handle:
            return list(csv.DictReader(handle))
    if suffix == ".jsonl":
        with path.open(encoding="utf-8") as handle:
            return [json.loads(line) for line in handle if line.strip()]
    if suffix == ".json":
        data = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(data, dict):  # {"train": [...]} or column-oriented {"Question": [...], ...}
            data = data.get("train", data)
        if isinstance(data, dict):
            keys = list(data)
            data = [dict(zip(keys, values, strict=True)) for values in zip(*data.values(), strict=True)]
        return list(data)
    raise ValueError(f"gpqa_path: expected a .csv, .jsonl or .json file in GPQA's columns, got {path}")


def load(gpqa_path: str | None = None, **kwargs):
    """``custom_dataset`` of the local GPQA tasks: ``DatasetDict({"train": ...})`` from a local GPQA file.

    lm-eval calls it with the task metadata (TaskManager / ``--metadata`` entries, and on the CLI the model args) as
    keyword arguments, hence ``**kwargs``. All columns are read as strings."""
    import datasets

    gpqa_path = gpqa_path or os.environ.get("GPQA_PATH")
    if not gpqa_path:
        raise ValueError(
            "the local GPQA tasks read GPQA from a file: pass "
            "--metadata '{\"gpqa_path\": \"/path/to/gpqa_diamond.csv\"}' "
            "(TaskManager(metadata={\"gpqa_path\": ...}) in Python) or set GPQA_PATH"
        )
    path = Path(gpqa_path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"gpqa_path: no such file: {path}")
    rows = _read_rows(path)
    if not rows:
        raise ValueError(f"gpqa_path: {path} holds no rows")
    missing = [column for column in REQUIRED_COLUMNS if column not in rows[0]]
    if missing:
        raise ValueError(f"gpqa_path: {path} lacks GPQA's columns {missing} (it has {sorted(rows[0])})")
    columns = list(dict.fromkeys(key for row in rows for key in row))
    table = {column: ["" if row.get(column) is None else str(row.get(column)) for row in rows] for column in columns}
    return datasets.DatasetDict({"train": datasets.Dataset.from_dict(table)})


def process_docs(dataset):
    """lm-eval's gpqa ``process_docs`` output (``choice1..4``, ``choices``, ``answer`` as ``"(A)"``..``"(D)"``) with
    the per-question seeded shuffle."""

    def _process_doc(doc):
        choices, correct = shuffled_choices(doc)
        return {
            "choice1": choices[0],
            "choice2": choices[1],
            "choice3": choices[2],
            "choice4": choices[3],
            "choices": choices,
            "answer": f"({chr(65 + correct)})",
        }

    return dataset.map(_process_doc)
