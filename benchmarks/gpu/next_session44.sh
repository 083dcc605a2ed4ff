#!/usr/bin/env bash
# GPU calls of the forty-fourth session (1800 s of device time; the machine goes back after 30 s idle, so STAGE=2
# follows STAGE=1 at once). Fetch first: `bash benchmarks/gpu/fetch_wheels.sh tf525` (transformers 5.25, 18 MB).
# Call: run(command="STAGE=1 bash benchmarks/gpu/next_session44.sh", carry=[".whl/tf525"], timeout_s=600)
# STAGE=1 (about 9 minutes), transformers 5.25 (compiles the verify forwards of a compileable cache):
#   1. test_gpu's static-cache speculation (the Qwen3.5 case with its tolerance at 1e-4: its later assertions never
#      ran on a GPU); then KDA's separated model tests on CUDA with the flush-weights default of run 218 (5.17);
#   2. compiled prompt lookup on a model that copies (bundled tiny-gdn-copy, passage said several times, bf16, 256
#      new tokens) against compiled greedy, both on a static ReplayCache, and the eager arms;
#   3. where a compiled prompt-lookup round's time goes against a compiled greedy step (Qwen3.5-like, 8 layers, bf16,
#      random weights: acceptance 0; cProfile and torch.profiler).
# STAGE=2 (about 5 minutes):
#   1. tiny-gdn-copy's compiled prompt lookup in float32 (identical tokens expected), 5.25;
#   2. the round profile on tiny-gdn-copy (acceptance high), 5.25.
source benchmarks/gpu/install.sh || exit 1
session_results next_session44; cd /tmp/w
if [ ! -d /tmp/tf525 ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/tf525 \
    "$R"/.whl/tf525/*.whl || exit 1
fi
ARMS=greedy-replay,greedy-static-compiled,lookup-replay,lookup-static-compiled
if [ "$STAGE" = 1 ]; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$RES/device.txt"
  TEST_PYTHONPATH=/tmp/tf525:/tmp/site test_job 150 test_static_speculation_tf525 -rs tests/test_gpu.py \
    -k static_cache_speculation; pack
  test_job 130 test_gpu_kda_separated -rs tests/test_gpu.py -k "kimi_linear and separated"; pack
  show_tests
  PYTHONPATH=/tmp/tf525:/tmp/site bench_job 130 speculative_copy_bf16 generate --speculative --models tiny-gdn-copy \
    --prompt 512 --new 256 --repeats 2 --lookup 10 --speculative-arms $ARMS --out "$RES/speculative_copy_bf16.json"
  pack; grep -v "^ *$" "$RES/speculative_copy_bf16.txt" | tail -6
  PYTHONPATH=/tmp/tf525:/tmp/site script_job 150 profile_round_qwen3_5 profile_lookup_round.py --model qwen3_5 \
    --layers 8 --prompt 512 --new 64 --out "$RES"; pack
  grep "compiled {" "$RES/profile_round_qwen3_5.txt"; tail -3 "$RES/profile_round_qwen3_5.txt"
fi
if [ "$STAGE" = 2 ]; then
  PYTHONPATH=/tmp/tf525:/tmp/site bench_job 150 speculative_copy_fp32 generate --speculative --models tiny-gdn-copy \
    --prompt 512 --new 256 --repeats 2 --lookup 10 --dtype float32 --speculative-arms $ARMS \
    --out "$RES/speculative_copy_fp32.json"
  pack; grep -v "^ *$" "$RES/speculative_copy_fp32.txt" | tail -6
  PYTHONPATH=/tmp/tf525:/tmp/site script_job 120 profile_round_copy profile_lookup_round.py --model tiny-gdn-copy \
    --prompt 512 --new 256 --out "$RES"; pack
  grep "compiled {" "$RES/profile_round_copy.txt"; tail -3 "$RES/profile_round_copy.txt"
fi
