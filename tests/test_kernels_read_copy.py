"""Replay kernels reading a low-precision read copy of the checkpoint (separated precision: fp8 / nvfp4), Mamba-2
and gated delta rule, against their torch references and against the separated-policy semantics.

The copy is the one a ``CheckpointStore`` with a separated policy keeps. Checks, per family and format:

* kernel == torch reference (same arguments). The copy decodes in registers to exactly the values the torch decoder
  gives (E4M3 / E2M1 times power-of-two-exact scales, multiplied in the same order), so the tolerance is that of the
  fp32 kernels (2e-6 of the output scale: float32 sums in another order);
* replay rows: the output and the appended record equal, bit for bit (CPU), those of the same kernel without a copy
  whose checkpoint *is* the decoded copy; their checkpoint is never read (NaN there) nor written;
* flush rows: unchanged by the copy (it is poisoned with NaN codes for them, so reading it would show), the
  checkpoint written as without a copy, and the copy never re-encoded (its tensors are bit-identical afterwards).

Runs in subprocesses under ``TRITON_INTERPRET=1`` like ``tests/test_kernels_mamba2.py`` (tiny shapes, including
rows that are neither a power of two nor a multiple of nvfp4's 16-element block).
"""

from __future__ import annotations

import functools
import itertools
import sys

import pytest
from kernel_harness import HAS_TRITON, RecordedKernel, load_kernel_module, run_case, worker_main
from kernel_harness import assert_close as _close

CASES = ["mamba2_device", "mamba2_host_phase", "mamba2_copy_tiles", "gdn_device", "kda_device", "delta_host_phase",
         "delta_exact_fold", "delta_chunked", "delta_stream_default", "delta_exact_solve", "kda_exact_solve",
         "delta_flush_weights", "flush_reads_copy",
         "reload_token_default",
         "mamba2_reencode_copy", "delta_reencode_copy", "nvfp4_pairs", "nvfp4_every_code", "bad_read_copy"]


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
@pytest.mark.parametrize("case", CASES)
def test_read_copy_kernel(case):
    run_case(__file__, case)


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
def test_delta_read_copy_launch_config():
    """The measured launch rule (H200, Qwen3-Next shape, batch 256): scalar-gate replay launches that read a copy
    take 32 x 2 tiles, except fp8 with device positions; fp32 reads 64 x 2 (run 86); small grids halve the tile.
    Per-key gates (KDA) take 16 x 1 with device positions on the fp32 checkpoint (run 86) and 32 x 2 with a read
    copy, when their decays come from the per-head pre-launch (the default), 64 x 4 with host positions on the fp32
    checkpoint (run 81, batch 256) and 64 x 4 without the pre-launch."""
    k = load_kernel_module("delta_rule")
    shape = (256, 32, 128, 128)
    assert k.replay_launch_config(*shape) == (64, 2)
    assert k.replay_launch_config(*shape, read_format="fp32") == (64, 2)
    assert k.replay_launch_config(*shape, read_format="fp8") == (32, 2)
    assert k.replay_launch_config(*shape, read_format="nvfp4") == (32, 2)
    assert k.replay_launch_config(*shape, read_format="nvfp4", device_phase=True) == (32, 2)
    assert k.replay_launch_config(*shape, read_format="fp8", device_phase=True) == (64, 4)
    assert k.replay_launch_config(*shape, per_key_gate=True) == (64, 4)
    assert k.replay_launch_config(*shape, per_key_gate=True, device_phase=True) == (16, 1)
    assert k.replay_launch_config(*shape, per_key_gate=True, read_format="fp8") == (32, 2)
    assert k.replay_launch_config(*shape, per_key_gate=True, read_format="fp8", kda_weights=False) == (64, 4)
    assert k.replay_launch_config(*shape, per_key_gate=True, kda_weights=False) == (64, 4)
    assert k.replay_launch_config(2, 4, 128, 128, read_format="fp8") == (16, 4)  # small grid: halved to 16 first
    # the exact fold's host-phase flush-only launch: one warp, [K, 16] for scalar gates, [K, 32] for per-key (run 140)
    assert k.host_flush_launch_config(*shape, exact_fold=True) == (16, 1, True)
    assert k.host_flush_launch_config(*shape, per_key_gate=True, exact_fold=True) == (32, 1, True)
    assert k.host_flush_launch_config(*shape, exact_fold=True, exact_solve=True) == (64, 4, True)
    assert k.host_flush_launch_config(*shape, per_key_gate=True, exact_fold=True, exact_solve=True) == (32, 4, True)
    # with the solve pre-launch, a scalar gate's solved fold on [K, 32] x 4 too (offline: no spills there)
    assert k.host_flush_launch_config(*shape, exact_fold=True, exact_solve=True, solve_given=True) == (32, 4, True)


# ---------------------------------------------------------------------------------------------------------------
# worker side (runs in the subprocess)

E4M3_NAN = 0x7F  # an E4M3 (fn) NaN bit pattern: codes / block scales that must never be read
REL = 2e-6


def _mamba2_inputs(device, batch, seed, heads=4, groups=2, head_dim=24, d_state=20, ring=5):
    """bf16 tokens and records, float32 checkpoint and dt, with D, z and dt_bias (dt raw, softplus on)."""
    import torch

    gen = torch.Generator().manual_seed(seed)

    def rnd(*shape):
        return torch.randn(*shape, generator=gen).to(device)

    bf16 = torch.bfloat16
    return dict(
        state=rnd(batch, heads, head_dim, d_state),
        ring_x=rnd(batch, ring, heads, head_dim).to(bf16),
        ring_dt=(torch.rand(batch, ring, heads, generator=gen) * 0.9 + 0.05).to(device),
        ring_B=rnd(batch, ring, groups, d_state).to(bf16),
        x=rnd(batch, heads, head_dim).to(bf16), dt=rnd(batch, heads), B=rnd(batch, groups, d_state).to(bf16),
        C=rnd(batch, groups, d_state).to(bf16), A=-(torch.rand(heads, generator=gen) * 2 + 0.2).to(device),
        D=rnd(heads), z=rnd(batch, heads, head_dim).to(bf16), dt_bias=rnd(heads) * 0.5, dt_softplus=True,
    )


def _delta_inputs(device, batch, seed, per_key, key_heads=2, value_heads=4, key_dim=20, value_dim=24, ring=5):
    """bf16 raw q/k/v and ring keys, float32 checkpoint, corrected values and log decays in [-0.6, -0.02]."""
    import torch

    gen = torch.Generator().manual_seed(seed)

    def rnd(*shape):
        return torch.randn(*shape, generator=gen).to(device)

    def gate(*shape):
        return -(torch.rand(*shape, generator=gen) * 0.58 + 0.02).to(device)

    gshape = (value_heads, key_dim) if per_key else (value_heads,)
    bf16 = torch.bfloat16
    return dict(
        state=rnd(batch, value_heads, key_dim, value_dim) * 0.5,
        ring_k=rnd(batch, ring, key_heads, key_dim).to(bf16), ring_d=rnd(batch, ring, value_heads, value_dim) * 0.3,
        ring_g=gate(batch, ring, *gshape),
        q=rnd(batch, key_heads, key_dim).to(bf16), k=rnd(batch, key_heads, key_dim).to(bf16),
        v=rnd(batch, value_heads, value_dim).to(bf16),
        beta=(torch.rand(batch, value_heads, generator=gen) * 0.9 + 0.05).to(device), g=gate(batch, *gshape),
    )


class _Family:
    """Calls a family's kernel (``_replay_step``) and reference with the inputs of ``_*_inputs``."""

    def __init__(self, name):
        self.name = name
        self.module = load_kernel_module("mamba2" if name == "mamba2" else "delta_rule")
        self.rings = ("ring_x", "ring_dt", "ring_B") if name == "mamba2" else ("ring_k", "ring_d", "ring_g")
        self.reference = getattr(self.module, f"{'mamba2' if name == 'mamba2' else 'delta'}_replay_step_ref")

    def inputs(self, device, batch, seed):
        if self.name == "mamba2":
            return _mamba2_inputs(device, batch, seed)
        return _delta_inputs(device, batch, seed, per_key=self.name == "kda")

    def _call(self, fn, p, origin, count, buffer_len, **read):
        import torch

        names = ("state", *self.rings)
        token = {n: v for n, v in p.items() if n not in names}
        out_like = p["x"] if self.name == "mamba2" else p["v"]
        out = torch.empty(out_like.shape, dtype=torch.float32, device=out_like.device)  # compare before rounding
        return fn(*[p[n] for n in names], origin, count, **token, buffer_len=buffer_len, out=out, **read)

    def kernel(self, p, origin, count, buffer_len, **read):
        return self._call(self.module._replay_step, p, origin, count, buffer_len, **read)

    def ref(self, p, origin, count, buffer_len, **read):
        return self._call(self.reference, p, origin, count, buffer_len, **read)


