#!/usr/bin/env bash
# Planned GPU call (not run yet): what the end-to-end tables still lack. GPU 0: batch 1 for Nemotron-H-like (prompt
# 128: the stock torch prefill of Mamba-2 asks for 170 GiB at 512) and Kimi-Linear-like, then where a Kimi-Linear-like
# batch-256 step spends its GPU time (operator table). GPU 1 (or GPU 0 afterwards): batched speculation on the
# random-weight shaped models, whose verify forwards are long enough for the rollback share to mean something.
# Call: run(command="bash benchmarks/gpu/next_part2.sh", carry=[".whl"], timeout_s=600).
source benchmarks/gpu/install.sh || exit 1
RES=/tmp/w/res_$(basename "$0" .sh); rm -rf "$RES"; mkdir -p "$RES"; cd /tmp/w
second=$(( $(nvidia-smi -L | wc -l) > 1 ? 1 : 0 ))
cli() {  # cli GPU SECONDS NAME ARGS...
  local gpu=$1 limit=$2 name=$3; shift 3
  CUDA_VISIBLE_DEVICES=$gpu timeout "$limit" python3 -m hf_replayssm.cli bench "$@" > "$RES/$name.txt" 2>&1
  echo "$name rc=$?" | tee -a "$RES/done.txt"
}
(cli 0 200 generate_b1_nemotron_h generate --models nemotron_h --batches 1 --prompt 128 --new 128 --repeats 1 \
   --arms stock,stock-static-compiled,replay,replay-compiled --out "$RES/generate_b1_nemotron_h.json"
 cli 0 200 generate_b1_kimi_linear generate --models kimi_linear --batches 1 --prompt 512 --new 128 --repeats 1 \
   --arms stock,stock-static-compiled,replay,replay-compiled --out "$RES/generate_b1_kimi_linear.json"
 cli 0 150 step_kimi_linear_b256 step --models kimi_linear --batches 256 --repeats 1 --profile "$RES/profile_kimi") &
(cli $second 540 speculative_shaped speculative --models qwen3_5,nemotron_h --batches 1,16,64 --prompt 512 --new 128 \
   --schedules constant,heuristic --out "$RES/speculative_shaped.json") &
wait
tail -n 25 "$RES"/*.txt
tar czf "$OUT/$(basename "$0" .sh).tgz" -C "$RES" .  # the device returns at most 8 files
