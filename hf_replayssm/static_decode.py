"""Device-side positions for the plain decode steps of a static ReplayCache (pure torch: no transformers import).

A compiled decode step (``torch.compile``, CUDA graphs) may not read or change a host integer: Dynamo would
specialise the graph on it and recompile every step. So while a layer of a static cache decodes plainly, its ring
positions live on the device: per-row ``origin`` / ``count`` (int32 [B]) that the fused replay-or-flush kernel
reads and advances, a step counter (int32 [1]), all three views of one tensor, and the conv window as a fixed
[B, C, K] tensor shifted in place. Once every SSM layer is on device positions, a ``DecodePack`` (``decode_pack.py``)
holds these tensors and the checkpoints and rings of all the layers as one tensor per kind, and a compiled plain step
reads its layer's slices from there (six graph inputs for all the layers). The host positions of the schedule then
stay as they were at entry: ``ReplaySchedule.current_tokens_seen`` / ``current_counters`` add the step counter (one
device read), and ``leave_device_positions`` writes the positions back and hands the conv window to the conv ring
before any step that needs the host schedule (a prefill, a speculative window, a crop, batch reordering).

Every tensor is allocated once per batch layout and marked as a static address, so CUDA graphs captured against
them stay valid however often a layer leaves and re-enters device positions.

Speculative verify forwards can run on device positions too (``verifying``: a static cache inside transformers'
assisted loop, which feeds one window and crops after it): the verify op writes the window's records after the
committed ones and leaves ``count`` alone, a ``pending`` counter holds the window's width, and the conv window stays
put while ``conv_hist`` keeps ``[window, inputs]``. The crop after it knows from the host how many tokens to keep
(the length transformers crops to, less the committed tokens), so it commits them on the device
(``commit_windows``: ``count`` advances, the conv window moves along ``conv_hist``, the dropped drafts are counted)
and reads nothing; a crop that completes a period folds it on the host schedule, whose ring positions the host
knows, and points these positions at the ring's new origin (``restart``). Anything that needs the host schedule
otherwise hands the positions back, reading the device once.
"""

from __future__ import annotations

import torch


def mark_static(*tensors: torch.Tensor) -> None:
    """Tell ``torch.compile`` these tensors keep their address (CUDA graphs then accept in-place writes to them
    instead of skipping the graph: "mutated inputs")."""
    if not torch.compiler.is_compiling():
        for tensor in tensors:
            torch._dynamo.mark_static_address(tensor)


# the counters after origin [B] and count [B]: steps, pending, dropped, errors
_COUNTERS = 4


