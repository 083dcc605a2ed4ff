#!/usr/bin/env bash
# Planned GPU calls for the next session (not run yet). Every job packs what it wrote into $OUT right after it ends.
# STAGE=1 (about 7 minutes): GDN's device-phase default since the twenty-first session (from 256 rows a split step
#   whose replay launch walks only the replaying rows' items, `_walk` compact; timed at Qwen3-Next batch 256 only, run
#   129: 210.7 us in phase, 222.6 mixed, against the fused 233.9 / 228.4): its CUDA tests (run 129's ran out of its
#   40 s compiling), then `bench_delta` at 64 / 128 / 256 / 512 rows on both GDN shapes and KDA, the variant
#   split_walk_s2_x4_compact and split_walk_32x1_x8_compact (the walk on the host walk's [K, 32] x 1 tile at 8 per
#   SM, its own tile since this session: sm_90 compile-only GDN 168 registers, no spills, against 255 for [128, 64]
#   x 2; KDA 96) timed at every batch. Decisions: the faster compacting walk in phase and mixed -> the default walk;
#   faster than fused at 128 (and 64) in phase and not slower mixed -> lower DEVICE_WALK_MIN_BATCH; slower at 512 or on
#   Qwen3.5-large -> the walk over every item there; KDA's compacting split step faster than its fused default -> its
#   device-phase default (device_walk_launch_config serves scalar gates only today).
# STAGE=2 (about 6 minutes, carry .whl too): compiled end to end, Qwen3.5-like at batch 64 and 256, three repeats.
# STAGE=3 (about 4 minutes, carry .whl too): where eager Qwen3.5-like's host time goes at batch 256 (run 127: 1.52x
#   less GPU work per step than stock + fla, yet 0.74-0.88x its speed, host-bound): `bench step --host-profile`
#   (cProfile of 16 decode forwards per arm, new) beside the operator tables.
# Calls: run(command="STAGE=1 bash benchmarks/gpu/next_session22.sh", carry=[".triton_cache"], timeout_s=600), then
#   STAGE=2 with carry=[".whl", ".triton_cache"] (the two must fit in 64 MiB beside the tracked files; prune with
#   benchmarks/gpu/prune_triton_cache.py, `--list` shows what is in the cache).
source benchmarks/gpu/install.sh || exit 1
RES=/tmp/w/res_next_session22_$STAGE; rm -rf "$RES"; mkdir -p "$RES"; cd /tmp/w
pack() { tar czf "$OUT/next_session22_$STAGE.tgz" -C "$RES" . ; }
if [ "$STAGE" = 1 ]; then
  REPLAYSSM_KERNEL_TEST_DEVICE=cuda test_job 200 test_kernels_cuda tests/test_kernels_delta.py \
    -k "replay_walk or device_walk_default"
  pack
  for spec in "gdn qwen3-next" "gdn qwen3.5-large" "kda kimi-linear"; do
    set -- $spec
    timeout 150 python3 -m hf_replayssm.kernels.bench_delta --family $1 --shapes $2 --batches 64,128,256,512 \
      --no-sweep --no-torch --no-fla --out "$RES/delta_$2.json" > "$RES/delta_$2.txt" 2>&1
    echo "$2 rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
  done
elif [ "$STAGE" = 3 ]; then
  bench_job 240 step_host_profile step --models qwen3_5 --batches 256 --arms stock,replay-triton --repeats 2 \
    --profile "$RES/ops" --host-profile "$RES/host" --out "$RES/step_host_profile.json"; pack
elif [ "$STAGE" = 2 ]; then
  bench_job 400 generate_compiled_qwen3_5 generate --models qwen3_5 --batches 64,256 \
    --arms stock-static-compiled,replay-compiled --prompt 512 --new 128 --repeats 3 \
    --out "$RES/generate_compiled_qwen3_5.json"; pack
fi
tail -n 12 "$RES"/*.txt
save_triton_cache
