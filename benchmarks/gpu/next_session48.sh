#!/usr/bin/env bash
# Planned GPU calls for the next session (not run yet), after the forty-seventh's guard cut (runs 231 / 232: the
# excess before AOT's graph call +46 -> +38 us shaped, +94 -> +68 us tiny shapes, Nemotron-H-like on an H100).
# STAGE=1 (about 8 minutes): batch-1 "never slower" on the card the call gets (say which: H100 or H200), twelve
#   interleaved repeats of compiled batch-1 `generate` for the three shaped models (run 158 on the H200: 0.96x /
#   0.98x / 1.00x), then host_split.py on the three shaped models (six repeats; run 227 / 228 before the cut).
# STAGE=2 (about 4 minutes): host_split.py --tiny on CUDA for Nemotron-H-like and Kimi-Linear-like, with and without
#   the guard check (run 231 before the cut): what the guards still cost in the loop.
# Call: run(command="STAGE=1 bash benchmarks/gpu/next_session48.sh", timeout_s=600)
source benchmarks/gpu/install.sh || exit 1
session_results next_session48; cd /tmp/w
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$RES/device.txt"
if [ "$STAGE" = 1 ]; then
  for model in nemotron_h kimi_linear qwen3_5; do paired_b1_job 130 $model 12; done
  for model in nemotron_h kimi_linear qwen3_5; do
    timeout 100 python3 "$R/benchmarks/offline/host_split.py" --models "$model" --prompt "$(shaped_prompt "$model")" \
      --new 64 --repeats 6 --out "$RES/host_split_${model}_b1.json" > "$RES/host_split_${model}_b1.txt" 2>&1
    echo "host_split_$model rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
  done
  grep -h -A 3 "^batch\|paired\|^arm" "$RES"/*.txt
fi
if [ "$STAGE" = 2 ]; then
  tiny_split_jobs nemotron_h kimi_linear
fi
