"""End-to-end ``generate()``: stock transformers decoding (eager, static cache compiled) against ReplayCache (eager,
compiled, separated fp8 / nvfp4), on random-weight models with the per-layer shapes of real hybrids.

Every arm runs ``model.generate`` on the same random prompt, greedy, ``min_new_tokens = max_new_tokens`` with the
special tokens suppressed, so every arm emits the same number of tokens (and, in exact arithmetic, the same ones:
each arm's tokens are compared with the stock arm's). Timing: one ``generate`` per run; a logits processor
synchronises the device and reads the clock when the first token's logits arrive, which splits the run into prefill
(prompt forward + first token) and decode (the remaining ``new - 1`` forwards), so prefill and decode come from the
same run, with no second prefill-only run whose warm-up or allocator state could differ. Decode tokens/s =
batch * (new - 1) / decode seconds; ms per step = decode seconds / (new - 1). Peak memory: the allocator's peak over
the run, weights included (``weights_bytes`` says how much of it they are). Every arm first runs
once untimed at the same lengths (cuDNN builds an attention graph per new KV length in torch 2.11; compilation and
Triton autotuning happen there), then arms are interleaved over ``--repeats``; the best decode rate counts
(``x best stock``), and so does the median of each repeat's ratio to the best stock arm's run in the same repeat
(``x paired``: robust to a host whose speed drifts between repeats, which decides batch-1 comparisons).

Compiled arms go through transformers' own path (``generate(..., compile_config=...)``: prefill eager, decode
forwards through ``model.get_compiled_call``); whether generate really took it is recorded per run (``compiled``),
so an arm that fell back to eager cannot pass for compiled. A ReplayCache arm whose cache cannot be built static
(no ``max_cache_len`` yet) or is not compileable is reported as skipped, with the reason. The stock arm is whatever
transformers runs by default: with flash-linear-attention installed (``fla`` in the JSON) its kernels.

``--speculative`` (batch 1): plain greedy (stock and ReplayCache) against prompt lookup and a small draft model of
the same family, each on a ReplayCache and on transformers' own cache (before 5.25 transformers refuses speculation
on hybrid models: those arms report its error; from 5.25 it rolls its linear layers back itself), on synthetic
repetitive prompts (a "code file" of repeated function templates asked to be edited; a document followed by
"Summary:"), token ids drawn from a seed (no tokenizer). With random weights the continuation means nothing, so the
arms report acceptance (accepted / drafted tokens), end-to-end tokens/s, and whether their tokens equal plain
greedy's. Speculative runs carry no logits processor (transformers' assisted loop runs each one per draft position:
host time a default call does not spend) and stop by length alone (``eos_token_id=None``). ``--models`` also takes
a bundled model (``tiny-gdn-copy``, which copies repeated text, so prompt lookup drafts are accepted) or a saved
model folder: its prompt kind is ``passage`` (a passage of Hamlet said several times, through its tokenizer), its
draft model ``--draft-model`` (another bundled name or folder; without one the draft arms are skipped, saying
so).
"""

from __future__ import annotations

import datetime
import hashlib
import importlib.util
import json
import platform
import statistics
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..tiny import repeat_layers
from . import default_device
from .attention import SDPA_CHOICES, sdpa_backend
from .compiles import JitCompiles, describe
from .step import _sync

ARMS = ("stock", "stock-static-compiled", "replay", "replay-compiled", "replay-fp8-compiled",
        "replay-nvfp4-compiled")
# eager separated-precision arms, asked for by name (not in the default list)
EXTRA_ARMS = ("replay-fp8", "replay-nvfp4")
REPLAY_PRECISION = {"replay": "fp32", "replay-compiled": "fp32", "replay-fp8-compiled": "separated-fp8",
                    "replay-nvfp4-compiled": "separated-nvfp4", "replay-fp8": "separated-fp8",
                    "replay-nvfp4": "separated-nvfp4"}
SPECULATIVE_ARMS = ("greedy-stock", "greedy-replay", "lookup-stock", "lookup-replay", "draft-stock", "draft-replay")
# speculation on a static ReplayCache (max_cache_len: static attention layers), by name: eager, or "-compiled"
# (transformers' compiled forward: from 5.25 the verify forwards too, on device positions; 5.17 runs them eagerly)
# beside plain greedy decoding compiled on the same kind of cache
SPECULATIVE_EXTRA_ARMS = ("lookup-static", "draft-static", "greedy-static-compiled", "lookup-static-compiled",
                          "draft-static-compiled")
PROMPT_KINDS = ("code-edit", "summary")
# a model with a tokenizer (bundled, or a saved folder): a passage of Hamlet said twice, through its tokenizer
TOKENIZER_PROMPT_KINDS = ("passage",)
# In-vocabulary special tokens for every shaped model (Kimi-Linear's config defaults, 163584+, lie outside the
# shaped 32000-token vocabulary); prompts draw ids >= 3 and generation suppresses these.
SPECIAL_TOKENS = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)
# --tiny: every shape cut down (layer patterns kept), for CPU tests and smoke runs
_TINY_COMMON = dict(hidden_size=64, intermediate_size=128, vocab_size=256, initializer_range=0.2)
TINY = {
    "qwen3_5": dict(_TINY_COMMON, num_attention_heads=4, num_key_value_heads=2, head_dim=16, linear_num_value_heads=4,
                    linear_num_key_heads=2, linear_key_head_dim=16, linear_value_head_dim=16, rms_norm_eps=1e-3),
    "nemotron_h": dict(_TINY_COMMON, num_attention_heads=4, num_key_value_heads=2, head_dim=16, mamba_num_heads=8,
                       mamba_head_dim=16, ssm_state_size=16, n_groups=2, chunk_size=8),
    "kimi_linear": dict(_TINY_COMMON, moe_intermediate_size=32, num_attention_heads=4, num_key_value_heads=4,
                        kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16, linear_head_dim=16,
                        linear_num_heads=4, num_local_experts=4),
}


