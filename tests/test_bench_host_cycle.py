"""The kernel benches' host-position cycle: L - 1 replay-only launches reading the copy, one flush, and (when asked:
the step as the cache runs it) the flush's outputs from the copy and the copy re-encoded after it on every row, as
``CheckpointStore.refresh_read_copy`` does.
The step and the encoder are recorders here (no Triton): what is checked is the call pattern the timings stand on."""

import pytest
import torch

from hf_replayssm.kernels import bench, bench_delta

L = 4


def _recorders():
    calls = []

    def step(*args, **kwargs):
        calls.append(("step", kwargs.get("read_copy") is not None, kwargs.get("read_format"),
                      kwargs.get("flush_reads_copy", False)))

    def reencode(state, read_copy, read_format, select):
        calls.append(("reencode", read_format, select.dtype, select.tolist(), state.shape[0]))

    return calls, step, reencode


def _inputs(family):
    gen = torch.Generator().manual_seed(0)
    if family == "mamba2":
        inputs = bench.ReplayInputs(3, 2, 4, 16, 1, L, torch.device("cpu"), gen, "in_phase", cuda=False)
    else:
        inputs = bench_delta.ReplayInputs(3, (2, 2, 16, 16), family == "kda", L, torch.device("cpu"), gen,
                                          "in_phase", cuda=False)
    inputs.add_read_copies("fp8")
    return inputs


@pytest.mark.parametrize("family", ["mamba2", "gdn", "kda"])
def test_host_cycle_reencodes_after_the_flush(family):
    inputs = _inputs(family)
    calls, step, reencode = _recorders()
    inputs.host_fn(step, read_format="fp8", reencode=reencode)()
    replays = [("step", True, "fp8", False)] * (L - 1)
    flush = ("step", True, "fp8", True)  # the cache's flush: its outputs from the copy
    assert calls == [*replays, flush, ("reencode", "fp8", torch.bool, [True] * 3, 3)], calls


def test_host_cycle_reencode_in_the_step():
    """Mamba-2's cache has the flush re-encode the copy itself (``reencode_copy``): no separate re-encode call."""
    inputs = _inputs("mamba2")
    flags = []

    def step(*args, **kwargs):
        flags.append((kwargs.get("flush_reads_copy", False), kwargs.get("reencode_copy", False)))

    inputs.host_fn(step, read_format="fp8", reencode="step")()
    assert flags == [(False, False)] * (L - 1) + [(True, True)], flags


@pytest.mark.parametrize("family", ["mamba2", "gdn"])
def test_host_cycle_without_reencode(family):
    inputs = _inputs(family)
    calls, step, _ = _recorders()
    inputs.host_fn(step, read_format="fp8")()
    assert [c[0] for c in calls] == ["step"] * L and calls[-1] == ("step", False, None, False), calls
