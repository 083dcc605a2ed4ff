"""A device-phase step's flush launch on a grid sized to the GPU rather than to the batch.

With positions on the device, a split replay-or-flush step launches its flushes first. On a grid of one program per
tile of every row, the programs of rows that are not due only read their count and exit: at batch 256 with one row
in 16 due, Mamba-2's such launch took 132 us of an H200 for about 36 us worth of bytes (run 101, Nsight Compute). On
a device-sized grid every program reads all counts, numbers the rows due (:func:`due_rows`), and walks the (due row,
head, tile) items with a stride of the grid (:func:`due_item` maps an item's ordinal to them), so the launch costs
what the due rows cost. The family kernels (``kernels/mamba2.py``, ``kernels/delta_rule.py``) fold each item as the
batch-grid program of that tile would.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

# programs per SM (sm_90: the family kernels compile to 128-145 registers on 2 warps, 7-8 programs fit)
PROGRAMS_PER_SM = 8
# every program holds every row's count and rank (sm_90, Mamba-2: 143 registers at 256 rows, 145 at 512, 168 and a
# spill at 1024): past this many rows the batch-sized grid serves
MAX_BATCH = 512


def use_device_grid(flush_grid: str, batch: int) -> bool:
    """Whether a split step's ``_flush_grid`` asks for the device-sized grid and ``batch`` fits it (past
    :data:`MAX_BATCH` rows the batch-sized grid serves); a name other than ``"batch"`` / ``"device"`` is refused."""
    if flush_grid not in ("batch", "device"):
        raise ValueError(f"_flush_grid must be 'batch' or 'device', got {flush_grid!r}")
    return flush_grid == "device" and batch <= MAX_BATCH


def flush_grid_programs(device: torch.device, items: int, programs_per_sm: int | None = None) -> int:
    """Programs of a device-grid flush launch: ``programs_per_sm`` (:data:`PROGRAMS_PER_SM` when not given) per
    multiprocessor (4 in all on a CPU, so that the interpreter walks several items per program), at most one per item
    of a step where every row flushes."""
    per_sm = PROGRAMS_PER_SM if programs_per_sm is None else int(programs_per_sm)
    if per_sm < 1:
        raise ValueError(f"programs_per_sm must be at least 1, got {programs_per_sm}")
    if device.type != "cuda":
        return max(1, min(items, 4))
    return max(1, min(items, per_sm * _multiprocessors(device.index)))


@functools.cache
def _multiprocessors(index: int | None) -> int:
    return torch.cuda.get_device_properties(torch.cuda.current_device() if index is None else index
                                            ).multi_processor_count


@triton.jit
def due_rows(count_ptr, stride_count, batch, BUFFER_LEN: tl.constexpr, BLOCK_B: tl.constexpr):
    """Every row's due flag (int32 [BLOCK_B]: count + 1 reaches the buffer length; the low 16 bits of count, as the
    step kernels read it), its rank among the due rows (the k-th due row has rank k + 1) and how many are due."""
    offs_b = tl.arange(0, BLOCK_B)
    in_batch = offs_b < batch
    counts = tl.load(count_ptr + offs_b * stride_count, mask=in_batch, other=0) & 0xFFFF
    due = (in_batch & (counts + 1 >= BUFFER_LEN)).to(tl.int32)
    return due, tl.cumsum(due, axis=0), tl.sum(due, axis=0)


@triton.jit
def replaying_rows(count_ptr, stride_count, batch, BUFFER_LEN: tl.constexpr, BLOCK_B: tl.constexpr):
    """:func:`due_rows`' complement: every row's replay flag (int32 [BLOCK_B]: in the batch and not due), its rank
    among the replaying rows and how many replay, for a replay launch that walks only their items."""
    due, _, _ = due_rows(count_ptr, stride_count, batch, BUFFER_LEN, BLOCK_B)
    replaying = ((tl.arange(0, BLOCK_B) < batch) & (due == 0)).to(tl.int32)
    return replaying, tl.cumsum(replaying, axis=0), tl.sum(replaying, axis=0)


@triton.jit
def walk_item(item, heads, tiles):
    """Item ``item`` of every row's (row, head, tile) items, tiles fastest: (tile, head, batch row as int64); the
    order of a batch-sized grid's programs, for launches whose programs walk the items with a stride of the grid."""
    row = tl.full([], 0, tl.int64) + item // (tiles * heads)  # (a Python int in the interpreter has no .to)
    return item % tiles, (item // tiles) % heads, row


@triton.jit
def walk_positions(origin_ptr, count_ptr, row, stride_origin, stride_count, origin_host, count_host, extent,
                   BUFFER_LEN: tl.constexpr, DEVICE_POSITIONS: tl.constexpr):
    """A walking replay program's positions for one item of batch ``row``: (origin, count, run, limit). Host
    positions: ``origin_host`` / ``count_host``, ``run`` true, ``limit`` the tile dimension's ``extent``. With
    ``DEVICE_POSITIONS`` (a split step's replay launch, the counts advanced by a launch of their own): the row's
    origin and count (low 16 bits) read on the device; a row due to flush, which the step's flush launch serves, gets
    ``run`` false, count 0 (no records read) and ``limit`` 0 (its offsets masked off: limits on the offsets, since
    the interpreter takes no tensor & scalar masks)."""
    if DEVICE_POSITIONS:
        origin = tl.load(origin_ptr + row * stride_origin)
        count = tl.load(count_ptr + row * stride_count) & 0xFFFF
        run = count + 1 < BUFFER_LEN
        count = tl.where(run, count, 0)
        limit = tl.where(run, extent, 0)
    else:
        origin = origin_host
        count = count_host
        run = True
        limit = extent
    return origin, count, run, limit


@triton.jit
def due_item(due, rank, item, heads, tiles, BLOCK_B: tl.constexpr):
    """Item ``item`` of the due rows' (row, head, tile) items, tiles fastest: (batch row as int64, head, tile)."""
    items_per_row = tiles * heads
    k = item // items_per_row  # the k-th due row (from 0) has rank k + 1
    row = tl.sum(tl.where((due > 0) & (rank == k + 1), tl.arange(0, BLOCK_B), 0), axis=0).to(tl.int64)
    return row, (item % items_per_row) // tiles, item % tiles
