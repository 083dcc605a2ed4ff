"""What a speculative round's ``crop`` costs on the host: a static ReplayCache inside transformers' assisted loop,
its verify forwards compiled (Dynamo's eager backend on the CPU), every ``crop`` timed and told apart by its path:
on the device (``ReplayCache._crop_on_device``: the SSM layers commit the kept drafts on device positions) or the
host way (a crop that completes a period: the positions handed back, the period folded, the positions entered
again). Runs on the CPU in about a minute:

    python benchmarks/offline/crop_cost.py --model tiny-gdn-copy --prompt 300 --new 200 --lookup 10
    python benchmarks/offline/crop_cost.py --model qwen3_5_text --layers 32   # random weights, 24 GDN layers

A bundled model decodes a passage said several times (prompt lookup accepts drafts, some crops complete a period);
a tiny random-weight model of a model type (``--layers`` deep, one attention layer in four) a prompt of repeated
random tokens (few drafts accepted: nearly every crop is on the device).

To compare two versions, run it from each checkout (``PYTHONPATH=<checkout>``) one after another, twice.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers.generation import CompileConfig

from hf_replayssm import ReplayCache, cache_argument
from hf_replayssm import cache as cache_module
from hf_replayssm.bench.generate import _vocab, speculative_prompt
from hf_replayssm.models import load_model
from hf_replayssm.tiny import TINY_CONFIGS, tiny_model


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="tiny-gdn-copy", help="a bundled model, a saved folder or a model type")
    parser.add_argument("--layers", type=int, default=8, help="layers of a tiny model type")
    parser.add_argument("--prompt", type=int, default=300)
    parser.add_argument("--new", type=int, default=200)
    parser.add_argument("--lookup", type=int, default=10)
    parser.add_argument("--buffer-len", type=int, default=16)
    parser.add_argument("--runs", type=int, default=2, help="the last run counts (the first compiles)")
    args = parser.parse_args()
    if args.model in TINY_CONFIGS:
        layer_types = (["linear_attention"] * 3 + ["full_attention"]) * (args.layers // 4)
        model = tiny_model(args.model, initializer_range=0.2, num_hidden_layers=len(layer_types),
                           layer_types=layer_types)
        block = torch.randint(3, model.config.vocab_size, (1, 20), generator=torch.Generator().manual_seed(0))
        ids = block.repeat(1, -(-args.prompt // 20))[:, : args.prompt]
    else:
        model, tokenizer = load_model(args.model, device="cpu", dtype=torch.float32)
        ids = speculative_prompt("passage", _vocab(model), args.prompt, 0, tokenizer)
    times: dict[str, list[float]] = {"device": [], "host": []}
    crop, on_device = cache_module.ReplayCache.crop, cache_module.ReplayCache._crop_on_device
    took_device = [False]

    def noting_path(self, count):
        took_device[0] = on_device(self, count)
        return took_device[0]

    def timed_crop(self, count):
        start = time.perf_counter()
        crop(self, count)
        times["device" if took_device[0] else "host"].append((time.perf_counter() - start) * 1e6)

    cache_module.ReplayCache._crop_on_device = noting_path
    cache_module.ReplayCache.crop = timed_crop
    config = CompileConfig(backend="eager", fullgraph=False, mode=None)
    config._compile_all_devices = True  # transformers compiles on CUDA only otherwise
    for _ in range(args.runs):
        for values in times.values():
            values.clear()
        cache = ReplayCache(args.buffer_len, max_cache_len=ids.shape[1] + args.new + args.lookup + 2)
        with torch.no_grad():
            model.generate(ids, **{cache_argument(model): cache}, prompt_lookup_num_tokens=args.lookup,
                           compile_config=config, do_sample=False, max_new_tokens=args.new, eos_token_id=None)
    for path, values in times.items():
        summary = (f"median {statistics.median(values):.1f} us, mean {statistics.mean(values):.1f} us"
                   if values else "none")
        print(f"crops {path:6s} {len(values):4d}: {summary}")
    print(f"all crops of the run: {sum(map(sum, times.values())) / 1e3:.1f} ms")


if __name__ == "__main__":
    main()
