"""Long-run KL study of state-precision policies against an fp32 reference (the protocol of the evaluation notes).

1. **Trajectory.** The fp32 policy generates ``tokens`` tokens from each prompt (greedy, or seeded sampling); the
   prompts are the batch rows. Prompts are cut to the token length of the shortest one so the batch is rectangular
   (no padding). The token ids are saved (``trajectory.pt``) so a resumed run forces exactly the same sequence.
2. **Teacher forcing through the decode path.** For each (prompt, policy) arm the prompt is prefilled and the
   trajectory is fed one token at a time through a ReplayCache with per-row policies: the fp32 reference rows (one
   per prompt) step in lockstep with the arm rows in the same cache, so the reference log-probabilities are never
   stored. By default one cache per policy (rows: references + that policy on every prompt); with ``batch_rows``
   every policy is a group of rows of one cache. An ``"fp32"`` control arm is always run (added if missing): its
   log-probabilities must equal the reference rows' exactly, or the run fails with ``ApparatusError`` (on the CPU,
   whose kernels can round a row by its place in the batch, to ``CONTROL_TOLERANCE``;
   ``meta["control_max_logp_diff"]`` is the control's largest difference, 0 when exact). With
   ``window`` W > 1, W tokens per forward go through the speculative-window path (each token still reads the
   checkpoint at its own flush boundary plus the records before it, as a decode step does): W times fewer forwards,
   the same outputs up to the float rounding of batched matmuls. On the CPU teacher forcing runs on one thread (a
   matmul's rows split between threads can round differently, which the exact control would catch).
3. **Numerics.** KL(P_fp32 || P_policy) over the full vocabulary from float32 log-softmax, summed in float64, computed
   online on the device; per step only the per-arm scalars are kept (KL, top-1 agreement, |delta log p| of the
   trajectory's token), so memory per step is constant (nothing O(tokens x vocab)).
4. **Report.** Per policy: mean KL with its standard error over prompts, median, p99, p99.9, max, top-1 agreement,
   mean |delta log p| of the trajectory token and the mean KL per log-spaced position bin. ``kl.json`` and ``kl.png``
   (KL against position, log x axis) go under ``out``; every finished arm is saved atomically under ``out/arms`` and,
   with ``resume``, not recomputed.

    from hf_replayssm.eval.kl import kl_study
    result = kl_study(model, tokenizer, ["separated-nvfp4", "shared-nvfp4"], tokens=4096, out="kl-run")

    hf-replayssm eval kl --model small-gdn --policies bf16,separated-nvfp4,shared-nvfp4 --tokens 32768 --window 16 \
        --batch-rows --out kl-run
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import hashlib
import json
import math
import os
import platform
import re
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from ..bench.generate import cudagraph_skips
from ..cache import ReplayCache, cache_argument
from ..precision import resolve_policy
from .precision_check import DEFAULT_POLICIES, position_bins

CONTROL = "fp32"
DEFAULT_PROMPTS = (
    "ROMEO:\nBut soft, what light through yonder window breaks? It is the east, and Juliet is the sun.",
    "First Citizen:\nBefore we proceed any further, hear me speak. You are all resolved rather to die than to famish?",
    "KING HENRY V:\nOnce more unto the breach, dear friends, once more; or close the wall up with our English dead.",
    "HAMLET:\nTo be, or not to be, that is the question: whether 'tis nobler in the mind to suffer the slings.",
)
RANDOM_PROMPT_TOKENS = 16  # prompts drawn at random (seeded) when the model has no tokenizer
ARM_FORMAT = 1


# On the CPU, where torch's kernels can round a row differently by its place in the batch (see _teacher_force), the
# control arm must stay within this many nats of every log-probability of its reference (a bf16 checkpoint in a
# control row is about 1e-3 off); on CUDA it must be exact.
CONTROL_TOLERANCE = 1e-5


class ApparatusError(RuntimeError):
    """The measurement itself is broken: the fp32 control arm does not reproduce the fp32 reference (exactly, or to
    ``CONTROL_TOLERANCE`` on the CPU, whose kernels can round a row by its place in the batch)."""


# ---------------------------------------------------------------------------------------------------- helpers
def _policy_name(policy) -> str:
    resolve_policy(policy)  # validates
    return policy if isinstance(policy, str) else repr(policy)


def _is_control(policy) -> bool:
    return resolve_policy(policy) == resolve_policy(CONTROL)


def _digest(*parts) -> str:
    h = hashlib.sha256()
    for part in parts:
        if isinstance(part, torch.Tensor):
            h.update(part.detach().cpu().to(torch.int64).contiguous().numpy().tobytes())
        else:
            h.update(json.dumps(part, sort_keys=True).encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9.+_-]", "_", name)[:48] + "-" + hashlib.sha1(name.encode()).hexdigest()[:8]


def _atomic_write(path: Path, write) -> None:
    """``write(file_object)`` into a temporary file next to ``path``, then rename it over ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp's 0600 is for the temporary file only
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _versions() -> dict:
    import transformers

    from .. import __version__

    return {"hf_replayssm": __version__, "torch": torch.__version__, "transformers": transformers.__version__,
            "python": platform.python_version()}


