"""A draft model for batched speculation (``batched_prompt_lookup(..., drafter=DraftModelDrafter(draft))``).

Every round the draft model drafts greedily for all rows at once, on a ReplayCache of its own that rolls each row back
exactly like the main model's: rows accept different numbers of drafts, so the draft cache keeps one position grid
for all rows, turns each row's rejected or padding tokens into neutral records (``ReplayCache.drop_rows``) and hides
them from attention (zeros in its own attention mask; every row gets its own position ids). A round:

1. drop what each row's cache holds beyond the longest prefix it shares with the row's tokens now (the rejected
   drafts; the accepted ones and the main model's correction are kept or fed next);
2. feed each row's tokens the cache does not hold yet in one forward (rows padded to the widest; the padding is
   dropped right after); its last real position's logits give the first draft;
3. feed the drafts one step at a time for the remaining draft positions (every row; a row that needs fewer drafts
   drops the extra ones next round).
"""

from __future__ import annotations

import torch

from .batched import drop_newest


class DraftModelDrafter:
    """Greedy drafts from ``draft_model`` for every row of a batch (the ``draft_batch`` protocol of
    ``batched_prompt_lookup``). The draft model must share the main model's vocabulary. A drafter serves one
    ``batched_prompt_lookup`` call (its cache follows that call's rows)."""

    def __init__(self, draft_model, buffer_len: int = 16, max_drafts: int = 16):
        from .cache import ReplayCache, cache_argument

        self.model = draft_model
        self.max_drafts = max_drafts
        self.cache = ReplayCache(buffer_len, window=max_drafts + 1)
        self.key = cache_argument(draft_model)
        self.held: list[list[int]] | None = None  # per row: the tokens its cache holds, in order
        self.mask: torch.Tensor | None = None  # [B, positions]: 1 where a position holds a row's real token
        self.device = next(draft_model.parameters()).device

    # ------------------------------------------------------------------ one round
    def draft_batch(self, histories: list[list[int]], counts: list[int]) -> list[list[int]]:
        """Up to ``counts[r]`` greedy draft tokens following ``histories[r]`` (row r's prompt and tokens so far)."""
        if any(c > self.max_drafts for c in counts):
            raise ValueError(f"at most {self.max_drafts} drafts per row (DraftModelDrafter(max_drafts=...))")
        with torch.no_grad():
            logits = self._prefill(histories) if self.held is None else self._catch_up(histories)
            drafts = [[token] for token in logits.argmax(-1).tolist()]
            for _ in range(max(counts, default=0) - 1):
                step = torch.tensor([[d[-1]] for d in drafts], device=self.device)
                logits = self._forward(step, [[d[-1]] for d in drafts])[:, -1]
                for row, token in enumerate(logits.argmax(-1).tolist()):
                    drafts[row].append(token)
        return [d[:c] for d, c in zip(drafts, counts, strict=True)]

    def _prefill(self, histories: list[list[int]]) -> torch.Tensor:
        """The first round: every row's tokens, left-padded, as the cache's prompt (never rolled back)."""
        width = max(len(h) for h in histories)
        ids = torch.tensor([[h[0]] * (width - len(h)) + h for h in histories], device=self.device)
        self.mask = torch.tensor([[0] * (width - len(h)) + [1] * len(h) for h in histories], device=self.device)
        self.cache.bind(self.model)
        self.cache.reserve_window(self.max_drafts + 1)
        self.cache.activate_past_recording()
        self.cache.expect_prompt(width)
        positions = (self.mask.cumsum(-1) - 1).clamp(min=0)
        out = self.model(ids, attention_mask=self.mask, position_ids=positions, use_cache=True,
                         **{self.key: self.cache})
        self.held = [list(h) for h in histories]
        return out.logits[:, -1]

    def _catch_up(self, histories: list[list[int]]) -> torch.Tensor:
        """Roll each row back to the prefix it shares with its tokens now, feed the rest; logits at each row's last
        real position [B, V]."""
        shared = [_common_prefix(held, history) for held, history in zip(self.held, histories, strict=True)]
        self._drop([len(held) - n for held, n in zip(self.held, shared, strict=True)])
        new = [history[n:] for history, n in zip(histories, shared, strict=True)]
        width = max(1, max(len(tokens) for tokens in new))
        padded = [tokens + [(tokens or history)[-1]] * (width - len(tokens)) for tokens, history in
                  zip(new, histories, strict=True)]
        out = self._forward(torch.tensor(padded, device=self.device), padded)
        self._drop([width - len(tokens) for tokens in new])
        last = torch.tensor([max(len(tokens), 1) - 1 for tokens in new], device=self.device)
        return out[torch.arange(len(new), device=self.device), last]

    # ------------------------------------------------------------------ cache bookkeeping
    def _forward(self, ids: torch.Tensor, tokens: list[list[int]]) -> torch.Tensor:
        """Feed ``ids`` [B, W] at each row's next positions; the rows' held tokens grow by ``tokens``."""
        real = self.mask.sum(-1, keepdim=True)
        positions = real + torch.arange(ids.shape[1], device=self.device)
        self.mask = torch.cat([self.mask, torch.ones_like(ids)], dim=1)
        out = self.model(ids, attention_mask=self.mask, position_ids=positions, use_cache=True,
                         **{self.key: self.cache})
        for held, fed in zip(self.held, tokens, strict=True):
            held.extend(fed)
        return out.logits

    def _drop(self, counts: list[int]) -> None:
        """Row r forgets its newest ``counts[r]`` tokens (neutral records; hidden from attention)."""
        if not any(counts):
            return
        drop_newest(self.cache, self.mask, counts)
        for held, count in zip(self.held, counts, strict=True):
            del held[len(held) - count :]


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n
