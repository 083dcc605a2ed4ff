"""Synthetic recall task: a name is stated, N tokens of filler follow, then a question whose answer is the name.

Document 3 at distance 16 (seed 1234) reads::

    Mark me: my name is Hector.
    Die less weep came lady my!          <- filler: 16 tokens of the bundled tokenizer
    Let why proud stand poor.
    What is my name? My name is

and is scored as multiple choice by log-likelihood over four candidate names (`` Puck``, `` Hector``, ...), one of
which is the stated name: chance is 25 %. A model that keeps what it read (in its recurrent state or its attention
cache) picks the stated name. Because the stated name is uniform over the four candidates, a model that only follows
its prior over names also scores 25 % on average.

* Everything is deterministic from the seed (``recall_seed``, default 1234): document ``i`` has the same name and
  candidates at every distance, and its filler at distance N is a prefix (ended with a full stop) of the same
  seeded word stream, so accuracy against distance is a paired comparison.
* The text never depends on a tokenizer except where the filler stops: it stops once the filler reaches N tokens of
  the counting tokenizer (default: the bundled models' byte-level BPE; ``recall_tokenizer`` takes another tokenizer
  folder or ``tokenizer.json``). Each document records the measured ``filler_tokens``.
* Filler words come from a fixed list of Shakespearean words that holds no candidate name and not the word "name".

lm-eval tasks (in ``tasks/``): ``recall_d16``, ``recall_d64``, ``recall_d256``, ``recall_d1024`` (the group
``recall``) and ``recall_d4096``; metric ``acc``. Options through ``--metadata '{...}'``: ``recall_docs`` (documents
per distance, default 200), ``recall_seed``, ``recall_tokenizer``. State precision only enters the scores when the
filler goes through the cache: use the ``hf-replayssm`` model with ``prefill_chunk=1`` (every token a decode step)
or a small chunk.

Accuracy against distance, one column per arm (``--log_samples`` runs)::

    python -m hf_replayssm.eval.recall table results/fp32 results/shared-nvfp4 --out recall.md
    python -m hf_replayssm.eval.recall preview --distance 64     # print one document

The task YAMLs name the loader as ``!function hf_replayssm.eval.recall.load`` (lm-eval 0.4.13 imports it as a module).
"""

from __future__ import annotations

import argparse
import math
import random
import re
import sys
from pathlib import Path

DISTANCES = (16, 64, 256, 1024, 4096)
DEFAULT_DOCS = 200
DEFAULT_SEED = 1234
NUM_CHOICES = 4
TASK_PREFIX = "recall_d"

STATEMENT = "Mark me: my name is {key}."
QUESTION = "\nWhat is my name? My name is"

# Character names of at most two tokens in the bundled tokenizer (the text itself never depends on a tokenizer).
NAMES = (
    "Caesar", "Antony", "John", "Henry", "Warwick", "York", "Romeo", "Juliet", "Lear", "Cassio",
    "Brutus", "Puck", "Hal", "Kent", "Edgar", "Toby", "Andrew", "Hero", "Richard", "Hector",
)

_FILLER_TEXT = """
good lord sweet night day heart love king queen crown sword blood death life time world heaven earth sea fire
air wind storm sun moon star light dark eye eyes hand hands tongue head face soul mind grace honour fair foul
true false noble gentle brave poor old young father mother brother sister son daughter friend foe master
servant soldier fool knave villain lady gentleman court house land field war peace battle hour morning even
thou thee thy thine you your my mine our his her their we they he she it this that these those what which
who whom where when how why if then so yet but and or nor for with without upon within from into unto before
after against among doth hath dost art shall will would should must may might can could let make made speak
spoke say said tell hear heard see saw look come came go went stay rest sleep wake die live fly fall rise
stand keep give take bring leave find lose know think fear hope pray swear weep laugh sing play fight kill
save serve rule bear hold call send seek more most much many little less great small high low long short
full empty new dead alive cold warm bright deep sad merry proud wise mad strange here there now never ever
still again away forth indeed alas nay ay well too very all some none each every own such no not
"""
FILLER_WORDS = tuple(_FILLER_TEXT.split())

_ENDINGS = (",", ",", ",", ";", ".", ".", "!", "?", ":")
_CLOSING = ".!?"


