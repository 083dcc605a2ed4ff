"""``hf-replayssm`` command line."""

from __future__ import annotations

import argparse
import json
import sys


def _demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    result = run_demo(
        model_id=args.model, max_new_tokens=args.tokens, prompt=args.prompt, buffer_len=args.buffer_len,
        lookup_tokens=args.lookup, device=args.device, progress=not args.no_progress,
    )
    if args.json:
        print(json.dumps({k: v for k, v in result.items() if k != "report"}, indent=2))
    else:
        print(result["report"])
    return 0 if result["identical_tokens"] and result["identical_tokens_lookup"] else 1


def _precision_check(args: argparse.Namespace) -> int:
    from .eval.precision_check import DEFAULT_POLICIES, precision_check
    from .models import DEFAULT_MODEL, load_model

    model, tokenizer = load_model(args.model, device=args.device)
    policies = args.policies.split(",") if args.policies else list(DEFAULT_POLICIES)
    report = precision_check(model, tokenizer, policies=policies, tokens=args.tokens, prompt=args.prompt,
                             buffer_len=args.buffer_len, progress=not args.no_progress,
                             model_name=f"{args.model or DEFAULT_MODEL} ({type(model).__name__})")
    print(json.dumps(report.to_dict(), indent=2) if args.json else report.table())
    return 0


BENCHES = {
    "memory": "hf_replayssm.bench.memory",  # cache memory and prefill peak vs the stock cache
    "step": "hf_replayssm.bench.step",  # model-level decode step time: stock vs ReplayCache backends
    "generate": "hf_replayssm.bench.generate",  # end-to-end generate(): stock eager/static-compiled vs ReplayCache arms
    "speculative": "hf_replayssm.bench.speculative",  # batched prompt lookup vs plain batched greedy
    "kernels": "hf_replayssm.kernels.bench",  # replay vs standard step kernels, Mamba-2 (needs triton and a GPU)
}
DELTA_FAMILIES = ("gdn", "kda")  # `bench kernels --family gdn|kda` runs the delta-rule benchmark


def _bench(args: argparse.Namespace) -> int:
    import importlib

    module = BENCHES[args.bench]
    rest = list(args.bench_args)
    if args.bench == "kernels" and any(f"--family={f}" in rest or (rest[i:i + 2] == ["--family", f])
                                       for f in DELTA_FAMILIES for i in range(len(rest))):
        module = "hf_replayssm.kernels.bench_delta"
    result = importlib.import_module(module).main(rest)
    return result if isinstance(result, int) else 0


EVALS = {
    "kl": "hf_replayssm.eval.kl",  # long-run KL of precision policies against fp32, teacher-forced
    "recall": "hf_replayssm.eval.recall",  # recall-task documents and accuracy-vs-distance tables
    "compare": "hf_replayssm.eval.compare",  # accuracy per arm of lm-eval runs, agreement, paired McNemar test
}


def _eval(args: argparse.Namespace) -> int:
    import importlib

    result = importlib.import_module(EVALS[args.eval]).main(list(args.eval_args))
    return result if isinstance(result, int) else 0


def _lm_eval(args: argparse.Namespace) -> int:
    from .eval.lm_eval_plugin import main as lm_eval_main  # imports lm_eval (the `eval` extra)

    result = lm_eval_main(list(args.lm_eval_args))
    return result if isinstance(result, int) else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hf-replayssm", description="ReplaySSM for Hugging Face Transformers")
    commands = parser.add_subparsers(dest="command", required=True)

    demo = commands.add_parser("demo", help="stock decoding vs ReplayCache vs ReplayCache + prompt lookup")
    demo.add_argument("--model", help="hub id or local path (default: the bundled tiny-mamba2; or tiny-gdn)")
    demo.add_argument("--tokens", type=int, default=128, help="new tokens to generate (default 128)")
    demo.add_argument("--prompt", help="prompt text (default: a few lines of Hamlet)")
    demo.add_argument("--buffer-len", type=int, default=16, help="ReplayCache buffer_len (default 16)")
    demo.add_argument("--lookup", type=int, default=4, help="prompt_lookup_num_tokens (default 4)")
    demo.add_argument("--device", help="cpu, cuda, ... (default: cuda if available)")
    demo.add_argument("--json", action="store_true", help="print the measurements as JSON")
    demo.add_argument("--no-progress", action="store_true", help="no progress bars")
    demo.set_defaults(run=_demo)

    check = commands.add_parser(
        "precision-check", help="teacher-forced KL of state-precision policies against fp32, per position bin"
    )
    check.add_argument("--model", help="hub id or local path (default: the bundled tiny-mamba2; or tiny-gdn)")
    check.add_argument("--tokens", type=int, default=256, help="positions to teacher-force (default 256)")
    check.add_argument("--policies", help="comma-separated presets (default: all of them)")
    check.add_argument("--prompt", help="prompt text the fp32 continuation starts from")
    check.add_argument("--buffer-len", type=int, default=16)
    check.add_argument("--device", help="cpu, cuda, ... (default: cuda if available)")
    check.add_argument("--json", action="store_true", help="print the report as JSON")
    check.add_argument("--no-progress", action="store_true", help="no progress bars")
    check.set_defaults(run=_precision_check)

    bench = commands.add_parser("bench", help="benchmarks: memory, step, generate, speculative, kernels "
                                  "(--help after the name; on the GPU where there is one, else on the CPU)")
    bench.add_argument("bench", choices=sorted(BENCHES))
    bench.add_argument("bench_args", nargs=argparse.REMAINDER, help="the benchmark's own arguments")
    bench.set_defaults(run=_bench)

    evaluate = commands.add_parser("eval", help="evaluation: kl, compare, recall (--help after the name)")
    evaluate.add_argument("eval", choices=sorted(EVALS))
    evaluate.add_argument("eval_args", nargs=argparse.REMAINDER, help="the evaluation's own arguments")
    evaluate.set_defaults(run=_eval)

    harness = commands.add_parser(
        "lm-eval", help="lm-evaluation-harness with the hf-replayssm model and this package's tasks registered",
        add_help=False,
    )
    harness.add_argument("lm_eval_args", nargs=argparse.REMAINDER, help="lm-eval's own command line")
    harness.set_defaults(run=_lm_eval)
    return parser


def main(argv: list[str] | None = None) -> int:
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["lm-eval"]:  # argparse would claim lm-eval's own leading options (--model ...) as ours
        return _lm_eval(argparse.Namespace(lm_eval_args=argv[1:]))
    args = build_parser().parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
