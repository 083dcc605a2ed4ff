#!/usr/bin/env bash
# Planned GPU calls for the next session (not run yet). Every job packs what it wrote into $OUT right after it ends.
# STAGE=1 (about 9 minutes): GDN's device-phase default since the twenty-first session (from 256 rows a split step
#   whose replay launch walks only the replaying rows' items, `_walk` compact; timed at Qwen3-Next batch 256 only, run
#   129: 210.7 us in phase, 222.6 mixed, against the fused 233.9 / 228.4): its CUDA tests (run 129's ran out of its
#   40 s compiling) and the new fp8 streamed replay's (`_chunk_k` with an fp8 read copy: the codes K rows at a time,
#   the row scales folded into q and k), then `bench_delta --read-format fp8` at Qwen3-Next batch 256 (the streamed
#   fp8 cycles over READ_COPY_CHUNKS beside the whole-tile default, 254.6 us in run 93, and one launch at a time) and
#   the device default with the variants split_walk_s2_x4_compact / split_walk_32x1_x8_compact at 64 / 128 / 512
#   rows. Decisions: the faster compacting walk in phase and mixed -> the default walk; faster than fused at 128
#   (and 64) -> lower DEVICE_WALK_MIN_BATCH; slower at 512 -> the walk over every item there; the streamed fp8 cycle
#   faster than the whole tile -> the fp8 read copy's host-phase default.
# STAGE=6 (about 9 minutes, carry .whl too): STAGE 3, then compiled Qwen3.5-like at batch 256 with the separated fp8
#   arm (STAGE 2's batch-256 half). STAGE=7 (about 6 minutes, carry .whl too): that compiled run alone.
# STAGE=5 (about 8 minutes): CUDA tests of the fp8 stream default and the solved exact fold (_exact_solve, new: the
#   records' corrected values at once, (I + A) D = rhs, instead of stepping them over the state tile; the stepped
#   flush launch costs 1004.8 us at Qwen3-Next 256, run 130), then `bench_delta --read-format fp8` at Qwen3-Next 256 rows (the solved exact fold timed) and 64
#   (the streamed fp8 replay, the default since run 130 from 64 rows), and nvfp4 at 256 (streamed too since this
#   session: each chunk decoded as loaded).
# STAGE=2 (about 8 minutes, carry .whl too): compiled end to end, Qwen3.5-like at batch 64 and 256, two repeats,
#   with the separated fp8 arm (its replay launches streaming the copy since run 130).
# STAGE=3 (about 4 minutes, carry .whl too): where eager Qwen3.5-like's host time goes at batch 256 (run 127: 1.52x
#   less GPU work per step than stock + fla, yet 0.74-0.88x its speed, host-bound): `bench step --host-profile`
#   (cProfile of 16 decode forwards per arm, new) beside the operator tables.
# STAGE=4 (about 4 minutes, carry .whl too): where a compiled batch-1 Qwen3.5-like step goes (runs 110 / 118 / 126:
#   0.99x / 0.93x / 1.00x against stock static compiled): profile_compiled.py, arms replay / stock / replay, kernels and
#   GPU time per decode step side by side.
# Calls: run(command="STAGE=1 bash benchmarks/gpu/next_session22.sh", carry=[".triton_cache"], timeout_s=600)
#   (STAGE=5 alike), then STAGE=2 with carry=[".whl", ".triton_cache"] (the two must fit in 64 MiB beside the tracked files; prune with
#   benchmarks/gpu/prune_triton_cache.py, `--list` shows what is in the cache).
source benchmarks/gpu/install.sh || exit 1
RES=/tmp/w/res_next_session22_$STAGE; rm -rf "$RES"; mkdir -p "$RES"; cd /tmp/w
pack() { tar czf "$OUT/next_session22_$STAGE.tgz" -C "$RES" . ; }
if [ "$STAGE" = 1 ]; then
  REPLAYSSM_KERNEL_TEST_DEVICE=cuda test_job 200 test_kernels_cuda tests/test_kernels_delta.py \
    tests/test_kernels_read_copy.py -k "replay_walk or device_walk_default or delta_chunked_fp8"
  pack
  timeout 200 python3 -m hf_replayssm.kernels.bench_delta --family gdn --shapes qwen3-next --batches 256 \
    --read-format fp8 --no-sweep --no-torch --no-fla --out "$RES/delta_fp8_qwen3-next.json" \
    > "$RES/delta_fp8_qwen3-next.txt" 2>&1
  echo "fp8 rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
  timeout 150 python3 -m hf_replayssm.kernels.bench_delta --family gdn --shapes qwen3-next --batches 64,128,512 \
    --no-sweep --no-torch --no-fla --out "$RES/delta_qwen3-next.json" > "$RES/delta_qwen3-next.txt" 2>&1
  echo "qwen3-next rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
