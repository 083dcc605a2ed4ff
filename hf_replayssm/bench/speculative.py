"""Batched speculative decoding against plain batched greedy decoding, both on a ReplayCache.

    hf-replayssm bench speculative --models small-mamba2,qwen3_5 --batches 1,16,64 --prompt 512 --new 128
    hf-replayssm bench speculative --models small-mamba2 --drafts tiny-mamba2 --batches 1,16,64   # + a draft model

Per model and batch size, on repetitive prompts (bundled Shakespeare models: a passage of Hamlet said twice, each
row from another line; shaped random-weight models: ``bench.generate``'s synthetic code-edit and summary prompts),
plain greedy ``generate()`` with a ReplayCache against ``batched_prompt_lookup`` (every row drafts by prompt lookup,
one forward verifies all rows, each row keeps what matches). Reported: new tokens per second (the tokens the batch
emitted, up to each row's end of sequence, over the wall time, prefill included, the same for both arms),
acceptance, verify forwards, whether every row's tokens equal plain greedy (where not: each differing row's first
differing position and greedy's margin there, in ulps of the model's dtype; printed ``ties {rows}r<={ulps}ulp``
when every one is a near-tie, at most ``TIE_ULPS`` = 4, that batched bf16 rounding can flip), and the time spent in
per-row rollback (``ReplayCache.drop_rows``) as a fraction of the run, against what the per-draft snapshot approach
would add (each SSM layer's state copied once per window position and the accepted one restored, per verify round:
measured as those copies on the same device, a lower bound). Models: a bundled name (``small-mamba2``, ``small-kda``,
``small-gdn``), a saved model folder with its tokenizer (e.g. a fine-tune that copies repeated text:
``python -m hf_replayssm.models.train --init-from ... --repeat-mix 0.5``), or a shaped random-weight model
(``qwen3_5``, ``nemotron_h``, ``kimi_linear``; ``--tiny`` cuts them down). Each arm runs once untimed first (same
lengths); arms alternate over repeats and the best run counts. On CUDA the verify windows run the Triton verify
kernels (the part of a window past a flush boundary from a checkpoint the fold kernel stages), plain greedy the
decode-step kernels.
"""

from __future__ import annotations

import argparse
import functools
import json
import time
from collections.abc import Sequence

import torch

from ..batched import DRAFT_SCHEDULES, stop_tokens, until_stop
from . import default_device
from .attention import SDPA_CHOICES, sdpa_backend
from .compiles import JitCompiles, describe
from .step import _sync


def _load(name: str, device: str, dtype: torch.dtype, tiny: bool):
    """(model, tokenizer or None): a bundled model or a saved model folder with its tokenizer, or a shaped
    random-weight model."""
    from pathlib import Path

    from ..models import BUNDLED, load_model
    from .generate import build_model

    if name in BUNDLED or Path(name, "config.json").is_file():
        return load_model(name, device=device, dtype=dtype)
    return build_model(name, device, dtype, tiny=tiny), None


