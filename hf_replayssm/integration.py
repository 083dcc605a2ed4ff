"""Hooks into transformers so that a ReplayCache "just works" in ``model(...)`` and ``model.generate(...)``.

* ``PreTrainedModel.__call__``: binds a ReplayCache passed by keyword to the model before its forward runs (and
  passes it under the keyword the forward takes, e.g. ``cache_params`` for pure Mamba-2 in transformers 5.17).
* ``GenerationMixin.generate``: binds the cache, and for speculative decoding (assistant models, including other
  tokenizers and DFlash drafters; prompt lookup; MTP heads; early exit) lifts transformers' refusal for stateful
  models (ReplayCache rolls back exactly) for this call only, preallocates the rollback window, gives a hybrid draft
  model a ReplayCache of its own, and returns the cache to plain decoding afterwards.
* ``GenerationMixin._prepare_cache_for_generation``: creates that draft ReplayCache.
* ``GenerationMixin._get_candidate_generator``: in those calls, transformers' prompt lookup searches a host copy of
  the ids (``host_lookup``: the same drafts, one device read a round instead of a dozen).

Installed once the package and transformers are both loaded (see ``hf_replayssm.__init__``). Calls without
a ReplayCache pass straight through, compiled ones included (the hooks read no context variable under
``torch.compile``).
"""

from __future__ import annotations

import contextvars
import copy
import functools
import inspect
import threading
from dataclasses import dataclass

import torch

_CACHE_KWARGS = ("cache", "past_key_values", "cache_params")
_install_lock = threading.Lock()
_installed = False


@dataclass(frozen=True)
class _DraftSettings:
    buffer_len: int
    precision: object
    window: int


_DRAFT: contextvars.ContextVar[_DraftSettings | None] = contextvars.ContextVar("hf_replayssm_draft", default=None)
# ids of the models whose "stateful models cannot do assisted generation" refusal is lifted in this context (thread)
_LIFTED: contextvars.ContextVar[frozenset] = contextvars.ContextVar("hf_replayssm_lifted", default=frozenset())
# the static cache whose verify forwards run on device positions in this generate() call: its compiled forwards are
# called through a wrapper that tells it each window's width (``_wrap_get_compiled_call``)
_VERIFYING: contextvars.ContextVar[object | None] = contextvars.ContextVar("hf_replayssm_verifying", default=None)


def _is_replay_cache(value) -> bool:
    return getattr(value, "_replayssm_cache", False) is True


def _replay_cache_in(kwargs: dict):
    for key in _CACHE_KWARGS:
        value = kwargs.get(key)
        if _is_replay_cache(value):
            return value
    return None


def _setting(model, kwargs: dict, name: str, default=None):
    """A generation setting as this generate() call sees it: its keyword, else its generation_config's (or the
    model's) value, else ``default``."""
    if name in kwargs:
        return kwargs[name]
    return getattr(kwargs.get("generation_config") or model.generation_config, name, default)


def _speculative_window(model, kwargs: dict) -> int | None:
    """Draft tokens transformers will verify per step (to preallocate the rings; larger windows grow them), or None
    when generation is not assisted."""
    lookup = _setting(model, kwargs, "prompt_lookup_num_tokens")
    assistant = kwargs.get("assistant_model")
    # in the order transformers picks its candidate generator: early exit, prompt lookup, MTP, DFlash, assistants
    if _early_exit_layer(model, kwargs) is not None:  # self-speculation: the model drafts with its first k layers
        return int(getattr(model.generation_config, "num_assistant_tokens", None) or 20)
    if lookup is not None:
        return int(lookup)
    if _setting(model, kwargs, "use_mtp", False):
        # the MTP heads draft one token each (their own MtpCache is transformers'); our cache holds the main model
        return int(getattr(model.config.get_text_config(), "num_mtp_layers", None) or 1)
    if assistant is None:
        return None
    if _setting(model, kwargs, "speculation_type") == "dflash":
        # a DFlash drafter denoises one block of block_size tokens per round from the main model's hidden states
        return int(getattr(assistant.config, "block_size", 16))
    # transformers drafts what the *assistant's* generation config says (a num_assistant_tokens keyword of the main
    # call does not reach it); the heuristic schedules start there and grow, which grows the rings
    drafts = getattr(assistant.generation_config, "num_assistant_tokens", None)
    return int(drafts or 20)