class ArmSkipped(Exception):
    """An arm that cannot run as named here (e.g. a compiled ReplayCache arm before ReplayCache compiles)."""


@dataclass
class Settings:
    buffer_len: int = 16
    backend: str = "auto"  # ReplayCache backend
    compile_backend: str = "inductor"
    compile_mode: str | None = "reduce-overhead"
    prefill_chunk: int | None = None  # transformers' prefill_chunk_size, for every arm alike

    def compile_config(self):
        from transformers import CompileConfig

        config = CompileConfig(backend=self.compile_backend, mode=self.compile_mode)
        config._compile_all_devices = True  # generate compiles on CPU only with this flag (tests, smoke runs)
        return config


# ------------------------------------------------------------------ models


def layer_overrides(name: str, layers: int, overrides: dict) -> dict:
    """Overrides that give ``name``'s model ``layers`` layers: the first ones of its layer pattern, the pattern
    repeated when asked for more (every per-layer list alike)."""
    from .shapes import SHAPES

    return repeat_layers({**SHAPES[name], **overrides}, layers)


def model_overrides(name: str, tiny: bool = False, layers: int | None = None) -> dict:
    overrides = {**SPECIAL_TOKENS, **(TINY[name] if tiny else {})}
    if layers:
        overrides.update(layer_overrides(name, layers, overrides))
    return overrides


def build_model(name: str, device, dtype, tiny: bool = False, layers: int | None = None, seed: int = 0):
    from .shapes import shaped_model

    return shaped_model(name, device=device, dtype=dtype, seed=seed, **model_overrides(name, tiny, layers))


def copy_shared_weights(draft, model) -> int:
    """Give ``draft`` every weight of ``model`` with the same name and shape (embeddings, its first layers, final
    norm, head): a truncated copy, whose guesses correlate with the full model's even with random weights.
    Returns the number of tensors copied."""
    source = model.state_dict()
    shared = {k: v for k, v in draft.state_dict().items() if k in source and source[k].shape == v.shape}
    with torch.no_grad():
        for key, tensor in shared.items():
            tensor.copy_(source[key])
    return len(shared)


def special_token_ids(model) -> list[int]:
    """The ids ``generate`` suppresses so that every arm emits exactly ``new`` tokens: the model's bos / eos / pad
    (``SPECIAL_TOKENS`` for the shaped models), those inside its vocabulary."""
    config = model.config.get_text_config(decoder=True)
    ids = set()
    for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
        value = getattr(config, name, None)
        ids.update(value if isinstance(value, (list, tuple)) else [] if value is None else [value])
    return sorted(i for i in ids if 0 <= i < _vocab(model))


def _vocab(model) -> int:
    return model.config.get_text_config(decoder=True).vocab_size


def _num_layers(model) -> int:
    return model.config.get_text_config(decoder=True).num_hidden_layers


def _weights_bytes(model) -> int:
    return sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])


# ------------------------------------------------------------------ arms


# Compiled arms reuse one static cache per (arm, lengths) across runs, reset in between (its storage, hence the
# CUDA graphs' addresses, stays), as transformers reuses its own static cache: no run re-records a graph.
_STATIC_CACHES: dict[tuple, object] = {}


def _replay_cache(arm: str, model, settings: Settings, max_cache_len: int):
    """The arm's ReplayCache; compiled arms ask for static attention layers (``max_cache_len``) and must come out
    compileable, else the arm is skipped."""
    from ..cache import ReplayCache

    precision = REPLAY_PRECISION[arm]
    if not arm.endswith("-compiled"):
        return ReplayCache(settings.buffer_len, precision=precision, backend=settings.backend)

    def build():
        try:
            cache = ReplayCache(settings.buffer_len, precision=precision, backend=settings.backend,
                                max_cache_len=max_cache_len)
        except TypeError as error:
            raise ArmSkipped(f"ReplayCache(max_cache_len=...) is not available yet: {error}") from None
        try:
            cache.bind(model)
        except ValueError as error:  # a static cache refuses layers / policies that cannot decode on device positions
            raise ArmSkipped(str(error)) from None
        if not cache.is_compileable:
            raise ArmSkipped(f"ReplayCache(precision={precision!r}, max_cache_len=...) reports is_compileable=False")
        return cache

    return _reused_static_cache((id(model), arm, max_cache_len), build)


def _reused_static_cache(key: tuple, build):
    """The static cache of ``key`` from an earlier run, reset; else ``build()``'s, kept for the next run (a build
    that raises keeps nothing)."""
    cache = _STATIC_CACHES.get(key)
    if cache is not None:
        cache.reset()
        return cache
    cache = _STATIC_CACHES[key] = build()
    return cache


def arm_kwargs(arm: str, model, settings: Settings, max_cache_len: int) -> dict:
    """``generate`` keywords of one run of ``arm`` (a fresh cache each time). Raises ArmSkipped."""
    from ..cache import cache_argument

    if arm == "stock":
        return dict(disable_compile=True)
    if arm == "stock-static-compiled":
        return dict(cache_implementation="static", compile_config=settings.compile_config())
    if arm not in REPLAY_PRECISION:
        raise ValueError(f"unknown arm {arm!r}; arms: {ARMS + EXTRA_ARMS}")
    cache = _replay_cache(arm, model, settings, max_cache_len)
    kwargs = {cache_argument(model): cache}
    if arm.endswith("-compiled"):
        kwargs["compile_config"] = settings.compile_config()
    else:
        kwargs["disable_compile"] = True
    return kwargs


# ------------------------------------------------------------------ one timed generate


def _first_token_clock():
    from transformers import LogitsProcessor

    class FirstTokenClock(LogitsProcessor):
        """Reads the clock (after a device sync) when the first token's logits arrive: the end of the prefill."""

        def __init__(self):
            self.time: float | None = None

        def __call__(self, input_ids, scores):
            if self.time is None:
                _sync(scores.device)
                self.time = time.perf_counter()
            return scores

    return FirstTokenClock()


