"""Cache memory of ReplayCache against transformers' stock cache, and the prefill peak, measured on one model.

``memory()`` reports what the cache keeps alive; this benchmark also measures what the device allocator holds
after the run (the two must agree) and the peak allocation during the prefill, for the stock ``DynamicCache`` and
each precision policy, interleaved on one model and one input (``--device cpu`` for a smoke run).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import torch

from . import default_device


def _storages(tensors) -> int:
    seen: dict[int, int] = {}
    for t in tensors:
        if isinstance(t, torch.Tensor):
            storage = t.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def stock_cache_bytes(cache) -> int:
    """Bytes of every tensor a stock transformers cache holds (K/V, conv and recurrent states)."""
    tensors = []
    for layer in cache.layers:
        for name in ("keys", "values"):
            tensors.append(getattr(layer, name, None))
        for name in ("conv_states", "recurrent_states"):
            tensors.extend((getattr(layer, name, None) or {}).values())
    return _storages(tensors)


def _allocated(device: torch.device) -> int:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        return torch.cuda.memory_allocated(device)
    return 0


def _peak(device: torch.device) -> int:
    return torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0


def measure_memory(model, batch: int = 256, prompt: int = 512, new_tokens: int = 20, piece: int = 128,
                   policies: Sequence[str] = ("fp32", "separated-fp8", "separated-nvfp4", "bf16"),
                   buffer_len: int = 16, seed: int = 0) -> dict:
    """Prefill ``prompt`` tokens (in forwards of ``piece`` tokens), decode ``new_tokens``, for the stock cache and
    each policy. Returns per arm: cache bytes (stock: its tensors; ReplayCache: ``memory()``), bytes the allocator
    still holds for the cache after the run, and the prefill peak above the model's own memory."""
    from transformers import DynamicCache

    from ..cache import ReplayCache, cache_argument

    device = next(model.parameters()).device
    key = cache_argument(model)
    generator = torch.Generator().manual_seed(seed)
    vocab = model.config.get_text_config(decoder=True).vocab_size
    ids = torch.randint(3, vocab, (batch, prompt + new_tokens), generator=generator).to(device)
    results: dict = {"batch": batch, "prompt": prompt, "new_tokens": new_tokens, "piece": piece,
                     "buffer_len": buffer_len, "arms": {}}
    for arm in ("stock", *policies):
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
        base = _allocated(device)
        cache = DynamicCache(config=model.config) if arm == "stock" else ReplayCache(buffer_len, precision=arm)
        with torch.no_grad():
            for start in range(0, prompt, piece):
                model(ids[:, start : min(prompt, start + piece)], **{key: cache}, use_cache=True, logits_to_keep=1)
            prefill_peak = _peak(device) - base
            for pos in range(prompt, prompt + new_tokens):
                model(ids[:, pos : pos + 1], **{key: cache}, use_cache=True, logits_to_keep=1)
        held = _allocated(device) - base
        if arm == "stock":
            entry = {"cache_bytes": stock_cache_bytes(cache)}
        else:
            report = cache.memory()
            entry = {"cache_bytes": report["total"], "components": report, "stock_total": report["stock_total"]}
        entry.update(allocator_bytes=held, prefill_peak_bytes=prefill_peak)
        results["arms"][arm] = entry
        del cache
    stock = results["arms"]["stock"]
    for entry in results["arms"].values():
        entry["cache_vs_stock"] = entry["cache_bytes"] / stock["cache_bytes"]
        if stock["prefill_peak_bytes"]:
            entry["prefill_peak_vs_stock"] = entry["prefill_peak_bytes"] / stock["prefill_peak_bytes"]
    return results


def table(results: dict, title: str = "") -> str:
    gib = 2**30
    lines = [title, f"batch {results['batch']}, prompt {results['prompt']} (+{results['new_tokens']} decoded), "
             f"buffer_len {results['buffer_len']}", "",
             f"{'arm':<16} {'cache GiB':>10} {'vs stock':>9} {'allocator GiB':>14} {'prefill peak GiB':>17} "
             f"{'vs stock':>9}"]
    for arm, e in results["arms"].items():
        peak = e.get("prefill_peak_vs_stock")
        lines.append(f"{arm:<16} {e['cache_bytes'] / gib:>10.3f} {e['cache_vs_stock']:>8.3f}x "
                     f"{e['allocator_bytes'] / gib:>14.3f} {e['prefill_peak_bytes'] / gib:>17.3f} "
                     f"{(f'{peak:.3f}x' if peak else '-'):>9}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    import argparse

    from .shapes import PREFILL_PIECE, SHAPES, shaped_model

    parser = argparse.ArgumentParser(prog="hf-replayssm bench memory", description=__doc__)
    parser.add_argument("--models", default="qwen3_5,nemotron_h", help=f"comma-separated, from {sorted(SHAPES)}")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--new-tokens", type=int, default=20)
    parser.add_argument("--piece", type=int, help="prefill forwards of this many tokens (default: per model)")
    parser.add_argument("--policies", default="fp32,separated-fp8,separated-nvfp4,bf16")
    parser.add_argument("--device", default=default_device(), help="default: cuda where there is a GPU, else cpu")
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args(argv)
    everything = {"device": torch.cuda.get_device_name() if args.device == "cuda" else args.device,
                  "torch": torch.__version__}
    for name in args.models.split(","):
        model = shaped_model(name, device=args.device)
        piece = args.piece or PREFILL_PIECE.get(name, 64)
        result = measure_memory(model, args.batch, args.prompt, args.new_tokens, piece, args.policies.split(","))
        everything[name] = result
        print(table(result, f"== {name}-like ({type(model).__name__}) on {everything['device']}"), flush=True)
        del model
    if args.out:
        with open(args.out, "w") as f:
            json.dump(everything, f, indent=2)
    return 0
