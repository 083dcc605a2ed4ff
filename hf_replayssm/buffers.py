"""Preallocated ring buffers with static shapes (pure torch, no transformers import).

``RecordRing`` holds the per-token records of one SSM layer: committed records (part of the sequence, waiting
for the next flush) followed by pending ones (speculative drafts that a ``crop`` may still drop). Records live in
a circular buffer, so folding the oldest records into the checkpoint and dropping the newest are both pointer
moves. ``ConvRing`` keeps the last inputs of the short causal convolution the same way, so the conv window can
be rewound together with the records.

Positions are host integers shared by the batch rows: this is the pure-torch reference schedule. The Triton
kernels keep per-row positions on the device.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch


def shared_index(memo: dict | None, key: tuple, build) -> torch.Tensor:
    """``build()``, or the tensor it gave for ``key`` earlier in ``memo``. Every SSM layer of a cache has the same ring
    and conv geometry, so one per-row rollback builds each mask or index once for all of them (``memo`` lives for
    one call), not once per layer."""
    if memo is None:
        return build()
    if key not in memo:
        memo[key] = build()
    return memo[key]


def device_counts(counts: list[int], device: torch.device, memo: dict | None = None) -> torch.Tensor:
    """Per-row counts [B] as int64 on ``device``, one host-to-device copy per rollback (shared through ``memo``). On
    CUDA through pinned memory and a non-blocking copy: a copy from pageable memory would make the host wait for the
    device to drain its queue. The caching host allocator keeps the pinned block until the copy has run."""
    def build() -> torch.Tensor:
        host = torch.from_numpy(np.asarray(counts, dtype=np.int64))
        return host.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else host.to(device)

    return shared_index(memo, ("counts", device), build)


def fill_masked_records(field: torch.Tensor, mask: torch.Tensor, value: float, layers: bool = False) -> None:
    """Set the records of ``field`` [B, R, *feature] (``layers``: [L, B, R, *feature], several layers' rings packed
    into one tensor) where ``mask`` [B, R] is True to ``value``: one masked fill for the whole batch."""
    lead = int(layers)
    field.masked_fill_(mask.view(*(1,) * lead, *mask.shape, *(1,) * (field.dim() - lead - 2)), value)


def move_conv_windows(buffer: torch.Tensor, source: torch.Tensor, end: int, kernel: int) -> None:
    """Columns ``end - kernel .. end - 1`` of every row of ``buffer`` [..., B, C, columns] (leading dims: several
    layers' conv windows packed into one tensor) become its columns ``source[row]`` ([B, kernel]): one gather and one
    slice copy for the whole batch (a row whose source is its window copies it onto itself)."""
    lead = buffer.dim() - 3
    index = source.view(*(1,) * lead, source.shape[0], 1, kernel).expand(*buffer.shape[:-1], kernel)
    buffer[..., end - kernel : end].copy_(torch.gather(buffer, -1, index))


class RecordRing:
    """Circular buffer of ``capacity`` records per batch row; one tensor per record field."""

    def __init__(self, capacity: int):
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.fields: dict[str, torch.Tensor] = {}
        self.origin = 0  # slot of the oldest record
        self.num_committed = 0
        self.num_pending = 0

    @property
    def allocated(self) -> bool:
        return len(self.fields) > 0  # not bool(dict): see CheckpointStore.allocated

    @property
    def size(self) -> int:
        return self.num_committed + self.num_pending

    def allocate(self, like: Mapping[str, torch.Tensor]) -> None:
        """Allocate storage shaped after example records ``like[name]`` of shape [B, T, *feature]."""
        for name, example in like.items():
            shape = (example.shape[0], self.capacity, *example.shape[2:])
            self.fields[name] = torch.zeros(shape, dtype=example.dtype, device=example.device)

    def _slots(self, start: int, count: int, device: torch.device) -> torch.Tensor:
        return (self.origin + start + torch.arange(count, device=device)) % self.capacity

    def read(self, start: int = 0, count: int | None = None) -> dict[str, torch.Tensor]:
        """Records ``start .. start+count`` (0 = oldest) in sequence order, each [B, count, *feature]."""
        count = self.size - start if count is None else count
        if not self.allocated:
            return {}
        device = next(iter(self.fields.values())).device
        if count == 0:
            return {name: buf[:, :0] for name, buf in self.fields.items()}
        first = (self.origin + start) % self.capacity
        if first + count <= self.capacity:  # contiguous: a view, no copy
            return {name: buf[:, first : first + count] for name, buf in self.fields.items()}
        slots = self._slots(start, count, device)
        return {name: buf.index_select(1, slots) for name, buf in self.fields.items()}

    def append(self, records: Mapping[str, torch.Tensor], pending: bool) -> None:
        count, first = next(iter(records.values())).shape[1], self.size
        self.extend(count, pending)
        if count:
            slots = self._slots(first, count, next(iter(self.fields.values())).device)
            for name, buf in self.fields.items():  # records may carry fields this ring does not keep
                buf.index_copy_(1, slots, records[name].to(buf.dtype))

    def extend(self, count: int, pending: bool) -> None:
        """Count ``count`` records as appended after the newest (``append`` writes them; a verify kernel writes them
        into the same slots itself)."""
        if self.size + count > self.capacity:
            raise RuntimeError(f"ring overflow: {self.size} + {count} > capacity {self.capacity}")
        if pending:
            self.num_pending += count
        else:
            self.num_committed += count

    def overwrite_newest(self, counts: list[int], values: Mapping[str, float], memo: dict | None = None) -> None:
        """Set the fields named in ``values`` of row r's newest ``counts[r]`` records to those values (fields this
        ring does not keep are skipped). ``memo`` (one dict per rollback, shared by the layers): reuse the mask
        another ring of the same geometry built for the same ``counts`` (a ``PackedRollback`` writes every layer's
        rings at once with the same mask)."""
        most, size = max(counts, default=0), self.size
        if most > size:
            raise RuntimeError(f"cannot overwrite {most} records, only {size} buffered")
        if not most:
            return
        # One masked fill per field for the whole batch, the mask built on the device from the per-row counts: no
        # per-row work on the host and no index tensors built there (an indexed write per field with host-built
        # (row, slot) indices cost most of a rollback)
        mask = self.newest_mask(counts, memo)
        for name, value in values.items():
            if name in self.fields:
                fill_masked_records(self.fields[name], mask, value)

    def newest_mask(self, counts: list[int], memo: dict | None = None) -> torch.Tensor:
        """[B, capacity] bool on the fields' device: whether slot s holds one of row r's newest ``counts[r]``
        records. Shared through ``memo`` by every ring of the same geometry."""
        device = next(iter(self.fields.values())).device
        end = self.origin + self.size

        def build() -> torch.Tensor:
            age = (end - 1 - torch.arange(self.capacity, device=device)) % self.capacity  # 0 = the newest record
            return age.unsqueeze(0) < device_counts(counts, device, memo).unsqueeze(1)

        return shared_index(memo, ("ring", end % self.capacity, self.capacity, device), build)

    def commit(self) -> None:
        """Pending records become part of the sequence."""
        self.num_committed += self.num_pending
        self.num_pending = 0

    def drop_newest(self, count: int) -> None:
        """Forget the newest ``count`` records (pending first, then committed): a rollback."""
        if count > self.size:
            raise RuntimeError(f"cannot drop {count} records, only {self.size} buffered")
        from_pending = min(count, self.num_pending)
        self.num_pending -= from_pending
        self.num_committed -= count - from_pending

    def drop_oldest(self, count: int) -> None:
        """Forget the oldest ``count`` records (after they were folded into the checkpoint)."""
        if count > self.size:
            raise RuntimeError(f"cannot drop {count} records, only {self.size} buffered")
        self.origin = (self.origin + count) % self.capacity
        from_committed = min(count, self.num_committed)
        self.num_committed -= from_committed
        self.num_pending -= count - from_committed
        if self.size == 0:
            self.origin = 0

    def clear(self) -> None:
        self.origin = self.num_committed = self.num_pending = 0

    def restart(self) -> None:
        """Empty, keeping the origin slot (what a kernel that flushed on the device leaves)."""
        self.num_committed = self.num_pending = 0

    def grow(self, capacity: int) -> None:
        """Reallocate to a larger capacity, keeping the records (outside the hot path: only when a larger
        speculative window is requested)."""
        if capacity <= self.capacity:
            return
        if self.allocated:
            kept = self.read()
            for name, buf in self.fields.items():
                new = torch.zeros((buf.shape[0], capacity, *buf.shape[2:]), dtype=buf.dtype, device=buf.device)
                new[:, : self.size] = kept[name]
                self.fields[name] = new
        self.capacity = capacity
        self.origin = 0

    def index_batch(self, index: torch.Tensor) -> None:
        """Select / reorder batch rows (beam search, contrastive search)."""
        for name, buf in self.fields.items():
            self.fields[name] = buf.index_select(0, index.to(buf.device))

    def nbytes(self) -> int:
        return sum(buf.numel() * buf.element_size() for buf in self.fields.values())


class ConvRing:
    """The last ``capacity`` inputs of a causal depthwise convolution, indexed by absolute token position.

    ``window(kernel)`` returns the ``kernel`` inputs before the current position (zeros before the sequence
    start), which is what the model's own conv needs in front of the new tokens. Rewinding ``r`` tokens is exact
    while ``r <= capacity - kernel``.

    Storage is linear, not circular, so that a decode step costs two kernel launches (the window is a view; a write
    is one slice copy) instead of an index computation, a gather and a scatter: position ``q`` lives in column
    ``q - base`` of a ``[B, C, 2 * capacity]`` buffer, and when the writes reach its end the last ``capacity``
    columns move to the front (one copy every ``capacity`` tokens). Columns of positions before the start are zeros.
    """

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.buffer: torch.Tensor | None = None  # [B, C, 2 * capacity]
        self.position = 0  # tokens written so far
        self.oldest = 0  # oldest position whose input is still held
        self.base = -capacity  # position held in column 0 (columns of negative positions are zeros)

    def allocate(self, like: torch.Tensor) -> None:
        self.buffer = torch.zeros((like.shape[0], like.shape[1], 2 * self.capacity), dtype=like.dtype,
                                  device=like.device)

    def window(self, kernel: int) -> torch.Tensor:
        """[B, C, kernel]: inputs at positions position-kernel .. position-1 (zeros before the start); a view of the
        buffer, valid until the next write."""
        assert self.buffer is not None
        start = self.position - kernel - self.base
        assert start >= 0, "conv window reaches before the held inputs"
        return self.buffer[..., start : start + kernel]

    def _shift(self) -> None:
        """Move the last ``capacity`` positions (zeros before the start) to the front."""
        new_base = self.position - self.capacity
        offset = new_base - self.base
        if offset > 0:
            self.buffer[..., : self.capacity] = self.buffer[..., offset : offset + self.capacity].clone()
            self.base = new_base

    def write(self, inputs: torch.Tensor) -> None:
        """Append inputs [B, C, T] (only the last ``capacity`` columns are kept)."""
        assert self.buffer is not None
        count = inputs.shape[-1]
        if count >= self.capacity:  # only the last `capacity` inputs survive: start a fresh layout
            self.base = self.position + count - self.capacity
            self.buffer[..., : self.capacity] = inputs[..., -self.capacity :]
        else:
            if self.position + count - self.base > self.buffer.shape[-1]:
                self._shift()
            col = self.position - self.base
            self.buffer[..., col : col + count] = inputs
        self.position += count
        self.oldest = max(self.oldest, self.position - self.capacity)

    def clear(self) -> None:
        """Forget every input, keeping the storage (zeros before the start, as at allocation)."""
        if self.buffer is not None:
            self.buffer.zero_()
        self.position = self.oldest = 0
        self.base = -self.capacity

    def load_window(self, window: torch.Tensor, position: int) -> None:
        """Hold exactly ``window`` [B, C, K] as the inputs before ``position`` (what a fixed-window conv kept while
        it stepped on its own); older inputs are gone, so nothing before them can be rewound."""
        kernel = window.shape[-1]
        self.buffer.zero_()
        self.base = position - self.capacity
        self.buffer[..., self.capacity - kernel : self.capacity] = window
        self.position = position
        self.oldest = max(0, position - kernel)

    def compact_rows(self, dropped: list[int], kernel: int, memo: dict | None = None) -> None:
        """Per-row rollback without moving the shared position: row r's newest ``dropped[r]`` inputs are forgotten
        by moving its last ``kernel`` kept inputs into the window before the position (batched speculation, where
        rows accept different numbers of drafts and the dropped slots stay behind as neutral tokens). ``memo``: as
        in ``RecordRing.overwrite_newest`` (a ``PackedRollback`` moves every layer's windows at once with the same
        source columns)."""
        assert self.buffer is not None
        if max(dropped) > self.rewindable(kernel):
            raise RuntimeError(f"conv window cannot drop {max(dropped)} inputs of a row "
                               f"(holds {self.position - self.oldest})")
        if any(dropped):  # per-row source columns computed on the device
            move_conv_windows(self.buffer, self.compaction_source(dropped, kernel, memo), self.window_end(), kernel)
        self.keep_window_only(kernel)

    def keep_window_only(self, kernel: int) -> None:
        """After a per-row compaction only the ``kernel`` inputs before the position are every row's own: nothing
        older can be rewound."""
        self.oldest = max(self.oldest, self.position - kernel)

    def window_end(self) -> int:
        """The buffer column after the newest input."""
        return self.position - self.base

    def compaction_source(self, dropped: list[int], kernel: int, memo: dict | None = None) -> torch.Tensor:
        """[B, kernel] int64 on the buffer's device: the columns of row r's ``kernel`` inputs before its dropped
        ones, which ``compact_rows`` moves to the ``kernel`` columns before the position."""
        end, device = self.window_end(), self.buffer.device

        def build() -> torch.Tensor:
            first = end - kernel - device_counts(dropped, device, memo)  # [B]
            return first.unsqueeze(1) + torch.arange(kernel, device=device)

        return shared_index(memo, ("conv", end, kernel, device), build)

    def rewindable(self, kernel: int) -> int:
        """How many tokens ``rewind`` can undo while keeping the ``kernel`` inputs before the new position."""
        return self.position if self.oldest == 0 else max(0, self.position - kernel - self.oldest)

    def rewind(self, count: int, kernel: int) -> None:
        if count > self.rewindable(kernel):
            raise RuntimeError(f"conv window cannot rewind {count} tokens (holds {self.position - self.oldest})")
        self.position -= count

    def grow(self, capacity: int) -> None:
        if capacity <= self.capacity:
            return
        if self.buffer is not None:
            # keep every column from `oldest` (or the zeros before the start) up to the position
            first = max(self.base, self.position - self.capacity)
            held = self.buffer[..., first - self.base : self.position - self.base]
            new = torch.zeros((*self.buffer.shape[:2], 2 * capacity), dtype=self.buffer.dtype,
                              device=self.buffer.device)
            new_base = self.position - capacity
            new[..., first - new_base : self.position - new_base] = held
            self.buffer, self.base = new, new_base
        else:
            self.base = -capacity
        self.capacity = capacity

    def index_batch(self, index: torch.Tensor) -> None:
        if self.buffer is not None:
            self.buffer = self.buffer.index_select(0, index.to(self.buffer.device))

    def nbytes(self) -> int:
        return 0 if self.buffer is None else self.buffer.numel() * self.buffer.element_size()
