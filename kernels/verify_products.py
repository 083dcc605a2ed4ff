"""Which ``tl.dot`` input precision the verify kernels' matrix-product form uses (``_verify(..., _products=...)``).

``True`` or ``"ieee"``: IEEE float32 on CUDA cores. On the H200 (run 77, batch 256) that form ran 1.2-9.7x slower
than the token form: its window tile is 16 rows whatever T is, and by our count of its products it runs at about a
tenth of the CUDA cores' FMA peak. ``"tf32x3"``: each float32 operand split into a TF32 high and low part and three
tensor-core products summed (Triton's own split), about float32 accuracy (H200: verify outputs within 3.6e-7 of the
reference, 1.5e-7 in IEEE). It made Mamba-2's product form 2.1x faster, the default from 5-token windows on
(``kernels/mamba2_verify.py``); the delta rule's got slower (run 78: 236-1036 B spilled per thread).
"""

from __future__ import annotations

DOT_PRECISIONS = ("ieee", "tf32x3")


def dot_precision(products: bool | str) -> str:
    """The input precision for ``_products`` (``False`` / ``True`` -> ``"ieee"``; the token form ignores it)."""
    if isinstance(products, bool):
        return "ieee"
    if products not in DOT_PRECISIONS:
        raise ValueError(f"_products must be a bool or one of {DOT_PRECISIONS}, got {products!r}")
    return products
