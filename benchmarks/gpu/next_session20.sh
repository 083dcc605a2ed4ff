#!/usr/bin/env bash
# The twentieth session's GPU calls (runs 116-122; STAGE 3 not run). Every job packs what it wrote into $OUT right after it ends.
# STAGE=1 (about 6 minutes): the nineteenth session's Mamba-2 launches. The host-phase flush launch now has a tile of
#   its own ([16, 128] x 2: 860 -> 726 us per flush at batch 256 in run 114's flush-alone sweep; the cycle only
#   inferred). The CUDA tests of every changed launch (both families), `bench kernels --diag` at batch 64 / 128 / 256
#   (the host cycle at the new flush tile; the new variants flush_batch_grid_fold_tile, the split step's batch-grid
#   flush on [16, 128] x 2 instead of the replay tile, 128 registers instead of 168 at sm_90, and
#   flush_device_grid_p8w2_x12 / _p4w1_x24, the device-grid flush on smaller tiles with more programs per SM; and the
#   host cycle with its replay-only launches walking the tiles on a device-sized grid with tl.range-pipelined loads,
#   `_walk`, diag_host_walk_us; and the split step's replay launch walking likewise, variants walk_s2 / walk_s3,
#   the compiled path's launch). Then read_probe.py (about 1 minute): the read bandwidth of a bare "S0^T q" tile read
#   per program (today's loads) against the pipelined walk (cp.async) and TMA descriptor loads (cp.async.bulk.tensor).
#   Decisions: flush_batch_grid_fold_tile faster at 256 -> the batch-grid flush's default tile (kernels.mamba2
#   launch_config, phase 3); a device-grid variant faster than both grids at 256 -> its values as the device-grid
#   flush's and DEVICE_GRID_MAX_BATCH raised; a walk faster than the per-tile host cycle -> the host-phase default;
#   walk_s2 / _s3 faster than the default step -> the device-phase default (with _count_launch), then end to end.
# STAGE=2 (about 6 minutes): the delta rule. `bench_delta --diag` for KDA at 64 / 256 (the host cycle at the final
#   flush default, the loop fold on [128, 32] x 1: 614 us per flush at 256 in run 114, the cycle timed only at
#   [128, 16] x 1, 231.6 us) and GDN at 256, with the host cycle's walks (diag_host_walk_us), the split step's
#   replay launch walking (variants split_walk_s2 / _s3), and KDA's split step now folding its flush with the loop
#   (replay_mixed_split_us: 717 us in run 111 with the spilling product).
# STAGE=3 (about 6 minutes, carry .whl too): eager decoding at batch 256 (host positions, where the new flush tiles
#   apply; the compiled step uses the device-phase kernels): Nemotron-H-like and Kimi-Linear-like, stock eager against
#   ReplayCache eager, two repeats.
# STAGE=4 (about 4 minutes, carry .whl too): batch 1 end to end with three repeats (Qwen3.5-like measured 0.99x,
#   20 us in a 3 ms host-bound step, in run 110; Nemotron-H-like 1.02x), the issue's "never slower at batch 1".
# Calls: run(command="STAGE=1 bash benchmarks/gpu/next_session20.sh", carry=[".triton_cache"], timeout_s=600), then
#   STAGE=2 the same way, STAGE=3 and 4 with carry=[".triton_cache", ".whl"].
source benchmarks/gpu/install.sh || exit 1
RES=/tmp/w/res_next_session20_$STAGE; rm -rf "$RES"; mkdir -p "$RES"; cd /tmp/w
pack() { tar czf "$OUT/next_session20_$STAGE.tgz" -C "$RES" . ; }
if [ "$STAGE" = 1 ]; then
  REPLAYSSM_KERNEL_TEST_DEVICE=cuda test_job 200 test_kernels_cuda tests/test_kernels_mamba2.py \
    tests/test_kernels_delta.py -k "host_phase or launch_variants or host_flush or kda_weights or replay_walk or flush_device_grid"
  pack
  bench_job 240 kernels_mamba2_diag kernels --family mamba2 --shapes nemotron-h-8b --batches 64,128,256 --no-sweep \
    --diag --out "$RES/kernels_mamba2_diag.json"; pack
  timeout 90 python3 "$R/benchmarks/gpu/read_probe.py" --out "$RES/read_probe.json" > "$RES/read_probe.txt" 2>&1
  echo "read_probe rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
