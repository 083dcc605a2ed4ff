"""The checkpoint of one SSM layer: the only place a replay layer reads or writes its recurrent state.

``read()`` is what non-flush steps compute outputs from (the read copy in separated mode, else the checkpoint);
``recurrence()`` is what flushes continue from (always the checkpoint). Both return float32 and are decoded once
per write. Storage is allocated once and rewritten in place. A store can hold a different policy per batch row
(used to compare policies on the same sequence in one batch).
"""

from __future__ import annotations

import torch

from .formats import Encoding
from .policy import PrecisionPolicy


class _Slot:
    """The encoded checkpoint (and read copy) of the batch rows that share one policy."""

    def __init__(self, policy: PrecisionPolicy, rows: torch.Tensor | None, seed: int):
        self.policy, self.rows, self.seed = policy, rows, seed
        self.checkpoint_codec, self.read_codec = policy.checkpoint_codec(), policy.read_codec()
        self.checkpoint: Encoding = {}
        self.read_copy: Encoding | None = None

    def encode(self, state: torch.Tensor, position: int) -> tuple[Encoding, Encoding | None]:
        """Encodings of ``state`` as the checkpoint at token ``position``. Stochastic rounding draws from a generator
        seeded by (policy seed, layer, position): the same state at the same position rounds the same way, however
        the writes were scheduled (plain or speculative decoding)."""
        generator = None
        if self.policy.stochastic_rounding:
            generator = torch.Generator(device=state.device)
            generator.manual_seed((self.seed * 1_000_003 + position) % (2**63 - 1))
        checkpoint = self.checkpoint_codec.encode(state, generator)
        read_copy = None
        if self.read_codec is not None:  # refreshed from the checkpoint, never read back into the recurrence
            read_copy = self.read_codec.encode(self.checkpoint_codec.decode(checkpoint))
        return checkpoint, read_copy

    def load(self, checkpoint: Encoding, read_copy: Encoding | None) -> None:
        if not self.checkpoint:  # first time: take the tensors as the static storage
            self.checkpoint = {name: t.clone() for name, t in checkpoint.items()}
            self.read_copy = None if read_copy is None else {name: t.clone() for name, t in read_copy.items()}
            return
        _copy_into(self.checkpoint, checkpoint)
        if read_copy is not None:
            _copy_into(self.read_copy, read_copy)

    def decode_checkpoint(self, checkpoint: Encoding | None = None) -> torch.Tensor:
        return self.checkpoint_codec.decode(self.checkpoint if checkpoint is None else checkpoint)

    def decode_read(self, checkpoint: Encoding | None = None, read_copy: Encoding | None = None) -> torch.Tensor:
        if self.read_codec is None:
            return self.decode_checkpoint(checkpoint)
        return self.read_codec.decode(self.read_copy if read_copy is None else read_copy)


class StagedCheckpoint:
    """A checkpoint computed but not stored: the state at a flush boundary inside a speculative window, which becomes
    the stored checkpoint only if the tokens before the boundary are accepted."""

    def __init__(self, store: CheckpointStore, state: torch.Tensor, position: int):
        self.position = position
        self.encodings = [slot.encode(state if slot.rows is None else state.index_select(0, slot.rows), position)
                          for slot in store.slots]
        self._store = store
        self._decoded: dict[str, torch.Tensor] = {}

    def read(self) -> torch.Tensor:
        if "read" not in self._decoded:
            self._decoded["read"] = self._store._assemble_from(
                [slot.decode_read(*enc) for slot, enc in zip(self._store.slots, self.encodings, strict=True)])
        return self._decoded["read"]

    def recurrence(self) -> torch.Tensor:
        if "recurrence" not in self._decoded:
            self._decoded["recurrence"] = self._store._assemble_from(
                [slot.decode_checkpoint(enc[0]) for slot, enc in zip(self._store.slots, self.encodings, strict=True)])
        return self._decoded["recurrence"]


def _copy_into(target: Encoding, source: Encoding) -> None:
    for name, value in source.items():
        target[name].copy_(value)


