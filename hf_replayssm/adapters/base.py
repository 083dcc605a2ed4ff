"""Patching machinery shared by the family adapters.

A mixer forward runs *unchanged* (its own projections, conv, gates and norms); the adapter only

1. wraps the mixer class's ``forward`` so that, when it receives a ``ReplayCache``, the call knows which
   ``ReplayLayer`` serves it (a context variable), and
2. wraps the module-level recurrence functions the forward calls (e.g. ``mamba2_selective_state_update`` /
   ``mamba2_chunk_scan``): inside a replay call they compute the outputs from checkpoint + records instead of
   stepping the state; outside one they call the original.

The cache hands the stock mixer ``None`` as conv state and a recording flag, so every conv step goes through
``update_conv_state`` (the conv ring). Both wraps are idempotent and cost one context lookup otherwise. Under
``torch.compile`` (a static ReplayCache's decode step) the call lives in a module-level slot instead of the context
variable, which Dynamo cannot trace. This module imports neither transformers nor the cache.
"""

from __future__ import annotations

import contextvars
import functools
import importlib.util
import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ..decode_pack import PackedSlot
from ..ops.short_conv import causal_conv_tail, causal_conv_window, supports_activation

# transformers' mixers use the causal_conv1d package's CUDA kernels when it is installed, their torch conv otherwise
_HAS_CAUSAL_CONV1D = importlib.util.find_spec("causal_conv1d") is not None

_ACTIVE: contextvars.ContextVar[ReplayCall | None] = contextvars.ContextVar("hf_replayssm_call", default=None)
_CACHE_KWARGS = ("cache", "cache_params", "past_key_values")


@dataclass
class ReplayCall:
    layer: object  # ReplayLayer
    module: torch.nn.Module
    handled_tokens: int = 0
    # width of the last eager conv window the cache handed the mixer ([history K, new T]): lets the conv interceptor
    # recognise that window when the mixer convolves it
    conv_window: int | None = None
    # what a step on device positions runs on: the layer's ``DevicePositions``, or in a compiled plain step on a
    # packed cache its ``PackedSlot`` (hf_replayssm.decode_pack). None: the layer's own (``call.layer.positions``)
    positions: object = None

    def __post_init__(self):
        if self.positions is None:
            self.positions = self.layer.positions


# The replay call of the mixer forward being traced by ``torch.compile``: Dynamo cannot trace a context variable (nor,
# in torch 2.11, an attribute set on a class), but it traces item writes and reads of a module-level list within one
# graph. Eager calls never use it.
_COMPILED_CALL: list[ReplayCall | None] = [None]


def active_call() -> ReplayCall | None:
    if torch.compiler.is_compiling():
        return _COMPILED_CALL[0]
    return _ACTIVE.get()


def _kernels_func_target(fn) -> Callable | None:
    """The function a Hugging Face ``kernels`` function module (``nn.Module`` ``Func``, which transformers makes of
    every hub-kernel function when ``kernels`` is installed: a dependency from transformers 5.25) calls when no kernel
    is selected: the ``func`` its ``forward`` closes over. None for anything else."""
    if not isinstance(fn, torch.nn.Module):
        return None
    forward = getattr(type(fn).forward, "__code__", None)
    closure = getattr(type(fn).forward, "__closure__", None) or ()
    if forward is None or "func" not in forward.co_freevars:
        return None
    target = closure[forward.co_freevars.index("func")].cell_contents
    return target if callable(target) else None


def reference_function(fn: Callable) -> Callable:
    """The pure-torch reference behind a hub-kernel wrapper (its signature is what model code calls)."""
    while True:
        if hasattr(fn, "__wrapped__"):
            fn = fn.__wrapped__
        elif (target := _kernels_func_target(fn)) is not None:
            fn = target
        else:
            return fn


def reference_signature(fn: Callable) -> inspect.Signature:
    """The signature model code calls ``fn`` with. With Hugging Face's ``kernels`` package active, transformers turns
    the function into a ``kernels`` function module whose ``forward`` carries the reference signature."""
    fn = reference_function(fn)
    if isinstance(fn, torch.nn.Module):
        return inspect.signature(fn.forward)
    return inspect.signature(fn)


