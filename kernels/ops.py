"""The decode-step kernels as torch custom ops (shipped as ``hf_replayssm.kernels.ops``), so that ``torch.compile``
traces a decode step with ``fullgraph=True`` and CUDA graphs capture it.

Ops (namespace ``hf_replayssm``; signatures of the Triton wrappers without ``out``; shapes as in
``kernels/mamba2.py`` and ``kernels/delta_rule.py``):

* ``torch.ops.hf_replayssm.mamba2_replay_step(state, ring_x, ring_dt, ring_B, origin, count, x, dt, B, C, A, D=None,
  z=None, dt_bias=None, dt_softplus=False, buffer_len=16) -> y [B, H, P]``; writes state, ring_x, ring_dt, ring_B,
  count.
* ``torch.ops.hf_replayssm.mamba2_state_update(state, x, dt, B, C, A, D=None, z=None, dt_bias=None,
  dt_softplus=False) -> y [B, H, P]``; writes state.
* ``torch.ops.hf_replayssm.delta_replay_step(state, ring_k, ring_d, ring_g, origin, count, q, k, v, beta, g,
  buffer_len=16, use_qk_l2norm=True, scale=None) -> o [B, Hv, V]``; writes state, ring_k, ring_d, ring_g, count.
* ``torch.ops.hf_replayssm.delta_state_update(state, q, k, v, beta, g, use_qk_l2norm=True, scale=None)
  -> o [B, Hv, V]``; writes state.
* ``mamba2_replay_step_read_copy(state, ring_x, ring_dt, ring_B, origin, count, rc_values, rc_scales,
  rc_tensor_scale, rc_row, read_format, x, ...)`` and ``delta_replay_step_read_copy(state, ring_k, ring_d, ring_g,
  ring_v, ring_beta, origin, count, rc_values, ..., read_format, q, ...)``: the replay steps under separated
  precision (a float32 checkpoint, an fp8 / nvfp4 read copy that replays read, passed as its tensors, see
  :func:`read_copy_parts`); they also re-encode the copy of every row that flushed (``count`` 0 after the step), so
  a compiled step keeps the copy current without the host. The delta rule's also writes the raw v / beta records of
  the exact fold.

* ``mamba2_verify(state, ring_x, ring_dt, ring_B, origin, count, x, dt, B, C, A, D=None, z=None, dt_bias=None,
  dt_softplus=False) -> y [B, T, H, P]`` and ``delta_verify(state, ring_k, ring_d, ring_g, origin, count, q, k, v,
  beta, g, use_qk_l2norm=True, scale=None) -> o [B, T, Hv, V]`` (float32): a speculative window of T tokens per row
  from the checkpoint and the row's ``count`` records, its records written after them; the state and ``count`` are
  only read (a compiled verify forward; the commit is the host's, at the crop).

Each step op returns a fresh contiguous tensor in the dtype of x (Mamba-2) or v (delta rule), each verify op one in
float32. ``origin`` is only read.

Implementations: CUDA tensors run the Triton kernel; every other device runs the torch reference of
``hf_replayssm.ops`` (bit-identical to calling it directly). The replay references read ``origin``/``count`` on the
host, a sync that is harmless on CPU and invisible to Dynamo, which only sees the op. ``custom_op`` rather than
``triton_op``: the Triton wrappers launch their kernels directly (not through ``wrap_triton``), so Inductor treats
the op as opaque, which is all that fullgraph tracing and CUDA-graph capture need (no host sync on the CUDA path).
Triton is imported on the first CUDA call only, so importing this module needs neither CUDA nor triton.
"""

from __future__ import annotations

import torch

from hf_replayssm.ops.delta_step import delta_replay_step_ref, delta_state_update_ref
from hf_replayssm.ops.mamba2_step import mamba2_replay_step_ref, mamba2_state_update_ref

__all__ = ["TRITON_IMPLS", "delta_replay_step", "delta_state_update", "delta_verify", "mamba2_replay_step",
           "mamba2_state_update", "mamba2_verify"]

NAMESPACE = "hf_replayssm"

# Explicit schemas (checked by torch.library against mutates_args), so they do not depend on how a torch version
# infers types from `X | None` annotations. `(a!)`: written in place.
_MAMBA2_TOKEN = "Tensor x, Tensor dt, Tensor B, Tensor C, Tensor A, Tensor? D=None, Tensor? z=None, " \
                "Tensor? dt_bias=None, bool dt_softplus=False"
