#!/usr/bin/env bash
# Run 56 (2026-12-01), one GPU, serial: where a Kimi-Linear-like batch-256 step spends its GPU time (operator tables by self GPU time),
# Kimi-Linear-like batch 1 end to end (compiled arms), and the kernel defaults no GPU has timed: Mamba-2's split
# read-copy device phase and GDN's optional split, fp8, batch 256.
# Call: run(command="bash benchmarks/gpu/next_final.sh", carry=[".whl/fla"], timeout_s=600).
source benchmarks/gpu/install.sh || exit 1
RES=/tmp/w/res_next_final; rm -rf "$RES"; mkdir -p "$RES"; cd /tmp/w
bench_job 90 step_kimi_linear_b256 step --models kimi_linear --batches 256 --repeats 1 --profile "$RES/profile_kimi"
bench_job 200 generate_b1_kimi_linear generate --models kimi_linear --batches 1 --prompt 512 --new 128 --repeats 1 \
  --arms stock-static-compiled,replay-compiled --out "$RES/generate_b1_kimi_linear.json"
bench_job 110 kernels_mamba2_fp8_split kernels --family mamba2 --shapes nemotron-h-8b --batches 256 --no-sweep \
  --read-format fp8 --out "$RES/kernels_mamba2_fp8_split.json"
bench_job 90 kernels_gdn_fp8_split kernels --family gdn --shapes qwen3-next --batches 256 --no-sweep --no-torch \
  --read-format fp8 --out "$RES/kernels_gdn_fp8_split.json"
tail -n 20 "$RES"/*.txt
tar czf "$OUT/next_final.tgz" -C "$RES" .