def _prompt_ids(model, tokenizer, prompts, seed: int, device) -> tuple[torch.Tensor, list[str] | None]:
    """[P, L] prompt ids (cut to the shortest prompt) and the prompt texts (None for id prompts)."""
    texts = None
    if prompts is None:
        if tokenizer is None:
            vocab = model.config.get_text_config().vocab_size
            generator = torch.Generator().manual_seed(seed)
            ids = [torch.randint(3, vocab, (RANDOM_PROMPT_TOKENS,), generator=generator).tolist()
                   for _ in range(len(DEFAULT_PROMPTS))]
        else:
            prompts = list(DEFAULT_PROMPTS)
    if prompts is not None:
        prompts = list(prompts)
        if not prompts:
            raise ValueError("prompts: give at least one prompt")
        if all(isinstance(p, str) for p in prompts):
            if tokenizer is None:
                raise ValueError("text prompts need a tokenizer (or give token-id lists)")
            texts = prompts
            ids = [tokenizer(p).input_ids for p in prompts]
        else:
            ids = [list(p.tolist() if isinstance(p, torch.Tensor) else p) for p in prompts]
    length = min(len(i) for i in ids)
    if length < 1:
        raise ValueError("every prompt must have at least one token")
    if any(len(i) != length for i in ids):
        print(f"kl: prompts cut to the shortest prompt's {length} tokens (the batch is rectangular, no padding)",
              file=sys.stderr)
    return torch.tensor([i[:length] for i in ids], dtype=torch.long, device=device), texts


@torch.no_grad()
def _compiled_trajectory_cache(model, buffer_len: int, max_cache_len: int):
    """A static fp32 ReplayCache that transformers' compiled decode path (CUDA graphs) can take, or None with the
    reason when this model / transformers cannot (the caller then decodes eagerly)."""
    try:
        cache = ReplayCache(buffer_len, max_cache_len=max_cache_len)
        cache.bind(model)
    except (TypeError, ValueError) as error:
        return None, str(error)
    if not cache.is_compileable:
        return None, "the static ReplayCache reports is_compileable=False"
    return cache, None