_DELTA_TOKEN = "Tensor q, Tensor k, Tensor v, Tensor beta, Tensor g"
_DELTA_OPTIONS = "bool use_qk_l2norm=True, float? scale=None"
# Separated precision (a float32 checkpoint and an fp8 / nvfp4 read copy the replays read): the copy's tensors in a
# fixed order (fp8: codes, scale; nvfp4: packed, block_scale, tensor_scale, row), re-encoded by the op for the rows
# that flushed.
_READ_COPY = "Tensor(f!) rc_values, Tensor(g!) rc_scales, Tensor(h!)? rc_tensor_scale, Tensor? rc_row, str read_format"
SCHEMAS = {
    "mamba2_replay_step": "(Tensor(a!) state, Tensor(b!) ring_x, Tensor(c!) ring_dt, Tensor(d!) ring_B, "
                          f"Tensor origin, Tensor(e!) count, {_MAMBA2_TOKEN}, int buffer_len=16) -> Tensor",
    "mamba2_state_update": f"(Tensor(a!) state, {_MAMBA2_TOKEN}) -> Tensor",
    "delta_replay_step": "(Tensor(a!) state, Tensor(b!) ring_k, Tensor(c!) ring_d, Tensor(d!) ring_g, "
                         f"Tensor origin, Tensor(e!) count, {_DELTA_TOKEN}, int buffer_len=16, {_DELTA_OPTIONS}) "
                         "-> Tensor",
    "delta_state_update": f"(Tensor(a!) state, {_DELTA_TOKEN}, {_DELTA_OPTIONS}) -> Tensor",
    "mamba2_replay_step_read_copy": "(Tensor(a!) state, Tensor(b!) ring_x, Tensor(c!) ring_dt, Tensor(d!) ring_B, "
                                    f"Tensor origin, Tensor(e!) count, {_READ_COPY}, {_MAMBA2_TOKEN}, "
                                    "int buffer_len=16) -> Tensor",
    "delta_replay_step_read_copy": "(Tensor(a!) state, Tensor(b!) ring_k, Tensor(c!) ring_d, Tensor(d!) ring_g, "
                                   "Tensor(i!) ring_v, Tensor(j!) ring_beta, Tensor origin, Tensor(e!) count, "
                                   f"{_READ_COPY}, {_DELTA_TOKEN}, int buffer_len=16, {_DELTA_OPTIONS}) -> Tensor",
}
SCHEMAS["mamba2_verify"] = ("(Tensor state, Tensor(b!) ring_x, Tensor(c!) ring_dt, Tensor(d!) ring_B, Tensor origin, "
                           f"Tensor count, {_MAMBA2_TOKEN}) -> Tensor")
SCHEMAS["delta_verify"] = ("(Tensor state, Tensor(b!) ring_k, Tensor(c!) ring_d, Tensor(d!) ring_g, Tensor origin, "
                          f"Tensor count, {_DELTA_TOKEN}, {_DELTA_OPTIONS}) -> Tensor")
MUTATES = {
    "mamba2_verify": ("ring_x", "ring_dt", "ring_B"),
    "delta_verify": ("ring_k", "ring_d", "ring_g"),
    "mamba2_replay_step": ("state", "ring_x", "ring_dt", "ring_B", "count"),
    "mamba2_state_update": ("state",),
    "delta_replay_step": ("state", "ring_k", "ring_d", "ring_g", "count"),
    "delta_state_update": ("state",),
    "mamba2_replay_step_read_copy": ("state", "ring_x", "ring_dt", "ring_B", "count", "rc_values", "rc_scales",
                                     "rc_tensor_scale"),
    "delta_replay_step_read_copy": ("state", "ring_k", "ring_d", "ring_g", "ring_v", "ring_beta", "count",
                                    "rc_values", "rc_scales", "rc_tensor_scale"),
}


# ---------------------------------------------------------------------------------------------------------------
# input checks: shared by the real and the fake implementations, so a bad call fails the same way eagerly and
# while tracing (host-side shape/dtype reads only, no sync)


def _expect(name: str, t: torch.Tensor | None, shape: tuple, layout: str, device: torch.device) -> None:
    if t is None:
        return
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name} must be {layout} = {tuple(shape)}, got {tuple(t.shape)}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device}, state on {device}")


def _check_positions(origin, count, batch, ring_size, buffer_len, device) -> None:
    for name, t in (("origin", origin), ("count", count)):
        _expect(name, t, (batch,), "[B]", device)
        if t.dtype != torch.int32:
            raise ValueError(f"{name} must be int32, got {t.dtype}")
    if not 1 <= buffer_len < 1 << 16:
        raise ValueError(f"buffer_len must be in [1, 65535], got {buffer_len}")
    if ring_size < max(buffer_len - 1, 1):
        raise ValueError(f"ring capacity R = {ring_size} < max(buffer_len - 1, 1) = {max(buffer_len - 1, 1)}")