# ---------------------------------------------------------------------- token counting
class TokenCounter:
    """Counts tokens of text pieces that start at a pre-token boundary (a space, a newline or punctuation), caching
    per piece. For byte-level BPE (the bundled tokenizer) the count of a concatenation is exactly the sum of the
    pieces' counts; for other tokenizers it is an estimate."""

    def __init__(self, encode):
        self._encode = encode
        self._cache: dict[str, int] = {}

    def __call__(self, text: str) -> int:
        count = self._cache.get(text)
        if count is None:
            count = self._cache[text] = len(self._encode(text))
        return count

    @classmethod
    def from_path(cls, path: str | Path | None = None) -> TokenCounter:
        """``path``: a tokenizer folder or ``tokenizer.json``; None = the bundled models' tokenizer."""
        if path is None:
            from ..models import bundled_path

            path = bundled_path("tiny-gdn") / "tokenizer.json"
        path = Path(path).expanduser()
        if path.is_file():
            from tokenizers import Tokenizer

            tokenizer = Tokenizer.from_file(str(path))
            return cls(lambda text: tokenizer.encode(text, add_special_tokens=False).ids)
        if path.is_dir():
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(str(path))
            return cls(lambda text: tokenizer(text, add_special_tokens=False)["input_ids"])
        raise FileNotFoundError(f"recall_tokenizer: no tokenizer folder or tokenizer.json at {path}")


# ---------------------------------------------------------------------- generation
def _rng(seed: int, index: int, stream: str) -> random.Random:
    # a str seed is hashed with SHA-512 by random.Random: stable across processes (unlike hash())
    return random.Random(f"{seed}:{index}:{stream}")


def filler_pieces(rng: random.Random):
    """An endless verse-like stream: each line ``\\nWord word ... word`` then a punctuation mark, one piece per word
    or mark (every piece starts at a pre-token boundary)."""
    while True:
        words = [rng.choice(FILLER_WORDS) for _ in range(rng.randint(5, 9))]
        yield "\n" + words[0].capitalize()
        for word in words[1:]:
            yield " " + word
        yield rng.choice(_ENDINGS)


def make_filler(seed: int, index: int, n_tokens: int, count: TokenCounter) -> tuple[str, int]:
    """(filler text, its token count): the seeded stream of document ``index`` cut at about ``n_tokens`` tokens
    (within a few) and ended with a full stop."""
    if n_tokens < 2:
        raise ValueError(f"distance must be at least 2 tokens, got {n_tokens}")
    pieces, total = [], 0
    for piece in filler_pieces(_rng(seed, index, "filler")):
        is_mark = piece in _ENDINGS
        if total + count(".") >= n_tokens and not is_mark:
            break
        pieces.append(piece)
        total += count(piece)
    while pieces[-1] in _ENDINGS:
        total -= count(pieces.pop())
    pieces.append(".")
    total += count(".")
    return "".join(pieces), total


def make_doc(index: int, distance: int, seed: int = DEFAULT_SEED, count: TokenCounter | None = None) -> dict:
    """Document ``index`` at ``distance`` filler tokens: ``context``, ``choices`` (candidate names), ``answer``
    (index of the stated name), ``key``, ``distance``, ``filler_tokens`` (measured), ``doc_index``."""
    count = count or TokenCounter.from_path()
    rng = _rng(seed, index, "key")
    choices = rng.sample(NAMES, NUM_CHOICES)
    answer = rng.randrange(NUM_CHOICES)
    key = choices[answer]
    filler, filler_tokens = make_filler(seed, index, distance, count)
    return {
        "context": STATEMENT.format(key=key) + filler + QUESTION,
        "choices": choices,
        "answer": answer,
        "key": key,
        "distance": distance,
        "filler_tokens": filler_tokens,
        "doc_index": index,
    }


def make_docs(distance: int, n_docs: int = DEFAULT_DOCS, seed: int = DEFAULT_SEED,
              count: TokenCounter | None = None) -> list[dict]:
    if n_docs < 1:
        raise ValueError(f"recall_docs must be >= 1, got {n_docs}")
    count = count or TokenCounter.from_path()
    return [make_doc(i, distance, seed, count) for i in range(n_docs)]


def load(distance=None, recall_docs=DEFAULT_DOCS, recall_seed=DEFAULT_SEED, recall_tokenizer=None, **_metadata):
    """``custom_dataset`` of the recall tasks: ``DatasetDict({"test": ...})`` of ``recall_docs`` documents at
    ``distance`` filler tokens. lm-eval passes the task metadata (``--metadata``, and on the CLI the model args) as
    keyword arguments too, hence ``**_metadata``."""
    if distance is None:
        raise ValueError("the recall task needs dataset_kwargs: {distance: N} in its YAML")
    try:
        distance, recall_docs, recall_seed = int(distance), int(recall_docs), int(recall_seed)
    except (TypeError, ValueError):
        raise ValueError(f"distance, recall_docs and recall_seed must be integers, got {distance!r}, "
                         f"{recall_docs!r}, {recall_seed!r}") from None
    docs = make_docs(distance, recall_docs, recall_seed, TokenCounter.from_path(recall_tokenizer))
    import datasets  # lm-eval's dependency

    columns = {name: [doc[name] for doc in docs] for name in docs[0]}
    return datasets.DatasetDict({"test": datasets.Dataset.from_dict(columns)})


# ---------------------------------------------------------------------- accuracy against distance
def _distance_of(task: str) -> int | None:
    match = re.fullmatch(rf"{TASK_PREFIX}(\d+)", task)
    return int(match.group(1)) if match else None


