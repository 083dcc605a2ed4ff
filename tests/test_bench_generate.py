"""The end-to-end generate() benchmark (``hf-replayssm bench generate``) on tiny shaped models on CPU: every arm
emits the same tokens, reports positive rates, says whether it really compiled (or why it was skipped), and the
speculative mode reports acceptance and equality with plain greedy."""

import json
import statistics

import pytest
import torch
from conftest import STOCK_ROLLS_BACK_LINEAR

from hf_replayssm.bench import generate as bench
from hf_replayssm.cache import ReplayCache

TINY_RUN = ["--tiny", "--layers", "4", "--prompt", "16", "--new", "8", "--repeats", "1", "--dtype", "float32",
            "--device", "cpu", "--compile-backend", "eager"]


def _main(tmp_path, *args) -> dict:
    out = tmp_path / "results.json"
    assert bench.main([*TINY_RUN, *args, "--out", str(out)]) == 0
    return json.loads(out.read_text())


def test_generate_arms_agree_and_report_rates(tmp_path):
    seed = int(torch.randint(0, 1000, (1,)))
    results = _main(tmp_path, "--models", "qwen3_5", "--batches", "2", "--arms", "stock,replay,replay-compiled",
                    "--seed", str(seed))
    env = results["environment"]
    assert env["device"] == "cpu" and env["torch"] == torch.__version__ and isinstance(env["fla"], bool)
    assert "transformers" in env and "date" in env
    entries = {e["arm"]: e for e in results["results"]}
    assert list(entries) == ["stock", "replay", "replay-compiled"] and results["speculative"] == []
    for arm in ("stock", "replay"):
        entry = entries[arm]
        assert entry["model"] == "qwen3_5" and entry["batch"] == 2 and entry["new_tokens"] == 8
        assert entry["tokens_per_s"] > 0 and entry["ms_per_step"] > 0 and entry["prefill_ms"] > 0
        assert entry["total_ms"] > entry["prefill_ms"]
        assert abs(entry["tokens_per_s"] - 2 * 7 * 1e3 / (entry["total_ms"] - entry["prefill_ms"])) < 1e-6 * entry[
            "tokens_per_s"]
        assert entry["compiled"] is False and entry["identical_to_stock"] is True
    assert entries["replay"]["tokens_checksum"] == entries["stock"]["tokens_checksum"]
    assert entries["stock"]["x_vs_best_stock"] == 1.0 and entries["stock"]["x_paired_median"] == 1.0
    replay, stock = entries["replay"], entries["stock"]
    assert replay["x_paired_median"] == pytest.approx(statistics.median(
        r / s for r, s in zip(replay["repeats_tokens_per_s"], stock["repeats_tokens_per_s"], strict=True)))
    compiled = entries["replay-compiled"]
    if "skipped" in compiled:  # ReplayCache cannot be static / compileable in this checkout
        assert compiled["skipped"] and "tokens_per_s" not in compiled
    else:  # it ran: it must have gone through generate's compiled forward, to the same tokens
        assert compiled["compiled"] is True and "warning" not in compiled
        assert compiled["identical_to_stock"] is True and compiled["tokens_per_s"] > 0


def test_a_cache_that_is_not_compileable_skips_the_compiled_arm(monkeypatch):
    monkeypatch.setattr(ReplayCache, "is_compileable", property(lambda self: False))
    model = bench.build_model("nemotron_h", "cpu", torch.float32, tiny=True, layers=4)
    entries = bench.measure_generate(model, batch=1, prompt=8, new_tokens=4, arms=("stock", "replay-compiled"),
                                     repeats=1, settings=bench.Settings(compile_backend="eager", compile_mode=None))
    skipped = entries[1]
    assert skipped["arm"] == "replay-compiled" and "tokens_per_s" not in skipped
    assert "is_compileable" in skipped["skipped"] or "max_cache_len" in skipped["skipped"]
    assert "skipped: " in bench.table(entries)


