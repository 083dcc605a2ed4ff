"""Storage precision of the recurrent state: formats (with counter-based stochastic rounding), policies and the
checkpoint store. Pure torch: no transformers import."""

from .policy import PRESETS, PrecisionPolicy, resolve_policy
from .store import CheckpointStore

__all__ = ["PRESETS", "CheckpointStore", "PrecisionPolicy", "resolve_policy"]
