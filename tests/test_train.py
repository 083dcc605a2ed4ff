"""The training script: per-head decay half-lives against the gate parameters, the small layouts' weight budget, and
a CPU smoke run whose output loads offline with from_pretrained."""

from __future__ import annotations

import math
import random
import sys

import pytest
import torch
import torch.nn.functional as F

from hf_replayssm.adapters import find_mixers
from hf_replayssm.adapters.base import reference_function
from hf_replayssm.models import bundled_path
from hf_replayssm.models import train as train_script
from hf_replayssm.tiny import tiny_model

FAMILIES = ("nemotron_h", "qwen3_5_text", "kimi_linear")


def _pin_gates(model, seed: int) -> dict[int, torch.Tensor]:
    """Make every SSM layer's decay input-independent with known per-head (KDA: per-channel) values; returns the
    expected half-lives per layer, [H] or [H, K]."""
    gen = torch.Generator().manual_seed(seed)
    expected = {}
    with torch.no_grad():
        for idx, (mixer, _) in find_mixers(model).items():
            if hasattr(mixer, "forget_gate"):  # KDA: g = -exp(A_log[h]) * softplus(f_b(f_a(x)) + dt_bias[h, k])
                gate = mixer.forget_gate
                gate.f_b_proj.weight.zero_()
                heads, dim = gate.num_heads, gate.head_dim
                gate.A_log.copy_(torch.empty(1, 1, heads, 1).uniform_(-4, 0, generator=gen))
                gate.dt_bias.copy_(torch.randn(heads * dim, generator=gen))
                rate = gate.A_log.exp().view(heads, 1) * F.softplus(gate.dt_bias.view(heads, dim))
            elif hasattr(mixer, "in_proj_a"):  # GDN: g = -exp(A_log) * softplus(in_proj_a(x) + dt_bias)
                mixer.in_proj_a.weight.zero_()
                mixer.A_log.copy_(torch.empty_like(mixer.A_log).uniform_(-4, 0, generator=gen))
                mixer.dt_bias.copy_(torch.randn(mixer.dt_bias.shape, generator=gen))
                rate = mixer.A_log.exp() * F.softplus(mixer.dt_bias)
            else:  # Mamba-2: log decay = -exp(A_log) * max(softplus(dt + dt_bias), time_step_min); dt rows last
                mixer.in_proj.weight[-mixer.num_heads:].zero_()
                if mixer.in_proj.bias is not None:
                    mixer.in_proj.bias[-mixer.num_heads:].zero_()
                mixer.A_log.copy_(torch.empty_like(mixer.A_log).uniform_(-4, 0, generator=gen))
                mixer.dt_bias.copy_(torch.randn(mixer.dt_bias.shape, generator=gen))
                dt = F.softplus(mixer.dt_bias).clamp(min=mixer.time_step_limit[0], max=mixer.time_step_limit[1])
                rate = mixer.A_log.exp() * dt
            expected[idx] = math.log(2) / rate.double()
    return expected


@pytest.mark.parametrize("model_type", FAMILIES)
def test_half_lives_match_pinned_gates(model_type):
    model = tiny_model(model_type)
    expected = _pin_gates(model, seed=3)
    ids = torch.randint(3, model.config.vocab_size, (2, 40), generator=torch.Generator().manual_seed(4))
    layers = train_script.decay_half_lives(model, ids)
    assert [layer["layer"] for layer in layers] == sorted(expected)
    for layer in layers:
        want = expected[layer["layer"]]
        if want.dim() == 2:
            torch.testing.assert_close(layer["channel_half_lives"].double(), want, rtol=1e-4, atol=0)
            torch.testing.assert_close(layer["half_lives"].double(), want.median(dim=-1).values, rtol=1e-4, atol=0)
        else:
            assert layer["channel_half_lives"] is None
            torch.testing.assert_close(layer["half_lives"].double(), want, rtol=1e-4, atol=0)
        assert len(set(layer["half_lives"].tolist())) > 1  # the heads differ, so a per-head mix-up would show


