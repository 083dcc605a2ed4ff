"""The decode-step custom ops (``hf_replayssm.kernels.ops``, namespace ``torch.ops.hf_replayssm``).

On CPU each op runs its torch reference, so it must equal a direct reference call bit for bit (output and every
tensor it writes), pass ``torch.library.opcheck`` (schema/mutation declarations, fake implementation, AOT
dispatch) and compile with ``fullgraph=True``. The Triton implementation (what the ops run on CUDA) is checked
through the same ops in a subprocess with ``TRITON_INTERPRET=1``, registered there for CPU tensors
(``REPLAYSSM_KERNEL_TEST_DEVICE=cuda`` runs that check on a GPU, through the CUDA registration itself).
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import torch
from kernel_harness import HAS_TRITON, ROOT, run_case, subprocess_env, worker_main
from kernel_harness import assert_close as _close

from hf_replayssm.kernels import ops
from hf_replayssm.ops.delta_step import delta_replay_step_ref, delta_state_update_ref
from hf_replayssm.ops.mamba2_step import mamba2_replay_step_ref, mamba2_state_update_ref

BUFFER_LEN = 4  # ring R = BUFFER_LEN - 1 = 3: the minimal capacity, so slots wrap around
ORIGINS = [2, 0, 1]
COUNTS = [0, 3, 2]  # row 1 flushes (count + 1 = buffer_len), rows 0 and 2 replay; row 2 becomes full
REFERENCES = {
    "mamba2_replay_step": mamba2_replay_step_ref,
    "mamba2_state_update": mamba2_state_update_ref,
    "delta_replay_step": delta_replay_step_ref,
    "delta_state_update": delta_state_update_ref,
}


# ---------------------------------------------------------------------------------------------------------------
# inputs: small, random, never zero


def _rand(gen, *shape, scale=1.0, device="cpu", dtype=torch.float32):
    return (torch.randn(*shape, generator=gen) * scale).to(device=device, dtype=dtype)


def _positions(device):
    return (torch.tensor(ORIGINS, dtype=torch.int32, device=device),
            torch.tensor(COUNTS, dtype=torch.int32, device=device))


def mamba2_inputs(op: str, *, options: bool, dtype=torch.float32, device="cpu", seed=0, steps=None) -> dict:
    """Keyword arguments of a Mamba-2 op: state [B, H, P, N] fp32, tokens in ``dtype`` ([B, T, ...] when ``steps``
    is given); ``options`` adds D, z, dt_bias and softplus (dt raw), else dt is a positive step size."""
    gen = torch.Generator().manual_seed(seed)
    batch, heads, groups, head_dim, d_state, ring = len(COUNTS), 4, 2, 6, 5, BUFFER_LEN - 1
    tok = () if steps is None else (steps,)

    def rnd(*shape, scale=1.0, dt=dtype):
        return _rand(gen, *shape, scale=scale, device=device, dtype=dt)

    p = dict(state=rnd(batch, heads, head_dim, d_state, dt=torch.float32),
             x=rnd(batch, *tok, heads, head_dim), B=rnd(batch, *tok, groups, d_state),
             C=rnd(batch, *tok, groups, d_state), A=-(torch.rand(heads, generator=gen) * 1.5 + 0.2).to(device))
    if options:
        p.update(dt=rnd(batch, *tok, heads, dt=torch.float32), D=rnd(heads, dt=torch.float32),
                 z=rnd(batch, *tok, heads, head_dim), dt_bias=rnd(heads, scale=0.5, dt=torch.float32),
                 dt_softplus=True)
    else:
        p["dt"] = (torch.rand(batch, *tok, heads, generator=gen) * 0.9 + 0.05).to(device)
    if op == "mamba2_replay_step":
        origin, count = _positions(device)
        p.update(ring_x=rnd(batch, ring, heads, head_dim), ring_B=rnd(batch, ring, groups, d_state),
                 ring_dt=(torch.rand(batch, ring, heads, generator=gen) * 0.9 + 0.05).to(device),
                 origin=origin, count=count, buffer_len=BUFFER_LEN)
    return p


def delta_inputs(op: str, *, per_key: bool, dtype=torch.float32, device="cpu", seed=0, steps=None,
                 options=False) -> dict:
    """Keyword arguments of a delta-rule op: state [B, Hv, K, V] fp32, Hv = 2 Hk, g [B, Hv] (GDN) or [B, Hv, K]
    (KDA) log decays; ``options`` turns l2 normalisation off and sets an explicit scale."""
    gen = torch.Generator().manual_seed(seed)
    batch, key_heads, value_heads, key_dim, value_dim, ring = len(COUNTS), 2, 4, 16, 12, BUFFER_LEN - 1
    tok = () if steps is None else (steps,)
    gate = (value_heads, key_dim) if per_key else (value_heads,)

    def rnd(*shape, scale=1.0, dt=dtype):
        return _rand(gen, *shape, scale=scale, device=device, dtype=dt)

    def decay(*shape):
        return -(torch.rand(*shape, generator=gen) * 0.5 + 0.02).to(device)

    p = dict(state=rnd(batch, value_heads, key_dim, value_dim, scale=0.5, dt=torch.float32),
             q=rnd(batch, *tok, key_heads, key_dim), k=rnd(batch, *tok, key_heads, key_dim),
             v=rnd(batch, *tok, value_heads, value_dim),
             beta=torch.sigmoid(rnd(batch, *tok, value_heads, dt=torch.float32)), g=decay(batch, *tok, *gate))
    if options:
        p.update(use_qk_l2norm=False, scale=0.3)
        p["q"], p["k"] = p["q"] * 0.3, p["k"] * 0.3  # unnormalised keys: keep the delta rule contractive
    if op == "delta_replay_step":
        origin, count = _positions(device)
        p.update(ring_k=rnd(batch, ring, key_heads, key_dim), ring_d=rnd(batch, ring, value_heads, value_dim,
                                                                        scale=0.3, dt=torch.float32),
                 ring_g=decay(batch, ring, *gate), origin=origin, count=count, buffer_len=BUFFER_LEN)
        if options:
            p["ring_k"] = p["ring_k"] * 0.3
    return p


def with_read_copy(p: dict, read_format: str, *, delta: bool, seed=7) -> dict:
    """``p`` (a replay op's inputs) plus a read copy of its checkpoint in ``read_format`` as the ``*_read_copy`` ops
    take it (and, for the delta rule, the raw v / beta records of the exact fold)."""
    from hf_replayssm.precision.formats import get_format

    gen = torch.Generator().manual_seed(seed)
    values, scales, tensor_scale, row = ops.read_copy_parts(get_format(read_format).encode(p["state"]), read_format)
    p.update(rc_values=values, rc_scales=scales, rc_tensor_scale=tensor_scale, rc_row=row, read_format=read_format)
    if delta:
        ring_d = p["ring_d"]
        p.update(ring_v=_rand(gen, *ring_d.shape, device=ring_d.device, dtype=p["v"].dtype),
                 ring_beta=torch.rand(ring_d.shape[:3], generator=gen).to(ring_d.device))
    return p


def _read_copy_reference(step_ref):
    """The separated ops' documented semantics, from the references: the step (flushing rows' outputs from the copy)
    then the copy of each row that flushed (count 0 afterwards) re-encoded from its new checkpoint."""
    from hf_replayssm.ops.read_copy import READ_COPY_ENTRIES, reencode_read_copy_ref

    def reference(rc_values, rc_scales, rc_tensor_scale, rc_row, read_format, **p):
        read_copy = dict(zip(READ_COPY_ENTRIES[read_format], (rc_values, rc_scales, rc_tensor_scale, rc_row),
                             strict=False))
        y = step_ref(**p, read_copy=read_copy, read_format=read_format, flush_reads_copy=True)
        reencode_read_copy_ref(p["state"], read_copy, read_format, p["count"] == 0)
        return y

    return reference


REFERENCES["mamba2_replay_step_read_copy"] = _read_copy_reference(mamba2_replay_step_ref)
REFERENCES["delta_replay_step_read_copy"] = _read_copy_reference(delta_replay_step_ref)

# name -> (op name, inputs)
CASES = {
    "mamba2_replay_options_bf16": ("mamba2_replay_step", lambda **kw: mamba2_inputs(
        "mamba2_replay_step", options=True, dtype=torch.bfloat16, **kw)),
    "mamba2_replay_plain": ("mamba2_replay_step", lambda **kw: mamba2_inputs(
        "mamba2_replay_step", options=False, **kw)),
    "mamba2_state_update": ("mamba2_state_update", lambda **kw: mamba2_inputs(
        "mamba2_state_update", options=True, **kw)),
    "delta_replay_gdn_bf16": ("delta_replay_step", lambda **kw: delta_inputs(
        "delta_replay_step", per_key=False, dtype=torch.bfloat16, **kw)),
    "delta_replay_kda_options": ("delta_replay_step", lambda **kw: delta_inputs(
        "delta_replay_step", per_key=True, options=True, **kw)),
    "delta_state_update_gdn": ("delta_state_update", lambda **kw: delta_inputs(
        "delta_state_update", per_key=False, **kw)),
    "delta_state_update_kda": ("delta_state_update", lambda **kw: delta_inputs(
        "delta_state_update", per_key=True, **kw)),
    "mamba2_replay_read_copy_nvfp4": ("mamba2_replay_step_read_copy", lambda **kw: with_read_copy(mamba2_inputs(
        "mamba2_replay_step", options=True, **kw), "nvfp4", delta=False)),
    # (fp8: the kernel's flush writes the copy of the rows it folds from its registers)
    "mamba2_replay_read_copy_fp8": ("mamba2_replay_step_read_copy", lambda **kw: with_read_copy(mamba2_inputs(
        "mamba2_replay_step", options=False, **kw), "fp8", delta=False)),
    "delta_replay_read_copy_gdn_fp8": ("delta_replay_step_read_copy", lambda **kw: with_read_copy(delta_inputs(
        "delta_replay_step", per_key=False, dtype=torch.bfloat16, **kw), "fp8", delta=True)),
    "delta_replay_read_copy_kda_nvfp4": ("delta_replay_step_read_copy", lambda **kw: with_read_copy(delta_inputs(
        "delta_replay_step", per_key=True, **kw), "nvfp4", delta=True)),
}


def _clone(p: dict) -> dict:
    return {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in p.items()}


def _tensors(p: dict) -> dict:
    return {k: v for k, v in p.items() if isinstance(v, torch.Tensor)}


def _op(name: str):
    return getattr(torch.ops.hf_replayssm, name)


# ---------------------------------------------------------------------------------------------------------------
# CPU: the ops are the references


def test_import_needs_no_triton():
    code = "import sys, hf_replayssm.kernels.ops; assert 'triton' not in sys.modules, 'triton imported'"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=subprocess_env(), capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]


@pytest.mark.parametrize("case", CASES)
def test_op_equals_reference(case):
    name, make = CASES[case]
    p = make()
    got_args, want_args = _clone(p), _clone(p)
    y = _op(name)(**got_args)
    want = REFERENCES[name](**want_args)
    like = p["x"] if name.startswith("mamba2") else p["v"]
    assert y.dtype == like.dtype and y.shape == like.shape and y.is_contiguous()
    assert torch.isfinite(y.float()).all()
    assert torch.equal(y, want)
    assert all(y.data_ptr() != t.data_ptr() for t in _tensors(got_args).values()), "output aliases an input"
    changed = set()
    for key, before in _tensors(p).items():
        assert torch.equal(got_args[key], want_args[key]), key
        if not torch.equal(got_args[key], before):
            changed.add(key)
    # the op wrote only what it declares, and these inputs exercise every declared write (that they pass: an fp8
    # read copy has no tensor scale)
    declared = {key for key in ops.MUTATES[name] if p.get(key) is not None}
    assert changed == declared, (changed, declared)


@pytest.mark.parametrize("case", CASES)
def test_opcheck(case):
    name, make = CASES[case]
    torch.library.opcheck(_op(name), (), make())


def test_bad_inputs_raise_clear_errors():
    p = mamba2_inputs("mamba2_replay_step", options=True)
    for key, value, match in (
        ("count", p["count"].long(), "count must be int32"),
        ("x", p["x"][:, :3], r"x must be \[B, H, P\]"),
        ("buffer_len", 6, "ring capacity"),
        ("ring_B", p["ring_B"][:, :2], r"ring_B must be \[B, R, G, N\]"),
    ):
        with pytest.raises(ValueError, match=match):
            _op("mamba2_replay_step")(**dict(_clone(p), **{key: value}))
    p = delta_inputs("delta_replay_step", per_key=True)
    with pytest.raises(ValueError, match="same gate kind"):
        _op("delta_replay_step")(**dict(_clone(p), ring_g=p["ring_g"][..., 0]))
    p = delta_inputs("delta_state_update", per_key=False)
    three_key_heads = torch.randn(len(COUNTS), 3, p["k"].shape[-1])  # Hv = 4 is not a multiple of Hk = 3
    with pytest.raises(ValueError, match="multiple of Hk"):
        _op("delta_state_update")(**dict(p, q=three_key_heads, k=three_key_heads))


STEPS = 5  # counts after each step (0* = flush): row 0: 1 2 3 0* 1; row 1: 0* 1 2 3 0*; row 2: 3 0* 1 2 3
LAYER_OPS = {"mamba2": "mamba2_replay_step", "delta": "delta_replay_step", "mamba2_std": "mamba2_state_update",
             "delta_std": "delta_state_update"}


def _sequence_inputs(device="cpu") -> dict:
    """A Mamba-2 (options, bf16 tokens) and a KDA layer, [B, STEPS, ...] tokens, plus one standard-step layer each."""
    return dict(
        mamba2=mamba2_inputs("mamba2_replay_step", options=True, dtype=torch.bfloat16, steps=STEPS, device=device),
        delta=delta_inputs("delta_replay_step", per_key=True, steps=STEPS, seed=1, device=device),
        mamba2_std=mamba2_inputs("mamba2_state_update", options=False, steps=STEPS, seed=2, device=device),
        delta_std=delta_inputs("delta_state_update", per_key=False, steps=STEPS, seed=3, device=device),
    )


_PER_TOKEN = {"x", "dt", "B", "C", "z", "q", "k", "v", "beta", "g"}


def decode_steps(layers: dict, steps: int = STEPS) -> torch.Tensor:
    """``steps`` decode tokens through the layers (each layer's op once per token); every layer's output
    [B, steps, ...] flattened and concatenated."""
    outs = {name: [] for name in layers}
    for t in range(steps):
        for name, p in layers.items():
            outs[name].append(_op(LAYER_OPS[name])(**{k: (v[:, t] if k in _PER_TOKEN else v) for k, v in p.items()}))
    return torch.cat([torch.stack(ys, dim=1).float().flatten(1) for ys in outs.values()], dim=1)


def _clone_layers(layers: dict) -> dict:
    return {name: _clone(p) for name, p in layers.items()}


def _check_compiled(backend, layers: dict, steps: int = STEPS, dynamic: bool | None = None) -> str | None:
    """Compile ``decode_steps`` with ``fullgraph=True`` and compare with eager op calls on copies of ``layers``
    (outputs and every tensor, exactly). Returns Inductor's generated code when ``backend`` is "inductor"."""
    torch._dynamo.reset()
    eager_layers, compiled_layers = _clone_layers(layers), _clone_layers(layers)
    want = decode_steps(eager_layers, steps)
    compiled = torch.compile(decode_steps, fullgraph=True, backend=backend, dynamic=dynamic)
    code = None
    if backend == "inductor":
        from torch._inductor.utils import run_and_get_code

        got, (code, *_) = run_and_get_code(compiled, compiled_layers, steps)
    else:
        got = compiled(compiled_layers, steps)
    assert torch.isfinite(want).all()
    assert torch.equal(got, want)
    for name, p in eager_layers.items():
        for key, t in _tensors(p).items():
            assert torch.equal(compiled_layers[name][key], t), (name, key)
    for name in {"mamba2", "delta"} & set(layers):  # some rows flushed and the positions moved on
        assert not torch.equal(eager_layers[name]["state"], layers[name]["state"]), name
        assert torch.equal(eager_layers[name]["count"].cpu(),
                           torch.tensor([(c + steps) % BUFFER_LEN for c in COUNTS], dtype=torch.int32))
    return code


def _op_calls(graph: torch.fx.Graph) -> int:
    return sum(node.op == "call_function" and str(node.target).startswith("hf_replayssm.") for node in graph.nodes)


def test_compile_fullgraph_eager():
    """One graph, in which Dynamo sees each op call (never the reference's host loops inside it)."""
    from torch._dynamo.testing import EagerAndRecordGraphs

    backend = EagerAndRecordGraphs()
    _check_compiled(backend, _sequence_inputs())
    assert len(backend.graphs) == 1
    assert _op_calls(backend.graphs[0].graph) == 4 * STEPS


def test_compile_fullgraph_dynamic_shapes():
    """Symbolic sizes through the fake implementations and functionalisation (aot_eager), as a varying batch
    would give."""
    replay_layers = {name: p for name, p in _sequence_inputs().items() if name in ("mamba2", "delta")}
    _check_compiled("aot_eager", replay_layers, steps=2, dynamic=True)


def test_compile_fullgraph_inductor():
    """Inductor calls the ops on the caller's tensors: the functionalised mutations are re-inplaced, so no copy of
    a state or ring is made per step (which would also keep CUDA graphs from writing the caller's buffers)."""
    code = _check_compiled("inductor", _sequence_inputs())
    assert len(re.findall(r"= torch\.ops\.hf_replayssm\.\w+\.default\(", code)) == 4 * STEPS, code
    assert "clone" not in code and ".copy_(" not in code, "Inductor copies a mutated input"


# ---------------------------------------------------------------------------------------------------------------
# the Triton implementation through the ops (subprocess, TRITON_INTERPRET=1 on CPU)


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
def test_triton_impls_through_ops():
    run_case(__file__, "triton_impls")


TRITON_CASES = ["mamba2_replay_options_bf16", "mamba2_state_update", "delta_replay_kda_options",
                "delta_state_update_gdn", "mamba2_replay_read_copy_nvfp4", "mamba2_replay_read_copy_fp8",
                "delta_replay_read_copy_gdn_fp8"]
# (one per op: the kernels themselves are tested in test_kernels_*.py)


def _check_reencoded(before: dict, after: dict) -> None:
    """A ``*_read_copy`` op's copy after the step: rows with count 0 (flushed) hold the encoding of their new
    checkpoint, bit for bit; the other rows' copy is unchanged."""
    from hf_replayssm.precision.formats import get_format

    encoded = ops.read_copy_parts(get_format(after["read_format"]).encode(after["state"]), after["read_format"])
    flushed = after["count"] == 0
    assert flushed.any() and not flushed.all()
    for key, fresh in zip(("rc_values", "rc_scales", "rc_tensor_scale"), encoded, strict=False):
        if after[key] is None:
            continue
        got = after[key].view(torch.uint8) if after[key].dtype == torch.float8_e4m3fn else after[key]
        assert torch.equal(got[flushed], fresh[flushed]), key
        assert torch.equal(got[~flushed], before[key][~flushed]), key


def case_triton_impls(module, device):
    """Each op (Triton implementation) against its reference, then two compiled replay steps (backend eager; rows
    1 and 2 flush). The interpreter takes ~1 s per launch, hence the few launches."""
    from hf_replayssm.kernels import delta_rule, mamba2

    if device == "cpu":
        for op, impl in module.TRITON_IMPLS.items():
            op.register_kernel("cpu")(impl)
    def check_case(case) -> dict:  # the op on a case's inputs against its reference; the launches it made
        name, make = CASES[case]
        p = make(device=device)
        got_args, want_args = _clone(p), _clone(p)
        launched = (mamba2 if name.startswith("mamba2") else delta_rule).LAST_COMPILED
        launched.clear()
        y = _op(name)(**got_args)
        assert ("replay" if "replay" in name else "state_update") in launched, "the op did not run Triton"
        want = REFERENCES[name](**want_args)
        print(case)
        _close("out", y.float(), want.float(), 1e-2 if y.dtype == torch.bfloat16 else 2e-5)
        if "read_format" in p:  # the copy: the exact encoding of the op's own new checkpoint on the rows that
            _check_reencoded(p, got_args)  # flushed (the reference's checkpoint differs in the last bits)
        for key in [key for key in (*ops.MUTATES[name], "origin") if key in p and not key.startswith("rc_")]:
            t = want_args[key]
            if key in ("count", "origin", "ring_x", "ring_B", "ring_k", "ring_v"):
                # positions and copied records: exact
                assert torch.equal(got_args[key], t), key
            else:
                _close(key, got_args[key], t, 2e-5)
        return dict(launched)

    for case in TRITON_CASES:
        check_case(case)
    replay_layers = {name: p for name, p in _sequence_inputs(device).items() if name in ("mamba2", "delta")}
    mamba2.LAST_COMPILED.clear()
    delta_rule.LAST_COMPILED.clear()
    _check_compiled("eager", replay_layers, steps=2)
    assert "replay" in mamba2.LAST_COMPILED and "replay" in delta_rule.LAST_COMPILED
    print("compiled replay steps (eager backend) equal eager op calls")
    # GDN's device-phase default from DEVICE_WALK_MIN_BATCH rows (lowered here to reach it): a flush-only launch,
    # then a replay launch walking the replaying rows; through the op against the reference, and compiled
    saved = delta_rule.DEVICE_WALK_MIN_BATCH
    try:
        delta_rule.DEVICE_WALK_MIN_BATCH = 1
        launched = check_case("delta_replay_gdn_bf16")
        assert "replay_phase3" in launched and "replay_phase4" in launched and "replay_phase0" not in launched
        delta_rule.LAST_COMPILED.clear()
        gdn = dict(delta=delta_inputs("delta_replay_step", per_key=False, steps=STEPS, seed=1, device=device))
        _check_compiled("eager", gdn, steps=2)
        assert "replay_phase4" in delta_rule.LAST_COMPILED and "replay_phase0" not in delta_rule.LAST_COMPILED
    finally:
        delta_rule.DEVICE_WALK_MIN_BATCH = saved
    print("GDN's split walking step through the op, eager and compiled")


if __name__ == "__main__":
    worker_main("ops", globals(), sys.argv[1])
