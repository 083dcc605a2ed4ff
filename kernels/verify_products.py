"""Which ``tl.dot`` input precision the verify kernels' matrix-product form uses (``_verify(..., _products=...)``).

``True`` or ``"ieee"``: IEEE float32 on CUDA cores, the bits of the token-by-token form up to summation order. On the
H200 (run 77, batch 256) this form ran 1.3-14x slower than the token form: the products are padded to 16 window rows
and float32 FMA products are compute-bound there. ``"tf32x3"``: each float32 operand split into a TF32 high and low
part and three tensor-core products summed (Triton's own split), about float32 accuracy at tensor-core speed.
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
