#!/usr/bin/env bash
# GPU calls of the fiftieth session: the decode pack (hf_replayssm/decode_pack.py: a static cache's compiled plain
# steps read every SSM layer's operands from one tensor per kind; graph inputs from the SSM layers 6 per layer -> 6 in
# all; guards on the cache of the tiny Nemotron-H-like model 67 -> 55, tensors 15 -> 9) against issue 8's batch-1
# "never slower" (runs 237 / 238: Nemotron-H-like 0.997x, Kimi-Linear-like 0.98x, Qwen3.5-like 1.03x).
# Fifty-second session: run 239 (H100) ran STAGE=1 (batch 1 paired: 0.998x / 1.02x / 1.01x); its tests stopped at
# falcon_h1 (fixed since: the pack's rows as strings). Next: STAGE=T (the CUDA-graph tests, about 5 minutes), then 2.
# Call: run(command="STAGE=1 bash benchmarks/gpu/next_session50_pack.sh", timeout_s=600) (transformers 5.17, the
# image's); STAGE=2 with carry=[".whl/tf525"] (its speculation tests on 5.25, which compiles the verify forwards).
# STAGE=1 (about 6 minutes): the CUDA-graph tests that run a static cache compiled (equal to eager / stock, one
#   compile per phase, speculation, read copies; transformers 5.17), then the paired batch-1 repeats of the shaped
#   Nemotron-H-like and Kimi-Linear-like models (8 each, as runs 237 / 238; QWEN=1: Qwen3.5-like's too).
# STAGE=2 (about 6 minutes): the speculation tests on transformers 5.25 (which compiles the verify forwards: they run on
#   the layers' slices of the pack), then host_split.py --tiny (Nemotron-H-like, with and without the guard check)
#   and the shaped Nemotron-H-like split (as run 235: before AOT's call, excess +31.9 tiny, +30.9 shaped).
source benchmarks/gpu/install.sh || exit 1
session_results next_session50_pack; cd /tmp/w
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$RES/device.txt"
if [ "$STAGE" = 1 ]; then
  test_job 130 test_compiled_static_cuda -rs tests/test_gpu.py \
    -k "compiled_static_cache or decode_compiles_once or static_cache_speculation or static_cache_with_a_read_copy"
  pack; show_tests
  for model in nemotron_h kimi_linear ${QWEN:+qwen3_5}; do paired_b1_job 125 $model 8; done
  grep -h -A 3 "^batch\|paired\|^arm" "$RES"/generate_*.txt
fi
if [ "$STAGE" = T ]; then  # (fifty-second session) the CUDA-graph tests alone, with time to finish: run 239's
  # 130 s cut them after falcon_h1 failed (the decode pack's rows, fixed since) and before zamba2, speculation, read copies
  test_job 420 test_compiled_static_cuda_all -rs tests/test_gpu.py \
    -k "compiled_static_cache or decode_compiles_once or static_cache_speculation or static_cache_with_a_read_copy"
  pack; show_tests
fi
if [ "$STAGE" = 2 ]; then
  carried_wheels tf525 && TEST_PYTHONPATH=/tmp/tf525:/tmp/site test_job 200 test_compiled_static_cuda_tf525 -rs \
    tests/test_gpu.py -k "compiled_static_cache or static_cache_speculation"
  pack; show_tests
  tiny_split_jobs nemotron_h
  timeout 120 python3 "$R/benchmarks/offline/host_split.py" --models nemotron_h --prompt 128 --new 64 --repeats 6 \
    --out "$RES/host_split_shaped_nemotron_h_b1.json" > "$RES/host_split_shaped_nemotron_h_b1.txt" 2>&1
  echo "host_split_shaped rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
  tail -n 5 "$RES/host_split_shaped_nemotron_h_b1.txt"
fi
