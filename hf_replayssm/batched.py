"""Batched speculative decoding with per-row acceptance on a ReplayCache (lookup; a draft model: ``batched_draft``).

transformers runs speculative decoding at batch size 1 only. Here every row of a batch drafts its own tokens by
prompt lookup (the continuation of the latest earlier occurrence of its last n-gram), one forward verifies all rows'
windows, and each row keeps as many drafts as match its greedy predictions. Rows then sit at different lengths:

* SSM layers: ``ReplayCache.drop_rows`` turns each row's rejected tokens into neutral records (they leave the state
  exactly as it is) and moves the row's conv window back, so all rows keep one ring position and flush grid;
* attention layers keep the rejected K/V in place and never attend to them: their positions get zeros in the
  attention mask, and every row gets its own position ids (its count of real tokens).

Each row's output equals that row decoded alone with greedy decoding (up to floating-point rounding of the
batched forward; ``tests/test_batched_speculation.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from .buffers import device_counts

DRAFT_SCHEDULES = ("constant", "heuristic")


def lookup_drafts(tokens: list[int], num_drafts: int, max_ngram: int = 2) -> list[int]:
    """Up to ``num_drafts`` tokens that followed the latest earlier occurrence of the last n-gram of ``tokens``
    (n from ``max_ngram`` down to 1); [] when nothing matches. transformers' prompt lookup (batch 1, and
    ``host_lookup``, which drafts as it does) takes the earliest occurrence instead; the latest follows the text a
    row is editing or repeating now. Either way the output is greedy's: only acceptance can differ.

    Candidates are found with ``list.index`` on the reversed history (a C-level scan) and only those that start
    with the n-gram's first token are compared: a Python loop over every start cost about 9 ms per round for 64 rows
    of 600 tokens on a CPU core, as long as a whole decode step of a small model."""
    length = len(tokens)
    backwards = tokens[-2::-1]  # backwards[i] is tokens[length - 2 - i]; one reversed copy for every n
    for n in range(min(max_ngram, length - 1), 0, -1):
        tail = tokens[length - n :]
        i = n - 1  # an earlier occurrence starts at length - n - 1 or before (ends before the tail's last token)
        while True:
            try:
                i = backwards.index(tail[0], i)
            except ValueError:
                break
            start = length - 2 - i
            if tokens[start : start + n] == tail:
                return tokens[start + n : start + n + num_drafts]
            i += 1
    return []


def _batched(drafter, max_ngram: int) -> Callable[[list[list[int]], list[int]], list[list[int]]]:
    """``draft_batch(histories, counts)`` for any drafter: a batched one as it is, a per-row one (or prompt lookup)
    called row by row; rows asking for no draft get none."""
    if hasattr(drafter, "draft_batch"):  # e.g. a draft model: one batched draft per round
        return drafter.draft_batch
    per_row = drafter or (lambda row, tokens, count: lookup_drafts(tokens, count, max_ngram))
    return lambda histories, counts: [list(per_row(row, tokens, count)) if count else [] for row, (tokens, count)
                                      in enumerate(zip(histories, counts, strict=True))]


def drop_newest(cache, mask: torch.Tensor, dropped: list[int]) -> None:
    """Row r forgets its newest ``dropped[r]`` tokens: neutral records in the SSM layers (``ReplayCache.drop_rows``)
    and zeros in the caller's attention mask [B, positions], so attention never sees them."""
    most = max(dropped, default=0)
    if most:  # one masked fill for the batch (a slice fill per row was a launch per row on the GPU)
        counts = device_counts(dropped, mask.device).unsqueeze(1)  # pinned, non-blocking: no device sync
        newest = torch.arange(most - 1, -1, -1, device=mask.device)  # how many positions after each column
        mask[:, mask.shape[1] - most :].masked_fill_(newest < counts, 0)
    cache.drop_rows(dropped)


