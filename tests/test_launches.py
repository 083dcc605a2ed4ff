"""Kernel launches of a decode step: with the decode-step kernels, a ReplayCache step launches no more kernels than
the stock step whose recurrence is one fused kernel (what flash-linear-attention / mamba_ssm give stock transformers).

Counted on CPU as the ATen operations that launch a kernel on a GPU (views and allocations excluded), one whole
model forward of one token; the stock recurrence and the ReplayCache kernel are each replaced by a one-launch
stand-in, so only what surrounds them is compared. Runs in a subprocess: the stand-ins replace module functions
before any ReplayCache wraps them.
"""

import json
import os
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# What both scripts below count: the ATen operations that launch a kernel on a GPU (views and allocations excluded),
# per name.
COUNTER = textwrap.dedent('''
    import collections
    from torch.utils._python_dispatch import TorchDispatchMode

    NO_LAUNCH = {"view", "slice", "select", "unsqueeze", "expand", "transpose", "alias", "empty", "_unsafe_view",
                 "permute", "squeeze", "t", "reshape", "split", "detach", "as_strided", "empty_like", "empty_strided",
                 "split_with_sizes", "chunk", "unbind", "new_empty"}

    class Launches(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = collections.Counter()
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.overloadpacket.__name__
            if name not in NO_LAUNCH:
                self.ops[name] += 1
            return func(*args, **(kwargs or {}))
''')

SCRIPT = textwrap.dedent('''
    import collections, functools, inspect, json, sys
    import torch
    from transformers import DynamicCache
    from transformers.models.kimi_linear import modeling_kimi_linear as mk
    from transformers.models.nemotron_h import modeling_nemotron_h as mn
    from transformers.models.qwen3_5 import modeling_qwen3_5 as mq
    from hf_replayssm import ReplayCache, recurrences
    from hf_replayssm.adapters.base import reference_function
    from hf_replayssm.tiny import tiny_model

    def one_launch(module, name, make_output):
        original = reference_function(getattr(module, name))  # beneath transformers' hub-kernel wrappers
        signature = inspect.signature(original)

        @functools.wraps(original)
        def stand_in(*args, **kwargs):
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            return make_output(bound.arguments)
        setattr(module, name, stand_in)

    def delta_out(a):  # fused recurrent kernels: o [B, T, H, V], the state updated in place
        return torch.empty_like(a["value"]), a["initial_state"]
    one_launch(mq, "torch_recurrent_gated_delta_rule", delta_out)
    one_launch(mk, "recurrent_kimi_delta_attention", delta_out)
    one_launch(mn, "mamba2_selective_state_update", lambda a: torch.empty_like(a["hidden_states"]))

    def kernel_stand_in(state, ring, origin, count, tokens, params, buffer_len, out_dtype=torch.float32, **read):
        t = tokens.get("v", tokens.get("x"))
        return torch.empty(t[:, :1].shape, dtype=out_dtype)
    for cls in (recurrences.Mamba2Recurrence, recurrences.DeltaRuleRecurrence):
        cls.kernel_step = staticmethod(kernel_stand_in)

    def step_launches(model, ids, cache, kernels):
        with torch.no_grad():
            model(ids[:, :20], past_key_values=cache, use_cache=True, logits_to_keep=1)
            if kernels:
                for layer in cache.replay_layers.values():
                    layer.schedule.backend = "triton"  # the kernel path, with the stand-in kernel
            counts = []
            for pos in range(20, 23):  # replay steps (and the kernel's phase does not change what surrounds it)
                mode = Launches()
                with mode:
                    model(ids[:, pos : pos + 1], past_key_values=cache, use_cache=True, logits_to_keep=1)
                counts.append(mode.ops)
        return counts[-1]

    result = {}
    for model_type in sys.argv[1].split(","):
        model = tiny_model(model_type)
        ids = torch.randint(3, 120, (2, 24))
        stock = step_launches(model, ids, DynamicCache(config=model.config), False)
        replay = step_launches(model, ids, ReplayCache(16), True)
        diff = collections.Counter(replay)
        diff.subtract(stock)
        result[model_type] = dict(stock=sum(stock.values()), replay=sum(replay.values()),
                                  diff={k: v for k, v in diff.items() if v})
    print(json.dumps(result))
''')


