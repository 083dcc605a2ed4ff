"""What a compiled decode step costs on the host outside the graph: Dynamo's frame around it, stock static cache
against ReplayCache, on the CPU.

On the H200 a ReplayCache batch-1 decode step spends +29 to +84 us more than stock in the compiled call's host part
(runs 154-156), of which the guard check explains 7-22 us; the rest sat in the compiled frame's own time, not pinned
down (the likeliest cause: per-input work, as ReplayCache hands the graph more tensors). This script isolates that
part: it compiles ``generate``'s decode step on a tiny model with a null backend, a graph that ran once and then only
hands back its first outputs, so that a call costs the frame alone: the guard check, the transformed bytecode that
gathers the graph's inputs, replays side effects and builds the outputs. It times such calls on a real decode step's
arguments, and the guard check by itself, per arm (blocks alternate between the arms; the best block counts), and
counts the graph's inputs (tensors, and how many of them the graph mutates). Runs on the CPU in about 30 s per model:

    python benchmarks/offline/frame_overhead.py --models nemotron_h,qwen3_5_text,kimi_linear --out frames.json

Inductor's and the CUDA-graph tree's wrappers, which a real compiled step adds, are not in it (in runs 155-156 they
differed by a few us between the arms). ``--through aot`` puts AOTAutograd between the frame and the null graph, as
Inductor compiles it (functionalized, input mutations kept in the graph: ``keep_inference_input_mutations``), so a
call also costs AOTAutograd's runtime wrappers (the version bump of every input the graph writes, outputs that alias
inputs regenerated, the input list unpacked): the frame plus those wrappers, per arm, which leaves only Inductor's
own call and the CUDA-graph tree (its run, timed on the GPU by ``host_split.py``) to a real step.
"""

from __future__ import annotations

import functools
import operator
import time

import torch

# this folder's guard reader (a script's folder is on its import path)
from guard_check import compare_arms, compile_decode_step, frame_tool_args
from transformers.generation import CompileConfig

# tensor methods that return a view of their tensor (a write into one writes the graph input it views)
VIEW_METHODS = {"view", "select", "narrow", "unflatten", "as_strided", "__getitem__"}


def null_backend(graphs: list[dict]):
    """A Dynamo backend whose graph runs on the first call only; later calls return those first outputs. Appends to
    ``graphs`` the graph's input counts: all, tensors, and those its nodes write in place. (A function, not an object:
    transformers copies the compile config, and the function survives the copy.)"""

    def backend(gm: torch.fx.GraphModule, example_inputs):
        placeholders = {node for node in gm.graph.nodes if node.op == "placeholder"}
        mutated = set()

        def base(value):
            """The graph input a value views (a decode pack's layer slice, ``positions[:B]``), else the value."""
            while isinstance(value, torch.fx.Node) and (
                    (value.op == "call_function" and value.target is operator.getitem)
                    or (value.op == "call_method" and value.target in VIEW_METHODS)):
                value = value.args[0]
            return value

        for node in gm.graph.nodes:
            if node.op == "call_method" and node.target.endswith("_") and base(node.args[0]) in placeholders:
                mutated.add(base(node.args[0]))  # tensor.copy_(...), tensor.add_(...)
                continue
            target = node.target
            if isinstance(target, torch._ops.OpOverloadPacket):
                target = target.default
            schema = getattr(target, "_schema", None)
            if node.op != "call_function" or schema is None:
                continue
            values = list(node.args) + [node.kwargs.get(a.name) for a in schema.arguments[len(node.args):]]
            for argument, value in zip(schema.arguments, values, strict=False):
                if argument.alias_info is not None and argument.alias_info.is_write and base(value) in placeholders:
                    mutated.add(base(value))
        graphs.append({"inputs": len(example_inputs),
                       "tensor_inputs": sum(isinstance(x, torch.Tensor) for x in example_inputs),
                       "mutated_inputs": len(mutated)})
        return run_once(gm)

    return backend


def run_once(gm: torch.fx.GraphModule):
    """A callable that runs ``gm`` on its first call and hands back those outputs on every later one."""
    first: list = []

    def run(*args):
        if not first:
            first.append(gm(*args))
        return first[0]

    return run


