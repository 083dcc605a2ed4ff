#!/usr/bin/env bash
# Planned GPU calls for the next session (not run yet). Every job packs what it wrote into $OUT right after it ends.
# STAGE=1 (about 8 minutes): the delta-rule verify kernel's steps form (new in the fourteenth session, unmeasured:
#   records folded into the checkpoint tile by one tf32x3 product, then the window stepped in registers; ptxas for
#   sm_90 counts 2.2-2.4x fewer barriers than the token form and 168 against 227 registers at [128, 64] x 4): its
#   CUDA tests first, then bench_verify with it beside the default (run 80 at T = 4, batch 256: GDN 2.41x, KDA 2.14x
#   snapshots; target 3x), then its launch sweep (tiles 64 / 128 on 4 / 8 warps; 8 warps compile to 127-144
#   registers for it). If it wins, make it the default (delta_verify.default_form and verify_launch_config).
# STAGE=2: where the token form's time goes (verify_cost_probe.py: T, records, normalisation), the KDA replay step's
#   host-phase tile at batch 64 (run 81 measured batch 256 only), and the Qwen3.5-like batch-64 speculative arm with
#   attention pinned to memory-efficient SDPA against the default (run 73 0.09x against run 75 0.70x, unexplained).
# Calls: run(command="STAGE=1 bash benchmarks/gpu/next_session15.sh", carry=[".triton_cache"], timeout_s=600), then
#   STAGE=2 the same way. Before a call on a fresh machine: cat FILES_AT/triton_cache.tgz* > .triton_cache/cache.tgz
#   (tracked files plus the carried cache must stay under 64 MiB: prune verify entries of unused tiles if needed).
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
else
  for sdpa in efficient default; do
    bench_job 160 speculative_qwen3_5_b64_$sdpa speculative --models qwen3_5 --batches 64 --prompt 512 --new 64 \
      --schedules heuristic --sdpa $sdpa --out "$RES/speculative_qwen3_5_b64_$sdpa.json"; pack
  done
fi
tail -n 12 "$RES"/*.txt
save_triton_cache