def _early_exit_layer(model, kwargs: dict) -> int | None:
    return _setting(model, kwargs, "assistant_early_exit")


def _check_early_exit(model, kwargs: dict) -> None:
    """Early-exit self-speculation drafts with this very model, its config cut to the first k layers while drafting,
    and its draft gets a ReplayCache of its own. Where transformers then sizes the draft's cache to k layers
    (5.24 does; 5.17 keeps one per layer type), that cache cannot hold the model's deeper SSM layers: refuse."""
    exit_layer = _early_exit_layer(model, kwargs)
    if exit_layer is None:
        return
    from transformers import DynamicCache

    from .adapters import find_mixers

    config = copy.deepcopy(model.config.get_text_config(decoder=True))
    config.num_hidden_layers = int(exit_layer)
    held = len(DynamicCache(config=config).layers)
    if max(find_mixers(model), default=-1) >= held:
        mtp = getattr(model.config.get_text_config(), "num_mtp_layers", None) is not None
        raise ValueError(
            "assistant_early_exit (self-speculation) is not supported with a ReplayCache on this transformers "
            f"version: it sizes the early-exit draft's cache to its first {exit_layer} layers, which cannot hold "
            "the model's deeper SSM layers. Use prompt_lookup_num_tokens= or a separate assistant_model="
            + (", or use_mtp=True (this model has multi-token-prediction layers)." if mtp else ".")
        )


def _prompt_ids(args: tuple, kwargs: dict):
    """The prompt a generate() call was given (positionally or by keyword), if any."""
    return kwargs.get("input_ids", kwargs.get("inputs", args[0] if args else None))


def _batch_of_prompts(args: tuple, kwargs: dict) -> torch.Tensor | None:
    """The prompt ids when they are a batch of more than one row (what the batched speculation route takes)."""
    prompt = _prompt_ids(args, kwargs)
    if isinstance(prompt, torch.Tensor) and prompt.dim() == 2 and prompt.shape[0] > 1:
        return prompt
    return None


def _max_length(model, args: tuple, kwargs: dict) -> int | None:
    prompt = _prompt_ids(args, kwargs)
    new = _setting(model, kwargs, "max_new_tokens")
    if isinstance(prompt, torch.Tensor) and new is not None:
        return prompt.shape[-1] + int(new)
    length = _setting(model, kwargs, "max_length")
    return int(length) if length is not None else None


def _has_replayable_layers(model) -> bool:
    from .adapters import find_mixers

    return bool(find_mixers(model))  # raises for recurrent layers ReplayCache cannot roll back


class _StatefulFlag:
    """Replaces a model class's ``_is_stateful = True``: still True, except for models whose refusal a ReplayCache
    ``generate()`` lifted in the current context (so other threads and plain calls keep transformers' check)."""

    def __init__(self, value):
        self.value = value

    def __get__(self, obj, objtype=None):
        if obj is not None and id(obj) in _LIFTED.get():
            return False
        return self.value


def _scope_stateful_flag(model) -> None:
    cls = type(model)
    if isinstance(cls.__dict__.get("_is_stateful"), _StatefulFlag):
        return
    for klass in cls.__mro__:  # the class that gives the value now
        if "_is_stateful" in klass.__dict__:
            value = klass.__dict__["_is_stateful"]
            break
    else:
        value = False
    if isinstance(value, _StatefulFlag):
        value = value.value
    cls._is_stateful = _StatefulFlag(value)


