#!/usr/bin/env bash
# Run 62 (2026-12-01), one GPU, serial: the rollback's share of a batched-speculation run after PackedRollback (one
# indexed write per record field for all SSM layers; run 59: 1.86 % of the run, 0.43 ms a round against a 12.4 ms
# step), Qwen3.5-like and Nemotron-H-like at batch 64.
# Call: run(command="bash benchmarks/gpu/next_rollback.sh", carry=[".whl/fla"], timeout_s=600).
source benchmarks/gpu/install.sh || exit 1
RES=/tmp/w/res_next_rollback; rm -rf "$RES"; mkdir -p "$RES"; cd /tmp/w
bench_job 200 speculative_qwen3_5_b64 speculative --models qwen3_5 --batches 64 --prompt 512 --new 64 \
  --schedules heuristic --time-forwards --out "$RES/speculative_qwen3_5_b64.json"
bench_job 200 speculative_nemotron_h_b64 speculative --models nemotron_h --batches 64 --prompt 128 --new 64 \
  --schedules heuristic --out "$RES/speculative_nemotron_h_b64.json"
tail -n 8 "$RES"/*.txt
tar czf "$OUT/next_rollback.tgz" -C "$RES" .
