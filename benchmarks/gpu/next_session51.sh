#!/usr/bin/env bash
# GPU calls of the fifty-first session, after next_session50_pack.sh STAGE=1 (the decode pack at compiled batch 1;
# since the fifty-first session also the stock views as properties: guards on the cache 5.17 55 -> 51 tiny
# Nemotron-H-like, 5.25 53 -> 49), which comes first: issue 8's last target.
# STAGE=E: issue 7's eager model-level row at batch 1, paired. BENCHMARKS.md's targets table still quotes
#   Nemotron-H-like 0.94x (run 7, before the kernels) and Qwen3.5-like 0.83x / 0.76x (run 160: the greedy arms of a
#   one-repeat speculative bench, prompt included), stale or not a decode-step figure. On the CPU (tiny models, the
#   Triton kernels stubbed, one eager decode step) ReplayCache dispatches fewer aten ops than stock (Qwen3.5-like 423
#   against 549) and makes fewer Python calls (5474 against 6500), so its host work should not be what slows it.
#   Eager `generate` at batch 1, stock dynamic cache (+ fla for GDN / KDA) against ReplayCache, six interleaved repeats,
#   the paired median ratio. Call: run(command="STAGE=E bash benchmarks/gpu/next_session51.sh", carry=[".whl/fla"],
#   timeout_s=600) (about 4 minutes; transformers 5.17, the image's).
source benchmarks/gpu/install.sh || exit 1
session_results next_session51; cd /tmp/w
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$RES/device.txt"
python3 -c "import fla, transformers; print('fla', fla.__version__, 'transformers', transformers.__version__)" \
  | tee "$RES/versions.txt"
if [ "$STAGE" = E ]; then
  for model in qwen3_5 kimi_linear nemotron_h; do
    name=generate_eager_${model}_b1_r6
    bench_job 170 "$name" generate --models "$model" --batches 1 --arms stock,replay \
      --prompt "$(shaped_prompt "$model")" --new 128 --repeats 6 --out "$RES/$name.json"; pack
  done
  grep -h -A 3 "^batch\|paired\|^arm" "$RES"/generate_*.txt
fi