@pytest.mark.parametrize("model_type", ["qwen3_5_text", "nemotron_h", "kimi_linear"])
def test_replay_step_launches_no_more_kernels_than_a_fused_stock_step(model_type):
    run = subprocess.run([sys.executable, "-c", COUNTER + SCRIPT, model_type], capture_output=True, text=True, cwd=ROOT,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    counts = json.loads(run.stdout.strip().splitlines()[-1])[model_type]
    print(counts)
    assert counts["stock"] > 20  # the count saw the model's forward
    assert counts["replay"] <= counts["stock"], counts


CROSSING_SCRIPT = textwrap.dedent('''
    import collections, json, sys
    import torch
    from hf_replayssm import ReplayCache, recurrences
    from hf_replayssm.batched import batched_prompt_lookup
    from hf_replayssm.tiny import tiny_model

    def verify_stand_in(state, ring, origin, count, tokens, params, out=None):  # one launch, no records written
        t = tokens.get("v", tokens.get("x"))
        return (torch.empty(t.shape, dtype=torch.float32) if out is None else out).zero_()

    def fold_stand_in(state, ring, origin, count, params, out=None):  # one launch
        return (torch.empty_like(state) if out is None else out).zero_()

    for cls in (recurrences.Mamba2Recurrence, recurrences.DeltaRuleRecurrence):
        cls.kernel_verify = staticmethod(verify_stand_in)
        cls.kernel_fold = staticmethod(fold_stand_in)

    model_type = sys.argv[1]
    model = tiny_model(model_type)
    cache = ReplayCache(16, backend="triton")
    forward, seen = model.forward, collections.defaultdict(list)

    def counted(*args, **kwargs):
        ids = args[0] if args else kwargs["input_ids"]
        folds = checkpoints()
        with Launches() as mode:
            out = forward(*args, **kwargs)
        crossed = checkpoints() > folds
        seen[f"{ids.shape[1]} {'crossing' if crossed else 'inside'}"].append(sum(mode.ops.values()))
        return out

    def checkpoints():  # staged at a crossed boundary, or stored from a complete period
        return sum(layer.schedule.counters["staged_checkpoints"] + layer.schedule.counters["flushes"]
                   for layer in cache.replay_layers.values())

    if len(sys.argv) > 2:  # the torch path for crossings, as before the fold kernels (the test's control)
        from hf_replayssm.schedule import ReplaySchedule
        ReplaySchedule._kernel_fold_applies = lambda self: False

    model.forward = counted
    ids = torch.randint(3, 120, (2, 30))
    batched_prompt_lookup(model, ids, max_new_tokens=40, num_draft_tokens=5, cache=cache,
                          drafter=lambda row, tokens, n: [3] * n)  # 6-token windows, rejected: crossings recur
    print(json.dumps(dict(ssm_layers=len(cache.replay_layers), seen=seen)))
''')


@pytest.mark.parametrize("model_type", ["qwen3_5_text", "nemotron_h"])
def test_a_window_crossing_a_flush_boundary_costs_a_fold_launch_per_layer(model_type):
    """A verify forward whose window crosses a flush boundary launches two kernels more per SSM layer than one
    inside a period (the fold kernel staging the boundary's checkpoint, the verify kernel for the rest), not
    the torch reference's fold and outputs (about 100 launches per layer before the fold kernels). Kernels are
    one-launch stand-ins (the Triton backend on CPU, its kernels replaced)."""
    def extra_launches_per_layer(*control):
        run = subprocess.run([sys.executable, "-c", COUNTER + CROSSING_SCRIPT, model_type, *control],
                             capture_output=True, text=True, cwd=ROOT, timeout=600,
                             env={**os.environ, "TRITON_INTERPRET": "1"})
        assert run.returncode == 0, run.stderr[-3000:]
        data = json.loads(run.stdout.strip().splitlines()[-1])
        print(data)
        seen = data["seen"]
        assert seen.get("6 crossing") and seen.get("6 inside"), seen  # both kinds of verify forward happened
        return (statistics.median(seen["6 crossing"]) - statistics.median(seen["6 inside"])) / data["ssm_layers"]

    # measured: 2 (the fold, the second piece's verify; the pieces write into one output); 5 before the verify
    # launches' position tensors were kept per value and the pieces were joined; the torch path 24-27 (the median
    # crossing: staging and the torch outputs)
    assert extra_launches_per_layer() <= 3
    assert extra_launches_per_layer("torch-path") > 15  # the control: the check can fail
