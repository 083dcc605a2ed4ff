"""Prompt-lookup drafts from a host copy of the token ids, the drafts transformers' own search finds (pure torch: no
transformers import).

transformers' ``PromptLookupCandidateGenerator.get_candidates`` searches the ids where they live. On a GPU each step
of that search is a device read, a synchronisation of tens of microseconds: ``nonzero`` per n-gram size, every match
it tries (``start < end`` and the slice compare device scalars), every draft token it checks against the logits
processors (even an empty list: it builds a vocabulary-wide row of ones per token and reads one entry back) and the
end-of-sequence cut. A dozen reads a round, at batch 1 the largest host cost of a speculative round after the forward.

``HostPromptLookup`` finds the same drafts (the earliest earlier occurrence of the last n-gram, n from
``max_matching_ngram_size`` down to 1, at most ``num_output_tokens`` tokens, none at or past ``max_length``, cut before
the first end-of-sequence token) in a host copy of the ids that grows by the tokens each round added: one device read
a round. The drafts are then a slice of the ids on the device, so nothing goes back. Where logits processors could
forbid a draft token (a non-empty list, e.g. sampling's warpers or a repetition penalty) transformers' own search runs.
"""

from __future__ import annotations

import torch

__all__ = ["HostPromptLookup", "earliest_lookup"]


def earliest_lookup(tokens: list[int], num_drafts: int, max_ngram: int, max_length: int | None = None,
                    stops: frozenset[int] = frozenset()) -> tuple[int, int] | None:
    """``(start, end)``: the drafts are ``tokens[start:end]``, as transformers' prompt lookup chooses them, or None.

    For n from ``min(max_ngram, len - 1)`` down to 1, the earliest occurrence ``p`` of the last n tokens that ends
    before them (``p + n < len``) whose continuation fits (``start = p + n < min(len, max_length)``) gives
    ``end = min(start + num_drafts, len, max_length)``, cut before the first token in ``stops``; a cut that leaves
    nothing gives None (transformers then drafts nothing this round rather than trying another match)."""
    length = len(tokens)
    limit = length if max_length is None else min(length, int(max_length))
    for n in range(min(max_ngram, length - 1), 0, -1):
        tail = tokens[length - n :]
        first, position = tail[0], 0
        while True:
            try:  # a C-level scan for the n-gram's first token; windows start at 0 .. len - n - 1
                position = tokens.index(first, position, length - n)
            except ValueError:
                break
            start = position + n
            if start < limit and tokens[position:start] == tail:
                end = min(start + num_drafts, limit)
                for index in range(start, end):
                    if tokens[index] in stops:
                        end = index
                        break
                return (start, end) if end > start else None
            position += 1
    return None


class HostPromptLookup:
    """``get_candidates`` for a transformers ``PromptLookupCandidateGenerator`` (read for its settings each round)
    that searches a host copy of the ids. Built per ``generate()`` call: the ids of one call only grow. The copy is
    checked at every round against its newest known token (read in the same device copy as the new ones)."""

    def __init__(self, generator):
        self.generator = generator
        self.searched_on_device = generator.get_candidates  # transformers' own search (logits processors)
        self.tokens: list[int] = []
        self._stops: frozenset[int] | None = None

    def _processors_may_forbid(self) -> bool:
        processors = getattr(self.generator, "logits_processor", None)
        return processors is not None and len(processors) > 0

    def _stop_ids(self) -> frozenset[int]:
        if self._stops is None:
            eos = getattr(self.generator, "eos_token_id", None)
            if isinstance(eos, torch.Tensor):
                eos = eos.flatten().tolist()
            elif isinstance(eos, int):
                eos = [eos]
            self._stops = frozenset(int(token) for token in (eos or ()))
        return self._stops

    def _mirror(self, input_ids: torch.Tensor) -> list[int]:
        """The host copy, brought up to ``input_ids`` [1, S] with one device read (the new tokens and the newest one
        it knew, to see that the ids only grew)."""
        known, length = len(self.tokens), input_ids.shape[1]
        if 0 < known <= length:
            fresh = input_ids[0, known - 1 :].tolist()
            if fresh[0] == self.tokens[-1]:
                self.tokens.extend(fresh[1:])
                return self.tokens
        self.tokens = input_ids[0].tolist()  # the first round, or ids that did not grow from the last ones
        return self.tokens

    def get_candidates(self, input_ids: torch.LongTensor, *args, **kwargs):
        generator = self.generator
        if input_ids.dim() != 2 or input_ids.shape[0] != 1 or self._processors_may_forbid():
            return self.searched_on_device(input_ids, *args, **kwargs)
        max_length = generator.max_length
        if max_length == input_ids.shape[1] + 1:  # the target model's own next token is the last one allowed
            return input_ids, None
        span = earliest_lookup(self._mirror(input_ids), int(generator.num_output_tokens),
                               int(generator.max_matching_ngram_size), max_length, self._stop_ids())
        if span is None:
            return input_ids, None
        start, end = span
        return torch.cat((input_ids, input_ids[:, start:end]), dim=1), None
