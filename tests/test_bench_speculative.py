"""``hf-replayssm bench speculative`` on CPU: JSON structure, identical tokens to plain greedy, measured rates."""

from __future__ import annotations

import json

from hf_replayssm.bench import speculative


def test_bench_speculative_runs_and_reports(tmp_path):
    out = tmp_path / "spec.json"
    speculative.main(["--models", "small-mamba2,qwen3_5", "--drafts", "tiny-mamba2,qwen3_5", "--tiny", "--batches",
                      "1,2", "--prompt", "32", "--new", "6", "--lookup", "3", "--buffer-len", "4", "--device", "cpu",
                      "--out", str(out)])
    data = json.loads(out.read_text())
    assert [(e["model"], e["batch"], e["arm"]) for e in data["results"]] == [
        (model, batch, arm) for model in ("small-mamba2", "qwen3_5") for batch in (1, 2) for arm in ("lookup", "draft")]
    self_drafts = [e for e in data["results"] if e["model"] == "qwen3_5" and e["arm"] == "draft"]
    assert all(e["acceptance"] == 1.0 for e in self_drafts)  # the model drafting for itself: every draft accepted
    for entry in data["results"]:
        assert entry["identical"], entry  # batched lookup emits exactly what plain greedy emits
        assert entry["greedy_tokens_per_s"] > 0 and entry["lookup_tokens_per_s"] > 0
        assert 0 <= entry["acceptance"] <= 1 and entry["verify_forwards"] >= 1
        assert 0 <= entry["rollback_fraction"] < 1
        assert 0 <= entry["rollback_commit_seconds"] <= entry["rollback_seconds"]
        assert 0 <= entry["rollback_fraction_without_commits"] <= entry["rollback_fraction"]
        assert 0 < entry["rollback_host_seconds"] <= entry["rollback_seconds"]  # every round dropped something
        assert entry["rollback_host_fraction"] <= entry["rollback_fraction"]
        assert entry["snapshot_seconds"] > 0 and entry["snapshot_fraction"] > 0  # copies of real checkpoints
        # no Triton kernel compiles on the CPU torch path; None would mean this Triton cannot count them
        assert entry["jit_compiles"] == {} and entry["greedy_jit_compiles"] == {}
    assert data["environment"]["device"] == "cpu"


def test_warm_verify_widths_verifies_a_window_of_each_tile():
    """The warm-up the bench runs on CUDA before its timed runs: a verify forward of every window width in
    WARM_WINDOWS up to lookup + 1 (each run's first round verifies its full window)."""
    import torch

    from hf_replayssm.tiny import tiny_model

    model = tiny_model("qwen3_5_text")
    widths = []
    model.register_forward_pre_hook(lambda module, args, kwargs: widths.append(
        (args[0] if args else kwargs["input_ids"]).shape[1]), with_kwargs=True)
    ids = torch.randint(3, 100, (2, 12), generator=torch.Generator().manual_seed(0))
    assert speculative.warm_verify_widths(model, ids, lookup=9, buffer_len=16) == [1, 2, 3, 7, 9]
    assert {2, 3, 4, 8, 10} <= set(widths), widths  # the windows (one token + n drafts) of each run
    assert speculative.warm_verify_widths(model, ids, lookup=0, buffer_len=16) == []


def test_snapshot_estimate_copies_every_ssm_state_per_position():
    """The snapshot estimate times (window + 1) copies of each SSM layer's checkpoint and leaves the state as it was."""
    import torch

    from hf_replayssm import ReplayCache
    from hf_replayssm.tiny import tiny_model

    model = tiny_model("qwen3_5_text", seed=0, initializer_range=0.2)
    cache = ReplayCache(4)
    with torch.no_grad():
        model(torch.randint(3, 100, (2, 9)), past_key_values=cache)
    before = [layer.schedule.checkpoint().clone() for layer in cache.replay_layers.values()]
    assert speculative.snapshot_seconds_per_round(cache, window=4) > 0
    after = [layer.schedule.checkpoint() for layer in cache.replay_layers.values()]
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
    assert speculative.snapshot_seconds_per_round(ReplayCache(4), window=4) == 0.0  # nothing bound: no state


