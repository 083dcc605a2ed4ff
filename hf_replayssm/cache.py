"""``ReplayCache``: a transformers ``Cache`` that runs every SSM layer with ReplaySSM.

Attention layers stay stock ``DynamicCache`` layers (masks, ``get_seq_length`` and cropping keep working); each
SSM layer becomes a ``ReplayLayer``. The cache binds to a model lazily, on the first ``generate`` or forward call
that receives it, so it needs no config argument.
"""

from __future__ import annotations

import inspect
import os
import weakref
from collections import Counter
from typing import NamedTuple

import torch
from transformers import DynamicCache, StaticCache
from transformers.cache_utils import (
    CacheLayerMixin,
    LinearAttentionCacheLayerMixin,
    StaticLayer,
    StaticSlidingWindowLayer,
)

from .adapters import find_mixers, refuse_hub_layer, repoint_accelerate_hook
from .adapters.base import active_call
from .decode_pack import DecodePack
from .integration import install_hooks
from .layers import ReplayHybridLayer, ReplayLayer, ReplayStaticHybridLayer, RollbackError, crop_static_attention
from .packed_rollback import PackedRollback
from .precision import PrecisionPolicy, resolve_policy
from .static_decode import STEP, commit_windows

BACKENDS = ("auto", "torch", "triton")
STAT_KEYS = ("decode_steps", "flushes", "checkpoint_writes", "rolled_back_tokens", "prefills", "tokens",
             "staged_checkpoints")


def cache_argument(model) -> str:
    """The keyword under which ``model`` (and its ``generate``) takes a cache in this transformers version:
    ``cache`` (newer 5.x; ``past_key_values`` still works there, with a deprecation warning), ``past_key_values``,
    or ``cache_params`` (pure Mamba models in 5.17)."""
    parameters = inspect.signature(model.forward).parameters
    for name in ("cache", "past_key_values", "cache_params"):
        if name in parameters:
            return name
    return "past_key_values"


class _LayerFacts(NamedTuple):
    """What ``generate`` asks a cache about its layers several times per decode step (``is_compileable``,
    ``is_linear``, ``get_seq_length``), worked out once per layer list: a batch-1 step is host-bound, and these
    walked every layer on every call."""

    layers: list  # the list they describe (a new list, or one grown in place, is described anew)
    count: int
    replay: dict  # layer index -> ReplayLayer
    has_attention: bool
    linear: tuple  # transformers' is_linear flags
    compileable: bool  # every layer can decode in a compiled step (a static ReplayLayer on device positions)

    @classmethod
    def of(cls, layers: list) -> _LayerFacts:
        replay = {idx: layer for idx, layer in enumerate(layers) if isinstance(layer, ReplayLayer)}
        linear = tuple(isinstance(layer, LinearAttentionCacheLayerMixin) and not isinstance(layer, CacheLayerMixin)
                       for layer in layers)
        return cls(layers, len(layers), replay, any(isinstance(layer, CacheLayerMixin) for layer in layers), linear,
                   all(layer.is_compileable for layer in layers))

    def describe(self, layers: list) -> bool:
        return self.layers is layers and self.count == len(layers)


