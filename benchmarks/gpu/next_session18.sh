#!/usr/bin/env bash
# Planned GPU calls for the next session (not run yet). Every job packs what it wrote into $OUT right after it ends.
# STAGE=1 (about 5 minutes): KDA's per-head weights pre-launch on one or two warps instead of four. Run 101's counters
#   (BENCHMARKS.md, seventeenth session): on 4 warps it took 95 us of the host-phase step's 262 us of kernel time at
#   batch 256, L1 / shared memory 92 % busy with 63 % excess wavefronts, DRAM 22 %: its reverse cumsum over the
#   records crosses warps. Compile-only (sm_90, Triton 3.6): 1 warp 128 registers, 1 barrier in the PTX (4 warps: 72,
#   22); the verify's pre-launch 0 barriers against 10. The CUDA tests of both (the replay and verify weights cases
#   run the one-warp launch too), the step timed with 1 / 2 / 4 warps at host and device positions (ncu_kernels.py),
#   the verify with `--forms weights_1warp`, and the counters of the KDA arms. If one warp wins: make it the default
#   of both pre-launches (and re-time the KDA replay cycle: bench_delta --family kda).
# STAGE=2 (about 5 minutes): Mamba-2's split device-phase step with its flush launch on a device-sized grid
#   (`_flush_grid="device"`, `_mamba2_flush_due_kernel`, built in the seventeenth session): run 101 timed the
#   batch-sized flush launch at 132 us with one row in 16 due (65 536 programs, 61 440 of which only read a count),
#   for about 36 us of bytes. Its CUDA tests, the step at batch 256 timed and counted (ncu_kernels.py, arm
#   replay_device_flush_grid), and `hf-replayssm bench kernels --family mamba2` at batch 64 / 256 with the new
#   variant (`replay_mixed_flush_device_grid_us`, `replay_in_phase_flush_device_grid_us`: every row flushing in one
#   step is its worst case). If it wins in both phase layouts: make "device" the default.
# STAGE=3 (about 4 minutes): the replay-only launches streaming the checkpoint in K chunks (`_chunk_k`, built in the
#   seventeenth session): run 101 found GDN's replay at 238 registers, 12.5 % occupancy and 67 % of DRAM bandwidth
#   (the standard step: 81 %). sm_90 registers: chunk 16 at [128, 64] x 2 155, chunk 32 at [128, 64] x 4 94, chunk 16
#   at [128, 128] x 4 123 (KDA: 123 / 119 / 121). The step timed at host positions and split at device positions
#   beside the defaults (ncu_kernels.py --chunks), and the counters. If a launch wins: make it the replay-only
#   launches' default in replay_launch_config and re-time the cycles (bench_delta). The same run times GDN / KDA
#   split steps with the flush launch on a device-sized grid (`_flush_grid="device"`, `_delta_flush_due_kernel`),
#   alone and with the chunked replay launch, against the fused device-phase default (run 101: GDN 229 us, 255
#   registers and spills).
# STAGE=4 (after runs 102-104; about 5 minutes, carry .whl/fla too): KDA's weights pre-launch on one warp is now the
#   default of both pre-launches. Its CUDA tests (the four-warp launch as the alternative), the KDA replay cycle
#   re-timed beside the standard step and fla (bench_delta), the verify at T = 2 / 3 with and without the pre-launch
#   (WEIGHTS_FROM_WINDOW was chosen on four warps), and Mamba-2's device-sized flush grid at batch 32 / 128 / 256
#   (run 103: it won at batch 64, lost at 256 in bench kernels, won at 256 in ncu_kernels.py), with ncu_kernels.py's
#   Mamba-2 arms again.
# STAGE=5 (after run 105; about 9 minutes, carry .whl/fla too): the KDA replay cycle with its launch sweeps at the new
#   defaults (bench_delta's host-position arm now starts from the host default), Kimi-Linear-like end to end compiled
#   (one-warp weights in every KDA step; run 91: 1.25x / 1.42x), Nemotron-H-like at batch 64 (the device-grid flush).
# STAGE=6 (after run 106; about 4 minutes): run 106's batch-64 end-to-end ratios fell (Kimi-Linear 1.25x -> 1.09x,
#   Nemotron-H 1.27x -> 1.09x): each model at batch 64 with this session's change undone in the process (Mamba-2's
#   flush on the batch-sized grid: DEVICE_GRID_MAX_BATCH = 0; KDA's pre-launch on four warps) and at the defaults,
#   alternating, each bench with its own stock arm.
# STAGE=7 (the session's last 250 s): Nemotron-H-like at batch 64 as the first bench process on a fresh machine (run
#   106's position), now that bench generate counts Triton compiles inside the timed runs.
# Calls: run(command="STAGE=1 bash benchmarks/gpu/next_session18.sh", carry=[".triton_cache"], timeout_s=600), then
#   STAGE=2 and 3 the same way.
source benchmarks/gpu/install.sh || exit 1
RES=/tmp/w/res_next_session18_$STAGE; rm -rf "$RES"; mkdir -p "$RES"; cd /tmp/w
pack() { tar czf "$OUT/next_session18_$STAGE.tgz" -C "$RES" . ; }
if [ "$STAGE" = 1 ]; then
  REPLAYSSM_KERNEL_TEST_DEVICE=cuda test_job 200 test_kernels_kda_weights_cuda tests/test_kernels_delta.py \
    tests/test_kernels_verify.py -k "kda_weights"; pack
  timeout 90 python3 "$R/benchmarks/gpu/ncu_kernels.py" --families kda --kda-weights-warps 1,2 \
    > "$RES/kda_weights_warps.txt" 2>&1
  echo "times rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
  timeout 150 python3 -m hf_replayssm.kernels.bench_verify --family kda --batches 64,256 --windows 3,4,8 \
    --forms weights_1warp --out "$RES/verify_kda_weights_1warp.json" > "$RES/verify_kda_weights_1warp.txt" 2>&1
  echo "verify rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
  ncu_job 120 ncu_kda --families kda --kda-weights-warps 1,2
