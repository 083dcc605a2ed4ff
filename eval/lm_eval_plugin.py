"""lm-evaluation-harness model ``hf-replayssm``: Hugging Face models evaluated through a ``ReplayCache``.

``ReplaySSMLM`` is lm-eval's ``HFLM`` with a fresh ``ReplayCache`` per batch:

* generation tasks (``generate_until``, e.g. ``gpqa_diamond_cot_zeroshot_local``) run ``generate()`` with the cache;
* with ``score_through_cache=True`` (the default), log-likelihood tasks (multiple choice, e.g.
  ``gpqa_diamond_zeroshot_local``) are scored through the decode path: each batch's context is prefilled into the
  cache (in chunks of ``prefill_chunk`` tokens; 0 = one forward) and the continuation tokens are stepped through it
  one at a time, so the state-storage precision actually enters the scores. Plain ``HFLM`` scores with one parallel
  forward and no cache, where the policy never matters. ``score_through_cache=False`` restores that.

Model args (``--model_args k=v,...``; strings are cast): ``pretrained`` (a hub id, a local folder, or a bundled model
name: ``tiny-gdn``, ``tiny-mamba2``), ``precision`` (a preset, e.g. ``fp32``, ``shared-nvfp4``), ``buffer_len``,
``backend``, ``score_through_cache``, ``prefill_chunk``, plus everything ``HFLM`` takes (``batch_size``, ``dtype``,
``max_length``, ``think_end_token``, ...). Bundled models load in float32 unless ``dtype`` is given.

Right padding: lm-eval right-pads a scoring batch. Each row's padding comes after its last real token, so in a causal
model (and in a recurrent state) it cannot reach any position that is scored; the batch is therefore prefilled up to
its shortest context and stepped together from there. With ``batch_size=1`` every context is prefilled whole.

Data parallel: under ``accelerate launch --multi_gpu --num_processes N`` each rank scores its share of the documents
with its own caches and rank 0 writes the results. On CPU ranks (gloo) set ``ACCELERATE_USE_CPU=1`` with that command
(``accelerate launch --cpu`` starts one process). ``replayssm_caches_built`` / ``replayssm_cache_stats`` in the
results' ``config`` are rank 0's counts.

Command line (``hf-replayssm lm-eval ...`` or ``python -m hf_replayssm.eval.lm_eval_plugin ...``) takes lm-eval's own
arguments, with this model registered and the package's task folder on the include path::

    hf-replayssm lm-eval run --model hf-replayssm \\
        --model_args pretrained=tiny-gdn,precision=shared-nvfp4,buffer_len=16 \\
        --tasks gpqa_diamond_zeroshot_local --metadata '{"gpqa_path": "/path/to/gpqa_diamond.csv"}' \\
        --output_path results/ --log_samples
"""

from __future__ import annotations

import contextlib
import sys
from collections import Counter
from pathlib import Path

import torch
import torch.nn.functional as F
from lm_eval.api.registry import register_model
from lm_eval.models.huggingface import HFLM
from lm_eval.models.utils import Collator
from tqdm import tqdm

from ..cache import BACKENDS, ReplayCache, cache_argument
from ..models import BUNDLED, bundled_path
from ..precision import resolve_policy

MODEL_NAME = "hf-replayssm"
TASKS_DIR = Path(__file__).resolve().parent / "tasks"

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def _as_bool(name: str, value) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return bool(value)
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError(f"{name} must be a boolean (true/false), got {value!r}")


def _as_int(name: str, value) -> int:
    try:
        return int(str(value).strip()) if not isinstance(value, int) else value
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {value!r}") from None