def test_repetitive_prompts_repeat():
    import torch

    from hf_replayssm.models import load_model

    _, tokenizer = load_model("small-kda", device="cpu")
    ids = speculative.repetitive_batch(tokenizer.vocab_size, 2, 200, tokenizer=tokenizer)
    assert ids.shape == (2, 200) and not torch.equal(ids[0], ids[1])
    row = ids[0].tolist()
    assert any(row[i : i + 8] == row[j : j + 8] for i in range(0, 40) for j in range(i + 8, 192))


def test_a_saved_model_folder_loads_with_its_tokenizer(tmp_path):
    """``--models PATH``: a saved model (e.g. a fine-tune from ``hf_replayssm.models.train --init-from``) runs with
    its own tokenizer, so its prompts are the repeated passage of the bundled models."""
    from hf_replayssm.models import load_model

    model, tokenizer = load_model("tiny-mamba2", device="cpu")
    model.save_pretrained(tmp_path / "saved")
    tokenizer.save_pretrained(tmp_path / "saved")
    loaded, loaded_tokenizer = speculative._load(str(tmp_path / "saved"), "cpu", model.dtype, tiny=False)
    assert loaded_tokenizer is not None and len(loaded_tokenizer) == len(tokenizer)
    assert loaded.config.model_type == model.config.model_type


def test_bench_speculative_heuristic_schedule_arms(tmp_path):
    out = tmp_path / "spec.json"
    speculative.main(["--models", "small-mamba2", "--drafts", "tiny-mamba2", "--batches", "2", "--prompt", "32",
                      "--new", "6", "--lookup", "3", "--buffer-len", "4", "--device", "cpu",
                      "--schedules", "constant,heuristic", "--out", str(out)])
    data = json.loads(out.read_text())
    assert [e["arm"] for e in data["results"]] == ["lookup", "lookup-heuristic", "draft", "draft-heuristic"]
    assert [e["draft_model"] for e in data["results"]] == [None, None, "tiny-mamba2", "tiny-mamba2"]
    assert all(e["identical"] for e in data["results"])
    try:
        speculative.main(["--models", "small-mamba2", "--schedules", "dynamic", "--device", "cpu"])
    except SystemExit as error:
        assert "--schedules" in str(error)
    else:
        raise AssertionError("an unknown schedule must be refused")


def test_time_forwards_splits_a_round_by_forward_width(tmp_path, capsys):
    """--time-forwards: the main model's forwards by input width, for the greedy arm (the prefill, then one-token
    steps) and the speculative arm (the prefill, then 1 + drafts per verify forward); the model's own forward is back
    afterwards."""
    from hf_replayssm.bench.speculative import ForwardClock

    out = tmp_path / "spec.json"
    speculative.main(["--models", "qwen3_5", "--drafts", "qwen3_5", "--tiny", "--batches", "2", "--prompt", "32",
                      "--new", "6", "--lookup", "3", "--buffer-len", "4", "--device", "cpu", "--time-forwards",
                      "--out", str(out)])
    data = json.loads(out.read_text())
    assert [e["arm"] for e in data["results"]] == ["lookup", "draft"] and data["results"][1]["drafted"] > 0
    for entry in data["results"]:
        greedy, spec = entry["greedy_forwards"], entry["forwards"]
        assert set(greedy["by_width"]) == {"32", "1"} and greedy["by_width"]["32"][0] == 1
        assert greedy["by_width"]["1"][0] == 5  # 6 new tokens: the prefill gives the first
        assert "32" in spec["by_width"] and spec["by_width"]["32"][0] == 1
        verify = sum(c for w, (c, _) in spec["by_width"].items() if w != "32")
        assert verify == entry["verify_forwards"] and verify >= 1
        if entry["drafted"]:  # drafts were verified in wider forwards (the self-drafting arm drafts every round)
            assert any(int(w) > 1 for w in spec["by_width"] if w != "32")
        assert spec["seconds"] > 0 and spec["calls"] == verify + 1
    assert "forwards" in capsys.readouterr().out
    from hf_replayssm.bench.speculative import _load

    model = _load("qwen3_5", "cpu", None, True)[0]
    with ForwardClock(model):
        assert "forward" in vars(model)
    assert "forward" not in vars(model)  # the class's forward again


