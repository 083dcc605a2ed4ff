"""Benchmarks (``hf-replayssm bench ...``): cache memory and, with the kernels, decode speed."""

import torch


def default_device() -> str:
    """``cuda`` where torch sees a GPU, else ``cpu`` (the benches' ``--device`` default: a CPU run is a smoke run)."""
    return "cuda" if torch.cuda.is_available() else "cpu"