@register_model(MODEL_NAME)
class ReplaySSMLM(HFLM):
    """``HFLM`` whose generation and (optionally) scoring run through a fresh ``ReplayCache`` per batch.

    ``caches_built`` counts the caches made and ``cache_stats`` sums their ``stats()`` after each use (decode steps,
    flushes, checkpoint writes, ...), which shows the cache was really used."""

    def __init__(
        self,
        pretrained="tiny-gdn",
        precision: str = "fp32",
        buffer_len: int | str = 16,
        backend: str = "auto",
        score_through_cache: bool | str = True,
        prefill_chunk: int | str = 0,
        device: str | None = None,
        dtype=None,
        **kwargs,
    ) -> None:
        self.precision = str(precision)
        self.buffer_len = _as_int("buffer_len", buffer_len)
        self.replay_backend = str(backend)
        self.score_through_cache = _as_bool("score_through_cache", score_through_cache)
        self.prefill_chunk = _as_int("prefill_chunk", prefill_chunk)
        if self.prefill_chunk < 0:
            raise ValueError(f"prefill_chunk must be >= 0 (0 = the whole context in one forward), got {prefill_chunk}")
        if self.buffer_len < 1:
            raise ValueError(f"buffer_len must be >= 1, got {buffer_len!r}")
        if self.replay_backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        resolve_policy(self.precision)  # an unknown preset fails here, before the model loads
        self.caches_built = 0
        self.cache_stats: Counter = Counter()
        if isinstance(pretrained, str) and pretrained in BUNDLED:
            tokenizer = kwargs.get("tokenizer")
            pretrained = str(bundled_path(pretrained))
            if tokenizer is None or tokenizer in BUNDLED:
                kwargs["tokenizer"] = pretrained
            dtype = dtype or "float32"
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        super().__init__(pretrained=pretrained, device=device, dtype=dtype or "auto", **kwargs)
        self._split_work_over_cpu_ranks()

    def _split_work_over_cpu_ranks(self) -> None:
        """Data parallelism on CPU ranks (``ACCELERATE_USE_CPU=1 accelerate launch --multi_gpu --num_processes N``,
        gloo). HFLM takes its rank and world size from the Accelerator only when it counts more than one CUDA device,
        so on CPU every rank kept ``rank 0 of 1``: each scored the whole task (N times the work, for the same result).
        Taking them from the Accelerator here makes lm-eval split the requests, pad the ranks to equal batch counts
        and gather the per-sample results on rank 0, as on GPUs. Each rank still builds its own caches per batch."""
        accelerator = getattr(self, "accelerator", None)
        if accelerator is None or accelerator.num_processes <= 1 or self._world_size > 1:
            return
        self._rank = accelerator.process_index  # the global rank: torch.distributed.gather_object(dst=0) uses it
        self._world_size = accelerator.num_processes

    # ------------------------------------------------------------------ caches
    def new_cache(self) -> ReplayCache:
        """A fresh, unbound ReplayCache with this model's policy (it binds on its first forward)."""
        self.caches_built += 1
        return ReplayCache(buffer_len=self.buffer_len, precision=self.precision, backend=self.replay_backend)

    def _record(self, cache: ReplayCache) -> None:
        self.cache_stats.update({key: value for key, value in cache.stats().items() if key != "ssm_layers"})

    def get_model_info(self) -> dict:
        """Settings, plus this process's cache counters, which show in the saved results that the ReplayCache was
        used. lm-eval asks only rank 0 (after the run), so data-parallel counts are rank 0's share of the work."""
        info = super().get_model_info()
        info.update(replayssm_precision=self.precision, replayssm_buffer_len=self.buffer_len,
                    replayssm_backend=self.replay_backend, replayssm_score_through_cache=self.score_through_cache,
                    replayssm_world_size=self.world_size, replayssm_caches_built=self.caches_built,
                    replayssm_cache_stats=dict(self.cache_stats))
        return info

    # ------------------------------------------------------------------ generation
    def _model_generate(self, context, max_length: int, stop: list[str], **generation_kwargs) -> torch.Tensor:
        cache = self.new_cache()
        generation_kwargs.pop("past_key_values", None)
        generation_kwargs.pop("cache", None)
        generation_kwargs[cache_argument(self.model)] = cache
        try:
            return super()._model_generate(context, max_length, stop, **generation_kwargs)
        finally:
            self._record(cache)

    # ------------------------------------------------------------------ scoring
    def _decode_logits(self, inps: torch.Tensor, prefill: int) -> torch.Tensor:
        """Logits [batch, seq, vocab] of ``inps`` fed through a fresh cache: positions [0, prefill) as a prefill (in
        chunks of ``prefill_chunk``), then one token per forward."""
        cache = self.new_cache()
        key = cache_argument(self.model)
        seq = inps.shape[1]
        prefill = max(1, min(prefill, seq))
        chunk = self.prefill_chunk or prefill
        spans = [(start, min(start + chunk, prefill)) for start in range(0, prefill, chunk)]
        spans += [(pos, pos + 1) for pos in range(prefill, seq)]
        logits = []
        try:
            with (
                torch.no_grad(),
                torch.autocast(device_type=self.device.type, dtype=self.mixed_precision_dtype,
                               enabled=self.mixed_precision_dtype is not None),
            ):
                for start, stop in spans:
                    out = self.model(input_ids=inps[:, start:stop], use_cache=True, **{key: cache})
                    logits.append(out.logits)
        finally:
            self._record(cache)
        return torch.cat(logits, dim=1)

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, override_bs: int | None = None):
        """HFLM's scoring (same request order, truncation, one-token-continuation grouping, results and cache hooks)
        with the logits taken from the decode path: each batch prefilled up to its shortest context, then stepped."""
        if not self.score_through_cache or self.backend != "causal":
            return super()._loglikelihood_tokens(requests, disable_tqdm=disable_tqdm, override_bs=override_bs)

        def _collate(req):
            toks = req[1] + req[2]
            return -len(toks), tuple(toks)

        def _lookup_one_token_cont(req):
            return req[-2] + req[-1][:-1]

        re_ord = Collator(requests, sort_fn=_collate, group_by="contexts" if self.logits_cache else None,
                          group_fn=_lookup_one_token_cont)
        batch_size = override_bs or (self.batch_size if isinstance(self.batch_size, int) else 1)
        pbar = tqdm(total=len(requests), disable=disable_tqdm or self.rank != 0,
                    desc="Running loglikelihood requests (ReplayCache decode path)")
        res = []
        for chunk in re_ord.get_batched(n=batch_size):
            inps, inplens, cont_toks_list = [], [], []
            for _, context_enc, continuation_enc in chunk:
                assert len(context_enc) > 0 and len(continuation_enc) > 0
                assert len(continuation_enc) <= self.max_length
                inp = (context_enc + continuation_enc)[-(self.max_length + 1):][:-1]
                inps.append(inp)
                inplens.append(len(inp))
                cont_toks_list.append(continuation_enc)
            width = max(inplens)
            pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
            batched = torch.full((len(inps), width), pad, dtype=torch.long, device=self.device)
            for row, inp in enumerate(inps):  # right padding: after each row's last scored position
                batched[row, : len(inp)] = torch.tensor(inp, dtype=torch.long, device=self.device)
            # the logits at position inplen - contlen predict the first continuation token: the context is
            # positions [0, inplen - contlen] of the input
            prefill = min(n - len(c) + 1 for n, c in zip(inplens, cont_toks_list, strict=True))
            multi_logits = F.log_softmax(self._decode_logits(batched, prefill), dim=-1, dtype=self.softmax_dtype)

            for (request_str, ctx_tokens, _), logits, inplen, cont_toks in zip(
                chunk, multi_logits, inplens, cont_toks_list, strict=True
            ):
                logits = self._select_cont_toks(logits, contlen=len(cont_toks), inplen=inplen).unsqueeze(0)
                greedy_tokens = logits.argmax(dim=-1)
                for req_str, cont, cont_logits in re_ord.get_cache(
                    req_str=request_str, cxt_toks=ctx_tokens, cont_toks=cont_toks, logits=logits
                ):
                    cont = torch.tensor(cont, dtype=torch.long, device=self.device).unsqueeze(0)
                    max_equal = (greedy_tokens[:, -cont.shape[1]:] == cont).all()
                    picked = torch.gather(cont_logits, 2, cont.unsqueeze(-1)).squeeze(-1)
                    answer = (float(picked.sum()), bool(max_equal))
                    res.append(answer)
                    if req_str is not None:
                        self.cache_hook.add_partial("loglikelihood", req_str, answer)
                    pbar.update(1)
        pbar.close()
        return re_ord.get_original(res)


