"""Does a model copy? Teacher-forced top-1 accuracy on the speculative bench's repetitive prompts (a Hamlet passage
said again and again, four rows from other lines): on the first copy the model can only predict the text, on the
later copies it can copy it. A model that copies scores near 1 there; one that does not scores as on the first copy.

    python benchmarks/gpu/copy_probe.py MODEL_DIR [MODEL_DIR ...]
"""
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from hf_replayssm.bench.speculative import repetitive_batch
from hf_replayssm.demo import DEFAULT_PROMPT


def copy_accuracy(path: str, rows: int = 4, length: int = 512) -> dict:
    tokenizer = AutoTokenizer.from_pretrained(path)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(device).eval()
    ids = repetitive_batch(model.config.vocab_size, rows, length, tokenizer=tokenizer).to(device)
    passage = len(tokenizer(DEFAULT_PROMPT)["input_ids"])
    with torch.no_grad():
        hit = (model(ids).logits[:, :-1].argmax(-1) == ids[:, 1:]).float()
    first, later = hit[:, : passage - 1].mean().item(), hit[:, passage:].mean().item()
    return dict(passage=passage, first_copy=first, later_copies=later)


if __name__ == "__main__":
    for path in sys.argv[1:]:
        print(path, " ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}"
                             for k, v in copy_accuracy(path).items()), flush=True)
