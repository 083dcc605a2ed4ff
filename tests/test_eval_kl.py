"""The long-run KL study (hf_replayssm.eval.kl): exact control arm, JSON + PNG, resume, ordering, apparatus check."""

import json

import pytest
import torch

from hf_replayssm.eval import kl
from hf_replayssm.models import load_model
from hf_replayssm.tiny import slow_heads, tiny_model

pytestmark = pytest.mark.slow

POLICIES = ["fp32", "bf16", "shared-nvfp4"]
TOKENS = 24
POLICY_KEYS = {"mean_kl", "se", "median", "p99", "p999", "max", "top1_agreement", "ref_token_logprob_gap",
               "per_prompt_mean_kl", "binned_kl", "binned_se"}
META_KEYS = {"model", "policies", "tokens", "positions", "prompts", "n_prompts", "prompt_tokens", "buffer_len",
             "sample", "seed", "versions", "date"}


@pytest.fixture(scope="module")
def mamba2():
    return load_model("tiny-mamba2", device="cpu")


@pytest.fixture(scope="module")
def first_run(mamba2, tmp_path_factory):
    model, tokenizer = mamba2
    out = tmp_path_factory.mktemp("kl-first")
    result = kl.kl_study(model, tokenizer, POLICIES, tokens=TOKENS, prompts=kl.DEFAULT_PROMPTS[:3], out=out,
                         progress=False, model_name="tiny-mamba2")
    return out, result


def _without_date(document: dict) -> dict:
    return {**document, "meta": {k: v for k, v in document["meta"].items() if k != "date"}}


