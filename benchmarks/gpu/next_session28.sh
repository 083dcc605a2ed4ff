#!/usr/bin/env bash
# Planned GPU calls of the twenty-eighth session. Every job packs what it wrote into $OUT right after it ends.
# STAGE=1 (about 8 minutes, carry .whl/fla too): where the batch-1 gap goes. benchmarks/offline/host_split.py times
#   every compiled decode step of both arms in three parts (the generate loop, the compiled call's host part, its GPU
#   part; arms interleaved, paired differences) for the three shaped models; then compiled batch-1 `generate` with
#   eight interleaved repeats and the paired median ratio after this session's change (ReplayCache answers
#   generate's per-step layer questions from facts worked out once).
# Call: run(command="STAGE=1 bash benchmarks/gpu/next_session28.sh", carry=[".whl/fla", ".triton_cache"],
#   timeout_s=600)
source benchmarks/gpu/install.sh || exit 1
session_results next_session28; cd /tmp/w
if [ "$STAGE" = 1 ]; then
  for model in nemotron_h kimi_linear qwen3_5; do
    timeout 110 python3 "$R/benchmarks/offline/host_split.py" --models $model --prompt "$(shaped_prompt $model)" \
      --new 64 --repeats 8 --out "$RES/host_split_${model}_b1.json" > "$RES/host_split_${model}_b1.txt" 2>&1
    echo "host_split_$model rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
  done
  for model in nemotron_h kimi_linear qwen3_5; do
    bench_job 130 generate_compiled_${model}_b1_r8 generate --models $model --batches 1 \
      --arms stock-static-compiled,replay-compiled --prompt "$(shaped_prompt $model)" --new 128 --repeats 8 \
      --out "$RES/generate_compiled_${model}_b1_r8.json"; pack
  done
fi
[ "$STAGE" = 1 ] && tail -n 8 "$RES"/*.txt
# STAGE=2 (about 7 minutes): inside the compiled call. Run 154 put ReplayCache's batch-1 excess in the compiled call's
#   host part (+58 to +84 us per step, the three models) while the generate loop around it costs about the same; this
#   profiles inside the compiled calls (cProfile enabled only there) and times the guard check on each arm's own frame.
if [ "$STAGE" = 2 ]; then
  for model in nemotron_h kimi_linear qwen3_5; do
    timeout 140 python3 "$R/benchmarks/offline/host_split.py" --models $model --prompt "$(shaped_prompt $model)" \
      --new 64 --repeats 4 --profile-dir "$RES/calls" --out "$RES/host_split_${model}_b1.json" \
      > "$RES/host_split_${model}_b1.txt" 2>&1
    echo "host_split_$model rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
  done
  tail -n 40 "$RES"/*.txt
fi
# STAGE=3 (about 6 minutes): does the order in which the arms compiled matter? Both arms compile the same frame
#   (PreTrainedModel.__call__), so its cache holds an entry per arm; host_split now also times the guard walk over the
#   frame's entry list up to the passing one, and `bench generate` runs batch 1 with ReplayCache compiled first.
if [ "$STAGE" = 3 ]; then
  for model in nemotron_h kimi_linear; do
    timeout 120 python3 "$R/benchmarks/offline/host_split.py" --models $model --prompt "$(shaped_prompt $model)" \
      --new 64 --repeats 3 --profile-dir "$RES/calls" --out "$RES/host_split_${model}_b1.json" \
      > "$RES/host_split_${model}_b1.txt" 2>&1
    echo "host_split_$model rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
  done
  for model in nemotron_h kimi_linear; do
    bench_job 100 generate_compiled_${model}_b1_replay_first generate --models $model --batches 1 \
      --arms replay-compiled,stock-static-compiled --prompt "$(shaped_prompt $model)" --new 128 --repeats 6 \
      --out "$RES/generate_compiled_${model}_b1_replay_first.json"; pack
  done
  grep -h -A 4 "guard check\|^batch" "$RES"/*.txt
fi
# STAGE=4 (within the last 300 s of GPU time): a layer's origin, count and step counter are now views of one int32
#   tensor (one graph input, one guard, one mutated input per layer for the three): the CUDA-graph tests, then the
#   batch-1 Nemotron-H-like split and generate with what time is left.
if [ "$STAGE" = 4 ]; then
  test_job 150 test_gpu_compiled tests/test_gpu.py -k "compiled_static_cache or static_cache_with_a_read_copy"; pack
  bench_job 60 generate_compiled_nemotron_h_b1_r4 generate --models nemotron_h --batches 1 \
    --arms stock-static-compiled,replay-compiled --prompt 128 --new 128 --repeats 4 \
    --out "$RES/generate_compiled_nemotron_h_b1_r4.json"; pack
  tail -n 4 "$RES"/*.txt
fi
