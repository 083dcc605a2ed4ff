"""The kernels' host-side integer helpers give Triton's integers (they replace its constexpr functions on the host)."""

from __future__ import annotations

import pytest

triton = pytest.importorskip("triton")


def test_host_math_matches_triton():
    from hf_replayssm.kernels.host_math import cdiv, next_power_of_2

    for n in range(0, 2100):
        assert next_power_of_2(n) == triton.next_power_of_2(n), n
        for d in (1, 2, 3, 7, 16, 64, 1024):
            assert cdiv(n, d) == triton.cdiv(n, d), (n, d)
    assert next_power_of_2(1 << 40) == 1 << 40 and next_power_of_2((1 << 40) + 1) == 1 << 41


def test_kernel_host_code_avoids_triton_constexpr_functions():
    """No host wrapper calls ``triton.cdiv`` / ``triton.next_power_of_2`` (about 4 us each per call)."""
    import re
    from pathlib import Path

    import hf_replayssm.kernels as kernels

    root = Path(kernels.__file__).parent
    offenders = [f"{path.name}:{i}" for path in sorted(root.glob("*.py")) if not path.name.startswith("bench")
                 for i, line in enumerate(path.read_text().splitlines(), 1)
                 if re.search(r"triton\.(cdiv|next_power_of_2)\(", line)]
    assert not offenders, offenders