def _check_mamba2(state, x, dt, B, C, A, D, z, dt_bias) -> int:
    """Token inputs against state [B, H, P, N]; returns the number of groups G."""
    if state.dim() != 4:
        raise ValueError(f"state must be [B, H, P, N], got {tuple(state.shape)}")
    batch, heads, head_dim, d_state = state.shape
    if B.dim() != 3 or B.shape[1] == 0 or heads % B.shape[1] != 0:
        raise ValueError(f"B must be [B, G, N] with H = {heads} a multiple of G, got {tuple(B.shape)}")
    groups = B.shape[1]
    dev = state.device
    for name, t, shape, layout in (
        ("x", x, (batch, heads, head_dim), "[B, H, P]"), ("dt", dt, (batch, heads), "[B, H]"),
        ("B", B, (batch, groups, d_state), "[B, G, N]"), ("C", C, (batch, groups, d_state), "[B, G, N]"),
        ("A", A, (heads,), "[H]"), ("D", D, (heads,), "[H]"), ("z", z, (batch, heads, head_dim), "[B, H, P]"),
        ("dt_bias", dt_bias, (heads,), "[H]"),
    ):
        _expect(name, t, shape, layout, dev)
    return groups


def _check_mamba2_replay(state, ring_x, ring_dt, ring_B, origin, count, x, dt, B, C, A, D, z, dt_bias,
                         buffer_len) -> None:
    groups = _check_mamba2(state, x, dt, B, C, A, D, z, dt_bias)
    batch, heads, head_dim, d_state = state.shape
    ring_size = ring_x.shape[1] if ring_x.dim() == 4 else -1
    _expect("ring_x", ring_x, (batch, ring_size, heads, head_dim), "[B, R, H, P]", state.device)
    _expect("ring_dt", ring_dt, (batch, ring_size, heads), "[B, R, H]", state.device)
    _expect("ring_B", ring_B, (batch, ring_size, groups, d_state), "[B, R, G, N]", state.device)
    _check_positions(origin, count, batch, ring_size, buffer_len, state.device)


def _check_delta(state, q, k, v, beta, g) -> None:
    if state.dim() != 4:
        raise ValueError(f"state must be [B, Hv, K, V], got {tuple(state.shape)}")
    batch, value_heads, key_dim, value_dim = state.shape
    if k.dim() != 3 or k.shape[1] == 0 or value_heads % k.shape[1] != 0:
        raise ValueError(f"k must be [B, Hk, K] with Hv = {value_heads} a multiple of Hk, got {tuple(k.shape)}")
    if g.dim() not in (2, 3):
        raise ValueError(f"g must be [B, Hv] (GDN) or [B, Hv, K] (KDA), got {tuple(g.shape)}")
    dev = state.device
    for name, t, shape, layout in (
        ("q", q, (batch, k.shape[1], key_dim), "[B, Hk, K]"), ("k", k, (batch, k.shape[1], key_dim), "[B, Hk, K]"),
        ("v", v, (batch, value_heads, value_dim), "[B, Hv, V]"), ("beta", beta, (batch, value_heads), "[B, Hv]"),
        ("g", g, (batch, value_heads, key_dim)[: g.dim()], "[B, Hv] or [B, Hv, K]"),
    ):
        _expect(name, t, shape, layout, dev)


def _check_delta_replay(state, ring_k, ring_d, ring_g, origin, count, q, k, v, beta, g, buffer_len) -> None:
    _check_delta(state, q, k, v, beta, g)
    batch, value_heads, key_dim, value_dim = state.shape
    ring_size = ring_k.shape[1] if ring_k.dim() == 4 else -1
    _expect("ring_k", ring_k, (batch, ring_size, k.shape[1], key_dim), "[B, R, Hk, K]", state.device)
    _expect("ring_d", ring_d, (batch, ring_size, value_heads, value_dim), "[B, R, Hv, V]", state.device)
    _expect("ring_g", ring_g, (batch, ring_size, *g.shape[1:]), "[B, R, *g.shape[1:]] (same gate kind as g)",
            state.device)
    _check_positions(origin, count, batch, ring_size, buffer_len, state.device)


def _fresh(like: torch.Tensor) -> torch.Tensor:
    """The op's output buffer: contiguous, like's dtype and device (a custom op may not return an input's alias;
    real and fake implementations must agree on strides)."""
    return like.new_empty(like.shape)


