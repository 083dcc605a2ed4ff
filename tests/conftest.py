import functools
import importlib.util
import sys
import warnings
from pathlib import Path

import pytest
import torch
import transformers

from hf_replayssm import cache_argument
from hf_replayssm.tiny import tiny_model

transformers.logging.set_verbosity_error()
warnings.filterwarnings("ignore", message=".*fall.*back.*")

# Every architecture ReplayCache supports, as tiny configs this transformers version can build.
SUPPORTED = [
    "nemotron_h", "falcon_h1", "bamba", "granitemoehybrid", "zamba2", "mamba2",
    "qwen3_next", "qwen3_5_text", "qwen3_5_moe_text", "olmo_hybrid", "lara_mini",
    "kimi_linear", "bailing_hybrid", "glm5_next",
]
# transformers 5.25 rolls its own linear-attention layers back (it keeps per-token recurrent states while recording)
# and no longer refuses assisted generation for them; older versions refuse it ("stateful") and crop the attention
# layers only.
STOCK_ROLLS_BACK_LINEAR = hasattr(transformers.Cache, "get_recurrent_states_to_keep")
# One per family and layer kind (plain SSM layers, hybrid attention+SSM layers) for the slower speculative tests.
REPRESENTATIVE = ["nemotron_h", "falcon_h1", "zamba2", "qwen3_next", "qwen3_5_text", "kimi_linear"]


@functools.cache
def _model(model_type: str, seed: int):
    try:
        return tiny_model(model_type, seed=seed)
    except ValueError as error:  # model type absent from this transformers version
        if "Unrecognized" in str(error) or "does not recognize" in str(error):
            return None
        raise


def get_model(model_type: str, seed: int = 0):
    model = _model(model_type, seed)
    if model is None:
        pytest.skip(f"transformers {transformers.__version__} has no {model_type}")
    return model


def cache_kwarg(model) -> str:
    """The keyword the model's forward takes its cache under (``cache`` in newer 5.x, ``past_key_values`` in 5.17,
    ``cache_params`` for pure Mamba-2 in 5.17). A stock cache passed under another name can be silently ignored."""
    return cache_argument(model)


def decode(model, tokens, prompt_len, cache):
    """Decoding through ``cache``: prefill ``tokens[:, :prompt_len]``, then one token at a time. Returns the logits
    of the last position of every forward, [batch, 1 + tokens - prompt_len, vocab]."""
    key = cache_kwarg(model)
    with torch.no_grad():
        logits = [model(tokens[:, :prompt_len], **{key: cache}, use_cache=True).logits[:, -1]]
        for pos in range(prompt_len, tokens.shape[1]):
            logits.append(model(tokens[:, pos : pos + 1], **{key: cache}, use_cache=True).logits[:, -1])
    return torch.stack(logits, dim=1)


def generate_compiled_once(model, prompt, cache, config, **kwargs):
    """``generate()`` on ``cache`` with ``compile_config=config`` from a fresh Dynamo, asserting that the decode step
    took the compiled path as one graph with no graph break."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    out = model.generate(prompt, **{cache_kwarg(model): cache}, compile_config=config, **kwargs)
    assert getattr(model, "_compiled_call", None) is not None, "generate did not take the compiled path"
    assert counters["stats"]["unique_graphs"] == 1 and not counters["graph_break"], dict(counters["graph_break"])
    return out


def load_offline_tool(name: str):
    """A script of ``benchmarks/offline/`` (not a package) imported as a module; its folder goes on the import path,
    as it does for a script run by path (the scripts import each other)."""
    folder = Path(__file__).resolve().parents[1] / "benchmarks" / "offline"
    if str(folder) not in sys.path:
        sys.path.append(str(folder))
    path = folder / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@functools.cache
def assisted_forwards_compile() -> bool:
    """Whether this transformers version compiles the verify forwards of assisted decoding for a compileable cache
    (5.25 does; 5.17 runs them eagerly)."""
    import inspect

    from transformers.generation.utils import GenerationMixin

    return "get_compiled_call" in inspect.getsource(GenerationMixin._assisted_decoding)


def max_logit_diff(a, b) -> float:
    assert len(a) == len(b), (len(a), len(b))
    return max((x - y).abs().max().item() for x, y in zip(a, b, strict=True))


def row_logit_diffs(a, b) -> torch.Tensor:
    """[rows] the largest |logit difference| of each row over every step; equal entries (-inf too) give 0, a NaN inf."""
    assert len(a) == len(b), (len(a), len(b))
    per_step = [torch.where(x == y, 0.0, (x.float() - y.float()).abs()).nan_to_num(nan=float("inf")).amax(-1)
                for x, y in zip(a, b, strict=True)]
    return torch.stack(per_step).amax(0)


def assert_rows_agree(a, b, tol: float, typical: float = 1e-4, share: float = 0.9, cap: float = 0.25) -> None:
    """Two separated-precision decodings that differ only in summation order. A checkpoint next to a rounding
    boundary of the copy's format can round one code the other way in one run (a few codes in 10^5, run 190), and
    that row's later layers then drift: the more rows, the likelier. So at a large batch: the typical (median) row
    agrees to float32 rounding, at least ``share`` of the rows within ``tol``, every row within ``cap`` (the formats'
    own error against fp32 is 0.03-10 there); a wrong launch moves most rows, a wrong row's garbage state exceeds the
    cap. A batch of at most 8 rows: every row within ``tol``."""
    rows = row_logit_diffs(a, b)
    if rows.numel() <= 8:
        assert rows.max().item() < tol, rows.tolist()
        return
    summary = dict(median=rows.median().item(), within=(rows < tol).float().mean().item(), max=rows.max().item())
    assert summary["median"] < typical and summary["within"] >= share and summary["max"] < cap, summary


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(1234)


# Greedy generation with per-step logits. suppress_tokens: a generated pad token (id 0) makes generate() infer a
# padding mask for it; keep tokens ordinary.
GREEDY_KW = dict(do_sample=False, max_new_tokens=30, min_new_tokens=30, output_logits=True,
                 return_dict_in_generate=True, suppress_tokens=[0])
