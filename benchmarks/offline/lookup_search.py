"""What prompt lookup's draft search costs a speculative round: transformers' own search on the device against
``HostPromptLookup`` (a host copy of the ids), on the ids of a real generate() call.

A compiled prompt-lookup round at batch 1 costs 1.3 ms more than a compiled greedy step on the H100 (run 225), most of
it host work outside the forward. transformers' ``PromptLookupCandidateGenerator.get_candidates`` reads the device
many times a round (``nonzero`` per n-gram size, every match it tries, each draft token against the logits processors
even when their list is empty, the end-of-sequence cut). This script runs generate() with prompt lookup on a ReplayCache
(the bundled ``tiny-gdn-copy`` on a repeated passage, as the speculative bench does), keeps the ids of every round, then
times both searches over those rounds (passes alternate between the two; the best pass counts) and checks that they
draft the same tokens every round:

    python benchmarks/offline/lookup_search.py --device cuda --out lookup_search.json

On a GPU the times include the device reads (the ids live there); on the CPU only the host work.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from transformers import LogitsProcessorList
from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

from hf_replayssm import ReplayCache
from hf_replayssm.bench.generate import speculative_prompt
from hf_replayssm.bench.step import _sync
from hf_replayssm.host_lookup import HostPromptLookup
from hf_replayssm.models import load_model


def recorded_rounds(model, ids: torch.Tensor, new_tokens: int, lookup: int) -> tuple[list[torch.Tensor], dict]:
    """The ids each round of a prompt-lookup generate() on a ReplayCache searched, and the search's settings."""
    rounds, seen = [], {}
    original = HostPromptLookup.get_candidates

    def recording(self, input_ids, *args, **kwargs):
        rounds.append(input_ids.clone())
        seen.update(num_output_tokens=self.generator.num_output_tokens, max_length=self.generator.max_length,
                    max_matching_ngram_size=self.generator.max_matching_ngram_size,
                    eos_token_id=self.generator.eos_token_id)
        return original(self, input_ids, *args, **kwargs)

    HostPromptLookup.get_candidates = recording
    try:
        model.generate(ids, past_key_values=ReplayCache(16), do_sample=False, max_new_tokens=new_tokens,
                       prompt_lookup_num_tokens=lookup)
    finally:
        HostPromptLookup.get_candidates = original
    return rounds, seen


def _stock_generator(settings: dict, vocab: int) -> PromptLookupCandidateGenerator:
    # generate() passes its processor list, empty for plain greedy decoding
    return PromptLookupCandidateGenerator(logits_processor=LogitsProcessorList(), vocab_size=vocab, **settings)


def _pass(search, rounds: list[torch.Tensor], device: torch.device) -> tuple[float, list[int]]:
    drafted = []
    _sync(device)
    start = time.perf_counter()
    for ids in rounds:
        candidates, _ = search(ids)
        drafted.append(candidates.shape[1] - ids.shape[1])
    _sync(device)
    return time.perf_counter() - start, drafted


def measure(model, rounds: list[torch.Tensor], settings: dict, passes: int) -> dict:
    """Best pass per search, in us per round; both searches' candidates compared on every round first."""
    vocab = model.config.get_text_config().vocab_size
    device = rounds[0].device
    stock, host = _stock_generator(settings, vocab), HostPromptLookup(_stock_generator(settings, vocab))
    for ids in rounds:
        theirs, ours = stock.get_candidates(ids)[0], host.get_candidates(ids)[0]
        if not torch.equal(theirs, ours):
            raise AssertionError(f"the searches drafted differently at length {ids.shape[1]}")
    best = {"transformers": float("inf"), "host": float("inf")}
    drafted = None
    for _ in range(passes):
        fresh_host = HostPromptLookup(_stock_generator(settings, vocab))  # a generate() call's: the copy grows
        for name, search in (("transformers", _stock_generator(settings, vocab).get_candidates),
                             ("host", fresh_host.get_candidates)):
            seconds, drafted = _pass(search, rounds, device)
            best[name] = min(best[name], seconds)
    us = {name: seconds / len(rounds) * 1e6 for name, seconds in best.items()}
    return {"rounds": len(rounds), "drafted": sum(drafted), "rounds_with_drafts": sum(1 for d in drafted if d),
            "us_per_round": us, "ratio": us["transformers"] / us["host"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny-gdn-copy", help="a bundled model with a tokenizer")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--new", type=int, default=256)
    parser.add_argument("--lookup", type=int, default=10, help="prompt_lookup_num_tokens")
    parser.add_argument("--passes", type=int, default=5)
    parser.add_argument("--out", help="JSON results")
    args = parser.parse_args(argv)
    model, tokenizer = load_model(args.model, device=args.device)
    ids = speculative_prompt("passage", model.config.get_text_config().vocab_size, args.prompt, 0,
                             tokenizer).to(args.device)
    rounds, settings = recorded_rounds(model, ids, args.new, args.lookup)
    result = {"model": args.model, "device": str(torch.device(args.device)), "torch": torch.__version__,
              **measure(model, rounds, settings, args.passes)}
    us = result["us_per_round"]
    print(f"{args.model} on {result['device']}: {result['rounds']} rounds ({result['rounds_with_drafts']} drafting "
          f"{result['drafted']} tokens); search per round: transformers {us['transformers']:.1f} us, host copy "
          f"{us['host']:.1f} us ({result['ratio']:.2f}x)")
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(result, handle, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