@pytest.mark.parametrize("model_type", FAMILIES)
def test_half_lives_on_a_random_model(model_type):
    """Input-dependent gates: one finite positive half-life per head of every SSM layer, and the recurrence
    functions are put back afterwards."""
    model = tiny_model(model_type)
    mixers = find_mixers(model)
    originals = {(mod, name): getattr(sys.modules[type(m).__module__], name)
                 for m, adapter in mixers.values() for mod in [type(m).__module__] for name in adapter.interceptors}
    ids = torch.randint(3, model.config.vocab_size, (1, 24), generator=torch.Generator().manual_seed(5))
    layers = train_script.decay_half_lives(model, ids)
    assert len(layers) == len(mixers)
    for layer in layers:
        values = layer["half_lives"]
        assert values.numel() >= 2 and torch.isfinite(values).all() and (values > 0).all()
    for (mod, name), fn in originals.items():
        assert getattr(sys.modules[mod], name) is fn
    text = train_script.describe_half_lives(layers)
    assert text.startswith(f"all {sum(layer['half_lives'].numel() for layer in layers)} heads")


@pytest.mark.parametrize("arch", sorted(train_script.ARCHS))
def test_small_layouts_fit_8_mb_of_bf16(arch):
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(arch, vocab_size=2048, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                                  tie_word_embeddings=True, **train_script.ARCHS[arch]["small"])
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    params = sum(p.numel() for p in model.parameters())
    assert params > 2_000_000 and 2 * params <= train_script.MAX_WEIGHT_BYTES
    assert len(find_mixers(model)) >= 3


def _plays(folder, n_lines: int = 3000) -> None:
    """A stand-in for the plays (seeded verse from the recall task's word list): no download in tests."""
    from hf_replayssm.eval.recall import filler_pieces

    pieces = filler_pieces(random.Random(0))
    folder.mkdir()
    (folder / "play_gut.txt").write_text("".join(next(pieces) for _ in range(n_lines * 8)))


@pytest.mark.parametrize(("arch", "own_tokenizer"), [("kimi_linear", False), ("nemotron_h", True),
                                                     ("qwen3_5_text", False)])
def test_smoke_run_saves_a_loadable_model(tmp_path, monkeypatch, arch, own_tokenizer):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _plays(tmp_path / "texts")
    out = tmp_path / "model"
    argv = ["--arch", arch, "--out", str(out), "--text-dir", str(tmp_path / "texts"), "--steps", "3",
            "--context", "64", "--batch", "2", "--seed", "7", "--recall-mix", "0.5", "--device", "cpu"]
    argv += ["--vocab-size", "400"] if own_tokenizer else ["--tokenizer", str(bundled_path("tiny-gdn"))]
    argv += ["--slow-gdn-init"] if arch == "qwen3_5_text" else []
    train_script.main(argv)

    note = (out / "TRAINING.txt").read_text()
    assert note.startswith("command: python -m hf_replayssm.models.train --arch " + arch)
    assert "seed=7" in note and "weights=bfloat16" in note and "final_train_loss=" in note
    assert f"slow_gdn_init={arch == 'qwen3_5_text'}" in note
    assert "held_out_loss=" in note and "decay half-lives per head" in note and "\nlayer " in note
    loss = float(note.split("final_train_loss=")[1].split()[0])
    assert math.isfinite(loss) and 0 < loss < 10

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert model.config.model_type == arch and len(tokenizer) == model.config.vocab_size
    ids = tokenizer("Mark me: my name is Romeo.", return_tensors="pt")["input_ids"]
    logits = model(input_ids=ids).logits
    assert logits.shape == (1, ids.shape[1], model.config.vocab_size) and torch.isfinite(logits).all()


