"""The main job: stock decoding vs ReplayCache vs ReplayCache + prompt-lookup speculation, side by side.

Shows that ReplayCache produces the same tokens as the model's stock decoding, how many recurrent-state writes each
does (stock: one per step per SSM layer; ReplayCache: one per flush), and what prompt-lookup speculative decoding
(possible because ReplayCache rolls back exactly) does to tokens/s. The state writes are counted, not derived: around
every forward the SSM state tensors are compared with a snapshot taken before it (``StateWriteCounter``).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

import torch
from tqdm import tqdm
from transformers.generation.streamers import BaseStreamer

from .cache import ReplayCache, cache_argument
from .models import DEFAULT_MODEL, load_model

DEFAULT_PROMPT = (
    "KING. Good Hamlet, cast thy nighted colour off,\n"
    "And let thine eye look like a friend on Denmark.\n"
    "HAMLET. Ay, madam, it is common.\n"
    "QUEEN. If it be,\n"
    "Why seems it so particular with thee?\n"
    "HAMLET. Seems, madam! Nay, it is; I know not seems.\n"
    "KING. Good Hamlet, cast thy nighted colour off,\n"
)


class ProgressStreamer(BaseStreamer):
    """A tqdm bar over generated tokens (the first ``put`` is the prompt)."""

    def __init__(self, total: int, desc: str, enabled: bool = True):
        self.bar = tqdm(total=total, desc=desc, unit="tok", leave=False, disable=not enabled)
        self.seen_prompt = False

    def put(self, value: torch.Tensor) -> None:
        if not self.seen_prompt:
            self.seen_prompt = True
            return
        self.bar.update(value.numel())

    def end(self) -> None:
        self.bar.close()


_BACKEND_NOTE = {"torch": "the pure-torch reference; on CUDA, backend='auto' runs the Triton kernels"}


def _cache_of(kwargs: dict, output=None):
    """The cache a model call used: its keyword (``past_key_values``; ``cache_params`` for pure Mamba-2 on 5.17;
    ``cache`` on newer 5.x), or the one the call returned."""
    for name in ("past_key_values", "cache", "cache_params"):
        if kwargs.get(name) is not None:
            return kwargs[name]
    for name in ("past_key_values", "cache_params"):
        if getattr(output, name, None) is not None:
            return getattr(output, name)
    return None


def stock_ssm_states(cache) -> dict[int, list[torch.Tensor]]:
    """The recurrent-state tensors of a stock transformers cache, per layer index (layers never written are absent)."""
    states: dict[int, list[torch.Tensor]] = {}
    for idx, layer in enumerate(getattr(cache, "layers", None) or []):
        tensors = [t for t in (getattr(layer, "recurrent_states", None) or {}).values() if isinstance(t, torch.Tensor)]
        if tensors:
            states[idx] = tensors
    if not states and isinstance(getattr(cache, "ssm_states", None), (list, tuple, dict)):  # older per-model caches
        ssm = cache.ssm_states
        for idx, t in (ssm.items() if isinstance(ssm, dict) else enumerate(ssm)):
            if isinstance(t, torch.Tensor) and t.numel():
                states[idx] = [t]
    return states


def replay_checkpoints(cache: ReplayCache) -> dict[int, list[torch.Tensor]]:
    """The checkpoint of each replay layer of a ReplayCache, per layer index (layers not written yet are absent)."""
    return {idx: [layer.checkpoint] for idx, layer in cache.replay_layers.items() if layer.checkpoint is not None}


class StateWriteCounter:
    """Counts SSM state writes by observation while active: before every forward of ``model`` it snapshots the
    tensors ``states(cache)`` returns (layer index -> tensors), after it counts one write for each layer whose tensors
    changed or appeared. ``seconds`` is the time spent observing, which the demo leaves out of its timings."""

    def __init__(self, model, states):
        self.model, self.states = model, states
        self.writes = self.forwards = 0
        self.seconds = 0.0
        self._before: dict[int, list[torch.Tensor]] = {}
        self._handles: list = []

    def __enter__(self) -> StateWriteCounter:
        self._handles = [self.model.register_forward_pre_hook(self._pre, with_kwargs=True),
                         self.model.register_forward_hook(self._post, with_kwargs=True)]
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()

    def _clock(self) -> float:
        if self.model.device.type == "cuda":
            torch.cuda.synchronize()  # the forward's own device work stays in the timing
        return time.perf_counter()

    def _pre(self, module, args, kwargs) -> None:
        start = self._clock()
        cache = _cache_of(kwargs)
        snapshot = self.states(cache) if cache is not None else {}
        self._before = {idx: [t.detach().clone() for t in tensors] for idx, tensors in snapshot.items()}
        self.seconds += time.perf_counter() - start

    def _post(self, module, args, kwargs, output) -> None:
        start = self._clock()
        cache = _cache_of(kwargs, output)
        for idx, tensors in (self.states(cache) if cache is not None else {}).items():
            before = self._before.get(idx)
            if before is None or len(before) != len(tensors) or not all(
                a.shape == b.shape and torch.equal(a, b) for a, b in zip(before, tensors, strict=True)
            ):
                self.writes += 1
        self.forwards += 1
        self._before = {}
        self.seconds += time.perf_counter() - start


@dataclass
class Run:
    name: str
    sequences: torch.Tensor
    logits: tuple
    seconds: float
    new_tokens: int
    stats: dict = field(default_factory=dict)
    state_writes: int | None = None  # counted by StateWriteCounter, where the run was observed
    forwards: int | None = None

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.seconds


def _generate(model, input_ids, name, max_new_tokens, progress, cache=None, states=None, **kwargs) -> Run:
    """One timed ``generate``; with ``states`` (see ``StateWriteCounter``) its state writes are counted too."""
    if cache is not None:
        kwargs[cache_argument(model)] = cache
    streamer = ProgressStreamer(max_new_tokens, name, enabled=progress)
    counter = StateWriteCounter(model, states) if states is not None else None
    if model.device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    with counter if counter is not None else contextlib.nullcontext():
        out = model.generate(
            input_ids, do_sample=False, max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens,
            output_logits=True, return_dict_in_generate=True, streamer=streamer, **kwargs,
        )
    if model.device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start - (counter.seconds if counter is not None else 0.0)
    stats = cache.stats() if cache is not None else {}
    return Run(name, out.sequences, out.logits, seconds, out.sequences.shape[1] - input_ids.shape[1], stats,
               state_writes=counter.writes if counter is not None else None,
               forwards=counter.forwards if counter is not None else None)


def run_demo(model_id: str | None = None, max_new_tokens: int = 128, prompt: str | None = None, buffer_len: int = 16,
             lookup_tokens: int = 4, device: str | None = None, progress: bool = True, seed: int = 0) -> dict:
    """Run the three decodings; return the measurements and a printable report."""
    torch.manual_seed(seed)
    model, tokenizer = load_model(model_id, device=device)
    if tokenizer is not None:
        input_ids = tokenizer(prompt or DEFAULT_PROMPT, return_tensors="pt").input_ids.to(model.device)
    else:  # no tokenizer: a fixed random prompt with a repeated span, so that prompt lookup has something to find
        base = torch.randint(3, model.config.get_text_config().vocab_size, (1, 12), device=model.device)
        input_ids = torch.cat([base, base[:, :6]], dim=1)

    ssm_layers = ReplayCache.for_model(model).stats()["ssm_layers"]
    stock = _generate(model, input_ids, "stock decoding", max_new_tokens, progress, states=stock_ssm_states)
    replay_cache = ReplayCache(buffer_len=buffer_len)
    replay = _generate(model, input_ids, "ReplayCache", max_new_tokens, progress, cache=replay_cache,
                       states=lambda _: replay_checkpoints(replay_cache))
    lookup = _generate(model, input_ids, f"ReplayCache + prompt lookup ({lookup_tokens})", max_new_tokens, progress,
                       cache=ReplayCache(buffer_len=buffer_len), prompt_lookup_num_tokens=lookup_tokens)

    def logit_gap(run: Run) -> float:
        return max((a - b).abs().max().item() for a, b in zip(run.logits, stock.logits, strict=True))

    # verify forwards and rollbacks, read off the first SSM layer's counters (identical in every SSM layer)
    forwards = lookup.stats["decode_steps"] // ssm_layers + 1 if ssm_layers else None
    accepted = lookup.new_tokens - forwards if ssm_layers else None
    rejected = lookup.stats["rolled_back_tokens"] // ssm_layers if ssm_layers else None
    result = {
        "model": model_id or DEFAULT_MODEL,
        "model_class": type(model).__name__,
        "device": str(model.device),
        "ssm_layers": ssm_layers,
        "prompt_tokens": input_ids.shape[1],
        "new_tokens": max_new_tokens,
        "buffer_len": buffer_len,
        "backend": "torch",
        "identical_tokens": torch.equal(replay.sequences, stock.sequences),
        "identical_tokens_lookup": torch.equal(lookup.sequences, stock.sequences),
        "max_logit_diff": logit_gap(replay),
        "max_logit_diff_lookup": logit_gap(lookup),
        # counted around every forward: SSM layers whose state (stock) / checkpoint (ReplayCache) changed
        "state_writes_stock": stock.state_writes,
        "state_writes_replay": replay.state_writes,
        "forwards_stock": stock.forwards,
        "forwards_replay": replay.forwards,
        "checkpoint_writes_stats": replay.stats["checkpoint_writes"],  # the cache's own counter, for comparison
        "tokens_per_second": {run.name: run.tokens_per_second for run in (stock, replay, lookup)},
        "lookup_forwards": forwards,
        "lookup_accepted_drafts": accepted,
        "lookup_rejected_drafts": rejected,
        "lookup_acceptance": accepted / max(accepted + rejected, 1) if ssm_layers else None,
        "text": tokenizer.decode(replay.sequences[0, input_ids.shape[1] :]) if tokenizer is not None else None,
    }
    result["report"] = format_report(result)
    return result


def format_report(r: dict) -> str:
    rows = [
        ("decoding", "tokens/s", "same tokens as stock", "max |logit diff|", "SSM state writes"),
        ("stock transformers", f"{r['tokens_per_second']['stock decoding']:.1f}", "-", "-",
         f"{r['state_writes_stock']}"),
        ("ReplayCache", f"{r['tokens_per_second']['ReplayCache']:.1f}", "yes" if r["identical_tokens"] else "NO",
         f"{r['max_logit_diff']:.1e}", f"{r['state_writes_replay']}"),
    ]
    lookup_name = next(name for name in r["tokens_per_second"] if "lookup" in name)
    rows.append(("ReplayCache + prompt lookup", f"{r['tokens_per_second'][lookup_name]:.1f}",
                 "yes" if r["identical_tokens_lookup"] else "NO", f"{r['max_logit_diff_lookup']:.1e}", "-"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [
        f"model: {r['model']} ({r['model_class']}, {r['ssm_layers']} SSM layers) on {r['device']}; "
        f"{r['prompt_tokens']} prompt tokens, {r['new_tokens']} new tokens, buffer_len={r['buffer_len']}",
        "",
    ]
    for i, row in enumerate(rows):
        lines.append("  ".join(cell.ljust(widths[j]) for j, cell in enumerate(row)).rstrip())
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    if r["lookup_forwards"] is not None:
        lines += [
            "",
            f"prompt lookup: {r['lookup_forwards']} verify forwards for {r['new_tokens']} tokens; drafts accepted "
            f"{r['lookup_accepted_drafts']}, rejected {r['lookup_rejected_drafts']} (acceptance "
            f"{r['lookup_acceptance']:.0%}); every rejection was an exact rollback.",
        ]
    lines += [
        f"backend: {r['backend']} ({_BACKEND_NOTE.get(r['backend'], 'Triton kernels')}): on small models tokens/s "
        "measures Python overhead, not state traffic (GPU numbers: BENCHMARKS.md).",
    ]
    if r["text"] is not None:
        lines += ["", "generated text (ReplayCache):", r["text"]]
    return "\n".join(lines)