def _check_assisted(model, cache, args: tuple, kwargs: dict) -> None:
    if "cache_params" in inspect.signature(model.forward).parameters and kwargs.get("cache_params") is cache:
        raise ValueError(
            "this transformers version runs assisted generation / prompt lookup only with a cache passed as "
            "past_key_values, which pure Mamba models do not take; plain decoding works, or upgrade transformers "
            "(pure Mamba-2 speculation works from 5.24, where the cache is passed as cache=)"
        )
    if cache.get_seq_length() > 0:
        raise ValueError(
            "assisted generation and prompt lookup need an empty ReplayCache: transformers feeds the whole "
            "prompt in the first verify step. Pass a new ReplayCache() to this generate() call, or "
            "call cache.reset() first (a static cache keeps its storage)."
        )
    if _setting(model, kwargs, "use_mtp", False):
        _check_mtp_heads(model)
    stop_strings = _setting(model, kwargs, "stop_strings")
    if stop_strings:
        # StopStringCriteria looks for a stop string at the end of the sequence; a round appends several tokens, so a
        # stop string inside them is never at the end, and generation runs on to max_new_tokens (transformers' own
        # assisted loop does the same on the caches it accepts)
        raise ValueError(
            f"stop_strings={stop_strings!r} with speculative decoding: transformers' assisted loop checks a stop "
            "string only at the end of the tokens a round accepts, so one inside them is missed and generation "
            "runs on to max_new_tokens. Decode without prompt_lookup_num_tokens / assistant_model, or drop "
            "stop_strings and cut the text at the stop string yourself (an end-of-sequence token does stop it)."
        )
    from .chunking import speculation_refusal

    reason = speculation_refusal(model, _max_length(model, args, kwargs))
    if reason is not None:
        raise ValueError(f"ReplayCache cannot make speculative decoding exact here: {reason}")
    assistant = kwargs.get("assistant_model")
    if assistant is not None:
        _has_replayable_layers(assistant)  # refuse a draft whose state could not be rolled back
        if _forward_cache_keyword(type(assistant)) == "cache_params":
            raise ValueError(
                f"{type(assistant).__name__} cannot be a draft model on this transformers version: transformers passes "
                "a draft model its cache as past_key_values, which pure Mamba models do not take here. Use a hybrid "
                "draft model, or upgrade transformers (pure Mamba-2 drafts work from 5.24)."
            )


def _check_mtp_heads(model) -> None:
    """transformers builds the MTP block with the class of the first norm in the main model's last layer. When that
    layer is a linear-attention one, this is the gated output norm, which then fails inside the MTP block for want of
    a gate (AttributeError on None): refuse clearly instead. (A model without MTP layers gets transformers' own
    "Could not find `num_mtp_layers`" error.)"""
    if getattr(model.config.get_text_config(), "num_mtp_layers", None) is None:
        return
    last_layer = model.get_decoder().layers[-1]
    norm = next((module for name, module in last_layer.named_modules() if "norm" in name), None)
    if norm is not None and "gate" in inspect.signature(type(norm).forward).parameters:
        raise ValueError(
            f"use_mtp=True cannot run on this {type(model).__name__}: its last decoder layer is a linear-attention "
            f"layer, and transformers builds the MTP block with that layer's first norm ({type(norm).__name__}, "
            "which needs a gate the MTP block does not pass). Use prompt lookup or a draft model instead."
        )


_PLAIN_GREEDY = {"do_sample": False, "num_beams": 1, "num_return_sequences": 1}
# What the batched route cannot return: it keeps no per-step scores or activations (rows advance unevenly).
_NOT_RETURNED = {"output_scores": False, "output_logits": False, "output_attentions": False,
                 "output_hidden_states": False}
# Settings whose logits processors or stopping criteria change what greedy decoding emits. The batched route picks
# the argmax of the raw logits and stops at max_new_tokens / eos, so it refuses them rather than silently ignore them.
_NOT_BATCHED = {
    "min_length": 0, "min_new_tokens": None, "suppress_tokens": None, "begin_suppress_tokens": None,
    "bad_words_ids": None, "force_words_ids": None, "sequence_bias": None, "repetition_penalty": 1.0,
    "encoder_repetition_penalty": 1.0, "no_repeat_ngram_size": 0, "encoder_no_repeat_ngram_size": 0,
    "forced_bos_token_id": None, "forced_eos_token_id": None, "exponential_decay_length_penalty": None,
    "guidance_scale": None, "watermarking_config": None, "stop_strings": None, "max_time": None,
}
_NOT_BATCHED_ARGUMENTS = ("logits_processor", "stopping_criteria", "prefix_allowed_tokens_fn", "streamer",
                          "negative_prompt_ids", "negative_prompt_attention_mask", "custom_generate")