def reference_trajectory(model, prompt_ids: torch.Tensor, tokens: int, sample: bool = False, seed: int = 0,
                         buffer_len: int = 16, compiled: bool = False, info: dict | None = None) -> torch.Tensor:
    """[P, L + tokens] ids: the prompts and their continuation under the fp32 policy (greedy or seeded sampling).

    ``compiled`` decodes through transformers' compiled path (static ReplayCache, ``torch.compile`` with CUDA graphs
    on a GPU): the same fp32 policy and tokens (tested on the CPU). Opt-in: in its one H200 run (32K tokens on the
    bundled small models, three studies sharing the GPU) it took about as long as eager decoding, ~7 min, for a
    reason not yet measured (the eager step is host-bound at ~12 ms). Falls back to eager decoding, with a message,
    where the cache cannot be static or compileable. ``info``, if given, receives ``{"compiled": bool,
    "eager_reason": str | None}`` (how the trajectory was really decoded) and, compiled on CUDA, ``cudagraph_skips``
    (graphs Inductor ran without CUDA graphs)."""
    key = cache_argument(model)
    config = getattr(model, "generation_config", None)
    pad = getattr(config, "pad_token_id", None)
    if pad is None:
        pad = getattr(config, "eos_token_id", None)
        pad = pad[0] if isinstance(pad, (list, tuple)) else pad
    kwargs = dict(max_new_tokens=tokens, min_new_tokens=tokens, do_sample=sample,
                  attention_mask=torch.ones_like(prompt_ids), pad_token_id=pad)
    device = prompt_ids.device
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        cache, reason = (None, None)
        if compiled:
            cache, reason = _compiled_trajectory_cache(model, buffer_len, prompt_ids.shape[1] + tokens)
            if cache is None:
                print(f"kl: trajectory decodes eagerly ({reason})", file=sys.stderr)
        if cache is not None:
            from transformers import CompileConfig

            config = CompileConfig(mode="reduce-overhead" if device.type == "cuda" else None)
            config._compile_all_devices = True  # generate compiles off CUDA only with this flag (CPU tests)
            kwargs["compile_config"] = config
        else:
            cache = ReplayCache(buffer_len=buffer_len)
            kwargs["disable_compile"] = True
        skips = cudagraph_skips()
        sequence = model.generate(prompt_ids, **kwargs, **{key: cache})
        if info is not None:
            info.update(compiled="compile_config" in kwargs, eager_reason=reason if compiled else None)
            if device.type == "cuda" and "compile_config" in kwargs:  # graphs Inductor ran without CUDA graphs
                info["cudagraph_skips"] = cudagraph_skips() - skips
    if sequence.shape[1] != prompt_ids.shape[1] + tokens:
        raise RuntimeError(f"generation stopped after {sequence.shape[1] - prompt_ids.shape[1]} of {tokens} tokens")
    return sequence


# ---------------------------------------------------------------------------------------------------- teacher forcing
@contextlib.contextmanager
def _one_cpu_thread(device: torch.device):
    """On the CPU, one intra-op thread: with several, a batched matmul splits its rows between threads and the
    partitions can round differently, so an fp32 control row would not equal its reference row bit for bit
    (small-gdn, 12 rows, 2 threads: from the first decode step). GPU kernels give every row the same reduction."""
    if device.type != "cpu" or torch.get_num_threads() == 1:
        yield
        return
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


@torch.no_grad()
def teacher_force(model, sequence: torch.Tensor, prompt_len: int, arms: list[tuple[int, str, object]],
                  buffer_len: int = 16, progress: bool = True, desc: str = "teacher forcing",
                  check_every: int = 256, window: int = 1) -> dict[tuple[int, str], dict]:
    """Per-position metrics of ``arms`` [(prompt index, name, policy)], all rows of one ReplayCache.

    Rows: the fp32 reference of every prompt the arms use, then one row per arm. Returns {(prompt, name): {"kl":
    float64 [T], "agree": bool [T], "gap": float64 [T], "ref_match": bool [T]}} on the CPU. Raises ApparatusError if
    an fp32 control arm's log-probabilities ever differ from its reference row's: by any bit on CUDA, by more than
    ``CONTROL_TOLERANCE`` on the CPU. Each arm's record also holds ``"max_logp_diff"``, its largest |delta log p|
    (float64 scalar; 0 for an exact control).

    ``window`` W > 1 feeds W trajectory tokens per forward through the cache's speculative-window path (past
    recording on, every window committed whole): each token's output is computed from the checkpoint at its own
    flush boundary plus the records before it, as one decode step computes it (the exactness that speculative
    decoding relies on), in W times fewer forwards. Only the float rounding of the batched matmuls differs.
    """
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"window must be an int >= 1, got {window!r}")
    with _one_cpu_thread(sequence.device):
        return _teacher_force(model, sequence, prompt_len, arms, buffer_len, progress, desc, check_every, window)


