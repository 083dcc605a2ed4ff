#!/usr/bin/env bash
# Planned GPU call (not run yet), one GPU, serial, about 4 minutes: speculation on tiny-gdn-copy, the first bundled
# model that copies repeated text (teacher-forced top-1 on later copies of a passage 0.96; this machine's CPU, float32:
# batched prompt lookup 1.77x / heuristic 1.94x plain greedy at batch 1, 0.87x / 0.81x at batch 16, identical tokens;
# generate(prompt_lookup_num_tokens=10) 1.53x). Targets on the H200: 1.5x at batch 16 (issue: speculative decoding),
# 1.8x at batch 1 (issue: compiled decoding); rollback under 1 % of a step at batch 64.
# Call: run(command="bash benchmarks/gpu/next_copy.sh", carry=[".whl/fla"], timeout_s=600).
source benchmarks/gpu/install.sh || exit 1
RES=/tmp/w/res_next_copy; rm -rf "$RES"; mkdir -p "$RES"; cd /tmp/w
bench_job 240 speculative_tiny_gdn_copy speculative --models tiny-gdn-copy --batches 1,16,64 --prompt 512 --new 128 \
  --schedules constant,heuristic --time-forwards --out "$RES/speculative_tiny_gdn_copy.json"
bench_job 200 speculative_tiny_gdn_copy_fp32 speculative --models tiny-gdn-copy --batches 1,16 --prompt 512 \
  --new 128 --dtype float32 --schedules heuristic --out "$RES/speculative_tiny_gdn_copy_fp32.json"
tail -n 12 "$RES"/*.txt
tar czf "$OUT/next_copy.tgz" -C "$RES" .
