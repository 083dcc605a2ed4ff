"""``ReplayCache``: a transformers ``Cache`` that runs every SSM layer with ReplaySSM.

Attention layers stay stock ``DynamicCache`` layers (masks, ``get_seq_length`` and cropping keep working); each
SSM layer becomes a ``ReplayLayer``. The cache binds to a model lazily, on the first ``generate`` or forward call
that receives it, so it needs no config argument.
"""

from __future__ import annotations

import weakref
from collections import Counter

import torch
from transformers import DynamicCache
from transformers.cache_utils import CacheLayerMixin, LinearAttentionCacheLayerMixin

from .layers import ReplayHybridLayer, ReplayLayer, RollbackError
from .precision import PrecisionPolicy, resolve_policy

BACKENDS = ("auto", "torch")
STAT_KEYS = ("decode_steps", "flushes", "checkpoint_writes", "rolled_back_tokens", "prefills", "tokens",
             "staged_checkpoints")


def cache_argument(model) -> str:
    """The keyword under which ``model`` (and its ``generate``) takes a cache in this transformers version:
    ``cache`` (newer 5.x; ``past_key_values`` still works there, with a deprecation warning), ``past_key_values``,
    or ``cache_params`` (pure Mamba models in 5.17)."""
    import inspect

    parameters = inspect.signature(model.forward).parameters
    for name in ("cache", "past_key_values", "cache_params"):
        if name in parameters:
            return name
    return "past_key_values"