def aot_null_backend(graphs: list[dict]):
    """``null_backend`` behind AOTAutograd as Inductor uses it (inference, input mutations kept in the functionalized
    graph): the graph runs on the first call only, every call goes through AOTAutograd's runtime wrappers."""
    from torch._functorch.aot_autograd import aot_module_simplified, make_boxed_func

    count_inputs = null_backend(graphs)

    def null_compiler(gm: torch.fx.GraphModule, example_inputs):
        return make_boxed_func(run_once(gm))  # AOTAutograd calls it with the input list (and may free its items)

    def backend(gm: torch.fx.GraphModule, example_inputs):
        count_inputs(gm, example_inputs)  # the Dynamo graph's input counts, as without AOTAutograd
        return aot_module_simplified(gm, example_inputs, fw_compiler=null_compiler,
                                     keep_inference_input_mutations=True)

    return backend


BACKENDS = {"frame": null_backend, "aot": aot_null_backend}


def compiled_step(model_type: str, arm: str, new_tokens: int = 6, through: str = "frame",
                  layers: int | None = None) -> dict:
    """One arm's decode step compiled with the null backend on a tiny model (``through="aot"``: behind
    AOTAutograd): the compiled callable, a decode step's arguments, the frame's passing guard manager and locals, and
    the graph's input counts."""
    graphs: list[dict] = []
    backend = BACKENDS[through](graphs)
    step = compile_decode_step(model_type, arm, CompileConfig(fullgraph=True, backend=backend, mode=None), new_tokens,
                               layers=layers)
    if not graphs:
        raise RuntimeError("the null backend compiled no graph")
    return dict(step, graph=graphs[-1])


def measure(model_type: str, blocks: int = 20, per_block: int = 200, through: str = "frame",
            layers: int | None = None) -> list[dict]:
    """Per arm: us per compiled call (the frame alone, or with AOTAutograd's wrappers: ``through``) and per guard
    check, best block of each; the graph's inputs."""
    torch._dynamo.reset()
    # ReplayCache first: binding it wraps module functions of the model's file, which a frame compiled before
    # guards against (as in guard_check.py)
    steps = {arm: compiled_step(model_type, arm, through=through, layers=layers) for arm in ("replay", "stock")}
    calls = {arm: [] for arm in steps}
    checks = {arm: [] for arm in steps}
    with torch.no_grad():
        for _ in range(blocks):
            for arm, step in steps.items():
                fn, kwargs = step["fn"], step["kwargs"]
                start = time.perf_counter()
                for _ in range(per_block):
                    fn(**kwargs)
                calls[arm].append((time.perf_counter() - start) / per_block * 1e6)
                check, frame_locals = step["guards"].check, step["locals"]
                start = time.perf_counter()
                for _ in range(per_block):
                    check(frame_locals)
                checks[arm].append((time.perf_counter() - start) / per_block * 1e6)
    rows = []
    for arm, step in steps.items():
        call, check = min(calls[arm]), min(checks[arm])
        rows.append({"model": model_type, "arm": arm, "through": through, "layers": layers, "call_us": call,
                     "guard_check_us": check, "rest_us": call - check, **step["graph"]})
    return rows


def _report(model_type: str, stock: dict, replay: dict) -> None:
    print(f"{model_type:14s} frame per call: stock {stock['call_us']:6.1f} us, ReplayCache "
          f"{replay['call_us']:6.1f} "
          f"({replay['call_us'] - stock['call_us']:+.1f}); guard check {stock['guard_check_us']:.1f} / "
          f"{replay['guard_check_us']:.1f}; the rest {stock['rest_us']:.1f} / {replay['rest_us']:.1f} "
          f"({replay['rest_us'] - stock['rest_us']:+.1f})")
    print(f"{'':14s} graph inputs {stock['inputs']} / {replay['inputs']} (tensors {stock['tensor_inputs']} / "
          f"{replay['tensor_inputs']}, mutated {stock['mutated_inputs']} / {replay['mutated_inputs']})")


def main(argv: list[str] | None = None) -> list[dict]:
    def add_options(parser):
        parser.add_argument("--through", choices=sorted(BACKENDS), default="frame",
                            help="frame: the null graph called by Dynamo's frame; aot: behind AOTAutograd too")

    args = frame_tool_args(__doc__, argv, blocks=20, add_options=add_options)
    return compare_arms(args, functools.partial(measure, through=args.through), _report)


if __name__ == "__main__":
    main()
