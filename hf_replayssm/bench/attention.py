"""Pin scaled-dot-product attention to one backend for a whole benchmark run (``--sdpa``).

With torch 2.11 on the H200, transformers' SDPA attention runs on cuDNN, which builds a graph for every new key
length (40-60 ms of host time the first time a length is seen). Benches warm every arm at the same lengths, but a
run can still meet lengths or masks its warm-up did not (or a graph cache that dropped them), and then times graph
builds. ``--sdpa efficient`` (memory-efficient attention, which takes masks) keeps cuDNN out; ``default`` leaves
torch's choice."""

from __future__ import annotations

import contextlib

SDPA_CHOICES = ("default", "efficient", "math", "flash", "cudnn")


def sdpa_backend(name: str):
    """A context manager that restricts ``torch.nn.functional.scaled_dot_product_attention`` to the backend
    ``name`` (one of :data:`SDPA_CHOICES`; ``default``: no restriction). A backend that cannot run a call (no kernel
    for the device; flash attention on CUDA with an attention mask, as padded or batched speculative inputs have)
    makes it fail rather than fall back."""
    if name not in SDPA_CHOICES:
        raise ValueError(f"--sdpa must be one of {SDPA_CHOICES}, got {name!r}")
    if name == "default":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = {"efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH,
               "flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}[name]
    return sdpa_kernel([backend])
