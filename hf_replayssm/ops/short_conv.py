"""The short causal depthwise convolution of hybrid mixers at the newest positions of a window, as one elementwise
product and sum (pure tensors).

Decoding convolves each channel's last ``K - 1`` inputs and the new ones with ``K`` taps. transformers' torch path
(and ours, eagerly) calls ``F.conv1d`` with ``groups=channels``, which on CUDA runs a generic depthwise 2-D kernel
(about 65 us per GDN layer and step at batch 64 on an H200, where the useful work is a few microseconds) and which
inductor cannot fuse. Written as ``sum_k x[t + k] w[k]`` over an ``unfold`` view, a compiled decode step fuses it with
its neighbours into one small kernel. Eagerly it would be several launches instead of one, so the adapters use it
only while compiling. Eagerly they use ``causal_conv_window``: the same ``F.conv1d`` as transformers' torch decode
update, unpadded over the ``K + T`` window (the model's ``causal_conv1d_fn`` pads the window by ``K - 1`` and computes
every position of it: about 5x the time, 372 against 77 us per KDA layer and step at batch 256 on an
H200).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

ACTIVATIONS = {None: None, "silu": F.silu, "swish": F.silu}


def supports_activation(activation) -> bool:
    return isinstance(activation, str | None) and activation in ACTIVATIONS


def _taps_checked(x: torch.Tensor, weight: torch.Tensor, activation, tokens: int) -> int:
    """The kernel size K, after refusing an activation not in ACTIVATIONS and a window shorter than K - 1 + tokens."""
    if not supports_activation(activation):
        raise ValueError(f"activation {activation!r} is not supported here; use one of {sorted(map(str, ACTIVATIONS))}")
    taps = weight.shape[-1]
    if x.shape[-1] < taps - 1 + tokens:
        raise ValueError(f"x holds {x.shape[-1]} positions; {taps - 1 + tokens} needed for {tokens} outputs")
    return taps


def _activated(out: torch.Tensor, activation, dtype: torch.dtype) -> torch.Tensor:
    act = ACTIVATIONS[activation]
    return (out if act is None else act(out)).to(dtype)


def causal_conv_tail(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, activation: str | None,
                     tokens: int) -> torch.Tensor:
    """Depthwise causal convolution outputs at the last ``tokens`` positions of ``x``.

    x [B, C, W] with W >= K - 1 + tokens (the conv window followed by the new inputs); weight [C, K] (or [C, 1, K]);
    bias [C] or None; activation None or "silu". Returns [B, C, tokens] in x's dtype: what
    ``causal_conv1d_fn(x, weight, bias, activation)[..., -tokens:]`` gives, with the products and sums in float32
    and one rounding to the weight's dtype before the activation, as ``F.conv1d`` does."""
    w = weight.reshape(weight.shape[0], -1)
    taps = _taps_checked(x, w, activation, tokens)
    windows = x[..., x.shape[-1] - (taps - 1 + tokens) :].unfold(-1, taps, 1)  # [B, C, tokens, K]
    out = (windows.float() * w.float()[:, None, :]).sum(-1)
    if bias is not None:
        out = out + bias.float()[:, None]
    return _activated(out.to(w.dtype), activation, x.dtype)


def causal_conv_window(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, activation: str | None,
                       tokens: int) -> torch.Tensor:
    """Depthwise causal convolution outputs at the last ``tokens`` positions of ``x``, as one unpadded ``F.conv1d``
    over ``x``: transformers' torch ``causal_conv1d_update`` on ``x = [conv state, new inputs]`` (input cast to the
    weight's dtype, activation, cast back), so eager decoding matches the stock torch path bit for bit.

    x [B, C, W] with W >= K - 1 + tokens; weight [C, K] (or [C, 1, K]); bias [C] or None; activation None or
    "silu". Returns [B, C, tokens] in x's dtype."""
    w = weight.reshape(weight.shape[0], 1, -1)
    _taps_checked(x, w, activation, tokens)
    out = F.conv1d(x.to(w.dtype), w, bias, padding=0, groups=w.shape[0])[..., -tokens:]
    return _activated(out, activation, x.dtype)
