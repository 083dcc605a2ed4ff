#!/usr/bin/env bash
# GPU calls for the session after the forty-fifth (which had no device time left: the cut-off tries of its stop had
# spent it). Fetch first: `bash benchmarks/gpu/fetch_wheels.sh tf525` (transformers 5.25, 18 MB). Each stage fits a
# 600-second call; STAGE=2 follows STAGE=1 at once (the machine goes back after 30 s idle).
# Call: run(command="STAGE=1 bash benchmarks/gpu/next_session45.sh", carry=[".whl/tf525"], timeout_s=600)
# STAGE=1 (about 8 minutes), transformers 5.25 (compiles the verify forwards of a compileable cache). Since runs
# 222 / 223: every crop after a device-verified window commits on the device (no device read; the host counts the
# dropped drafts; all SSM layers in three foreach launches; a crop that completes a period folds it without leaving
# the device positions), and the speculative bench passes no logits processor.
#   1. test_gpu's static-cache speculation (CUDA graphs; the crops now commit on the device between graph replays);
#   2. tiny-gdn-copy, bf16: compiled prompt lookup against compiled greedy on a static ReplayCache and the eager arms
#      (run 222: 494.6 against 543.9 tok/s, eager 303.5 against 116.1);
#   3. the round profile on the Qwen3.5-like model (run 222: 5.84 ms a token against 2.30 for compiled greedy).
# STAGE=2 (about 5 minutes):
#   1. the same bench in float32 (run 223: 435.3 against 605.2 tok/s; identical tokens expected);
#   2. the round profile on tiny-gdn-copy (run 223: 2.90 ms a token against 1.59, 61 rounds, 195 of 440 accepted).
source benchmarks/gpu/install.sh || exit 1
session_results next_session45; cd /tmp/w
if [ ! -d /tmp/tf525 ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/tf525 \
    "$R"/.whl/tf525/*.whl || exit 1
fi
ARMS=greedy-replay,greedy-static-compiled,lookup-replay,lookup-static-compiled
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$RES/device.txt"
if [ "$STAGE" = 1 ]; then
  TEST_PYTHONPATH=/tmp/tf525:/tmp/site test_job 150 test_static_speculation_tf525 -rs tests/test_gpu.py \
    -k static_cache_speculation; pack
  show_tests
  PYTHONPATH=/tmp/tf525:/tmp/site bench_job 130 speculative_copy_bf16 generate --speculative --models tiny-gdn-copy \
    --prompt 512 --new 256 --repeats 2 --lookup 10 --speculative-arms $ARMS --out "$RES/speculative_copy_bf16.json"
  pack; grep -v "^ *$" "$RES/speculative_copy_bf16.txt" | tail -6
  PYTHONPATH=/tmp/tf525:/tmp/site script_job 150 profile_round_qwen3_5 profile_lookup_round.py --model qwen3_5 \
    --layers 8 --prompt 512 --new 64 --out "$RES"; pack
  head -24 "$RES/profile_lookup_round_qwen3_5.txt"
fi
if [ "$STAGE" = 2 ]; then
  PYTHONPATH=/tmp/tf525:/tmp/site bench_job 150 speculative_copy_fp32 generate --speculative --models tiny-gdn-copy \
    --prompt 512 --new 256 --repeats 2 --lookup 10 --dtype float32 --speculative-arms $ARMS \
    --out "$RES/speculative_copy_fp32.json"
  pack; grep -v "^ *$" "$RES/speculative_copy_fp32.txt" | tail -6
  PYTHONPATH=/tmp/tf525:/tmp/site script_job 120 profile_round_copy profile_lookup_round.py --model tiny-gdn-copy \
    --prompt 512 --new 256 --out "$RES"; pack
  head -24 "$RES/profile_lookup_round_tiny-gdn-copy.txt"
fi