@dataclass
class BatchedSpeculationResult:
    sequences: list[list[int]]  # per row: its prompt (without padding) and its new tokens
    new_tokens: list[list[int]]
    drafted: int = 0  # draft tokens verified (padding excluded)
    accepted: int = 0
    forwards: int = 0  # verify forwards after the prefill
    accepted_per_row: list[int] = field(default_factory=list)

    @property
    def acceptance(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0


def stop_tokens(eos_token_id) -> frozenset[int]:
    """The end-of-sequence ids of ``eos_token_id`` (None, one id, or a list / tensor of them) as a set."""
    if eos_token_id is None:
        return frozenset()
    if isinstance(eos_token_id, torch.Tensor):
        eos_token_id = eos_token_id.flatten().tolist()
    return frozenset(int(t) for t in eos_token_id) if isinstance(eos_token_id, (list, tuple)) else \
        frozenset((int(eos_token_id),))


def until_stop(tokens: list[int], stops: frozenset[int]) -> list[int]:
    """``tokens`` up to and with the first end-of-sequence token in ``stops`` (all of them if there is none)."""
    end = next((i + 1 for i, t in enumerate(tokens) if t in stops), len(tokens))
    return tokens[:end]


def batched_prompt_lookup(model, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                          max_new_tokens: int = 32, num_draft_tokens: int = 4, max_ngram: int = 2,
                          eos_token_id: int | Sequence[int] | None = None, cache=None,
                          drafter: Callable[[int, list[int], int], list[int]] | None = None,
                          draft_schedule: str = "constant") -> BatchedSpeculationResult:
    """Greedy decoding of a batch with per-row prompt-lookup speculation.

    Args:
        input_ids: [B, S] prompts, left-padded where ``attention_mask`` [B, S] has zeros.
        max_new_tokens: new tokens per row (fewer for a row that emits an end-of-sequence token).
        eos_token_id: the end-of-sequence token, or several (as in a generation config's list): a row stops after
            the first of them it emits. Default None: no row stops early (unlike ``generate()``, which reads the
            model's generation config; pass ``model.generation_config.eos_token_id`` for its stops).
        num_draft_tokens: drafts per row and round (the verify window is one more token).
        cache: a ``ReplayCache`` (default: ``ReplayCache()``); it must be empty.
        drafter: ``drafter(row, tokens, n)`` -> up to n draft tokens following ``tokens`` (the row's prompt and
            output so far), or an object whose ``draft_batch(histories, counts)`` drafts for all rows at once
            (``hf_replayssm.batched_draft.DraftModelDrafter``: a draft model); default: prompt lookup
            (``lookup_drafts`` with ``max_ngram``).
        draft_schedule: ``"constant"``: every row asks for ``num_draft_tokens`` drafts each round; ``"heuristic"``:
            transformers' heuristic per row (start at ``num_draft_tokens``; +2 after a round in which the row kept
            every draft, -1 down to 1 otherwise), capped at ``num_draft_tokens`` (the window the cache reserved), so
            rows whose drafts keep failing stop widening the verify window. Outputs are the same either way.
    """
    from .cache import ReplayCache, cache_argument
    from .chunking import speculation_refusal

    if input_ids.dim() != 2 or input_ids.shape[1] == 0:
        raise ValueError(f"input_ids must be [B, S] with S >= 1, got {tuple(input_ids.shape)}")
    if max_new_tokens < 1 or num_draft_tokens < 0:
        raise ValueError("max_new_tokens must be >= 1 and num_draft_tokens >= 0")
    if draft_schedule not in DRAFT_SCHEDULES:
        raise ValueError(f"draft_schedule must be one of {DRAFT_SCHEDULES}, got {draft_schedule!r}")
    batch, prompt_len = input_ids.shape
    refusal = speculation_refusal(model, prompt_len + max_new_tokens + num_draft_tokens)
    if refusal is not None:
        raise ValueError(f"batched speculation would not equal plain decoding here: {refusal}")
    cache = ReplayCache(window=num_draft_tokens + 1) if cache is None else cache
    if cache.get_seq_length():
        raise ValueError("batched_prompt_lookup needs an empty cache (cache.reset() or a new ReplayCache())")
    draft_batch = _batched(drafter, max_ngram)
    stops = stop_tokens(eos_token_id)
    device = input_ids.device
    mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask.to(device).long()
    key = cache_argument(model)
    cache.bind(model)
    cache.reserve_window(num_draft_tokens + 1)
    cache.activate_past_recording()
    cache.expect_prompt(prompt_len)
    try:
        with torch.no_grad():
            positions = (mask.cumsum(-1) - 1).clamp(min=0)
            out = model(input_ids, attention_mask=mask, position_ids=positions, use_cache=True, **{key: cache})
            next_token = out.logits[:, -1].argmax(-1).tolist()
            prompts = [input_ids[r][mask[r].bool()].tolist() for r in range(batch)]
            result = BatchedSpeculationResult(sequences=[], new_tokens=[[] for _ in range(batch)],
                                              accepted_per_row=[0] * batch)
            real = [len(p) for p in prompts]
            done = [False] * batch
            budget = [num_draft_tokens] * batch  # drafts each row asks for next round (the schedule moves them)
            while not all(done):
                histories = [prompts[r] + result.new_tokens[r] + [next_token[r]] for r in range(batch)]
                room = [max_new_tokens - len(result.new_tokens[r]) - 1 for r in range(batch)]
                counts = [0 if done[r] else max(0, min(budget[r], room[r])) for r in range(batch)]
                drafts = [list(d)[:c] for d, c in zip(draft_batch(histories, counts), counts, strict=True)]
                width = max(len(d) for d in drafts)
                window = torch.tensor([[next_token[r], *d, *[next_token[r]] * (width - len(d))]
                                       for r, d in enumerate(drafts)], device=device)
                positions = torch.tensor(real, device=device)[:, None] + torch.arange(width + 1, device=device)
                mask = torch.cat([mask, torch.ones(batch, width + 1, dtype=mask.dtype, device=device)], dim=1)
                out = model(window, attention_mask=mask, position_ids=positions, use_cache=True, **{key: cache})
                predictions = out.logits.argmax(-1).tolist()
                result.forwards += 1
                dropped = []
                for r, draft in enumerate(drafts):
                    kept = 0
                    while kept < len(draft) and draft[kept] == predictions[r][kept]:
                        kept += 1
                    dropped.append(width - kept)
                    if done[r]:
                        continue
                    result.drafted += len(draft)
                    result.accepted += kept
                    result.accepted_per_row[r] += kept
                    if draft_schedule == "heuristic" and draft:
                        grown = budget[r] + 2 if kept == len(draft) else budget[r] - 1
                        budget[r] = min(num_draft_tokens, max(1, grown))
                    added = [next_token[r], *draft[:kept]]
                    result.new_tokens[r] += added
                    next_token[r] = predictions[r][kept]
                    real[r] += 1 + kept
                    if len(result.new_tokens[r]) >= max_new_tokens or not stops.isdisjoint(added):
                        done[r] = True
                drop_newest(cache, mask, dropped)
    finally:
        cache.deactivate_past_recording()
        # its attention layers keep every rejected draft, which only this route's masks hid
        cache.seal("batched speculation left the rejected drafts' attention entries in it (only that route's masks "
                   "hid them)")
    for r in range(batch):
        emitted = until_stop(result.new_tokens[r][:max_new_tokens], stops)
        result.new_tokens[r] = emitted
        result.sequences.append(prompts[r] + emitted)
    return result
