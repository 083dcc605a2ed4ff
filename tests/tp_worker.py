"""Per-rank script of the tensor-parallel test, run under ``torchrun`` (``tests/test_tensor_parallel.py``).

Usage: ``torchrun --nproc-per-node 2 tests/tp_worker.py OUT_DIR MODEL_DIR [MODEL_DIR ...]``. Loads each saved tiny
model with ``DistributedConfig(tp_plan="auto")`` (transformers initialises gloo on CPU ranks, NCCL on GPU ones),
generates greedily from ``MODEL_DIR/prompt.pt`` with a stock cache and with ReplayCaches, and writes each rank's
results to ``OUT_DIR/{MODEL_DIR name}.rank{r}.pt``. An exception is written to ``OUT_DIR/rank{r}.err`` (the test
shows it) before re-raising. One launch serves every model: starting the ranks costs more than the models.
"""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path

import torch

NEW_TOKENS = 16
GREEDY_KW = dict(do_sample=False, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, output_logits=True,
                 return_dict_in_generate=True, suppress_tokens=[0])


def greedy(model, prompt, cache, **kwargs):
    """Tokens [B, P + 16] and logits [B, 16, V] of greedy generation through ``cache`` (None: stock cache)."""
    from hf_replayssm import cache_argument

    if cache is not None:
        kwargs[cache_argument(model)] = cache
    prompt = prompt.to(model.device)
    with torch.no_grad():
        out = model.generate(prompt, attention_mask=torch.ones_like(prompt), **kwargs, **GREEDY_KW)
    return out.sequences.cpu(), torch.stack(out.logits, dim=1).cpu()


def local_shapes(model) -> dict[str, tuple]:
    """Every parameter's shape on this rank (a DTensor's local shard)."""
    return {name: tuple(param.to_local().shape if hasattr(param, "to_local") else param.shape)
            for name, param in model.named_parameters()}


def cache_shapes(cache) -> dict[str, tuple]:
    """Shapes this rank's cache holds: each attention layer's keys, each SSM layer's checkpoint (a short-conv layer
    has none)."""
    shapes = {f"checkpoint.{idx}": tuple(layer.checkpoint.shape) for idx, layer in cache.replay_layers.items()
              if layer.checkpoint is not None}
    for idx, layer in enumerate(cache.layers):
        keys = getattr(layer, "keys", None)
        if idx not in cache.replay_layers and isinstance(keys, torch.Tensor) and keys.numel():
            shapes[f"keys.{idx}"] = tuple(keys.shape)
    return shapes


def replay_caches(prompt_len: int) -> dict:
    """name: (fresh ReplayCache, extra generate kwargs, batch rows used). "replay": the default (16 tokens: no
    flush); "replay_l4": flushes every 4 tokens; "replay_static": ``max_cache_len``, the compiled-decoding cache
    (device-side positions) run eagerly, flushing every 4 tokens; "replay_lookup": prompt-lookup speculation (batch 1
    only in transformers), rejected drafts rolled back by ``crop``."""
    from hf_replayssm import ReplayCache

    # the GPU test runs the torch reference in its ranks: what it checks is the NCCL machinery
    backend = os.environ.get("REPLAYSSM_TP_BACKEND", "auto")
    return {
        "replay": (ReplayCache(backend=backend), {}, None),
        "replay_l4": (ReplayCache(buffer_len=4, backend=backend), {}, None),
        # eager: on CUDA, generate() compiles the forward by itself for a compileable cache, which in both ranks of
        # three sharded models outlasted the test's limit on the H200 (240 s); compiled decoding has its own tests
        "replay_static": (ReplayCache(buffer_len=4, max_cache_len=prompt_len + NEW_TOKENS, backend=backend),
                          {"disable_compile": True}, None),
        "replay_lookup": (ReplayCache(buffer_len=4, backend=backend), {"prompt_lookup_num_tokens": 3}, 1),
    }


def generations(model, prompt) -> dict:
    """Greedy runs keyed by cache: "stock" and each of ``replay_caches``, a (tokens, logits) pair, plus each
    ReplayCache's stats and cache shapes under "{name}_stats" / "{name}_shapes"."""
    result = {"stock": greedy(model, prompt, None)}
    for name, (cache, kwargs, rows) in replay_caches(prompt.shape[1]).items():
        result[name] = greedy(model, prompt[:rows], cache, **kwargs)
        result[f"{name}_stats"] = cache.stats()
        result[f"{name}_shapes"] = cache_shapes(cache)
    return result


def run(out_dir: Path, model_dirs: list[Path]) -> None:
    from transformers import AutoModelForCausalLM, DistributedConfig

    for model_dir in model_dirs:
        model = AutoModelForCausalLM.from_pretrained(
            model_dir, distributed_config=DistributedConfig(tp_plan="auto"), dtype=torch.float32
        ).eval()
        result = {"tp_size": model.tp_size, "local_shapes": local_shapes(model)}
        result.update(generations(model, torch.load(model_dir / "prompt.pt")))
        torch.save(result, out_dir / f"{model_dir.name}.rank{os.environ['RANK']}.pt")


def main() -> None:
    out_dir, model_dirs = Path(sys.argv[1]), [Path(arg) for arg in sys.argv[2:]]
    # GPU ranks (NCCL): float32 matmuls and convolutions at float32 precision, to compare with a CPU reference
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    rank = os.environ.get("RANK", 0)
    try:
        run(out_dir, model_dirs)
        if torch.distributed.is_initialized():
            # both ranks done before either tears its process group down: a rank destroying gloo while its peer
            # still sends once aborted the peer natively ("terminate called without an active exception", CI)
            torch.distributed.barrier()
        # Past the barrier every rank has saved every result. torch 2.11's gloo teardown below still aborted a
        # rank natively in CI (stop 54: SIGABRT, no traceback, and torchrun then killed its peer); the marker
        # lets the test tell such an abort from a failed run.
        (out_dir / f"rank{rank}.barrier").write_text("every rank saved its results\n")
    except BaseException:
        (out_dir / f"rank{rank}.err").write_text(traceback.format_exc())
        raise
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
    # leaving without interpreter finalization skips the thread destructors such aborts come from
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)

if __name__ == "__main__":
    main()
