#!/usr/bin/env bash
# Run 66 (2026-12-01), one GPU, serial: per-row rollback after its host-built indices were replaced by device-side
# masks and gathers (run 62: 0.435 ms per round, 1.41 % of a Qwen3.5-like batch-64 run, about 1.3 ms per call that
# drops something). Same commands as run 62, then the GPU tests of batched speculation (rows equal rows alone) and
# speculation against greedy on CUDA.
# Call: run(command="bash benchmarks/gpu/next_rollback3.sh", carry=[".whl/fla"], timeout_s=600).
source benchmarks/gpu/install.sh || exit 1
RES=/tmp/w/res_next_rollback3; rm -rf "$RES"; mkdir -p "$RES"; cd /tmp/w
bench_job 200 speculative_qwen3_5_b64 speculative --models qwen3_5 --batches 64 --prompt 512 --new 64 \
  --schedules heuristic --time-forwards --out "$RES/speculative_qwen3_5_b64.json"
bench_job 150 speculative_nemotron_h_b64 speculative --models nemotron_h --batches 64 --prompt 128 --new 64 \
  --schedules heuristic --out "$RES/speculative_nemotron_h_b64.json"
test_job 180 test_gpu_speculation tests/test_gpu.py -k "batched_speculation or speculation_equals_greedy"
tail -n 8 "$RES"/*.txt
tar czf "$OUT/next_rollback3.tgz" -C "$RES" .
