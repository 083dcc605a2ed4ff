"""``ops.short_conv.causal_conv_tail`` (the compiled decode step's conv) against transformers' ``causal_conv1d_fn``
(``F.conv1d``, what eager decoding runs), on fresh random inputs."""

from __future__ import annotations

import pytest
import torch

from hf_replayssm.ops.short_conv import causal_conv_tail


def reference(x, weight, bias, activation, tokens):
    from transformers.models.qwen3_5.modeling_qwen3_5 import causal_conv1d_fn

    return causal_conv1d_fn(x, weight, bias, activation=activation)[..., -tokens:]


@pytest.mark.parametrize("activation", [None, "silu"])
@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("tokens", [1, 3])
def test_matches_conv1d_float32(activation, with_bias, tokens):
    gen = torch.Generator().manual_seed(tokens * 4 + with_bias * 2 + (activation is None))
    batch, channels, taps = 3, 40, 4
    x = torch.randn(batch, channels, taps - 1 + tokens + 2, generator=gen)  # longer than needed: only the tail counts
    weight = torch.randn(channels, taps, generator=gen)
    bias = torch.randn(channels, generator=gen) if with_bias else None
    got = causal_conv_tail(x, weight, bias, activation, tokens)
    want = reference(x, weight, bias, activation, tokens)
    assert got.shape == want.shape == (batch, channels, tokens) and got.dtype == want.dtype
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_bfloat16_within_one_rounding():
    """bf16 inputs: float32 products and sums rounded once, as F.conv1d: at most one bf16 ulp apart."""
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(2, 64, 5, generator=gen).bfloat16()
    weight = torch.randn(64, 4, generator=gen).bfloat16()
    bias = torch.randn(64, generator=gen).bfloat16()
    got = causal_conv_tail(x, weight, bias, "silu", 2)
    want = reference(x, weight, bias, "silu", 2)
    assert got.dtype == torch.bfloat16
    ulp = want.float().abs().clamp_min(2**-10) * 2**-7
    assert ((got.float() - want.float()).abs() <= ulp).all()


def test_refuses_short_window_and_unknown_activation():
    x, weight = torch.randn(1, 4, 3), torch.randn(4, 4)
    with pytest.raises(ValueError, match="4 needed"):
        causal_conv_tail(x, weight, None, None, 1)
    with pytest.raises(ValueError, match="not supported"):
        causal_conv_tail(torch.randn(1, 4, 4), weight, None, "gelu", 1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tokens", [1, 3])
def test_window_conv_matches_the_stock_decode_update(dtype, tokens):
    """``causal_conv_window`` (eager decoding, no causal_conv1d package) gives transformers' torch
    ``causal_conv1d_update`` bit for bit (the stock decode conv), and the padded ``causal_conv1d_fn`` tail too."""
    from transformers.models.qwen3_5.modeling_qwen3_5 import causal_conv1d_update

    from hf_replayssm.ops.short_conv import causal_conv_window

    gen = torch.Generator().manual_seed(11 + tokens)
    batch, channels, taps = 3, 40, 4
    state = torch.randn(batch, channels, taps, generator=gen).to(dtype)  # transformers keeps K positions
    new = torch.randn(batch, channels, tokens, generator=gen).to(dtype)
    weight = torch.randn(channels, taps, generator=gen).to(dtype)
    bias = torch.randn(channels, generator=gen).to(dtype)
    window = torch.cat([state, new], dim=-1)
    got = causal_conv_window(window, weight, bias, "silu", tokens)
    want = causal_conv1d_update(new, state.clone(), weight, bias, activation="silu")
    assert got.shape == want.shape == (batch, channels, tokens) and got.dtype == dtype
    assert torch.isfinite(got).all() and torch.equal(got, want)
    torch.testing.assert_close(got, reference(window, weight, bias, "silu", tokens), rtol=1e-2 if dtype != torch.float32
                               else 1e-6, atol=1e-2 if dtype != torch.float32 else 1e-6)
    with pytest.raises(ValueError, match="needed"):
        causal_conv_window(window[..., : taps - 2 + tokens], weight, bias, None, tokens)


@pytest.mark.parametrize("model_type", ["qwen3_5_text", "nemotron_h", "kimi_linear", "mamba2"])
def test_eager_decode_convolves_only_the_new_position(model_type, monkeypatch):
    """An eager ReplayCache decode step convolves its window unpadded, as the stock decode update does
    (transformers' padded ``causal_conv1d_fn`` over the [conv ring, new] window computed every position of it: 5x
    the work on an H200), and decodes what stock decoding does."""
    import torch.nn.functional as F
    from conftest import cache_kwarg, decode, get_model
    from transformers import DynamicCache

    from hf_replayssm import ReplayCache
    from hf_replayssm.adapters import base

    if base._HAS_CAUSAL_CONV1D:
        pytest.skip("the causal_conv1d package's kernels convolve here")
    model = get_model(model_type)
    tokens = torch.randint(3, 120, (2, 12), generator=torch.Generator().manual_seed(3))
    original, calls = F.conv1d, []

    def spy(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
        out = original(x, weight, bias, stride, padding, dilation, groups)
        calls.append((padding, out.shape[-1], groups > 1))
        return out

    key = cache_kwarg(model)
    with torch.no_grad():
        cache = ReplayCache(buffer_len=4)
        model(tokens[:, :6], **{key: cache}, use_cache=True)  # prefill, not spied
        monkeypatch.setattr(F, "conv1d", spy)
        replay = [model(tokens[:, pos : pos + 1], **{key: cache}, use_cache=True).logits for pos in range(6, 12)]
        monkeypatch.undo()
    depthwise = [call for call in calls if call[2]]
    assert depthwise, "no depthwise conv ran in the decode steps"
    # the [K history, new] window gives 2 outputs unpadded, as transformers' update does (padded: K + 1 + ...)
    assert all(padding == 0 and width <= 2 for padding, width, _ in depthwise), depthwise
    stock = decode(model, tokens, 6, DynamicCache(config=model.config))
    got = torch.cat([logits[:, -1:] for logits in replay], dim=1)
    assert torch.isfinite(stock).all()
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, stock[:, 1:], rtol=1e-4, atol=1e-4)
