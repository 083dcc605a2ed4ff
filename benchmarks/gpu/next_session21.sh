#!/usr/bin/env bash
# The twenty-first session's GPU calls (runs 124-129, BENCHMARKS.md); STAGE 4-6 were added during the session.
# Every job packs what it wrote into $OUT right after it ends.
# STAGE=1 (about 7 minutes): GDN's device-phase step as a split step whose replay launch walks the tiles, the
#   compiled path's candidate (run 123: 219.6 us with rows in phase against the fused default's 234.7, 229.3 against
#   227.6 with rows in mixed phases, Qwen3-Next batch 256). `bench_delta` at batch 64 / 256 for both GDN shapes with
#   the variants split_walk_s2_x4 and split_walk_32x1_x8 (and --walks for the host cycle's neighbours). Decision:
#   faster in phase at both batches and not slower mixed by more than 2 % -> the device-phase default for GDN, then
#   STAGE 3 end to end.
#   Before that, Mamba-2's record-coefficient pre-launch (`_weights`, built in the twentieth session, CPU-tested,
#   not timed: sm_90 compile-only, the split step's replay launch 196 -> 112 registers, the host-phase one 128 -> 96):
#   its CUDA tests, then `bench kernels` at batch 64 / 256 (the host arm's replay_host_weights_us and the device-phase
#   variant "weights"). Decision: faster with host positions -> the host default; faster in the split step (rows in
#   mixed phases and in phase) -> the device-phase default, then end to end (Nemotron-H-like, compiled, batch 64 / 256).
# STAGE=2 (about 6 minutes, carry .whl too; carry the Triton cache only if the two fit in 64 MiB): eager decoding at
#   batch 256, where the host-phase launches run (the delta rule's replay-only launch now walks the tiles: Qwen3-Next
#   host cycle 212 -> 177 us): Qwen3.5-like and Kimi-Linear-like, stock (with fla) against ReplayCache, two repeats.
# STAGE=3 (about 5 minutes, carry .whl too): compiled end to end at batch 1 and 256 for Qwen3.5-like, three repeats
#   (batch 1 was 0.93x in run 118 and 0.99x in run 110: host-bound, the arms' order matters).
# Calls: run(command="STAGE=1 bash benchmarks/gpu/next_session21.sh", carry=[".triton_cache"], timeout_s=600), then
#   STAGE=2 and 3 with carry=[".whl", ".triton_cache"] after `python3 benchmarks/gpu/prune_triton_cache.py --drop
#   _delta_commit_kernel,_mamba2_verify_kernel,_delta_verify_kernel,_mamba2_commit_kernel` (both must fit in 64 MiB
#   beside the tracked files; `--list` shows what is in the cache).
source benchmarks/gpu/install.sh || exit 1
RES=/tmp/w/res_next_session21_$STAGE; rm -rf "$RES"; mkdir -p "$RES"; cd /tmp/w
pack() { tar czf "$OUT/next_session21_$STAGE.tgz" -C "$RES" . ; }
if [ "$STAGE" = 1 ]; then
  REPLAYSSM_KERNEL_TEST_DEVICE=cuda test_job 150 test_kernels_cuda tests/test_kernels_mamba2.py -k "replay_weights"
  pack
  bench_job 200 kernels_mamba2_weights kernels --family mamba2 --shapes nemotron-h-8b --batches 64,256 --no-sweep \
    --out "$RES/kernels_mamba2_weights.json"; pack
  for shape in qwen3-next qwen3.5-large; do
    timeout 150 python3 -m hf_replayssm.kernels.bench_delta --family gdn --shapes $shape --batches 64,256 \
      --no-sweep --diag --walks 32:1:2:8,32:1:2:10,64:2:2:4 --no-torch --no-fla \
      --out "$RES/delta_gdn_${shape}.json" > "$RES/delta_gdn_${shape}.txt" 2>&1
    echo "$shape rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
  done
elif [ "$STAGE" = 2 ]; then
  for model in qwen3_5 kimi_linear; do
    bench_job 200 generate_eager_$model generate --models $model --batches 256 --arms stock,replay \
      --prompt 512 --new 128 --repeats 2 --out "$RES/generate_eager_$model.json"; pack
  done