def read_copy_parts(read_copy: dict, read_format: str) -> tuple:
    """(rc_values, rc_scales, rc_tensor_scale, rc_row): a store's read copy as the ``*_read_copy`` ops take it (None
    for the entries the format has not)."""
    from hf_replayssm.ops.read_copy import READ_COPY_ENTRIES

    if read_format not in READ_COPY_ENTRIES:
        raise ValueError(f"read_format must be 'fp8' or 'nvfp4', got {read_format!r}")
    parts = tuple(read_copy[name] for name in READ_COPY_ENTRIES[read_format])
    return parts + (None,) * (4 - len(parts))


def _read_copy(rc_values, rc_scales, rc_tensor_scale, rc_row, read_format, state) -> dict:
    """The encoding dict back from the op's arguments, checked against the checkpoint ``state``."""
    from hf_replayssm.ops.read_copy import READ_COPY_ENTRIES, check_read_copy

    if read_format not in READ_COPY_ENTRIES:
        raise ValueError(f"read_format must be 'fp8' or 'nvfp4', got {read_format!r}")
    names = READ_COPY_ENTRIES[read_format]
    parts = (rc_values, rc_scales, rc_tensor_scale, rc_row)[: len(names)]
    if any(part is None for part in parts):
        raise ValueError(f"an {read_format} read copy needs rc_tensor_scale and rc_row")
    read_copy = dict(zip(names, parts, strict=True))
    check_read_copy(read_copy, read_format, state)
    return read_copy


def _check_raw_records(ring_v, ring_beta, ring_d) -> None:
    batch, ring_size, value_heads, value_dim = ring_d.shape
    _expect("ring_v", ring_v, (batch, ring_size, value_heads, value_dim), "[B, R, Hv, V]", ring_d.device)
    _expect("ring_beta", ring_beta, (batch, ring_size, value_heads), "[B, R, Hv]", ring_d.device)


# ---------------------------------------------------------------------------------------------------------------
# ops: the decorated function is the implementation for every device without a specific kernel (the reference)


@torch.library.custom_op(f"{NAMESPACE}::mamba2_replay_step", mutates_args=MUTATES["mamba2_replay_step"],
                         schema=SCHEMAS["mamba2_replay_step"])
def mamba2_replay_step(
    state: torch.Tensor, ring_x: torch.Tensor, ring_dt: torch.Tensor, ring_B: torch.Tensor, origin: torch.Tensor,
    count: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, B: torch.Tensor, C: torch.Tensor, A: torch.Tensor,
    D: torch.Tensor | None = None, z: torch.Tensor | None = None, dt_bias: torch.Tensor | None = None,
    dt_softplus: bool = False, buffer_len: int = 16,
) -> torch.Tensor:
    """ReplaySSM Mamba-2 decode step (replay or flush per row); semantics of ``kernels.mamba2.mamba2_replay_step``.
    Returns y [B, H, P] in x's dtype."""
    _check_mamba2_replay(state, ring_x, ring_dt, ring_B, origin, count, x, dt, B, C, A, D, z, dt_bias, buffer_len)
    return mamba2_replay_step_ref(state, ring_x, ring_dt, ring_B, origin, count, x, dt, B, C, A, D, z, dt_bias,
                                  dt_softplus, buffer_len, out=_fresh(x))


@torch.library.custom_op(f"{NAMESPACE}::mamba2_state_update", mutates_args=MUTATES["mamba2_state_update"],
                         schema=SCHEMAS["mamba2_state_update"])
def mamba2_state_update(
    state: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, B: torch.Tensor, C: torch.Tensor, A: torch.Tensor,
    D: torch.Tensor | None = None, z: torch.Tensor | None = None, dt_bias: torch.Tensor | None = None,
    dt_softplus: bool = False,
) -> torch.Tensor:
    """Standard Mamba-2 decode step (state updated in place); semantics of ``kernels.mamba2.mamba2_state_update``.
    Returns y [B, H, P] in x's dtype."""
    _check_mamba2(state, x, dt, B, C, A, D, z, dt_bias)
    return mamba2_state_update_ref(state, x, dt, B, C, A, D, z, dt_bias, dt_softplus, out=_fresh(x))


@torch.library.custom_op(f"{NAMESPACE}::delta_replay_step", mutates_args=MUTATES["delta_replay_step"],
                         schema=SCHEMAS["delta_replay_step"])
def delta_replay_step(
    state: torch.Tensor, ring_k: torch.Tensor, ring_d: torch.Tensor, ring_g: torch.Tensor, origin: torch.Tensor,
    count: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, g: torch.Tensor,
    buffer_len: int = 16, use_qk_l2norm: bool = True, scale: float | None = None,
) -> torch.Tensor:
    """ReplaySSM gated delta rule decode step (GDN: g [B, Hv]; KDA: g [B, Hv, K]); semantics of
    ``kernels.delta_rule.delta_replay_step``. Returns o [B, Hv, V] in v's dtype."""
    _check_delta_replay(state, ring_k, ring_d, ring_g, origin, count, q, k, v, beta, g, buffer_len)
    return delta_replay_step_ref(state, ring_k, ring_d, ring_g, origin, count, q, k, v, beta, g, buffer_len,
                                 use_qk_l2norm, scale, out=_fresh(v))


