"""Quick accuracy check of state-precision policies: teacher-forced KL divergence against an fp32 reference.

One sequence (the prompt plus a greedy fp32 continuation) is fed token by token through the decode path of one
ReplayCache whose batch rows each use a different policy: row 0 is the fp32 reference, the other rows the policies
under test (an ``"fp32"`` arm checks the apparatus: its KL must be 0). At every position the full-vocabulary
KL(P_ref || P_policy) is computed from float32 log-softmax and summed in float64, then averaged over log-spaced
position bins, so accumulation with length shows.

    from hf_replayssm.eval.precision_check import precision_check
    report = precision_check(model, tokenizer, tokens=512)
    print(report.table())
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from tqdm import tqdm

from ..cache import ReplayCache, cache_argument
from ..precision import PRESETS, resolve_policy

DEFAULT_POLICIES = (
    "fp32", "bf16", "fp16-sr", "separated-fp8", "shared-fp8", "separated-nvfp4", "shared-nvfp4", "fp16-sr+nvfp4",
)


def position_bins(length: int) -> list[tuple[int, int]]:
    """[0,1), [1,2), [2,4), [4,8), ... covering ``length`` positions (log-spaced, to show accumulation)."""
    bins, start = [], 0
    while start < length:
        stop = min(max(1, 2 * start), length)
        bins.append((start, stop))
        start = stop
    return bins


@dataclass
class PrecisionReport:
    policies: list[str]
    positions: int
    bins: list[tuple[int, int]]
    kl: dict[str, list[float]]  # per policy, per position (nats)
    top1_agreement: dict[str, float]
    ref_token_logprob_gap: dict[str, float]  # mean |delta log p| of the token the reference continuation took
    bytes_per_element: dict[str, float]
    meta: dict = field(default_factory=dict)

    def binned(self, policy: str) -> list[float]:
        values = torch.tensor(self.kl[policy], dtype=torch.float64)
        return [values[a:b].mean().item() for a, b in self.bins]

    def mean_kl(self, policy: str) -> float:
        return float(torch.tensor(self.kl[policy], dtype=torch.float64).mean())

    def to_dict(self) -> dict:
        return {
            "policies": self.policies, "positions": self.positions, "bins": self.bins,
            "mean_kl": {p: self.mean_kl(p) for p in self.policies},
            "binned_kl": {p: self.binned(p) for p in self.policies},
            "max_kl": {p: max(self.kl[p]) for p in self.policies},
            "top1_agreement": self.top1_agreement, "ref_token_logprob_gap": self.ref_token_logprob_gap,
            "bytes_per_element": self.bytes_per_element, "meta": self.meta,
        }

    def table(self) -> str:
        heads = ["policy", "B/elem", "mean KL", *[f"pos {a}-{b - 1}" for a, b in self.bins], "top-1 agree"]
        rows = [heads]
        for p in self.policies:
            rows.append([p, f"{self.bytes_per_element[p]:.2f}", f"{self.mean_kl(p):.2e}",
                         *[f"{v:.1e}" for v in self.binned(p)], f"{self.top1_agreement[p]:.1%}"])
        widths = [max(len(r[i]) for r in rows) for i in range(len(heads))]
        lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
        lines.insert(1, "  ".join("-" * w for w in widths))
        meta = self.meta
        title = (f"KL(fp32 || policy) per position, teacher-forced through the decode path: {meta.get('model', '')} "
                 f"({meta.get('ssm_layers', '?')} SSM layers), {meta.get('prompt_tokens', '?')} prompt tokens + "
                 f"{self.positions} positions, buffer_len={meta.get('buffer_len', '?')}")
        return "\n".join([title, "", *lines])


def _policy_names(policies) -> list[str]:
    names = []
    for p in policies:
        resolve_policy(p)  # validates
        names.append(p if isinstance(p, str) else repr(p))
    return names


@torch.no_grad()
def precision_check(model, tokenizer=None, policies=DEFAULT_POLICIES, tokens: int = 256, prompt: str | None = None,
                    input_ids: torch.Tensor | None = None, buffer_len: int = 16, progress: bool = True,
                    seed: int = 0, model_name: str | None = None) -> PrecisionReport:
    """Teacher-forced KL of each policy against fp32 over ``tokens`` positions (see the module docstring)."""
    names = _policy_names(policies)
    device = next(model.parameters()).device
    if input_ids is None:
        if tokenizer is not None:
            input_ids = tokenizer(prompt or "The ", return_tensors="pt").input_ids
        else:
            generator = torch.Generator().manual_seed(seed)
            vocab = model.config.get_text_config().vocab_size
            input_ids = torch.randint(3, vocab, (1, 16), generator=generator)
    input_ids = input_ids[:1].to(device)
    key = cache_argument(model)

    # 1. The sequence: the prompt and its greedy continuation under the fp32 reference.
    sequence = model.generate(input_ids, do_sample=False, max_new_tokens=tokens, min_new_tokens=tokens,
                              **{key: ReplayCache(buffer_len=buffer_len)})
    prompt_len = input_ids.shape[1]

    # 2. Teacher forcing, one batch row per policy (row 0: the reference).
    rows = 1 + len(names)
    cache = ReplayCache(buffer_len=buffer_len, precision=["fp32", *policies])
    batch = sequence.expand(rows, -1)
    logits = model(batch[:, :prompt_len], use_cache=True, **{key: cache}).logits[:, -1]
    kl: dict[str, list[float]] = {n: [] for n in names}
    agree = {n: 0 for n in names}
    gap = {n: 0.0 for n in names}
    positions = sequence.shape[1] - prompt_len
    for pos in tqdm(range(positions), desc="teacher forcing", disable=not progress, leave=False):
        logp = torch.log_softmax(logits.float(), dim=-1)
        ref = logp[0].double()
        target = sequence[0, prompt_len + pos]
        for i, name in enumerate(names, start=1):
            arm = logp[i].double()
            kl[name].append(float((ref.exp() * (ref - arm)).sum().clamp(min=0)))
            agree[name] += int(arm.argmax() == ref.argmax())
            gap[name] += float((arm[target] - ref[target]).abs())
        if pos + 1 < positions:
            token = batch[:, prompt_len + pos : prompt_len + pos + 1]
            logits = model(token, use_cache=True, **{key: cache}).logits[:, -1]

    state_rows = {layer.store.recurrence().shape[-1] for layer in cache.replay_layers.values()}
    row = max(state_rows) if state_rows else 128
    return PrecisionReport(
        policies=names, positions=positions, bins=position_bins(positions), kl=kl,
        top1_agreement={n: agree[n] / positions for n in names},
        ref_token_logprob_gap={n: gap[n] / positions for n in names},
        bytes_per_element={n: resolve_policy(p).bytes_per_element(row) for n, p in zip(names, policies, strict=True)},
        meta={"model": model_name or getattr(model.config, "_name_or_path", "") or type(model).__name__,
              "ssm_layers": len(cache.replay_layers), "prompt_tokens": prompt_len, "buffer_len": buffer_len,
              "state_row": row, "presets": list(PRESETS)},
    )