class CompileProbe:
    """Records whether ``generate`` took transformers' compiled forward (it asks ``model.get_compiled_call``
    exactly when its auto-compile criteria hold, then decodes through the returned callable)."""

    def __init__(self, model):
        self.model = model
        self.used = False

    def __enter__(self):
        original = self.model.get_compiled_call

        def get_compiled_call(*args, **kwargs):
            self.used = True
            return original(*args, **kwargs)

        self.model.get_compiled_call = get_compiled_call
        return self

    def __exit__(self, *exc):
        del self.model.get_compiled_call  # the instance attribute; the class method shows again


def _dynamo_counter(group: str, name: str) -> int:
    """One of torch.compile's process-wide counters; 0 where they do not exist."""
    try:
        from torch._dynamo.utils import counters
    except ImportError:
        return 0
    return int(counters[group][name])


def _dynamo_frames() -> int:
    return _dynamo_counter("frames", "ok")


def cudagraph_skips() -> int:
    """How many compiled graphs Inductor has run without CUDA graphs so far in this process (it skips them, with a
    log line, for CPU tensors, mutated inputs, dynamic shapes ...): a compiled arm whose count grows did not run as
    CUDA graphs."""
    return _dynamo_counter("inductor", "cudagraph_skips")


def timed_generate(model, ids: torch.Tensor, new_tokens: int, kwargs: dict, processors: bool = True) -> dict:
    """One greedy ``generate`` of exactly ``new_tokens`` tokens; seconds in all and up to the first token, the
    allocator peak, whether the compiled forward ran, and the new tokens (on CPU). ``processors``: exactly that many
    tokens by suppressing the special ones (``min_new_tokens``, ``suppress_tokens``) and the first token timed by a
    logits processor; False: by switching off the end of sequence (``eos_token_id=None``), with no logits processor
    at all (``prefill_s`` None). transformers' assisted loop calls each logits processor once per draft position
    (and 5.25's prompt lookup again on its candidates), a host cost that a plain call without processors (the
    default) does not pay: the speculative bench runs without them."""
    from transformers import LogitsProcessorList

    device = ids.device
    clock = _first_token_clock()
    if processors:
        exact = dict(min_new_tokens=new_tokens, suppress_tokens=special_token_ids(model),
                     logits_processor=LogitsProcessorList([clock]))
    else:
        exact = dict(eos_token_id=None)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    frames, skips = _dynamo_frames(), cudagraph_skips()
    _sync(device)
    with torch.no_grad(), CompileProbe(model) as probe, JitCompiles() as jit:
        start = time.perf_counter()
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=new_tokens,
                             **exact, **kwargs)
        _sync(device)
        seconds = time.perf_counter() - start
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0
    prefill = (clock.time or start + seconds) - start if processors else None
    return dict(seconds=seconds, prefill_s=prefill, peak_bytes=peak, compiled=probe.used,
                dynamo_frames=_dynamo_frames() - frames, cudagraph_skips=cudagraph_skips() - skips,
                jit_compiles=jit.summary(), cuda=device.type == "cuda",
                tokens=out[:, ids.shape[1] :].cpu())


def _decode_rates(run: dict, batch: int, new_tokens: int) -> dict:
    decode = max(run["seconds"] - run["prefill_s"], 1e-9)
    steps = max(new_tokens - 1, 1)
    return dict(tokens_per_s=batch * steps / decode, ms_per_step=decode * 1e3 / steps,
                prefill_ms=run["prefill_s"] * 1e3, total_ms=run["seconds"] * 1e3)


def _checksum(tokens: torch.Tensor) -> str:
    return hashlib.sha1(tokens.to(torch.int64).numpy().tobytes()).hexdigest()[:16]


def agreement(tokens: torch.Tensor, reference: torch.Tensor) -> dict:
    """Token equality with a reference run: identical, and the mean fraction of each row before its first
    difference (rounding can flip one near-tie and the continuations part from there)."""
    same = tokens == reference
    prefix = same.long().cumprod(dim=1).sum(dim=1).double() / tokens.shape[1]
    return dict(identical_to_stock=bool(same.all()), agree_prefix=float(prefix.mean()))


# ------------------------------------------------------------------ the benchmark


def _run_arm(model, ids, arm: str, new_tokens: int, settings: Settings) -> dict:
    kwargs = arm_kwargs(arm, model, settings, ids.shape[1] + new_tokens)
    if settings.prefill_chunk:
        kwargs["prefill_chunk_size"] = settings.prefill_chunk
    return timed_generate(model, ids, new_tokens, kwargs)


def _try_run(model, ids, arm: str, new_tokens: int, settings: Settings) -> dict:
    """A run, or ``{"skipped": reason}`` / ``{"error": ...}`` (out of memory at large batches, say): one failing arm
    does not stop the others."""
    try:
        return _run_arm(model, ids, arm, new_tokens, settings)
    except ArmSkipped as reason:
        return {"skipped": str(reason)}
    except Exception as error:  # recorded in the results; the benchmark goes on
        if ids.device.type == "cuda":
            torch.cuda.empty_cache()
        return {"error": f"{type(error).__name__}: {str(error)[:500]}"}


