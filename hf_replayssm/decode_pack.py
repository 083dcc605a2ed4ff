"""One tensor per operand kind for all the SSM layers of a static cache in plain compiled decoding (pure torch, no
transformers import).

A compiled decode step's host cost before its CUDA graph runs grows with what the graph reads from the cache: each
tensor is a graph input (a guard checked before every replay, gathered by the frame, version-bumped by AOTAutograd
when written, checked by the CUDA-graph tree) and every attribute on the way to it is a guard too. On device
positions each SSM layer's step reads six tensors (checkpoint, the three Mamba-2 / delta-rule record rings, the
positions, the conv window) and a few constants through its own objects, against two tensors for a stock linear
layer: at batch 1, where the step is host-bound, that made a compiled ReplayCache step 2-4 % slower than transformers'
static cache (BENCHMARKS.md, issue 8).

``DecodePack`` moves those tensors of every SSM layer of one geometry into one tensor per kind, ``[layers, ...]``
(each layer keeps a view of its slice, so eager code, crops and the host schedule see nothing new), and holds the
constants once. A compiled step then reaches it through the cache (one source for every layer) and slices its layer
inside the graph: the graph takes six tensors for all the SSM layers, and the decode-step ops write the slices in
place (Inductor passes views of the inputs to the ops; no copy). The pack is active only while every SSM layer of
the cache takes plain steps on device positions; any layer leaving them switches it off.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping

import torch

from .static_decode import OFF, STEP, _split_positions, mark_static, plain_step, roll_conv


def _geometry(t: torch.Tensor | None) -> tuple | None:
    return None if t is None else (tuple(t.shape), t.dtype, t.device)


def _same(values) -> bool:
    return len(set(values)) <= 1


def _same_memory(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.stride() == b.stride()


class PackedSlot:
    """One layer's slice of a ``DecodePack``, as the compiled step of its mixer sees it: the few methods of
    ``DevicePositions`` that a plain step calls, on in-graph views of the packed tensors. Made inside the traced
    forward (``ReplayCall.positions``), so Dynamo guards none of it."""

    __slots__ = ("pack", "slot")

    def __init__(self, pack: DecodePack, slot: int):
        self.pack, self.slot = pack, slot

    def is_active(self) -> bool:
        return True

    def takes(self, tokens) -> bool:
        return tokens[self.pack.token_name].shape[1] == 1

    def takes_conv(self, inputs: torch.Tensor) -> bool:
        return inputs.shape[-1] == 1

    @property
    def conv(self) -> torch.Tensor | None:
        conv = self.pack.conv
        return None if conv is None else conv[self.slot]

    @property
    def operands(self) -> tuple:
        return self.pack.state[self.slot], None, None

    def step(self, tokens, out_dtype: torch.dtype | None) -> torch.Tensor:
        """``DevicePositions.step`` on this layer's slices."""
        pack, slot = self.pack, self.slot
        fields = {name: field[slot] for name, field in pack.fields.items()}
        return plain_step(pack.step_fn, pack.state[slot], fields, _split_positions(pack.positions[slot]), tokens,
                          pack.buffer_len, out_dtype)

    def conv_step(self, inputs: torch.Tensor) -> torch.Tensor:
        """``DevicePositions.conv_step`` on this layer's conv window."""
        return roll_conv(self.pack.conv[self.slot], inputs)


