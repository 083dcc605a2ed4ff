"""ReplaySSM for Hugging Face Transformers: cache SSM inputs, not state.

    from hf_replayssm import ReplayCache
    out = model.generate(input_ids, past_key_values=ReplayCache(), max_new_tokens=256)

Importing the package (or ``hf_replayssm.ops`` / ``hf_replayssm.precision``) imports no transformers: the
transformers-facing names load on first use. The pass-through hooks (``integration``) are installed as soon as both
this package and transformers are loaded: by this import when transformers already is, else when ``ReplayCache`` is
first looked up, created, or ``install_hooks()`` is called. They must be in place before ``model.generate`` is looked
up: ``model.generate(ids, past_key_values=ReplayCache())`` fetches the bound method before it builds the cache, so
hooks installed by that first ``ReplayCache()`` would miss that call.
"""

from __future__ import annotations

import importlib
import sys

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


if "transformers" in sys.modules:  # a model may exist already: hook before its first generate() is looked up
    importlib.import_module(".integration", __name__).install_hooks()


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'hf_replayssm' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