def test_speculative_mode_matches_plain_greedy(tmp_path):
    # an 8-layer model, its draft a copy of the first 4 (Kimi-Linear in transformers needs an attention layer)
    results = _main(tmp_path, "--speculative", "--models", "kimi_linear", "--layers", "8", "--draft-layers", "4",
                    "--lookup", "3", "--prompt-kinds", "code-edit")
    entries = {e["arm"]: e for e in results["speculative"]}
    assert set(entries) == set(bench.SPECULATIVE_ARMS) and results["results"] == []
    for arm in ("lookup-stock", "draft-stock"):  # transformers' own speculation: refused, or run and compared
        entry = entries.pop(arm)
        if STOCK_ROLLS_BACK_LINEAR:
            assert entry["tokens_per_s"] > 0 and entry["drafted"] > 0 and isinstance(entry["identical"], bool)
        else:
            assert "stateful" in entry["error"] and "tokens_per_s" not in entry
    for arm, entry in entries.items():
        assert entry["batch"] == 1 and entry["tokens_per_s"] > 0
        assert entry["identical"] is True, arm
    for arm in ("lookup-replay", "draft-replay"):
        entry = entries[arm]
        assert entry["drafted"] > 0 and 0 <= entry["accepted"] <= entry["drafted"]
        assert 0.0 <= entry["acceptance"] <= 1.0
    assert entries["greedy-stock"]["acceptance"] is None and entries["greedy-stock"]["drafted"] == 0


def test_speculative_arms_on_a_static_cache(tmp_path):
    """``lookup-static`` / ``draft-static``: speculation on a ReplayCache with max_cache_len (static attention
    layers), sized by the bench, eager; ``-compiled``: the same through transformers' compiled forward (from 5.25 the
    verify forwards too; 5.17 runs them eagerly, which the entry says), beside plain greedy compiled on a static
    cache; the tokens equal plain greedy, and no compiled arm compiles again in its timed runs."""
    from conftest import assisted_forwards_compile

    arms = ["greedy-replay", "lookup-static", "draft-static", "greedy-static-compiled", "lookup-static-compiled",
            "draft-static-compiled"]
    results = _main(tmp_path, "--speculative", "--models", "kimi_linear", "--layers", "8", "--draft-layers", "4",
                    "--lookup", "3", "--prompt-kinds", "code-edit", "--repeats", "2",
                    "--speculative-arms", ",".join(arms))
    entries = {e["arm"]: e for e in results["speculative"]}
    assert set(entries) == set(arms)
    for arm in arms[1:]:
        entry = entries[arm]
        assert entry["tokens_per_s"] > 0 and entry["identical"] is True, (arm, entry)
        assert (entry["drafted"] > 0) == (not arm.startswith("greedy")), (arm, entry)
    assert entries["greedy-static-compiled"]["compiled"] is True
    for arm in ("lookup-static-compiled", "draft-static-compiled"):
        assert entries[arm]["compiled"] is assisted_forwards_compile(), (arm, entries[arm])
        assert entries[arm]["dynamo_frames_timed"] == 0, (arm, entries[arm])  # one cache: no recompilation
    assert entries["lookup-static"]["compiled"] is False
    table = bench.speculative_table(results["speculative"])
    assert ("EAGER!" in table) is not assisted_forwards_compile()


def test_speculative_mode_on_a_bundled_model(tmp_path):
    """A bundled model (tiny-gdn-copy, with its tokenizer): the passage prompt by default, a bundled draft model by
    name, tokens equal to plain greedy; without --draft-model its draft arms are skipped with the reason."""
    arms = "greedy-replay,lookup-replay,draft-replay"
    out = tmp_path / "bundled.json"
    common = ["--speculative", "--models", "tiny-gdn-copy", "--prompt", "96", "--new", "12", "--repeats", "1",
              "--dtype", "float32", "--device", "cpu", "--lookup", "4", "--speculative-arms", arms]
    assert bench.main([*common, "--draft-model", "tiny-gdn", "--out", str(out)]) == 0
    entries = {e["arm"]: e for e in json.loads(out.read_text())["speculative"]}
    assert set(entries) == set(arms.split(","))
    for arm, entry in entries.items():
        assert entry["prompt_kind"] == "passage" and entry["model"] == "tiny-gdn-copy"
        assert entry["draft_model"] == "tiny-gdn" and entry["tokens_per_s"] > 0
        assert entry["identical"] is True, arm
    assert entries["lookup-replay"]["drafted"] > 0 and entries["draft-replay"]["drafted"] > 0
    assert bench.main([*common, "--out", str(out)]) == 0
    skipped = {e["arm"]: e for e in json.loads(out.read_text())["speculative"]}["draft-replay"]
    assert "--draft-model" in skipped["skipped"] and "tokens_per_s" not in skipped