def _binomial_se(p: float, n: int) -> float | None:
    return math.sqrt(p * (1 - p) / (n - 1)) if n > 1 else None


def recall_table(paths, names: list[str] | None = None, metric: str = "acc") -> dict:
    """Accuracy against distance for lm-eval runs of the recall tasks (results files or ``--output_path`` folders).

    Returns ``{"distances", "arms", "cells", "markdown"}``; ``cells[(distance, arm)]`` holds ``accuracy``, ``stderr``
    (sqrt(p(1-p)/(n-1)), lm-eval's formula), ``n`` and, for arms after the first when both runs logged samples,
    ``p_value`` (exact McNemar against the first arm on the same documents)."""
    from .compare import _arm_names, compare_runs, load_run

    paths = [paths] if isinstance(paths, (str, Path)) else list(paths)
    if not paths:
        raise ValueError("recall_table needs at least one run")
    runs = [load_run(p) for p in paths]
    arms = _arm_names(runs, names) if len(runs) > 1 or names else [Path(runs[0]["path"]).name or runs[0]["path"]]
    distances = sorted({d for run in runs for task in run["results"]["results"] if (d := _distance_of(task))})
    if not distances:
        raise ValueError(f"no {TASK_PREFIX}N task in the runs' results")
    cells: dict[tuple[int, str], dict] = {}
    for distance in distances:
        task = f"{TASK_PREFIX}{distance}"
        for run, arm in zip(runs, arms, strict=True):
            result = run["results"]["results"].get(task)
            if result is None or not isinstance(result.get(f"{metric},none"), (int, float)):
                continue
            p = float(result[f"{metric},none"])
            n = int(run["results"].get("n-samples", {}).get(task, {}).get("effective", result.get("sample_len", 0)))
            cells[(distance, arm)] = {"accuracy": p, "n": n, "stderr": _binomial_se(p, n), "p_value": None}
        with_samples = [i for i, run in enumerate(runs)
                        if task in run["samples_files"] and (distance, arms[i]) in cells]
        if len(with_samples) > 1 and with_samples[0] == 0:
            report = compare_runs([paths[i] for i in with_samples], task=task, metric=metric,
                                  names=[arms[i] for i in with_samples])
            for pair in report["pairs"]:
                if pair["a"] == arms[0]:
                    cells[(distance, pair["b"])]["p_value"] = pair["p_value"]
    table = {"distances": distances, "arms": arms, "cells": cells}
    table["markdown"] = table_markdown(table, metric)
    return table


def table_markdown(table: dict, metric: str = "acc") -> str:
    """Rows: distance in filler tokens; columns: arms; cells: accuracy ± SE in percent (McNemar p against the first
    arm in brackets where samples were logged)."""
    arms = table["arms"]
    lines = [f"{metric} (%) ± SE by distance (chance 25 %; p: exact McNemar vs {arms[0]})", "",
             "| distance (tokens) | " + " | ".join(a.replace("|", "\\|") for a in arms) + " |",
             "|---:|" + "---:|" * len(arms)]
    for distance in table["distances"]:
        row = []
        for arm in arms:
            cell = table["cells"].get((distance, arm))
            if cell is None:
                row.append("—")
                continue
            text = f"{100 * cell['accuracy']:.1f}"
            if cell["stderr"] is not None:
                text += f" ± {100 * cell['stderr']:.1f}"
            if cell["p_value"] is not None:
                text += f" (p={cell['p_value']:.2g})"
            row.append(text)
        lines.append(f"| {distance} | " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------- command line
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m hf_replayssm.eval.recall", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    table = commands.add_parser("table", help="accuracy against distance per arm (Markdown)")
    table.add_argument("runs", nargs="+", help="lm-eval results files or --output_path folders, one per arm")
    table.add_argument("--names", help="comma-separated arm names (default: the model_args that differ)")
    table.add_argument("--metric", default="acc", help="acc (default) or acc_norm")
    table.add_argument("--out", type=Path, help="also write the Markdown here")
    preview = commands.add_parser("preview", help="print one document")
    preview.add_argument("--distance", type=int, default=64)
    preview.add_argument("--index", type=int, default=0)
    preview.add_argument("--seed", type=int, default=DEFAULT_SEED)
    preview.add_argument("--tokenizer", help="counting tokenizer (folder or tokenizer.json; default: bundled)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "preview":
        doc = make_doc(args.index, args.distance, args.seed, TokenCounter.from_path(args.tokenizer))
        print(doc["context"] + " [" + " | ".join(doc["choices"]) + f"]  answer: {doc['key']}, "
              f"filler tokens: {doc['filler_tokens']}")
        return 0
    names = [n.strip() for n in args.names.split(",")] if args.names else None
    markdown = recall_table(args.runs, names=names, metric=args.metric)["markdown"]
    if args.out:
        args.out.write_text(markdown, encoding="utf-8")
    sys.stdout.write(markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
