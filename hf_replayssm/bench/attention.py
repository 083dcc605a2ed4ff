"""Pin scaled-dot-product attention to one backend for a whole benchmark run (``--sdpa``).

With torch 2.11 on the H200, transformers' SDPA attention runs on cuDNN, which builds a graph for every new key
length (40-60 ms of host time the first time a length is seen). Benches warm every arm at the same lengths, but a
run can still meet lengths or masks its warm-up did not (or a graph cache that dropped them), and then times graph
builds. ``--sdpa efficient`` (memory-efficient attention, which takes masks) keeps cuDNN out; ``default`` leaves
torch's choice.

The two fused kernels (``efficient``, ``flash``) take no grouped-query inputs (``enable_gqa``), which transformers
passes for mask-free calls (a prompt without padding): under those pins transformers repeats the key / value heads
instead, as it does for masked calls (H200 run 94: Qwen3.5's prefill failed with "No available kernel" before)."""

from __future__ import annotations

import contextlib

SDPA_CHOICES = ("default", "efficient", "math", "flash", "cudnn")
NO_GQA_BACKENDS = ("efficient", "flash")  # torch's fused kernels want as many key / value heads as query heads


@contextlib.contextmanager
def _transformers_repeats_kv():
    """Inside: transformers' SDPA integration never asks for ``enable_gqa`` (it repeats key / value heads)."""
    try:
        from transformers.integrations import sdpa_attention
    except ImportError:
        sdpa_attention = None
    original = getattr(sdpa_attention, "use_gqa_in_sdpa", None)
    if original is None:  # no transformers, or one without the switch: nothing to turn off
        yield
        return
    sdpa_attention.use_gqa_in_sdpa = lambda *args, **kwargs: False
    try:
        yield
    finally:
        sdpa_attention.use_gqa_in_sdpa = original


def sdpa_backend(name: str):
    """A context manager that restricts ``torch.nn.functional.scaled_dot_product_attention`` to the backend
    ``name`` (one of :data:`SDPA_CHOICES`; ``default``: no restriction). A backend that cannot run a call (no kernel
    for the device; flash attention on CUDA with an attention mask, as padded or batched speculative inputs have)
    makes it fail rather than fall back. Under ``efficient`` and ``flash`` transformers gets key / value heads
    repeated to the query heads instead of grouped-query inputs, which those kernels refuse."""
    if name not in SDPA_CHOICES:
        raise ValueError(f"--sdpa must be one of {SDPA_CHOICES}, got {name!r}")
    if name == "default":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = {"efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH,
               "flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}[name]
    stack = contextlib.ExitStack()
    stack.enter_context(sdpa_kernel([backend]))
    if name in NO_GQA_BACKENDS:
        stack.enter_context(_transformers_repeats_kv())
    return stack
