"""Per-row rollback of every SSM layer of a cache in a few launches (batched speculation).

A per-row rollback writes neutral records into each SSM layer's record ring and moves each layer's conv window back
(``ReplaySchedule.drop_rows_newest``): a masked fill per record field and a gather and a copy for the conv window,
per layer, each a launch with tens of microseconds of host work on CUDA (H200, six GDN layers at batch 64: about
0.8 ms per rollback that drops something, while the GPU waits: the host needs the verify forward's logits before it
can roll back). Every SSM layer of a cache has seen the same tokens, so their rings and conv windows sit at the same
positions, and their buffers usually have one shape. ``PackedRollback`` moves such buffers into one tensor per buffer
kind, ``[layers, *buffer]`` (each layer keeps a view of its slice, so nothing else changes), and writes all layers
with one masked fill per record field and one gather and copy for the conv windows. Pure torch, no transformers
import.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence

import torch

from .buffers import fill_masked_records, move_conv_windows


def _ring_state(schedule) -> tuple:
    ring = schedule.ring
    return ring.origin, ring.num_committed, ring.num_pending, ring.capacity


def _conv_state(schedule) -> tuple:
    conv = schedule.conv
    return conv.position, conv.base, conv.oldest, conv.capacity, schedule.conv_kernel


def _same(values) -> bool:
    return len(set(values)) <= 1


class PackedRollback:
    """The record fields and conv buffers of ``schedules`` packed as slices of one tensor each. Held weakly: the
    layers' views keep the packed tensors alive, so a cache that reallocates its layers (another batch, a reset)
    frees them, and this object then no longer ``holds``."""

    def __init__(self, schedules: Sequence, fields: dict[str, torch.Tensor], conv: torch.Tensor | None):
        self._schedules = [weakref.ref(s) for s in schedules]
        self._fields = {name: weakref.ref(t) for name, t in fields.items()}  # name -> [layers, B, R, ...]
        self._conv = None if conv is None else weakref.ref(conv)  # [layers, B, C, columns]
        # each layer's slices, as its ring / conv ring holds them: identity says the layer still uses them
        self._views = [([weakref.ref(s.ring.fields[name]) for name in fields],
                        None if conv is None else weakref.ref(s.conv.buffer)) for s in schedules]

    @staticmethod
    def packable(schedules: Sequence) -> bool:
        """Two or more layers of the plain schedule (short-conv layers keep their own rollback), with allocated rings
        of one geometry at one position, a neutral record form, and conv windows all present or all absent."""
        from .schedule import ReplaySchedule

        if len(schedules) < 2 or any(type(s) is not ReplaySchedule for s in schedules):
            return False
        if not all(s.store.allocated and s.ring.allocated for s in schedules):
            return False
        if not _same(type(s.recurrence) for s in schedules) or getattr(schedules[0].recurrence, "neutral_record",
                                                                         None) is None:
            return False
        if not _same(_ring_state(s) for s in schedules):
            return False
        geometry = [tuple((name, t.shape, t.dtype, t.device) for name, t in s.ring.fields.items()) for s in schedules]
        if not _same(geometry):
            return False
        convs = [s.conv.buffer for s in schedules]
        if all(c is None for c in convs):
            return True
        return (all(c is not None for c in convs) and _same((c.shape, c.dtype, c.device) for c in convs)
                and _same(_conv_state(s) for s in schedules))

    @classmethod
    def pack(cls, schedules: Sequence) -> PackedRollback | None:
        """Move the schedules' buffers into packed tensors (one copy), or None where they cannot be packed."""
        if not cls.packable(schedules):
            return None
        fields = {}
        for name in schedules[0].ring.fields:
            fields[name] = torch.stack([s.ring.fields[name] for s in schedules])
            for i, s in enumerate(schedules):
                s.ring.fields[name] = fields[name][i]
        conv = None
        if schedules[0].conv.buffer is not None:
            conv = torch.stack([s.conv.buffer for s in schedules])
            for i, s in enumerate(schedules):
                s.conv.buffer = conv[i]
        return cls(schedules, fields, conv)

    def _live(self):
        """(schedules, fields, conv), or None once any of them is gone."""
        schedules = [ref() for ref in self._schedules]
        fields = {name: ref() for name, ref in self._fields.items()}
        conv = None if self._conv is None else self._conv()
        if any(s is None for s in schedules) or any(t is None for t in fields.values()) or (
                self._conv is not None and conv is None):
            return None
        return schedules, fields, conv

    def holds(self, schedules: Sequence) -> bool:
        """Whether these are still the packed layers, each still on its slices (a ring that grew or a batch that was
        reordered has new storage) and all at one position."""
        live = self._live()
        if live is None or len(schedules) != len(live[0]):
            return False
        for s, packed, (fields, conv) in zip(schedules, live[0], self._views, strict=True):
            if s is not packed or len(s.ring.fields) != len(fields):
                return False
            if any(view() is not held for view, held in zip(fields, s.ring.fields.values(), strict=True)):
                return False
            if conv is not None and conv() is not s.conv.buffer:
                return False
        return _same(_ring_state(s) for s in schedules) and (self._conv is None
                                                              or _same(_conv_state(s) for s in schedules))

    def write(self, dropped: list[int], memo: dict) -> None:
        """Every layer's neutral records and conv moves of one per-row rollback, after ``holds`` (the checks and
        positions are each schedule's ``drop_rows_newest(..., packed=True)``, which must run right after)."""
        if not max(dropped, default=0):
            return
        schedules, fields, conv = self._live()
        first = schedules[0]
        if conv is not None:  # [layers, B, C, columns]: each row's window moved back over its dropped inputs
            kernel = first.conv_kernel
            move_conv_windows(conv, first.conv.compaction_source(dropped, kernel, memo), first.conv.window_end(),
                              kernel)
        mask = first.ring.newest_mask(dropped, memo)  # [B, R]
        for name, value in first.recurrence.neutral_record:
            if name in fields:
                fill_masked_records(fields[name], mask, value, layers=True)  # [layers, B, R, ...]
