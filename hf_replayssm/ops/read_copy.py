"""Low-precision read copies of a checkpoint, as the decode-step kernels and their references take them.

In a *separated* precision policy the recurrence runs on the float32 checkpoint while non-flush (replay) steps read
a low-precision copy of it, refreshed from the checkpoint at every flush. A read copy is the encoding dict the
:class:`~hf_replayssm.precision.store.CheckpointStore` keeps (layouts in :mod:`hf_replayssm.precision.formats`), for a
state ``[B, H, A, C]`` whose rows are its last dim ``C`` (d_state for Mamba-2, the value dim for the delta rule):

* ``fp8``: ``codes`` [B, H, A, C] uint8 (E4M3 bit patterns), ``scale`` [B, H, A, 1] float32;
* ``nvfp4``: ``packed`` [B, H, A, 8 nb] uint8 (element 2i in the low nibble of byte i), ``block_scale``
  [B, H, A, nb] uint8 (E4M3 bits), ``tensor_scale`` [B] float32, ``row`` 0-d, with nb = ceil(C / 16).

``row`` is never read here (reading a device tensor would synchronise): the row length is the state's last dim.

:func:`reencode_read_copy_ref` refreshes the copy of selected batch rows from the checkpoint (the reference of the
device op ``hf_replayssm.kernels.read_copy_encode.reencode_read_copy``).
"""

from __future__ import annotations

import math

import torch

from hf_replayssm.precision.formats import NVFP4_BLOCK, get_format

READ_FORMATS = ("fp32", "fp8", "nvfp4")
# the entries of a read copy's encoding dict per format, in the order the decode-step ops take them
READ_COPY_ENTRIES = {"fp8": ("codes", "scale"), "nvfp4": ("packed", "block_scale", "tensor_scale", "row")}


def _expect(name: str, t: torch.Tensor, shape: tuple[int, ...], dtypes: tuple[torch.dtype, ...], device) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"read copy entry {name!r} must be a tensor, got {type(t).__name__}")
    if tuple(t.shape) != shape:
        raise ValueError(f"read copy entry {name!r} must have shape {list(shape)}, got {list(t.shape)}")
    if t.dtype not in dtypes:
        raise ValueError(f"read copy entry {name!r} must be {' or '.join(map(str, dtypes))}, got {t.dtype}")
    if t.device != device:
        raise ValueError(f"read copy entry {name!r} is on {t.device}, the state on {device}")


def check_read_copy(read_copy: dict | None, read_format: str | None, state: torch.Tensor) -> str:
    """Validate a read copy against the checkpoint ``state`` [B, H, A, C]; returns the effective read format
    ("fp32" when there is no copy)."""
    if read_copy is None:
        if read_format not in (None, "fp32"):
            raise ValueError(f"read_format={read_format!r} needs a read_copy")
        return "fp32"
    if read_format not in ("fp8", "nvfp4"):
        raise ValueError(f"a read_copy needs read_format 'fp8' or 'nvfp4', got {read_format!r}")
    if not isinstance(read_copy, dict):
        raise TypeError(f"read_copy must be a dict of tensors (a store encoding), got {type(read_copy).__name__}")
    batch, outer, row = state.shape[0], tuple(state.shape[:-1]), state.shape[-1]
    keys = set(READ_COPY_ENTRIES[read_format])
    if set(read_copy) != keys:
        raise ValueError(f"a {read_format} read copy has entries {sorted(keys)}, got {sorted(read_copy)}")
    if read_format == "fp8":
        _expect("codes", read_copy["codes"], tuple(state.shape), (torch.uint8, torch.float8_e4m3fn), state.device)
        _expect("scale", read_copy["scale"], (*outer, 1), (torch.float32,), state.device)
    else:
        blocks = math.ceil(row / NVFP4_BLOCK)
        _expect("packed", read_copy["packed"], (*outer, blocks * NVFP4_BLOCK // 2), (torch.uint8,), state.device)
        _expect("block_scale", read_copy["block_scale"], (*outer, blocks), (torch.uint8, torch.float8_e4m3fn),
                state.device)
        _expect("tensor_scale", read_copy["tensor_scale"], (batch,), (torch.float32,), state.device)
    return read_format


def decode_read_copy(read_copy: dict | None, read_format: str | None, state: torch.Tensor) -> torch.Tensor:
    """The float32 state replay steps read: ``state`` itself without a copy, else the decoded copy [B, H, A, C]."""
    if check_read_copy(read_copy, read_format, state) == "fp32":
        return state
    as_bits = {name: t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t for name, t in read_copy.items()}
    decoded = get_format(read_format).decode(as_bits)
    if decoded.shape != state.shape:  # nvfp4: its ``row`` entry disagrees with the state's row length
        raise ValueError(f"read copy decodes to {list(decoded.shape)}, the state is {list(state.shape)}")
    return decoded


def check_select(select: torch.Tensor, state: torch.Tensor) -> None:
    """``select`` [B] int32 or bool, on the state's device: the batch rows whose read copy a re-encode rewrites."""
    if not isinstance(select, torch.Tensor):
        raise TypeError(f"select must be a [B] int32 or bool tensor, got {type(select).__name__}")
    if tuple(select.shape) != (state.shape[0],):
        raise ValueError(f"select must have shape [{state.shape[0]}] (one entry per batch row), got "
                         f"{list(select.shape)}")
    if select.dtype not in (torch.int32, torch.bool):
        raise ValueError(f"select must be torch.int32 or torch.bool, got {select.dtype}")
    if select.device != state.device:
        raise ValueError(f"select is on {select.device}, the state on {state.device}")


def check_reencode(state: torch.Tensor, read_copy: dict, read_format: str, select: torch.Tensor) -> str:
    """Validate the arguments of a read-copy re-encode; returns the read format ("fp8" or "nvfp4")."""
    if not isinstance(state, torch.Tensor) or state.dim() != 4:
        raise ValueError(f"state must be a [B, H, A, C] tensor, got {getattr(state, 'shape', type(state).__name__)}")
    if state.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"state must be float32 (or bf16 / fp16), got {state.dtype}")
    if read_copy is None:
        raise ValueError("re-encoding needs a read_copy (an fp8 or nvfp4 encoding dict)")
    fmt = check_read_copy(read_copy, read_format, state)
    check_select(select, state)
    return fmt


def reencode_read_copy_ref(state: torch.Tensor, read_copy: dict, read_format: str, select: torch.Tensor) -> None:
    """Re-encode, in place, the read copy of the batch rows ``b`` with ``select[b] != 0`` from the checkpoint
    ``state`` [B, H, A, C]: their entries become ``get_format(read_format).encode(state[b:b + 1])``; the other rows'
    bytes (and ``row``) are left as they are. A reference: it reads ``select`` on the host (a sync) and loops over the
    selected rows."""
    fmt = check_reencode(state, read_copy, read_format, select)
    encoder = get_format(fmt)
    names = [name for name in READ_COPY_ENTRIES[fmt] if name != "row"]  # ``row`` is the same for every batch row
    for b in torch.nonzero(select).flatten().tolist():
        encoding = encoder.encode(state[b:b + 1])
        for name in names:
            target = read_copy[name]
            if target.dtype == torch.float8_e4m3fn:
                target = target.view(torch.uint8)  # E4M3 bits either way
            target[b].copy_(encoding[name][0])
