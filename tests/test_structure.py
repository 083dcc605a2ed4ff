"""The package's layering: the math, the precision formats and the schedule import no transformers; importing the
package patches nothing; the hooks install with the first ReplayCache."""

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


def test_hooks_install_with_the_first_replaycache():
    code = (
        "import hf_replayssm\n"
        "from transformers import GenerationMixin, PreTrainedModel\n"
        "before = hasattr(GenerationMixin.generate, '_replayssm_original')\n"
        "hf_replayssm.ReplayCache()\n"
        "after = hasattr(GenerationMixin.generate, '_replayssm_original')\n"
        "print(before, after, hasattr(PreTrainedModel.__call__, '_replayssm_original'))\n"
    )
    assert _run(code) == "False True True"


def test_cache_module_does_not_import_the_hooks_circularly():
    # adapters never import the cache: importing them first must work
    assert _run("import hf_replayssm.adapters, hf_replayssm.cache; print('ok')") == "ok"