def _summarise(arm: str, runs: list[dict], warmup: dict, batch: int, new_tokens: int) -> dict:
    if "skipped" in warmup or "error" in warmup:
        return {"arm": arm, **{k: v for k, v in warmup.items() if k in ("skipped", "error")}}
    failed = next((r for r in runs if "error" in r), None)
    if failed is not None:
        return {"arm": arm, "error": failed["error"]}
    rates = [_decode_rates(r, batch, new_tokens) for r in runs]
    best = max(range(len(runs)), key=lambda i: rates[i]["tokens_per_s"])
    entry = {"arm": arm, **rates[best], "peak_bytes": max(r["peak_bytes"] for r in runs),
             "compiled": all(r["compiled"] for r in runs), "warmup_s": warmup["seconds"],
             "repeats_tokens_per_s": [r["tokens_per_s"] for r in rates],
             "dynamo_frames_compiled_in_timed_runs": sum(r["dynamo_frames"] for r in runs),
             # graphs compiled in the warm-up run (or later) that Inductor ran without CUDA graphs
             "cudagraph_skips": warmup["cudagraph_skips"] + sum(r["cudagraph_skips"] for r in runs),
             "tokens_checksum": _checksum(runs[-1]["tokens"]), "_tokens": runs[-1]["tokens"]}
    # Triton kernels compiled inside the timed runs (None: this Triton cannot count them); a run that compiled
    # timed the JIT too, which Dynamo's frame count does not see
    counted = [r.get("jit_compiles") for r in runs]
    entry["jit_compiles_in_timed_runs"] = (None if any(c is None for c in counted)
                                           else dict(sum(map(Counter, counted), Counter())))
    if arm.endswith("-compiled") and not entry["compiled"]:
        entry["warning"] = "generate did not take the compiled forward: this arm ran eager"
    elif arm.endswith("-compiled") and entry["cudagraph_skips"] and runs[0]["cuda"]:
        entry["without_cuda_graphs"] = True
        entry["warning"] = (f"Inductor skipped CUDA graphs {entry['cudagraph_skips']} time(s) in this arm: its decode "
                            "step ran compiled but launched kernel by kernel (TORCH_LOGS=perf_hints says why)")
    if entry["jit_compiles_in_timed_runs"]:
        note = (f"the timed runs compiled Triton kernels ({describe(entry['jit_compiles_in_timed_runs'])}): their "
                "time is in this arm's numbers")
        entry["warning"] = f"{entry['warning']}; {note}" if "warning" in entry else note
    return entry


def paired_median_ratio(rates: Sequence[float], reference_rates: Sequence[float]) -> float:
    """Median over the interleaved repeats of rate / reference rate in the same repeat. Neighbouring runs share the
    host's state (a batch-1 decode step is host-bound, and a shared host's speed drifts by more than the 5 % two
    arms differ by): pairing cancels the drift that a best-of-N ratio keeps."""
    if len(rates) != len(reference_rates) or not rates:
        raise ValueError(f"paired rates need the same number of repeats, got {len(rates)} and {len(reference_rates)}")
    return statistics.median(rate / reference for rate, reference in zip(rates, reference_rates, strict=True))


def _compare(entries: list[dict]) -> None:
    """Adds identical_to_stock / agree_prefix (against the ``stock`` arm, else the first stock arm that ran),
    x_vs_best_stock (decode tokens/s over the best stock arm's, best run each) and x_paired_median (the median of the
    repeats' ratios to that arm's run in the same repeat); drops the kept tokens."""
    ran = [e for e in entries if "tokens_per_s" in e]
    stocks = [e for e in ran if e["arm"].startswith("stock")]
    reference = next((e for e in stocks if e["arm"] == "stock"), stocks[0] if stocks else None)
    best_stock = max(stocks, key=lambda e: e["tokens_per_s"], default=None)
    for entry in ran:
        if reference is not None:
            entry.update(agreement(entry["_tokens"], reference["_tokens"]))
        if best_stock is not None:
            entry["x_vs_best_stock"] = entry["tokens_per_s"] / best_stock["tokens_per_s"]
            entry["x_paired_median"] = paired_median_ratio(entry["repeats_tokens_per_s"],
                                                           best_stock["repeats_tokens_per_s"])
    for entry in ran:
        del entry["_tokens"]


def install_replay_hooks(model) -> None:
    """Bind a throwaway ReplayCache: the first bind patches the SSM mixer classes (a pass-through without a
    ReplayCache). Done before any run, so a graph compiled for one arm is not invalidated by another arm's first
    ReplayCache (which would put a recompilation into a timed run), and every arm runs the same mixer code."""
    from ..cache import ReplayCache

    ReplayCache.for_model(model)


def measure_generate(model, batch: int, prompt: int = 512, new_tokens: int = 256, arms: Sequence[str] = ARMS,
                     repeats: int = 2, settings: Settings | None = None, seed: int = 0) -> list[dict]:
    """Every arm on the same random ``[batch, prompt]`` prompt: one untimed warm-up each, then ``repeats`` timed
    runs interleaved across arms. One entry per arm (skipped and failed arms say why)."""
    settings = settings or Settings()
    device = next(model.parameters()).device
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, _vocab(model), (batch, prompt), generator=generator).to(device)
    if any(arm.startswith("replay") for arm in arms):
        install_replay_hooks(model)
    if any(arm.endswith("-compiled") for arm in arms):
        torch._dynamo.reset()  # fresh graphs per batch: no dims marked dynamic by another batch size's runs
    _STATIC_CACHES.clear()
    warmups = {arm: _try_run(model, ids, arm, new_tokens, settings) for arm in arms}
    live = [arm for arm in arms if "seconds" in warmups[arm]]
    runs: dict[str, list[dict]] = {arm: [] for arm in arms}
    for _ in range(repeats):
        for arm in live:
            runs[arm].append(_try_run(model, ids, arm, new_tokens, settings))
    entries = [_summarise(arm, runs[arm], warmups[arm], batch, new_tokens) for arm in arms]
    _compare(entries)
    common = dict(batch=batch, prompt=prompt, new_tokens=new_tokens, buffer_len=settings.buffer_len)
    return [{**common, **entry} for entry in entries]


# ------------------------------------------------------------------ speculative decoding


def _prompt_from(body: list[int], tail: list[int], length: int) -> torch.Tensor:
    """[1, length]: the start of ``body``, then ``tail`` (what the continuation follows)."""
    return torch.tensor([(body[: max(length - len(tail), 0)] + tail)[-length:]], dtype=torch.long)


