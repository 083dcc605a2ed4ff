"""Shared vs separated state precision on tiny hybrids whose SSM heads forget slowly.

The bundled models forget within a few tokens, so a checkpoint's rounding error fades before it can accumulate.
Real long-context models have slow heads; here every SSM head gets A_log = log(1e-3) (the same models as
tests/test_precision_policies.py) and the quick check runs over 300 teacher-forced positions on CPU:

    python examples/precision_long_memory.py
"""

import transformers

from hf_replayssm.eval.precision_check import precision_check
from hf_replayssm.tiny import slow_heads, tiny_model

POLICIES = ["fp32", "bf16", "fp16-sr", "separated-fp8", "shared-fp8", "separated-nvfp4", "shared-nvfp4",
            "fp16-sr+nvfp4"]


def main() -> None:
    transformers.logging.set_verbosity_error()
    for model_type, family in [("nemotron_h", "Mamba-2"), ("qwen3_5_text", "GDN"), ("kimi_linear", "KDA")]:
        report = precision_check(slow_heads(tiny_model(model_type)), tokens=300, progress=False, policies=POLICIES,
                                 model_name=f"tiny {model_type} ({family}), slow heads")
        print(report.table(), end="\n\n")


if __name__ == "__main__":
    main()
