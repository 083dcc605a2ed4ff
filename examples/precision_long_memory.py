"""Shared vs separated state precision on tiny hybrids whose SSM heads forget slowly.

The bundled models forget within a few tokens, so a checkpoint's rounding error fades before it can accumulate.
Real long-context models have slow heads; here every SSM head gets A_log = log(1e-3) (the same models as
tests/test_precision_policies.py) and the quick check runs over 300 teacher-forced positions on CPU (the README's
numbers; a few minutes):

    python examples/precision_long_memory.py

Shorter runs (the tests use one): ``--positions 48 --families mamba2,gdn --policies fp32,shared-fp8,separated-fp8``.
"""

import argparse

import transformers

from hf_replayssm.eval.precision_check import precision_check
from hf_replayssm.tiny import slow_heads, tiny_model

POLICIES = ["fp32", "bf16", "fp16-sr", "separated-fp8", "shared-fp8", "separated-nvfp4", "shared-nvfp4",
            "fp16-sr+nvfp4"]
# family name -> (model type, label)
FAMILIES = {"mamba2": ("nemotron_h", "Mamba-2"), "gdn": ("qwen3_5_text", "GDN"), "kda": ("kimi_linear", "KDA")}


def _names(text: str, choices=None) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if choices is not None and name not in choices]
    if not names or unknown:
        expected = f" from {', '.join(choices)}" if choices is not None else ""
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of names{expected}; got {text!r}")
    return names


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--positions", type=int, default=300, help="teacher-forced positions per model (default 300)")
    parser.add_argument("--families", type=lambda s: _names(s, FAMILIES), default=list(FAMILIES),
                        help=f"comma-separated, from {','.join(FAMILIES)} (default: all)")
    parser.add_argument("--policies", type=_names, default=POLICIES,
                        help="comma-separated precision presets (default: all of them)")
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.positions < 1:
        parser.error("--positions must be at least 1")

    transformers.logging.set_verbosity_error()
    for family in args.families:
        model_type, label = FAMILIES[family]
        report = precision_check(slow_heads(tiny_model(model_type)), tokens=args.positions, progress=False,
                                 policies=args.policies, model_name=f"tiny {model_type} ({label}), slow heads")
        print(report.table(), end="\n\n")


if __name__ == "__main__":
    main()