def test_control_exact_and_files(first_run):
    out, result = first_run
    assert set(result["policies"]) == set(POLICIES)
    control = result["policies"]["fp32"]
    deviation = result["meta"]["control_max_logp_diff"]
    if deviation == 0.0:
        assert control["mean_kl"] == 0.0 and control["max"] == 0.0
    else:  # the CPU rounded a row by its place in the batch (softplus over [B, H] on an AVX-512 machine)
        assert 0 < deviation <= kl.CONTROL_TOLERANCE
        assert control["max"] < 1e-6  # KL is first order in log-prob differences of float32 rounding size
    assert control["top1_agreement"] == 1.0
    assert result["policies"]["shared-nvfp4"]["mean_kl"] > result["policies"]["bf16"]["mean_kl"] > 0
    assert result["meta"]["reference_top1_is_trajectory"] == 1.0  # greedy: the lockstep reference reproduces it

    document = json.loads((out / "kl.json").read_text())
    assert document == json.loads(json.dumps(result))
    assert set(document["meta"]) >= META_KEYS
    assert document["meta"]["positions"] == TOKENS and document["meta"]["n_prompts"] == 3
    assert document["bins"][0] == [0, 1] and document["bins"][-1][1] == TOKENS
    for entry in document["policies"].values():
        assert set(entry) >= POLICY_KEYS
        assert len(entry["binned_kl"]) == len(document["bins"]) and len(entry["per_prompt_mean_kl"]) == 3
    assert (out / "kl.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(list((out / "arms").glob("*.pt"))) == 3 * len(POLICIES)  # one file per (prompt, policy) arm
    assert "shared-nvfp4" in kl.format_table(result)


def test_resume_skips_finished_arms(mamba2, first_run, tmp_path, monkeypatch):
    model, tokenizer = mamba2
    first_out, first = first_run
    calls = {"trajectory": 0, "groups": []}
    real_force, real_trajectory = kl.teacher_force, kl.reference_trajectory

    def counting_trajectory(*args, **kwargs):
        calls["trajectory"] += 1
        return real_trajectory(*args, **kwargs)

    def interrupted_force(model_, sequence, prompt_len, arms, **kwargs):
        if arms[0][1] == "shared-nvfp4":
            raise KeyboardInterrupt  # the run dies while the last policy is being computed
        calls["groups"].append([(p, name) for p, name, _ in arms])
        return real_force(model_, sequence, prompt_len, arms, **kwargs)

    monkeypatch.setattr(kl, "reference_trajectory", counting_trajectory)
    monkeypatch.setattr(kl, "teacher_force", interrupted_force)
    kwargs = dict(tokens=TOKENS, prompts=kl.DEFAULT_PROMPTS[:3], out=tmp_path, progress=False,
                  model_name="tiny-mamba2")
    with pytest.raises(KeyboardInterrupt):
        kl.kl_study(model, tokenizer, POLICIES, **kwargs)
    assert calls["trajectory"] == 1 and [g[0][1] for g in calls["groups"]] == ["fp32", "bf16"]
    assert not (tmp_path / "kl.json").exists()
    finished = {path.name: path.stat().st_mtime_ns for path in (tmp_path / "arms").glob("*.pt")}
    assert len(finished) == 6 and not list((tmp_path / "arms").glob(".*tmp"))

    # resumed: the trajectory and the finished arms are reused, only the interrupted policy is computed
    calls["groups"].clear()

    def counting_force(*args, **kwargs_):
        calls["groups"].append(args[3])
        return real_force(*args, **kwargs_)

    monkeypatch.setattr(kl, "teacher_force", counting_force)
    resumed = kl.kl_study(model, tokenizer, POLICIES, resume=True, **kwargs)
    assert calls["trajectory"] == 1
    assert [[(p, name) for p, name, _ in g] for g in calls["groups"]] == [[(0, "shared-nvfp4"), (1, "shared-nvfp4"),
                                                                           (2, "shared-nvfp4")]]
    assert {path.name: path.stat().st_mtime_ns for path in (tmp_path / "arms").glob("*.pt")
            if path.name in finished} == finished
    assert _without_date(resumed) == _without_date(first)  # same numbers as the uninterrupted run

    # resumed again with everything finished: nothing is recomputed and kl.json comes out byte-identical
    before = (tmp_path / "kl.json").read_bytes()
    calls["groups"].clear()
    again = kl.kl_study(model, tokenizer, POLICIES, resume=True, **kwargs)
    assert calls["groups"] == [] and calls["trajectory"] == 1
    assert again == resumed and (tmp_path / "kl.json").read_bytes() == before

    # a resume into a directory of another study is refused
    with pytest.raises(ValueError, match="another study"):
        kl.kl_study(model, tokenizer, POLICIES, resume=True, **{**kwargs, "tokens": TOKENS + 1})
    assert first_out != tmp_path


def test_inexact_apparatus_raises(mamba2, tmp_path, monkeypatch):
    """If the fp32 control arm does not reproduce the reference, the study fails instead of reporting numbers."""
    model, tokenizer = mamba2
    real_cache = kl.ReplayCache

    def broken_cache(buffer_len=16, precision="fp32", **kwargs):  # the last control row silently gets bf16 storage
        if isinstance(precision, list):
            precision = list(precision)
            precision[len(precision) - 1 - precision[::-1].index("fp32")] = "bf16"
        return real_cache(buffer_len=buffer_len, precision=precision, **kwargs)

    monkeypatch.setattr(kl, "ReplayCache", broken_cache)
    with pytest.raises(kl.ApparatusError, match="control arm"):
        kl.kl_study(model, tokenizer, ["shared-fp8"], tokens=20, prompts=kl.DEFAULT_PROMPTS[:2], out=tmp_path,
                    progress=False, batch_rows=True)
    assert not (tmp_path / "kl.json").exists() and not list((tmp_path / "arms").glob("*fp32*"))


def test_long_memory_separated_beats_shared():
    """Slow-decay Mamba-2 heads keep the checkpoint's rounding error: separated storage (fp32 master, nvfp4 read copy)
    must drift less than shared storage (the nvfp4 copy is the master)."""
    model = slow_heads(tiny_model("nemotron_h"))
    result = kl.kl_study(model, None, ["separated-nvfp4", "shared-nvfp4"], tokens=150, progress=False,
                         batch_rows=True)
    assert result["meta"]["control_added"] and result["policies"]["fp32"]["max"] == 0.0
    separated, shared = (result["policies"][p]["mean_kl"] for p in ("separated-nvfp4", "shared-nvfp4"))
    assert 0 < separated < shared
    # one cache per policy (the default) measures the same numbers as all policies as rows of one cache
    per_policy = kl.kl_study(model, None, ["separated-nvfp4", "shared-nvfp4"], tokens=150, progress=False)
    assert per_policy["policies"]["shared-nvfp4"]["mean_kl"] == pytest.approx(shared, rel=1e-6)
    assert per_policy["policies"]["separated-nvfp4"]["mean_kl"] == pytest.approx(separated, rel=1e-6)
    assert result["meta"]["positions"] == 150 and result["meta"]["n_prompts"] == len(kl.DEFAULT_PROMPTS)


def test_cli_sampled_with_prompt_file(tmp_path, capsys):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("ROMEO:\nJULIET:\n\nHAMLET:\n", encoding="utf-8")
    out = tmp_path / "run"
    argv = ["--model", "tiny-mamba2", "--policies", "separated-fp8,shared-fp8", "--tokens", "12", "--out", str(out),
            "--prompts", str(prompts), "--sample", "--seed", "3", "--device", "cpu", "--no-progress", "--batch-rows"]
    assert kl.main(argv) == 0
    assert "separated-fp8" in capsys.readouterr().out
    document = json.loads((out / "kl.json").read_text())
    assert document["meta"]["prompts"] == ["ROMEO:", "JULIET:", "HAMLET:"] and document["meta"]["sample"]
    assert document["meta"]["seed"] == 3 and document["policies"]["fp32"]["mean_kl"] == 0.0
    trajectory = torch.load(out / "trajectory.pt", weights_only=True)["sequence"]
    for arm_file in (out / "arms").glob("*.pt"):  # each arm file holds its own metrics, not every arm's storage
        metrics = torch.load(arm_file, weights_only=True)["metrics"]
        assert all(t.untyped_storage().nbytes() == t.numel() * t.element_size() for t in metrics.values())
    assert kl.main([*argv, "--resume"]) == 0  # the same sampled trajectory is reused
    assert torch.equal(torch.load(out / "trajectory.pt", weights_only=True)["sequence"], trajectory)
    assert json.loads((out / "kl.json").read_text()) == document


@pytest.mark.parametrize("model_name", ["small-mamba2", "small-gdn"])
def test_window_teacher_forcing_matches_decode_steps(model_name, tmp_path):
    """Windows of 16 tokens through the speculative-window path measure what one decode step per token measures
    (mean KL within 2 %, the same top-1 agreement; float rounding of the batched matmuls flips a few low-precision
    codes), with the control exactly 0, in 16x fewer forwards. Windows cross flush boundaries (prompt not a multiple
    of 16, 70 positions). Arms saved with one window are not reused by a run with another."""
    model, tokenizer = load_model(model_name, device="cpu")
    policies = ["separated-nvfp4", "shared-nvfp4", "shared-fp8"]
    forwards = []
    hook = model.register_forward_pre_hook(lambda module, args: forwards.append(1))
    try:
        kwargs = dict(tokens=70, prompts=kl.DEFAULT_PROMPTS[:2], progress=False, batch_rows=True, out=tmp_path)
        steps = kl.kl_study(model, tokenizer, policies, **kwargs)
        step_forwards, forwards[:] = len(forwards), []
        windows = kl.kl_study(model, tokenizer, policies, window=16, resume=True, **kwargs)
        window_forwards = len(forwards)
    finally:
        hook.remove()
    # steps: generation (1 + 69) + teacher forcing (1 + 69); windows: the trajectory is reused, 1 + ceil(69 / 16)
    assert step_forwards == 140 and window_forwards == 1 + 5
    assert windows["meta"]["window"] == 16 and steps["meta"]["window"] == 1
    for name in ["fp32", *policies]:
        a, b = steps["policies"][name], windows["policies"][name]
        if name == "fp32":
            assert a["max"] == b["max"] == 0.0
            continue
        assert b["mean_kl"] > 0 and b["mean_kl"] == pytest.approx(a["mean_kl"], rel=0.02), name
        assert b["top1_agreement"] == a["top1_agreement"], name
    with pytest.raises(ValueError, match="window must be an int >= 1"):
        kl.teacher_force(model, torch.zeros(1, 4, dtype=torch.long), 2, [(0, "fp32", "fp32")], window=0)


def test_control_exact_with_several_cpu_threads():
    """With two intra-op threads a 12-row batch (4 references, 4 controls, 4 bf16 rows) rounded some control rows
    differently from their references from the first decode step on (a matmul's rows split between threads); the
    study teacher-forces on one CPU thread and restores the caller's thread count."""
    model, tokenizer = load_model("small-gdn", device="cpu")
    saved = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        result = kl.kl_study(model, tokenizer, ["bf16"], tokens=8, progress=False, batch_rows=True)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(saved)
    assert result["meta"]["n_prompts"] == 4 and result["policies"]["fp32"]["max"] == 0.0
    assert result["policies"]["bf16"]["mean_kl"] > 0


def test_study_switches_tf32_and_cudnn_attention_off_and_restores_them(mamba2, monkeypatch):
    model, tokenizer = mamba2
    seen = []
    real_force = kl.teacher_force

    def recording_force(*args, **kwargs):
        seen.append((torch.backends.cuda.matmul.allow_tf32, torch.backends.cuda.cudnn_sdp_enabled()))
        return real_force(*args, **kwargs)

    monkeypatch.setattr(kl, "teacher_force", recording_force)
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cuda.cudnn_sdp_enabled()
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cuda.enable_cudnn_sdp(True)
    try:
        kl.kl_study(model, tokenizer, ["bf16"], tokens=4, prompts=kl.DEFAULT_PROMPTS[:1], progress=False)
        assert seen and all(state == (False, False) for state in seen)
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cuda.cudnn_sdp_enabled()
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved[0]
        torch.backends.cuda.enable_cudnn_sdp(saved[1])


def test_compiled_trajectory_equals_eager(mamba2, tmp_path):
    """The reference trajectory through transformers' compiled path (static ReplayCache; inductor on the CPU, CUDA
    graphs on a GPU) is the eager fp32 trajectory token for token, and the study records how it was decoded."""
    model, tokenizer = mamba2
    prompt_ids = torch.randint(0, model.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(5))
    eager_info, compiled_info = {}, {}
    eager = kl.reference_trajectory(model, prompt_ids, 40, info=eager_info)
    compiled = kl.reference_trajectory(model, prompt_ids, 40, compiled=True, info=compiled_info)
    assert eager_info == {"compiled": False, "eager_reason": None}
    assert compiled_info == {"compiled": True, "eager_reason": None}
    assert eager.shape == (2, 49) and torch.equal(compiled, eager)
    result = kl.kl_study(model, tokenizer, ["bf16"], tokens=12, prompts=kl.DEFAULT_PROMPTS[:1], out=tmp_path,
                         progress=False, compile_trajectory=True)
    assert result["meta"]["trajectory_compiled"] is True and result["policies"]["fp32"]["max"] == 0.0
    resumed = kl.kl_study(model, tokenizer, ["bf16"], tokens=12, prompts=kl.DEFAULT_PROMPTS[:1], out=tmp_path,
                          progress=False, resume=True)
    assert resumed["meta"]["trajectory_compiled"] is True  # read back from trajectory.pt


def test_compiled_trajectory_falls_back_with_reason(mamba2, monkeypatch, capsys):
    model, _ = mamba2
    monkeypatch.setattr(kl, "_compiled_trajectory_cache", lambda *args: (None, "no static cache here"))
    info = {}
    prompt_ids = torch.randint(0, model.config.vocab_size, (1, 5), generator=torch.Generator().manual_seed(6))
    sequence = kl.reference_trajectory(model, prompt_ids, 6, compiled=True, info=info)
    assert sequence.shape == (1, 11) and info == {"compiled": False, "eager_reason": "no static cache here"}
    assert "trajectory decodes eagerly (no static cache here)" in capsys.readouterr().err
