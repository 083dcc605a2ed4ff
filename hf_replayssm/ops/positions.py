"""Ring positions of the decode-step references: per-row int32 tensors (decided and advanced per row, like the fused
kernels do on the device) or host ints (every row at the same position; the caller advances its own count)."""

from __future__ import annotations

import torch


def row_position(position: torch.Tensor | int, row: int) -> int:
    return int(position[row]) if isinstance(position, torch.Tensor) else int(position)


def set_row_count(count: torch.Tensor | int, row: int, value: int) -> None:
    if isinstance(count, torch.Tensor):
        count[row] = value


def host_phase(origin: torch.Tensor | int, count: torch.Tensor | int, buffer_len: int) -> int:
    """Which decode-step kernel a launch needs: 0 when the positions are per-row device tensors (phase decided per
    row on the device); 1 (every row replays) or 2 (every row flushes) when they are host ints."""
    if isinstance(origin, torch.Tensor) or isinstance(count, torch.Tensor):
        if not (isinstance(origin, torch.Tensor) and isinstance(count, torch.Tensor)):
            raise TypeError("origin and count must both be tensors or both be ints")
        return 0
    if not (0 <= count < buffer_len and origin >= 0):
        raise ValueError(f"positions out of range: origin {origin}, count {count}, buffer_len {buffer_len}")
    return 2 if count + 1 >= buffer_len else 1


def ring_slots(origin: int, count: int, ring_size: int, device: torch.device) -> torch.Tensor:
    """Slots ``(origin + j) % ring_size`` of ``count`` records from host position ``origin`` (every row alike);
    ValueError for a position outside the ring."""
    if not (0 <= origin < ring_size and 0 <= count <= ring_size):
        raise ValueError(f"origin {origin} / count {count} outside a ring of {ring_size}")
    return (origin + torch.arange(count, device=device)) % ring_size


def into(out: torch.Tensor | None, value: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``value`` written into ``out``, or as a new tensor of ``like``'s dtype when ``out`` is None."""
    return value.to(like.dtype) if out is None else out.copy_(value)