class ReplayCache(DynamicCache):
    """ReplaySSM cache: checkpoint + a ring of the last inputs per SSM layer instead of a rewritten state.

    Args:
        buffer_len: records buffered before a flush folds them into the checkpoint (L). ``1`` is plain step
            decoding.
        precision: a preset name (see ``hf_replayssm.precision.PRESETS``) or a ``PrecisionPolicy``; or a list of
            them, one per batch row (to compare policies on the same sequence in one batch).
        backend: ``"auto"`` or ``"torch"`` (the pure-torch reference; Triton kernels come later).
        window: extra record slots for speculative windows (draft tokens per verify) beyond ``buffer_len``; sets
            the deepest rollback that stays exact. ``generate()`` raises it automatically for prompt lookup and
            assistant models; plain decoding needs none.
    """

    def __init__(
        self,
        buffer_len: int = 16,
        precision: str | PrecisionPolicy | list[str | PrecisionPolicy] = "fp32",
        backend: str = "auto",
        window: int | None = None,
    ):
        if not isinstance(buffer_len, int) or isinstance(buffer_len, bool) or buffer_len < 1:
            raise ValueError(f"buffer_len must be an int >= 1, got {buffer_len!r}")
        if window is not None and (not isinstance(window, int) or window < 1):
            raise ValueError(f"window must be None or an int >= 1, got {window!r}")
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        super().__init__()
        self.buffer_len = buffer_len
        if isinstance(precision, (list, tuple)):
            if not precision:
                raise ValueError("precision: give a policy, or a non-empty list with one policy per batch row")
            self.policy = [resolve_policy(p) for p in precision]
        else:
            self.policy = resolve_policy(precision)
        self.backend = backend
        self.window = window or 0
        self._bound: weakref.ref | None = None
        self._bound_ids: set[int] = set()
        self._batch_size: int | None = None
        self._recording = False
        self._prompt_tokens = 0

    # ------------------------------------------------------------------ binding
    @classmethod
    def for_model(cls, model, **kwargs) -> ReplayCache:
        """Create a cache already bound to ``model`` (binding otherwise happens on first use)."""
        cache = cls(**kwargs)
        cache.bind(model)
        return cache

    @property
    def bound_model(self):
        return self._bound() if self._bound is not None else None

    def bind(self, model) -> None:
        """Attach to ``model``: build one cache layer per decoder layer, ReplayLayers for the SSM ones."""
        from .adapters import find_mixers, repoint_accelerate_hook

        bound = self.bound_model
        if bound is not None:
            if model is bound or id(model) in self._bound_ids:
                return
            if any(module is bound for module in model.modules()):  # an outer wrapper of the bound model
                self._bound_ids.add(id(model))
                return
            raise ValueError(
                f"this ReplayCache is bound to a {type(bound).__name__} (it holds that model's state); create a "
                f"new ReplayCache() for {type(model).__name__}"
            )
        if any(getattr(layer, "is_initialized", False) for layer in self.layers):
            raise ValueError("this ReplayCache was used before it was bound to a model; create a new ReplayCache()")

        mixers = find_mixers(model)  # raises for SSM types we cannot replay
        text_config = model.config.get_text_config(decoder=True)
        layers = DynamicCache(config=text_config).layers
        for layer_idx, (mixer, adapter) in mixers.items():
            stock = layers[layer_idx]
            layer_cls = ReplayHybridLayer if isinstance(stock, CacheLayerMixin) else ReplayLayer
            layer = layer_cls(self.buffer_len, self.window, self.policy, layer_idx)
            layer.recurrence = adapter.recurrence()
            layer.mixer_ref = weakref.ref(mixer)
            layers[layer_idx] = layer
            adapter.install(type(mixer))
            repoint_accelerate_hook(mixer)
        self.layers = layers
        self.layer_class_to_replicate = None
        self._bound = weakref.ref(model)
        self._bound_ids = {id(m) for m in model.modules() if hasattr(m, "config")}
        if self._recording:
            self.activate_past_recording()
        self.expect_prompt(self._prompt_tokens)

    def replay_layer_for(self, mixer, batch_size: int) -> ReplayLayer:
        """The ReplayLayer serving ``mixer``; checks the binding and the batch size."""
        if self._bound is None:
            raise ValueError(
                "this ReplayCache is not bound to a model: pass it by keyword (past_key_values=/cache=) to the model "
                "or to generate(), or create it with ReplayCache.for_model(model)"
            )
        layer = self.layers[mixer.layer_idx] if mixer.layer_idx < len(self.layers) else None
        if not isinstance(layer, ReplayLayer) or layer.mixer_ref() is not mixer:
            raise ValueError(
                f"this ReplayCache is bound to another model ({type(self.bound_model).__name__}); create a new "
                "ReplayCache() per model"
            )
        self.check_batch_size(batch_size)
        return layer

    def check_batch_size(self, batch_size: int) -> None:
        if self._batch_size is None:
            self._batch_size = batch_size
        elif batch_size != self._batch_size:
            raise ValueError(
                f"this ReplayCache holds state for batch size {self._batch_size}, got a batch of {batch_size}; "
                "use a new ReplayCache() for a different batch"
            )

    # ------------------------------------------------------------------ views
    @property
    def replay_layers(self) -> dict[int, ReplayLayer]:
        return {idx: layer for idx, layer in enumerate(self.layers) if isinstance(layer, ReplayLayer)}

    def stats(self) -> dict[str, int]:
        """Counters summed over SSM layers: decode_steps, flushes, checkpoint_writes, rolled_back_tokens, ..."""
        total: Counter = Counter()
        for layer in self.replay_layers.values():
            total.update(layer.counters)
        stats = {key: int(total[key]) for key in STAT_KEYS}
        stats["ssm_layers"] = len(self.replay_layers)
        return stats

    def memory(self) -> dict[str, int]:
        """Bytes per component: ``checkpoint``, ``read_copy``, ``buffer`` (records), ``conv`` (the conv input ring),
        ``attention_kv``, their ``total``, and ``stock_total``: what a stock transformers cache holds for the same
        tokens (a float32 recurrent state and a kernel-wide conv window per SSM layer, the same attention K/V)."""
        sizes: Counter = Counter()
        for layer in self.layers:
            if isinstance(layer, ReplayLayer):
                sizes.update(layer.nbytes())
                if layer.store.allocated:
                    sizes["stock_state"] += layer.checkpoint.numel() * 4
                if layer.conv.buffer is not None:
                    conv = layer.conv.buffer
                    sizes["stock_conv"] += conv.shape[0] * conv.shape[1] * layer.conv_kernel * conv.element_size()
            if isinstance(layer, CacheLayerMixin) and getattr(layer, "is_initialized", False):
                sizes["attention_kv"] += sum(t.numel() * t.element_size() for t in (layer.keys, layer.values))
        keys = ("checkpoint", "read_copy", "buffer", "conv", "attention_kv")
        result = {key: int(sizes[key]) for key in keys}
        result["total"] = sum(result.values())
        result["stock_total"] = int(sizes["stock_state"] + sizes["stock_conv"] + sizes["attention_kv"])
        return result

    # ------------------------------------------------------------------ transformers Cache API
    def get_seq_length(self, layer_idx: int = 0) -> int:
        if not any(isinstance(layer, CacheLayerMixin) for layer in self.layers):  # SSM-only model
            return max((layer.tokens_seen for layer in self.replay_layers.values()), default=0)
        return super().get_seq_length(layer_idx)

    def get_conv_state(self, layer_idx: int, state_idx: int = 0):
        if isinstance(self.layers[layer_idx], ReplayLayer):
            return None  # routes the stock mixer through update_conv_state, i.e. our conv ring
        return super().get_conv_state(layer_idx, state_idx)

    def get_recurrent_state(self, layer_idx: int, state_idx: int = 0):
        layer = self.layers[layer_idx]
        if isinstance(layer, ReplayLayer):
            return layer.checkpoint if layer.tokens_seen else None
        return super().get_recurrent_state(layer_idx, state_idx)

    def update_conv_state(self, conv_states: torch.Tensor, layer_idx: int, state_idx: int = 0, **kwargs):
        self._require_replay_call(layer_idx)
        return super().update_conv_state(conv_states, layer_idx, state_idx, **kwargs)

    def update_recurrent_state(self, recurrent_states: torch.Tensor, layer_idx: int, state_idx: int = 0, **kwargs):
        self._require_replay_call(layer_idx)
        return super().update_recurrent_state(recurrent_states, layer_idx, state_idx, **kwargs)

    def _require_replay_call(self, layer_idx: int) -> None:
        from .adapters.base import active_call

        if isinstance(self.layers[layer_idx], ReplayLayer) and active_call() is None:
            raise RuntimeError(
                f"layer {layer_idx} wrote its state outside the ReplaySSM path (a replaced or kernelized mixer "
                "forward?); ReplayCache cannot keep it exact"
            )

    @property
    def is_compileable(self) -> bool:
        return False

    def activate_past_recording(self) -> None:
        self._recording = True
        for layer in self.layers:
            if hasattr(layer, "activate_past_recording"):
                layer.activate_past_recording()

    def deactivate_past_recording(self) -> None:
        """Back to plain decoding: pending records are committed and no layer keeps growing its past."""
        self._recording = False
        for layer in self.layers:
            if isinstance(layer, ReplayLayer):
                layer.deactivate_past_recording()
            elif hasattr(layer, "record_past"):
                layer.record_past = False

    def expect_prompt(self, num_tokens: int) -> None:
        """The first ``num_tokens`` tokens fed to an empty cache are prompt: while recording they take the
        model's prefill path instead of becoming rollback-able drafts."""
        self._prompt_tokens = int(num_tokens)
        for layer in self.replay_layers.values():
            layer.prompt_tokens = self._prompt_tokens

    def reserve_window(self, window: int) -> None:
        """Keep speculative rollbacks of up to ``window`` tokens exact."""
        self.window = max(self.window, int(window))
        for layer in self.replay_layers.values():
            layer.reserve_window(self.window)

    def crop(self, tokens_to_remove) -> None:
        """Drop the last ``-tokens_to_remove`` tokens (int or 0-d tensor). A positive value is the length to keep."""
        count = int(tokens_to_remove)
        if count > 0:
            count -= self.get_seq_length()
            if count > 0:
                raise ValueError(f"cannot crop to length {int(tokens_to_remove)}: the cache holds fewer tokens")
        for idx, layer in self.replay_layers.items():  # all-or-nothing: check every SSM layer first
            if -count > layer.ring.size:
                raise RollbackError(
                    f"cannot roll back {-count} tokens exactly: SSM layer {idx} only holds its last "
                    f"{layer.ring.size} tokens as records (older ones are folded into the checkpoint). Use "
                    "ReplayCache(window=...) at least as large as the speculative window."
                )
        for layer in self.layers:
            # stock linear layers that never ran (5.17 uses them for nemotron_h's mlp/moe blocks) have nothing to crop
            stock_linear = isinstance(layer, LinearAttentionCacheLayerMixin) and not isinstance(layer, ReplayLayer)
            if stock_linear and not any(layer.is_conv_states_initialized.values()):
                continue
            if hasattr(layer, "crop"):
                layer.crop(count)

    def batch_repeat_interleave(self, repeats: int) -> None:
        super().batch_repeat_interleave(repeats)
        if self._batch_size is not None:
            self._batch_size *= repeats

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        super().batch_select_indices(indices)
        if self._batch_size is not None:
            self._batch_size = int(torch.as_tensor(indices).numel())

    def reset(self) -> None:
        super().reset()
        self._batch_size = None

    def __repr__(self) -> str:
        model = type(self.bound_model).__name__ if self.bound_model is not None else "unbound"
        return (
            f"ReplayCache(buffer_len={self.buffer_len}, precision={self.policy}, window={self.window}, "
            f"model={model}, ssm_layers={len(self.replay_layers)})"
        )
