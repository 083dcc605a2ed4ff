"""Storage precision of the recurrent state: formats, policies and the checkpoint store."""

from .policy import PRESETS, PrecisionPolicy, resolve_policy
from .store import CheckpointStore

__all__ = ["PRESETS", "CheckpointStore", "PrecisionPolicy", "resolve_policy"]
