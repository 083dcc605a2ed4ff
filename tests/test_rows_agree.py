"""The large-batch agreement check of the GPU model tests (``conftest.assert_rows_agree``) on made-up logits: it
passes a few drifting rows, and fails a shift of every row, one garbage row, a NaN, and any excess at small batches."""

import pytest
import torch
from conftest import assert_rows_agree, row_logit_diffs


def _logits(rows=256, steps=3, vocab=40):
    a = [torch.randn(rows, vocab) for _ in range(steps)]
    return a, [x.clone() for x in a]


def test_few_drifting_rows_pass():
    a, b = _logits()
    b[1][:10] += 0.01  # 10 of 256 rows past 2e-3
    b[2] += 1e-6 * torch.randn_like(b[2])  # float32 rounding everywhere
    assert_rows_agree(a, b, 2e-3)


@pytest.mark.parametrize("damage", ["every row", "many rows", "one garbage row", "nan"])
def test_damage_fails(damage):
    a, b = _logits()
    if damage == "every row":
        b[0] += 5e-4  # under the tolerance, but the typical row no longer agrees to float32 rounding
    elif damage == "many rows":
        b[2][:40] += 0.01  # 16 % of the rows past the tolerance
    elif damage == "one garbage row":
        b[1][7] += 3.0
    else:
        b[0][3, 5] = float("nan")
    with pytest.raises(AssertionError):
        assert_rows_agree(a, b, 2e-3)


def test_small_batch_is_strict_and_infinities_agree():
    a, b = _logits(rows=2)
    a[0][0, 0] = b[0][0, 0] = float("-inf")  # equal entries, -inf included, give 0
    assert row_logit_diffs(a, b).max().item() == 0.0
    assert_rows_agree(a, b, 2e-3)
    b[2][1, 3] += 3e-3
    with pytest.raises(AssertionError):
        assert_rows_agree(a, b, 2e-3)