def code_edit_prompt(vocab: int, length: int, seed: int = 0) -> torch.Tensor:
    """A synthetic code file: functions stamped from 4 templates (header "def NAME ( ARGS ) :", body lines that
    mention NAME), then an instruction ("rename OLD to NEW") and the header of the first function with its new name,
    so that the edited function is a near-copy of text in the prompt. [1, length] token ids in [3, vocab)."""
    rng = torch.Generator().manual_seed(seed)

    def draw(n: int) -> list[int]:
        return torch.randint(3, vocab, (n,), generator=rng).tolist()

    define, open_paren, close_paren, colon, newline, rename, to = draw(7)
    templates = [[draw(int(torch.randint(4, 9, (1,), generator=rng))) for _ in range(4)] for _ in range(4)]
    functions, body = [], []
    while len(body) < length:
        name, args, template = draw(1)[0], draw(2), templates[len(functions) % len(templates)]
        lines = [[*line[:2], name, *line[2:]] if i % 2 else line for i, line in enumerate(template)]
        function = [define, name, open_paren, *args, close_paren, colon, newline]
        for line in lines:
            function += [*line, newline]
        functions.append((name, args))
        body += function
    (old, args), new = functions[0], draw(1)[0]
    tail = [newline, rename, old, to, new, newline, define, new, open_paren, *args, close_paren, colon, newline]
    return _prompt_from(body, tail, length)


def summary_prompt(vocab: int, length: int, seed: int = 0) -> torch.Tensor:
    """A synthetic document: sentences drawn with repetition from a pool of 24 (8-16 tokens, ending in a period),
    then "Summary :" and the first tokens of the document's most repeated sentence. [1, length] ids in [3, vocab)."""
    rng = torch.Generator().manual_seed(seed)
    period, summary, colon = torch.randint(3, vocab, (3,), generator=rng).tolist()
    lengths = torch.randint(8, 17, (24,), generator=rng).tolist()
    pool = [[*torch.randint(3, vocab, (n,), generator=rng).tolist(), period] for n in lengths]
    weights = 1.0 / torch.arange(1, len(pool) + 1, dtype=torch.float)  # Zipf-like: a few sentences recur often
    body: list[int] = []
    while len(body) < length:
        body += pool[int(torch.multinomial(weights, 1, generator=rng))]
    tail = [summary, colon, *pool[0][:3]]
    return _prompt_from(body, tail, length)


PROMPTS = {"code-edit": code_edit_prompt, "summary": summary_prompt}


class DraftCounter:
    """Counts drafted and accepted tokens of assisted ``generate`` calls on ``model``, by wrapping the candidate
    generator transformers builds (its ``get_candidates`` output length and ``update_candidate_strategy``'s
    ``num_matches``)."""

    def __init__(self, model):
        self.model = model
        self.drafted = 0
        self.accepted = 0
        self.rounds = 0

    def __enter__(self):
        original = self.model._get_candidate_generator

        def _get_candidate_generator(*args, **kwargs):
            generator = original(*args, **kwargs)
            self._wrap(generator)
            return generator

        self.model._get_candidate_generator = _get_candidate_generator
        return self

    def _wrap(self, generator) -> None:
        get_candidates, update = generator.get_candidates, generator.update_candidate_strategy

        def counted_candidates(input_ids, *args, **kwargs):
            candidates, logits = get_candidates(input_ids, *args, **kwargs)
            self.drafted += candidates.shape[1] - input_ids.shape[1]
            self.rounds += 1
            return candidates, logits

        def counted_update(input_ids, scores, num_matches):
            self.accepted += int(num_matches)
            return update(input_ids, scores, num_matches)

        generator.get_candidates = counted_candidates
        generator.update_candidate_strategy = counted_update

    def __exit__(self, *exc):
        del self.model._get_candidate_generator

    @property
    def acceptance(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None


def _speculative_kwargs(arm: str, model, draft, settings: Settings, lookup: int, length: int) -> dict:
    """``generate()`` keywords of a speculative arm; ``length``: prompt plus new tokens (what a static cache holds,
    with one window of drafts more). A compiled arm reuses one static cache (reset) across its runs, so that its
    graphs keep their addresses, as ``_replay_cache`` does for the plain compiled arms."""
    from ..cache import ReplayCache, cache_argument

    if arm not in SPECULATIVE_ARMS + SPECULATIVE_EXTRA_ARMS:
        raise ValueError(f"unknown speculative arm {arm!r}; arms: {SPECULATIVE_ARMS + SPECULATIVE_EXTRA_ARMS}")
    compiled = arm.endswith("-compiled")
    kind, _, cache = arm.removesuffix("-compiled").partition("-")
    if kind == "draft" and draft is None:
        raise ArmSkipped("a draft arm needs a draft model: pass --draft-model (a bundled name or a saved folder) "
                         "for a bundled or saved main model")
    kwargs = dict(compile_config=settings.compile_config()) if compiled else dict(disable_compile=True)
    if cache == "static":  # one window of drafts more than the tokens (what generate() asks a static cache for)
        if kind == "greedy":
            window = 0
        elif kind == "lookup":
            window = lookup
        else:
            window = int(getattr(draft.generation_config, "num_assistant_tokens", None) or 20)

        def build():
            return ReplayCache(settings.buffer_len, backend=settings.backend, max_cache_len=length + window)

        kwargs[cache_argument(model)] = (_reused_static_cache((id(model), arm, length + window), build) if compiled
                                         else build())
    elif cache == "replay":  # stock: transformers' own cache (its speculation on hybrids: refused before 5.25)
        kwargs[cache_argument(model)] = ReplayCache(settings.buffer_len, backend=settings.backend)
    if kind == "lookup":
        kwargs["prompt_lookup_num_tokens"] = lookup
    elif kind == "draft":
        kwargs["assistant_model"] = draft
    return kwargs


def _speculative_run(model, draft, ids, arm: str, new_tokens: int, settings: Settings, lookup: int) -> dict:
    try:
        kwargs = _speculative_kwargs(arm, model, draft, settings, lookup, ids.shape[1] + new_tokens)
    except ArmSkipped as skipped:
        return {"skipped": str(skipped)}
    try:
        with DraftCounter(model) as counter:
            run = timed_generate(model, ids, new_tokens, kwargs, processors=False)
    except Exception as error:  # recorded in the results; the benchmark goes on
        return {"error": f"{type(error).__name__}: {str(error)[:500]}"}
    return dict(run, drafted=counter.drafted, accepted=counter.accepted, rounds=counter.rounds,
                acceptance=counter.acceptance)


def _speculative_entry(arm: str, runs: list[dict], new_tokens: int, reference) -> dict:
    failed = next((r for r in runs if "error" in r or "skipped" in r), None)
    if failed is not None:
        return {"arm": arm, **{k: failed[k] for k in ("error", "skipped") if k in failed}}
    best = min(runs, key=lambda r: r["seconds"])
    entry = {"arm": arm, "tokens_per_s": new_tokens / best["seconds"],
             "ms_per_token": best["seconds"] * 1e3 / new_tokens,
             "peak_bytes": max(r["peak_bytes"] for r in runs), "drafted": best["drafted"],
             "accepted": best["accepted"], "acceptance": best["acceptance"],
             "repeats_tokens_per_s": [new_tokens / r["seconds"] for r in runs],
             "tokens_checksum": _checksum(best["tokens"]), "compiled": best["compiled"],
             # frames Dynamo compiled during the timed runs (``runs`` holds no warm-up): a compiled arm should show none
             "dynamo_frames_timed": sum(r["dynamo_frames"] for r in runs)}
    if reference is not None:
        entry["identical"] = bool(torch.equal(best["tokens"], reference))
    return entry


def _plain_greedy_arm(runs: dict[str, list[dict]]) -> str | None:
    """The reference for ``identical``: plain greedy with the stock cache, else with a ReplayCache."""
    for arm in ("greedy-stock", "greedy-replay"):
        if runs.get(arm) and "tokens" in runs[arm][0]:
            return arm
    return None


def _label_divergences(model, ids: torch.Tensor, new_tokens: int, reference_arm: str, plain: torch.Tensor,
                       entries: list[dict], runs: dict[str, list[dict]]) -> None:
    """For each entry whose tokens differ from plain greedy's: where they part and greedy's margin there in ulps of the
    model's dtype (``divergences``, ``identity``: ``ties 1r<=1ulp`` when the arm only took the other side of a
    near-tie, as bf16 rounding in another order can). Greedy's logits come from one more untimed run of the
    reference arm's cache."""
    from .speculative import _identity_label, first_divergences

    differing = [e for e in entries if e.get("identical") is False]
    if not differing:
        return
    kwargs = {}
    if reference_arm == "greedy-replay":
        from ..cache import ReplayCache, cache_argument

        kwargs[cache_argument(model)] = ReplayCache()
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=new_tokens,
                             eos_token_id=None, output_logits=True, return_dict_in_generate=True, **kwargs)
    logits = torch.stack(out.logits, dim=1)
    rerun = out.sequences[:, ids.shape[1] :].cpu().tolist()
    dtype = next(model.parameters()).dtype
    for entry in differing:
        best = min(runs[entry["arm"]], key=lambda r: r["seconds"])
        entry["divergences"] = first_divergences(plain.tolist(), best["tokens"].tolist(), logits, dtype,
                                                 reference=rerun)
        entry["identity"] = _identity_label(entry)


