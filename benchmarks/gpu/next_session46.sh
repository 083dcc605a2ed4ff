#!/usr/bin/env bash
# GPU calls planned in the forty-sixth session, which got no machine (failed starts spent its 30 minutes):
# next_session45.sh's two stages regrouped, most needed first, with the batch-1 host split. Carry `.whl/tf525`
# (`bash benchmarks/gpu/fetch_wheels.sh tf525`).
# Call: run(command="STAGE=1 bash benchmarks/gpu/next_session46.sh", carry=[".whl/tf525"], timeout_s=600)
# STAGE=1 (about 7 minutes):
#   1. test_gpu's static-cache speculation under transformers 5.25 (CUDA graphs; every crop now commits on the device
#      between graph replays, folding ones too: the Triton fold kernel on this path, so far run only interpreted);
#   2. tiny-gdn-copy, bf16: compiled prompt lookup against compiled greedy on a static ReplayCache and the eager arms
#      (run 222: 494.6 against 543.9 tok/s, eager 303.5 against 116.1);
#   3. batch 1, where the compiled call's host excess goes (issue 8's "never slower"): host_split.py now splits the
#      compiled call's host part into the CUDA-graph tree's run (input checks, launch, outputs), the graph launch
#      alone, and the rest (Dynamo's guard check and bytecode, the AOT / Inductor wrappers); Nemotron-H-like,
#      transformers 5.17 (the image's), six repeats.
# STAGE=2 (about 7 minutes): the same split for Kimi-Linear-like; the float32 bench (run 223: 435.3 against 605.2
#   tok/s); the round profile on the Qwen3.5-like model (run 222: 5.84 ms a token against 2.30 for compiled greedy).
source benchmarks/gpu/install.sh || exit 1
session_results next_session46; cd /tmp/w
carried_wheels tf525 || exit 1
ARMS=greedy-replay,greedy-static-compiled,lookup-replay,lookup-static-compiled
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$RES/device.txt"
split() {  # split MODEL: host_split.py at batch 1, six repeats
  timeout 120 python3 "$R/benchmarks/offline/host_split.py" --models "$1" --prompt "$(shaped_prompt "$1")" \
    --new 64 --repeats 6 --out "$RES/host_split_$1_b1.json" > "$RES/host_split_$1_b1.txt" 2>&1
  echo "host_split_$1 rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
  tail -n 5 "$RES/host_split_$1_b1.txt"
}
if [ "$STAGE" = 0 ] || [ "$STAGE" = 1 ]; then  # STAGE=0: the tests alone (a call with little device time left)
  TEST_PYTHONPATH=/tmp/tf525:/tmp/site test_job 150 test_static_speculation_tf525 -rs tests/test_gpu.py \
    -k static_cache_speculation; pack
  show_tests
fi
if [ "$STAGE" = 1 ]; then
  PYTHONPATH=/tmp/tf525:/tmp/site bench_job 130 speculative_copy_bf16 generate --speculative --models tiny-gdn-copy \
    --prompt 512 --new 256 --repeats 2 --lookup 10 --speculative-arms $ARMS --out "$RES/speculative_copy_bf16.json"
  pack; grep -v "^ *$" "$RES/speculative_copy_bf16.txt" | tail -6
  split nemotron_h
fi
if [ "$STAGE" = 2 ]; then
  split kimi_linear
  PYTHONPATH=/tmp/tf525:/tmp/site bench_job 150 speculative_copy_fp32 generate --speculative --models tiny-gdn-copy \
    --prompt 512 --new 256 --repeats 2 --lookup 10 --dtype float32 --speculative-arms $ARMS \
    --out "$RES/speculative_copy_fp32.json"
  pack; grep -v "^ *$" "$RES/speculative_copy_fp32.txt" | tail -6
  PYTHONPATH=/tmp/tf525:/tmp/site script_job 150 profile_round_qwen3_5 profile_lookup_round.py --model qwen3_5 \
    --layers 8 --prompt 512 --new 64 --out "$RES"; pack
  head -24 "$RES/profile_lookup_round_qwen3_5.txt"
fi