def test_special_tokens_and_prompt_kinds():
    model = bench.build_model("qwen3_5", "cpu", torch.float32, tiny=True, layers=4)
    assert bench.special_token_ids(model) == [0, 1, 2]
    with pytest.raises(ValueError, match="needs a model with a tokenizer"):
        bench.speculative_prompt("passage", 256, 32)
    with pytest.raises(ValueError, match="code-edit"):
        bench.speculative_prompt("poem", 256, 32)


@pytest.mark.parametrize("kind", bench.PROMPT_KINDS)
def test_repetitive_prompts(kind):
    seed = int(torch.randint(0, 1000, (1,)))
    ids = bench.PROMPTS[kind](vocab=32000, length=512, seed=seed)
    assert ids.shape == (1, 512) and ids.dtype == torch.long
    assert int(ids.min()) >= 3 and int(ids.max()) < 32000  # no special tokens
    assert torch.equal(ids, bench.PROMPTS[kind](vocab=32000, length=512, seed=seed))
    # repetitive: far fewer distinct 3-grams than positions (random ids would give ~510)
    grams = {tuple(ids[0, i : i + 3].tolist()) for i in range(510)}
    assert len(grams) < 0.7 * 510


def test_layer_overrides_repeat_the_pattern():
    cut = bench.layer_overrides("kimi_linear", 6, {})
    assert cut["num_hidden_layers"] == 6
    assert cut["layer_types"] == ["linear_attention"] * 3 + ["full_attention"] + ["linear_attention"] * 2
    assert len(cut["mlp_layer_types"]) == 6
    assert bench.layer_overrides("nemotron_h", 2, {}) == {"layers_block_type": ["mamba", "mlp"]}


def test_a_compiled_arm_without_cuda_graphs_is_flagged():
    """On CUDA a compiled arm whose graphs Inductor ran without CUDA graphs (its skip counter grew) is reported as
    such, in the JSON and in the table; on the CPU (no CUDA graphs to expect) it is not."""
    def run(cuda: bool, skips: int) -> dict:
        return dict(seconds=1.0, prefill_s=0.1, peak_bytes=1, compiled=True, dynamo_frames=0, cudagraph_skips=skips,
                    cuda=cuda, tokens=torch.zeros(1, 4, dtype=torch.long))

    flagged = bench._summarise("replay-compiled", [run(True, 0)], run(True, 2), batch=1, new_tokens=4)
    assert flagged["cudagraph_skips"] == 2 and "skipped CUDA graphs 2 time(s)" in flagged["warning"]
    fine = bench._summarise("replay-compiled", [run(True, 0)], run(True, 0), batch=1, new_tokens=4)
    on_cpu = bench._summarise("replay-compiled", [run(False, 0)], run(False, 3), batch=1, new_tokens=4)
    assert "warning" not in fine and "warning" not in on_cpu
    rows = bench.table([{**e, "model": "m", "batch": 1} for e in (flagged, fine)]).splitlines()
    assert "NOGRAPH" in rows[2] and "NOGRAPH" not in rows[3] and " yes " in rows[3]
    before = bench.cudagraph_skips()
    assert isinstance(before, int) and before >= 0


def test_triton_compiles_inside_timed_runs_are_reported():
    """A Triton kernel compiled inside a timed run (Dynamo's frame count does not see it) is summed over the runs,
    warned about in the JSON and the table; none compiled gives {} and no warning; a Triton that cannot count gives
    None (not counted), not 0."""
    def run(compiles) -> dict:
        return dict(seconds=1.0, prefill_s=0.1, peak_bytes=1, compiled=True, dynamo_frames=0, cudagraph_skips=0,
                    jit_compiles=compiles, cuda=True, tokens=torch.zeros(1, 4, dtype=torch.long))

    flagged = bench._summarise("replay-compiled", [run({"_k": 1}), run({"_k": 1, "_j": 2})], run({}), batch=1,
                               new_tokens=4)
    assert flagged["jit_compiles_in_timed_runs"] == {"_k": 2, "_j": 2}
    assert "compiled Triton kernels (_k x2, _j x2)" in flagged["warning"]
    fine = bench._summarise("replay-compiled", [run({})], run({"_k": 5}), batch=1, new_tokens=4)  # warm-up compiles
    assert fine["jit_compiles_in_timed_runs"] == {} and "warning" not in fine
    uncounted = bench._summarise("replay-compiled", [run(None)], run(None), batch=1, new_tokens=4)
    assert uncounted["jit_compiles_in_timed_runs"] is None and "warning" not in uncounted
    rows = bench.table([{**e, "model": "m", "batch": 1} for e in (flagged, fine)]).splitlines()
    assert "warning" in rows[3] and "_k x2" in rows[3] and len(rows) == 5