def _split_positions(positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(origin [B], count [B], steps [1], pending [1])``, views of one int32 [2B + 4] tensor (then ``dropped``,
    ``errors``: see ``DevicePositions``)."""
    batch = (positions.shape[0] - _COUNTERS) // 2
    return (positions[:batch], positions[batch : 2 * batch], positions[2 * batch : 2 * batch + 1],
            positions[2 * batch + 1 : 2 * batch + 2])


def plain_step(step_fn, state: torch.Tensor, fields: dict, positions: tuple, tokens, buffer_len: int,
               out_dtype: torch.dtype | None, read_copy=None, read_format=None) -> torch.Tensor:
    """One plain decode token on ``positions`` (``origin``, ``count``, ``steps``: device tensors): the fused
    replay-or-flush op reads and advances them and the step counter moves on. Shared by a layer's own positions
    (``DevicePositions.step``) and its slice of a decode pack (``PackedSlot.step``)."""
    origin, count, steps = positions[:3]
    y = step_fn(state, fields, origin, count, tokens, buffer_len, read_copy=read_copy, read_format=read_format)
    steps.add_(1)
    return y if out_dtype is None else y.to(out_dtype)


def roll_conv(conv: torch.Tensor, inputs: torch.Tensor) -> torch.Tensor:
    """``[window, inputs]`` ([B, C, K + 1]) for the model's own conv; the window ``conv`` [B, C, K] moves on by the
    new input in place."""
    full = torch.cat([conv.to(inputs.dtype), inputs], dim=-1)
    conv.copy_(full[..., 1:])
    return full


def commit_windows(layers: list[DevicePositions], kept: int) -> None:
    """A crop on the device after a window these layers verified: its first ``kept`` tokens become committed records
    (the verify op wrote them after the committed ones), the rest are dropped (counted), each conv window moves on by
    the kept inputs, and the next window verifies from there. No host read: the dropped drafts are counted on the
    host where it saw the window's width (``fed``: the assisted loop's crops), else on the device, where a crop
    that keeps more than the window fed is counted in ``errors``, which leaving raises. Three multi-tensor launches
    for all the layers (count, the window counters, the conv windows), not three a layer: a real hybrid crops
    dozens of SSM layers every speculative round."""
    counts, window_counters, convs, conv_sources = [], [], [], []
    for positions in layers:
        positions._count_crop(kept)
        counts.append(positions.count)
        window_counters.append(positions.counters[:2])  # steps (windows since the last crop), pending
        if positions.conv is not None:
            convs.append(positions.conv)
            conv_sources.append(positions.conv_hist[..., kept : kept + positions.conv.shape[-1]])
    torch._foreach_add_(counts, kept)
    torch._foreach_zero_(window_counters)
    if convs:
        torch._foreach_copy_(convs, conv_sources)


# ``DevicePositions.phase``: module constants, so that a compiled step's comparisons read globals (one guard per frame)
# rather than class attributes through each layer's instance (one guard per layer, checked before every replay)
OFF, STEP, VERIFY = 0, 1, 2


class DevicePositions:
    """The device-side positions of one layer (see the module docstring)."""

    # no instance dict: Dynamo guards every method a compiled step calls on an object with one (that the instance
    # does not shadow it), before each CUDA-graph replay
    __slots__ = ("buffer_len", "committed_here", "conv", "conv_hist", "count", "counters", "entry_committed", "fed",
                 "fields", "host_dropped", "operands", "origin", "pack", "pending", "phase", "positions", "step_fn",
                 "steps", "token_name", "verify_fn", "verify_window")

    def __init__(self):
        # ``phase``: OFF (the host schedule decides), STEP (plain decode steps) or VERIFY (speculative windows). One
        # attribute for both questions, read once where a compiled forward asks: each read through another path is
        # another guard checked before every CUDA-graph replay
        self.phase = OFF
        # origin, count and the step counter share one int32 tensor, ``positions`` [2B + 1]: a compiled step slices it
        # inside the graph, so the graph takes (and Dynamo guards, and the runtime bumps the version of) one tensor
        # per layer for the three
        self.positions: torch.Tensor | None = None
        self.origin: torch.Tensor | None = None  # int32 [B] view: ring slot of the oldest record (read only)
        self.count: torch.Tensor | None = None  # int32 [B] view: records in the ring (the kernel advances it)
        self.steps: torch.Tensor | None = None  # int32 [1] view: decode steps (verifying: windows) since entry
        self.pending: torch.Tensor | None = None  # int32 [1] view: width of the window verified since entry
        # int32 [4] view: steps, pending, then (verifying) the drafts dropped by crops on the device since entry and
        # how many of those crops kept more tokens than their window fed (a caller's error, raised on leaving)
        self.counters: torch.Tensor | None = None
        self.conv: torch.Tensor | None = None  # [B, C, K]: the last K conv inputs, oldest first
        self.conv_hist: torch.Tensor | None = None  # [B, C, K + verify_window]: [window, inputs] of a verify forward
        self.entry_committed = 0  # records in the ring when device positions took over (every row alike)
        self.committed_here = False  # a crop committed a window on the device since entry (the conv ring is stale)
        # the width of the window verified since the last crop, as the host saw it (an eager verify forward, or the
        # compiled call's caller: ``note_window``); None where it did not see one
        self.fed: int | None = None
        # the drafts dropped by the crops whose window's width the host knew (``fed``): counted on the host, no
        # device operation (such a crop never keeps more than the window fed: ``ReplaySchedule.kept_on_device``)
        self.host_dropped = 0
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
        # VERIFY: every forward is a speculative window of at most ``verify_window`` tokens, through ``verify_fn``
        # (the recurrence's ``device_verify``)
        self.verify_fn = None
        self.verify_window = 0
        # the cache's ``DecodePack`` whose slices these tensors are (None: their own storage); while it is active a
        # compiled plain step reads the packed tensors instead, and leaving these positions switches it off
        self.pack = None

    def _allocate(self, batch: int, device: torch.device, conv_window: torch.Tensor | None,
                  verify_window: int) -> None:
        fits = self.count is not None and self.count.shape[0] == batch and self.count.device == device
        conv_fits = (conv_window is None) == (self.conv is None) and (
            conv_window is None or (self.conv.shape == conv_window.shape and self.conv.dtype == conv_window.dtype))
        hist_columns = 0 if conv_window is None or not verify_window else conv_window.shape[-1] + verify_window
        hist_fits = (self.conv_hist.shape[-1] if self.conv_hist is not None else 0) == hist_columns
        if fits and conv_fits and hist_fits:
            return
        if not (fits and conv_fits):
            self.positions = torch.zeros(2 * batch + _COUNTERS, dtype=torch.int32, device=device)
            self.origin, self.count, self.steps, self.pending = _split_positions(self.positions)
            self.counters = self.positions[2 * batch :]
            self.conv = None if conv_window is None else torch.empty_like(conv_window)
            mark_static(self.positions, *([] if self.conv is None else [self.conv]))
        self.conv_hist = None
        if hist_columns:
            self.conv_hist = conv_window.new_zeros((*conv_window.shape[:-1], hist_columns))
            mark_static(self.conv_hist)

    def enter(self, origin: int, committed: int, batch: int, device: torch.device,
              conv_window: torch.Tensor | None, operands: tuple, fields: dict, step_fn, buffer_len: int,
              token_name: str, verify_fn=None, verify_window: int = 0) -> None:
        """Take over from the host schedule: every row at ring slot ``origin`` with ``committed`` records;
        ``operands`` / ``fields``: the store's kernel operands and the ring's records, which nothing replaces until
        the host schedule takes over again; ``step_fn``: the recurrence's ``device_step``; ``verify_fn`` (the
        recurrence's ``device_verify``): every forward is a speculative window of up to ``verify_window`` tokens."""
        self._allocate(batch, device, conv_window, verify_window if verify_fn is not None else 0)
        self.operands, self.fields = operands, fields
        self.step_fn, self.buffer_len, self.token_name = step_fn, buffer_len, token_name
        self.verify_fn = verify_fn
        self.verify_window = verify_window if verify_fn is not None else 0
        self.origin.fill_(origin)
        self.count.fill_(committed)
        self.counters.zero_()
        if conv_window is not None:
            self.conv.copy_(conv_window)
        self.entry_committed = committed
        self.committed_here = False
        self.fed = None
        self.host_dropped = 0
        self.phase = STEP if verify_fn is None else VERIFY

    # methods, not properties: Dynamo guards a property's getter per instance (per layer), a method by its class
    def is_active(self) -> bool:
        """On device positions (plain steps or verify windows)."""
        return self.phase != OFF

    def is_verifying(self) -> bool:
        """On device positions, every forward a speculative window."""
        return self.phase == VERIFY

    def steps_taken(self) -> int:
        """Decode steps since entry (reads the device)."""
        return int(self.steps.item())

    def progress(self) -> tuple[int, int]:
        """(steps or verified windows, width of the pending window) since entry: one device read."""
        steps, pending = self.counters[:2].tolist()
        return steps, pending

    def ledger(self) -> tuple[int, int, int, int]:
        """(windows verified since the last crop, the pending window's width, drafts dropped by crops on the device,
        crops that kept more than their window fed) since entry: one device read."""
        windows, pending, dropped, errors = self.counters.tolist()
        return windows, pending, dropped + self.host_dropped, errors

    def _count_crop(self, kept: int) -> None:
        """The host side of ``commit_windows``: the dropped drafts and the crops past the window counted (on the host
        where it saw the window's width, else on the device), the host's fields moved on."""
        if self.fed is not None:
            self.host_dropped += self.fed - kept
        else:
            surplus = self.pending - kept  # [1], on the device
            self.counters[2:].add_(torch.cat([surplus, (surplus < 0).to(surplus.dtype)]))
        self.entry_committed += kept
        self.committed_here = True
        self.fed = None

    def restart(self, origin: int, committed: int) -> None:
        """Point the positions at the ring after a fold on the host schedule (``ReplaySchedule.crop_on_device``):
        every row at ring slot ``origin`` with ``committed`` records; the window counters stay as the crop left
        them."""
        self.origin.fill_(origin)
        self.count.fill_(committed)
        self.entry_committed = committed

    def note_window(self, width: int) -> None:
        """The host's view of the next forward, from outside a compiled call: a window of ``width`` tokens, which
        these positions verify when it fits (a wider one leaves them for the host schedule)."""
        self.fed = width if self.phase == VERIFY and width <= self.verify_window else None

    def adopt(self, state: torch.Tensor | None, positions: torch.Tensor, conv: torch.Tensor | None) -> None:
        """Hold ``state`` (the checkpoint; None: unchanged), ``positions`` and ``conv``: a ``DecodePack``'s slices
        with the same values (the pack copied them there), or copies of them when the pack lets the layer go."""
        self.positions = positions
        self.origin, self.count, self.steps, self.pending = _split_positions(positions)
        self.counters = positions[2 * self.origin.shape[0] :]
        self.conv = conv
        if state is not None and self.operands is not None:  # (off device positions the next entry reads the store)
            self.operands = (state, *self.operands[1:])

    def leave(self) -> None:
        if self.pack is not None:
            self.pack.deactivate()
        self.phase = OFF
        self.fed = None
        self.operands = self.fields = self.step_fn = self.verify_fn = None

    def takes(self, tokens) -> bool:
        """Whether a forward of these tokens is a plain decode step on these positions (one token, not verifying)."""
        return self.phase == STEP and tokens[self.token_name].shape[1] == 1

    def takes_conv(self, inputs: torch.Tensor) -> bool:
        """Whether a conv update of ``inputs`` [B, C, T] is a plain decode step on these positions (one token, not
        verifying): ``conv_step`` then serves it."""
        return self.phase == STEP and inputs.shape[-1] == 1

    def accepts(self, count) -> bool:
        """Whether a forward of ``count`` tokens runs on these positions (a plain step, or a window they verify)."""
        phase = self.phase
        return count == 1 if phase == STEP else phase == VERIFY and count <= self.verify_window

    def verifies(self, tokens) -> bool:
        """Whether a forward of these tokens is a speculative window these positions verify (at most
        ``verify_window`` tokens; a wider one goes back to the host schedule, which grows the rings)."""
        return self.phase == VERIFY and tokens[self.token_name].shape[1] <= self.verify_window

    def verify(self, tokens) -> torch.Tensor:
        """A speculative window (float32 outputs): the verify op writes its records after the committed ones and
        changes no position; ``pending`` records its width for the crop, ``steps`` counts windows (one per crop)."""
        if torch.compiler.is_compiling():
            origin, count, steps, pending = _split_positions(self.positions)
        else:
            origin, count, steps, pending = self.origin, self.count, self.steps, self.pending
        width = tokens[self.token_name].shape[1]
        y = self.verify_fn(self.operands[0], self.fields, origin, count, tokens)
        pending.fill_(width)
        steps.add_(1)
        if not torch.compiler.is_compiling():  # an eager verify forward: the host sees its width
            self.fed = width
        return y

    def conv_verify(self, inputs: torch.Tensor) -> torch.Tensor:
        """``[window, inputs]`` for the model's own conv; kept in ``conv_hist`` for the crop, the window unchanged."""
        full = torch.cat([self.conv.to(inputs.dtype), inputs], dim=-1)
        self.conv_hist[..., : full.shape[-1]].copy_(full)
        return full

    def step(self, tokens, out_dtype: torch.dtype | None) -> torch.Tensor:
        """One plain decode token: the fused replay-or-flush op reads and advances the positions; no host integer
        is read or written (a compiled step may be replayed as a CUDA graph)."""
        state, read_copy, read_format = self.operands
        if torch.compiler.is_compiling():  # views made inside the graph: its one input is the positions tensor
            positions = _split_positions(self.positions)
        else:
            positions = (self.origin, self.count, self.steps)
        return plain_step(self.step_fn, state, self.fields, positions, tokens, self.buffer_len, out_dtype,
                          read_copy=read_copy, read_format=read_format)

    def conv_step(self, inputs: torch.Tensor) -> torch.Tensor:
        """``[window, inputs]`` ([B, C, K + 1]) for the model's own conv; the window moves on by the new input."""
        return roll_conv(self.conv, inputs)