def test_max_minutes_cuts_the_run(tmp_path):
    """A budget the first steps show cannot hold the planned steps ends the run early, and TRAINING.txt says so."""
    _plays(tmp_path / "texts")
    out = tmp_path / "model"
    train_script.main(["--arch", "nemotron_h", "--out", str(out), "--text-dir", str(tmp_path / "texts"), "--steps",
                       "100000", "--context", "32", "--batch", "1", "--max-minutes", "1e-4", "--device", "cpu",
                       "--tokenizer", str(bundled_path("tiny-gdn"))])
    note = (out / "TRAINING.txt").read_text()
    assert f"steps={train_script._TIMED_STEPS + 1} (of 100000: --max-minutes)" in note


def test_repeat_rows_repeat_one_passage():
    rows = train_script.RepeatRows(seed=0)
    text = torch.arange(3, 500)
    lengths = set()
    for _ in range(20):
        ids, labels = rows.row(text, offset=40, length=129)
        assert ids.shape == (129,) and labels is ids
        period = int((ids[1:] == ids[0]).nonzero()[0]) + 1  # the text is distinct tokens: the first repeat
        assert 16 <= period <= 64 and torch.equal(ids[:period], text[40 : 40 + period])
        assert torch.equal(ids[period:], ids[: 129 - period])  # every later token copies the one a period back
        lengths.add(period)
    assert len(lengths) > 5  # passage lengths vary from row to row


def test_repeat_rows_of_random_tokens():
    """--repeat-random: the passage is uniform tokens above the special ones, fresh per row, repeated."""
    rows = train_script.RepeatRows(seed=1, random_tokens=True, vocab=300, first_token=3)
    passages = []
    for _ in range(10):
        ids, labels = rows.row(torch.arange(3, 500), offset=0, length=129)
        assert labels is ids and int(ids.min()) >= 3 and int(ids.max()) < 300
        period = next(p for p in range(16, 65) if torch.equal(ids[p:], ids[: 129 - p]))
        passages.append(ids[:period])
    assert len({tuple(p.tolist()) for p in passages}) == 10  # not the text, not one passage again
    with pytest.raises(ValueError, match="vocabulary above token 3"):
        train_script.RepeatRows(seed=0, random_tokens=True, vocab=3)


def test_fine_tune_from_a_saved_model(tmp_path):
    """--init-from starts from a saved model's weights (its layout and tokenizer); rows of repeated passages are
    mixed in; TRAINING.txt records both; another --arch is refused."""
    from transformers import AutoModelForCausalLM

    _plays(tmp_path / "texts")
    base = bundled_path("tiny-mamba2")
    out = tmp_path / "tuned"
    common = ["--text-dir", str(tmp_path / "texts"), "--steps", "2", "--context", "48", "--batch", "2",
              "--device", "cpu", "--lr", "1e-4"]
    train_script.main(["--arch", "nemotron_h", "--out", str(out), "--init-from", str(base), "--repeat-mix", "0.5",
                       "--repeat-random", *common])
    note = (out / "TRAINING.txt").read_text()
    assert "repeat_mix=0.5 repeat_random=True" in note and f"init_from={base}" in note and "size=init-from" in note
    before = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    after = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    assert after.config.hidden_size == before.config.hidden_size
    assert after.config.num_hidden_layers == before.config.num_hidden_layers
    weight_before = before.get_input_embeddings().weight
    weight_after = after.get_input_embeddings().weight
    # started from the saved weights: a few small steps (and the bf16 save) move them only a little
    assert (weight_after - weight_before).abs().max() < 0.05 * weight_before.abs().max()
    with pytest.raises(ValueError, match="not --arch qwen3_5_text"):
        train_script.main(["--arch", "qwen3_5_text", "--out", str(tmp_path / "x"), "--init-from", str(base),
                           *common])
    small_vocab = tmp_path / "small-vocab"
    tiny_model("nemotron_h", seed=0).save_pretrained(small_vocab)  # 128 embeddings, the bundled tokenizer's 2048
    with pytest.raises(ValueError, match="give the tokenizer it was trained with"):
        train_script.main(["--arch", "nemotron_h", "--out", str(tmp_path / "y"), "--init-from", str(small_vocab),
                           "--tokenizer", str(base), *common])