class _Parameters:
    """What ``CallArgs`` needs of a signature, computed once per intercepted function (binding by hand keeps the
    per-call work traceable by ``torch.compile``)."""

    def __init__(self, signature: inspect.Signature):
        kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        self.positional = [p.name for p in signature.parameters.values() if p.kind in kinds]
        self.positions = {name: i for i, name in enumerate(self.positional)}
        self.var_positional = any(p.kind is p.VAR_POSITIONAL for p in signature.parameters.values())
        self.defaults = {p.name: p.default for p in signature.parameters.values()
                         if p.default is not p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}


class CallArgs:
    """The arguments of one intercepted call, by name, able to re-issue the call with a few substitutions."""

    def __init__(self, signature: inspect.Signature | _Parameters, args: tuple, kwargs: dict):
        params = signature if isinstance(signature, _Parameters) else _Parameters(signature)
        if len(args) > len(params.positional) and not params.var_positional:
            raise TypeError(f"too many positional arguments ({len(args)} > {len(params.positional)})")
        self.args, self.kwargs = args, kwargs
        self._positions = params.positions
        self.values = dict(params.defaults)
        self.values.update(zip(params.positional, args, strict=False))
        self.values.update(kwargs)

    def __getitem__(self, name: str):
        return self.values.get(name)

    def call(self, fn: Callable, **overrides):
        """Call ``fn`` the way the model called the original, with ``overrides`` by parameter name."""
        args, kwargs = list(self.args), dict(self.kwargs)
        for name, value in overrides.items():
            pos = self._positions.get(name)
            if name not in kwargs and pos is not None and pos < len(args):
                args[pos] = value
            else:
                kwargs[name] = value
        return fn(*args, **kwargs)


def intercept(module, name: str, make_replacement: Callable[[Callable], Callable]) -> None:
    """Replace ``module.name`` by ``make_replacement(original)`` once."""
    original = getattr(module, name, None)
    if original is None:
        raise RuntimeError(f"{module.__name__} has no function {name!r}; this transformers version is not supported")
    if getattr(original, "_replayssm_original", None) is not None:
        return
    replacement = make_replacement(original)
    replacement._replayssm_original = original
    setattr(module, name, replacement)


def _find_cache(args: tuple, kwargs: dict):
    for key in _CACHE_KWARGS:
        if kwargs.get(key) is not None:
            return kwargs[key]
    return args[0] if args else None


def wrap_mixer_forward(mixer_cls: type) -> None:
    """Make ``mixer_cls.forward`` route a ReplayCache call through the replay layer (idempotent)."""
    original = mixer_cls.__dict__.get("forward")
    if original is None or getattr(original, "_replayssm_original", None) is not None:
        return

    @functools.wraps(original)
    def forward(self, hidden_states, *args, **kwargs):
        cache = _find_cache(args, kwargs)
        if getattr(cache, "_replayssm_cache", False) is not True:  # stock caches pass through
            return original(self, hidden_states, *args, **kwargs)
        if torch.compiler.is_compiling():
            return _compiled_forward(original, self, cache, hidden_states, args, kwargs)
        return _replay_forward(original, self, cache, hidden_states, args, kwargs)

    forward._replayssm_original = original
    mixer_cls.forward = forward


def _replay_forward(original, mixer, cache, hidden_states, args, kwargs):
    """A mixer forward on a ReplayCache, eagerly: inside a replay call, then the layer's bookkeeping."""
    if kwargs.get("cu_seq_lens_q") is not None or kwargs.get("cu_seqlens") is not None:
        raise ValueError("ReplayCache does not support packed sequences (cu_seqlens); pad the batch instead")
    layer = cache.replay_layer_for(mixer, hidden_states.shape[0])
    call = ReplayCall(layer, mixer)
    token = _ACTIVE.set(call)
    try:
        out = original(mixer, hidden_states, *args, **kwargs)
    finally:
        _ACTIVE.reset(token)
    count = hidden_states.shape[1]
    if call.handled_tokens != count:
        raise RuntimeError(
            f"{type(mixer).__name__} did not route its recurrence through ReplayCache ({call.handled_tokens} of "
            f"{count} tokens); this kernel path is not supported"
        )
    was_active = layer.positions.is_active()
    layer.finish_forward(count)
    if not was_active and layer.positions.is_active():  # took over from the host schedule in this forward
        cache.refresh_decode_pack()
    return out