def _store_copy(state, read_format):
    """The read copy a separated-policy CheckpointStore keeps for ``state`` (its exact encoding)."""
    from hf_replayssm.precision.policy import PrecisionPolicy
    from hf_replayssm.precision.store import CheckpointStore

    store = CheckpointStore(PrecisionPolicy("fp32", read_format=read_format))
    store.allocate(tuple(state.shape), state.device)
    store.write(state, position=0)
    return store.slots[0].read_copy, store.read()


def _poison_copy(copy, rows):
    """A copy whose batch ``rows`` decode to NaN (E4M3 NaN codes, or block scales for nvfp4)."""
    copy = {n: t.clone() for n, t in copy.items()}
    target = "codes" if "codes" in copy else "block_scale"
    copy[target][rows] = E4M3_NAN
    return copy


def _clone(p):
    return {n: (v.clone() if hasattr(v, "clone") else v) for n, v in p.items()}


def _positions(origin, count, device):
    import torch

    if isinstance(count, int):
        return origin, count
    return (torch.tensor(origin, dtype=torch.int32, device=device), torch.tensor(count, dtype=torch.int32,
                                                                                    device=device))


def _reordered_tol(y):
    """Mamba-2's replay launches take a copy's product with C as stored (nvfp4 block by block, ``nvfp4_blocks_dot``;
    fp8 with the row scale applied to the sum, not to each element) where its other launches decode the tile first:
    the same terms summed in another order, equal within float32 rounding of the outputs' scale (measured: 1.9e-6 at
    a scale of 25)."""
    return dict(rtol=1e-6, atol=1e-6 * max(1.0, y.abs().max().item()))