def _teacher_force(model, sequence, prompt_len, arms, buffer_len, progress, desc, check_every, window):
    device = sequence.device
    key = cache_argument(model)
    used = sorted({p for p, _, _ in arms})
    ref_row = {p: i for i, p in enumerate(used)}
    rows = [*used, *(p for p, _, _ in arms)]
    batch = sequence[rows]
    ref_idx = torch.tensor([ref_row[p] for p, _, _ in arms], device=device)
    arm_idx = torch.arange(len(used), len(rows), device=device)
    targets = sequence[[p for p, _, _ in arms], prompt_len:]
    control = torch.tensor([_is_control(policy) for _, _, policy in arms], device=device)
    n, positions = len(arms), sequence.shape[1] - prompt_len
    kl = torch.empty(n, positions, dtype=torch.float64, device=device)
    agree = torch.empty(n, positions, dtype=torch.bool, device=device)
    gap = torch.empty(n, positions, dtype=torch.float64, device=device)
    ref_match = torch.empty(n, positions, dtype=torch.bool, device=device)
    differs = torch.zeros(n, dtype=torch.bool, device=device)
    deviation = torch.zeros(n, dtype=torch.float32, device=device)  # max |delta log p| so far
    # Exact on CUDA. On the CPU, torch's elementwise and matmul kernels can take another code path for a tensor's
    # tail (vector body vs scalar remainder: softplus over [B, H] rounds the last rows differently on an AVX-512
    # machine), so equal rows at other places in the batch may differ in the last bit: there the control must stay
    # within CONTROL_TOLERANCE, and the result says so.
    tolerant = device.type == "cpu"

    def check(pos: int) -> None:
        failed = deviation > CONTROL_TOLERANCE if tolerant else differs
        bad = (failed & control).nonzero().flatten().tolist()
        if bad:
            names = ", ".join(f"{arms[i][1]} on prompt {arms[i][0]}" for i in bad)
            how = f"is more than {CONTROL_TOLERANCE:g} nats off" if tolerant else "differs from"
            raise ApparatusError(f"the fp32 control arm ({names}) {how} the fp32 reference by position {pos}: "
                                 "the decode path is not exact, so the KL of the other arms cannot be trusted")

    cache = ReplayCache(buffer_len=buffer_len, precision=[CONTROL] * len(used) + [policy for _, _, policy in arms])
    keeps_logits = "logits_to_keep" in _forward_parameters(model)
    logits = model(batch[:, :prompt_len], use_cache=True, **({"logits_to_keep": 1} if keeps_logits else {}),
                   **{key: cache}).logits[:, -1:]
    pending = []  # logits [R, V] of the positions to score, in order
    bar = tqdm(total=positions, desc=desc, disable=not progress, leave=False, dynamic_ncols=True)
    for pos in range(positions):
        if not pending:
            pending = list(logits.unbind(1))
        logp = torch.log_softmax(pending.pop(0).float(), dim=-1)
        ref, arm = logp[ref_idx], logp[arm_idx]
        differs |= (ref != arm).any(dim=-1)
        off = torch.where(ref == arm, 0.0, (ref - arm).abs().nan_to_num(nan=float("inf")))  # equal -infs: 0
        torch.maximum(deviation, off.amax(dim=-1), out=deviation)
        ref64 = ref.double()
        kl[:, pos] = (ref64.exp() * (ref64 - arm.double())).sum(dim=-1).clamp_(min=0)
        ref_top = ref.argmax(dim=-1)
        agree[:, pos] = arm.argmax(dim=-1) == ref_top
        target = targets[:, pos : pos + 1]
        gap[:, pos] = (arm.gather(1, target) - ref.gather(1, target)).double().abs().squeeze(1)
        ref_match[:, pos] = ref_top == target.squeeze(1)
        if check_every and (pos + 1) % check_every == 0:
            check(pos)
        bar.update()
        if pos + 1 < positions and not pending:
            count = min(window, positions - 1 - pos)
            step = batch[:, prompt_len + pos : prompt_len + pos + count]
            if window > 1:  # the speculative-window path: past recording on for this forward
                cache.activate_past_recording()
            logits = model(step, use_cache=True, **({"logits_to_keep": count} if keeps_logits else {}),
                           **{key: cache}).logits[:, -count:]
            if window > 1:
                cache.deactivate_past_recording()  # commits the window: nothing of it is rolled back
    bar.close()
    check(positions - 1)
    kl, agree, gap, ref_match = kl.cpu(), agree.cpu(), gap.cpu(), ref_match.cpu()
    # clones: a row view would carry (and torch.save would write) every arm's storage into each arm's file
    return {(p, name): {"kl": kl[i].clone(), "agree": agree[i].clone(), "gap": gap[i].clone(),
                        "ref_match": ref_match[i].clone(), "max_logp_diff": deviation[i].double().cpu()}
            for i, (p, name, _) in enumerate(arms)}