def speculative_prompt(kind: str, vocab: int, length: int, seed: int = 0, tokenizer=None) -> torch.Tensor:
    """[1, length] ids of a prompt kind: ``PROMPTS`` (synthetic ids), or ``passage`` (needs the model's tokenizer)."""
    if kind in TOKENIZER_PROMPT_KINDS:
        if tokenizer is None:
            raise ValueError(f"prompt kind {kind!r} needs a model with a tokenizer (a bundled model or a saved "
                             f"folder); shaped random-weight models take {PROMPT_KINDS}")
        from .speculative import repetitive_batch

        return repetitive_batch(vocab, 1, length, seed, tokenizer)
    if kind not in PROMPTS:
        raise ValueError(f"unknown prompt kind {kind!r}; kinds: {PROMPT_KINDS + TOKENIZER_PROMPT_KINDS}")
    return PROMPTS[kind](vocab, length, seed)


def measure_speculative(model, draft, prompt: int = 512, new_tokens: int = 256, lookup: int = 10,
                        arms: Sequence[str] = SPECULATIVE_ARMS, kinds: Sequence[str] | None = None,
                        repeats: int = 2, settings: Settings | None = None, seed: int = 0,
                        tokenizer=None) -> list[dict]:
    """Batch 1, per prompt kind (default: ``passage`` with a tokenizer, else ``PROMPT_KINDS``): every speculative
    arm warmed once, then ``repeats`` interleaved timed runs; tokens/s end to end (prefill included: a verify forward
    mixes prompt and drafts), acceptance = accepted / drafted tokens, ``identical``: the new tokens equal plain
    greedy's (``greedy-stock``, else ``greedy-replay``). No logits processor and no end of sequence: every arm
    emits exactly ``new_tokens`` tokens (``timed_generate(processors=False)``). ``draft`` None: the draft arms are
    skipped."""
    settings = settings or Settings()
    device = next(model.parameters()).device
    if kinds is None:
        kinds = TOKENIZER_PROMPT_KINDS if tokenizer is not None else PROMPT_KINDS
    results = []
    for kind in kinds:
        ids = speculative_prompt(kind, _vocab(model), prompt, seed, tokenizer).to(device)
        warmups = {arm: _speculative_run(model, draft, ids, arm, new_tokens, settings, lookup) for arm in arms}
        failed = {arm for arm in arms if "error" in warmups[arm] or "skipped" in warmups[arm]}
        runs = {arm: [warmups[arm]] if arm in failed else [] for arm in arms}
        for _ in range(repeats):
            for arm in arms:
                if arm not in failed:
                    runs[arm].append(_speculative_run(model, draft, ids, arm, new_tokens, settings, lookup))
        reference = _plain_greedy_arm(runs)
        plain = None if reference is None else runs[reference][0]["tokens"]
        entries = [dict(prompt_kind=kind, batch=1, prompt=prompt, new_tokens=new_tokens,
                        lookup_tokens=lookup if arm.startswith("lookup") else None,
                        **_speculative_entry(arm, runs[arm], new_tokens, plain)) for arm in arms]
        if plain is not None:
            _label_divergences(model, ids, new_tokens, reference, plain, entries, runs)
        results.extend(entries)
    return results