def _check(family, device, read_format, origins, counts, buffer_len, seed, launch=None, batch=3):
    """One launch with a read copy against (a) the reference with the copy, (b) the kernel without a copy whose
    checkpoint is the decoded copy on replay rows. ``origins``/``counts``: per-row lists (device phase) or ints.
    ``launch``: overrides for the kernel with the copy (then (b) holds within float32 rounding, not bit for bit).
    ``batch``: the rows of host positions."""
    import torch

    batch = len(counts) if isinstance(counts, list) else batch
    row_counts = counts if isinstance(counts, list) else [counts] * batch
    replay = torch.tensor([c + 1 < buffer_len for c in row_counts], device=device)
    p = family.inputs(device, batch, seed)
    copy, decoded = _store_copy(p["state"], read_format)
    assert not torch.equal(decoded, p["state"])  # the copy is lossy: reading the checkpoint instead would show
    # Replay rows never read the checkpoint, flush rows never read the copy: poison both.
    p["state"][replay] = float("nan")
    copy = _poison_copy(copy, ~replay)
    copy_before = {n: t.clone() for n, t in copy.items()}
    read = dict(read_copy=copy, read_format=read_format)

    got, want = _clone(p), _clone(p)
    pos_got, pos_want = _positions(origins, counts, device), _positions(origins, counts, device)
    if isinstance(counts, int):  # the reference with the host positions as per-row tensors
        pos_want = _positions([origins] * batch, [counts] * batch, device)
    y = family.kernel(got, *pos_got, buffer_len, **read, **(launch or {}))
    y_ref = family.ref(want, *pos_want, buffer_len, **read)
    print(f" {family.name} {read_format}: origins={origins} counts={counts}")
    _close("y vs reference", y, y_ref, REL)
    torch.testing.assert_close(got["state"], want["state"], rtol=0, atol=1e-6 * max(1.0, decoded.abs().max().item()),
                               equal_nan=True)
    for name in family.rings:
        torch.testing.assert_close(got[name], want[name], rtol=2e-6, atol=2e-6)
    if not isinstance(counts, int):
        assert torch.equal(pos_got[1], pos_want[1]), (pos_got[1], pos_want[1])
    for name, t in copy.items():  # never re-encoded (the caller refreshes it after a flush)
        assert torch.equal(t, copy_before[name]), name

    # Separated semantics: replay rows == the same kernel reading the decoded copy as its checkpoint; flush rows ==
    # the kernel reading the fp32 checkpoint.
    plain = _clone(p)
    plain["state"] = torch.where(replay[:, None, None, None], decoded, p["state"])
    y_plain = family.kernel(plain, *_positions(origins, counts, device), buffer_len)
    # the same float32 operations on the same values; a GPU compiler may contract FMAs, a launch override regroup
    reordered = family.name == "mamba2"  # its replay launches take the copy as stored (both formats)
    exact = device == "cpu" and not launch and not reordered
    tol = dict(rtol=0, atol=0) if exact else _reordered_tol(y_plain) if reordered else dict(rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(y, y_plain, **tol)
    for name in family.rings:
        torch.testing.assert_close(got[name], plain[name], **tol)
    flush = ~replay
    torch.testing.assert_close(got["state"][flush], plain["state"][flush], **tol)
    assert torch.isnan(got["state"][replay]).all()  # replay rows: the checkpoint is not written
    assert torch.isfinite(y).all()
    if flush.any():
        assert torch.isfinite(got["state"][flush]).all()


def case_mamba2_device(_, device):
    """Per-row positions (the fused kernel): replay and flush rows in one launch, ring wrap-around."""
    _check(_Family("mamba2"), device, "fp8", origins=[4, 0, 2, 1], counts=[3, 5, 0, 4], buffer_len=6, seed=1)
    _check(_Family("mamba2"), device, "nvfp4", origins=[1, 3, 0, 4], counts=[5, 2, 4, 0], buffer_len=6, seed=2)


def case_mamba2_host_phase(_, device):
    """Host-int positions: the replay-only kernel reads the copy, the flush-only kernel ignores it (NaN-poisoned)."""
    family = _Family("mamba2")
    for read_format in ("fp8", "nvfp4"):
        for count in (3, 5):  # replay-only with records, flush-only
            _check(family, device, read_format, origins=(2 * count + 1) % 5, counts=count, buffer_len=6, seed=count)


def case_mamba2_copy_tiles(_, device):
    """The launches large batches take by default with a copy (one program per head, ``replay_launch_config``; the
    records' coefficients from the pre-launch, ``_weights``), forced on these small shapes: host positions (a replay
    with records, from none, and the flush step as the cache runs it is in ``case_flush_reads_copy``) and device
    positions (a split step, rows in mixed phases), both formats, each against the reference and the decoded-copy
    semantics. On CUDA also at a batch whose defaults are those (batch x heads >= 2048)."""
    family = _Family("mamba2")
    head = dict(block_p=32, num_warps=1)  # head_dim 24: the whole head in one program
    for launch in (dict(_weights=True), dict(_config=head), dict(_config=head, _weights=True)):
        for read_format in ("fp8", "nvfp4"):
            for count in (0, 3):
                _check(family, device, read_format, origins=(2 * count + 1) % 5, counts=count, buffer_len=6,
                       seed=count, launch=launch)
            _check(family, device, read_format, origins=[4, 0, 2, 1], counts=[3, 5, 0, 4], buffer_len=6, seed=7,
                   launch=dict(launch, _split=True))
    if device == "cuda":
        k = family.module
        assert k.replay_launch_config(512, 4, 24, 20, "fp8")["num_warps"] == 1
        origins, counts = [b % 5 for b in range(512)], [(3 * b) % 6 for b in range(512)]
        for read_format in ("fp8", "nvfp4"):
            _check(family, device, read_format, origins=origins, counts=counts, buffer_len=6, seed=8)
            _check(family, device, read_format, origins=1, counts=3, buffer_len=6, seed=9, batch=512)


def case_gdn_device(_, device):
    _check(_Family("gdn"), device, "fp8", origins=[4, 0, 2], counts=[3, 5, 1], buffer_len=6, seed=3)


def case_kda_device(_, device):
    _check(_Family("kda"), device, "nvfp4", origins=[1, 4, 0], counts=[2, 5, 4], buffer_len=6, seed=5)


def case_delta_host_phase(_, device):
    for name, read_format in (("gdn", "nvfp4"), ("kda", "fp8")):
        for count in (2, 5):  # replay-only with records, flush-only
            _check(_Family(name), device, read_format, origins=(3 * count + 2) % 5, counts=count, buffer_len=6,
                   seed=10 + count)


def case_delta_chunked(_, device):
    """``_chunk_k`` with a read copy (the replay-only launches stream the copy K rows at a time: fp8 codes with the row
    scales folded into q and k, nvfp4 decoded per chunk, both nibble loads): GDN and KDA, host positions replaying
    and flushing, a split step with rows in both phases (K = 20: the last chunk is masked); fp8 also with the codes
    loaded 4 to a vector (``_replay_code_vector``); chunks of 4 rows and the records' values loaded after the stream
    (``_late_records``, the default for these launches), fp8 and both nvfp4 loads; chunks of 8 with the records'
    values loaded first (``_late_records=False``)."""
    early, late = dict(_late_records=False), dict(_late_records=True)
    for name, read_format, extra in (("gdn", "fp8", early), ("kda", "fp8", early), ("gdn", "nvfp4", early),
                                     ("kda", "nvfp4", dict(_nvfp4_pairs=False, **early)),
                                     ("kda", "fp8", dict(_replay_code_vector=4)),
                                     ("gdn", "fp8", dict(_replay_code_vector=4)),
                                     ("gdn", "fp8", late), ("kda", "nvfp4", late),
                                     ("gdn", "nvfp4", dict(_nvfp4_pairs=False, **late))):
        family = _Family(name)
        chunk = 4 if extra.get("_late_records") else 8
        for count in (2, 5):
            _check(family, device, read_format, origins=(3 * count + 2) % 5, counts=count, buffer_len=6,
                   seed=20 + count, launch=dict(_chunk_k=chunk, **extra))
        _check(family, device, read_format, origins=[4, 0, 2], counts=[3, 5, 1], buffer_len=6, seed=30,
               launch=dict(_chunk_k=16, _split=True, **extra))


def case_delta_stream_default(_, device):
    """From ``READ_COPY_STREAM_MIN_BATCH`` rows (lowered here) the replay-only launches stream a read copy by default
    (``read_copy_stream_config``): GDN and KDA, fp8 and nvfp4, with host positions a streamed replay-only launch,
    with device positions a split step whose replay launch streams and whose flush launch takes its own tile
    (``read_copy_split_flush_config``); each bit for bit the explicit call and against the reference (``_check``:
    both host phases, mixed phases). A forced tile and ``_split=False`` keep the whole tile."""
    import torch

    families = {name: _Family(name) for name in ("gdn", "kda")}
    module = families["gdn"].module  # (one module: both families)
    saved = module.READ_COPY_STREAM_MIN_BATCH, module._delta_replay_step_kernel
    recorded = module._delta_replay_step_kernel = RecordedKernel(saved[1])
    try:
        module.READ_COPY_STREAM_MIN_BATCH = 1
        for fmt in ("fp8", "nvfp4"):
            for device_phase in (False, True):
                # a whole head of V up to 128 (run 185), KDA's nvfp4 copy in chunks of 8 (run 212)
                chunk = 8 if fmt == "nvfp4" else 16
                assert module.read_copy_stream_config(3, 20, False, fmt, device_phase) == (128, 1, 16)
                assert module.read_copy_stream_config(3, 20, False, fmt, device_phase, value_dim=24) == (32, 1, 16)
                assert module.read_copy_stream_config(3, 20, False, fmt, device_phase, value_dim=256) == (128, 1, 16)
                assert module.read_copy_stream_config(3, 20, True, fmt, device_phase) == (128, 1, chunk)
                assert module.read_copy_stream_config(3, 20, True, fmt, device_phase, value_dim=8) == (16, 1, chunk)
            assert module.read_copy_stream_config(3, 256, False, fmt) is None  # past 128 key channels
        # (the same tiles for both families since run 201)
        assert module.read_copy_split_flush_config(24) == (32, 1)
        assert module.read_copy_split_flush_config(8) == (16, 1)
        assert module.read_copy_split_flush_config(128, "nvfp4") == (16, 1)
        assert module.read_copy_split_flush_config(128, "fp8") == (64, 2)
        assert module.read_copy_split_flush_config(24, "nvfp4") == (16, 1)
        assert module.read_copy_split_flush_config(24, "fp8") == (32, 1)
        default = dict(_split="auto")  # the default launch (a launch argument: compared within float32 rounding)
        for name, fmt in (("gdn", "fp8"), ("gdn", "nvfp4"), ("kda", "fp8"), ("kda", "nvfp4")):
            for count in (2, 5):
                _check(families[name], device, fmt, origins=(3 * count + 2) % 5, counts=count, buffer_len=6,
                       seed=40 + count, launch=default)
            _check(families[name], device, fmt, origins=[4, 0, 2], counts=[3, 5, 1], buffer_len=6, seed=45,
                   launch=default)

        def launched(origin, count, fmt="fp8", family="gdn", **kw):
            family = families[family]
            p = family.inputs(device, 3, 7)
            copy, _ = _store_copy(p["state"], fmt)
            recorded.launches.clear()
            pos = _positions(origin, count, device)
            y = family.kernel(p, *pos, 6, read_copy=copy, read_format=fmt, **kw)
            return y, p, pos, [(kw["PHASE"], kw["CHUNK_K"], kw["BLOCK_V"], kw["num_warps"], kw["LATE_RECORDS"])
                               for kw in recorded.launches]

        host, mixed = (1, 2), ([4, 0, 2], [3, 5, 1])
        split = dict(_split=True, _flush_config=(32, 1))
        # (the streamed launches load the records' values after the stream: LATE_RECORDS, run 212)
        for name, fmt, (origin, count), want, explicit in (
                ("gdn", "fp8", host, [(1, 16, 32, 1, True)], dict(_block_v=32, _num_warps=1, _chunk_k=16)),
                ("gdn", "nvfp4", host, [(1, 16, 32, 1, True)], dict(_block_v=32, _num_warps=1, _chunk_k=16)),
                ("kda", "fp8", host, [(1, 16, 32, 1, True)], dict(_block_v=32, _num_warps=1, _chunk_k=16)),
                ("gdn", "fp8", mixed, [(3, 0, 32, 1, False), (4, 16, 32, 1, True)],
                 dict(_block_v=32, _num_warps=1, _chunk_k=16, **split)),
                ("gdn", "nvfp4", mixed, [(3, 0, 16, 1, False), (4, 16, 32, 1, True)],
                 dict(_block_v=32, _num_warps=1, _chunk_k=16, _split=True, _flush_config=(16, 1))),
                ("kda", "nvfp4", host, [(1, 8, 32, 1, True)], dict(_block_v=32, _num_warps=1, _chunk_k=8)),
                ("kda", "fp8", mixed, [(3, 0, 32, 1, False), (4, 16, 32, 1, True)],
                 dict(_block_v=32, _num_warps=1, _chunk_k=16, **split)),
                ("kda", "nvfp4", mixed, [(3, 0, 16, 1, False), (4, 8, 32, 1, True)],
                 dict(_block_v=32, _num_warps=1, _chunk_k=8, _split=True, _flush_config=(16, 1)))):
            y, p, pos, launches = launched(origin, count, fmt, name)
            assert launches == want, (name, fmt, launches)
            # the explicit tile (late records by default): same bits; with the records loaded first the same values
            # up to float32 rounding (on the GPU the compiler may contract the products differently)
            for extra in ({}, dict(_late_records=False)):
                y_explicit, p_explicit, pos_explicit, explicit_launches = launched(origin, count, fmt, name,
                                                                                   **explicit, **extra)
                assert [launch[-1] for launch in explicit_launches] == [
                    launch[-1] and not extra for launch in want], (name, fmt, extra)
                same = torch.equal if not extra else functools.partial(torch.allclose, rtol=1e-5, atol=1e-6)
                assert same(y, y_explicit), (name, fmt, extra, (y - y_explicit).abs().max().item())
                for ring in families[name].rings:
                    assert same(p[ring], p_explicit[ring]), ring
                assert torch.equal(p["state"], p_explicit["state"])
                if not isinstance(count, int):
                    assert torch.equal(pos[1], pos_explicit[1])
        for name, tile in (("gdn", 16), ("kda", 32)):  # the host flush with the exact fold: its own one-warp tile
            p = families[name].inputs(device, 3, 8)
            p["ring_v"], p["ring_beta"] = _raw_rings(p)
            recorded.launches.clear()
            families[name].kernel(p, 2, 5, 6)
            assert [(kw["PHASE"], kw["BLOCK_V"], kw["num_warps"]) for kw in recorded.launches] == [(2, tile, 1)], (
                name, recorded.launches)
        # the host flush giving its outputs from an fp8 copy loads the codes 4 to a vector (_flush_code_vector);
        # nothing else asks for it
        for fmt, option, want in (("fp8", True, 4), ("fp8", False, 0), ("nvfp4", True, 0)):
            p = families["gdn"].inputs(device, 3, 8)
            p["ring_v"], p["ring_beta"] = _raw_rings(p)
            copy, _ = _store_copy(p["state"], fmt)
            recorded.launches.clear()
            families["gdn"].kernel(p, 2, 5, 6, read_copy=copy, read_format=fmt, flush_reads_copy=option)
            assert [kw["CODE_VECTOR"] for kw in recorded.launches] == [want], (fmt, option, recorded.launches)
        # the streamed replay launches load an fp8 copy's codes at the compiler's widest vector unless asked
        # (_replay_code_vector); the split step's flush launch 4 to a vector (_split_flush_code_vector)
        # (when it reads the copy: flush_reads_copy)
        for fmt, option, outputs, (origin, count), want in (
                ("fp8", None, False, host, [0]), ("fp8", 4, False, host, [4]), ("nvfp4", 4, False, host, [0]),
                ("fp8", None, False, mixed, [0, 0]), ("fp8", 4, False, mixed, [0, 4]),
                ("fp8", None, True, mixed, [4, 0]), ("fp8", 4, True, mixed, [4, 4])):
            launch = dict(flush_reads_copy=outputs, **({} if option is None else dict(_replay_code_vector=option)))
            phases = [c[0] for c in launched(origin, count, fmt, **launch)[3]]
            assert phases == ([1] if (origin, count) == host else [3, 4]), phases
            assert [kw["CODE_VECTOR"] for kw in recorded.launches] == want, (fmt, option, recorded.launches)
        assert launched(*host, _block_v=16)[3][0][:3] == (1, 0, 16)  # a forced tile: the whole tile
        assert launched(*mixed, _split=False)[3][0][:2] == (0, 0)  # one fused launch
        # an explicit flush tile wins over the streamed copy's
        assert launched(*mixed, _flush_config=(16, 2))[3] == [(3, 0, 16, 2, False), (4, 16, 32, 1, True)]
    finally:
        module.READ_COPY_STREAM_MIN_BATCH, module._delta_replay_step_kernel = saved


def case_flush_reads_copy(_, device):
    """flush_reads_copy (the separated policy's flush step): a flushing row's output is the replay output from the
    copy, its checkpoint folded as without the option; kernel == reference, mixed phases on device positions and
    every row flushing on host positions, every family (the delta rule with the exact fold's raw records); flush
    rows' outputs differ from the default's (from the new state), replay rows', checkpoints, rings and counts do
    not. Mamba-2 gives a flushing row's output by a replay launch and folds it by a plain flush launch (the default
    at host positions and for nvfp4 split steps; ``_flush_outputs_launch=True`` for fp8 ones); its one flush launch
    reading both (``_flush_outputs_launch=False``), taking the copy's product with C as stored or decoding the whole
    copy tile (``_flush_copy_product=False``), gives the same outputs within float32 reordering, the rest bit for
    bit (the checkpoint within 1e-6 on a GPU)."""
    import torch

    for name, read_format in (("mamba2", "fp8"), ("mamba2", "nvfp4"), ("gdn", "fp8"), ("kda", "nvfp4")):
        family = _Family(name)
        same_fold = dict(rtol=0, atol=0) if device == "cpu" else dict(rtol=1e-6, atol=1e-6)
        p = family.inputs(device, 4, seed=40)
        if name != "mamba2":
            p["ring_v"], p["ring_beta"] = _raw_rings(p)
        copy, _ = _store_copy(p["state"], read_format)
        counts = [5, 2, 4, 5]
        flush = torch.tensor([c + 1 >= 6 for c in counts], device=device)
        runs = {}
        arms = [("kernel", family.kernel, True, {}), ("ref", family.ref, True, {}),
                ("default", family.kernel, False, {})]
        # the other launch layout: Mamba-2's default is two launches (flushing rows, then replaying rows), the
        # delta rule's one fused launch
        arms.append(("other", family.kernel, True, {"_split": name != "mamba2"}))
        if name == "mamba2":  # the split step's flush launch decoding the whole copy tile; the flushing rows'
            # outputs by the replay launch (which runs them too) and their fold by a plain flush launch
            arms.append(("one launch", family.kernel, True, {"_flush_outputs_launch": False}))
            arms.append(("two launches", family.kernel, True, {"_flush_outputs_launch": True}))
            arms.append(("decoded", family.kernel, True, {"_flush_outputs_launch": False,
                                                          "_flush_copy_product": False}))
        if name != "mamba2" and read_format == "fp8":  # the split step's flush launch loading the codes at the
            # compiler's widest vector (its default: 4 to a vector)
            arms.append(("codes 16 to a vector", family.kernel, True, {"_split": True, "_split_flush_code_vector": 0}))
            # its default tile at real shapes (GDN and KDA: [K, 64] x 2; here past the head's V, masked)
            arms.append(("flush tile 64 x 2", family.kernel, True, {"_split": True, "_flush_config": (64, 2)}))
        if name != "mamba2":  # the exact fold holding the token through the records' loop (its default reads it
            # again after the loop; same values)
            arms.append(("token held", family.kernel, True, {"_reload_token": False}))
            arms.append(("token held, split", family.kernel, True, {"_split": True, "_reload_token": False}))
        if name == "kda":  # the split step's flush launch taking the records' weights from the pre-launch
            arms.append(("flush weights, split", family.kernel, True, {"_split": True, "_flush_weights": True}))
        for label, fn, option, launch in arms:
            q = _clone(p)
            raw = {n: q.pop(n) for n in ("ring_v", "ring_beta") if n in q}
            origin, count = _positions([1, 4, 0, 3], counts, device)
            y = fn(q, origin, count, 6, read_copy={n: t.clone() for n, t in copy.items()}, read_format=read_format,
                   flush_reads_copy=option, **raw, **launch)
            runs[label] = (y, q, count)
        print(f" {name} {read_format} flush_reads_copy, flush rows {flush.tolist()}")
        (y, got, count), (y_ref, want, count_ref), (y_def, default, count_def) = (runs[k] for k in
                                                                                  ("kernel", "ref", "default"))
        if "other" in runs:  # the fused step equals the split one (constexpr variants: 1e-6 on a GPU)
            y_split, split, count_split = runs["other"]
            exact = dict(rtol=0, atol=0) if device == "cpu" else dict(rtol=1e-6, atol=1e-6)
            torch.testing.assert_close(y_split, y, **(_reordered_tol(y) if name == "mamba2" else exact))
            assert torch.equal(count_split, count)
            for n in ("state", *family.rings):
                torch.testing.assert_close(split[n], got[n], **exact)
        # the same terms summed in another order; the rest bit for bit (the checkpoint within 1e-6 on a GPU: another
        # compiled flush launch may contract FMAs differently)
        for arm in sorted(runs.keys() - {"kernel", "ref", "default", "other"}):  # every other arm
            y_arm, arm_got, count_arm = runs[arm]
            torch.testing.assert_close(y_arm, y, **_reordered_tol(y))
            assert torch.equal(count_arm, count), arm
            torch.testing.assert_close(arm_got["state"], got["state"], **same_fold)
            for n in family.rings:
                assert torch.equal(arm_got[n], got[n]), (arm, n)
        _close("y vs reference", y, y_ref, REL)
        assert torch.equal(count, count_ref) and torch.equal(count, count_def)
        # the option is a constexpr: on a GPU the two compiled kernels may contract FMAs differently
        same = dict(rtol=0, atol=0) if device == "cpu" else dict(rtol=1e-6, atol=1e-6)
        for n in ("state", *family.rings):
            torch.testing.assert_close(got[n], want[n], rtol=2e-6, atol=2e-6)
            torch.testing.assert_close(got[n], default[n], **same)
        torch.testing.assert_close(y[~flush], y_def[~flush], **same)
        assert (y[flush] - y_def[flush]).abs().max() > 1e-4  # the copy's rounding shows in the flush outputs

        # host positions (every row at its last buffered position: the flush-only launch, which then reads the copy
        # for the outputs and the checkpoint for the fold; eager decoding's flush step): against the reference with
        # the same positions per row, and against the launch without the option
        runs = {}
        host_arms = [("kernel", family.kernel, True, {}), ("ref", family.ref, True, {}),
                     ("default", family.kernel, False, {})]
        if name != "mamba2" and read_format == "fp8":  # the codes at the compiler's widest vector (16 to a thread)
            host_arms.append(("codes 16 to a vector", family.kernel, True, {"_flush_code_vector": 0}))
        if name != "mamba2":  # the exact fold holding the token through the records' loop, and reading it again
            # after the loop (the default but for GDN's nvfp4 host step; same values), with the outputs from the copy
            # and (plain: compared with "default") from the new checkpoint
            for reload in (False, True):
                host_arms.append((f"token reload {reload}", family.kernel, True, {"_reload_token": reload}))
                host_arms.append((f"token reload {reload}, plain", family.kernel, False, {"_reload_token": reload}))
        if name == "mamba2":  # the flush-only launch decoding the whole copy tile; the outputs by a replay-only
            # launch appending nothing, then the plain flush storing none
            host_arms.append(("one launch", family.kernel, True, {"_flush_outputs_launch": False}))
            host_arms.append(("decoded", family.kernel, True, {"_flush_outputs_launch": False,
                                                               "_flush_copy_product": False}))
        for label, fn, option, launch in host_arms:
            q = _clone(p)
            raw = {n: q.pop(n) for n in ("ring_v", "ring_beta") if n in q}
            positions = (3, 5) if label != "ref" else _positions([3] * 4, [5] * 4, device)
            runs[label] = (fn(q, *positions, 6, read_copy={n: t.clone() for n, t in copy.items()},
                              read_format=read_format, flush_reads_copy=option, **raw, **launch), q)
        print(f" {name} {read_format} flush_reads_copy, host positions")
        (y, got), (y_ref, want), (y_def, default) = runs["kernel"], runs["ref"], runs["default"]
        for arm in sorted(runs.keys() - {"kernel", "ref", "default"}):  # every other arm, against the launch with
            # the same outputs (from the copy, or plain: from the new checkpoint)
            y_arm, arm_got = runs[arm]
            y_same, got_same = runs["default"] if arm.endswith("plain") else (y, got)
            torch.testing.assert_close(y_arm, y_same, **_reordered_tol(y_same))
            torch.testing.assert_close(arm_got["state"], got_same["state"], **same_fold)
            for n in family.rings:
                assert torch.equal(arm_got[n], got_same[n]), (arm, n)
        _close("y vs reference (host)", y, y_ref, REL)
        for n in ("state", *family.rings):
            torch.testing.assert_close(got[n], want[n], rtol=2e-6, atol=2e-6)
            torch.testing.assert_close(got[n], default[n], **same)
        assert (y - y_def).abs().max() > 1e-4


def case_reload_token_default(_, device):
    """The exact fold's flush reads the token again after the records' loop by default (``_reload_token="auto"``),
    except in a host-phase GDN step reading an nvfp4 copy (slower there on the H200, run 204): the constexpr each
    flushing launch compiles with, GDN and KDA, fp8 and nvfp4, host positions (every row flushing) and device
    positions in mixed phases (one fused launch; split: the flush launch)."""
    for name, read_format in itertools.product(("gdn", "kda"), ("fp8", "nvfp4")):
        family = _Family(name)
        module = family.module
        saved = module._delta_replay_step_kernel
        recorded = module._delta_replay_step_kernel = RecordedKernel(saved)
        try:
            for positions, launch in (((3, 5), {}), (([1, 4, 0, 3], [5, 2, 4, 5]), {}),
                                      (([1, 4, 0, 3], [5, 2, 4, 5]), {"_split": True})):
                p = family.inputs(device, 4, seed=50)
                p["ring_v"], p["ring_beta"] = _raw_rings(p)
                copy, _ = _store_copy(p["state"], read_format)
                raw = {n: p.pop(n) for n in ("ring_v", "ring_beta")}
                host = isinstance(positions[1], int)
                first = recorded.calls
                family.kernel(p, *_positions(*positions, device), 6, read_copy=copy, read_format=read_format,
                              flush_reads_copy=True, **raw, **launch)
                flushing = [kw for kw in recorded.launches[first:] if kw["PHASE"] in (0, 2, 3)]
                assert flushing, (name, read_format, positions, launch)
                want = not (name == "gdn" and read_format == "nvfp4" and host)
                assert all(kw["RELOAD_TOKEN"] == want for kw in flushing), (name, read_format, host, launch,
                                                                            flushing)
        finally:
            module._delta_replay_step_kernel = saved
        print(f" {name} {read_format}: token reloaded but on GDN's nvfp4 host step")


def case_mamba2_reencode_copy(_, device):
    """``reencode_copy`` (Mamba-2): a flushing row's copy is re-encoded from its new checkpoint in the same call, the
    copy's bytes equal to the re-encode kernel's (and the codec's) on the new checkpoint, the other rows' bytes
    untouched, outputs / checkpoints / rings / counts those of the call without it. By the re-encode launch after
    the step (host positions; device positions: the rows whose count came back to 0), fp8 and nvfp4, and fp8
    copies written by the flush from its registers (``_encode_in_flush``: host positions' plain flush beside the
    outputs by the replay launch (the default there) and their one flush launch, a split step's flush launch, the
    fused launch; host positions with the re-encode launch instead); the reference the same. nvfp4: the flush
    launches hand the re-encode each row's amax (``_flush_amax``, default) on every flush launch (host
    flush-only, split, fused, the split step's device-sized flush grid without ``flush_reads_copy``), and the
    re-encode's own amax pass (off). Row length 20 (not a power of two: masked columns) and 32."""
    import torch


    family = _Family("mamba2")
    in_flush = {"_encode_in_flush": True}
    for read_format, d_state, host, launch in (
            ("fp8", 20, True, {}), ("fp8", 20, True, in_flush), ("fp8", 32, True, in_flush), ("nvfp4", 20, True, {}),
            ("fp8", 20, True, {"_flush_outputs_launch": False, **in_flush}),
            ("fp8", 32, True, {"_encode_in_flush": False}),
            ("fp8", 32, False, {"_flush_outputs_launch": True}),
            ("fp8", 20, False, {}), ("fp8", 20, False, in_flush), ("fp8", 32, False, {"_split": False, **in_flush}),
            ("nvfp4", 32, False, {}), ("nvfp4", 20, True, {"_flush_amax": False}),
            ("nvfp4", 32, False, {"_split": False}),
            ("nvfp4", 32, False, {"flush_reads_copy": False, "_flush_grid": "device"}),
            ("nvfp4", 20, False, {"flush_reads_copy": False, "_flush_grid": "batch"})):
        launch = dict(launch)
        flush_reads_copy = launch.pop("flush_reads_copy", True)
        p = _mamba2_inputs(device, 4, seed=70 + d_state, d_state=d_state)
        copy, _ = _store_copy(p["state"], read_format)
        counts = [5] * 4 if host else [5, 2, 5, 4]
        runs = {}
        for label, fn, option in (("kernel", family.kernel, True), ("ref", family.ref, True),
                                  ("plain", family.kernel, False)):
            q, c = _clone(p), {n: t.clone() for n, t in copy.items()}
            positions = _reencode_case_positions(host, label, counts, device)
            y = fn(q, *positions, 6, read_copy=c, read_format=read_format, flush_reads_copy=flush_reads_copy,
                   reencode_copy=option, **(launch if label != "ref" else {}))
            runs[label] = (y, q, c, positions[1])
        flushed = torch.tensor([n + 1 >= 6 for n in counts], device=device)
        print(f" {read_format} N={d_state} {'host' if host else 'device'} positions {launch}, flush_reads_copy "
              f"{flush_reads_copy}, flushed {flushed.tolist()}")
        _check_step_reencoded(family, runs, copy, flushed, read_format, host, device)


def _reencode_case_positions(host, label, counts, device):
    """The ``*_reencode_copy`` cases' positions: host ints (origin 3, count 5: every row flushes) for the kernel
    calls with host positions, else per-row tensors (the reference takes the host case's as tensors)."""
    if host and label != "ref":
        return 3, 5
    return _positions([3, 1, 0, 2] if not host else [3] * 4, counts, device)


def _check_step_reencoded(family, runs, copy, flushed, read_format, host, device):
    """The ``*_reencode_copy`` cases' checks on ``runs`` {"kernel", "ref", "plain": (y, inputs after, copy after,
    count)} of one step from ``copy`` with the option (kernel, reference) and without it (plain)."""
    import torch

    from hf_replayssm.kernels.read_copy_encode import reencode_read_copy

    def bits(t):
        return t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t

    (y, got, got_copy, count), (y_ref, want, ref_copy, _), (y_plain, plain, plain_copy, _) = (
        runs[k] for k in ("kernel", "ref", "plain"))
    same = dict(rtol=0, atol=0) if device == "cpu" else dict(rtol=1e-6, atol=1e-6)  # (constexpr variants)
    torch.testing.assert_close(y, y_plain, **same)
    for n in ("state", *family.rings):
        torch.testing.assert_close(got[n], plain[n], **same)
    if not host:
        assert torch.equal(count, runs["plain"][3])
    for n in copy:  # the plain call leaves the copy; the option rewrites exactly the flushed rows
        assert torch.equal(plain_copy[n], copy[n]), n
    # the kernel's copy and the reference's: the re-encode kernel's (the codec's) of their own new checkpoints
    for label, checkpoint, step_copy in (("kernel", got["state"], got_copy), ("ref", want["state"], ref_copy)):
        expected = {n: t.clone() for n, t in copy.items()}
        reencode_read_copy(checkpoint, expected, read_format, flushed)
        for n in copy:
            if n != "row":
                assert torch.equal(bits(step_copy[n]), bits(expected[n])), (family.name, read_format, label, n)
                # the other rows' bytes untouched; the flushed rows' rewritten (the checkpoint did change)
                assert torch.equal(bits(step_copy[n])[~flushed], bits(copy[n])[~flushed]), (label, n)
                assert not torch.equal(bits(step_copy[n])[flushed], bits(copy[n])[flushed]), (label, n)
    _close("y vs reference", y, y_ref, REL)
    torch.testing.assert_close(got["state"], want["state"], rtol=2e-6, atol=2e-6)


def case_nvfp4_pairs(_, device):
    """``_nvfp4_pairs`` (the nvfp4 copy loaded as a byte tile, both nibbles decoded and interleaved) against the
    default per-nibble load: the same outputs, checkpoints, rings and counts (bit for bit on CPU but Mamba-2's
    outputs: its replay launches reduce the byte tile against C, see ``_reordered_tol``), with device
    positions (mixed phases, with and without flush_reads_copy) and host positions (replay-only launches), every
    family, and an odd Mamba-2 row length (the last byte's high nibble is storage padding)."""
    import torch

    exact = device == "cpu"
    tol = dict(rtol=0, atol=0) if exact else dict(rtol=1e-6, atol=1e-6)
    launches = [([1, 4, 0, 3], [5, 2, 4, 5], True), ([1, 4, 0, 3], [5, 2, 4, 5], False), (2, 3, False),
                (4, 0, False)]
    for name, d_state in (("mamba2", 20), ("mamba2", 21), ("gdn", None), ("kda", None)):
        family = _Family(name)
        p = _mamba2_inputs(device, 4, seed=50, d_state=d_state) if name == "mamba2" else family.inputs(device, 4, 50)
        if name != "mamba2":
            p["ring_v"], p["ring_beta"] = _raw_rings(p)
        copy, _ = _store_copy(p["state"], "nvfp4")
        for origins, counts, reads_copy in launches:
            runs = []
            for pairs in (False, True):
                q = _clone(p)
                raw = {n: q.pop(n) for n in ("ring_v", "ring_beta") if n in q}
                origin, count = _positions(origins, counts, device)
                y = family.kernel(q, origin, count, 6, read_copy={n: t.clone() for n, t in copy.items()},
                                  read_format="nvfp4", _nvfp4_pairs=pairs, flush_reads_copy=reads_copy, **raw)
                runs.append((y, q, count))
            print(f" {name} d_state={d_state} counts={counts} flush_reads_copy={reads_copy}")
            (y, got, count), (y_pairs, got_pairs, count_pairs) = runs
            assert torch.isfinite(y).all()
            torch.testing.assert_close(y_pairs, y, **(_reordered_tol(y) if name == "mamba2" else tol))
            for n in ("state", *family.rings):
                torch.testing.assert_close(got_pairs[n], got[n], **tol)
            if isinstance(count, torch.Tensor):
                assert torch.equal(count_pairs, count)


def case_nvfp4_every_code(_, device):
    """``load_read_tile`` decodes every byte (both nibbles: all 16 E2M1 codes, signs, -0.0) times block scales and a
    tensor scale to exactly the torch decoder's float32 bits, in both nvfp4 loads, the pairs in whole tiles, by
    scale block at an offset and in tiles narrower than a block."""
    import torch
    import triton
    import triton.language as tl

    from hf_replayssm.kernels.read_copy import load_read_tile
    from hf_replayssm.precision.formats import e2m1_decode, e4m3_decode, e4m3_encode, unpack_nibbles

    globals().update(tl=tl, load_read_tile=load_read_tile)  # a jit function resolves names in its module

    @triton.jit
    def decode_kernel(values_ptr, scales_ptr, tensor_ptr, out_ptr, ROWS: tl.constexpr, COLS: tl.constexpr,
                      WIDTH: tl.constexpr, FORMAT: tl.constexpr):
        # the row in tiles of WIDTH columns: 16 or more wide loads by scale block, narrower by byte
        offs_a = tl.arange(0, ROWS)
        for c_start in tl.static_range(0, COLS, WIDTH):
            offs_c = c_start + tl.arange(0, WIDTH)
            mask = (offs_a[:, None] < ROWS) & (offs_c[None, :] < COLS)
            tile = load_read_tile(values_ptr, scales_ptr, tensor_ptr, 0, 0, offs_a, offs_c, mask, offs_a < ROWS,
                                  c_start, COLS, 0, 0, COLS // 2, 1, 0, 0, COLS // 16, 1, 0, FORMAT, WIDTH, False)
            tl.store(out_ptr + offs_a[:, None] * COLS + offs_c[None, :], tile)

    rows, cols = 16, 32  # 16 x 16 bytes: every byte value once
    packed = torch.arange(256, dtype=torch.int32).to(torch.uint8).reshape(rows, cols // 2)
    gen = torch.Generator().manual_seed(3)
    block = e4m3_encode(torch.rand(rows, cols // 16, generator=gen) * 3 + 0.01)
    tensor_scale = torch.tensor([0.37], dtype=torch.float32)
    want = (e2m1_decode(unpack_nibbles(packed)).reshape(rows, cols // 16, 16)
            * e4m3_decode(block)[..., None]).reshape(rows, cols) * tensor_scale
    assert (want.view(torch.int32) == torch.tensor(-2**31, dtype=torch.int32)).any()  # -0.0 is among them
    for fmt, width in (("nvfp4", 32), ("nvfp4_pairs", 32), ("nvfp4_pairs", 16), ("nvfp4_pairs", 8)):
        out = torch.full((rows, cols), float("nan"), device=device)
        decode_kernel[(1,)](packed.to(device), block.view(torch.float8_e4m3fn).to(device), tensor_scale.to(device),
                            out, ROWS=rows, COLS=cols, WIDTH=width, FORMAT=fmt)
        assert torch.equal(out.cpu().view(torch.int32), want.view(torch.int32)), (fmt, width)


def case_delta_reencode_copy(_, device):
    """``reencode_copy`` (GDN / KDA): as ``mamba2_reencode_copy``, a flushing row's copy re-encoded from its new
    checkpoint in the same call (bytes equal to the re-encode kernel's on that checkpoint, the other rows' untouched,
    everything else that of the call without it); nvfp4 with the flush launches' amax (``_flush_amax``, default) on
    the host flush-only launch, the fused and the split step, the device-sized flush grid (no exact fold, no
    ``flush_reads_copy``), and without it; fp8. Value dim 24 (masked columns of nvfp4's 16-element blocks)."""
    import torch


    for name, read_format, host, launch in (
            ("gdn", "nvfp4", True, {}), ("kda", "nvfp4", True, {"_flush_amax": False}), ("gdn", "fp8", False, {}),
            ("kda", "nvfp4", False, {}), ("gdn", "nvfp4", False, {"_split": True}),
            ("gdn", "nvfp4", False, {"exact": False, "_split": True, "_flush_grid": "device"})):
        family = _Family(name)
        launch = dict(launch)
        exact = launch.pop("exact", True)  # the separated policy's exact fold and flush outputs from the copy
        p = family.inputs(device, 4, seed=90 + len(name))
        if exact:
            p["ring_v"], p["ring_beta"] = _raw_rings(p)
        copy, _ = _store_copy(p["state"], read_format)
        counts = [5] * 4 if host else [5, 2, 5, 4]
        runs = {}
        for label, fn, option in (("kernel", family.kernel, True), ("ref", family.ref, True),
                                  ("plain", family.kernel, False)):
            q, c = _clone(p), {n: t.clone() for n, t in copy.items()}
            raw = {n: q.pop(n) for n in ("ring_v", "ring_beta") if n in q}
            positions = _reencode_case_positions(host, label, counts, device)
            family.module.LAST_COMPILED.pop("flush_due", None)
            y = fn(q, *positions, 6, read_copy=c, read_format=read_format, flush_reads_copy=exact,
                   reencode_copy=option, **raw, **(launch if label != "ref" else {}))
            if label == "kernel" and "_flush_grid" in launch:  # the device-sized flush grid did serve the step
                assert "flush_due" in family.module.LAST_COMPILED
            runs[label] = (y, q, c, positions[1])
        flushed = torch.tensor([n + 1 >= 6 for n in counts], device=device)
        print(f" {name} {read_format} {'host' if host else 'device'} positions {launch}, exact fold {exact}, "
              f"flushed {flushed.tolist()}")
        _check_step_reencoded(family, runs, copy, flushed, read_format, host, device)


def _raw_rings(p):
    """Random raw v / beta rings for an exact fold, shaped like the ring's d and g (v's dtype, beta float32)."""
    import torch

    return torch.randn(p["ring_d"].shape).to(p["v"]), torch.rand(p["ring_g"].shape[:3]).to(p["ring_g"])


def case_delta_exact_fold(_, device):
    """Delta rule with ring_v / ring_beta (exact fold): (1) kernel == reference on a mixed-phase launch reading a
    copy; (2) GDN, the separated policy over two buffer cycles (copy refreshed after each flush): the flushed checkpoint
    and the flush outputs equal the plain float32 recurrence (the standard step), i.e. the copy's rounding never
    enters the recurrence; without ring_v / ring_beta it does (the check that the comparison can fail)."""
    import torch

    from hf_replayssm.precision.formats import get_format

    for name, read_format in (("gdn", "fp8"), ("kda", "nvfp4")):
        family = _Family(name)
        p = family.inputs(device, 3, seed=20)
        p["ring_v"], p["ring_beta"] = _raw_rings(p)
        copy, _ = _store_copy(p["state"], read_format)
        read = dict(read_copy=copy, read_format=read_format)
        got, want = _clone(p), _clone(p)
        origin, count = _positions([1, 4, 0], [5, 2, 4], device)
        origin_ref, count_ref = origin.clone(), count.clone()
        ring_got = dict(ring_v=got.pop("ring_v"), ring_beta=got.pop("ring_beta"))
        ring_want = dict(ring_v=want.pop("ring_v"), ring_beta=want.pop("ring_beta"))
        y = family.kernel(got, origin, count, 6, **read, **ring_got)
        y_ref = family.ref(want, origin_ref, count_ref, 6, **read, **ring_want)
        print(f" {name} {read_format} exact fold, mixed phases")
        _close("o vs reference", y, y_ref, REL)
        _close("state vs reference", got["state"], want["state"], REL)
        for ring in ("ring_v", "ring_beta"):
            assert torch.equal(ring_got[ring], ring_want[ring]), ring
        assert torch.equal(count, count_ref)
        if name != "gdn":  # the sequence below once (interpreter time); the fold code is shared by the gate kinds
            continue

        L, errors = 3, {}
        for exact in (True, False):
            p = family.inputs(device, 2, seed=21)
            raw = dict(zip(("ring_v", "ring_beta"), _raw_rings(p), strict=True)) if exact else {}
            std = p["state"].clone()
            worst_state = worst_flush_o = 0.0
            for step in range(2 * L):
                tok = _delta_inputs(device, 2, seed=100 + step, per_key=name == "kda")
                tok = {n: tok[n] for n in ("q", "k", "v", "beta", "g")}
                copy = get_format(read_format).encode(p["state"]) if step % L == 0 else copy  # refreshed at flushes
                p.update(tok)
                y = family.kernel(p, 0, step % L, L, read_copy=copy, read_format=read_format, **raw)
                o_std = family.module.delta_state_update_ref(std, *[tok[n] for n in ("q", "k", "v", "beta", "g")],
                                                             out=torch.empty_like(y))
                if step % L == L - 1:  # a flush: the fp32 recurrence
                    scale = std.abs().max().item()
                    worst_state = max(worst_state, (p["state"] - std).abs().max().item() / scale)
                    worst_flush_o = max(worst_flush_o, (y - o_std).abs().max().item())
            errors[exact] = (worst_state, worst_flush_o)
            print(f"  exact={exact}: checkpoint rel err {worst_state:.2e}, flush output err {worst_flush_o:.2e}")
        assert errors[True][0] < 1e-5 and errors[True][1] < 1e-5, errors
        assert errors[False][0] > 100 * max(errors[True][0], 1e-7), errors  # the copy leaks in without them


def case_delta_exact_solve(_, device):
    """``_exact_solve`` (GDN's exact fold solving the records' corrected values at once, _exact_fold_solved): against
    the reference on a fused mixed-phase launch, a split one and host-position flushes at every ring fill (0 records
    to a full ring, origins wrapping), NaN-poisoned copies on flushing rows; over two buffer cycles of the separated
    policy the checkpoint and flush outputs equal the float32 standard recurrence; refused without the raw records
    and past the ring tile. ``_solve_weights`` (the chain over the records by a per-head pre-launch that the
    flush-only launches read): the same against the reference, split and host flushes, the pre-launch recorded and
    the flush launch reading it; refused without ``_exact_solve`` or for a fused device step."""
    _recorded_solve_cases(_Family("gdn"), device)


def case_kda_exact_solve(_, device):
    """``_exact_solve`` for per-key gates (KDA: each row of A with its own decays, _solved_chain_per_key; the
    pre-launch also hands the flush programs the decayed keys, so they read no record key or gate): the checks of
    :func:`case_delta_exact_solve` on an nvfp4 copy."""
    _recorded_solve_cases(_Family("kda"), device, read_format="nvfp4")


def case_delta_flush_weights(_, device):
    """``_flush_weights`` (exact fold, outputs from the copy; by default on for KDA, off for GDN: H200, run 218):
    the flush-only launches take the decay
    and the records' weights for their outputs from the per-head weights pre-launch instead of each V tile
    recomputing them (KDA: the [R, K] decays' reverse scan, 832 warp shuffles of a program, sm_90; GDN: the record
    keys and their reductions). Host flushes (stepped fold, solved fold with its pre-launch) and a split step in
    mixed phases, GDN and KDA, each against the reference and against the launch without it (same expressions: bit
    for bit on the CPU); the flush launch reads the weights (WEIGHTS_GIVEN) and the pre-launch ran before it (KDA's
    split step runs it anyway, GDN's only for this). The host stepped flush also runs with the default ("auto"),
    which must be the family's setting."""

    for name, read_format in (("gdn", "fp8"), ("kda", "nvfp4")):
        family = _Family(name)
        module = family.module
        saved = module._kda_weights_kernel, module._delta_replay_step_kernel
        recorded_weights = module._kda_weights_kernel = RecordedKernel(saved[0])
        recorded_step = module._delta_replay_step_kernel = RecordedKernel(saved[1])
        try:
            _flush_weights_cases(family, read_format, device, recorded_weights, recorded_step)
        finally:
            module._kda_weights_kernel, module._delta_replay_step_kernel = saved


def _flush_weights_cases(family, read_format, device, recorded_weights, recorded_step):
    import torch

    for origins, counts, launch in ((2, 5, {}), (4, 5, dict(_exact_solve=True, _solve_weights=True)),
                                    ([3, 0, 2], [5, 5, 1], dict(_split=True))):
        runs = []
        p = family.inputs(device, 3, seed=41)
        p["ring_v"], p["ring_beta"] = _raw_rings(p)
        copy, _ = _store_copy(p["state"], read_format)
        split = isinstance(counts, list)
        for setting in (True, False) if launch else (True, False, "auto"):
            on = setting if setting != "auto" else family.name == "kda"  # delta_rule.FLUSH_WEIGHTS_DEFAULT
            recorded_weights.launches.clear()
            recorded_step.launches.clear()
            got = _clone(p)
            raw = dict(ring_v=got.pop("ring_v"), ring_beta=got.pop("ring_beta"))
            y = family.kernel(got, *_positions(origins, counts, device), 6, read_copy=copy, read_format=read_format,
                              flush_reads_copy=True, **raw, **launch,
                              **({} if setting == "auto" else {"_flush_weights": setting}))
            flush_launches = [kw for kw in recorded_step.launches if kw["PHASE"] in (2, 3)]
            assert [kw["WEIGHTS_GIVEN"] for kw in flush_launches] == [on], (launch, recorded_step.launches)
            runs_weights = 1 if on or (split and family.name == "kda") else 0
            assert recorded_weights.calls == runs_weights, (family.name, launch, on, recorded_weights.calls)
            runs.append((y, got))
        want = _clone(p)
        raw = dict(ring_v=want.pop("ring_v"), ring_beta=want.pop("ring_beta"))
        row_counts = counts if split else [counts] * 3
        y_ref = family.ref(want, *_positions(origins if split else [origins] * 3, row_counts, device), 6,
                           read_copy=copy, read_format=read_format, flush_reads_copy=True, **raw)
        print(f" {family.name} flush weights: origins={origins} counts={counts} {launch}")
        (y, got), (y_off, got_off) = runs[:2]
        exact = dict(rtol=0, atol=0) if device == "cpu" else dict(rtol=1e-6, atol=1e-6)
        if len(runs) == 3:  # the default: the run with the family's setting
            (y_auto, got_auto), (y_set, got_set) = runs[2], runs[0 if family.name == "kda" else 1]
            torch.testing.assert_close(y_auto, y_set, **exact)
            torch.testing.assert_close(got_auto["state"], got_set["state"], **exact)
        _close("o vs reference", y, y_ref, REL)
        _close("state vs reference", got["state"], want["state"], REL)
        torch.testing.assert_close(y, y_off, **exact)
        for name in ("state", *family.rings):
            torch.testing.assert_close(got[name], got_off[name], **exact)


def _recorded_solve_cases(family, device, read_format="fp8"):
    solve = dict(_exact_solve=True)
    given = dict(_solve_weights=True)
    module = family.module
    saved = module._delta_solve_kernel, module._delta_replay_step_kernel
    recorded_solve = module._delta_solve_kernel = RecordedKernel(saved[0])
    recorded_step = module._delta_replay_step_kernel = RecordedKernel(saved[1])
    try:
        _exact_solve_cases(family, device, solve, given, recorded_solve, recorded_step, read_format)
    finally:
        module._delta_solve_kernel, module._delta_replay_step_kernel = saved


def _exact_solve_cases(family, device, solve, given, recorded_solve, recorded_step, read_format):
    import torch

    from hf_replayssm.precision.formats import get_format

    for origins, counts, launch in (([1, 4, 0], [5, 2, 4], {}), ([3, 0, 2], [5, 5, 1], dict(_split=True)),
                                    (2, 5, {}), (4, 5, {}), ([3, 0, 2], [5, 5, 1], dict(_split=True, **given)),
                                    (2, 5, given), (4, 5, given)):
        recorded_solve.launches.clear()
        recorded_step.launches.clear()
        p = family.inputs(device, 3, seed=23)
        p["ring_v"], p["ring_beta"] = _raw_rings(p)
        copy, _ = _store_copy(p["state"], read_format)
        row_counts = counts if isinstance(counts, list) else [counts] * 3
        copy = _poison_copy(copy, torch.tensor([c + 1 >= 6 for c in row_counts], device=device))
        got, want = _clone(p), _clone(p)
        pos, pos_ref = _positions(origins, counts, device), _positions(
            origins if isinstance(origins, list) else [origins] * 3, row_counts, device)
        raw_got = dict(ring_v=got.pop("ring_v"), ring_beta=got.pop("ring_beta"))
        raw_want = dict(ring_v=want.pop("ring_v"), ring_beta=want.pop("ring_beta"))
        read = dict(read_copy=copy, read_format=read_format)
        y = family.kernel(got, *pos, 6, **read, **raw_got, **solve, **launch)
        y_ref = family.ref(want, *pos_ref, 6, **read, **raw_want)
        print(f" {family.name} exact solve: origins={origins} counts={counts} {launch}")
        _close("o vs reference", y, y_ref, REL)
        _close("state vs reference", got["state"], want["state"], REL)
        assert torch.isfinite(got["state"]).all() and torch.isfinite(y).all()
        # the pre-launch ran (once, before the flush launch) and only the flush-only launch read it
        assert recorded_solve.calls == (1 if launch.get("_solve_weights") else 0), (launch, recorded_solve.calls)
        assert all(kw["GATE_PER_KEY"] == (family.name == "kda") for kw in recorded_solve.launches)
        assert [(kw["PHASE"], kw["SOLVE_GIVEN"]) for kw in recorded_step.launches] == (
            [(0, False)] if launch == {} and isinstance(counts, list) else
            [(3, bool(launch.get("_solve_weights"))), (4, False)] if isinstance(counts, list) else
            [(2, bool(launch.get("_solve_weights")))]), (launch, recorded_step.launches)
    for ring_fill, launch in itertools.product(range(1, 6), ({}, given)):  # a flush after 0 .. 4 records (host)
        p = family.inputs(device, 2, seed=30 + ring_fill)
        p["ring_v"], p["ring_beta"] = _raw_rings(p)
        got, want = _clone(p), _clone(p)
        y = family.kernel(got, 3, ring_fill - 1, ring_fill, **solve, **launch)
        y_ref = family.ref(want, torch.full((2,), 3, dtype=torch.int32, device=device),
                           torch.full((2,), ring_fill - 1, dtype=torch.int32, device=device), ring_fill)
        _close(f"o, flush after {ring_fill - 1} records {launch}", y, y_ref, REL)
        _close(f"state, flush after {ring_fill - 1} records {launch}", got["state"], want["state"], REL)
    p = family.inputs(device, 3, seed=5)
    p["ring_v"], p["ring_beta"] = _raw_rings(p)
    for launch, match in ((dict(given), "_exact_solve=True"), (dict(given, **solve), "split step")):
        with pytest.raises(ValueError, match=match):  # without the solved fold; a fused device step
            family.kernel(_clone(p), *_positions([3, 0, 2], [5, 5, 1], device), 6, **launch)

    L = 3
    p = family.inputs(device, 2, seed=21)
    raw = dict(zip(("ring_v", "ring_beta"), _raw_rings(p), strict=True))
    std = p["state"].clone()
    worst = 0.0
    for step in range(2 * L):
        tok = _delta_inputs(device, 2, seed=100 + step, per_key=family.name == "kda")
        tok = {n: tok[n] for n in ("q", "k", "v", "beta", "g")}
        copy = get_format(read_format).encode(p["state"]) if step % L == 0 else copy  # refreshed at flushes
        p.update(tok)
        y = family.kernel(p, 0, step % L, L, read_copy=copy, read_format=read_format, **raw, **solve,
                          **(given if step % L == L - 1 else {}))
        o_std = family.module.delta_state_update_ref(std, *[tok[n] for n in ("q", "k", "v", "beta", "g")],
                                                     out=torch.empty_like(y))
        if step % L == L - 1:  # a flush: the fp32 recurrence
            worst = max(worst, (p["state"] - std).abs().max().item() / std.abs().max().item(),
                        (y - o_std).abs().max().item())
    assert worst < 1e-5, worst
    if family.name == "kda":  # the refusals below are the gate kind's own
        return

    p = family.inputs(device, 2, seed=1)
    for inputs, length, match in ((p, 6, "raw records"),
                                  (dict(p, ring_v=_raw_rings(p)[0], ring_beta=_raw_rings(p)[1]), 17, "buffer_len")):
        if match == "buffer_len":  # 16 records and the token: one row more than the ring's tile of 16
            inputs = dict(inputs)
            for name in ("ring_k", "ring_d", "ring_g", "ring_v", "ring_beta"):
                inputs[name] = inputs[name][:, :1].expand(-1, 16, *inputs[name].shape[2:]).contiguous()
        with pytest.raises(ValueError, match=match):
            family.kernel(inputs, 0, 1, length, **solve)


def case_bad_read_copy(_, device):
    """Clear errors, from the kernels and the references alike, for a read copy that does not fit."""
    for family in (_Family("mamba2"), _Family("gdn")):
        p = family.inputs(device, 2, seed=0)
        copy, _ = _store_copy(p["state"], "fp8")
        nv, _ = _store_copy(p["state"], "nvfp4")
        wrong = {
            "no format": (dict(read_copy=copy), "needs read_format"),
            "unknown format": (dict(read_copy=copy, read_format="fp16"), "needs read_format"),
            "format without copy": (dict(read_format="fp8"), "needs a read_copy"),
            "format mismatch": (dict(read_copy=copy, read_format="nvfp4"), "has entries"),
            "scale shape": (dict(read_copy=dict(copy, scale=copy["scale"][..., :1, :].clone()), read_format="fp8"),
                            "must have shape"),
            "codes dtype": (dict(read_copy=dict(copy, codes=copy["codes"].float()), read_format="fp8"),
                            "must be torch.uint8"),
            "nvfp4 row": (dict(read_copy=dict(nv, packed=nv["packed"][..., :-1]), read_format="nvfp4"),
                          "must have shape"),
        }
        for label, (read, message) in wrong.items():
            for call in (family.kernel, family.ref):
                try:
                    call(_clone(p), 0, 0, 6, **read)
                except ValueError as err:
                    assert message in str(err), (label, str(err))
                else:
                    raise AssertionError(f"{family.name} {label}: no error")
        print(f" {family.name}: {len(wrong)} bad read copies rejected")
    # Mamba-2's flush outputs by the replay launch, asked for where it cannot apply: the fused device launch, and a
    # split step whose flush launch writes the fp8 copy before the replay launch would read it
    import torch

    family = _Family("mamba2")
    p = family.inputs(device, 2, seed=0)
    copy, _ = _store_copy(p["state"], "fp8")
    for launch in ({"_split": False}, {"_encode_in_flush": True}):
        try:
            family.kernel(_clone(p), *_positions([1, 0], [5, 2], device), 6, read_copy=copy, read_format="fp8",
                          flush_reads_copy=True, reencode_copy=True, _flush_outputs_launch=True, **launch)
        except ValueError as err:
            assert "_flush_outputs_launch=True serves host positions" in str(err), str(err)
        else:
            raise AssertionError(f"_flush_outputs_launch=True with {launch}: no error")
    assert torch.equal(copy["codes"], _store_copy(p["state"], "fp8")[0]["codes"])  # nothing written
    print(" _flush_outputs_launch=True refused with the fused launch and with _encode_in_flush on a split step")


if __name__ == "__main__":
    worker_main("mamba2", globals(), sys.argv[1])