# generate() keywords that are not generation settings and that the batched route reads, or that change nothing there
_ROUTE_KEYWORDS = frozenset({"inputs", "input_ids", "attention_mask", "generation_config", "assistant_model",
                             "tokenizer", "assistant_tokenizer", "past_key_values", "cache", "cache_params",
                             "synced_gpus", "use_model_defaults"})


def _non_neutral_settings(model, kwargs: dict, neutral: dict):
    """(name, value) of each setting in ``neutral`` that this call sets to something else (None and empty
    containers count as unset)."""
    for name, default in neutral.items():
        value = _setting(model, kwargs, name, default)
        if value is not None and value != default and not (isinstance(value, list | tuple | dict) and not value):
            yield name, value


def _refuse_unbatched_settings(model, kwargs: dict) -> None:
    for name, value in _non_neutral_settings(model, kwargs, _PLAIN_GREEDY):
        raise ValueError(f"batched prompt lookup with a ReplayCache is greedy only: {name}={value!r} is not "
                         "supported (use batch size 1 for transformers' own assisted generation)")
    for name, value in _non_neutral_settings(model, kwargs, _NOT_BATCHED):
        raise ValueError(
            f"batched speculation with a ReplayCache emits the argmax of the model's logits and does not apply "
            f"{name}={value!r} (a logits processor or stopping criterion of plain generate()); leave it unset "
            f"(or {_NOT_BATCHED[name]!r}), or decode this batch without prompt_lookup_num_tokens / assistant_model"
        )
    for name, value in _non_neutral_settings(model, kwargs, _NOT_RETURNED):
        raise ValueError(f"batched speculation with a ReplayCache returns the sequences only: {name}={value!r} is not "
                         "supported; decode this batch without prompt_lookup_num_tokens / assistant_model, or one row "
                         "at a time (transformers' own assisted generation returns them at batch size 1)")
    for name in _NOT_BATCHED_ARGUMENTS:
        if kwargs.get(name) is not None:
            raise ValueError(f"batched speculation with a ReplayCache does not run {name}=...; decode this batch "
                             "without prompt_lookup_num_tokens / assistant_model, or one row at a time")
    ignored = sorted(name for name, value in kwargs.items()
                     if value is not None and name not in _ROUTE_KEYWORDS and name not in _generation_settings())
    if ignored:  # model inputs plain generate() would pass to the forward (images, position ids, embeddings, ...)
        raise ValueError(
            f"batched speculation with a ReplayCache feeds the model input_ids and an attention mask only, so it "
            f"would ignore {', '.join(ignored)}; decode this batch without prompt_lookup_num_tokens / "
            "assistant_model, or one row at a time (transformers' own assisted generation passes them at batch size 1)"
        )


@functools.cache
def _generation_settings() -> frozenset:
    """Every setting a GenerationConfig holds (generate() takes each as a keyword)."""
    from transformers import GenerationConfig

    return frozenset(GenerationConfig().to_dict())


def _attention_mask(model, kwargs: dict, prompt: torch.Tensor, eos) -> torch.Tensor | None:
    """The caller's attention mask, else the one plain generate() infers: zeros at pad tokens when the prompt holds
    the pad id and the pad id is not an end-of-sequence id (else none: every token counts)."""
    mask = kwargs.get("attention_mask")
    pad = _setting(model, kwargs, "pad_token_id")
    if mask is not None or pad is None:
        return mask
    from .batched import stop_tokens

    if int(pad) in stop_tokens(eos) or not bool((prompt == int(pad)).any()):
        return None
    return prompt.ne(int(pad)).long()


def _new_tokens(model, kwargs: dict, prompt_len: int) -> int:
    """New tokens per row as plain generate() counts them: max_new_tokens, else max_length minus the prompt, else
    transformers' default of 20 (within the model's max_position_embeddings)."""
    new = _setting(model, kwargs, "max_new_tokens")
    if new is not None:
        return int(new)
    length = _setting(model, kwargs, "max_length")
    if length is None:
        length = prompt_len + 20
        positions = getattr(model.config, "max_position_embeddings", None)
        length = min(length, positions) if positions is not None else length
    if length <= prompt_len:
        raise ValueError(f"Input length of input_ids is {prompt_len}, but `max_length` is set to {length}: no room for "
                         "new tokens. Increase `max_length` or, better, set `max_new_tokens`.")
    return int(length) - prompt_len


