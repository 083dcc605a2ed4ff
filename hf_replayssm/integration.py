"""Hooks into transformers so that a ReplayCache "just works" in ``model(...)`` and ``model.generate(...)``.

* ``PreTrainedModel.__call__``: binds a ReplayCache passed by keyword to the model before its forward runs.
* ``GenerationMixin.generate``: binds the cache, and for assisted generation / prompt lookup lifts transformers'
  refusal for stateful models (ReplayCache rolls back exactly), sizes the rollback window, gives a hybrid draft
  model a ReplayCache of its own, and returns the cache to plain decoding afterwards.
* ``GenerationMixin._prepare_cache_for_generation``: creates that draft ReplayCache.

Installed once, when ``hf_replayssm`` is imported; calls without a ReplayCache pass straight through.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
from dataclasses import dataclass

import torch
from transformers import DynamicCache, GenerationMixin, PreTrainedModel

_CACHE_KWARGS = ("cache", "past_key_values", "cache_params")
_installed = False


@dataclass(frozen=True)
class _DraftSettings:
    buffer_len: int
    precision: object
    window: int


_DRAFT: contextvars.ContextVar[_DraftSettings | None] = contextvars.ContextVar("hf_replayssm_draft", default=None)


def _replay_cache_in(kwargs: dict):
    from .cache import ReplayCache

    for key in _CACHE_KWARGS:
        value = kwargs.get(key)
        if isinstance(value, ReplayCache):
            return value
    return None


def _speculative_window(model, kwargs: dict) -> int | None:
    """Largest number of draft tokens one verify step can reject, or None when generation is not assisted."""
    config = kwargs.get("generation_config") or model.generation_config
    lookup = kwargs.get("prompt_lookup_num_tokens", getattr(config, "prompt_lookup_num_tokens", None))
    assistant = kwargs.get("assistant_model")
    if assistant is None and lookup is None:
        return None
    if assistant is None:
        return int(lookup)
    assistant_config = assistant.generation_config
    drafts = int(kwargs.get("num_assistant_tokens", getattr(assistant_config, "num_assistant_tokens", None) or 20))
    schedule = getattr(assistant_config, "num_assistant_tokens_schedule", None) or "constant"
    if schedule != "constant":  # the heuristic schedules grow the draft by 2 per fully accepted round
        limit = kwargs.get("max_new_tokens", getattr(config, "max_new_tokens", None)) or 256
        drafts = max(drafts, int(limit))
    return drafts


def _has_replayable_layers(model) -> bool:
    from .adapters import find_mixers

    return bool(find_mixers(model))  # raises for recurrent layers ReplayCache cannot roll back


def _wrap_generate(original):
    @functools.wraps(original)
    def generate(self, *args, **kwargs):
        cache = _replay_cache_in(kwargs)
        if cache is None:
            return original(self, *args, **kwargs)
        cache.bind(self)
        drafts = _speculative_window(self, kwargs)
        if drafts is None:
            return original(self, *args, **kwargs)
        if kwargs.get("cache_params") is cache and "cache_params" in inspect.signature(self.forward).parameters:
            raise ValueError(
                "this transformers version runs assisted generation / prompt lookup only with a cache passed as "
                "past_key_values, which pure Mamba models do not take; plain decoding works, or upgrade transformers "
                "(pure Mamba-2 speculation works from 5.24, where the cache is passed as cache=)"
            )
        if cache.get_seq_length() > 0:
            raise ValueError(
                "assisted generation and prompt lookup need an empty ReplayCache: transformers feeds the whole "
                "prompt in the first verify step. Pass a new ReplayCache() to this generate() call."
            )
        assistant = kwargs.get("assistant_model")
        if assistant is not None:
            _has_replayable_layers(assistant)  # refuse a draft whose state could not be rolled back
        cache.reserve_window(drafts + 1)
        prompt = kwargs.get("input_ids", kwargs.get("inputs", args[0] if args else None))
        if isinstance(prompt, torch.Tensor):
            cache.expect_prompt(prompt.shape[-1])
        had_flag = "_is_stateful" in vars(self)
        previous = vars(self).get("_is_stateful")
        self._is_stateful = False  # ReplayCache makes rollback exact, so assisted decoding is allowed
        token = _DRAFT.set(_DraftSettings(cache.buffer_len, cache.policy, drafts + 1))
        try:
            return original(self, *args, **kwargs)
        finally:
            _DRAFT.reset(token)
            if had_flag:
                self._is_stateful = previous
            else:
                del self._is_stateful
            cache.deactivate_past_recording()

    generate._replayssm_original = original
    return generate


def _wrap_prepare_cache(original):
    @functools.wraps(original)
    def _prepare_cache_for_generation(self, generation_config, model_kwargs, *args, **kwargs):
        result = original(self, generation_config, model_kwargs, *args, **kwargs)
        settings = _DRAFT.get()
        if settings is None or not getattr(generation_config, "is_assistant", False):
            return result
        from .cache import ReplayCache

        for key in _CACHE_KWARGS:
            made = model_kwargs.get(key)
            if isinstance(made, DynamicCache) and not isinstance(made, ReplayCache) and _has_replayable_layers(self):
                draft_cache = ReplayCache(settings.buffer_len, settings.precision, window=settings.window)
                draft_cache.bind(self)
                draft_cache.activate_past_recording()
                model_kwargs[key] = draft_cache
        return result

    _prepare_cache_for_generation._replayssm_original = original
    return _prepare_cache_for_generation


def _wrap_call(original):
    @functools.wraps(original)
    def __call__(self, *args, **kwargs):
        cache = _replay_cache_in(kwargs)
        if cache is not None:
            cache.bind(self)
        return original(self, *args, **kwargs)

    __call__._replayssm_original = original
    return __call__


def install_hooks() -> None:
    global _installed
    if _installed:
        return
    GenerationMixin.generate = _wrap_generate(GenerationMixin.generate)
    GenerationMixin._prepare_cache_for_generation = _wrap_prepare_cache(GenerationMixin._prepare_cache_for_generation)
    PreTrainedModel.__call__ = _wrap_call(PreTrainedModel.__call__)
    _installed = True
