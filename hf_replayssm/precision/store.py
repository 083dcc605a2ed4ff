"""The checkpoint of one SSM layer: the only place a replay layer reads or writes its recurrent state.

``read()`` is what non-flush steps compute outputs from (the read copy in separated mode, else the checkpoint);
``recurrence()`` is what flushes continue from (always the checkpoint). Both return float32, decoded from the
encodings at every call: nothing but the encodings is kept, so ``nbytes()`` is all the state memory. For the fp32
format (with one policy) the decoded tensor *is* the stored one, not a copy: callers must not modify it in place.
Storage is allocated once and rewritten in place (``index_batch`` replaces it). A store can hold a different policy
per batch row (used to compare policies on the same sequence in one batch).

Stochastic rounding of the checkpoint at token ``position`` uses the noise key (policy ``seed``, ``seed_offset`` as
the layer, ``position``): a batch row's encoding depends only on its own state and that key, not on the other rows
of the batch nor on their policies (see :mod:`.formats` for the exact function).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from .formats import Encoding, NoiseKey
from .policy import PrecisionPolicy


class _Slot:
    """The encoded checkpoint (and read copy) of the batch rows that share one policy (``rows``: their indices,
    None when the policy covers the whole batch)."""

    def __init__(self, policy: PrecisionPolicy, rows: torch.Tensor | None, layer: int):
        self.policy, self.rows, self.layer = policy, rows, layer
        self.checkpoint_codec, self.read_codec = policy.checkpoint_codec(), policy.read_codec()
        self.checkpoint: Encoding = {}
        self.read_copy: Encoding | None = None

    def encode(self, state: torch.Tensor, position: int) -> tuple[Encoding, Encoding | None]:
        """Encodings of ``state`` (this slot's rows) as the checkpoint at token ``position``. Stochastic rounding is
        keyed by (policy seed, layer, position) and the element index within a batch row: the same state at the
        same position rounds the same way, whatever the batch and however the writes were scheduled (plain or
        speculative decoding)."""
        noise = NoiseKey(self.policy.seed, self.layer, position) if self.policy.stochastic_rounding else None
        checkpoint = self.checkpoint_codec.encode(state, noise)
        return checkpoint, self.encode_read_copy(checkpoint)

    def encode_read_copy(self, checkpoint: Encoding | None = None) -> Encoding | None:
        """The read copy of ``checkpoint`` (default: the stored one), or None without a read format: refreshed from
        the checkpoint, never read back into the recurrence."""
        if self.read_codec is None:
            return None
        return self.read_codec.encode(self.decode_checkpoint(checkpoint))

    def load(self, checkpoint: Encoding, read_copy: Encoding | None) -> None:
        if not self.checkpoint:  # first time: compact copies become the static storage
            self.checkpoint = _compact_copy(checkpoint)
            self.read_copy = None if read_copy is None else _compact_copy(read_copy)
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
    the stored checkpoint only if the tokens before the boundary are accepted. It keeps only its encodings; reads
    decode them at every call."""

    def __init__(self, store: CheckpointStore, state: torch.Tensor, position: int):
        self.position = position
        self.encodings = [slot.encode(state if slot.rows is None else state.index_select(0, slot.rows), position)
                          for slot in store.slots]
        self._store = store

    def read(self) -> torch.Tensor:
        return self._store._assemble_from(
            [slot.decode_read(*enc) for slot, enc in zip(self._store.slots, self.encodings, strict=True)])

    def recurrence(self) -> torch.Tensor:
        return self._store._assemble_from(
            [slot.decode_checkpoint(enc[0]) for slot, enc in zip(self._store.slots, self.encodings, strict=True)])


def _compact_copy(encoding: Encoding) -> Encoding:
    """Copies that own exactly their bytes (never a view into a larger buffer)."""
    return {name: t.clone(memory_format=torch.contiguous_format) for name, t in encoding.items()}


def _copy_into(target: Encoding, source: Encoding) -> None:
    for name, value in source.items():
        target[name].copy_(value)


def _storage_bytes(tensors: list[torch.Tensor], seen: set) -> int:
    """Bytes of the storages behind ``tensors`` (0-d ones included), each storage counted once across ``seen``."""
    total = 0
    for t in tensors:
        storage = t.untyped_storage()
        key, size = (t.device, storage.data_ptr()), storage.nbytes()
        if t.dim() and t.numel() * t.element_size() < size:  # a slice of a larger buffer (a DecodePack's): its bytes
            key, size = (t.device, t.data_ptr()), t.numel() * t.element_size()
        if key not in seen:
            seen.add(key)
            total += size
    return total


class CheckpointStore:
    def __init__(self, policy: PrecisionPolicy | list[PrecisionPolicy], seed_offset: int = 0):
        self.policies = list(policy) if isinstance(policy, (list, tuple)) else [policy]
        self.seed_offset = seed_offset  # the layer index: the ``layer`` of the stochastic-rounding noise key
        self.slots: list[_Slot] = []

    @property
    def allocated(self) -> bool:
        return len(self.slots) > 0  # not bool(list): torch 2.11 Dynamo cannot trace it

    @property
    def exact_fold(self) -> bool:
        """Folds must recompute delta-rule corrected values from raw inputs (reads saw a different state)."""
        return any(p.mode == "separated" for p in self.policies)

    def allocate(self, shape: tuple[int, ...], device: torch.device) -> None:
        batch = shape[0]
        distinct = list(dict.fromkeys(self.policies))
        if len(self.policies) > 1 and len(self.policies) != batch:  # even when they agree: a list names the rows
            raise ValueError(
                f"{len(self.policies)} per-row precision policies for a batch of {batch}: give one policy, or one "
                "per batch row"
            )
        if len(distinct) == 1:
            groups = [(distinct[0], None)]
        else:
            groups = [
                (p, torch.tensor([i for i, q in enumerate(self.policies) if q == p], device=device)) for p in distinct
            ]
        self.slots = [_Slot(policy, rows, self.seed_offset) for policy, rows in groups]
        self.load(self.stage(torch.zeros(shape, device=device), position=0))

    def _assemble_from(self, parts: list[torch.Tensor]) -> torch.Tensor:
        if len(parts) == 1:
            return parts[0]
        out = torch.empty((len(self.policies), *parts[0].shape[1:]), device=parts[0].device)
        for slot, part in zip(self.slots, parts, strict=True):
            out.index_copy_(0, slot.rows, part)
        return out

    def stage(self, state: torch.Tensor, position: int) -> StagedCheckpoint:
        """Encode ``state`` as the checkpoint at token ``position`` without storing it."""
        return StagedCheckpoint(self, state, position)

    def load(self, staged: StagedCheckpoint) -> None:
        """Store a staged checkpoint (its exact encodings: nothing is rounded again)."""
        for slot, (checkpoint, read_copy) in zip(self.slots, staged.encodings, strict=True):
            slot.load(checkpoint, read_copy)

    def read(self) -> torch.Tensor:
        """State for computing outputs on non-flush steps (float32, decoded now)."""
        return self._assemble_from([slot.decode_read() for slot in self.slots])

    def recurrence(self) -> torch.Tensor:
        """State the recurrence continues from at a flush (float32, decoded now)."""
        return self._assemble_from([slot.decode_checkpoint() for slot in self.slots])

    def kernel_operands(self) -> tuple[torch.Tensor, Encoding | None, str | None] | None:
        """``(checkpoint, read_copy, read_format)`` when the decode-step kernels may run this store: one policy for
        every row with a float32 checkpoint (updated in place by flushes) and no read copy or an fp8 / nvfp4 one
        (decoded by the replay kernels in registers). None otherwise (those policies run the torch path)."""
        if len(self.slots) != 1:
            return None
        slot = self.slots[0]
        read_format = slot.policy.read_format
        if slot.policy.checkpoint_format != "fp32" or read_format not in (None, "fp8", "nvfp4"):
            return None
        return slot.checkpoint["values"], slot.read_copy, read_format

    def repoint_checkpoint(self, values: torch.Tensor) -> None:
        """Keep the float32 checkpoint of :meth:`kernel_operands` in ``values`` from now on (a tensor already holding
        the same numbers: a ``DecodePack``'s slice, or a copy of it when the pack lets the layer go)."""
        if self.kernel_operands() is None or self.slots[0].read_copy is not None:
            raise RuntimeError("repoint_checkpoint serves one float32 checkpoint without a read copy")
        current = self.slots[0].checkpoint["values"]
        if values.shape != current.shape or values.dtype != current.dtype or values.device != current.device:
            raise ValueError(f"checkpoint must stay {tuple(current.shape)} {current.dtype} on {current.device}")
        self.slots[0].checkpoint["values"] = values

    def refresh_read_copy(self, reencode=None) -> None:
        """Re-encode the read copy from the checkpoint, after a kernel folded into the float32 checkpoint in place
        (:meth:`kernel_operands`): the encoding :meth:`write` gives. ``reencode(state, read_copy, read_format)``:
        an in-place encoder bit-identical to the codec (the Triton re-encode on CUDA); None: the codec."""
        if len(self.slots) != 1 or self.slots[0].read_copy is None:
            raise RuntimeError("refresh_read_copy serves one policy with a read copy (the kernel operands)")
        slot = self.slots[0]
        if reencode is not None:
            reencode(slot.checkpoint["values"], slot.read_copy, slot.policy.read_format)
        else:
            _copy_into(slot.read_copy, slot.encode_read_copy())

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
                    if value.dim():  # 0-d entries (nvfp4's row length) are not per batch row
                        encoding[name] = value.index_select(0, index.to(value.device))

    def _checkpoint_tensors(self) -> list[torch.Tensor]:
        tensors = []
        for slot in self.slots:
            tensors += slot.checkpoint.values()
            if slot.rows is not None:  # which batch rows the slot holds (per-row policies)
                tensors.append(slot.rows)
        return tensors

    def _read_copy_tensors(self) -> list[torch.Tensor]:
        return [t for slot in self.slots for t in (slot.read_copy or {}).values()]

    def tensors(self) -> Iterator[torch.Tensor]:
        """Every tensor the store keeps alive: the encodings of the checkpoint and read copy (values, codes, scales,
        0-d entries) and, with per-row policies, each slot's row index."""
        yield from self._checkpoint_tensors()
        yield from self._read_copy_tensors()

    def nbytes(self) -> dict[str, int]:
        """Bytes of every storage behind :meth:`tensors`: ``checkpoint`` (checkpoint encodings, row indices) and
        ``read_copy``."""
        seen: set = set()
        return {
            "checkpoint": _storage_bytes(self._checkpoint_tensors(), seen),
            "read_copy": _storage_bytes(self._read_copy_tensors(), seen),
        }
