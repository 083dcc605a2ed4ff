"""Model coverage: which mixers ReplayCache serves, and which SSM mixers it refuses."""

from __future__ import annotations

from .base import FamilyAdapter, refuse_hub_layer, repoint_accelerate_hook

__all__ = ["ADAPTERS", "find_mixers", "refuse_hub_layer", "repoint_accelerate_hook", "supported_model_types"]
from .delta_rule import GATED_DELTANET, KIMI_DELTA
from .mamba2 import ADAPTER as MAMBA2
from .short_conv import ADAPTER as SHORT_CONV

ADAPTERS: tuple[FamilyAdapter, ...] = (MAMBA2, GATED_DELTANET, KIMI_DELTA, SHORT_CONV)
_BY_MIXER = {mixer: adapter for adapter in ADAPTERS for mixer in adapter.mixers}

# Recurrent mixers ReplayCache does not replay yet (Mamba-1 selective scan, lightning attention).
UNSUPPORTED_MIXERS = {
    "MambaMixer": "Mamba-1 (mamba)",
    "FalconMambaMixer": "Mamba-1 (falcon_mamba)",
    "JambaMambaMixer": "Mamba-1 (jamba)",
    "ZambaMambaMixer": "Mamba-1 (zamba)",
    "MiniMaxLightningAttention": "lightning attention (minimax)",
}
_LINEAR_LAYER_TYPES = {"linear_attention", "conv", "hybrid", "hybrid_sliding", "mamba"}


def supported_model_types() -> list[str]:
    """The ``config.model_type`` values whose SSM layers ReplayCache replays."""
    return sorted(t for adapter in ADAPTERS for types in adapter.mixers.values() for t in types)


def _refuse(model, what: str) -> None:
    raise ValueError(
        f"ReplayCache cannot replay {type(model).__name__} ({what}). Supported model types: "
        f"{', '.join(supported_model_types())}. Use a transformers DynamicCache for this model."
    )


def find_mixers(model) -> dict[int, tuple[object, FamilyAdapter]]:
    """``{layer_idx: (mixer module, adapter)}`` for the model's SSM layers; raises for unsupported recurrences."""
    found: dict[int, tuple[object, FamilyAdapter]] = {}
    for module in model.modules():
        name = type(module).__name__
        if name in UNSUPPORTED_MIXERS:
            _refuse(model, f"its {name} layers are {UNSUPPORTED_MIXERS[name]}")
        adapter = _BY_MIXER.get(name)
        if adapter is not None:
            layer_idx = getattr(module, "layer_idx", None)
            if layer_idx is None or layer_idx in found:
                _refuse(model, f"{name} without a unique layer_idx")
            found[layer_idx] = (module, adapter)
    if not found:
        text_config = model.config.get_text_config(decoder=True)
        layer_types = set(getattr(text_config, "layer_types", None) or [])
        if layer_types & _LINEAR_LAYER_TYPES:
            _refuse(model, f"model type {text_config.model_type!r} has recurrent layers of an unknown kind")
    return found