elif [ "$STAGE" = 2 ]; then
  REPLAYSSM_KERNEL_TEST_DEVICE=cuda test_job 150 test_kernels_mamba2_flush_grid_cuda tests/test_kernels_mamba2.py \
    -k "flush_device_grid or launch_variants or mixed_bf16"; pack
  timeout 90 python3 "$R/benchmarks/gpu/ncu_kernels.py" --families mamba2 > "$RES/mamba2_flush_grid.txt" 2>&1
  echo "times rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
  bench_job 200 kernels_mamba2_flush_grid kernels --family mamba2 --shapes nemotron-h-8b --batches 64,256 --no-sweep \
    --out "$RES/kernels_mamba2_flush_grid.json"; pack
  ncu_job 120 ncu_mamba2 --families mamba2
elif [ "$STAGE" = 3 ]; then
  REPLAYSSM_KERNEL_TEST_DEVICE=cuda test_job 150 test_kernels_chunked_cuda tests/test_kernels_delta.py \
    -k "chunked_checkpoint or flush_device_grid"; pack
  CHUNKS=16:64:2,32:64:4,16:128:4,32:128:4,16:32:1
  timeout 150 python3 "$R/benchmarks/gpu/ncu_kernels.py" --families gdn,kda --chunks $CHUNKS \
    > "$RES/chunked_replay.txt" 2>&1
  echo "times rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
  ncu_job 150 ncu_chunked --families gdn --chunks 16:64:2,32:64:4
elif [ "$STAGE" = 4 ]; then
  REPLAYSSM_KERNEL_TEST_DEVICE=cuda test_job 200 test_kernels_kda_weights_cuda tests/test_kernels_delta.py \
    tests/test_kernels_verify.py -k "kda_weights"; pack
  timeout 200 python3 -m hf_replayssm.kernels.bench_delta --family kda --shapes kimi-linear --batches 64,256 \
    --no-sweep --no-torch --out "$RES/delta_kda_cycle.json" > "$RES/delta_kda_cycle.txt" 2>&1
  echo "kda cycle rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
  timeout 120 python3 -m hf_replayssm.kernels.bench_verify --family kda --batches 64,256 --windows 2,3 \
    --forms weights,no_weights --out "$RES/verify_kda_t2.json" > "$RES/verify_kda_t2.txt" 2>&1
  echo "verify rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
  bench_job 200 kernels_mamba2_flush_grid kernels --family mamba2 --shapes nemotron-h-8b --batches 32,128,256 \
    --no-sweep --out "$RES/kernels_mamba2_flush_grid.json"; pack
  timeout 60 python3 "$R/benchmarks/gpu/ncu_kernels.py" --families mamba2 > "$RES/mamba2_flush_grid.txt" 2>&1
  echo "times rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
elif [ "$STAGE" = 5 ]; then
  timeout 170 python3 -m hf_replayssm.kernels.bench_delta --family kda --shapes kimi-linear --batches 64,256 \
    --no-torch --out "$RES/delta_kda_cycle_sweep.json" > "$RES/delta_kda_cycle_sweep.txt" 2>&1
  echo "kda cycle rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
  bench_job 230 generate_kimi_linear generate --models kimi_linear --batches 64,256 \
    --arms stock-static-compiled,replay-compiled --prompt 512 --new 128 --repeats 1 \
    --out "$RES/generate_kimi_linear.json"; pack
  bench_job 120 generate_nemotron_h generate --models nemotron_h --batches 64 \
    --arms stock-static-compiled,replay-compiled --prompt 128 --new 128 --repeats 1 \
    --out "$RES/generate_nemotron_h.json"; pack
elif [ "$STAGE" = 6 ]; then
  ab() {  # ab NAME MODEL PROMPT PATCH: bench generate at batch 64 with a module global patched first
    timeout 100 python3 -c "import sys; from hf_replayssm.kernels import mamba2, delta_rule; $4
from hf_replayssm.cli import main; sys.argv = ['hf-replayssm'] + sys.argv[1:]; main()" bench generate \
      --models "$2" --batches 64 --arms stock-static-compiled,replay-compiled --prompt "$3" --new 128 --repeats 1 \
      --out "$RES/$1.json" > "$RES/$1.txt" 2>&1
    echo "$1 rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
  }
  ab nemotron_batch_grid nemotron_h 128 "mamba2.DEVICE_GRID_MAX_BATCH = 0"
  ab nemotron_default nemotron_h 128 "pass"
  ab kimi_weights_4warps kimi_linear 512 "delta_rule.KDA_WEIGHTS_WARPS = 4"
  ab kimi_default kimi_linear 512 "pass"
elif [ "$STAGE" = 7 ]; then
  bench_job 110 generate_nemotron_h generate --models nemotron_h --batches 64 \
    --arms stock-static-compiled,replay-compiled --prompt 128 --new 128 --repeats 1 \
    --out "$RES/generate_nemotron_h.json"; pack
fi
tail -n 12 "$RES"/*.txt
save_triton_cache