@torch.library.custom_op(f"{NAMESPACE}::delta_state_update", mutates_args=MUTATES["delta_state_update"],
                         schema=SCHEMAS["delta_state_update"])
def delta_state_update(
    state: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, g: torch.Tensor,
    use_qk_l2norm: bool = True, scale: float | None = None,
) -> torch.Tensor:
    """Standard gated delta rule decode step (state updated in place); semantics of
    ``kernels.delta_rule.delta_state_update``. Returns o [B, Hv, V] in v's dtype."""
    _check_delta(state, q, k, v, beta, g)
    return delta_state_update_ref(state, q, k, v, beta, g, use_qk_l2norm, scale, out=_fresh(v))


def _mamba2_read_copy_step(step, state, ring_x, ring_dt, ring_B, origin, count, rc_values, rc_scales,
                           rc_tensor_scale, rc_row, read_format, x, dt, B, C, A, D, z, dt_bias, dt_softplus,
                           buffer_len):
    """The separated Mamba-2 step with ``step`` (the kernel or its reference; a flush step's output from the copy),
    which also re-encodes the copy of the rows that flushed (``reencode_copy``)."""
    _check_mamba2_replay(state, ring_x, ring_dt, ring_B, origin, count, x, dt, B, C, A, D, z, dt_bias, buffer_len)
    read_copy = _read_copy(rc_values, rc_scales, rc_tensor_scale, rc_row, read_format, state)
    return step(state, ring_x, ring_dt, ring_B, origin, count, x, dt, B, C, A, D, z, dt_bias, dt_softplus, buffer_len,
                out=_fresh(x), read_copy=read_copy, read_format=read_format, flush_reads_copy=True, reencode_copy=True)


def _delta_read_copy_step(step, state, ring_k, ring_d, ring_g, ring_v, ring_beta, origin, count, rc_values,
                          rc_scales, rc_tensor_scale, rc_row, read_format, q, k, v, beta, g, buffer_len, use_qk_l2norm,
                          scale):
    """The separated delta-rule step (exact fold from the raw v / beta records) with ``step``, which also re-encodes
    the copy of the rows that flushed (``reencode_copy``)."""
    _check_delta_replay(state, ring_k, ring_d, ring_g, origin, count, q, k, v, beta, g, buffer_len)
    _check_raw_records(ring_v, ring_beta, ring_d)
    read_copy = _read_copy(rc_values, rc_scales, rc_tensor_scale, rc_row, read_format, state)
    o = step(state, ring_k, ring_d, ring_g, origin, count, q, k, v, beta, g, buffer_len, use_qk_l2norm, scale,
             out=_fresh(v), read_copy=read_copy, read_format=read_format, ring_v=ring_v, ring_beta=ring_beta,
             flush_reads_copy=True, reencode_copy=True)
    return o


@torch.library.custom_op(f"{NAMESPACE}::mamba2_replay_step_read_copy",
                         mutates_args=MUTATES["mamba2_replay_step_read_copy"],
                         schema=SCHEMAS["mamba2_replay_step_read_copy"])
def mamba2_replay_step_read_copy(
    state: torch.Tensor, ring_x: torch.Tensor, ring_dt: torch.Tensor, ring_B: torch.Tensor, origin: torch.Tensor,
    count: torch.Tensor, rc_values: torch.Tensor, rc_scales: torch.Tensor, rc_tensor_scale: torch.Tensor | None,
    rc_row: torch.Tensor | None, read_format: str, x: torch.Tensor, dt: torch.Tensor, B: torch.Tensor,
    C: torch.Tensor, A: torch.Tensor, D: torch.Tensor | None = None, z: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None, dt_softplus: bool = False, buffer_len: int = 16,
) -> torch.Tensor:
    """:func:`mamba2_replay_step` under separated precision: replaying rows read the read copy, and the copy of each
    row that flushed is re-encoded from its new checkpoint (``reencode_read_copy``), so the next step reads it."""
    return _mamba2_read_copy_step(mamba2_replay_step_ref, state, ring_x, ring_dt, ring_B, origin, count, rc_values,
                                  rc_scales, rc_tensor_scale, rc_row, read_format, x, dt, B, C, A, D, z, dt_bias,
                                  dt_softplus, buffer_len)


@torch.library.custom_op(f"{NAMESPACE}::delta_replay_step_read_copy",
                         mutates_args=MUTATES["delta_replay_step_read_copy"],
                         schema=SCHEMAS["delta_replay_step_read_copy"])
