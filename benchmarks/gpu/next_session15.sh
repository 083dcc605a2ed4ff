#!/usr/bin/env bash
# GPU calls of the fifteenth session (2026-12-01); every job packs what it wrote into $OUT right after it ends.
# STAGE=1 (run 82): the delta-rule verify kernel's steps form (records folded into the checkpoint tile by one tf32x3
#   product, then the window stepped in registers): its CUDA tests, bench_verify beside the default, its launch sweep.
# STAGE=2 (run 83): the sweep at T = 3 / 4 / 8 over tiles 32-128 on 4 warps, 2 warps at T = 4, KDA's replay host tile
#   at batch 64. Runs 84 / 85 were inline sweeps on one and two warps (see BENCHMARKS.md).
# STAGE=3 (run 86): the new defaults: verify CUDA tests, bench_verify for all families at T = 2 / 3 / 4 / 8, the steps
#   tile at T = 5 / 6, the replay step on fewer warps. STAGE=4 (run 87): delta verify CUDA tests, replay cycles at the
#   new replay launches, KDA verify at T = 5 / 6. STAGE=5 (not run): the Qwen3.5-like batch-64 speculative arm with
#   attention pinned to memory-efficient SDPA against the default (run 73 0.09x against run 75 0.70x, unexplained).
# Calls: run(command="STAGE=N bash benchmarks/gpu/next_session15.sh", carry=[".triton_cache"], timeout_s=600).
#   Before a call on a fresh machine: cat FILES_AT/triton_cache.tgz* > .triton_cache/cache.tgz (tracked files plus
#   the carried cache must stay under 64 MiB: prune verify entries of unused tiles if needed).
source benchmarks/gpu/install.sh || exit 1
RES=/tmp/w/res_next_session15_$STAGE; rm -rf "$RES"; mkdir -p "$RES"; cd /tmp/w
pack() { tar czf "$OUT/next_session15_$STAGE.tgz" -C "$RES" . ; }
if [ "$STAGE" = 1 ]; then
  REPLAYSSM_KERNEL_TEST_DEVICE=cuda test_job 150 test_kernels_verify_steps_cuda tests/test_kernels_verify.py \
    -k "steps and not bench"; pack
  timeout 150 python3 -m hf_replayssm.kernels.bench_verify --family gdn,kda --batches 64,256 --windows 2,4,8 \
    --forms steps --out "$RES/verify_steps.json" > "$RES/verify_steps.txt" 2>&1
  echo "verify rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
  timeout 150 python3 "$R/benchmarks/gpu/verify_config_sweep.py" --families gdn,kda --batches 64,256 \
    --windows 2,4,8 --forms tokens,steps --tiles 64,128 --warps 4,8 > "$RES/sweep_steps.txt" 2>&1
  echo "sweep rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
elif [ "$STAGE" = 2 ]; then
  timeout 200 python3 "$R/benchmarks/gpu/verify_config_sweep.py" --families gdn,kda --batches 64,256 \
    --windows 3,4,8 --forms tokens,steps --tiles 32,64,128 --warps 4 > "$RES/sweep_steps_tiles.txt" 2>&1
  echo "sweep rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
  timeout 60 python3 "$R/benchmarks/gpu/verify_config_sweep.py" --families gdn,kda --batches 256 \
    --windows 4 --forms steps --tiles 32,64 --warps 2 > "$RES/sweep_steps_2warps.txt" 2>&1
  echo "sweep 2 warps rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
  timeout 90 python3 "$R/benchmarks/gpu/replay_config_sweep.py" --families kda --batches 64 \
    > "$RES/replay_sweep_kda_b64.txt" 2>&1
  echo "replay sweep rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
elif [ "$STAGE" = 3 ]; then
  REPLAYSSM_KERNEL_TEST_DEVICE=cuda test_job 170 test_kernels_verify_cuda tests/test_kernels_verify.py -k "not bench"
  pack
  timeout 150 python3 -m hf_replayssm.kernels.bench_verify --family mamba2,gdn,kda --batches 64,256 --windows 2,3,4,8 \
    --out "$RES/verify.json" > "$RES/verify.txt" 2>&1
  echo "verify rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
  timeout 60 python3 "$R/benchmarks/gpu/verify_config_sweep.py" --families gdn,kda --batches 256 --windows 5,6 \
    --forms steps --tiles 16,32 --warps 1 > "$RES/sweep_steps_t56.txt" 2>&1
  echo "sweep rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
  timeout 120 python3 "$R/benchmarks/gpu/replay_config_sweep.py" --families gdn,kda,mamba2 --batches 256 \
    --configs 32x1,16x1,64x2,32x2,16x1x4,32x1x4,32x2x4,64x1x4 > "$RES/replay_sweep_warps.txt" 2>&1
  echo "replay sweep rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
elif [ "$STAGE" = 4 ]; then  # the new replay launches (GDN 64 x 2 fp32; KDA 16 x 1 with device positions), KDA T = 5 / 6
  REPLAYSSM_KERNEL_TEST_DEVICE=cuda test_job 150 test_kernels_verify_delta_cuda tests/test_kernels_verify.py \
    -k "delta and not bench"; pack
  for family in gdn kda; do
    timeout 110 python3 -m hf_replayssm.kernels.bench_delta --family $family --batches 64,256 --no-sweep --no-fla \
      --no-torch --out "$RES/replay_$family.json" > "$RES/replay_$family.txt" 2>&1
    echo "replay $family rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
  done
  timeout 60 python3 -m hf_replayssm.kernels.bench_verify --family kda --batches 256 --windows 5,6 \
    --out "$RES/verify_kda_t56.json" > "$RES/verify_kda_t56.txt" 2>&1
  echo "verify rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
elif [ "$STAGE" = 5 ]; then
  for sdpa in efficient default; do
    bench_job 160 speculative_qwen3_5_b64_$sdpa speculative --models qwen3_5 --batches 64 --prompt 512 --new 64 \
      --schedules heuristic --sdpa $sdpa --out "$RES/speculative_qwen3_5_b64_$sdpa.json"; pack
  done
fi
tail -n 12 "$RES"/*.txt
save_triton_cache
