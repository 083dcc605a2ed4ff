#!/usr/bin/env bash
# Planned GPU call (not run yet), one GPU, serial, about 5 minutes: PackedRollback (every SSM layer's rings and conv
# windows packed into one tensor per buffer, written with device-built masks and gathers: 12 launches per rollback
# for any number of layers, 32 for six GDN layers without it, counted on the CPU) against run 67 (0.26 ms a round,
# 1.17 % of a Qwen3.5-like batch-64 run, about 0.8 ms per call that drops something); then the GPU tests of
# speculation and verify (among them: draft counts 5-7 share one compiled verify kernel); the verify kernels against
# per-draft snapshots with their new loop forms (target: T = 4 at least 3x faster than snapshots; last timed before
# the Mamba-2 verify became a runtime loop, 0.59-0.67x of its former time at T >= 4 in run 67).
# Call: run(command="bash benchmarks/gpu/next_rollback4.sh", carry=[".whl/fla"], timeout_s=600).
source benchmarks/gpu/install.sh || exit 1
RES=/tmp/w/res_next_rollback4; rm -rf "$RES"; mkdir -p "$RES"; cd /tmp/w
bench_job 180 speculative_qwen3_5_b64 speculative --models qwen3_5 --batches 64 --prompt 512 --new 64 \
  --schedules heuristic --time-forwards --out "$RES/speculative_qwen3_5_b64.json"
bench_job 120 speculative_nemotron_h_b64 speculative --models nemotron_h --batches 64 --prompt 128 --new 64 \
  --schedules heuristic --out "$RES/speculative_nemotron_h_b64.json"
timeout 150 python3 -m hf_replayssm.kernels.bench_verify --family mamba2,gdn,kda --batches 256 --windows 2,4,8 \
  --out "$RES/verify.json" > "$RES/verify.txt" 2>&1
echo "verify rc=$? $(date +%T)" | tee -a "$RES/done.txt"
test_job 120 test_gpu_speculation tests/test_gpu.py -k "speculation or verify or draft"
tail -n 12 "$RES"/*.txt
tar czf "$OUT/next_rollback4.tgz" -C "$RES" .