# ------------------------------------------------------------------ reporting


def environment(device: str) -> dict:
    import transformers

    try:
        import fla

        with_fla, fla_version = True, getattr(fla, "__version__", "?")
    except ImportError:
        with_fla, fla_version = False, None
    # the other kernel packages transformers' stock path picks up when installed (Mamba-2 scan, short conv)
    others = {name: importlib.util.find_spec(name) is not None for name in ("mamba_ssm", "causal_conv1d", "triton")}
    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "device": torch.cuda.get_device_name() if device.startswith("cuda") else device,
            "torch": torch.__version__, "transformers": transformers.__version__, "fla": with_fla,
            "fla_version": fla_version, "kernels_installed": others, "python": platform.python_version()}


def _status(entry: dict) -> str:
    if "skipped" in entry:
        return f"skipped: {entry['skipped']}"
    return f"error: {entry['error']}"


def table(entries: Sequence[dict], title: str = "") -> str:
    gib = 2**30
    lines = [title, f"{'batch':>5} {'arm':<22} {'decode tok/s':>12} {'ms/step':>8} {'prefill ms':>10} "
             f"{'peak GiB':>8} {'compiled':>8} {'x best stock':>12} {'x paired':>8} {'same tokens':>11}"]
    for e in entries:
        if "tokens_per_s" not in e:
            lines.append(f"{e['batch']:>5} {e['arm']:<22} {_status(e)}")
            continue
        same = e.get("identical_to_stock")
        same = "-" if same is None else ("yes" if same else f"{e['agree_prefix']:.2f}")
        compiled = "yes" if e["compiled"] else ("EAGER!" if e["arm"].endswith("-compiled") else "no")
        if e.get("without_cuda_graphs"):
            compiled = "NOGRAPH"  # compiled, but Inductor ran it without CUDA graphs
        lines.append(f"{e['batch']:>5} {e['arm']:<22} {e['tokens_per_s']:>12.1f} {e['ms_per_step']:>8.2f} "
                     f"{e['prefill_ms']:>10.1f} {e['peak_bytes'] / gib:>8.2f} {compiled:>8} "
                     f"{e.get('x_vs_best_stock', float('nan')):>11.2f}x "
                     f"{e.get('x_paired_median', float('nan')):>7.2f}x {same:>11}")
        if e.get("jit_compiles_in_timed_runs"):
            lines.append(f"{'':>5} warning: {e['warning']}")
    return "\n".join(lines)


def _identical(entry: dict) -> str:
    """true / false, or ``ties 1r<=1ulp`` where the tokens part only at a near-tie of greedy's logits."""
    label = entry.get("identity", str(entry.get("identical", "-")))
    return label.lower() if label in ("True", "False") else label


def speculative_table(entries: Sequence[dict], title: str = "") -> str:
    lines = [title, f"{'prompt':<10} {'arm':<22} {'tok/s':>8} {'ms/token':>9} {'acceptance':>10} {'drafted':>8} "
             f"{'identical':>13} {'compiled':>8}"]
    for e in entries:
        if "tokens_per_s" not in e:
            lines.append(f"{e['prompt_kind']:<10} {e['arm']:<22} {_status(e)}")
            continue
        acceptance = "-" if e["acceptance"] is None else f"{e['acceptance']:.3f}"
        compiled = "yes" if e.get("compiled") else ("EAGER!" if e["arm"].endswith("-compiled") else "no")
        if e.get("dynamo_frames_timed"):
            compiled += f" (+{e['dynamo_frames_timed']} frames timed)"
        lines.append(f"{e['prompt_kind']:<10} {e['arm']:<22} {e['tokens_per_s']:>8.1f} {e['ms_per_token']:>9.2f} "
                     f"{acceptance:>10} {e['drafted']:>8} {_identical(e):>13} {compiled:>8}")
    return "\n".join(lines)


# ------------------------------------------------------------------ command line


def build_parser():
    import argparse

    from .shapes import SHAPES

    parser = argparse.ArgumentParser(prog="hf-replayssm bench generate", description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="qwen3_5,nemotron_h,kimi_linear",
                        help=f"comma-separated: shaped random-weight models {sorted(SHAPES)}, a bundled model "
                        "(e.g. tiny-gdn-copy) or a saved model's folder")
    parser.add_argument("--batches", default="1,64,256")
    parser.add_argument("--prompt", type=int, default=512, help="prompt tokens")
    parser.add_argument("--new", type=int, default=256, help="new tokens per sequence")
    parser.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, from {ARMS + EXTRA_ARMS}")
    parser.add_argument("--repeats", type=int, default=2, help="timed runs per arm, after one warm-up run")
    parser.add_argument("--buffer-len", type=int, default=16)
    parser.add_argument("--backend", default="auto", help="ReplayCache backend (auto: Triton on CUDA)")
    parser.add_argument("--compile-backend", default="inductor", help="torch.compile backend of the compiled arms")
    parser.add_argument("--compile-mode", help="torch.compile mode ('none' for no mode; default reduce-overhead "
                        "with inductor, none with other backends)")
    parser.add_argument("--prefill-chunk", type=int, help="transformers' prefill_chunk_size, every arm (default: "
                        "one prefill forward)")
    parser.add_argument("--layers", type=int, help="the first N layers of each model's pattern, repeated as needed "
                        "(32: Qwen3.5-4B's depth)")
    parser.add_argument("--tiny", action="store_true", help="tiny hidden sizes (CPU tests, smoke runs)")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--sdpa", default="default", choices=SDPA_CHOICES,
                        help="pin attention to one SDPA backend for the whole run (efficient: no cuDNN graph builds)")
    parser.add_argument("--device", default=default_device(), help="default: cuda where there is a GPU, else cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--speculative", action="store_true", help="batch 1 speculative decoding instead (greedy vs "
                        "prompt lookup vs a draft model, repetitive prompts)")
    parser.add_argument("--speculative-arms", default=",".join(SPECULATIVE_ARMS),
                        help=f"comma-separated, from {SPECULATIVE_ARMS + SPECULATIVE_EXTRA_ARMS}")
    parser.add_argument("--prompt-kinds", help=f"comma-separated, from {PROMPT_KINDS + TOKENIZER_PROMPT_KINDS} "
                        "(default: passage for a model with a tokenizer, else the synthetic kinds)")
    parser.add_argument("--lookup", type=int, default=10, help="prompt_lookup_num_tokens")
    parser.add_argument("--draft-layers", type=int, default=4, help="layers of the draft model: the first N of the "
                        "family's pattern, same shapes and vocabulary (include an attention layer: transformers' "
                        "Kimi-Linear fails without one)")
    parser.add_argument("--draft-init", choices=("copy", "random"), default="copy", help="copy: the draft takes the "
                        "main model's embeddings, first layers and head (a truncated copy); random: its own weights")
    parser.add_argument("--draft-model", help="the draft arms' model: a bundled name or a saved folder (default: a "
                        "shaped main model's truncated copy, --draft-layers; none for a bundled or saved main model)")
    parser.add_argument("--out", help="write the results as JSON here")
    return parser


