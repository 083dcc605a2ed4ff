#!/usr/bin/env bash
# Thirteenth session, call 3 (run 75): why the Qwen3.5-like batch-64 speculative arm ran at 0.09x in run 73 (14 s
# for 64 verify forwards after a warm-up at the same lengths; run 67: 0.77x). The bench now counts Triton JIT compiles
# inside each timed run; --time-forwards splits the arm's time by forward width. Plus the GPU test of the counter.
# Call: run(command="bash benchmarks/gpu/next_diag13.sh", carry=[".whl/fla", ".triton_cache"], timeout_s=420)
source benchmarks/gpu/install.sh || exit 1
RES=/tmp/w/res_next_diag13; rm -rf "$RES"; mkdir -p "$RES"; cd /tmp/w
test_job 60 test_gpu_jit_compiles tests/test_gpu.py -k jit_compiles
bench_job 300 speculative_qwen3_5_b64_forwards speculative --models qwen3_5 --batches 64 --prompt 512 --new 64 \
  --schedules heuristic --time-forwards --out "$RES/speculative_qwen3_5_b64_forwards.json"
tail -n 12 "$RES"/*.txt
tar czf "$OUT/next_diag13.tgz" -C "$RES" .