def _check_count(name: str, value, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")


def _triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def resolve_backend(backend: str, device: torch.device | None) -> str:
    """The implementation a bound cache runs, decided once at bind: ``"triton"`` (the decode-step kernels, where a
    family has them; other steps stay on the reference) or ``"torch"`` (the pure-torch reference). ``"auto"`` is
    Triton on CUDA devices when triton imports, the reference elsewhere (on CPU the kernels only run under the
    Triton interpreter, for tests)."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    on_cuda = device is not None and device.type == "cuda"
    if backend == "auto":
        return "triton" if on_cuda and _triton_available() else "torch"
    if backend == "triton":
        if not _triton_available():
            raise ValueError("backend='triton' needs the triton package (pip install triton), or use backend='auto'")
        if not (on_cuda or interpreted):
            raise ValueError(
                f"backend='triton' runs on CUDA devices (the model is on {device}); use backend='auto', or set "
                "TRITON_INTERPRET=1 to run the kernels on CPU for testing"
            )
        if interpreted and not on_cuda:
            _check_interpreter_numpy()
    return backend


def _release(version: str) -> tuple[int, int]:
    major, minor = (int(part) for part in version.split(".")[:2])
    return major, minor


def _check_interpreter_numpy() -> None:
    """Triton's interpreter up to 3.6 passes a kernel's integer arguments as one-element arrays and takes their
    ``int()``, which NumPy 2.4 refuses: every kernel looping over such an argument fails deep inside the interpreter.
    Refuse that pair up front (Triton 3.7+ and NumPy below 2.4 both work; checked on 3.6 / 3.7 / 3.8 / 3.9)."""
    import numpy
    import triton

    if _release(triton.__version__) < (3, 7) and _release(numpy.__version__) >= (2, 4):
        raise ValueError(
            f"TRITON_INTERPRET=1 with triton {triton.__version__} cannot run the kernels under numpy "
            f"{numpy.__version__} (that interpreter turns integer arguments into one-element arrays, which numpy 2.4 "
            "no longer converts): pip install 'triton>=3.7' or 'numpy<2.4', or use backend='torch'"
        )


def _static_layer_croppable(layer: StaticLayer) -> bool:
    """A static layer with a ``crop`` (transformers 5.25) says it (``is_croppable``: a sliding-window layer only while
    it has not wrapped). 5.17's have no crop (and say False): its full-attention layer writes at ``cumulative_length``,
    which a crop can rewind; its sliding-window one writes by a wrapping host position, which it cannot."""
    if hasattr(layer, "crop"):
        return bool(layer.is_croppable)
    return not isinstance(layer, StaticSlidingWindowLayer)


class ReplayCache(DynamicCache):
    """ReplaySSM cache: checkpoint + a ring of the last inputs per SSM layer instead of a rewritten state.

    Args:
        buffer_len: records buffered before a flush folds them into the checkpoint (L). ``1`` is plain step
            decoding.
        precision: a preset name (see ``hf_replayssm.precision.PRESETS``) or a ``PrecisionPolicy``; or a list of
            them, one per batch row (to compare policies on the same sequence in one batch).
        backend: ``"triton"`` (the decode-step kernels), ``"torch"`` (the pure-torch reference) or ``"auto"``
            (Triton on CUDA when triton imports, else the reference; see ``resolve_backend``). Resolved once, when
            the cache binds to a model (``cache.resolved_backend``). With ``"triton"``, plain single-token decode
            steps with an fp32 checkpoint run the family's replay-only / flush-only kernel (Mamba-2, Gated DeltaNet,
            KDA: one launch per step and layer; two in a static cache's device-phase steps, flushes then replays);
            prefills, speculative windows and other policies run the reference.
        window: record slots reserved for speculative windows (draft tokens per verify) beyond ``buffer_len``.
            A larger window grows the rings when it happens, so this only preallocates; ``generate()`` sets it from
            what transformers will draft. Plain decoding needs none.
        max_cache_len: make the cache static, for compiled decoding: attention layers preallocate this many
            tokens (transformers' ``StaticLayer``) and, after the prefill, every SSM layer decodes on per-row device
            positions through the fused replay-or-flush op (no host integer per step), so ``is_compileable`` is True
            and ``generate(..., compile_config=...)`` captures the decode step (CUDA graphs on a GPU). Speculative
            decoding (batch 1: prompt lookup, draft models) and ``crop`` work too (transformers 5.25 compiles the
            verify forwards, which run on device positions; 5.17 runs them eagerly), and the attention layers give
            back the rejected drafts' slots. Policies with a float32 checkpoint (``fp32``, and the separated
            ``separated-fp8`` / ``separated-nvfp4``, whose read copy the decode op re-encodes on the device for the
            rows that flush); Mamba-2, Gated DeltaNet and KDA layers, also in layers that hold attention K/V too
            (``ReplayStaticHybridLayer``: falcon_h1, zamba2); others are refused when the cache binds.
    """

    _replayssm_cache = True  # how the mixer hooks recognise this cache without importing it

    def __init__(
        self,
        buffer_len: int = 16,
        precision: str | PrecisionPolicy | list[str | PrecisionPolicy] = "fp32",
        backend: str = "auto",
        window: int | None = None,
        max_cache_len: int | None = None,
    ):
        _check_count("buffer_len", buffer_len, 1)
        if window is not None:
            _check_count("window", window, 0)
        if max_cache_len is not None:
            _check_count("max_cache_len", max_cache_len, 1)
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
        self.resolved_backend: str | None = None
        self.window = window or 0
        self.static_cache_len = max_cache_len
        self._bound: weakref.ref | None = None
        self._bound_ids: set[int] = set()
        self._batch_size: int | None = None
        self._recording = False
        self._packed_rollback: PackedRollback | None = None  # per-row rollback of all SSM layers at once
        self.decode_pack: DecodePack | None = None  # compiled plain steps of all SSM layers on packed operands
        self._prompt_tokens = 0
        self._facts: _LayerFacts | None = None
        self._sealed: str | None = None  # why this cache takes no more tokens until reset() (see seal)

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_facts"] = None
        state["_bound"] = None  # a cache pickles without its model; it re-binds on its next use
        state["_bound_ids"] = set()
        state["_packed_rollback"] = None  # weak references; the next rollback packs again
        state["decode_pack"] = None  # the same; the layers' next entry on device positions packs again
        return state

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
        """Attach to ``model``: build one cache layer per decoder layer, ReplayLayers for the SSM ones. A cache that
        already holds layers (e.g. unpickled) re-attaches to a model of the same architecture."""
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
        mixers = find_mixers(model)  # raises for SSM types we cannot replay
        if self.replay_layers or any(getattr(layer, "is_initialized", False) for layer in self.layers):
            self._reattach(model, mixers)
        else:
            self.layers = self._build_layers(model, mixers)
            self.layer_class_to_replicate = None
        self._bound = weakref.ref(model)
        self._bound_ids = {id(m) for m in model.modules() if hasattr(m, "config")}
        self.resolved_backend = resolve_backend(self.backend, next(model.parameters()).device)
        for layer in self.replay_layers.values():
            layer.schedule.backend = self.resolved_backend
        if self._recording:
            self.activate_past_recording()
        self.expect_prompt(self._prompt_tokens)

    def _build_layers(self, model, mixers) -> list:
        text_config = model.config.get_text_config(decoder=True)
        if self.static_cache_len is None:
            layers = DynamicCache(config=text_config).layers
        else:
            layers = StaticCache(config=text_config, max_cache_len=self.static_cache_len).layers
        for layer_idx, (mixer, adapter) in mixers.items():
            stock = layers[layer_idx]
            if isinstance(stock, StaticSlidingWindowLayer):
                raise ValueError(
                    f"{type(model).__name__} has layers with both an SSM state and sliding-window attention (layer "
                    f"{layer_idx}), which ReplayCache does not serve yet"
                )
            if isinstance(stock, StaticLayer):  # SSM + static attention: falcon_h1, zamba2 in a static cache
                layer = ReplayStaticHybridLayer(self.buffer_len, self.window, self.policy, layer_idx,
                                                recurrence=adapter.recurrence(), max_cache_len=self.static_cache_len)
            else:
                layer_cls = ReplayHybridLayer if isinstance(stock, CacheLayerMixin) else ReplayLayer
                layer = layer_cls(self.buffer_len, self.window, self.policy, layer_idx,
                                  recurrence=adapter.recurrence())
            layer.family = adapter.name
            layer.schedule.backend = self.resolved_backend or "torch"
            layer.schedule.static = self.static_cache_len is not None
            if layer.schedule.static and not layer.schedule.device_positions_supported():
                # transformers only masks a one-token query against a static cache that says it is compileable:
                # a static cache that is not would attend to the unwritten slots
                raise ValueError(
                    f"a static ReplayCache (max_cache_len) decodes every SSM layer on device positions, which "
                    f"{type(mixer).__name__} (layer {layer_idx}) with precision {self.policy} cannot (that needs "
                    "Mamba-2, Gated DeltaNet or KDA layers and a float32-checkpoint policy, with an fp8 / nvfp4 "
                    "read copy or none: fp32, separated-fp8, separated-nvfp4): use "
                    "ReplayCache() without max_cache_len"
                )
            layers[layer_idx] = layer
            self._attach(layer, mixer, adapter)
        return layers

    @staticmethod
    def _attach(layer: ReplayLayer, mixer, adapter) -> None:
        refuse_hub_layer(mixer, layer.layer_idx)
        layer.mixer_ref = weakref.ref(mixer)
        adapter.install(type(mixer))
        repoint_accelerate_hook(mixer)

    def _reattach(self, model, mixers) -> None:
        replay = self.replay_layers
        if not replay:
            raise ValueError("this ReplayCache was used before it was bound to a model; create a new ReplayCache()")
        if set(replay) != set(mixers) or any(replay[i].family != adapter.name for i, (_, adapter) in mixers.items()):
            raise ValueError(
                f"this ReplayCache holds the state of another architecture (SSM layers {sorted(replay)}); create a "
                f"new ReplayCache() for {type(model).__name__}"
            )
        for layer_idx, (mixer, adapter) in mixers.items():
            self._attach(replay[layer_idx], mixer, adapter)

    def replay_layer_for(self, mixer, batch_size: int) -> ReplayLayer:
        """The ReplayLayer serving ``mixer``; checks the binding and the batch size."""
        if self._bound is None:
            raise ValueError(
                "this ReplayCache is not bound to a model: pass it by keyword (past_key_values=/cache=) to the model "
                "or to generate(), or create it with ReplayCache.for_model(model)"
            )
        layer = self.layers[mixer.layer_idx] if mixer.layer_idx < len(self.layers) else None
        if not isinstance(layer, ReplayLayer) or layer.mixer_ref is None or layer.mixer_ref() is not mixer:
            raise ValueError(
                f"this ReplayCache is bound to another model ({type(self.bound_model).__name__}); create a new "
                "ReplayCache() per model"
            )
        self.check_batch_size(batch_size)
        return layer

    def seal(self, reason: str) -> None:
        """Refuse every later forward until ``reset()``: the cache holds what no later forward could read correctly
        (batched speculation leaves the rejected drafts' attention K/V in place, hidden only by that route's own
        masks)."""
        self._sealed = reason

    def check_unsealed(self) -> None:
        reason = getattr(self, "_sealed", None)  # a cache pickled by an older version has none
        if reason:
            raise ValueError(f"this ReplayCache takes no more tokens: {reason}. Call cache.reset() or use a new "
                             "ReplayCache() (to continue such a batch, feed the returned sequences to a fresh cache)")

    def check_static_batch(self, batch_size: int) -> None:
        """A static cache after ``reset()`` holds storage for one batch size: refuse another before any layer runs."""
        kept = getattr(self, "_kept_batch_size", None)
        if self._batch_size is None and kept is not None and batch_size != kept:
            raise ValueError(
                f"this static ReplayCache (max_cache_len) keeps storage for batch size {kept} across reset(); got a "
                f"batch of {batch_size}: create a new ReplayCache(max_cache_len=...) for it"
            )

    def check_batch_size(self, batch_size: int) -> None:
        if self._batch_size is None:
            self._batch_size = batch_size
        elif batch_size != self._batch_size:
            raise ValueError(
                f"this ReplayCache holds state for batch size {self._batch_size}, got a batch of {batch_size}; "
                "use a new ReplayCache() (or cache.reset()) for a different batch"
            )

    # ------------------------------------------------------------------ views
    def _layer_facts(self) -> _LayerFacts:
        facts = getattr(self, "_facts", None)  # a cache pickled by an older version has none
        if facts is None or not facts.describe(self.layers):
            facts = self._facts = _LayerFacts.of(self.layers)
        return facts

    @property
    def replay_layers(self) -> dict[int, ReplayLayer]:
        return dict(self._layer_facts().replay)

    def stats(self) -> dict[str, int]:
        """Counters summed over SSM layers: decode_steps, flushes, checkpoint_writes, rolled_back_tokens, ..."""
        total: Counter = Counter()
        for layer in self.replay_layers.values():
            total.update(layer.schedule.current_counters())
        stats = {key: int(total[key]) for key in STAT_KEYS}
        stats["ssm_layers"] = len(self.replay_layers)
        return stats

    def memory(self) -> dict[str, int]:
        """Bytes of every tensor the cache keeps alive, per component: ``checkpoint``, ``read_copy``, ``buffer``
        (records), ``conv`` (the conv input ring), ``attention_kv``, ``other`` (staged checkpoints of an open
        speculative window, per-layer constants), their ``total``, and ``stock_total``: what a stock transformers
        cache holds for the same tokens (a float32 recurrent state and a kernel-wide conv window per SSM layer, the
        same attention K/V). Storage shared with the model's own parameters is not counted."""
        model = self.bound_model
        shared = set() if model is None else {
            t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]
        }
        sizes: Counter = Counter()
        for layer in self.layers:
            if isinstance(layer, ReplayLayer):
                parts = layer.nbytes(exclude=shared)
                sizes.update({key: parts[key] for key in ("checkpoint", "read_copy", "buffer", "conv")})
                sizes["other"] += parts["staged"] + parts["params"]
                schedule = layer.schedule
                if schedule.allocated:
                    sizes["stock_state"] += schedule.state_numel() * 4
                if schedule.conv.buffer is not None:
                    conv = schedule.conv.buffer
                    sizes["stock_conv"] += conv.shape[0] * conv.shape[1] * schedule.conv_kernel * conv.element_size()
            if isinstance(layer, CacheLayerMixin) and getattr(layer, "is_initialized", False):
                sizes["attention_kv"] += sum(t.numel() * t.element_size() for t in (layer.keys, layer.values))
        keys = ("checkpoint", "read_copy", "buffer", "conv", "attention_kv", "other")
        result = {key: int(sizes[key]) for key in keys}
        result["total"] = sum(result.values())
        result["stock_total"] = int(sizes["stock_state"] + sizes["stock_conv"] + sizes["attention_kv"])
        return result

    # ------------------------------------------------------------------ transformers Cache API
    def get_seq_length(self, layer_idx: int = 0) -> int:
        facts = self._layer_facts()
        if not facts.has_attention:  # SSM-only model
            return max((layer.schedule.current_tokens_seen() for layer in facts.replay.values()), default=0)
        return super().get_seq_length(layer_idx)

    def get_conv_state(self, layer_idx: int, state_idx: int = 0):
        layer = self.layers[layer_idx]
        if isinstance(layer, ReplayLayer):
            if active_call() is not None:
                return None  # routes the stock mixer through update_conv_state, i.e. our conv ring
            return layer.conv_states[state_idx] if layer.tokens_seen else None
        return super().get_conv_state(layer_idx, state_idx)

    def get_recurrent_state(self, layer_idx: int, state_idx: int = 0):
        """Inside a replay call: the checkpoint (the mixer only hands it back). Elsewhere: the current recurrent
        state, materialised (checkpoint + buffered records), as a stock cache would hold it."""
        layer = self.layers[layer_idx]
        if isinstance(layer, ReplayLayer):
            return layer.recurrent_states[state_idx]
        return super().get_recurrent_state(layer_idx, state_idx)

    def update_conv_state(self, conv_states: torch.Tensor, layer_idx: int, state_idx: int = 0, **kwargs):
        if torch.compiler.is_compiling():
            call = active_call()
            if call is not None and call.module.layer_idx == layer_idx and call.positions.takes_conv(conv_states):
                # a plain decode step, straight to the device positions the call runs on (the layer's, or its slice
                # of the decode pack): no method looked up on the layer (a guard per layer before every replay)
                return call.positions.conv_step(conv_states)
        self._require_replay_call(layer_idx)
        full = super().update_conv_state(conv_states, layer_idx, state_idx, **kwargs)
        call = active_call()
        if call is not None and not torch.compiler.is_compiling():
            call.conv_window = full.shape[-1]  # the conv interceptor convolves only this window's new positions
        return full

    def update_recurrent_state(self, recurrent_states: torch.Tensor, layer_idx: int, state_idx: int = 0, **kwargs):
        self._require_replay_call(layer_idx)
        return super().update_recurrent_state(recurrent_states, layer_idx, state_idx, **kwargs)

    def _require_replay_call(self, layer_idx: int) -> None:
        if isinstance(self.layers[layer_idx], ReplayLayer) and active_call() is None:
            raise RuntimeError(
                f"layer {layer_idx} wrote its state outside the ReplaySSM path: its mixer's forward was replaced "
                "(e.g. by a hub kernel layer, kernels' kernelize, after this cache bound the model: call "
                "model.reset_kernels()); ReplayCache cannot keep it exact"
            )

    @property
    def is_compileable(self) -> bool:
        """True for a bound static cache (``max_cache_len``; binding refuses layers that cannot decode without a
        host-side position): transformers' ``generate`` then compiles the decode step, and its masks treat the
        attention layers as static (a one-token query must not see the unwritten slots)."""
        if self.static_cache_len is None or self.bound_model is None:
            return False
        facts = self._layer_facts()
        return bool(facts.replay) and facts.compileable

    @property
    def is_croppable(self) -> bool:
        """Whether ``crop`` can undo tokens in every layer (transformers 5.25 checks it before assisted decoding). A
        static cache's full-attention layers can (``crop``), also on 5.17, whose static layer says it cannot; stock
        linear layers that never ran hold nothing to undo."""
        return all(_static_layer_croppable(layer) if isinstance(layer, StaticLayer) else layer.is_croppable
                   for layer in self._layers_with_state())

    @property
    def is_linear(self) -> list[bool]:
        """transformers re-feeds the whole prefix to a cache whose layers are all linear (it cannot tell how many
        tokens such a cache holds); a ReplayCache knows (``get_seq_length``), so an SSM-only model reports its
        layers as not linear and a reused cache continues from where it stopped. A static one reports them as they
        are: generate() builds attention masks for a compileable cache unless all its layers are linear, and a model
        without attention refuses them."""
        facts = self._layer_facts()
        if facts.linear and all(facts.linear) and facts.replay and self.static_cache_len is None:
            return [False] * facts.count
        return list(facts.linear)

    def activate_past_recording(self, **kwargs) -> None:
        """Keep every new token droppable until ``crop``. transformers 5.25 passes ``recurrent_states_to_keep`` (how
        many per-token states its own linear layers should save for rollback): the attention layers get it as
        transformers sends it; replay layers need no saved states (a dropped token is a ring entry)."""
        self._recording = True
        for layer in self.layers:
            if hasattr(layer, "activate_past_recording"):
                layer.activate_past_recording(**kwargs)

    def deactivate_past_recording(self) -> None:
        """Back to plain decoding: pending records are committed and no layer keeps growing its past."""
        self._recording = False
        for layer in self.layers:
            if isinstance(layer, ReplayLayer):
                layer.deactivate_past_recording()
            elif hasattr(layer, "record_past"):
                layer.record_past = False

    def verifies_on_device(self) -> bool:
        """Whether speculative verify forwards can run on device positions in every SSM layer (a static cache whose
        layers have verify ops and a float32 checkpoint without a read copy), so that a compiled verify forward
        reads no host position."""
        return (self.static_cache_len is not None and bool(self.replay_layers)
                and all(layer.schedule.device_verify_supported() for layer in self.replay_layers.values()))

    def set_device_verify(self, on: bool) -> None:
        """Let verify forwards run on device positions (``on``: transformers' assisted loop drives the cache, one
        window then its crop), or keep them on the host schedule."""
        for layer in self.replay_layers.values():
            if not on:
                layer.schedule.leave_device_positions()
            layer.schedule.device_verify = bool(on)

    def expect_prompt(self, num_tokens: int) -> None:
        """The first ``num_tokens`` tokens fed to an empty cache are prompt: while recording they take the
        model's prefill path instead of becoming rollback-able drafts (default: the first forward)."""
        self._prompt_tokens = int(num_tokens)
        for layer in self.replay_layers.values():
            layer.expect_prompt(self._prompt_tokens)

    def reserve_window(self, window: int) -> None:
        """Preallocate for speculative windows of up to ``window`` tokens (larger ones grow the rings)."""
        self.window = max(self.window, int(window))
        for layer in self.replay_layers.values():
            layer.reserve_window(self.window)

    def crop(self, tokens_to_remove) -> None:
        """Drop the last ``-tokens_to_remove`` tokens (int or 0-d tensor). A positive value is the length to keep.
        All or nothing: a rollback some layer cannot undo exactly raises ``RollbackError`` and changes nothing. In a
        static cache the attention layers' newest slots are given back (the next forward overwrites them, and the
        causal mask never shows them), as transformers' ``StaticLayer.crop`` does."""
        count = int(tokens_to_remove)
        if self._crop_on_device(count):
            return
        if count > 0:
            count -= int(self.get_seq_length())
            if count > 0:
                raise ValueError(f"cannot crop to length {int(tokens_to_remove)}: the cache holds fewer tokens")
        if count and self.static_cache_len is not None:
            for idx, layer in enumerate(self.layers):
                if isinstance(layer, StaticLayer) and not _static_layer_croppable(layer):
                    raise RollbackError(
                        f"attention layer {idx} is a sliding-window static layer, which cannot give back its newest "
                        "slots (transformers 5.25: when the cache is longer than its window; 5.17: never); use "
                        "ReplayCache() without max_cache_len for speculative decoding"
                    )
        for idx, layer in self.replay_layers.items():
            try:
                layer.check_rollback(count)
            except RollbackError as error:
                raise RollbackError(f"SSM layer {idx}: {error}") from None
        for layer in self._layers_with_state():
            if isinstance(layer, StaticLayer) and not isinstance(layer, ReplayLayer):
                if count and layer.is_initialized:
                    crop_static_attention(layer, count)
            elif hasattr(layer, "crop"):
                layer.crop(count)

    def _crop_on_device(self, count: int) -> bool:
        """``crop(count)`` after a window every SSM layer verified on device positions, where none of them needs the
        host schedule for it (``ReplaySchedule.kept_on_device``): the SSM layers commit the kept tokens on the
        device, the static attention layers give back the dropped slots; nothing is read from the device. Else
        False (nothing changed) and ``crop`` goes the host way."""
        replay = list(self.replay_layers.values())
        kept = {layer.schedule.kept_on_device(count) for layer in replay}
        if len(kept) != 1 or None in kept:
            return False
        # the others: plain static layers (not sliding-window ones) whose length is a device tensor, as in 5.17 to
        # 5.25, and 5.25's placeholders of the mlp / moe blocks (``DummyLayer``: no data, nothing to crop)
        attention = [layer for layer in self._layers_with_state()
                     if not isinstance(layer, ReplayLayer) and type(layer).__name__ != "DummyLayer"]
        if not all(type(layer) is StaticLayer and (not layer.is_initialized or isinstance(
                getattr(layer, "cumulative_length", None), torch.Tensor)) for layer in attention):
            return False
        (kept,) = kept
        commit_windows([layer.positions for layer in replay], kept)
        for layer in replay:
            layer.schedule.crop_on_device(kept)
        # static attention layers, and the attention part of SSM layers that have one (ReplayStaticHybridLayer)
        lengths = [layer.cumulative_length for layer in [*attention, *replay]
                   if isinstance(layer, StaticLayer) and layer.is_initialized]
        if lengths and count > 0:  # the length to keep
            torch._foreach_zero_(lengths)
            torch._foreach_add_(lengths, count)
        elif lengths and count:  # minus the tokens to drop
            torch._foreach_add_(lengths, count)
        return True

    def refresh_decode_pack(self) -> None:
        """Once every SSM layer takes plain steps on device positions (a static cache after its prefill), run their
        compiled steps on one ``DecodePack``: the one they already use (a reset keeps it), or a new one (one copy of
        their operands). Nothing where they cannot be packed (read copies, layers of several geometries)."""
        layers = self.replay_layers
        if not layers or not all(layer.positions.phase == STEP for layer in layers.values()):
            return
        pack = self.decode_pack
        if pack is None or not pack.holds(layers):
            pack = self.decode_pack = DecodePack.pack(layers, len(self.layers), previous=pack)
        if pack is not None:
            pack.activate(layers)

    def note_window(self, width: int) -> None:
        """The next forward feeds ``width`` tokens (told by the caller of a compiled forward, which the host does not
        see run): layers verifying on device positions can then crop after it without reading the device."""
        for layer in self.replay_layers.values():
            layer.schedule.device_positions.note_window(width)

    def drop_rows(self, dropped) -> None:
        """Per-row rollback for batched speculation: row r forgets its newest ``dropped[r]`` tokens (fed while
        recording). SSM layers keep them as neutral records, which leave the state exactly as it is, so all rows
        keep one position and one flush grid; attention K/V is not touched: the caller masks the dropped positions
        (attention_mask zeros) and gives each row its own position_ids (in a static cache too: the dropped tokens
        keep their attention slots). All or nothing, like ``crop``."""
        dropped = [int(c) for c in (dropped.tolist() if isinstance(dropped, torch.Tensor) else dropped)]
        if min(dropped, default=0) < 0:
            raise ValueError(f"dropped counts must be >= 0, got {dropped}")
        most = max(dropped, default=0)
        layers = self.replay_layers
        schedules = [layer.schedule for layer in layers.values()]
        for idx, schedule in zip(layers, schedules, strict=True):  # all or nothing: every check before any write
            try:
                schedule.check_drop_rows(dropped, most)
            except RollbackError as error:
                raise RollbackError(f"SSM layer {idx}: {error}") from None
        memo = {}  # masks and index tensors built once for every layer of the same geometry
        packed = None
        if most:
            packed = self._packed_rollback
            if packed is None or not packed.holds(schedules):
                packed = self._packed_rollback = PackedRollback.pack(schedules)  # None: each layer writes its own
        if packed is not None:
            packed.write(dropped, memo)
        checked = most, sum(dropped)
        for schedule in schedules:
            schedule.drop_rows_newest(dropped, memo, packed=packed is not None, checked=checked)

    def _layers_with_state(self) -> list:
        """Layers to crop / reorder: stock linear layers that never ran (5.17 uses them for nemotron_h's mlp/moe
        blocks) hold nothing and lack the batch methods."""
        layers = []
        for layer in self.layers:
            stock_linear = isinstance(layer, LinearAttentionCacheLayerMixin) and not isinstance(layer, ReplayLayer)
            if stock_linear and not any(layer.is_conv_states_initialized.values()):
                continue
            layers.append(layer)
        return layers

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        for layer in self._layers_with_state():
            layer.reorder_cache(beam_idx)

    def batch_repeat_interleave(self, repeats: int) -> None:
        """Repeat every batch row ``repeats`` times (as transformers does for ``num_return_sequences``)."""
        for layer in self._layers_with_state():
            layer.batch_repeat_interleave(repeats)
        if self._batch_size is not None:
            self._batch_size *= repeats

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep the batch rows ``indices`` (in that order)."""
        for layer in self._layers_with_state():
            layer.batch_select_indices(indices)
        if self._batch_size is not None:
            self._batch_size = int(torch.as_tensor(indices).numel())

    def reset(self) -> None:
        """Forget every token: the cache takes any batch size afterwards. A static cache (``max_cache_len``) keeps
        its storage, so compiled graphs and CUDA graphs stay valid: it takes the same batch size again."""
        self._sealed = None
        model = self.bound_model
        if self.static_cache_len is not None and model is not None and self._batch_size is not None:
            for layer in self.layers:
                if isinstance(layer, ReplayLayer):
                    layer.clear_keeping_storage()
                elif hasattr(layer, "reset"):
                    layer.reset()
            self._kept_batch_size, self._batch_size = self._batch_size, None
            self.expect_prompt(self._prompt_tokens)
            return
        if model is not None:
            self.layers = self._build_layers(model, find_mixers(model))
        else:
            for layer in self.layers:
                layer.reset()
        self._batch_size = None
        if self._recording:
            self.activate_past_recording()
        self.expect_prompt(self._prompt_tokens)

    def __repr__(self) -> str:
        model = type(self.bound_model).__name__ if self.bound_model is not None else "unbound"
        return (
            f"ReplayCache(buffer_len={self.buffer_len}, precision={self.policy}, window={self.window}, "
            f"model={model}, ssm_layers={len(self.replay_layers)})"
        )


# Loading this module loads transformers: hook now, before any model.generate is looked up (see the package docstring)
install_hooks()