# A forward the layer's device positions cannot take (a speculative window wider than the verify slots, which the host
# schedule grows the rings for) runs outside the graph: Dynamo must not trace the host schedule
_eager_replay_forward = torch.compiler.disable(_replay_forward)


def _compiled_forward(original, mixer, cache, hidden_states, args, kwargs):
    """A mixer forward traced by ``torch.compile``: a static ReplayCache's plain decode step or speculative window on
    device positions (the cache says ``is_compileable`` for nothing else), which touches no host-side position, so
    the graph holds; anything else runs eagerly (a graph break)."""
    layer = cache.layers[mixer.layer_idx]
    pack = cache.decode_pack
    slot = None if pack is None else pack.slot_for(mixer.layer_idx)
    if slot is not None and hidden_states.shape[1] == 1:
        # a plain step of a packed cache: every operand read through the pack (one source for all the layers)
        call = ReplayCall(layer, mixer, positions=PackedSlot(pack, slot))
    elif layer.positions.accepts(hidden_states.shape[1]):
        call = ReplayCall(layer, mixer)
    else:
        return _eager_replay_forward(original, mixer, cache, hidden_states, args, kwargs)
    previous = _COMPILED_CALL[0]
    _COMPILED_CALL[0] = call
    try:
        return original(mixer, hidden_states, *args, **kwargs)
    finally:
        _COMPILED_CALL[0] = previous


def refuse_hub_layer(mixer: torch.nn.Module, layer_idx: int) -> None:
    """A mixer whose forward Hugging Face ``kernels`` replaced by a hub layer (``kernelize``, which transformers'
    ``from_pretrained`` runs by default from 5.25 wherever the hub has a layer for the device: Qwen3.5's Gated DeltaNet
    on GB10 and Strix Halo) never reaches the patched class forward, so its recurrence cannot be replayed: refuse at
    bind. Kernelized *functions* (fla's, mamba_ssm's) are fine: the replay path runs in their place inside a replay
    call and calls them for a prefill."""
    repo = vars(mixer).get("_kernel_repo")
    if repo is None:
        return
    name = getattr(type(mixer), "kernel_layer_name", type(mixer).__name__)
    raise ValueError(
        f"{type(mixer).__name__} (layer {layer_idx}) runs a hub kernel layer in place of its own forward ({repo}, "
        f"set by kernels' kernelize: transformers' from_pretrained applies it by default from 5.25); ReplayCache "
        f"replays through the model's own forward: call model.reset_kernels() (or load with use_kernels=False, or "
        f"kernelize with a mapping without {name!r}) before decoding with it"
    )


def repoint_accelerate_hook(mixer: torch.nn.Module) -> None:
    """accelerate's device hooks capture the bound ``forward`` when a model is dispatched (``device_map=...``);
    point a hooked mixer at the patched class forward."""
    if "_old_forward" in vars(mixer):
        mixer._old_forward = type(mixer).forward.__get__(mixer)


Interceptor = Callable[[object], Callable[[Callable], Callable]]


def interceptor(body: Callable) -> Interceptor:
    """Turn ``body(module, call, args, original)`` into an interceptor factory for a module-level function: outside a
    replay call the original runs untouched; inside one, ``body`` gets the call's ``ReplayCall``, the arguments by
    name (``CallArgs``, bound against the torch reference's signature) and the original (to run the model's own
    path, e.g. a chunked prefill)."""

    def factory(module) -> Callable[[Callable], Callable]:
        def make(original: Callable) -> Callable:
            parameters = _Parameters(reference_signature(original))

            @functools.wraps(original)
            def replacement(*args, **kwargs):
                call = active_call()
                if call is None:
                    return original(*args, **kwargs)
                return body(module, call, CallArgs(parameters, args, kwargs), original)

            return replacement

        return make

    return factory


