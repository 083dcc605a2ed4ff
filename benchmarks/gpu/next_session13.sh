#!/usr/bin/env bash
# Planned GPU call (not run yet), one GPU, serial, about 9 minutes. Call it twice in a row within the machine's 30 s
# idle window (the second call then finds the Triton cache warm): first with STAGE=1, then STAGE=2.
# Stage 1: the compile tests (verify: one variant per window tile with one ring capacity; decode: one variant per
# kernel phase now that the host's ring positions are not specialised on), batched speculation on CUDA, the fold
# kernels; then the Qwen3.5-like batch-64 rollback share with PackedRollback and the fold kernels (run 67: 1.17 %,
# target under 1 %). Stage 2: tiny-gdn-copy in float32 at batch 16 (identical tokens to plain greedy), and the verify
# kernels against per-draft snapshots (target: T = 4 at least 3x faster), and profile_spec.py again (CUDA launches of
# a crossing width-11 verify forward: 604-655 in run 70, before the fold kernels).
# Calls: run(command="STAGE=1 bash benchmarks/gpu/next_session13.sh", carry=[".whl/fla"], timeout_s=600), then
#        run(command="STAGE=2 bash benchmarks/gpu/next_session13.sh", carry=[".whl/fla", ".triton_cache"],
#        timeout_s=600) after copying stage 1's triton_cache.tgz to .triton_cache/cache.tgz (a cold machine then
#        skips the kernels' JIT; a warm one keeps its own cache).
source benchmarks/gpu/install.sh || exit 1
RES=/tmp/w/res_next_session13_$STAGE; rm -rf "$RES"; mkdir -p "$RES"; cd /tmp/w
if [ "$STAGE" = 1 ]; then
  test_job 150 test_gpu_compiles tests/test_gpu.py -k "compiles_once or batched_speculation"
  REPLAYSSM_KERNEL_TEST_DEVICE=cuda test_job 60 test_kernels_fold tests/test_kernels_verify.py -k fold_ring
  bench_job 330 speculative_qwen3_5_b64 speculative --models qwen3_5 --batches 64 --prompt 512 --new 64 \
    --schedules heuristic --out "$RES/speculative_qwen3_5_b64.json"
else
  bench_job 360 speculative_tiny_gdn_copy_fp32 speculative --models tiny-gdn-copy --batches 16 --prompt 512 \
    --new 128 --dtype float32 --schedules heuristic --out "$RES/speculative_tiny_gdn_copy_fp32.json"
  timeout 180 python3 -m hf_replayssm.kernels.bench_verify --family mamba2,gdn,kda --batches 256 --windows 2,4,8 \
    --out "$RES/verify.json" > "$RES/verify.txt" 2>&1
  echo "verify rc=$? $(date +%T)" | tee -a "$RES/done.txt"
  timeout 150 python3 "$R/benchmarks/gpu/profile_spec.py" "$RES" 16 > "$RES/profile_b16.log" 2>&1  # launches now
  echo "profile rc=$? $(date +%T)" | tee -a "$RES/done.txt"
fi
tail -n 8 "$RES"/*.txt
tar czf "$OUT/next_session13_$STAGE.tgz" -C "$RES" .
save_triton_cache  # for the calls after: copy files_at/triton_cache.tgz to .triton_cache/cache.tgz, carry it
