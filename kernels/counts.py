"""The count update of a device-phase decode step as its own launch.

A replay-or-flush step whose positions live on the device (compiled decoding) has every program of a batch row read
``count[b]`` to learn the row's phase, so no program may change it until all have read it. Instead of count tickets
(each program takes one with an atomic, the last writes the new count), the step's kernels read ``count`` plainly and
this launch, stream-ordered after them, advances it: one program per 1024 rows, a few microseconds inside a CUDA
graph (H200, GDN at batch 256: 16 us per step less than the tickets).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hf_replayssm.kernels.host_math import cdiv

BLOCK_ROWS = 1024


@triton.jit
def _advance_counts_kernel(count_ptr, stride_count, batch, BUFFER_LEN: tl.constexpr, BLOCK_B: tl.constexpr):
    offs = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    mask = offs < batch
    count = tl.load(count_ptr + offs * stride_count, mask=mask, other=0)
    tl.store(count_ptr + offs * stride_count, tl.where(count + 1 >= BUFFER_LEN, 0, count + 1), mask=mask)


def advance_counts(count: torch.Tensor, buffer_len: int) -> None:
    """count [B] int32, in place: ``count[b] + 1``, or 0 where the step flushed (``count[b] + 1 >= buffer_len``)."""
    batch = count.shape[0]
    _advance_counts_kernel[(cdiv(batch, BLOCK_ROWS),)](count, count.stride(0), batch, BUFFER_LEN=buffer_len,
                                                              BLOCK_B=BLOCK_ROWS)