# ---------------------------------------------------------------------- launcher
@contextlib.contextmanager
def _with_task_dir(task_dir: Path):
    """Every TaskManager the lm-eval CLI builds also indexes ``task_dir`` (after any --include_path)."""
    import lm_eval.tasks

    original = lm_eval.tasks.TaskManager

    class TaskManager(original):
        def __init__(self, *args, include_path=None, **kwargs):
            paths = [] if include_path is None else (
                list(include_path) if isinstance(include_path, (list, tuple)) else [include_path])
            if str(task_dir) not in [str(p) for p in paths]:
                paths.append(str(task_dir))
            super().__init__(*args, include_path=paths, **kwargs)

    lm_eval.tasks.TaskManager = TaskManager
    try:
        yield
    finally:
        lm_eval.tasks.TaskManager = original


def main(argv: list[str] | None = None) -> int:
    """lm-eval's command line (``lm-eval run|ls|validate ...``; ``run`` may be left out) with the ``hf-replayssm``
    model registered and this package's tasks (``gpqa_diamond_zeroshot_local``, ``gpqa_diamond_cot_zeroshot_local``,
    the synthetic ``recall`` group) on the include path."""
    from lm_eval.__main__ import cli_evaluate

    argv = list(sys.argv[1:] if argv is None else argv)
    saved = sys.argv
    sys.argv = ["lm-eval", *argv]
    try:
        with _with_task_dir(TASKS_DIR):
            cli_evaluate()
    finally:
        sys.argv = saved
    return 0


if __name__ == "__main__":
    sys.exit(main())
