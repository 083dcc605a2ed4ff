"""The replay schedule (``ReplaySchedule``, no transformers) on synthetic inputs: speculation with rollbacks stores
the same checkpoints, bit for bit, as plain decoding, under every precision policy."""

import pytest
import torch

from hf_replayssm.precision import PRESETS
from hf_replayssm.recurrences import DeltaRuleRecurrence, Mamba2Recurrence
from hf_replayssm.schedule import ReplaySchedule

HEADS, HEAD_DIM, STATE, GROUPS = 4, 8, 32, 2


def mamba2_tokens(generator, count):
    return {
        "x": torch.randn(1, count, HEADS, HEAD_DIM, generator=generator),
        "dt": torch.rand(1, count, HEADS, generator=generator) * 0.5 + 0.05,
        "B": torch.randn(1, count, GROUPS, STATE, generator=generator),
        "C": torch.randn(1, count, GROUPS, STATE, generator=generator),
        "A": -torch.linspace(0.01, 0.3, HEADS),
        "D": torch.ones(HEADS),
    }


def delta_tokens(generator, count):
    k = torch.nn.functional.normalize(torch.randn(1, count, HEADS, STATE, generator=generator), dim=-1)
    q = torch.nn.functional.normalize(torch.randn(1, count, HEADS, STATE, generator=generator), dim=-1)
    return {
        "q": q, "k": k, "v": torch.randn(1, count, HEADS, STATE, generator=generator),
        "beta": torch.rand(1, count, HEADS, generator=generator),
        "g": -torch.rand(1, count, HEADS, generator=generator) * 0.05,
        "normalize": None, "value_heads": HEADS,
    }


def _cat(a, b, per_token):
    return {name: torch.cat([a[name], b[name]], dim=1) if name in per_token else a[name] for name in a}


def _feed(layer, tokens, rec):
    out = layer.forward_tokens(tokens)
    layer.finish_forward(tokens[rec.per_token[0]].shape[1])
    return out


@pytest.mark.parametrize("precision", list(PRESETS))
@pytest.mark.parametrize("family", ["mamba2", "delta_rule"])
def test_speculation_stores_the_checkpoints_of_plain_decoding(family, precision):
    rec_cls, make = (Mamba2Recurrence, mamba2_tokens) if family == "mamba2" else (DeltaRuleRecurrence, delta_tokens)
    if family == "delta_rule" and PRESETS[precision].mode == "shared" and precision != "fp32":
        # shared low-precision delta-rule checkpoints fold corrected values computed with the batch shape of the
        # forward (a window vs one step), so their last bits differ before rounding; see test_speculative.py
        pytest.skip("shared low-precision delta rule: covered with a tolerance at the model level")
    # Mamba-2 records do not depend on the state, and separated delta-rule flushes recompute the corrected values
    # from raw inputs: the stored checkpoints are then bit-identical. A float32 delta-rule checkpoint folds the
    # corrected values as computed (window vs single step), equal to float32 rounding.
    bitwise = family == "mamba2" or PRESETS[precision].mode == "separated"
    generator = torch.Generator().manual_seed(0)
    prompt_len, length = 5, 4
    rounds = [(5, 2), (3, 0), (6, 5), (4, 1), (2, 1), (6, 3), (5, 4), (4, 2), (6, 0), (1, 0)]  # (window, rejected)
    accepted = make(generator, prompt_len + sum(w - r for w, r in rounds))
    rec = rec_cls()
    per_token = rec.per_token

    plain = ReplaySchedule(rec, length, 8, PRESETS[precision])
    spec = ReplaySchedule(rec, length, 8, PRESETS[precision])
    spec.activate_recording()
    spec.prompt_tokens = prompt_len

    plain_out = [_feed(plain, rec.slice(accepted, 0, prompt_len), rec)]
    checkpoints = {plain.checkpoint_position: _encodings(plain)}
    for pos in range(prompt_len, accepted[per_token[0]].shape[1]):
        plain_out.append(_feed(plain, rec.slice(accepted, pos, pos + 1), rec))
        checkpoints.setdefault(plain.checkpoint_position, _encodings(plain))
    plain_out = torch.cat(plain_out, dim=1)

    start, spec_out, pending = 0, {}, prompt_len
    for window, reject in rounds:
        keep = rec.slice(accepted, start, start + pending + window - reject)
        drop = make(generator, reject)  # drafts that get rejected: random, never seen by the plain run
        out = _feed(spec, _cat(keep, drop, per_token) if reject else keep, rec)
        for i in range(pending + window - reject):
            spec_out[start + i] = out[:, i]
        spec.crop(reject)
        start += pending + window - reject
        pending = 0
        for got, want in zip(_encodings(spec), checkpoints[spec.checkpoint_position], strict=True):
            if bitwise:
                assert torch.equal(got, want)
            else:
                torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
    # every boundary up to the last stored checkpoint was flushed once, as in plain decoding
    assert spec.counters["flushes"] == (spec.checkpoint_position - prompt_len) // length >= 5
    for pos, out in spec_out.items():
        if pos >= prompt_len:  # (the prompt went through the prefill path in both)
            torch.testing.assert_close(out, plain_out[:, pos], atol=2e-5, rtol=1e-5)


def _encodings(layer):
    return [t.clone() for slot in layer.store.slots for enc in (slot.checkpoint, slot.read_copy or {})
            for t in enc.values()]
