"""The pure-torch replay math against the plain sequential recurrence it replaces."""

import pytest
import torch
import torch.nn.functional as F

from hf_replayssm.ops.delta_rule import delta_fold, delta_replay, delta_step_reference
from hf_replayssm.ops.mamba2 import ssd_fold, ssd_replay, ssd_step_reference


def _mamba2_inputs(batch=2, heads=4, head_dim=8, state=6, groups=2, tokens=12):
    return dict(
        S0=torch.randn(batch, heads, head_dim, state),
        x=torch.randn(batch, tokens, heads, head_dim),
        dt=torch.rand(batch, tokens, heads) + 0.05,
        B=torch.randn(batch, tokens, groups, state),
        C=torch.randn(batch, tokens, groups, state),
        A=-torch.rand(heads) * 2 - 0.1,
        D=torch.randn(heads),
    )


@pytest.mark.parametrize("num_hist", [0, 1, 7, 11])
def test_ssd_replay_matches_sequential(num_hist):
    p = _mamba2_inputs()
    y_ref, _ = ssd_step_reference(p["S0"], p["x"], p["dt"], p["B"], p["C"], p["A"], p["D"])
    h = slice(0, num_hist)
    w = slice(num_hist, None)
    y = ssd_replay(p["S0"], p["x"][:, h], p["dt"][:, h], p["B"][:, h], p["x"][:, w], p["dt"][:, w], p["B"][:, w],
                   p["C"][:, w], p["A"], p["D"])
    torch.testing.assert_close(y, y_ref[:, num_hist:], atol=1e-5, rtol=1e-5)


def test_ssd_fold_matches_sequential_state():
    p = _mamba2_inputs()
    _, state_ref = ssd_step_reference(p["S0"], p["x"], p["dt"], p["B"], p["C"], p["A"], p["D"])
    torch.testing.assert_close(ssd_fold(p["S0"], p["x"], p["dt"], p["B"], p["A"]), state_ref, atol=1e-5, rtol=1e-5)
    # folding in two pieces equals folding at once
    half = ssd_fold(p["S0"], p["x"][:, :5], p["dt"][:, :5], p["B"][:, :5], p["A"])
    torch.testing.assert_close(ssd_fold(half, p["x"][:, 5:], p["dt"][:, 5:], p["B"][:, 5:], p["A"]), state_ref,
                               atol=1e-5, rtol=1e-5)


def _delta_inputs(per_channel, batch=2, heads=3, key=5, value=7, tokens=12):
    gate_shape = (batch, tokens, heads, key) if per_channel else (batch, tokens, heads)
    return dict(
        S0=torch.randn(batch, heads, key, value),
        q=F.normalize(torch.randn(batch, tokens, heads, key), dim=-1) / key**0.5,
        k=F.normalize(torch.randn(batch, tokens, heads, key), dim=-1),
        v=torch.randn(batch, tokens, heads, value),
        beta=torch.rand(batch, tokens, heads),
        g=-torch.rand(gate_shape) * 0.5,
    )


@pytest.mark.parametrize("per_channel", [False, True], ids=["gdn", "kda"])
@pytest.mark.parametrize("num_hist", [0, 3, 11])
def test_delta_replay_matches_sequential(per_channel, num_hist):
    p = _delta_inputs(per_channel)
    o_ref, state_ref = delta_step_reference(p["S0"], p["q"], p["k"], p["v"], p["beta"], p["g"])
    h, w = slice(0, num_hist), slice(num_hist, None)
    empty = {n: p[n][:, :0] for n in ("k", "v", "g")}
    _, d_hist = delta_replay(p["S0"], empty["k"], empty["v"], empty["g"], None, p["k"][:, h], p["v"][:, h],
                             p["beta"][:, h], p["g"][:, h])
    o, d_new = delta_replay(p["S0"], p["k"][:, h], d_hist, p["g"][:, h], p["q"][:, w], p["k"][:, w], p["v"][:, w],
                            p["beta"][:, w], p["g"][:, w])
    torch.testing.assert_close(o, o_ref[:, num_hist:], atol=1e-5, rtol=1e-5)
    d = torch.cat([d_hist, d_new], dim=1)
    torch.testing.assert_close(delta_fold(p["S0"], p["k"], d, p["g"]), state_ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("per_channel", [False, True], ids=["gdn", "kda"])
def test_delta_window_prefix_equals_shorter_window(per_channel):
    """The d's of any prefix of a speculative window equal those of the shorter window: rollback is free."""
    p = _delta_inputs(per_channel, tokens=8)
    empty = {n: p[n][:, :0] for n in ("k", "v", "g")}
    args = lambda n: (p["S0"], empty["k"], empty["v"], empty["g"], p["q"][:, :n], p["k"][:, :n], p["v"][:, :n],  # noqa: E731
                      p["beta"][:, :n], p["g"][:, :n])
    o8, d8 = delta_replay(*args(8))
    o3, d3 = delta_replay(*args(3))
    torch.testing.assert_close(d8[:, :3], d3, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(o8[:, :3], o3, atol=1e-6, rtol=1e-6)
