"""Integer helpers for the kernels' host code (launch grids and tile sizes).

``triton.cdiv`` and ``triton.next_power_of_2`` are ``constexpr_function`` objects since Triton 3.5: callable from
host code, but each call unwraps its arguments as constexprs (about 4 us on the development machine's CPU), and a
decode step's wrapper called them about ten times per launch. These plain functions give the same integers.
"""

from __future__ import annotations


def cdiv(x: int, y: int) -> int:
    """ceil(x / y) for positive y (``triton.cdiv``)."""
    return -(-x // y)


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= n for n >= 1, 0 for 0 (``triton.next_power_of_2``)."""
    return 1 << (n - 1).bit_length() if n > 0 else 0