def _settings(args) -> Settings:
    mode = args.compile_mode or ("reduce-overhead" if args.compile_backend == "inductor" else None)
    return Settings(buffer_len=args.buffer_len, backend=args.backend, compile_backend=args.compile_backend,
                    compile_mode=None if mode == "none" else mode, prefill_chunk=args.prefill_chunk)


def _raise_recompile_limit(limit: int = 64) -> None:
    """Several compiled arms and batch sizes share one compiled ``__call__`` (transformers keeps one per model): more
    graphs than dynamo's default limit of 8 per code object."""
    import torch._dynamo.config as config

    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(config, name):
            setattr(config, name, max(getattr(config, name), limit))


def _bench_model(name: str, args, settings: Settings) -> list[dict]:
    dtype = getattr(torch, args.dtype)
    model = build_model(name, args.device, dtype, args.tiny, args.layers, args.seed)
    entries = []
    for batch in (int(b) for b in args.batches.split(",")):
        rows = measure_generate(model, batch, args.prompt, args.new, args.arms.split(","), args.repeats, settings,
                                args.seed)
        rows = [{"model": name, "model_class": type(model).__name__, "layers": _num_layers(model),
                 "weights_bytes": _weights_bytes(model), **row} for row in rows]
        title = "" if entries else (f"== {name}-like ({type(model).__name__}, {_num_layers(model)} layers), prompt "
                                    f"{args.prompt}, {args.new} new tokens: decode tokens/s, ratio to the best stock "
                                    "arm")
        print(table(rows, title), flush=True)
        entries += rows
    return entries


def is_saved_model(name: str) -> bool:
    """A bundled model name or a folder holding a saved model (as opposed to a shaped random-weight model)."""
    from pathlib import Path

    from ..models import BUNDLED

    return name in BUNDLED or Path(name, "config.json").is_file()


def speculative_models(name: str, args):
    """(model, draft or None, tokenizer or None, draft description) of one ``--speculative`` model."""
    from ..models import load_model

    dtype = getattr(torch, args.dtype)
    if is_saved_model(name):
        model, tokenizer = load_model(name, device=args.device, dtype=dtype)
    else:
        model, tokenizer = build_model(name, args.device, dtype, args.tiny, args.layers, args.seed), None
    if args.draft_model:
        draft, _ = load_model(args.draft_model, device=args.device, dtype=dtype)
        return model, draft, tokenizer, dict(draft_model=args.draft_model, draft_layers=_num_layers(draft))
    if tokenizer is not None or is_saved_model(name):
        return model, None, tokenizer, dict(draft_model=None, draft_layers=None)
    draft = build_model(name, args.device, dtype, args.tiny, args.draft_layers, args.seed + 1)
    if args.draft_init == "copy":
        copy_shared_weights(draft, model)
    return model, draft, tokenizer, dict(draft_model=None, draft_layers=args.draft_layers, draft_init=args.draft_init)


def _speculate_model(name: str, args, settings: Settings) -> list[dict]:
    model, draft, tokenizer, about_draft = speculative_models(name, args)
    kinds = args.prompt_kinds.split(",") if args.prompt_kinds else None
    rows = measure_speculative(model, draft, args.prompt, args.new, args.lookup, args.speculative_arms.split(","),
                               kinds, args.repeats, settings, args.seed, tokenizer)
    rows = [{"model": name, "layers": _num_layers(model), **about_draft, **row} for row in rows]
    like = "" if is_saved_model(name) else "-like"
    draft_text = (f"draft {about_draft['draft_model'] or ''} of {about_draft['draft_layers']} layers"
                  if about_draft["draft_layers"] else "no draft model")
    print(speculative_table(rows, f"== {name}{like} ({type(model).__name__}, {_num_layers(model)} layers), batch 1, "
                            f"prompt {args.prompt}, {args.new} new tokens, {draft_text}"), flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    settings = _settings(args)
    _raise_recompile_limit()
    results = {"environment": {**environment(args.device), "argv": sys.argv[1:] if argv is None else list(argv)},
               "settings": vars(args), "results": [], "speculative": []}
    with sdpa_backend(args.sdpa):
        for name in args.models.split(","):
            if args.speculative:
                results["speculative"] += _speculate_model(name, args, settings)
            else:
                results["results"] += _bench_model(name, args, settings)
            if args.device.startswith("cuda"):
                torch.cuda.empty_cache()
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2)
    return 0