def delta_replay_step_read_copy(
    state: torch.Tensor, ring_k: torch.Tensor, ring_d: torch.Tensor, ring_g: torch.Tensor, ring_v: torch.Tensor,
    ring_beta: torch.Tensor, origin: torch.Tensor, count: torch.Tensor, rc_values: torch.Tensor,
    rc_scales: torch.Tensor, rc_tensor_scale: torch.Tensor | None, rc_row: torch.Tensor | None, read_format: str,
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, g: torch.Tensor, buffer_len: int = 16,
    use_qk_l2norm: bool = True, scale: float | None = None,
) -> torch.Tensor:
    """:func:`delta_replay_step` under separated precision: replaying rows read the read copy and append the raw v
    and beta, flushing rows recompute the corrected values against the float32 checkpoint (exact fold), and the copy
    of each row that flushed is re-encoded from its new checkpoint."""
    return _delta_read_copy_step(delta_replay_step_ref, state, ring_k, ring_d, ring_g, ring_v, ring_beta, origin,
                                 count, rc_values, rc_scales, rc_tensor_scale, rc_row, read_format, q, k, v, beta, g,
                                 buffer_len, use_qk_l2norm, scale)


def _window_out(like: torch.Tensor) -> torch.Tensor:
    """A verify op's output: float32 [B, T, ...] shaped like the window input ``like``."""
    return like.new_empty(like.shape, dtype=torch.float32)


def _check_verify_rings(state, rings: tuple, origin, count, window: int) -> None:
    batch, ring_size = rings[0].shape[:2]
    for ring in rings:
        if ring.shape[:2] != (batch, ring_size) or ring.device != state.device:
            raise ValueError(f"ring tensors must be [B, R, ...] = [{batch}, {ring_size}, ...] on {state.device}")
    if state.shape[0] != batch:
        raise ValueError(f"state holds {state.shape[0]} rows, the ring {batch}")
    _check_positions(origin, count, batch, ring_size, 1, state.device)
    if not 1 <= window <= ring_size:
        raise ValueError(f"a verify window of {window} tokens does not fit a ring of {ring_size} records")


@torch.library.custom_op(f"{NAMESPACE}::mamba2_verify", mutates_args=MUTATES["mamba2_verify"],
                         schema=SCHEMAS["mamba2_verify"])
def mamba2_verify(
    state: torch.Tensor, ring_x: torch.Tensor, ring_dt: torch.Tensor, ring_B: torch.Tensor, origin: torch.Tensor,
    count: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, B: torch.Tensor, C: torch.Tensor, A: torch.Tensor,
    D: torch.Tensor | None = None, z: torch.Tensor | None = None, dt_bias: torch.Tensor | None = None,
    dt_softplus: bool = False,
) -> torch.Tensor:
    """Outputs y [B, T, H, P] (float32) of a speculative window; semantics of ``ops.mamba2_verify_ref``."""
    from hf_replayssm.ops.mamba2_verify import mamba2_verify_ref

    _check_verify_rings(state, (ring_x, ring_dt, ring_B), origin, count, x.shape[1])
    return mamba2_verify_ref(state, ring_x, ring_dt, ring_B, origin, count, x, dt, B, C, A, D, z, dt_bias,
                             dt_softplus, out=_window_out(x))


@torch.library.custom_op(f"{NAMESPACE}::delta_verify", mutates_args=MUTATES["delta_verify"],
                         schema=SCHEMAS["delta_verify"])
def delta_verify(
    state: torch.Tensor, ring_k: torch.Tensor, ring_d: torch.Tensor, ring_g: torch.Tensor, origin: torch.Tensor,
    count: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, g: torch.Tensor,
    use_qk_l2norm: bool = True, scale: float | None = None,
) -> torch.Tensor:
    """Outputs o [B, T, Hv, V] (float32) of a speculative window; semantics of ``ops.delta_verify_ref``."""
    from hf_replayssm.ops.delta_verify import delta_verify_ref

    _check_verify_rings(state, (ring_k, ring_d, ring_g), origin, count, v.shape[1])
    return delta_verify_ref(state, ring_k, ring_d, ring_g, origin, count, q, k, v, beta, g, use_qk_l2norm, scale,
                            out=_window_out(v))


# ---------------------------------------------------------------------------------------------------------------
# CUDA: the Triton kernels (imported lazily: triton is optional on CPU installs)