def _forward_parameters(model):
    import inspect

    return inspect.signature(model.forward).parameters


# ---------------------------------------------------------------------------------------------------- statistics
def _control_deviation(records: dict, names: list[str], policies: list, n_prompts: int) -> float | None:
    values = [records[(p, name)].get("max_logp_diff") for name, policy in zip(names, policies, strict=True)
              if _is_control(policy) for p in range(n_prompts)]
    return None if not values or any(v is None for v in values) else max(float(v) for v in values)


def _summary(records: list[dict], bins: list[tuple[int, int]]) -> dict:
    kl = torch.stack([r["kl"] for r in records]).numpy()  # [P, T] float64
    per_prompt = kl.mean(axis=1)
    n = kl.shape[0]
    se = float(per_prompt.std(ddof=1) / math.sqrt(n)) if n > 1 else None
    binned, binned_se = [], []
    for a, b in bins:
        part = kl[:, a:b].mean(axis=1)
        binned.append(float(part.mean()))
        binned_se.append(float(part.std(ddof=1) / math.sqrt(n)) if n > 1 else None)
    flat = kl.ravel()
    return {
        "mean_kl": float(flat.mean()), "se": se, "median": float(np.median(flat)),
        "p99": float(np.percentile(flat, 99)), "p999": float(np.percentile(flat, 99.9)), "max": float(flat.max()),
        "top1_agreement": float(torch.stack([r["agree"] for r in records]).double().mean()),
        "ref_token_logprob_gap": float(torch.stack([r["gap"] for r in records]).mean()),
        "per_prompt_mean_kl": [float(v) for v in per_prompt],
        "binned_kl": binned, "binned_se": binned_se,
    }


