"""ReplaySSM for Hugging Face Transformers: cache SSM inputs, not state.

    from hf_replayssm import ReplayCache
    out = model.generate(input_ids, past_key_values=ReplayCache(), max_new_tokens=256)
"""

from .adapters import supported_model_types
from .cache import ReplayCache, cache_argument
from .integration import install_hooks
from .layers import ReplayLayer, RollbackError
from .precision import PRESETS, PrecisionPolicy

__version__ = "0.1.0"

# Pass-through hooks on generate() and model calls; they only act when a ReplayCache is passed.
install_hooks()

__all__ = [
    "PRESETS",
    "PrecisionPolicy",
    "ReplayCache",
    "ReplayLayer",
    "RollbackError",
    "__version__",
    "cache_argument",
    "supported_model_types",
]