def _in_pieces(kernel, window: int, count: torch.Tensor, out: torch.Tensor, call) -> torch.Tensor:
    """The verify kernels take at most ``MAX_WINDOW`` tokens a launch: a longer window runs in pieces, each after
    the records of the pieces before it (``count + start``, on the device)."""
    for start in range(0, window, kernel.MAX_WINDOW):
        stop = min(window, start + kernel.MAX_WINDOW)
        piece = out[:, start:stop]
        result = call(count if start == 0 else count + start, start, stop,
                      piece if piece.is_contiguous() else None)
        if result.data_ptr() != piece.data_ptr():
            piece.copy_(result)
    return out


def _mamba2_verify_triton(state, ring_x, ring_dt, ring_B, origin, count, x, dt, B, C, A, D=None, z=None,
                          dt_bias=None, dt_softplus=False):
    from . import mamba2_verify as kernel

    _check_verify_rings(state, (ring_x, ring_dt, ring_B), origin, count, x.shape[1])

    def call(piece_count, start, stop, out):
        return kernel.mamba2_verify(state, ring_x, ring_dt, ring_B, origin, piece_count, x[:, start:stop],
                                    dt[:, start:stop], B[:, start:stop], C[:, start:stop], A, D,
                                    None if z is None else z[:, start:stop], dt_bias, dt_softplus,
                                    out=torch.empty(x[:, start:stop].shape, dtype=torch.float32, device=x.device)
                                    if out is None else out)

    return _in_pieces(kernel, x.shape[1], count, _window_out(x), call)


def _delta_verify_triton(state, ring_k, ring_d, ring_g, origin, count, q, k, v, beta, g, use_qk_l2norm=True,
                         scale=None):
    from . import delta_verify as kernel

    _check_verify_rings(state, (ring_k, ring_d, ring_g), origin, count, v.shape[1])

    def call(piece_count, start, stop, out):
        return kernel.delta_verify(state, ring_k, ring_d, ring_g, origin, piece_count, q[:, start:stop],
                                   k[:, start:stop], v[:, start:stop], beta[:, start:stop], g[:, start:stop],
                                   use_qk_l2norm, scale,
                                   out=torch.empty(v[:, start:stop].shape, dtype=torch.float32, device=v.device)
                                   if out is None else out)

    return _in_pieces(kernel, v.shape[1], count, _window_out(v), call)


def _mamba2_replay_step_triton(state, ring_x, ring_dt, ring_B, origin, count, x, dt, B, C, A, D=None, z=None,
                               dt_bias=None, dt_softplus=False, buffer_len=16):
    from .mamba2 import mamba2_replay_step as kernel

    _check_mamba2_replay(state, ring_x, ring_dt, ring_B, origin, count, x, dt, B, C, A, D, z, dt_bias, buffer_len)
    return kernel(state, ring_x, ring_dt, ring_B, origin, count, x, dt, B, C, A, D, z, dt_bias, dt_softplus,
                  buffer_len, out=_fresh(x))


def _mamba2_state_update_triton(state, x, dt, B, C, A, D=None, z=None, dt_bias=None, dt_softplus=False):
    from .mamba2 import mamba2_state_update as kernel

    _check_mamba2(state, x, dt, B, C, A, D, z, dt_bias)
    return kernel(state, x, dt, B, C, A, D, z, dt_bias, dt_softplus, out=_fresh(x))


def _delta_replay_step_triton(state, ring_k, ring_d, ring_g, origin, count, q, k, v, beta, g, buffer_len=16,
                              use_qk_l2norm=True, scale=None):
    from .delta_rule import delta_replay_step as kernel

    _check_delta_replay(state, ring_k, ring_d, ring_g, origin, count, q, k, v, beta, g, buffer_len)
    return kernel(state, ring_k, ring_d, ring_g, origin, count, q, k, v, beta, g, buffer_len, use_qk_l2norm, scale,
                  out=_fresh(v))


def _delta_state_update_triton(state, q, k, v, beta, g, use_qk_l2norm=True, scale=None):
    from .delta_rule import delta_state_update as kernel

    _check_delta(state, q, k, v, beta, g)
    return kernel(state, q, k, v, beta, g, use_qk_l2norm, scale, out=_fresh(v))


def _mamba2_replay_step_read_copy_triton(state, ring_x, ring_dt, ring_B, origin, count, rc_values, rc_scales,
                                         rc_tensor_scale, rc_row, read_format, x, dt, B, C, A, D=None, z=None,
                                         dt_bias=None, dt_softplus=False, buffer_len=16):
    from .mamba2 import mamba2_replay_step as kernel

    return _mamba2_read_copy_step(kernel, state, ring_x, ring_dt, ring_B, origin, count, rc_values, rc_scales,
                                  rc_tensor_scale, rc_row, read_format, x, dt, B, C, A, D, z, dt_bias, dt_softplus,
                                  buffer_len)


