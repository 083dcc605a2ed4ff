#!/usr/bin/env bash
# Planned GPU calls for the next session (not run yet). Every job packs what it wrote into $OUT right after it ends.
# STAGE=1 (about 8 minutes, carry .whl/fla too): batch 1 after the twenty-eighth session's last change (a layer's
#   origin, count and step counter are one tensor: one graph input per layer for three; run 157 measured it with four
#   repeats only, paired 1.00x Nemotron-H-like): compiled batch-1 `generate` of the three shaped models, twelve
#   interleaved repeats, then host_split.py with --profile-dir on Nemotron-H-like (did the compiled frame's excess,
#   +28 to +40 us in runs 155 / 156, shrink with the inputs? The per-input hypothesis), then frame_overhead.py on the
#   image's CPU stack (the compiled frame alone, null backend: on this CPU with torch 2.11 / 2.13 it costs the same for both
#   caches outside the guard check).
# Call: run(command="STAGE=1 bash benchmarks/gpu/next_session29.sh", carry=[".whl/fla", ".triton_cache"],
#   timeout_s=600)
source benchmarks/gpu/install.sh || exit 1
session_results next_session29; cd /tmp/w
if [ "$STAGE" = 1 ]; then
  for model in nemotron_h kimi_linear qwen3_5; do paired_b1_job 150 $model 12; done
  timeout 120 python3 "$R/benchmarks/offline/host_split.py" --models nemotron_h --prompt 128 --new 64 --repeats 4 \
    --profile-dir "$RES/calls" --out "$RES/host_split_nemotron_h_b1.json" > "$RES/host_split_nemotron_h_b1.txt" 2>&1
  echo "host_split_nemotron_h rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
  # the compiled frame alone (null backend, CPU) on this image's torch 2.11 / transformers 5.17
  CUDA_VISIBLE_DEVICES= timeout 240 python3 "$R/benchmarks/offline/frame_overhead.py" --out "$RES/frame_overhead.json" \
    > "$RES/frame_overhead.txt" 2>&1
  echo "frame_overhead rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
  grep -h -A 3 "^batch\|guard check\|frame per call" "$RES"/*.txt
fi
save_triton_cache