def _check_static_length(cache, length: int | None, drafts: int | None) -> None:
    """A static cache must hold every token a generate() call writes: up to ``max_length``, and with speculation up
    to ``drafts`` more in every mode (prompt lookup caps its drafts by the prompt, not by max_length: its last verify
    forward may run past max_length, and the tokens past it are cropped; transformers' other candidate generators
    cap theirs, but a window more is the bound that holds for all)."""
    if length is None:
        return
    needed = length + (drafts or 0)
    if needed > cache.static_cache_len:
        past = f" ({length} and up to {drafts} drafts a verify forward may run past them)" if drafts else ""
        raise ValueError(
            f"this generate() call reaches {needed} tokens{past}, more than the static ReplayCache holds "
            f"(max_cache_len={cache.static_cache_len}); create it with ReplayCache(..., max_cache_len={needed})"
        )


def _check_static_speculation(args: tuple, kwargs: dict) -> None:
    """A static ReplayCache speculates at batch size 1 (transformers' assisted loop, which crops every layer): the
    batched route keeps each rejected draft's attention slots (masked), so its cache would outgrow max_cache_len by
    up to a whole window per round."""
    prompt = _batch_of_prompts(args, kwargs)
    if prompt is not None:
        raise ValueError(
            f"batched speculative decoding ({prompt.shape[0]} rows) keeps every rejected draft's attention slots, so a "
            "static ReplayCache (max_cache_len) could run out of them; use ReplayCache() without max_cache_len for "
            "batched prompt lookup or draft models (a static cache speculates at batch size 1)"
        )


def _batched_lookup(model, cache, drafts: int, args: tuple, kwargs: dict):
    """Greedy prompt lookup or a draft model (``assistant_model``; ``drafts`` per round, as ``_speculative_window``
    counts them) over a batch (transformers' assisted generation takes batch size 1 only): the route through
    ``hf_replayssm.batched``. Returns the [B, S + new] sequences (new tokens right-padded with the pad id after a row's
    end of sequence; in a ``GenerateDecoderOnlyOutput`` with ``return_dict_in_generate``), or None where transformers'
    own path applies (batch 1, other modes)."""
    prompt = _batch_of_prompts(args, kwargs)
    if prompt is None:
        return None
    if _early_exit_layer(model, kwargs) is not None:
        return None
    assistant = None  # transformers' order: prompt lookup before MTP heads, DFlash and assistants
    if _setting(model, kwargs, "prompt_lookup_num_tokens") is None:
        assistant = kwargs.get("assistant_model")
        if (assistant is None or _setting(model, kwargs, "use_mtp", False)
                or _setting(model, kwargs, "speculation_type") == "dflash"
                or kwargs.get("assistant_tokenizer") is not None):  # another tokenizer is not batched
            return None
        vocab = model.config.get_text_config().vocab_size
        if assistant.config.get_text_config().vocab_size != vocab:
            raise ValueError(
                f"batched speculation with a draft model needs the main model's vocabulary ({vocab} tokens), the draft "
                f"has {assistant.config.get_text_config().vocab_size}; a draft with another tokenizer "
                "(assistant_tokenizer=...) runs at batch size 1 only"
            )
    _refuse_unbatched_settings(model, kwargs)
    new = _new_tokens(model, kwargs, prompt.shape[1])
    eos = _setting(model, kwargs, "eos_token_id")  # one id or several (a generation config's list)
    if isinstance(eos, torch.Tensor):
        eos = eos.flatten().tolist()
    if isinstance(eos, (list, tuple)) and not eos:
        eos = None
    from .batched import batched_prompt_lookup

    drafter, schedule = None, "constant"  # prompt lookup drafts a constant number, as in transformers
    if assistant is not None:
        from .batched_draft import DraftModelDrafter

        drafter = DraftModelDrafter(assistant, buffer_len=cache.buffer_len, max_drafts=drafts)
        # the assistant's schedule, per row here; it grows no further than the window the cache reserved
        if getattr(assistant.generation_config, "num_assistant_tokens_schedule", None) in ("heuristic",
                                                                                             "heuristic_transient"):
            schedule = "heuristic"
    result = batched_prompt_lookup(
        model, prompt, attention_mask=_attention_mask(model, kwargs, prompt, eos), max_new_tokens=int(new),
        num_draft_tokens=drafts, max_ngram=int(_setting(model, kwargs, "max_matching_ngram_size") or 2),
        eos_token_id=eos, cache=cache, drafter=drafter, draft_schedule=schedule,
    )
    pad = _setting(model, kwargs, "pad_token_id")
    if pad is None:  # as transformers pads: with the (first) end-of-sequence id
        pad = eos[0] if isinstance(eos, (list, tuple)) else eos
    width = max(len(t) for t in result.new_tokens)
    tail = torch.full((prompt.shape[0], width), 0 if pad is None else int(pad), dtype=prompt.dtype,
                      device=prompt.device)
    for row, tokens in enumerate(result.new_tokens):
        tail[row, : len(tokens)] = torch.tensor(tokens, dtype=prompt.dtype)
    sequences = torch.cat([prompt, tail], dim=1)
    if _setting(model, kwargs, "return_dict_in_generate", False):
        from transformers.generation.utils import GenerateDecoderOnlyOutput

        # no past_key_values: the cache's attention layers hold rejected drafts that only this route's mask hides
        return GenerateDecoderOnlyOutput(sequences=sequences)
    return sequences


