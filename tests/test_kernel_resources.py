"""ptxas resource usage of the verify kernels for the H200 (sm_90), compiled on this CPU machine
(``hf_replayssm.kernels.resources``): the token-by-token form at the launch configurations the wrappers pick for
batch 256 has no stack (the configurations the H200 measured), and the matrix-product form compiles. A subprocess
without ``TRITON_INTERPRET`` (the interpreter compiles nothing); skipped where this Triton bundles no ptxas."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from kernel_harness import HAS_TRITON, ROOT

SCRIPT = """
import json
from hf_replayssm.kernels import resources
reason = resources.available()
if reason:
    print(json.dumps({"skip": reason}))
else:
    print(json.dumps([resources.verify_kernel_resources(family, 256, 4, products)
                      for family in ("mamba2", "gdn", "kda") for products in (False, True)]))
"""


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
def test_verify_kernels_compile_for_sm90_and_the_default_form_does_not_spill():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    if isinstance(result, dict):
        pytest.skip(result["skip"])
    assert [(u["family"], u["products"]) for u in result] == [
        (family, products) for family in ("mamba2", "gdn", "kda") for products in (False, True)]
    for usage in result:
        print(usage)
        assert 0 < usage["registers"] <= 255 and usage["arch"] == "sm_90", usage
        if not usage["products"]:
            assert usage["stack_bytes"] == 0, f"the default verify form spills: {usage}"