elif [ "$STAGE" = 2 ]; then
  for pair in kda:kimi-linear:64,256:300 gdn:qwen3-next:256:200; do
    IFS=: read -r family shape batches limit <<< "$pair"
    timeout $limit python3 -m hf_replayssm.kernels.bench_delta --family $family --shapes $shape --batches $batches \
      --no-sweep --diag --no-torch --no-fla --out "$RES/delta_${family}_diag.json" > "$RES/delta_${family}_diag.txt" 2>&1
    echo "$family diag rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
  done
elif [ "$STAGE" = 3 ]; then
  for model in nemotron_h kimi_linear; do
    prompt=$([ $model = nemotron_h ] && echo 128 || echo 512)
    bench_job 170 generate_eager_$model generate --models $model --batches 256 --arms stock,replay \
      --prompt $prompt --new 128 --repeats 2 --out "$RES/generate_eager_$model.json"; pack
  done
elif [ "$STAGE" = 5 ]; then  # the twentieth session's second call: STAGE 1's probe again (its write-back form had
  # halved the states rep after rep, so the next form's check divided 0 by 0), then STAGE 4
  timeout 120 python3 "$R/benchmarks/gpu/read_probe.py" --out "$RES/read_probe.json" > "$RES/read_probe.txt" 2>&1
  echo "read_probe rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
  STAGE=4  # the same folder, packed as next_session20_4.tgz from here on
elif [ "$STAGE" = 6 ]; then  # the twentieth session's third call: the walks again with more programs per SM
  # (run 116: every walk lost 1.1-2.2x, but each family's walks got faster with every program added per SM); the
  # new WALKS lists and variants walk_s2_x6 (Mamba-2) / split_walk_s2_x4 (delta), batch 256
  bench_job 150 kernels_mamba2_walks kernels --family mamba2 --shapes nemotron-h-8b --batches 256 --no-sweep \
    --diag --out "$RES/kernels_mamba2_walks.json"; pack
  for pair in kda:kimi-linear gdn:qwen3-next; do
    IFS=: read -r family shape <<< "$pair"
    timeout 150 python3 -m hf_replayssm.kernels.bench_delta --family $family --shapes $shape --batches 256 \
      --no-sweep --diag --no-torch --no-fla --out "$RES/delta_${family}_walks.json" > "$RES/delta_${family}_walks.txt" 2>&1
    echo "$family walks rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
  done
elif [ "$STAGE" = 7 ]; then  # the twentieth session's last call: the delta rule's host-phase replay-only launch now
  # walks by default from 64 rows (32 x 1, 2 stages, 8 per SM; runs 117-118); its CUDA tests, then the default timed
  REPLAYSSM_KERNEL_TEST_DEVICE=cuda test_job 200 test_kernels_cuda tests/test_kernels_delta.py \
    -k "host_walk_default or replay_walk or host_phase"
  pack
  for pair in gdn:qwen3-next kda:kimi-linear; do
    IFS=: read -r family shape <<< "$pair"
    timeout 120 python3 -m hf_replayssm.kernels.bench_delta --family $family --shapes $shape --batches 64,256 \
      --no-sweep --no-torch --no-fla --out "$RES/delta_${family}_default.json" > "$RES/delta_${family}_default.txt" 2>&1
    echo "$family default rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
  done
fi
if [ "$STAGE" = 4 ]; then
  for model in qwen3_5 nemotron_h; do
    prompt=$([ $model = nemotron_h ] && echo 128 || echo 512)
    bench_job 120 generate_b1_$model generate --models $model --batches 1 \
      --arms stock-static-compiled,replay-compiled --prompt $prompt --new 128 --repeats 3 \
      --out "$RES/generate_b1_$model.json"; pack
  done
fi
tail -n 12 "$RES"/*.txt
save_triton_cache