def _nbytes(encoding: Encoding | None) -> int:
    return 0 if not encoding else sum(t.numel() * t.element_size() for t in encoding.values() if t.dim())


class CheckpointStore:
    def __init__(self, policy: PrecisionPolicy | list[PrecisionPolicy], seed_offset: int = 0):
        self.policies = list(policy) if isinstance(policy, (list, tuple)) else [policy]
        self.seed_offset = seed_offset
        self.slots: list[_Slot] = []
        self._decoded: dict[str, torch.Tensor] = {}

    @property
    def allocated(self) -> bool:
        return bool(self.slots)

    @property
    def exact_fold(self) -> bool:
        """Folds must recompute delta-rule corrected values from raw inputs (reads saw a different state)."""
        return any(p.mode == "separated" for p in self.policies)

    def allocate(self, shape: tuple[int, ...], device: torch.device) -> None:
        batch = shape[0]
        distinct = list(dict.fromkeys(self.policies))
        if len(distinct) == 1:
            groups = [(distinct[0], None)]
        elif len(self.policies) != batch:
            raise ValueError(
                f"{len(self.policies)} per-row precision policies for a batch of {batch}: give one policy, or one "
                "per batch row"
            )
        else:
            groups = [
                (p, torch.tensor([i for i, q in enumerate(self.policies) if q == p], device=device)) for p in distinct
            ]
        self.slots = [_Slot(policy, rows, policy.seed * 1_000_003 + self.seed_offset) for policy, rows in groups]
        self.load(self.stage(torch.zeros(shape, device=device), position=0))

    def _assemble_from(self, parts: list[torch.Tensor]) -> torch.Tensor:
        if len(parts) == 1:
            return parts[0]
        out = torch.empty((len(self.policies), *parts[0].shape[1:]), device=parts[0].device)
        for slot, part in zip(self.slots, parts, strict=True):
            out.index_copy_(0, slot.rows, part)
        return out

    def _assemble(self, kind: str) -> torch.Tensor:
        if kind not in self._decoded:
            parts = [slot.decode_checkpoint() if kind == "recurrence" else slot.decode_read() for slot in self.slots]
            self._decoded[kind] = self._assemble_from(parts)
        return self._decoded[kind]

    def stage(self, state: torch.Tensor, position: int) -> StagedCheckpoint:
        """Encode ``state`` as the checkpoint at token ``position`` without storing it."""
        return StagedCheckpoint(self, state, position)

    def load(self, staged: StagedCheckpoint) -> None:
        """Store a staged checkpoint (its exact encodings: nothing is rounded again)."""
        for slot, (checkpoint, read_copy) in zip(self.slots, staged.encodings, strict=True):
            slot.load(checkpoint, read_copy)
        self._decoded = {}

    def read(self) -> torch.Tensor:
        """State for computing outputs on non-flush steps (float32)."""
        return self._assemble("read")

    def recurrence(self) -> torch.Tensor:
        """State the recurrence continues from at a flush (float32)."""
        return self._assemble("recurrence")

    def write(self, state: torch.Tensor, position: int) -> None:
        """Store ``state`` as the checkpoint at token ``position``."""
        self.load(self.stage(state, position))

    def zero_(self) -> None:
        if self.slots:
            self.load(self.stage(torch.zeros_like(self.recurrence()), position=0))

    def index_batch(self, index: torch.Tensor) -> None:
        if len(self.slots) > 1:
            raise ValueError("batch rows cannot be reordered when each row has its own precision policy")
        for slot in self.slots:
            for encoding in (slot.checkpoint, slot.read_copy or {}):
                for name, value in encoding.items():
                    if value.dim():
                        encoding[name] = value.index_select(0, index.to(value.device))
        self._decoded = {}

    def nbytes(self) -> dict[str, int]:
        return {
            "checkpoint": sum(_nbytes(slot.checkpoint) for slot in self.slots),
            "read_copy": sum(_nbytes(slot.read_copy) for slot in self.slots),
        }
