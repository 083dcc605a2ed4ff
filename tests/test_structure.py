"""The package's layering: the math, the precision formats and the schedule import no transformers; importing the
package before transformers patches nothing; the hooks install as soon as both are loaded, before a first
``model.generate(..., past_key_values=ReplayCache())`` looks its method up."""

import subprocess
import sys

import pytest

PURE = ["hf_replayssm.ops.mamba2", "hf_replayssm.ops.delta_rule", "hf_replayssm.precision", "hf_replayssm.buffers",
        "hf_replayssm.recurrences", "hf_replayssm.schedule", "hf_replayssm"]


def _run(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return out.stdout.strip()


@pytest.mark.parametrize("module", PURE)
def test_import_does_not_load_transformers(module):
    assert _run(f"import sys, {module}; print('transformers' in sys.modules)") == "False"


def test_hooks_install_when_the_cache_is_looked_up():
    code = (
        "import hf_replayssm\n"
        "from transformers import GenerationMixin, PreTrainedModel\n"
        "before = hasattr(GenerationMixin.generate, '_replayssm_original')\n"
        "hf_replayssm.ReplayCache\n"
        "after = hasattr(GenerationMixin.generate, '_replayssm_original')\n"
        "print(before, after, hasattr(PreTrainedModel.__call__, '_replayssm_original'))\n"
    )
    assert _run(code) == "False True True"


def test_hooks_install_on_import_after_transformers():
    code = (
        "from transformers import GenerationMixin\n"
        "import hf_replayssm\n"
        "print(hasattr(GenerationMixin.generate, '_replayssm_original'))\n"
    )
    assert _run(code) == "True"


@pytest.mark.parametrize("mode", ["lookup", "static"])
def test_first_generate_of_a_process_with_an_inline_cache(mode):
    """``model.generate(ids, past_key_values=ReplayCache(), ...)`` as a process's first ReplayCache use: Python looks
    ``model.generate`` up before it builds the cache, so hooks installed by the constructor came too late (prompt
    lookup was refused as for any stateful model; a too-short static cache failed with an IndexError)."""
    call = ("prompt_lookup_num_tokens=3" if mode == "lookup" else "")
    cache = "ReplayCache()" if mode == "lookup" else "ReplayCache(4, max_cache_len=12)"
    code = (
        "import torch\n"
        "from transformers import AutoModelForCausalLM\n"
        "from hf_replayssm import ReplayCache\n"
        "from hf_replayssm.tiny import tiny_config\n"
        "torch.manual_seed(0)\n"
        "model = AutoModelForCausalLM.from_config(tiny_config('qwen3_5_text')).eval()\n"
        "ids = torch.randint(3, 100, (1, 12))\n"
        "try:\n"
        f"    out = model.generate(ids, past_key_values={cache}, do_sample=False, max_new_tokens=8, {call})\n"
        "    print('ok', tuple(out.shape))\n"
        "except ValueError as error:\n"
        "    print('ValueError', error)\n"
    )
    out = _run(code)
    if mode == "lookup":
        assert out == "ok (1, 20)"
    else:
        assert out.startswith("ValueError") and "max_cache_len=20" in out


def test_cache_module_does_not_import_the_hooks_circularly():
    # adapters never import the cache: importing them first must work
    assert _run("import hf_replayssm.adapters, hf_replayssm.cache; print('ok')") == "ok"