def test_eager_separated_arms_run_by_name():
    """``replay-fp8`` / ``replay-nvfp4`` (eager ReplayCache with a separated precision policy) run when asked for,
    on a fresh cache of that policy; an unknown arm names them among the choices."""
    model = bench.build_model("nemotron_h", "cpu", torch.float32, tiny=True, layers=4)
    entries = bench.measure_generate(model, batch=1, prompt=8, new_tokens=4, arms=("stock", "replay-fp8"),
                                     repeats=1, settings=bench.Settings(compile_backend="eager", compile_mode=None))
    separated = entries[1]
    assert separated["arm"] == "replay-fp8" and separated["tokens_per_s"] > 0 and separated["compiled"] is False
    kwargs = bench.arm_kwargs("replay-nvfp4", model, bench.Settings(), 16)
    cache = next(value for value in kwargs.values() if isinstance(value, ReplayCache))
    assert kwargs["disable_compile"] is True and cache.policy.read_format == "nvfp4"
    with pytest.raises(ValueError, match="replay-nvfp4"):
        bench.arm_kwargs("replay-int4", model, bench.Settings(), 16)


def test_paired_median_ratio_pairs_repeats_and_refuses_unequal_counts():
    # a drifting host: every repeat of the reference slower than the one before; the arm 10 % faster in each pair
    reference = [100.0, 80.0, 60.0]
    assert bench.paired_median_ratio([110.0, 88.0, 66.0], reference) == pytest.approx(1.1)
    assert bench.paired_median_ratio([50.0, 88.0, 300.0], reference) == pytest.approx(1.1)  # the median pair
    with pytest.raises(ValueError, match="same number of repeats"):
        bench.paired_median_ratio([1.0, 2.0], reference)


def test_speculative_divergences_name_near_ties_and_only_them():
    """An arm whose tokens part from plain greedy's gets the place and greedy's margin there in ulps: its runner-up
    token there reads as a near-tie only if greedy's top two logits are that close, and its least likely token reads
    ``false`` (a wrong token is never called a tie)."""
    from conftest import get_model

    model = get_model("qwen3_5_text")
    ids = torch.randint(0, model.config.vocab_size, (1, 10), generator=torch.Generator().manual_seed(3))
    new, position = 6, 2
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=new,
                             eos_token_id=None, output_logits=True, return_dict_in_generate=True)
    plain = out.sequences[:, ids.shape[1]:].cpu()
    scores = out.logits[position][0].float()
    runner_up, worst = scores.topk(2).indices[1].item(), scores.argmin().item()
    entries, runs = [], {}
    for arm, token in (("near", runner_up), ("wrong", worst)):
        tokens = plain.clone()
        tokens[0, position] = token
        runs[arm] = [dict(seconds=1.0, tokens=tokens)]
        entries.append(dict(arm=arm, identical=False))
    entries.append(dict(arm="same", identical=True))
    bench._label_divergences(model, ids, new, "greedy-stock", plain, entries, runs)
    near, wrong, same = entries
    ulp = torch.finfo(torch.float32).eps * 2.0 ** torch.floor(torch.log2(scores.max().abs()))
    assert near["divergences"][0]["position"] == position == wrong["divergences"][0]["position"]
    assert near["divergences"][0]["ulps"] == pytest.approx(float((scores.max() - scores[runner_up]) / ulp))
    assert wrong["divergences"][0]["ulps"] > 1e4 and bench._identical(wrong) == "false"
    assert bench._identical(near).startswith("ties 1r<=") or bench._identical(near) == "false"
    assert "divergences" not in same and bench._identical(same) == "true"
