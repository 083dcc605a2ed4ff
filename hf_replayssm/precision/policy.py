"""Precision policies: how the checkpoint is stored, and what non-flush steps read.

* **shared**: the checkpoint itself is stored in the format; reads and the recurrence both use it, so rounding
  error re-enters the recurrence at every flush and accumulates with length.
* **separated**: the recurrence runs on the checkpoint (``checkpoint_format``, high precision); non-flush steps read
  a low-precision copy (``read_format``) refreshed from the checkpoint at every flush and never read back into the
  recurrence. For the delta-rule families the corrected values that enter the checkpoint are recomputed at flush
  time from the buffered raw inputs against the high-precision checkpoint.

Stochastic rounding (bf16 / fp16 checkpoints) is counter-based: each element's noise is Philox-4x32-10 of (``seed``,
layer, token position, element index within its batch row), so a sequence rounds the same way in any batch, next to
any other policies, and under plain or speculative scheduling (exact function in :mod:`.formats`).
"""

from __future__ import annotations

from dataclasses import dataclass

from .formats import FORMATS, get_format


@dataclass(frozen=True)
class PrecisionPolicy:
    checkpoint_format: str = "fp32"
    stochastic_rounding: bool = False  # on checkpoint writes (bf16 / fp16 only)
    read_format: str | None = None  # None: non-flush steps read the checkpoint itself
    seed: int = 0  # stochastic rounding: noise of (seed mod 2^32, layer, position, element), see formats.py

    def __post_init__(self):
        if self.checkpoint_format not in FORMATS:
            raise ValueError(f"unknown checkpoint_format {self.checkpoint_format!r}; use one of {FORMATS}")
        if self.read_format is not None and self.read_format not in FORMATS:
            raise ValueError(f"unknown read_format {self.read_format!r}; use one of {FORMATS} or None")
        get_format(self.checkpoint_format, self.stochastic_rounding)  # validates the SR combination

    @property
    def mode(self) -> str:
        return "separated" if self.read_format is not None else "shared"

    def checkpoint_codec(self):
        return get_format(self.checkpoint_format, self.stochastic_rounding)

    def read_codec(self):
        return get_format(self.read_format) if self.read_format is not None else None

    def bytes_per_element(self, row: int = 128) -> float:
        """State bytes held per state element (checkpoint + read copy), for rows of ``row`` elements."""
        total = self.checkpoint_codec().bytes_per_element(row)
        if self.read_format is not None:
            total += self.read_codec().bytes_per_element(row)
        return total


PRESETS: dict[str, PrecisionPolicy] = {
    "fp32": PrecisionPolicy(),
    "bf16": PrecisionPolicy("bf16"),
    "fp16-sr": PrecisionPolicy("fp16", stochastic_rounding=True),
    "separated-fp8": PrecisionPolicy("fp32", read_format="fp8"),
    "separated-nvfp4": PrecisionPolicy("fp32", read_format="nvfp4"),
    "fp16-sr+nvfp4": PrecisionPolicy("fp16", stochastic_rounding=True, read_format="nvfp4"),
    "shared-fp8": PrecisionPolicy("fp8"),
    "shared-nvfp4": PrecisionPolicy("nvfp4"),
}


def resolve_policy(precision: str | PrecisionPolicy) -> PrecisionPolicy:
    if isinstance(precision, PrecisionPolicy):
        return precision
    try:
        return PRESETS[precision]
    except (KeyError, TypeError):
        raise ValueError(
            f"unknown precision {precision!r}; use one of {', '.join(PRESETS)} or a PrecisionPolicy"
        ) from None

