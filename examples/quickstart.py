"""Quickstart: ReplaySSM decoding and exact speculative rollback on a hybrid model.

    python examples/quickstart.py                         # the bundled tiny Mamba-2 hybrid, on CPU in seconds
    python examples/quickstart.py --model tiny-gdn        # the bundled tiny Gated DeltaNet hybrid
    python examples/quickstart.py --model nvidia/NVIDIA-Nemotron-Nano-9B-v2   # any supported hybrid (needs a GPU)
"""

import argparse

import torch
import transformers

from hf_replayssm import ReplayCache, cache_argument, supported_model_types
from hf_replayssm.models import load_model

PROMPT = (
    "HAMLET. To be, or not to be, that is the question:\n"
    "Whether 'tis nobler in the mind to suffer\n"
    "The slings and arrows of outrageous fortune,\n"
    "HORATIO. To be, or not to be, that is the question:\n"
)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default=None, help="bundled name (tiny-mamba2, tiny-gdn), hub id or path")
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()
    transformers.logging.set_verbosity_error()

    model, tokenizer = load_model(args.model)
    key = cache_argument(model)  # "past_key_values" (transformers 5.17) or "cache" (newer 5.x, where both work)
    print(f"{type(model).__name__}; ReplayCache supports {len(supported_model_types())} model types")
    inputs = tokenizer(PROMPT, return_tensors="pt").to(model.device)
    greedy = dict(do_sample=False, max_new_tokens=args.tokens, min_new_tokens=args.tokens)

    # 1. Stock decoding vs ReplayCache: same tokens, far fewer state writes.
    stock = model.generate(**inputs, **greedy)
    cache = ReplayCache(buffer_len=16)
    replay = model.generate(**inputs, **{key: cache}, **greedy)
    print("same tokens as stock decoding:", torch.equal(stock, replay))
    stats = cache.stats()
    print(f"SSM state writes: stock {stats['ssm_layers'] * args.tokens}, ReplayCache {stats['checkpoint_writes']} "
          f"({stats['flushes']} flushes over {stats['decode_steps']} layer-steps)")

    # 2. Prompt-lookup speculative decoding: transformers refuses it for hybrids; ReplayCache rolls back exactly.
    cache = ReplayCache()
    lookup = model.generate(**inputs, **{key: cache}, prompt_lookup_num_tokens=4, **greedy)
    print("prompt lookup, same tokens:", torch.equal(stock, lookup),
          f"(rolled back {cache.stats()['rolled_back_tokens']} layer-tokens)")

    # 3. A draft model that is itself a hybrid gets a ReplayCache of its own.
    if args.model in (None, "tiny-mamba2", "tiny-gdn"):
        draft, _ = load_model("tiny-gdn" if args.model != "tiny-gdn" else "tiny-mamba2", device=model.device)
        assisted = model.generate(**inputs, **{key: ReplayCache()}, assistant_model=draft, **greedy)
        print("assisted by a hybrid draft, same tokens:", torch.equal(stock, assisted))

    # 4. The fast path: a static cache (max_cache_len). On CUDA, generate() then compiles the decode step with CUDA
    #    graphs through transformers' own compile path (the first call compiles; reset() keeps the graphs for the
    #    next prompt of this batch size); elsewhere it decodes eagerly on the same device-side positions.
    static = ReplayCache(max_cache_len=inputs.input_ids.shape[1] + args.tokens)
    fast = model.generate(**inputs, **{key: static}, **greedy)
    print("static cache (compiled on CUDA), same tokens:", torch.equal(stock, fast))

    print(tokenizer.decode(replay[0, inputs.input_ids.shape[1] :]))
    print("cache memory (bytes):", cache.memory())


if __name__ == "__main__":
    main()
