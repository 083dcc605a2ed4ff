"""Hugging Face ``kernels`` hub kernels (a transformers dependency from 5.25, whose ``from_pretrained`` kernelizes by
default): kernelized recurrence functions leave replay exact, a mixer whose whole forward became a hub layer is
refused at bind. The hub cannot be reached here, so local stand-ins play the hub kernels: each counts its calls and
runs the function's torch reference."""

import collections
import inspect

import pytest
import torch
from conftest import GREEDY_KW, cache_kwarg, get_model, max_logit_diff

from hf_replayssm import ReplayCache
from hf_replayssm.adapters import find_mixers
from hf_replayssm.adapters.base import reference_function

kernels = pytest.importorskip("kernels", reason="Hugging Face kernels is not installed (transformers 5.25+ needs it)")

# the kernels that step a recurrent state one token at a time: ReplayCache's decode steps replay in their place
STATE_STEP_KERNELS = {"fused_recurrent_gated_delta_rule", "fused_recurrent_kda", "selective_state_update"}


class LocalRepository:
    """A kernels layer repository whose layer is given (``kernels`` asks a repository for ``load()`` alone)."""

    def __init__(self, name: str, layer: type):
        self.name, self.layer = name, layer

    def load(self) -> type:
        return self.layer

    def __hash__(self):
        return hash(self.name)

    def __eq__(self, other):
        return isinstance(other, LocalRepository) and other.name == self.name

    def __repr__(self):
        return f"LocalRepository({self.name!r})"


def _layer(name: str, forward, signature: inspect.Signature) -> type:
    """A stateless ``nn.Module`` class with ``forward``, whose signature (kernels checks it against the layer it
    replaces) is ``signature``."""
    forward.__signature__ = signature
    return type(name, (torch.nn.Module,), {"forward": forward})


def _kernelize(model, mapping: dict) -> None:
    with kernels.use_kernel_mapping(mapping, inherit_mapping=False):
        kernels.kernelize(model, mode=kernels.Mode.INFERENCE, device="cpu")


def _function_kernels(model, calls: collections.Counter) -> dict:
    """A counting stand-in for every hub-kernel function the model's SSM mixers call (recurrences, convs)."""
    mapping = {}
    for mixer, _ in find_mixers(model).values():
        for func in getattr(mixer, "_kernel_funcs", {}).values():
            name = type(func).kernel_layer_name
            reference = reference_function(func)

            def forward(self, *args, _name=name, _reference=reference, **kwargs):
                calls[_name] += 1
                return _reference(*args, **kwargs)

            layer = _layer(name, forward, inspect.signature(type(func).forward))
            mapping[name] = {"cpu": {kernels.Mode.INFERENCE: LocalRepository(name, layer)}}
    return mapping


@pytest.mark.parametrize("model_type", ["nemotron_h", "qwen3_5_text", "kimi_linear"])
def test_kernelized_recurrence_functions_leave_replay_exact(model_type):
    """transformers 5.25 kernelizes by default: on CUDA, fla's and mamba_ssm's hub kernels take the place of the
    recurrence functions ReplayCache intercepts. Inside a replay call the replay runs instead of them (decode) or
    calls them for the prefill; decoding equals stock decoding through the same kernels."""
    model = get_model(model_type).eval()
    if not any(getattr(mixer, "_kernel_funcs", None) for mixer, _ in find_mixers(model).values()):
        pytest.skip("this transformers version's mixers attach no kernel functions")
    calls = collections.Counter()
    mapping = _function_kernels(model, calls)
    assert STATE_STEP_KERNELS & set(mapping), sorted(mapping)
    prompt = torch.randint(3, 120, (2, 9))
    try:
        _kernelize(model, mapping)
        stock = model.generate(prompt, **GREEDY_KW)
        stock_calls = dict(calls)
        calls.clear()
        cache = ReplayCache(buffer_len=4)
        ours = model.generate(prompt, **{cache_kwarg(model): cache}, **GREEDY_KW)
    finally:
        _kernelize(model, {})  # back to the model's own functions (the model is shared between tests)
    # the stand-ins ran: stock decoding stepped its state through the kernelized function every token
    assert sum(stock_calls.get(name, 0) for name in STATE_STEP_KERNELS) >= GREEDY_KW["max_new_tokens"], stock_calls
    assert not any(calls.get(name) for name in STATE_STEP_KERNELS), dict(calls)  # replayed, never stepped
    assert torch.equal(ours.sequences, stock.sequences)
    assert max_logit_diff(ours.logits, stock.logits) < 1e-4
    assert cache.get_seq_length() == ours.sequences.shape[1] - 1


def test_a_mixer_forward_replaced_by_a_hub_layer_is_refused_until_reset():
    """transformers 5.25 maps Qwen3.5's whole Gated DeltaNet layer to a hub layer on some GPUs (GB10, Strix Halo):
    its forward never reaches the replay path, so binding refuses it with what to do; after ``reset_kernels`` (or
    kernelizing without that layer) the model decodes exactly."""
    model = get_model("qwen3_5_text").eval()
    mixer_cls = type(next(iter(find_mixers(model).values()))[0])
    layer_name = getattr(mixer_cls, "kernel_layer_name", None)
    if layer_name is None:
        pytest.skip("this transformers version's Gated DeltaNet cannot be kernelized")
    ReplayCache().bind(model)  # installs the patched class forward, which the hub layer's forward must bypass
    stock_forward = getattr(mixer_cls.forward, "_replayssm_original", mixer_cls.forward)
    hub_layer = _layer("HubGatedDeltaNet", lambda self, *args, **kwargs: stock_forward(self, *args, **kwargs),
                       inspect.signature(stock_forward))
    prompt = torch.randint(3, 120, (2, 9))
    stock = model.generate(prompt, **GREEDY_KW)
    try:
        _kernelize(model, {layer_name: {"cpu": {kernels.Mode.INFERENCE: LocalRepository("gdn", hub_layer)}}})
        with pytest.raises(ValueError, match=r"hub kernel layer in place of its own forward.*reset_kernels"):
            model.generate(prompt, **{cache_kwarg(model): ReplayCache()}, **GREEDY_KW)
        # a cache bound before the model was kernelized: the write outside the replay path is refused
        late = get_model("qwen3_5_text", seed=3).eval()
        bound_early = ReplayCache.for_model(late)
        _kernelize(late, {layer_name: {"cpu": {kernels.Mode.INFERENCE: LocalRepository("gdn", hub_layer)}}})
        with pytest.raises(RuntimeError, match=r"outside the ReplaySSM path.*reset_kernels"):
            late.generate(prompt, **{cache_kwarg(late): bound_early}, **GREEDY_KW)
    finally:
        _kernelize(model, {})
        _kernelize(get_model("qwen3_5_text", seed=3), {})
    assert "forward" not in vars(model.model.layers[0].linear_attn)
    ours = model.generate(prompt, **{cache_kwarg(model): ReplayCache()}, **GREEDY_KW)
    assert torch.equal(ours.sequences, stock.sequences)
    assert max_logit_diff(ours.logits, stock.logits) < 1e-4