elif [ "$STAGE" = 3 ]; then
  # the new device-phase default (GDN from DEVICE_WALK_MIN_BATCH rows: split, replay launch walking): its CUDA test,
  # then the default launch against the fused one at 128 / 256 / 512 rows (the threshold's neighbours)
  REPLAYSSM_KERNEL_TEST_DEVICE=cuda test_job 120 test_kernels_cuda_device_walk tests/test_kernels_delta.py \
    -k "device_walk_default"
  timeout 120 python3 -m hf_replayssm.kernels.bench_delta --family gdn --shapes qwen3-next --batches 128,256,512 \
    --no-sweep --no-torch --no-fla --out "$RES/delta_gdn_device_default.json" > "$RES/delta_gdn_device_default.txt" 2>&1
  echo "device default rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
  bench_job 280 generate_compiled_qwen3_5 generate --models qwen3_5 --batches 1,256 \
    --arms stock-static-compiled,replay-compiled --prompt 512 --new 128 --repeats 3 \
    --out "$RES/generate_compiled_qwen3_5.json"; pack
elif [ "$STAGE" = 4 ]; then
  # eager Qwen3.5-like at batch 256 was 0.88x stock + fla in STAGE 2 (README: 1.03-1.06x since the tenth session):
  # the model step timed GPU-bound (one sync per run) with operator tables, then with the host-phase walk off
  # (HOST_WALK_MIN_BATCH past the batch: the per-tile replay launch of the nineteenth session), then generate again
  bench_job 200 step_qwen3_5 step --models qwen3_5 --batches 256 --arms stock,replay-triton --repeats 3 \
    --profile "$RES/profile" --out "$RES/step_qwen3_5.json"; pack
  timeout 150 python3 -c "import sys; import hf_replayssm.kernels.delta_rule as d; d.HOST_WALK_MIN_BATCH = 1 << 30
from hf_replayssm.bench.step import main; main(sys.argv[1:])" --models qwen3_5 --batches 256 --arms replay-triton \
    --repeats 3 --out "$RES/step_qwen3_5_no_walk.json" > "$RES/step_qwen3_5_no_walk.txt" 2>&1
  echo "no walk rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
  bench_job 150 generate_eager_qwen3_5_again generate --models qwen3_5 --batches 256 --arms replay,stock \
    --prompt 512 --new 128 --repeats 2 --out "$RES/generate_eager_qwen3_5_again.json"; pack
elif [ "$STAGE" = 5 ]; then
  # where the device-phase split walk loses to the host phase (220 vs 177 us, Qwen3-Next batch 256, rows in phase):
  # the step one count at a time, and the flush launch on the device-sized grid of due rows (variant
  # split_walk_s2_x4_flush_device; with rows in phase 15 steps in 16 have none due)
  for shape in qwen3-next qwen3.5-large; do
    timeout 150 python3 -m hf_replayssm.kernels.bench_delta --family gdn --shapes $shape --batches 256,512 \
      --no-sweep --diag --no-torch --no-fla --out "$RES/delta_gdn_${shape}.json" > "$RES/delta_gdn_${shape}.txt" 2>&1
    echo "$shape rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
  done
elif [ "$STAGE" = 6 ]; then
  # the split step's replay launch walking only the replaying rows' items (_walk compact=True; run 128: with every
  # row due the walk over masked items cost about 170 us of the flush step's 685): CUDA test, then timed
  REPLAYSSM_KERNEL_TEST_DEVICE=cuda test_job 40 test_kernels_cuda_walk tests/test_kernels_delta.py -k "replay_walk"
  pack
  timeout 140 python3 -m hf_replayssm.kernels.bench_delta --family gdn --shapes qwen3-next --batches 256 \
    --no-sweep --no-torch --no-fla --out "$RES/delta_gdn_compact.json" > "$RES/delta_gdn_compact.txt" 2>&1
  echo "compact rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
fi
tail -n 12 "$RES"/*.txt
save_triton_cache
