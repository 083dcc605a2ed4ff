"""Benchmarks (``hf-replayssm bench ...``): cache memory and, with the kernels, decode speed."""
