#!/usr/bin/env bash
# Planned GPU calls for the next session (not run yet). Every job packs what it wrote into $OUT right after it ends,
# so a call that hits its limit still brings back the jobs before (run 76 packed only at the end and lost all).
# STAGE=1 (about 9 minutes on a fresh machine, most of it JIT compiles): the verify kernels' CUDA tests with the
#   matrix-product form (tests/test_kernels_verify.py, slow cases included), the GPU speculation and compile tests,
#   then bench_verify with both forms side by side (run 74, token form, T = 4 x snapshots: Mamba-2 0.93x, GDN 2.01x,
#   KDA 1.15x; target 3x).
# STAGE=2: the launch-configuration sweep of both forms, then the bundled copying model at batch 16 end to end with
#   the default form (if stage 1 shows the product form correct and faster, make it the default before this call).
# STAGE=4 (run 78, added after run 77 timed the IEEE product form 1.3-14x slower than the token form): the product
#   form with tf32x3 tensor-core products side by side with the token form, the sweep of both at T = 4, and the
#   Mamba-2 speculation cases with checkpoints within 1e-5 on CUDA (run 77: the two step kernels one ulp apart).
# STAGE=5 (run 79): bench_verify at the launch defaults run 78's sweep chose, the sweep of wider tiles (and Mamba-2's
#   two forms at every T), the verify kernels' CUDA tests (default set).
# STAGE=6 (run 80): bench_verify at batch 64 and 256 with the launches run 79's sweep chose, then the CUDA tests.
# STAGE=7 (run 81): the replay step at one program per (row, head) and other wide tiles against its defaults.
# STAGE=3 (optional): the Qwen3.5-like batch-64 speculative arm with attention pinned to memory-efficient SDPA
#   (no cuDNN graph builds) and with torch's default, each counting JIT compiles: run 73 measured 0.09x where run 75
#   measured 0.70x.
# Calls: run(command="STAGE=1 bash benchmarks/gpu/next_session14.sh", carry=[".whl/fla", ".triton_cache"],
#        timeout_s=600), then STAGE=2 the same way within 30 s (the machine stays warm). Before a call on a fresh
#        machine: cat FILES_AT/triton_cache.tgz* > .triton_cache/cache.tgz (the last call's compiled kernels).
source benchmarks/gpu/install.sh || exit 1
RES=/tmp/w/res_next_session14_$STAGE; rm -rf "$RES"; mkdir -p "$RES"; cd /tmp/w
pack() { tar czf "$OUT/next_session14_$STAGE.tgz" -C "$RES" . ; }
if [ "$STAGE" = 1 ]; then
  REPLAYSSM_KERNEL_TEST_DEVICE=cuda test_job 240 test_kernels_verify_cuda tests/test_kernels_verify.py \
    -m "slow or not slow"; pack
  test_job 150 test_gpu_spec tests/test_gpu.py -k "jit_compiles or compiles_once or batched_speculation"; pack
  timeout 150 python3 -m hf_replayssm.kernels.bench_verify --family mamba2,gdn,kda --batches 256 --windows 2,4,8 \
    --products --out "$RES/verify_products.json" > "$RES/verify_products.txt" 2>&1
  echo "verify rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
elif [ "$STAGE" = 4 ]; then  # run 78: the product form with tensor-core products (tf32x3), then the token form's sweep
  timeout 200 python3 -m hf_replayssm.kernels.bench_verify --family mamba2,gdn,kda --batches 256 --windows 2,4,8 \
    --products tf32x3 --out "$RES/verify_tf32x3.json" > "$RES/verify_tf32x3.txt" 2>&1
  echo "verify rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
  timeout 230 python3 "$R/benchmarks/gpu/verify_config_sweep.py" --batches 256 --windows 4 --forms tokens,tf32x3 \
    > "$RES/sweep.txt" 2>&1
  echo "sweep rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
  REPLAYSSM_KERNEL_TEST_DEVICE=cuda test_job 120 test_kernels_verify_cuda tests/test_kernels_verify.py \
    -m "slow or not slow" -k "mamba2_speculation"; pack
elif [ "$STAGE" = 5 ]; then  # run 79: the new defaults (wider tiles, Mamba-2's tf32x3 products from T = 4) and the sweep
  timeout 150 python3 -m hf_replayssm.kernels.bench_verify --family mamba2,gdn,kda --batches 256 --windows 2,4,8 \
    --out "$RES/verify_defaults.json" > "$RES/verify_defaults.txt" 2>&1
  echo "verify rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
  timeout 130 python3 "$R/benchmarks/gpu/verify_config_sweep.py" --families mamba2 --batches 64,256 --windows 2,4,8 \
    --forms tokens,tf32x3 --tiles 32,64 --warps 2,4,8 > "$RES/sweep_mamba2.txt" 2>&1
  echo "sweep rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
  timeout 110 python3 "$R/benchmarks/gpu/verify_config_sweep.py" --families gdn,kda --batches 64,256 --windows 2,4,8 \
    --forms tokens --tiles 64,128 --warps 4,8 > "$RES/sweep_delta.txt" 2>&1
  echo "sweep rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
  REPLAYSSM_KERNEL_TEST_DEVICE=cuda test_job 150 test_kernels_verify_cuda tests/test_kernels_verify.py; pack
elif [ "$STAGE" = 6 ]; then  # run 80: bench_verify and the verify kernels' CUDA tests at run 79's launch choices
  timeout 140 python3 -m hf_replayssm.kernels.bench_verify --family mamba2,gdn,kda --batches 64,256 --windows 2,4,8 \
    --out "$RES/verify_final.json" > "$RES/verify_final.txt" 2>&1
  echo "verify rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
  REPLAYSSM_KERNEL_TEST_DEVICE=cuda test_job 270 test_kernels_verify_cuda tests/test_kernels_verify.py; pack
elif [ "$STAGE" = 7 ]; then  # run 81: wider replay-step tiles (the verify kernels' lesson), batch 256
  timeout 200 python3 "$R/benchmarks/gpu/replay_config_sweep.py" --families mamba2,kda,gdn --batches 256 \
    > "$RES/replay_sweep.txt" 2>&1
  echo "replay sweep rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
elif [ "$STAGE" = 3 ]; then
  for sdpa in efficient default; do
    bench_job 280 speculative_qwen3_5_b64_$sdpa speculative --models qwen3_5 --batches 64 --prompt 512 --new 64 \
      --schedules heuristic --sdpa $sdpa --out "$RES/speculative_qwen3_5_b64_$sdpa.json"; pack
  done
else
  timeout 240 python3 "$R/benchmarks/gpu/verify_config_sweep.py" > "$RES/sweep.txt" 2>&1
  echo "sweep rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
  bench_job 200 speculative_tiny_gdn_copy_b16 speculative --models tiny-gdn-copy --batches 16 --prompt 512 \
    --new 128 --out "$RES/speculative_tiny_gdn_copy_b16.json"; pack
fi
tail -n 12 "$RES"/*.txt
save_triton_cache
