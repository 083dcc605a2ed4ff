"""Per-rank script of the tensor-parallel test, run under ``torchrun`` (``tests/test_tensor_parallel.py``).

Usage: ``torchrun --nproc-per-node 2 tests/tp_worker.py MODEL_DIR OUT_DIR``. Loads the saved tiny model with
``tp_plan="auto"`` (on CPU transformers picks the gloo backend), generates greedily from ``MODEL_DIR/prompt.pt``
with a stock cache and with a ``ReplayCache``, and writes each rank's tokens and per-step logits to
``OUT_DIR/rank{r}.pt``. An exception is written to ``OUT_DIR/rank{r}.err`` (the test shows it) before re-raising.
"""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path

import torch

GREEDY_KW = dict(do_sample=False, max_new_tokens=16, min_new_tokens=16, output_logits=True,
                 return_dict_in_generate=True, suppress_tokens=[0])


def greedy(model, prompt, cache):
    """Tokens [B, P + 16] and logits [B, 16, V] of greedy generation through ``cache`` (None: stock cache)."""
    from hf_replayssm import cache_argument

    kwargs = {} if cache is None else {cache_argument(model): cache}
    with torch.no_grad():
        out = model.generate(prompt, attention_mask=torch.ones_like(prompt), **kwargs, **GREEDY_KW)
    return out.sequences, torch.stack(out.logits, dim=1)


def tp_facts(model) -> dict:
    """What the TP load did: the TP size and every parameter's local (this rank's) shape."""
    shapes = {name: tuple(param.to_local().shape if hasattr(param, "to_local") else param.shape)
              for name, param in model.named_parameters()}
    return {"tp_size": getattr(model, "tp_size", None), "local_shapes": shapes}


def generations(model, prompt) -> dict:
    """Greedy runs keyed by cache: stock, ReplayCache() (16 tokens: no flush) and ReplayCache(buffer_len=4)
    (flushes every 4 tokens); each a (tokens, logits) pair, plus the replay caches' stats."""
    from hf_replayssm import ReplayCache

    result = {"stock": greedy(model, prompt, None)}
    for name, buffer_len in (("replay", 16), ("replay_l4", 4)):
        cache = ReplayCache(buffer_len=buffer_len)
        result[name] = greedy(model, prompt, cache)
        result[f"{name}_stats"] = cache.stats()
    return result


def run(model_dir: Path, out_dir: Path) -> None:
    from transformers import AutoModelForCausalLM, DistributedConfig

    model = AutoModelForCausalLM.from_pretrained(
        model_dir, distributed_config=DistributedConfig(tp_plan="auto"), dtype=torch.float32
    ).eval()
    result = {"facts": tp_facts(model), **generations(model, torch.load(model_dir / "prompt.pt"))}
    torch.save(result, out_dir / f"rank{os.environ['RANK']}.pt")


def main() -> None:
    model_dir, out_dir = Path(sys.argv[1]), Path(sys.argv[2])
    try:
        run(model_dir, out_dir)
    except BaseException:
        (out_dir / f"rank{os.environ.get('RANK', 0)}.err").write_text(traceback.format_exc())
        raise
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
