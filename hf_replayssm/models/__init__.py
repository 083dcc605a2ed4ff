"""Small hybrid models shipped with the package, and a loader that also takes hub ids or local paths.

* ``tiny-mamba2``: a 0.9M-parameter Nemotron-H-style hybrid (Mamba-2 + attention + MLP blocks);
* ``tiny-gdn``: a 1M-parameter Qwen3.5-style hybrid (Gated DeltaNet + attention);
* ``small-mamba2``: a 3.5M-parameter Nemotron-H-style hybrid (Mamba-2 + attention + MLP blocks, ``--size small``);
* ``small-kda``: a 3.9M-parameter Kimi-Linear-style hybrid (Kimi Delta Attention + MLA attention, ``--size small``);
* ``small-gdn``: a 3.9M-parameter Qwen3.5-style hybrid (Gated DeltaNet + attention, ``--size small``);
* ``tiny-gdn-copy``: tiny-gdn fine-tuned to copy repeated text (what prompt-lookup speculation drafts): first on
  passages of random tokens (22 minutes on a CPU: an induction mechanism forms, random passages copied at 100 %
  top-1, natural text not yet), then on repeated Shakespeare passages (13 minutes); on a Hamlet passage said again
  it predicts 96 % of the later copies' tokens (tiny-gdn 26 %), with a lower held-out loss than tiny-gdn's.

The tiny models were trained for a few minutes on CPU on Shakespeare's plays by ``python -m
hf_replayssm.models.train``; they write recognisably Shakespeare-shaped text, which is all the demos need: a state
that carries information and a real tokenizer. The small ones were trained within a 6.3-minute budget on a GPU at 2048
tokens per row, a quarter of the rows being synthetic recall documents, to recall a name stated hundreds of tokens
earlier: small-mamba2 answers the recall task at distance 1024 almost always, small-gdn 78 % of the time (90 % at
256), small-kda well above chance up to distance 256 (each has one full-attention layer, which can answer without the
recurrent state). All six share one tokenizer; settings, losses, decay half-lives and recall accuracy are in each
folder's TRAINING.txt.
"""

from __future__ import annotations

from pathlib import Path

import torch

BUNDLED = ("tiny-mamba2", "tiny-gdn", "small-mamba2", "small-kda", "small-gdn", "tiny-gdn-copy")
DEFAULT_MODEL = "tiny-mamba2"


def bundled_path(name: str) -> Path:
    if name not in BUNDLED:
        raise ValueError(f"no bundled model {name!r}; bundled models: {', '.join(BUNDLED)}")
    return Path(__file__).parent / name


def load_model(name_or_path: str | None = None, device: str | torch.device | None = None,
               dtype: torch.dtype = torch.float32):
    """(model, tokenizer or None) for a bundled name, a local path or a hub id; eval mode, on ``device``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    name_or_path = name_or_path or DEFAULT_MODEL
    source = bundled_path(name_or_path) if name_or_path in BUNDLED else name_or_path
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype).to(device).eval()
    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError):
        tokenizer = None
    return model, tokenizer
