#!/usr/bin/env bash
# Planned GPU calls after the forty-eighth session (which had 60 s of device time left from the forty-seventh's
# interrupted try, no call): prompt lookup on a ReplayCache now searches a host copy of the ids (`host_lookup`).
# Carry `.whl/tf525` (`bash benchmarks/gpu/fetch_wheels.sh tf525`).
# Call: run(command="STAGE=1 bash benchmarks/gpu/next_session49.sh", carry=[".whl/tf525"], timeout_s=600)
# STAGE=1 (about 6 minutes):
#   1. lookup_search.py on CUDA: transformers' search against the host copy over a real call's rounds (CPU: 186.1
#      against 21.3 us a round, tiny-gdn-copy, 68 rounds; on the GPU transformers' search reads the device a dozen
#      times a round);
#   2. tiny-gdn-copy, bf16, transformers 5.25: compiled prompt lookup against compiled greedy on a static ReplayCache
#      (run 224 on an H100: 1622.6 against 1024.6 tok/s, 1.58x; issue 8's target 1.8x), and the eager arms.
# STAGE=0 (about 3 minutes): the CUDA-graph tests of a static ReplayCache on the models whose layers hold both an SSM
#   state and attention (falcon_h1, zamba2: ReplayStaticHybridLayer, new), transformers 5.17 and 5.25.
# STAGE=2: the same bench in float32 (run 225: 1183.2 against 1071.0, 1.10x), then next_session48.sh's STAGE=1
#   (batch-1 paired repeats) if the call has time.
# STAGE=3 (about 5 minutes): the batch-1 guard cuts of the forty-eighth session (tiny models, transformers 5.17: guards
#   on the cache Nemotron-H-like 83 -> 67, Kimi-Linear-like 118 -> 100; no per-layer aliasing guard left):
#   host_split.py --tiny and the shaped Nemotron-H-like split, as runs 231 / 232 (before AOT's call, excess: tiny
#   +68.2 us, shaped +37.8 us in run 232).
source benchmarks/gpu/install.sh || exit 1
session_results next_session49; cd /tmp/w
carried_wheels tf525 || exit 1
ARMS=greedy-replay,greedy-static-compiled,lookup-replay,lookup-static-compiled
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$RES/device.txt"
if [ "$STAGE" = 0 ]; then
  test_job 150 test_static_hybrid_cuda -rs tests/test_gpu.py -k "falcon or zamba"; pack
  TEST_PYTHONPATH=/tmp/tf525:/tmp/site test_job 150 test_static_hybrid_cuda_tf525 -rs tests/test_gpu.py \
    -k "falcon or zamba"; pack
  show_tests
fi
if [ "$STAGE" = 1 ]; then
  PYTHONPATH=/tmp/tf525:/tmp/site timeout 120 python3 "$R/benchmarks/offline/lookup_search.py" --device cuda \
    --out "$RES/lookup_search_cuda.json" > "$RES/lookup_search_cuda.txt" 2>&1
  echo "lookup_search rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack; tail -n 2 "$RES/lookup_search_cuda.txt"
  PYTHONPATH=/tmp/tf525:/tmp/site bench_job 150 speculative_copy_bf16 generate --speculative --models tiny-gdn-copy \
    --prompt 512 --new 256 --repeats 2 --lookup 10 --speculative-arms $ARMS --out "$RES/speculative_copy_bf16.json"
  pack; grep -v "^ *$" "$RES/speculative_copy_bf16.txt" | tail -6
fi
if [ "$STAGE" = 2 ]; then
  PYTHONPATH=/tmp/tf525:/tmp/site bench_job 150 speculative_copy_fp32 generate --speculative --models tiny-gdn-copy \
    --prompt 512 --new 256 --repeats 2 --lookup 10 --dtype float32 --speculative-arms $ARMS \
    --out "$RES/speculative_copy_fp32.json"
  pack; grep -v "^ *$" "$RES/speculative_copy_fp32.txt" | tail -6
  for model in nemotron_h kimi_linear qwen3_5; do paired_b1_job 130 $model 12; done
  grep -h -A 3 "^batch\|paired\|^arm" "$RES"/*.txt
fi
if [ "$STAGE" = 3 ]; then
  tiny_split_jobs nemotron_h kimi_linear
  timeout 120 python3 "$R/benchmarks/offline/host_split.py" --models nemotron_h --prompt 128 --new 64 --repeats 6 \
    --out "$RES/host_split_shaped_nemotron_h_b1.json" > "$RES/host_split_shaped_nemotron_h_b1.txt" 2>&1
  echo "host_split_shaped rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
  tail -n 5 "$RES/host_split_shaped_nemotron_h_b1.txt"
fi