def _wrap_generate(original):
    @functools.wraps(original)
    def generate(self, *args, **kwargs):
        cache = _replay_cache_in(kwargs)
        if cache is None:
            return original(self, *args, **kwargs)
        cache.bind(self)
        cache.check_unsealed()
        drafts = _speculative_window(self, kwargs)
        if cache.static_cache_len is not None:
            _check_static_length(cache, _max_length(self, args, kwargs), drafts)
        if kwargs.get("cache_params") is cache and cache.get_seq_length() > 0:
            # transformers (5.17) slices the already-cached prefix off the inputs only for past_key_values
            raise ValueError(
                f"this transformers version re-feeds the whole prefix to a cache passed as cache_params, so a "
                f"{type(self).__name__} cannot continue from a non-empty ReplayCache in generate(). Feed the new "
                "tokens with model(...) calls, start a new ReplayCache(), or upgrade transformers (works from 5.24)."
            )
        _check_early_exit(self, kwargs)
        if drafts is None:
            return original(self, *args, **kwargs)
        device_verify = False
        if cache.static_cache_len is not None:
            _check_static_speculation(args, kwargs)
            # transformers 5.25 compiles the verify forwards of a compileable cache. Layers with verify ops run their
            # windows on device positions (no host integer: the graph holds); otherwise a window runs on the host
            # schedule, whose width and ring positions a graph would specialise on: keep the verify forwards eager.
            device_verify = cache.verifies_on_device()
            if not device_verify:
                kwargs["disable_compile"] = True
        batched = _batched_lookup(self, cache, drafts, args, kwargs)
        if batched is not None:
            return batched
        _check_assisted(self, cache, args, kwargs)
        cache.reserve_window(drafts + 1)
        prompt = _prompt_ids(args, kwargs)
        if isinstance(prompt, torch.Tensor):
            cache.expect_prompt(prompt.shape[-1])
        _scope_stateful_flag(self)
        lifted = _LIFTED.set(_LIFTED.get() | {id(self)})  # ReplayCache makes rollback exact: allow assisted decoding
        draft = _DRAFT.set(_DraftSettings(cache.buffer_len, cache.policy, drafts + 1))
        cache.set_device_verify(device_verify)
        verifying = _VERIFYING.set(cache if device_verify else None)
        try:
            return original(self, *args, **kwargs)
        finally:
            _VERIFYING.reset(verifying)
            _DRAFT.reset(draft)
            _LIFTED.reset(lifted)
            cache.set_device_verify(False)
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
        from transformers import DynamicCache

        from .cache import ReplayCache

        for key in _CACHE_KWARGS:
            made = model_kwargs.get(key)
            if isinstance(made, DynamicCache) and not _is_replay_cache(made) and _has_replayable_layers(self):
                draft_cache = ReplayCache(settings.buffer_len, settings.precision, window=settings.window)
                draft_cache.bind(self)
                draft_cache.activate_past_recording()  # its first forward (the prompt) is the prefill
                model_kwargs[key] = draft_cache
        return result

    _prepare_cache_for_generation._replayssm_original = original
    return _prepare_cache_for_generation