def test_first_divergences_measure_greedys_margin_in_ulps():
    """A row whose token flips at a one-ulp near-tie of greedy's bf16 logits reports margin 2^-5 at 7.0 (one ulp);
    a clear miss many ulps; a row that only stops earlier reports no margin; equal rows are not listed."""
    import torch

    greedy = [[1, 2, 3], [4, 5, 6], [7, 8, 9], [7, 8]]
    other = [[1, 2, 3], [4, 9, 6], [7, 8, 1], [7, 8, 9]]
    logits = torch.zeros(4, 3, 10)
    logits[1, 1, 5], logits[1, 1, 9] = 7.0, 7.0 - 2**-5
    logits[2, 2, 9], logits[2, 2, 1] = 6.0, 2.0
    found = speculative.first_divergences(greedy, other, logits, torch.bfloat16)
    assert [(d["row"], d["position"]) for d in found] == [(1, 1), (2, 2), (3, 2)]
    assert found[0]["margin"] == 2**-5 and found[0]["ulps"] == 1.0
    assert found[1]["margin"] == 4.0 and found[1]["ulps"] == 4.0 / 2**-5
    assert found[2]["margin"] is None and found[2]["ulps"] is None
    entry = dict(identical=False, divergences=found[:1])
    assert speculative._identity_label(entry) == "ties 1r<=1ulp"
    assert speculative._identity_label(dict(identical=False, divergences=found)) == "False"
    assert speculative._identity_label(dict(identical=False, divergences=found[1:2])) == "False"  # 128 ulps: no tie
    assert speculative._identity_label(dict(identical=True)) == "True"
    # The run that made the logits parted from the timed greedy run before row 1's divergence (another near-tie
    # rounded another way): its logits there belong to another prefix, so no margin for that row.
    reference = [[1, 2, 3], [4, 5, 6], [7, 3, 9], [7, 8]]
    found = speculative.first_divergences(greedy, other, logits, torch.bfloat16, reference)
    assert found[0]["ulps"] == 1.0 and "reference_differs" not in found[0]  # same prefix up to the position
    assert found[1]["reference_differs"] and found[1]["margin"] is None and found[1]["ulps"] is None
    assert speculative._identity_label(dict(identical=False, divergences=found[:2])) == "ties 1r<=1ulp+1?"


def test_jit_compiles_records_each_compile_and_restores_the_hook():
    """JitCompiles counts what Triton's post-compile hook reports (called here as triton.runtime.jit calls it; the
    GPU test compiles a real kernel), keeps a hook set before it running, and puts it back on exit."""
    import pytest

    knobs = pytest.importorskip("triton.knobs")
    from triton.runtime.jit import JitFunctionInfo

    from hf_replayssm.bench.compiles import JitCompiles

    seen = []

    def earlier_hook(**kwargs):
        seen.append(kwargs["fn"].name)

    def compile_event(name):  # the keywords triton.runtime.jit.JITFunction._call_hook passes
        knobs.runtime.jit_post_compile_hook(key=(name,), repr=f"{name}[num_warps=4](x: *fp32)",
                                            fn=JitFunctionInfo(speculative, name, None), compile={},
                                            is_manual_warmup=False, already_compiled=False)

    knobs.runtime.jit_post_compile_hook = earlier_hook
    try:
        with JitCompiles() as compiles:
            assert compiles.supported
            for name in ("_verify_kernel", "_fold_kernel", "_verify_kernel"):
                compile_event(name)
        assert compiles.summary() == {"_verify_kernel": 2, "_fold_kernel": 1}
        assert seen == ["_verify_kernel", "_fold_kernel", "_verify_kernel"]
        assert knobs.runtime.jit_post_compile_hook is earlier_hook
        compile_event("_after")  # outside the context: not counted
        assert compiles.summary() == {"_verify_kernel": 2, "_fold_kernel": 1}
    finally:
        knobs.runtime.jit_post_compile_hook = None


