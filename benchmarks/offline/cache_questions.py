"""What the cache questions ``generate`` asks every decode step cost on the host: stock static cache against
ReplayCache.

transformers' decode loop asks its cache ``is_compileable`` (twice), ``is_linear`` (twice) and ``get_seq_length``
every step, outside the compiled call; at batch 1 the step is host-bound. This script fills both caches with a
short ``generate`` on a tiny model and times each question (best of ``--repeats`` blocks of 2000 calls). Runs on the
CPU in a few seconds per model:

    python benchmarks/offline/cache_questions.py --models nemotron_h,qwen3_5_text,kimi_linear
"""

from __future__ import annotations

import argparse
import timeit

import torch

# this folder's result writer (a script's folder is on its import path)
from guard_check import write_rows
from transformers import StaticCache

from hf_replayssm import ReplayCache
from hf_replayssm.tiny import tiny_model

QUESTIONS = {
    "is_compileable": lambda cache: cache.is_compileable,
    "is_linear": lambda cache: cache.is_linear,
    "get_seq_length": lambda cache: cache.get_seq_length(),
}


def measure(model_type: str, repeats: int = 5, number: int = 2000) -> dict:
    """Microseconds per call of each question, stock and ReplayCache, on caches that served a generate."""
    model = tiny_model(model_type, seed=0, initializer_range=0.2)
    prompt = torch.randint(3, model.config.vocab_size, (1, 11), generator=torch.Generator().manual_seed(1))
    caches = {"stock": StaticCache(config=model.config, max_cache_len=40), "replay": ReplayCache(4, max_cache_len=40)}
    with torch.no_grad():
        for cache in caches.values():
            model.generate(prompt, past_key_values=cache, do_sample=False, max_new_tokens=3)
    result = {"model": model_type}
    for name, ask in QUESTIONS.items():
        for arm, cache in caches.items():
            best = min(timeit.repeat(lambda c=cache, q=ask: q(c), number=number, repeat=repeats))
            result[f"{name}_{arm}_us"] = best / number * 1e6
    return result


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="nemotron_h,qwen3_5_text,kimi_linear")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", help="JSON results")
    args = parser.parse_args(argv)
    rows = [measure(model_type, args.repeats) for model_type in args.models.split(",")]
    for row in rows:
        print(f"{row['model']:14s} " + "  ".join(
            f"{name} {row[f'{name}_stock_us']:.2f} / {row[f'{name}_replay_us']:.2f} us" for name in QUESTIONS))
    write_rows(args.out, rows)
    return rows


if __name__ == "__main__":
    main()