class DecodePack:
    """The packed operands of the SSM layers ``layers`` ({layer index: ReplayLayer}) of one cache; see the module
    docstring. ``rows[layer index]``: the layer's row in the packed tensors as a string, which a trace reads (None:
    not packed); ``slots``: the same as ints."""

    __slots__ = ("__weakref__", "_layers", "buffer_len", "conv", "fields", "phase", "positions", "rows", "state",
                 "step_fn", "token_name")

    def __init__(self, layers: Mapping[int, object], num_layers: int, state: torch.Tensor, fields: dict,
                 conv: torch.Tensor | None, positions: torch.Tensor):
        first = next(iter(layers.values())).positions
        self.phase = OFF
        self.state, self.fields, self.conv, self.positions = state, fields, conv, positions
        self.step_fn, self.buffer_len, self.token_name = first.step_fn, first.buffer_len, first.token_name
        order = {idx: slot for slot, idx in enumerate(layers)}
        # ``rows``: the slots as strings. Dynamo makes an int attribute symbolic once it sees it change between
        # compiles of one frame (another model's pack compiled before in the process, or ``dynamic=True``), and a
        # packed tensor sliced at a symbolic row reached the decode-step ops at the wrong offset under Inductor (every
        # layer read one layer's state: falcon_h1 after kimi_linear, found on an H100, run 239). A string stays a
        # constant (guarded by value).
        self.rows = tuple(None if order.get(idx) is None else str(order[idx]) for idx in range(num_layers))
        self._layers = {idx: weakref.ref(layer) for idx, layer in layers.items()}

    @property
    def slots(self) -> tuple[int | None, ...]:
        return tuple(None if row is None else int(row) for row in self.rows)

    @staticmethod
    def packable(layers: Mapping[int, object]) -> bool:
        """Every layer takes plain steps on device positions (not verifying), without a read copy, through one step
        function, with operands of one geometry."""
        if not layers:
            return False
        positions = [layer.positions for layer in layers.values()]
        if any(p.phase != STEP or p.operands is None or p.operands[1] is not None for p in positions):
            return False
        if not all(p.operands[0].is_contiguous() for p in positions):
            return False
        return (_same((p.step_fn, p.buffer_len, p.token_name) for p in positions)
                and _same(_geometry(p.operands[0]) for p in positions)
                and _same(tuple((name, _geometry(t)) for name, t in p.fields.items()) for p in positions)
                and _same(_geometry(p.conv) for p in positions)
                and _same(_geometry(p.positions) for p in positions))

    @classmethod
    def pack(cls, layers: Mapping[int, object], num_layers: int, previous: DecodePack | None = None
             ) -> DecodePack | None:
        """Move the layers' operands into packed tensors (one copy each), or None where they cannot be packed.
        ``previous``: a pack whose slices these layers no longer hold (their storage was replaced: a batch reorder, a
        per-row rollback's own packing), whose tensors take them back when they fit, so that compiled graphs and CUDA
        graphs keep their addresses."""
        if not cls.packable(layers):
            return None
        positions = [layer.positions for layer in layers.values()]
        parts = {"state": [p.operands[0] for p in positions], "positions": [p.positions for p in positions],
                 **{f"field {name}": [p.fields[name] for p in positions] for name in positions[0].fields}}
        if positions[0].conv is not None:
            parts["conv"] = [p.conv for p in positions]
        if previous is not None and previous.fits(layers, parts):
            pack = previous
            for name, tensors in parts.items():
                packed = pack._packed(name)
                for slot, t in enumerate(tensors):
                    packed[slot].copy_(t)
        else:
            stacked = {name: torch.stack(tensors) for name, tensors in parts.items()}
            fields = {name: stacked[f"field {name}"] for name in positions[0].fields}
            pack = cls(layers, num_layers, stacked["state"], fields, stacked.get("conv"), stacked["positions"])
        state, fields, conv, counters = pack.state, pack.fields, pack.conv, pack.positions
        for slot, layer in enumerate(layers.values()):
            schedule = layer.schedule
            schedule.store.repoint_checkpoint(state[slot])
            for name in fields:  # the ring's own dict (the positions hold the same one)
                schedule.ring.fields[name] = fields[name][slot]
            schedule.device_positions.adopt(state[slot], counters[slot], None if conv is None else conv[slot])
        packed = [state, *fields.values(), counters, *([] if conv is None else [conv])]
        mark_static(*packed)
        # static shapes too: a pack of other shapes (rings grown for speculation) recompiles with constants instead of
        # making the sizes symbolic, where Inductor (torch 2.13, CPU) passed every layer's op slot 0 of a ring whose
        # capacity was symbolic (its output code: offset 0, not the slot times the symbolic stride)
        for tensor in packed:
            torch._dynamo.mark_static(tensor)
        return pack

    def _same_layers(self, layers: Mapping[int, object]) -> bool:
        return list(layers) == list(self._layers) and all(self._layers[idx]() is layer for idx, layer in layers.items())

    def _packed(self, name: str) -> torch.Tensor | None:
        if name.startswith("field "):
            return self.fields.get(name[len("field "):])
        return getattr(self, name)

    def fits(self, layers: Mapping[int, object], parts: dict) -> bool:
        """Whether these layers' operands (``parts``: kind -> one tensor per layer) fit this pack's tensors: the same
        layers, step function and geometry."""
        if not self._same_layers(layers) or len(parts) != 2 + len(self.fields) + (self.conv is not None):
            return False
        first = next(iter(layers.values())).positions
        if (first.step_fn, first.buffer_len, first.token_name) != (self.step_fn, self.buffer_len, self.token_name):
            return False
        for name, tensors in parts.items():
            packed = self._packed(name)
            if packed is None or _geometry(packed) != ((len(tensors), *tensors[0].shape), tensors[0].dtype,
                                                       tensors[0].device):
                return False
        return True

    def holds(self, layers: Mapping[int, object]) -> bool:
        """Whether these layers still run on this pack's slices (a reset keeps them; another batch size, a reorder or
        a per-row rollback's own packing does not)."""
        if not self._same_layers(layers):
            return False
        for slot, layer in enumerate(layers.values()):
            p = layer.positions
            if p.operands is None or p.operands[1] is not None or not _same_memory(p.operands[0], self.state[slot]):
                return False
            if not _same_memory(p.positions, self.positions[slot]) or not _same_memory(
                    p.conv, None if self.conv is None else self.conv[slot]):
                return False
            if list(p.fields) != list(self.fields) or not all(
                    _same_memory(p.fields[name], field[slot]) for name, field in self.fields.items()):
                return False
            if (p.step_fn, p.buffer_len, p.token_name) != (self.step_fn, self.buffer_len, self.token_name):
                return False
        return True

    def __reduce__(self):  # a pickled or copied cache packs again on its next entry (weak references inside)
        return (type(None), ())

    def activate(self, layers: Mapping[int, object]) -> None:
        """Compiled plain steps of these layers run on the pack until one of them leaves its device positions."""
        for layer in layers.values():
            layer.positions.pack = self
        self.phase = STEP

    def deactivate(self) -> None:
        self.phase = OFF

    def slot_for(self, layer_idx: int) -> int | None:
        """The layer's row while the pack is active (plain steps), else None."""
        if self.phase != STEP or layer_idx >= len(self.rows):
            return None
        row = self.rows[layer_idx]
        return None if row is None else int(row)  # a constant in a trace (see __init__)
