"""Kernel launches of a decode step: with the decode-step kernels, a ReplayCache step launches no more kernels than
the stock step whose recurrence is one fused kernel (what flash-linear-attention / mamba_ssm give stock transformers).

Counted on CPU as the ATen operations that launch a kernel on a GPU (views and allocations excluded), one whole
model forward of one token; the stock recurrence and the ReplayCache kernel are each replaced by a one-launch
stand-in, so only what surrounds them is compared. Runs in a subprocess: the stand-ins replace module functions
before any ReplayCache wraps them.
"""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = textwrap.dedent('''
    import collections, functools, inspect, json, sys
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from transformers import DynamicCache
    from transformers.models.kimi_linear import modeling_kimi_linear as mk
    from transformers.models.nemotron_h import modeling_nemotron_h as mn
    from transformers.models.qwen3_5 import modeling_qwen3_5 as mq
    from hf_replayssm import ReplayCache, recurrences
    from hf_replayssm.tiny import tiny_model

    NO_LAUNCH = {"view", "slice", "select", "unsqueeze", "expand", "transpose", "alias", "empty", "_unsafe_view",
                 "permute", "squeeze", "t", "reshape", "split", "detach", "as_strided", "empty_like",
                 "split_with_sizes", "chunk", "unbind", "new_empty"}

    def one_launch(module, name, make_output):
        original = getattr(module, name)
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

    class Launches(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = collections.Counter()
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.overloadpacket.__name__
            if name not in NO_LAUNCH:
                self.ops[name] += 1
            return func(*args, **(kwargs or {}))

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
    run = subprocess.run([sys.executable, "-c", SCRIPT, model_type], capture_output=True, text=True, cwd=ROOT,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    counts = json.loads(run.stdout.strip().splitlines()[-1])[model_type]
    print(counts)
    assert counts["stock"] > 20  # the count saw the model's forward
    assert counts["replay"] <= counts["stock"], counts