def format_table(result: dict) -> str:
    """llama.cpp-style table of a ``kl_study`` result."""
    meta, bins = result["meta"], result["bins"]
    shown = [i for i in range(len(bins)) if len(bins) <= 8 or i in (0, len(bins) - 1) or i % 2 == 1]  # narrow
    heads = ["policy", "mean KL", "± SE", "median", "p99", "max", "top-1",
             *[f"pos {bins[i][0]}-{bins[i][1] - 1}" for i in shown]]
    rows = [heads]
    for name, s in result["policies"].items():
        rows.append([name, f"{s['mean_kl']:.2e}", "-" if s["se"] is None else f"{s['se']:.1e}", f"{s['median']:.1e}",
                     f"{s['p99']:.1e}", f"{s['max']:.1e}", f"{s['top1_agreement']:.2%}",
                     *[f"{s['binned_kl'][i]:.1e}" for i in shown]])
    widths = [max(len(r[i]) for r in rows) for i in range(len(heads))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    title = (f"KL(fp32 || policy), teacher-forced through the decode path: {meta['model']}, "
             f"{meta['n_prompts']} prompts x ({meta['prompt_tokens']} prompt tokens + {meta['positions']} positions), "
             f"{'sampled (seed ' + str(meta['seed']) + ')' if meta['sample'] else 'greedy'}, "
             f"buffer_len={meta['buffer_len']}")
    return "\n".join([title, "", *lines])


def plot(result: dict, path: str | Path) -> None:
    """KL per log-spaced position bin against position (log x), one line per policy, +-SE band; PNG, atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bins = result["bins"]
    x = np.array([math.sqrt((a + 1) * b) for a, b in bins])  # geometric centre of positions a+1 .. b (1-based)
    fig, ax = plt.subplots(figsize=(8, 5))
    any_positive = False
    for name, s in result["policies"].items():
        y = np.array(s["binned_kl"])
        keep = y > 0
        if not keep.any():
            ax.plot([], [], label=f"{name} (exactly 0)")
            continue
        any_positive = True
        (line,) = ax.plot(x[keep], y[keep], marker="o", markersize=3, label=f"{name} (mean {s['mean_kl']:.1e})")
        if s["binned_se"][0] is not None:
            se = np.array(s["binned_se"], dtype=float)
            ax.fill_between(x[keep], np.maximum(y - se, y * 1e-3)[keep], (y + se)[keep], color=line.get_color(),
                            alpha=0.15, linewidth=0)
    ax.set_xscale("log")
    if any_positive:
        ax.set_yscale("log")
    meta = result["meta"]
    ax.set_xlabel("position (generated tokens)")
    ax.set_ylabel("mean KL(fp32 || policy) per bin [nats]")
    ax.set_title(f"{meta['model']}: {meta['n_prompts']} prompts, {meta['positions']} positions, "
                 f"buffer_len={meta['buffer_len']}", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    _atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=120))
    plt.close(fig)


# ---------------------------------------------------------------------------------------------------- the study
def kl_study(model, tokenizer=None, policies=DEFAULT_POLICIES, tokens: int = 1024, prompts=None, *,
             out: str | Path | None = None, sample: bool = False, seed: int = 0, batch_rows: bool = False,
             buffer_len: int = 16, progress: bool = True, resume: bool = False, model_name: str | None = None,
             window: int = 1, compile_trajectory: bool = False) -> dict:
    """Teacher-forced KL(P_fp32 || P_policy) of each policy over ``tokens`` positions from several prompts.

    Args:
        policies: preset names or ``PrecisionPolicy`` objects; ``"fp32"`` (the control) is added first if missing.
        prompts: texts (need ``tokenizer``) or token-id lists; default: ``DEFAULT_PROMPTS``, or seeded random ids
            when there is no tokenizer. Cut to the shortest prompt's length.
        out: directory for ``kl.json``, ``kl.png``, ``trajectory.pt`` and ``arms/`` (per-arm results); ``None``
            writes nothing.
        sample / seed: seeded sampling (the model's generation config) instead of greedy for the reference.
        batch_rows: every policy as rows of one cache (one forward per step); default one cache per policy.
        resume: reuse the trajectory and the finished arms found under ``out`` (they must match this study).
        window: trajectory tokens per teacher-forcing forward (default 1: one decode step per token). W > 1 runs
            the speculative-window path (see :func:`teacher_force`): W times fewer forwards, the same outputs up to
            float rounding (on the bundled models, mean KL per policy within 1 % of W = 1).
        compile_trajectory: generate the reference through transformers' compiled path (static ReplayCache, CUDA
            graphs; see :func:`reference_trajectory`); off by default.

    Returns the JSON document: {"meta": ..., "bins": [[start, stop], ...], "policies": {name: {"mean_kl", "se",
    "median", "p99", "p999", "max", "top1_agreement", "ref_token_logprob_gap", "per_prompt_mean_kl", "binned_kl",
    "binned_se"}}}. TF32 is off while it runs (the protocol), and so is cuDNN's attention backend of SDPA (in torch
    2.11 it builds a graph for every new KV length, 40-60 ms of CPU per decode step on an H200); both are restored
    afterwards.
    """
    with _no_tf32(), _no_cudnn_attention():
        return _kl_study(model, tokenizer, policies, tokens, prompts, out=out, sample=sample, seed=seed,
                         batch_rows=batch_rows, buffer_len=buffer_len, progress=progress, resume=resume,
                         model_name=model_name, window=window, compile_trajectory=compile_trajectory)


@contextlib.contextmanager
def _no_cudnn_attention():
    """SDPA without its cuDNN backend (flash / memory-efficient / math stay): a 32K-token study would otherwise pay a
    cuDNN graph build at every new KV length."""
    enabled = getattr(torch.backends.cuda, "cudnn_sdp_enabled", None)
    if enabled is None:  # a torch without the switch
        yield
        return
    saved = enabled()
    torch.backends.cuda.enable_cudnn_sdp(False)
    try:
        yield
    finally:
        torch.backends.cuda.enable_cudnn_sdp(saved)


@contextlib.contextmanager
def _no_tf32():
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


@torch.no_grad()
def _kl_study(model, tokenizer, policies, tokens, prompts, *, out, sample, seed, batch_rows, buffer_len, progress,
              resume, model_name, window, compile_trajectory=False) -> dict:
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
        raise ValueError(f"tokens must be an int >= 1, got {tokens!r}")
    if resume and out is None:
        raise ValueError("resume needs an output directory (out)")
    policies = list(policies)
    names = [_policy_name(p) for p in policies]
    if len(set(names)) != len(names):
        raise ValueError(f"policies: duplicate names in {names}")
    control_added = not any(_is_control(p) for p in policies)
    if control_added:
        policies.insert(0, CONTROL)
        names.insert(0, CONTROL)
    device = next(model.parameters()).device
    dtype = next(model.parameters()).dtype
    model_name = model_name or getattr(model.config, "_name_or_path", "") or type(model).__name__
    out = Path(out) if out is not None else None

    prompt_ids, texts = _prompt_ids(model, tokenizer, prompts, seed, device)
    n_prompts, prompt_len = prompt_ids.shape
    seed_used = seed if sample or texts is None else None  # the sampling seed, or that of random prompts
    study = {"model": model_name, "prompt_ids": _digest(prompt_ids), "tokens": tokens, "sample": sample,
             "seed": seed_used, "buffer_len": buffer_len, "dtype": str(dtype)}

    # 1. the reference trajectory (saved, and reused on resume)
    trajectory_path = out / "trajectory.pt" if out is not None else None
    saved = None
    if resume and trajectory_path.exists():
        saved = torch.load(trajectory_path, map_location="cpu", weights_only=True)
        if saved["study"] != study:
            raise ValueError(f"{trajectory_path} belongs to another study ({saved['study']}, not {study}); use "
                             "another output directory or run without resume")
        sequence = saved["sequence"].to(device=device, dtype=torch.long)
        date = saved["date"]
        decode = saved.get("decode", {"compiled": None})  # trajectories saved before this was recorded: unknown
    else:
        decode = {}
        sequence = reference_trajectory(model, prompt_ids, tokens, sample=sample, seed=seed, buffer_len=buffer_len,
                                        compiled=compile_trajectory, info=decode)
        date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        if trajectory_path is not None:
            record = {"study": study, "sequence": sequence.cpu().to(torch.int32), "date": date, "decode": decode}
            _atomic_write(trajectory_path, lambda f: torch.save(record, f))
    trajectory = _digest(sequence)
    positions = sequence.shape[1] - prompt_len

    # 2. the arms: reuse finished ones, compute the rest (in groups that share one cache)
    def arm_path(prompt: int, name: str) -> Path:
        return out / "arms" / f"p{prompt:03d}-{_slug(name)}.pt"

    def arm_key(prompt: int, name: str) -> dict:
        key = {"format": ARM_FORMAT, "trajectory": trajectory, "prompt": prompt, "policy": name,
               "buffer_len": buffer_len, "dtype": str(dtype)}
        return key if window == 1 else {**key, "window": window}  # arms saved before windows existed stay valid

    records: dict[tuple[int, str], dict] = {}
    todo = []
    for name, policy in zip(names, policies, strict=True):
        for prompt in range(n_prompts):
            path = arm_path(prompt, name) if out is not None else None
            if resume and path.exists():
                saved_arm = torch.load(path, map_location="cpu", weights_only=True)
                if saved_arm["key"] == arm_key(prompt, name):
                    records[(prompt, name)] = saved_arm["metrics"]
                    continue
            todo.append((prompt, name, policy))
    if batch_rows:
        groups = [todo] if todo else []
    else:
        groups = [[arm for arm in todo if arm[1] == name] for name in names]
        groups = [g for g in groups if g]
    for group in groups:
        label = "all policies" if batch_rows else group[0][1]
        done = teacher_force(model, sequence, prompt_len, group, buffer_len=buffer_len, progress=progress,
                             desc=f"{label} ({len(group)} arms)", window=window)
        for (prompt, name), metrics in done.items():
            records[(prompt, name)] = metrics
            if out is not None:
                payload = {"key": arm_key(prompt, name), "metrics": metrics}
                _atomic_write(arm_path(prompt, name), lambda f, payload=payload: torch.save(payload, f))

    # 3. the report
    bins = position_bins(positions)
    ref_match = torch.stack([r["ref_match"] for r in records.values()]).double().mean()
    result = {
        "meta": {
            "model": model_name, "policies": names, "control_added": control_added, "tokens": tokens,
            "positions": positions, "prompts": texts, "n_prompts": n_prompts, "prompt_tokens": prompt_len,
            "buffer_len": buffer_len, "sample": sample, "seed": seed_used, "batch_rows": batch_rows,
            "window": window,
            # the control arms' largest |delta log p| against their references: 0.0 when exact (always on CUDA),
            # at most CONTROL_TOLERANCE on the CPU (None for arms saved before this was recorded)
            "control_max_logp_diff": _control_deviation(records, names, policies, n_prompts),
            "device": device.type, "dtype": str(dtype).removeprefix("torch."),
            "kl": "KL(P_fp32 || P_policy), full vocabulary, float32 log-softmax, float64 sums, teacher-forced",
            # how often the lockstep fp32 reference's argmax is the trajectory's token (1.0 for greedy up to ties)
            "reference_top1_is_trajectory": float(ref_match),
            "trajectory": trajectory, "trajectory_compiled": decode.get("compiled"),
            "versions": _versions(), "date": date,
        },
        "bins": [list(b) for b in bins],
        "policies": {name: _summary([records[(p, name)] for p in range(n_prompts)], bins) for name in names},
    }
    if out is not None:
        text = json.dumps(result, indent=2) + "\n"
        _atomic_write(out / "kl.json", lambda f: f.write(text.encode()))
        plot(result, out / "kl.png")
    return result


# ---------------------------------------------------------------------------------------------------- CLI
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hf-replayssm eval kl", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None,
                        help="bundled model name (tiny-mamba2, tiny-gdn), local path or hub id (default tiny-mamba2)")
    parser.add_argument("--policies", default=",".join(DEFAULT_POLICIES),
                        help="comma-separated precision presets; fp32 (the control) is added if missing "
                             "(default: all presets)")
    parser.add_argument("--tokens", type=int, default=1024, help="generated (and scored) tokens per prompt")
    parser.add_argument("--out", required=True, help="output directory (kl.json, kl.png, trajectory.pt, arms/)")
    parser.add_argument("--prompts", default=None, help="file with one prompt per line (default: built-in prompts)")
    parser.add_argument("--sample", action="store_true", help="sample the reference trajectory instead of greedy")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    parser.add_argument("--batch-rows", action="store_true",
                        help="all policies as batch rows of one cache (default: one cache per policy)")
    parser.add_argument("--buffer-len", type=int, default=16, help="ReplayCache buffer length (default 16)")
    parser.add_argument("--window", type=int, default=1,
                        help="trajectory tokens per teacher-forcing forward through the speculative-window path "
                             "(default 1: one decode step per token; 16 is 16x fewer forwards, the same outputs "
                             "up to float rounding)")
    parser.add_argument("--compile-trajectory", action="store_true",
                        help="generate the reference trajectory through transformers' compiled path (static "
                             "ReplayCache, CUDA graphs); the same tokens as eager")
    parser.add_argument("--device", default=None, help="torch device (default cuda if available, else cpu)")
    parser.add_argument("--dtype", choices=list(DTYPES), default="float32", help="model weights dtype")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--resume", action="store_true", help="reuse the trajectory and finished arms under --out")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.tokens < 1:
        parser.error("--tokens must be at least 1")
    if args.buffer_len < 1:
        parser.error("--buffer-len must be at least 1")
    if args.window < 1:
        parser.error("--window must be at least 1")
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    if not policies:
        parser.error("--policies: give at least one policy")
    try:
        for p in policies:
            resolve_policy(p)
    except (ValueError, KeyError) as error:
        parser.error(f"--policies: {error}")
    prompts = None
    if args.prompts:
        prompts = [line.rstrip("\r\n") for line in Path(args.prompts).read_text(encoding="utf-8").splitlines()]
        prompts = [p for p in prompts if p.strip()]
        if not prompts:
            parser.error(f"--prompts: no prompts in {args.prompts}")

    import transformers

    from ..models import DEFAULT_MODEL, load_model

    transformers.logging.set_verbosity_error()
    model, tokenizer = load_model(args.model, device=args.device, dtype=DTYPES[args.dtype])
    result = kl_study(model, tokenizer, policies, tokens=args.tokens, prompts=prompts, out=args.out,
                      sample=args.sample, seed=args.seed, batch_rows=args.batch_rows, buffer_len=args.buffer_len,
                      progress=not args.no_progress, resume=args.resume, model_name=args.model or DEFAULT_MODEL,
                      window=args.window, compile_trajectory=args.compile_trajectory)
    print(format_table(result))
    print(f"\nwrote {Path(args.out) / 'kl.json'} and {Path(args.out) / 'kl.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
