"""ReplaySSM for Hugging Face Transformers: cache SSM inputs, not state.

    from hf_replayssm import ReplayCache
    out = model.generate(input_ids, past_key_values=ReplayCache(), max_new_tokens=256)

Importing the package (or ``hf_replayssm.ops`` / ``hf_replayssm.precision``) imports no transformers and patches
nothing: the transformers-facing names load on first use, and the pass-through hooks are installed when the first
``ReplayCache`` is created (or by ``install_hooks()``).
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_LAZY = {
    "ReplayCache": ".cache",
    "cache_argument": ".cache",
    "ReplayLayer": ".layers",
    "RollbackError": ".schedule",
    "install_hooks": ".integration",
    "supported_model_types": ".adapters",
    "PRESETS": ".precision",
    "PrecisionPolicy": ".precision",
}

__all__ = sorted([*_LAZY, "__version__"])


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'hf_replayssm' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