elif [ "$STAGE" = 5 ]; then
  REPLAYSSM_KERNEL_TEST_DEVICE=cuda test_job 100 test_read_copy_cuda tests/test_kernels_read_copy.py \
    -k "delta_stream_default or delta_exact_solve or delta_chunked"
  pack
  for spec in "gdn qwen3-next 256,64 fp8 200" "gdn qwen3-next 256 nvfp4 150"; do
    set -- $spec
    read=(); [ "$4" != - ] && read=(--read-format "$4")
    timeout $5 python3 -m hf_replayssm.kernels.bench_delta --family $1 --shapes $2 --batches $3 "${read[@]}" \
      --no-sweep --no-torch --no-fla --out "$RES/delta_$2_$4.json" > "$RES/delta_$2_$4.txt" 2>&1
    echo "$2 $4 rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
  done
elif [ "$STAGE" = 6 ]; then  # STAGE 3's host profile, then compiled Qwen3.5-like at batch 256 with the fp8 arm
  bench_job 230 step_host_profile step --models qwen3_5 --batches 256 --arms stock,replay-triton --repeats 2 \
    --profile "$RES/ops" --host-profile "$RES/host" --out "$RES/step_host_profile.json"; pack
  bench_job 300 generate_compiled_qwen3_5 generate --models qwen3_5 --batches 256 \
    --arms stock-static-compiled,replay-compiled,replay-fp8-compiled --prompt 512 --new 128 --repeats 2 \
    --out "$RES/generate_compiled_qwen3_5.json"; pack
elif [ "$STAGE" = 8 ]; then  # the run-131 stream defaults' CUDA test
  REPLAYSSM_KERNEL_TEST_DEVICE=cuda test_job 110 test_read_copy_defaults_cuda tests/test_kernels_read_copy.py \
    -k "delta_stream_default"
  pack
elif [ "$STAGE" = 7 ]; then  # STAGE 6's second half alone
  bench_job 330 generate_compiled_qwen3_5 generate --models qwen3_5 --batches 256 \
    --arms stock-static-compiled,replay-compiled,replay-fp8-compiled --prompt 512 --new 128 --repeats 2 \
    --out "$RES/generate_compiled_qwen3_5.json"; pack
elif [ "$STAGE" = 3 ]; then
  bench_job 240 step_host_profile step --models qwen3_5 --batches 256 --arms stock,replay-triton --repeats 2 \
    --profile "$RES/ops" --host-profile "$RES/host" --out "$RES/step_host_profile.json"; pack
elif [ "$STAGE" = 4 ]; then
  timeout 300 python3 "$R/benchmarks/gpu/profile_compiled.py" --model qwen3_5 --batch 1 --prompt 512 --new 80 \
    --arms replay-compiled,stock-static-compiled,replay-compiled --out "$RES/profile_compiled" \
    > "$RES/profile_compiled.txt" 2>&1
  echo "profile_compiled rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
elif [ "$STAGE" = 2 ]; then
  bench_job 450 generate_compiled_qwen3_5 generate --models qwen3_5 --batches 64,256 \
    --arms stock-static-compiled,replay-compiled,replay-fp8-compiled --prompt 512 --new 128 --repeats 2 \
    --out "$RES/generate_compiled_qwen3_5.json"; pack
fi
tail -n 12 "$RES"/*.txt
save_triton_cache