def repetitive_batch(vocab: int, batch: int, length: int, seed: int = 0, tokenizer=None) -> torch.Tensor:
    """[batch, length] repetitive prompts. With a tokenizer (the bundled Shakespeare models): a passage of Hamlet
    said twice, each row starting at another line, so the continuation repeats text the prompt holds. Without one:
    ``bench.generate``'s synthetic code-edit and summary prompts, alternating, each row from its own seed."""
    if tokenizer is not None:
        from ..demo import DEFAULT_PROMPT

        lines = DEFAULT_PROMPT.splitlines(keepends=True)
        rows = []
        for r in range(batch):
            passage = "".join(lines[r % len(lines) :] + lines[: r % len(lines)])
            ids = tokenizer(passage)["input_ids"]
            rows.append((ids * (2 * length // max(len(ids), 1) + 2))[:length])
        return torch.tensor(rows)
    from .generate import code_edit_prompt, summary_prompt

    builders = (code_edit_prompt, summary_prompt)
    return torch.cat([builders[r % 2](vocab, length, seed=seed + r) for r in range(batch)])


class RollbackClock:
    """Wall time spent in ``ReplayCache.drop_rows`` (device-synchronised around each call), and the part of it spent
    storing checkpoints at flush boundaries the verify window crossed (``commit_seconds``: a fold of the kept
    records, or a staged checkpoint copied in), which plain decoding spends at its flushes too; the rest is the
    rollback itself. ``host_seconds``: the same calls up to their return, before the synchronisation after them (the
    host's share: launching the rollback's kernels; in a host-bound decode loop their device time overlaps the next
    forward's launches; commits inside a call are synchronised by their own timer, so their device time counts).
    Layers get their timers when their schedules exist (after the prefill)."""

    def __init__(self, cache):
        self.seconds, self.commit_seconds, self.host_seconds, self._cache = 0.0, 0.0, 0.0, cache
        self._inside = False
        original = cache.drop_rows

        def timed(dropped):
            device = next(iter(cache.replay_layers.values())).schedule.device
            for layer in cache.replay_layers.values():
                self._wrap_commits(layer.schedule, device)
            _sync(device)
            start = time.perf_counter()
            self._inside = True
            try:
                original(dropped)
            finally:
                self._inside = False
            self.host_seconds += time.perf_counter() - start  # launching it: what a host-bound loop pays
            _sync(device)
            self.seconds += time.perf_counter() - start

        cache.drop_rows = timed

    def _wrap_commits(self, schedule, device) -> None:
        if getattr(schedule, "_clocked", False):
            return
        original = schedule._commit_staged_or_fold

        def timed(boundary):
            if not self._inside:
                return original(boundary)
            _sync(device)
            start = time.perf_counter()
            original(boundary)
            _sync(device)
            self.commit_seconds += time.perf_counter() - start

        schedule._commit_staged_or_fold = timed
        schedule._clocked = True


class ForwardClock:
    """Device-synchronised wall time of every forward of ``model`` while active, by input width (tokens per row: the
    prefill, 1 for a greedy step, 1 + drafts for a verify forward). What a round spends outside them is drafting and
    bookkeeping on the host. The synchronisations cost the arm its CPU/GPU overlap, so it is opt-in
    (``--time-forwards``) and its runs say so."""

    def __init__(self, model):
        self.model, self.by_width = model, {}

    def __enter__(self):
        original, device = self.model.forward, next(self.model.parameters()).device

        @functools.wraps(original)  # generate() checks its kwargs against forward's signature (``cache=`` on 5.25)
        def timed(*args, **kwargs):
            ids = kwargs.get("input_ids", args[0] if args else None)
            width = int(ids.shape[-1]) if isinstance(ids, torch.Tensor) else 0
            _sync(device)
            start = time.perf_counter()
            out = original(*args, **kwargs)
            _sync(device)
            calls, seconds = self.by_width.get(width, (0, 0.0))
            self.by_width[width] = (calls + 1, seconds + time.perf_counter() - start)
            return out

        self.model.forward = timed
        return self

    def __exit__(self, *exc):
        del self.model.forward  # the instance attribute: the class's forward again
        return False

    def summary(self) -> dict:
        """{"seconds": all forwards, "calls": n, "by_width": {width: [calls, seconds]}}"""
        return dict(seconds=sum(s for _, s in self.by_width.values()), calls=sum(c for c, _ in self.by_width.values()),
                    by_width={str(w): [c, s] for w, (c, s) in sorted(self.by_width.items())})


def snapshot_seconds_per_round(cache, window: int, repeats: int = 3) -> float:
    """What the per-draft snapshot approach (vLLM / SGLang hybrid speculation) spends per verify round that a
    ReplayCache does not: every SSM layer writes its state once per window position (``window`` state copies into
    a preallocated buffer) and restores the accepted one (one more copy). Timed here as those copies of this
    cache's own checkpoints (device-synchronised, best of ``repeats``); the verify math itself is left out, so the
    estimate is a lower bound."""
    states = [layer.schedule.checkpoint() for layer in cache.replay_layers.values()]
    states = [s for s in states if s is not None]
    if not states:
        return 0.0
    device = states[0].device
    buffers = [torch.empty((window, *s.shape), dtype=s.dtype, device=device) for s in states]
    best = float("inf")
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        for state, buffer in zip(states, buffers, strict=True):
            for position in range(window):
                buffer[position].copy_(state)
            state.copy_(buffer[window - 1])  # the accepted position's state back (equal contents here)
        _sync(device)
        best = min(best, time.perf_counter() - start)
    return best


def _eos(model):
    """The model's end-of-sequence id or ids (a generation config may list several), or None."""
    return model.generation_config.eos_token_id


def _until_eos(tokens: list[int], eos) -> list[int]:
    return until_stop(tokens, stop_tokens(eos))


def run_arm(model, ids: torch.Tensor, arm: str, new_tokens: int, lookup: int, buffer_len: int,
            draft_model=None, time_forwards: bool = False) -> dict:
    """One timed run; tokens per row up to (and with) the end of sequence, which every arm stops at. Arms:
    ``greedy`` (plain batched ``generate``), ``lookup`` (batched prompt lookup), ``draft`` (batched speculation with
    ``draft_model``). ``time_forwards``: also the main model's forwards by width (``ForwardClock``)."""
    if time_forwards:
        with ForwardClock(model) as clock:
            run = run_arm(model, ids, arm, new_tokens, lookup, buffer_len, draft_model)
        return dict(run, forwards=clock.summary())
    from ..batched import batched_prompt_lookup
    from ..batched_draft import DraftModelDrafter
    from ..cache import ReplayCache, cache_argument

    cache, eos = ReplayCache(buffer_len), _eos(model)
    _sync(ids.device)
    with JitCompiles() as compiles:
        start = time.perf_counter()
        extra = {}
        if arm == "greedy":
            with torch.no_grad():
                out = model.generate(ids, do_sample=False, max_new_tokens=new_tokens, **{cache_argument(model): cache})
            tokens = [_until_eos(row, eos) for row in out[:, ids.shape[1] :].tolist()]
        else:
            clock = RollbackClock(cache)
            kind, _, schedule = arm.partition("-")  # "lookup", "draft", "lookup-heuristic", "draft-heuristic"
            drafter = DraftModelDrafter(draft_model, buffer_len, max_drafts=lookup) if kind == "draft" else None
            result = batched_prompt_lookup(model, ids, max_new_tokens=new_tokens, num_draft_tokens=lookup, cache=cache,
                                           eos_token_id=eos, drafter=drafter, draft_schedule=schedule or "constant")
            tokens = result.new_tokens
            extra = dict(acceptance=result.acceptance, drafted=result.drafted, accepted=result.accepted,
                         verify_forwards=result.forwards, rollback_seconds=clock.seconds,
                         rollback_commit_seconds=clock.commit_seconds, rollback_host_seconds=clock.host_seconds)
        _sync(ids.device)
        seconds = time.perf_counter() - start
    extra["jit_compiles"] = compiles.summary()  # kernels compiled inside the timed run (None: not countable)
    if arm != "greedy":  # measured after the timed run, on the same cache
        extra["snapshot_seconds"] = snapshot_seconds_per_round(cache, lookup + 1) * extra["verify_forwards"]
    return dict(arm=arm, seconds=seconds, tokens=tokens, **extra)


def first_divergences(greedy: list[list[int]], other: list[list[int]], logits: torch.Tensor,
                      dtype: torch.dtype, reference: list[list[int]] | None = None) -> list[dict]:
    """Per row whose tokens differ from plain greedy's: the first differing new-token position, and how far the
    other arm's token there trailed greedy's in greedy's own logits (``logits`` [B, new, V], greedy's scores at each
    step): ``margin`` in logit units and ``ulps``, the margin in spacings of ``dtype`` at the top logit's magnitude.
    A margin of an ulp or two is a near-tie that the rounding of a wider batched forward can flip (bf16 rounds
    logits of 4-8 to steps of 2^-5); a larger one would be a wrong rollback. Rows that only differ in length (one
    stopped earlier) report the first position past the shorter one, margin None. ``reference``: the tokens of the
    run that produced ``logits``; where they part from ``greedy`` before the position, those logits belong to another
    prefix (plain greedy itself did not repeat: bf16 ties and nondeterministic kernels), so the row gets
    ``reference_differs`` and no margin."""
    spacing = torch.finfo(dtype).eps
    found = []
    for row, (want, got) in enumerate(zip(greedy, other, strict=True)):
        if want == got:
            continue
        shorter = min(len(want), len(got))
        position = next((i for i in range(shorter) if want[i] != got[i]), shorter)
        entry = dict(row=row, position=position, margin=None, ulps=None)
        if reference is not None and reference[row][:position] != want[:position]:
            entry["reference_differs"] = True
        elif position < shorter and position < logits.shape[1]:
            scores = logits[row, position].float()
            top = scores[want[position]]
            entry["margin"] = float(top - scores[got[position]])
            ulp = spacing * 2.0 ** torch.floor(torch.log2(top.abs().clamp_min(torch.finfo(torch.float32).tiny)))
            entry["ulps"] = float(entry["margin"] / ulp)
        found.append(entry)
    return found


def greedy_logits(model, ids: torch.Tensor, new_tokens: int, buffer_len: int) -> tuple[torch.Tensor, list]:
    """[B, new, V] scores of an untimed plain greedy run with a ReplayCache, and its tokens per row (up to the end of
    sequence): the timed greedy run's, unless a near-tie rounded another way this time."""
    from ..cache import ReplayCache, cache_argument

    with torch.no_grad():
        out = model.generate(ids, do_sample=False, max_new_tokens=new_tokens, output_logits=True,
                             return_dict_in_generate=True,
                             **{cache_argument(model): ReplayCache(buffer_len)})
    tokens = [_until_eos(row, _eos(model)) for row in out.sequences[:, ids.shape[1] :].tolist()]
    return torch.stack(out.logits, dim=1), tokens


# the widest margin, in ulps of the model's dtype, still called a near-tie: summing in another order (a wider verify
# forward, another conv) moves a bf16 logit by an ulp or two; a wrong token trails greedy's by far more
TIE_ULPS = 4


def _identity_label(entry: dict) -> str:
    if entry["identical"]:
        return "True"
    worst = [d["ulps"] for d in entry["divergences"] if d["ulps"] is not None]
    unrepeated = sum(bool(d.get("reference_differs")) for d in entry["divergences"])
    if worst and max(worst) <= TIE_ULPS and len(worst) + unrepeated == len(entry["divergences"]):
        # "+3?": rows where greedy did not repeat
        return f"ties {len(worst)}r<={max(worst):.0f}ulp" + (f"+{unrepeated}?" if unrepeated else "")
    return "False"


# a verify window of each kernel tile and form: the token form (up to 2 tokens), the steps / product forms at the
# window tiles (BLOCK_T) 4, 8 and 16
WARM_WINDOWS = (2, 3, 4, 8, 16)


def warm_verify_widths(model, ids: torch.Tensor, lookup: int, buffer_len: int) -> list[int]:
    """One verify window of each width in :data:`WARM_WINDOWS` up to ``lookup + 1``, so that every verify kernel a
    timed run could launch is compiled before it: a warm-up run's windows follow what it drafted, which the timed
    run need not repeat (H200 run 98: the unpinned arm compiled five verify kernels inside its timing). The drafts
    are constant tokens, so each run's first round verifies a full window. Returns the draft counts run."""
    from ..batched import batched_prompt_lookup
    from ..cache import ReplayCache

    drafts = sorted({min(lookup, width - 1) for width in WARM_WINDOWS}) if lookup >= 1 else []
    for n in drafts:
        batched_prompt_lookup(model, ids, max_new_tokens=n + 2, num_draft_tokens=n, cache=ReplayCache(buffer_len),
                              drafter=lambda row, tokens, k: [tokens[-1]] * k)
    return drafts


def measure(model, batch: int, prompt: int, new_tokens: int, lookup: int = 10, buffer_len: int = 16,
            repeats: int = 1, seed: int = 0, tokenizer=None, draft_model=None,
            schedules: Sequence[str] = ("constant",), time_forwards: bool = False) -> list[dict]:
    """One entry per speculative arm (``lookup``, and ``draft`` when a draft model is given; with the
    ``"heuristic"`` draft schedule also ``lookup-heuristic`` / ``draft-heuristic``), each against plain batched
    greedy decoding measured in the same run."""
    device = next(model.parameters()).device
    ids = repetitive_batch(model.config.get_text_config().vocab_size, batch, prompt, seed, tokenizer).to(device)
    kinds = ("lookup", "draft") if draft_model is not None else ("lookup",)
    arms = ("greedy", *(kind if schedule == "constant" else f"{kind}-{schedule}" for kind in kinds
                        for schedule in schedules))
    for arm in arms:  # warm-up at the same lengths
        run_arm(model, ids, arm, new_tokens, lookup, buffer_len, draft_model)
    if device.type == "cuda":  # Triton kernels compile per window tile: every one before the timed runs
        warm_verify_widths(model, ids, lookup, buffer_len)
    best: dict[str, dict] = {}
    for _ in range(repeats):
        for arm in arms:
            run = run_arm(model, ids, arm, new_tokens, lookup, buffer_len, draft_model, time_forwards)
            if arm not in best or run["seconds"] < best[arm]["seconds"]:
                best[arm] = run
    greedy = best["greedy"]
    emitted = sum(map(len, greedy["tokens"]))
    entries = []
    reference_logits = None
    for arm in arms[1:]:
        run = best[arm]
        entry = dict(arm=arm, batch=batch, prompt=prompt, new_tokens=new_tokens, lookup=lookup, buffer_len=buffer_len,
                     emitted_tokens=emitted, greedy_tokens_per_s=emitted / greedy["seconds"],
                     lookup_tokens_per_s=sum(map(len, run["tokens"])) / run["seconds"],
                     identical=run["tokens"] == greedy["tokens"],
                     **{k: v for k, v in run.items() if k not in ("arm", "tokens", "seconds")})
        if not entry["identical"]:  # where the rows part, and whether each is a near-tie of greedy's scores
            if reference_logits is None:
                reference_logits, reference_tokens = greedy_logits(model, ids, new_tokens, buffer_len)
            entry["divergences"] = first_divergences(greedy["tokens"], run["tokens"], reference_logits,
                                                     next(model.parameters()).dtype, reference_tokens)
        entry["greedy_jit_compiles"] = greedy["jit_compiles"]
        if time_forwards:
            entry["greedy_forwards"] = greedy["forwards"]
        entry["speedup"] = entry["lookup_tokens_per_s"] / entry["greedy_tokens_per_s"]
        entry["rollback_fraction"] = run["rollback_seconds"] / run["seconds"]
        # without the checkpoint stores at crossed flush boundaries (plain decoding flushes too)
        entry["rollback_fraction_without_commits"] = (
            (run["rollback_seconds"] - run["rollback_commit_seconds"]) / run["seconds"])
        entry["rollback_host_fraction"] = run["rollback_host_seconds"] / run["seconds"]
        entry["snapshot_fraction"] = run["snapshot_seconds"] / run["seconds"]
        entries.append(entry)
    return entries


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hf-replayssm bench speculative", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="small-mamba2,small-kda,small-gdn")
    parser.add_argument("--batches", default="1,16,64")
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--new", type=int, default=128)
    parser.add_argument("--lookup", type=int, default=10, help="drafts per row and round")
    parser.add_argument("--buffer-len", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--device", default=default_device(), help="default: cuda where there is a GPU, else cpu")
    parser.add_argument("--dtype", default=None, help="default: bfloat16 on CUDA, float32 elsewhere")
    parser.add_argument("--tiny", action="store_true", help="shaped models cut down (CPU smoke runs)")
    parser.add_argument("--drafts", default=None,
                        help="comma-separated draft models, one per --models entry (a bundled name or a shaped model, "
                             "same vocabulary; e.g. tiny-mamba2 for small-mamba2): adds a 'draft' arm")
    parser.add_argument("--sdpa", default="default", choices=SDPA_CHOICES,
                        help="pin attention to one SDPA backend for the whole run (efficient: no cuDNN graph builds)")
    parser.add_argument("--schedules", default="constant",
                        help="draft schedules, comma-separated: constant (num drafts every round), heuristic (per row: "
                             "+2 after a fully accepted round, -1 otherwise; adds the *-heuristic arms)")
    parser.add_argument("--time-forwards", action="store_true",
                        help="also time every forward of the main model by input width (device-synchronised, which "
                             "costs the arms their CPU/GPU overlap): where a round's time goes")
    parser.add_argument("--out", help="JSON results")
    return parser


def main(argv: list[str] | None = None) -> int:
    from .generate import environment

    args = build_parser().parse_args(argv)
    schedules = tuple(args.schedules.split(","))
    if not schedules or any(s not in DRAFT_SCHEDULES for s in schedules):
        raise SystemExit(f"--schedules: each of {DRAFT_SCHEDULES}, got {args.schedules!r}")
    dtype = getattr(torch, args.dtype) if args.dtype else (torch.bfloat16 if args.device.startswith("cuda")
                                                           else torch.float32)
    results = {"environment": environment(args.device), "settings": vars(args), "results": []}
    names = args.models.split(",")
    drafts = args.drafts.split(",") if args.drafts else [None] * len(names)
    if len(drafts) != len(names):
        raise SystemExit(f"--drafts names {len(drafts)} models for {len(names)} --models entries")
    with sdpa_backend(args.sdpa):
        _run_models(args, names, drafts, dtype, schedules, results)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2)
    return 0


def _run_models(args, names, drafts, dtype, schedules, results) -> None:
    for name, draft_name in zip(names, drafts, strict=True):
        model, tokenizer = _load(name, args.device, dtype, args.tiny)
        draft = _load(draft_name, args.device, dtype, args.tiny)[0] if draft_name else None
        versus = "prompt lookup" + (f" / draft model {draft_name}" if draft else "")
        print(f"== {name}: batched {versus} vs plain greedy (ReplayCache, buffer_len {args.buffer_len})")
        print("batch arm              greedy tok/s  spec tok/s  speedup  acceptance  verify fwd  rollback  "
              "(no flushes)  (host)  snapshots  identical")
        for batch in (int(b) for b in args.batches.split(",")):
            for entry in measure(model, batch, args.prompt, args.new, args.lookup, args.buffer_len, args.repeats,
                                 tokenizer=tokenizer, draft_model=draft, schedules=schedules,
                                 time_forwards=args.time_forwards):
                is_draft = entry["arm"].startswith("draft")
                entry = dict(model=name, draft_model=draft_name if is_draft else None, **entry)
                results["results"].append(entry)
                print(f"{batch:5d} {entry['arm']:16s} {entry['greedy_tokens_per_s']:12.1f} "
                      f"{entry['lookup_tokens_per_s']:11.1f} {entry['speedup']:7.2f}x {entry['acceptance']:11.2f} "
                      f"{entry['verify_forwards']:11d} {100 * entry['rollback_fraction']:8.2f}% "
                      f"{100 * entry['rollback_fraction_without_commits']:12.2f}% "
                      f"{100 * entry['rollback_host_fraction']:6.2f}% "
                      f"{100 * entry['snapshot_fraction']:9.2f}% {_identity_label(entry):>10}", flush=True)
                for label, compiled in (("greedy", entry["greedy_jit_compiles"]),
                                        (entry["arm"], entry["jit_compiles"])):
                    if compiled:  # a timed run that compiled kernels measured the JIT too
                        print(f"      warning: the timed {label} run compiled Triton kernels ({describe(compiled)})",
                              flush=True)
                if args.time_forwards:
                    for label, forwards in (("greedy", entry["greedy_forwards"]), (entry["arm"], entry["forwards"])):
                        widths = ", ".join(f"width {w}: {c} x {1e3 * t / c:.2f} ms"
                                           for w, (c, t) in forwards["by_width"].items())
                        print(f"      {label} forwards {forwards['seconds']:.3f} s ({widths})", flush=True)
        del model, draft