def _delta_replay_step_read_copy_triton(state, ring_k, ring_d, ring_g, ring_v, ring_beta, origin, count, rc_values,
                                        rc_scales, rc_tensor_scale, rc_row, read_format, q, k, v, beta, g,
                                        buffer_len=16, use_qk_l2norm=True, scale=None):
    from .delta_rule import delta_replay_step as kernel

    return _delta_read_copy_step(kernel, state, ring_k, ring_d, ring_g, ring_v, ring_beta, origin,
                                 count, rc_values, rc_scales, rc_tensor_scale, rc_row, read_format, q, k, v, beta, g,
                                 buffer_len, use_qk_l2norm, scale)


# op -> its Triton implementation, registered for "cuda" below. Tests register them for "cpu" too (in a subprocess
# with TRITON_INTERPRET=1) to run the Triton path through the op without a GPU.
TRITON_IMPLS = {
    mamba2_replay_step: _mamba2_replay_step_triton,
    mamba2_state_update: _mamba2_state_update_triton,
    delta_replay_step: _delta_replay_step_triton,
    delta_state_update: _delta_state_update_triton,
    mamba2_replay_step_read_copy: _mamba2_replay_step_read_copy_triton,
    delta_replay_step_read_copy: _delta_replay_step_read_copy_triton,
    mamba2_verify: _mamba2_verify_triton,
    delta_verify: _delta_verify_triton,
}
for _op, _impl in TRITON_IMPLS.items():
    _op.register_kernel("cuda")(_impl)


# ---------------------------------------------------------------------------------------------------------------
# fake (meta) implementations: output shape/dtype only, for tracing


@mamba2_replay_step.register_fake
def _(state, ring_x, ring_dt, ring_B, origin, count, x, dt, B, C, A, D=None, z=None, dt_bias=None,
      dt_softplus=False, buffer_len=16):
    _check_mamba2_replay(state, ring_x, ring_dt, ring_B, origin, count, x, dt, B, C, A, D, z, dt_bias, buffer_len)
    return _fresh(x)


@mamba2_state_update.register_fake
def _(state, x, dt, B, C, A, D=None, z=None, dt_bias=None, dt_softplus=False):
    _check_mamba2(state, x, dt, B, C, A, D, z, dt_bias)
    return _fresh(x)


@delta_replay_step.register_fake
def _(state, ring_k, ring_d, ring_g, origin, count, q, k, v, beta, g, buffer_len=16, use_qk_l2norm=True,
      scale=None):
    _check_delta_replay(state, ring_k, ring_d, ring_g, origin, count, q, k, v, beta, g, buffer_len)
    return _fresh(v)


@delta_state_update.register_fake
def _(state, q, k, v, beta, g, use_qk_l2norm=True, scale=None):
    _check_delta(state, q, k, v, beta, g)
    return _fresh(v)


@mamba2_replay_step_read_copy.register_fake
def _(state, ring_x, ring_dt, ring_B, origin, count, rc_values, rc_scales, rc_tensor_scale, rc_row, read_format, x,
      dt, B, C, A, D=None, z=None, dt_bias=None, dt_softplus=False, buffer_len=16):
    _check_mamba2_replay(state, ring_x, ring_dt, ring_B, origin, count, x, dt, B, C, A, D, z, dt_bias, buffer_len)
    _read_copy(rc_values, rc_scales, rc_tensor_scale, rc_row, read_format, state)
    return _fresh(x)


@delta_replay_step_read_copy.register_fake
def _(state, ring_k, ring_d, ring_g, ring_v, ring_beta, origin, count, rc_values, rc_scales, rc_tensor_scale, rc_row,
      read_format, q, k, v, beta, g, buffer_len=16, use_qk_l2norm=True, scale=None):
    _check_delta_replay(state, ring_k, ring_d, ring_g, origin, count, q, k, v, beta, g, buffer_len)
    _check_raw_records(ring_v, ring_beta, ring_d)
    _read_copy(rc_values, rc_scales, rc_tensor_scale, rc_row, read_format, state)
    return _fresh(v)


@mamba2_verify.register_fake
def _(state, ring_x, ring_dt, ring_B, origin, count, x, dt, B, C, A, D=None, z=None, dt_bias=None,
      dt_softplus=False):
    _check_verify_rings(state, (ring_x, ring_dt, ring_B), origin, count, x.shape[1])
    return _window_out(x)


@delta_verify.register_fake
def _(state, ring_k, ring_d, ring_g, origin, count, q, k, v, beta, g, use_qk_l2norm=True, scale=None):
    _check_verify_rings(state, (ring_k, ring_d, ring_g), origin, count, v.shape[1])
    return _window_out(v)
