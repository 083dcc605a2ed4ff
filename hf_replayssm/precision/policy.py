"""Precision policies: how the checkpoint is stored and what the non-flush reads see."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PrecisionPolicy:
    """``checkpoint_format``: storage of the state the recurrence continues from.
    ``read_format``: storage of the copy that non-flush steps read (``None``: they read the checkpoint).
    """

    checkpoint_format: str = "fp32"
    stochastic_rounding: bool = False
    read_format: str | None = None

    @property
    def mode(self) -> str:
        return "separated" if self.read_format is not None else "shared"


PRESETS: dict[str, PrecisionPolicy] = {
    "fp32": PrecisionPolicy(),
}


def resolve_policy(precision: str | PrecisionPolicy) -> PrecisionPolicy:
    if isinstance(precision, PrecisionPolicy):
        return precision
    try:
        return PRESETS[precision]
    except (KeyError, TypeError):
        raise ValueError(
            f"unknown precision {precision!r}; use one of {sorted(PRESETS)} or a PrecisionPolicy"
        ) from None
