#!/usr/bin/env bash
# Run 55 (2026-12-01), one GPU, serial (timings on one GPU must not overlap): batch 1 end to end for the
# Nemotron-H-like (prompt 128: the stock torch prefill of Mamba-2 asks for 170 GiB at 512) and Kimi-Linear-like models,
# where a Kimi-Linear-like batch-256 step spends its GPU time, and batched speculation on the shaped Qwen3.5-like
# model at batch 64 (the rollback share of a longer verify forward).
# Call: run(command="bash benchmarks/gpu/next_single.sh", carry=[".whl/fla"], timeout_s=600).
source benchmarks/gpu/install.sh || exit 1
RES=/tmp/w/res_next_single; rm -rf "$RES"; mkdir -p "$RES"; cd /tmp/w
arms=stock,stock-static-compiled,replay-compiled
bench_job 160 generate_b1_nemotron_h generate --models nemotron_h --batches 1 --prompt 128 --new 128 --repeats 1 \
  --arms $arms --out "$RES/generate_b1_nemotron_h.json"
bench_job 140 generate_b1_kimi_linear generate --models kimi_linear --batches 1 --prompt 512 --new 128 --repeats 1 \
  --arms $arms --out "$RES/generate_b1_kimi_linear.json"
bench_job 90 step_kimi_linear_b256 step --models kimi_linear --batches 256 --repeats 1 --profile "$RES/profile_kimi"
bench_job 150 speculative_qwen3_5_b64 speculative --models qwen3_5 --batches 64 --prompt 512 --new 64 \
  --schedules heuristic --out "$RES/speculative_qwen3_5_b64.json"
tail -n 20 "$RES"/*.txt
tar czf "$OUT/next_single.tgz" -C "$RES" .