@functools.cache
def _forward_cache_keyword(model_cls: type) -> str | None:
    """The cache parameter a model class's forward names, when it does not name ``past_key_values`` (``cache`` in
    newer 5.x, ``cache_params`` for pure Mamba in 5.17); a cache passed as ``past_key_values`` would otherwise land in
    ``**kwargs`` and never be used (or, for some classes, go through a deprecation shim)."""
    parameters = inspect.signature(model_cls.forward).parameters
    if "past_key_values" in parameters:
        return None
    return next((name for name in ("cache", "cache_params") if name in parameters), None)


def _wrap_call(original):
    @functools.wraps(original)
    def __call__(self, *args, **kwargs):
        if torch.compiler.is_compiling():
            return original(self, *args, **kwargs)
        cache = _replay_cache_in(kwargs)
        if cache is not None:
            cache.bind(self)
            cache.check_unsealed()
            inputs = kwargs.get("input_ids", kwargs.get("inputs_embeds", args[0] if args else None))
            if isinstance(inputs, torch.Tensor):
                cache.check_static_batch(inputs.shape[0])
            keyword = _forward_cache_keyword(type(self))
            if keyword is not None and kwargs.get("past_key_values") is cache and kwargs.get(keyword) is None:
                kwargs[keyword] = kwargs.pop("past_key_values")
        return original(self, *args, **kwargs)

    __call__._replayssm_original = original
    return __call__


def _wrap_get_compiled_call(original):
    """Inside a generate() call whose verify forwards run on device positions, the compiled forward comes wrapped:
    before each call the wrapper tells the cache the width of the window (the compiled frame runs no Python of ours
    that could), so that the crop after it commits on the device without reading it back. Elsewhere (plain compiled
    decoding, whose every step the wrapper would cost host time) the compiled forward is returned as it is."""
    @functools.wraps(original)
    def get_compiled_call(self, *args, **kwargs):
        compiled = original(self, *args, **kwargs)
        cache = _VERIFYING.get()
        if cache is None:
            return compiled

        def noting_window(*call_args, **call_kwargs):
            inputs = call_kwargs.get("input_ids", call_kwargs.get("inputs_embeds"))
            if _replay_cache_in(call_kwargs) is cache and isinstance(inputs, torch.Tensor):
                cache.note_window(inputs.shape[1])
            return compiled(*call_args, **call_kwargs)

        return noting_window

    get_compiled_call._replayssm_original = original
    return get_compiled_call


def _wrap_candidate_generator(original):
    """Inside a speculative generate() call on a ReplayCache, transformers' prompt lookup finds its drafts in a host
    copy of the ids (``host_lookup.HostPromptLookup``: the same drafts, one device read a round)."""
    @functools.wraps(original)
    def _get_candidate_generator(self, *args, **kwargs):
        generator = original(self, *args, **kwargs)
        if _DRAFT.get() is not None:
            from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

            from .host_lookup import HostPromptLookup

            if type(generator) is PromptLookupCandidateGenerator:  # a subclass may search otherwise
                generator.get_candidates = HostPromptLookup(generator).get_candidates
        return generator

    _get_candidate_generator._replayssm_original = original
    return _get_candidate_generator


def install_hooks() -> None:
    """Install the pass-through hooks (idempotent; ``ReplayCache()`` calls it)."""
    global _installed
    with _install_lock:
        if _installed:
            return
        from transformers import GenerationMixin, PreTrainedModel

        GenerationMixin.generate = _wrap_generate(GenerationMixin.generate)
        GenerationMixin._prepare_cache_for_generation = _wrap_prepare_cache(
            GenerationMixin._prepare_cache_for_generation
        )
        if hasattr(GenerationMixin, "_get_candidate_generator"):
            GenerationMixin._get_candidate_generator = _wrap_candidate_generator(
                GenerationMixin._get_candidate_generator
            )
        PreTrainedModel.__call__ = _wrap_call(PreTrainedModel.__call__)
        if hasattr(PreTrainedModel, "get_compiled_call"):
            PreTrainedModel.get_compiled_call = _wrap_get_compiled_call(PreTrainedModel.get_compiled_call)
        _installed = True
