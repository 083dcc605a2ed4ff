#!/usr/bin/env bash
# Planned GPU call (not run yet), one GPU, serial: what runs 54-58 left open. (1) Where a batched-speculation round of
# the shaped Qwen3.5-like model goes at batch 64 (run 55: 180 ms per verify forward against a 16 ms greedy step):
# forwards by width, device-synchronised. (2) Why the eager Qwen3.5-like batch-256 step is 0.89x of stock + fla
# (operator tables by self GPU time). (3) The rollback's host share on a bundled model
# (small-gdn, batch 16 / 64). (4) The nvfp4 read-copy split defaults (run 56 timed fp8 only).
# Call: run(command="bash benchmarks/gpu/next_session.sh", carry=[".whl/fla"], timeout_s=600).
source benchmarks/gpu/install.sh || exit 1
RES=/tmp/w/res_next_session; rm -rf "$RES"; mkdir -p "$RES"; cd /tmp/w
bench_job 200 speculative_qwen3_5_b64_forwards speculative --models qwen3_5 --batches 64 --prompt 512 --new 64 \
  --schedules heuristic --time-forwards --out "$RES/speculative_qwen3_5_b64_forwards.json"
bench_job 110 speculative_small_gdn speculative --models small-gdn --batches 16,64 --prompt 512 --new 128 \
  --schedules heuristic --out "$RES/speculative_small_gdn.json"
bench_job 100 step_qwen3_5_b256 step --models qwen3_5 --batches 256 --repeats 1 --profile "$RES/profile_qwen3_5"
bench_job 90 kernels_mamba2_nvfp4_split kernels --family mamba2 --shapes nemotron-h-8b --batches 256 --no-sweep \
  --read-format nvfp4 --out "$RES/kernels_mamba2_nvfp4_split.json"
bench_job 70 kernels_gdn_nvfp4_split kernels --family gdn --shapes qwen3-next --batches 256 --no-sweep --no-torch \
  --read-format nvfp4 --out "$RES/kernels_gdn_nvfp4_split.json"
tail -n 20 "$RES"/*.txt
tar czf "$OUT/next_session.tgz" -C "$RES" .