def test_sdpa_backend_pins_attention_for_a_run(tmp_path):
    """``--sdpa`` restricts scaled-dot-product attention for the whole run: the math backend computes what the default
    does; cuDNN attention (no CPU kernel) is then the only choice and fails; a bench run with ``--sdpa math`` records
    the setting and still emits plain greedy's tokens."""
    import pytest
    import torch

    from hf_replayssm.bench.attention import sdpa_backend

    q, k, v = (torch.randn(2, 4, 5, 8) for _ in range(3))
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    with sdpa_backend("math"):
        torch.testing.assert_close(torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True), expected)
    with sdpa_backend("cudnn"), pytest.raises(RuntimeError):
        torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    with pytest.raises(ValueError, match="--sdpa"):
        sdpa_backend("fastest")
    out = tmp_path / "spec.json"
    speculative.main(["--models", "qwen3_5", "--tiny", "--batches", "2", "--prompt", "32", "--new", "6", "--lookup",
                      "3", "--buffer-len", "4", "--device", "cpu", "--sdpa", "math", "--out", str(out)])
    data = json.loads(out.read_text())
    assert data["settings"]["sdpa"] == "math" and data["results"][0]["identical"], data["results"][0]


def test_sdpa_fused_pins_make_transformers_repeat_kv_heads():
    """The fused kernels refuse grouped-query inputs, which transformers passes for mask-free calls (H200 run 94:
    ``--sdpa efficient`` failed on Qwen3.5's prefill); under those pins transformers repeats the key / value heads
    (``use_gqa_in_sdpa`` False), and the switch comes back afterwards, also after an error."""
    import pytest
    import torch
    from transformers.integrations import sdpa_attention

    from hf_replayssm.bench.attention import sdpa_backend

    k = v = torch.randn(1, 2, 5, 8)
    assert sdpa_attention.use_gqa_in_sdpa(None, k, v) is True  # what a mask-free call asks for by default
    for name in ("efficient", "flash"):
        with sdpa_backend(name):
            assert sdpa_attention.use_gqa_in_sdpa(None, k, v) is False
        assert sdpa_attention.use_gqa_in_sdpa(None, k, v) is True
    with pytest.raises(KeyError), sdpa_backend("efficient"):
        raise KeyError("inside")
    assert sdpa_attention.use_gqa_in_sdpa(None, k, v) is True
    with sdpa_backend("math"):  # the math kernel takes grouped-query inputs: left alone
        assert sdpa_attention.use_gqa_in_sdpa(None, k, v) is True


def test_time_forwards_keeps_the_forward_signature(tmp_path):
    """generate() checks its keyword arguments against ``model.forward``'s signature; the timed forward keeps the
    model's, so a model whose cache keyword is ``cache`` (transformers 5.25's Nemotron-H) still runs with
    --time-forwards (a bare wrapper made generate() refuse ``cache`` as unused)."""
    import inspect

    from hf_replayssm.bench.speculative import ForwardClock, _load

    model = _load("small-mamba2", "cpu", None, True)[0]
    before = inspect.signature(model.forward)
    with ForwardClock(model):
        assert inspect.signature(model.forward) == before
    out = tmp_path / "spec.json"
    speculative.main(["--models", "small-mamba2", "--batches", "1", "--prompt", "24", "--new", "4", "--lookup", "3",
                      "--repeats", "1", "--device", "cpu", "--time-forwards", "--out", str(out)])
    entry = json.loads(out.read_text())["results"][0]
    assert entry["forwards"]["calls"] == entry["verify_forwards"] + 1