def test_bad_arguments_are_refused(tmp_path):
    with pytest.raises(ValueError, match="recall-mix"):
        train_script.main(["--arch", "nemotron_h", "--out", str(tmp_path), "--recall-mix", "2"])
    with pytest.raises(ValueError, match="repeat-mix"):
        train_script.main(["--arch", "nemotron_h", "--out", str(tmp_path), "--recall-mix", "0.6", "--repeat-mix",
                           "0.6"])
    with pytest.raises(SystemExit):
        train_script.main(["--arch", "mamba", "--out", str(tmp_path)])


def test_slow_gdn_init_lengthens_gdn_half_lives():
    model = tiny_model("qwen3_5_text")
    ids = torch.randint(3, model.config.vocab_size, (1, 32), generator=torch.Generator().manual_seed(6))
    before = torch.cat([layer["half_lives"] for layer in train_script.decay_half_lives(model, ids)])
    assert train_script.slow_gdn_decay_init(model, seed=0) == len(find_mixers(model))
    dt = torch.cat([F.softplus(m.dt_bias.detach()) for m, _ in find_mixers(model).values()])
    assert dt.min() >= 1e-3 * (1 - 1e-5) and dt.max() <= 1e-1 * (1 + 1e-5) and dt.std() > 0
    after = torch.cat([layer["half_lives"] for layer in train_script.decay_half_lives(model, ids)])
    assert after.median() > 10 * before.median()
    assert train_script.slow_gdn_decay_init(tiny_model("nemotron_h"), seed=0) == 0  # Mamba-2 is left alone


def test_recall_rows_supervise_only_the_answer():
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(bundled_path("tiny-gdn"))
    rows = train_script.RecallRows(tokenizer, context=129, seed=0)
    text = torch.arange(3, 500)
    ids, labels = rows.row(text, offset=10, length=129)
    assert ids.shape == labels.shape == (129,)
    first = int((labels != -100).nonzero()[0])
    decoded = tokenizer.decode(ids[:first].tolist())
    assert decoded.startswith("Mark me: my name is ") and decoded.endswith("What is my name? My name is")
    key = decoded.split("my name is ")[1].split(".")[0]
    assert tokenizer.decode(ids[first:].tolist()).startswith(f" {key}.\n")
    assert torch.equal(labels[first:], ids[first:])  # the answer and the text after it are targets
    doc_end = first + len(tokenizer(f" {key}.\n", add_special_tokens=False)["input_ids"])
    assert torch.equal(ids[doc_end:], text[10 : 10 + 129 - doc_end])  # then the text from the offset
    ids2, _ = rows.row(text, offset=10, length=129)
    assert not torch.equal(ids, ids2)  # a new document each row


@pytest.mark.parametrize("arch", ["qwen3_5_text", "kimi_linear"])
def test_torch_recurrence_rebinds_the_decorated_kernels(arch, monkeypatch):
    """--torch-recurrence: the module functions the mixers call become transformers' own torch recurrences (what
    the kernel decorator wrapped), and the model still runs."""
    model = tiny_model(arch, seed=0)
    mixer, adapter = next(iter(find_mixers(model).values()))
    module = sys.modules[type(mixer).__module__]
    # the kernel decorators' wrappers (beneath the replay hooks, if an earlier test in this process installed them)
    decorated = {name: getattr(getattr(module, name), "_replayssm_original", getattr(module, name))
                 for name in adapter.interceptors if hasattr(module, name)}
    wrapped = {name: fn for name, fn in decorated.items() if reference_function(fn) is not fn}
    assert wrapped, "transformers no longer decorates these recurrences: the flag has nothing to undo"
    for name, function in wrapped.items():
        monkeypatch.setattr(module, name, function)  # restored after the test (the rebinding is process-wide)
    assert train_script.use_torch_recurrences(model) == len(wrapped)  # once per function, not per layer
    for name, function in wrapped.items():
        rebound = getattr(module, name)
        assert rebound is reference_function(function) and reference_function(rebound) is rebound
    ids = torch.randint(0, model.config.vocab_size, (1, 12))
    assert torch.isfinite(model(input_ids=ids).logits).all()
