"""Device-side positions for the plain decode steps of a static ReplayCache (pure torch: no transformers import).

A compiled decode step (``torch.compile``, CUDA graphs) may not read or change a host integer: Dynamo would
specialise the graph on it and recompile every step. So while a layer of a static cache decodes plainly, its ring
positions live on the device: per-row ``origin`` / ``count`` (int32 [B]) that the fused replay-or-flush kernel
reads and advances, a step counter (int32 [1]), all three views of one tensor (one graph input per layer), and the
conv window as a fixed [B, C, K] tensor shifted in place. The host positions of the schedule then stay as they were
at entry: ``ReplaySchedule.current_tokens_seen`` /
``current_counters`` add the step counter (one device read), and ``leave_device_positions`` writes the positions back
and hands the conv window to the conv ring before any step that needs the host schedule (a prefill, a speculative
window, a crop, batch reordering).

Every tensor is allocated once per batch layout and marked as a static address, so CUDA graphs captured against
them stay valid however often a layer leaves and re-enters device positions.
"""

from __future__ import annotations

import torch


def mark_static(*tensors: torch.Tensor) -> None:
    """Tell ``torch.compile`` these tensors keep their address (CUDA graphs then accept in-place writes to them
    instead of skipping the graph: "mutated inputs")."""
    if not torch.compiler.is_compiling():
        for tensor in tensors:
            torch._dynamo.mark_static_address(tensor)


def _split_positions(positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(origin [B], count [B], steps [1])``, views of one int32 [2B + 1] tensor."""
    batch = positions.shape[0] // 2
    return positions[:batch], positions[batch : 2 * batch], positions[2 * batch :]


class DevicePositions:
    """The device-side positions of one layer (see the module docstring)."""

    # no instance dict: Dynamo guards every method a compiled step calls on an object with one (that the instance
    # does not shadow it), before each CUDA-graph replay
    __slots__ = ("active", "buffer_len", "conv", "count", "entry_committed", "fields", "operands", "origin",
                 "positions", "step_fn", "steps", "token_name")

    def __init__(self):
        self.active = False
        # origin, count and the step counter share one int32 tensor, ``positions`` [2B + 1]: a compiled step slices it
        # inside the graph, so the graph takes (and Dynamo guards, and the runtime bumps the version of) one tensor
        # per layer for the three
        self.positions: torch.Tensor | None = None
        self.origin: torch.Tensor | None = None  # int32 [B] view: ring slot of the oldest record (read only)
        self.count: torch.Tensor | None = None  # int32 [B] view: records in the ring (the kernel advances it)
        self.steps: torch.Tensor | None = None  # int32 [1] view: decode steps since entry
        self.conv: torch.Tensor | None = None  # [B, C, K]: the last K conv inputs, oldest first
        self.entry_committed = 0  # records in the ring when device positions took over (every row alike)
        # What a decode step reads, fixed while the positions are active: the store's kernel operands (checkpoint,
        # read copy, read format) and the ring's record tensors. A compiled step reads them here, one attribute
        # away, instead of through the store's slots and policies (each hop is a Dynamo guard checked before every
        # CUDA-graph replay: the host cost that decides batch 1; benchmarks/offline/guard_check.py).
        self.operands: tuple | None = None
        self.fields: dict | None = None
        # the recurrence's fused replay-or-flush step, the buffer length and the name of a per-token input (its
        # dim 1 counts the tokens of a forward): a compiled step calls them from here too
        self.step_fn = None
        self.buffer_len = 0
        self.token_name = ""

    def _allocate(self, batch: int, device: torch.device, conv_window: torch.Tensor | None) -> None:
        fits = self.count is not None and self.count.shape[0] == batch and self.count.device == device
        conv_fits = (conv_window is None) == (self.conv is None) and (
            conv_window is None or (self.conv.shape == conv_window.shape and self.conv.dtype == conv_window.dtype))
        if fits and conv_fits:
            return
        self.positions = torch.zeros(2 * batch + 1, dtype=torch.int32, device=device)
        self.origin, self.count, self.steps = _split_positions(self.positions)
        self.conv = None if conv_window is None else torch.empty_like(conv_window)
        mark_static(self.positions, *([] if self.conv is None else [self.conv]))

    def enter(self, origin: int, committed: int, batch: int, device: torch.device,
              conv_window: torch.Tensor | None, operands: tuple, fields: dict, step_fn, buffer_len: int,
              token_name: str) -> None:
        """Take over from the host schedule: every row at ring slot ``origin`` with ``committed`` records;
        ``operands`` / ``fields``: the store's kernel operands and the ring's records, which nothing replaces until
        the host schedule takes over again; ``step_fn``: the recurrence's ``device_step``."""
        self._allocate(batch, device, conv_window)
        self.operands, self.fields = operands, fields
        self.step_fn, self.buffer_len, self.token_name = step_fn, buffer_len, token_name
        self.origin.fill_(origin)
        self.count.fill_(committed)
        self.steps.zero_()
        if conv_window is not None:
            self.conv.copy_(conv_window)
        self.entry_committed = committed
        self.active = True

    def steps_taken(self) -> int:
        """Decode steps since entry (reads the device)."""
        return int(self.steps.item())

    def leave(self) -> None:
        self.active = False
        self.operands = self.fields = self.step_fn = None

    def takes(self, tokens) -> bool:
        """Whether a forward of these tokens is a plain decode step on these positions (one token; a schedule on
        device positions never records)."""
        return tokens[self.token_name].shape[1] == 1

    def step(self, tokens, out_dtype: torch.dtype | None) -> torch.Tensor:
        """One plain decode token: the fused replay-or-flush op reads and advances the positions; no host integer
        is read or written (a compiled step may be replayed as a CUDA graph)."""
        state, read_copy, read_format = self.operands
        if torch.compiler.is_compiling():  # views made inside the graph: its one input is the positions tensor
            origin, count, steps = _split_positions(self.positions)
        else:
            origin, count, steps = self.origin, self.count, self.steps
        y = self.step_fn(state, self.fields, origin, count, tokens, self.buffer_len, read_copy=read_copy,
                         read_format=read_format)
        steps.add_(1)
        return y if out_dtype is None else y.to(out_dtype)

    def conv_step(self, inputs: torch.Tensor) -> torch.Tensor:
        """``[window, inputs]`` ([B, C, K + 1]) for the model's own conv; the window moves on by the new input."""
        full = torch.cat([self.conv.to(inputs.dtype), inputs], dim=-1)
        self.conv.copy_(full[..., 1:])
        return full