@interceptor
def conv_update_interceptor(module, call, a: CallArgs, original):
    """``causal_conv1d_update`` inside a replay call (mixers that skip the recording check use it for decode)."""
    x = a["hidden_states"]
    positions = call.positions
    if torch.compiler.is_compiling() and positions.takes_conv(x):  # a plain step: the call's positions (its pack slot)
        full = positions.conv_step(x)
    else:
        full = call.layer.update_conv_state(x, conv_kernel_size=a["weight"].shape[-1])
    if torch.compiler.is_compiling() and supports_activation(a["activation"]):
        # fused by inductor with its neighbours; F.conv1d would be a slow depthwise kernel there (ops/short_conv.py)
        return causal_conv_tail(full, a["weight"], a["bias"], a["activation"], x.shape[-1])
    if not _HAS_CAUSAL_CONV1D and supports_activation(a["activation"]):
        # transformers' torch conv pads the window and computes all of it; stock decoding convolves only the tail
        return causal_conv_window(full, a["weight"], a["bias"], a["activation"], x.shape[-1])
    out = module.causal_conv1d_fn(full, a["weight"], a["bias"], activation=a["activation"])  # the CUDA package's
    return out[..., -x.shape[-1] :]


@interceptor
def conv_fn_interceptor(module, call, a: CallArgs, original):
    """``causal_conv1d_fn`` inside a replay call, on the window ``[conv ring K, new T]`` the cache handed the mixer
    (the mixer keeps the last T outputs). transformers' torch conv pads that window by K - 1 and computes every
    position of it (about 5x the work: 250 against 51 us per Qwen3.5-like GDN layer and step at batch 256 on an H200);
    the T outputs alone are one unpadded ``F.conv1d`` eagerly (``causal_conv_window``: transformers' decode update,
    bit for bit) and one fusable elementwise sum in a compiled decode step (``causal_conv_tail``: F.conv1d would be a
    slow depthwise kernel under inductor; ops/short_conv.py). The CUDA ``causal_conv1d`` package, where installed, and
    any other input get the model's own conv."""
    x = a["hidden_states"]
    if torch.compiler.is_compiling():
        positions = call.positions
        # on device positions the window's width is the conv tensor's (already guarded), not the schedule's kernel
        # (one more guard per layer before every CUDA-graph replay)
        if positions.is_active() and positions.conv is not None and supports_activation(a["activation"]):
            kernel = positions.conv.shape[-1]
            if x.shape[-1] > kernel:
                return causal_conv_tail(x, a["weight"], a["bias"], a["activation"], x.shape[-1] - kernel)
        return a.call(original)
    kernel = call.layer.schedule.conv_kernel
    if kernel is None or not supports_activation(a["activation"]) or x.shape[-1] <= kernel:
        return a.call(original)
    if not _HAS_CAUSAL_CONV1D and call.conv_window == x.shape[-1]:
        return causal_conv_window(x, a["weight"], a["bias"], a["activation"], x.shape[-1] - kernel)
    return a.call(original)


@dataclass
class FamilyAdapter:
    """A recurrence family and the model types whose mixers it serves."""

    name: str
    recurrence: Callable[[], object]
    # mixer class name -> (model types, {function name: interceptor factory(module) -> (original -> replacement)})
    mixers: dict[str, tuple[str, ...]] = field(default_factory=dict)
    interceptors: dict[str, Callable] = field(default_factory=dict)  # the recurrence functions
    # the mixers' ``causal_conv1d_fn`` gets ``conv_fn_interceptor`` (compiled decode steps: a fused conv)
    fused_conv: bool = False

    def install(self, mixer_cls: type) -> None:
        module = sys.modules[mixer_cls.__module__]
        for fn_name, factory in self.interceptors.items():
            if hasattr(module, fn_name):
                intercept(module, fn_name, factory(module))
        if hasattr(module, "causal_conv1d_update"):
            intercept(module, "causal_conv1d_update", conv_update_interceptor(module))
        if self.fused_conv and hasattr(module, "causal_conv1d_fn"):
            intercept(module, "causal_conv1d_fn", conv_fn_interceptor(module))
        wrap_mixer_forward(mixer_cls)
