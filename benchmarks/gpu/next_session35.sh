#!/usr/bin/env bash
# GPU calls of the thirty-fifth session. Every job packs what it wrote into $OUT.
# Call: run(command="STAGE=N bash benchmarks/gpu/next_session35.sh", carry=[".whl/fla", ".triton_cache"],
#   timeout_s=600)
# STAGE=1 (about 5 minutes): where Mamba-2's replay-only launch reading a copy spends its time
#   (benchmarks/gpu/copy_replay_probe.py: counts 0 / 8 / 14 per tile, with and without the record coefficients from
#   a pre-launch, fp32 / fp8 / nvfp4; the host cycle as the cache runs it per tile).
# STAGE=2 (about 6 minutes): run 182 found the copy launches far faster on other tiles (fp8 [64, 128] x 2 warps: host
#   cycle 268.3 -> 193.0 us; nvfp4 [32, 128] x 1 warp with the coefficients pre-launch 335.8 -> 267.2; the fp32
#   replay launch at count 8 333.5 -> 297.6 on one warp): the candidate tiles at count 8, the host cycle and the
#   compiled path's split step (in phase / mixed) for each format.
# STAGE=3 (about 8 minutes): run 183's tiles as the defaults (replay_launch_config by read format and positions;
#   the coefficients pre-launch on for a split step reading a copy): the CUDA tests of the copy launches (the new
#   case at a batch whose defaults they are), the flush and re-encode cases, tests/test_gpu.py's separated-policy
#   model tests; Mamba-2 fp8 and nvfp4 at 64 and 256 (bench kernels, --no-sweep).
# STAGE=4 (about 8 minutes): the delta rule's streamed copy launches on other tiles (read_copy_defaults.py
#   --stream-tiles), GDN and KDA, fp8 and nvfp4, batch 256: host cycle as the cache runs it, split step in phase.
# STAGE=5 (about 6 minutes): run 185's whole-head streamed tiles as the delta rule's defaults (GDN both formats, KDA
#   fp8): the CUDA tests of the delta copy launches, and read_copy_defaults.py at 64 and 256 (every default arm).
# STAGE=6 (about 4 minutes): the stream-default case on CUDA again (run 186 stopped at a wrong launch-rule assertion,
#   fixed); where GDN's fp8 host flush goes (read_copy_defaults.py at 256: the flush's outputs from the copy without
#   the re-encode beside the plain flush and the cache's flush).
# STAGE=7 (about 5 minutes): run 187 found GDN's fp8 flush giving its outputs from the copy 26.9 us per step dearer
#   than the plain flush (nvfp4: 1.2): the flush launches now load the fp8 copy's scales once per row instead of once
#   per element (_flush_scale_per_row): the flush CUDA test, GDN / KDA fp8 at 256 with both.
source benchmarks/gpu/install.sh || exit 1
session_results next_session35; cd /tmp/w
if [ "$STAGE" = 1 ]; then
  timeout 420 python3 "$R/benchmarks/gpu/copy_replay_probe.py" --out "$RES/copy_replay_probe.json" 2>&1 \
    | tee "$RES/copy_replay_probe.txt"
  echo "copy_replay_probe rc=${PIPESTATUS[0]} $(date +%T)" | tee -a "$RES/done.txt"; pack
elif [ "$STAGE" = 2 ]; then
  timeout 500 python3 "$R/benchmarks/gpu/copy_replay_probe.py" --counts 8 --configs 32x2x4,32x1x4,64x1x4,64x2x4,16x1x4 \
    --device-steps --out "$RES/copy_replay_tiles.json" 2>&1 | tee "$RES/copy_replay_tiles.txt"
  echo "copy_replay_tiles rc=${PIPESTATUS[0]} $(date +%T)" | tee -a "$RES/done.txt"; pack
elif [ "$STAGE" = 3 ]; then
  REPLAYSSM_KERNEL_TEST_DEVICE=cuda test_job 200 test_kernels_copy_tiles_cuda tests/test_kernels_read_copy.py \
    -k "mamba2 or flush_reads_copy or bad_read_copy"; pack
  test_job 150 test_gpu_separated tests/test_gpu.py -k "separated_flushes_in_the_kernel or static_cache_with_a_read_copy \
    or exact_separated"; pack
  tail -n 3 "$RES"/test_*.txt; grep -h "^FAILED\|Error" "$RES"/test_*.txt | head -20
  for fmt in fp8 nvfp4; do
    bench_job 150 kernels_mamba2_${fmt}_tiles kernels --family mamba2 --shapes nemotron-h-8b --batches 64,256 \
      --no-sweep --read-format $fmt --out "$RES/kernels_mamba2_${fmt}_tiles.json"; pack
  done
  grep -h "check\|host-phase replay\|as the cache\|device\|^nemotron\|^ *256\|^ *64" "$RES"/kernels_*.txt | cut -c1-400
elif [ "$STAGE" = 4 ]; then
  timeout 560 python3 "$R/benchmarks/gpu/read_copy_defaults.py" --batches 256 --stream-tiles \
    --tiles 64x1x16,128x1x16,128x2x16,64x2x16,64x1x32,32x1x16 --specs gdn:nvfp4,kda:nvfp4,gdn:fp8,kda:fp8 \
    --out "$RES/read_copy_stream_tiles.json" > "$RES/read_copy_stream_tiles.txt" 2>&1
  echo "read_copy_stream_tiles rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
  cut -c1-1500 "$RES/read_copy_stream_tiles.txt"
elif [ "$STAGE" = 5 ]; then
  REPLAYSSM_KERNEL_TEST_DEVICE=cuda test_job 200 test_kernels_delta_copy_cuda tests/test_kernels_read_copy.py \
    -k "delta or gdn or kda or flush_reads_copy"; pack
  tail -n 3 "$RES"/test_*.txt; grep -h "^FAILED\|Error" "$RES"/test_*.txt | head -20
  timeout 330 python3 "$R/benchmarks/gpu/read_copy_defaults.py" --batches 256,64 \
    --out "$RES/read_copy_defaults_whole_head.json" > "$RES/read_copy_defaults_whole_head.txt" 2>&1
  echo "read_copy_defaults_whole_head rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
  cut -c1-1200 "$RES/read_copy_defaults_whole_head.txt"
elif [ "$STAGE" = 6 ]; then
  REPLAYSSM_KERNEL_TEST_DEVICE=cuda test_job 150 test_kernels_delta_stream_cuda tests/test_kernels_read_copy.py \
    -k "delta_stream_default or mamba2_copy_tiles"; pack
  tail -n 3 "$RES"/test_*.txt; grep -h "^FAILED\|Error" "$RES"/test_*.txt | head -20
  timeout 200 python3 "$R/benchmarks/gpu/read_copy_defaults.py" --batches 256 --specs gdn:fp8,gdn:nvfp4,kda:fp8 \
    --out "$RES/read_copy_flush_parts.json" > "$RES/read_copy_flush_parts.txt" 2>&1
  echo "read_copy_flush_parts rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
  cut -c1-900 "$RES/read_copy_flush_parts.txt"
elif [ "$STAGE" = 7 ]; then
  REPLAYSSM_KERNEL_TEST_DEVICE=cuda test_job 150 test_kernels_flush_scale_cuda tests/test_kernels_read_copy.py \
    -k "flush_reads_copy"; pack
  tail -n 3 "$RES"/test_*.txt; grep -h "^FAILED\|Error" "$RES"/test_*.txt | head -20
  timeout 200 python3 "$R/benchmarks/gpu/read_copy_defaults.py" --batches 256 --specs gdn:fp8,kda:fp8 \
    --out "$RES/read_copy_flush_scale.json" > "$RES/read_copy_flush_scale.txt" 2>&1
  echo "read_copy_flush_scale rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
  cut -c1-1100 "$RES/read_copy_flush_scale.txt"
fi
save_triton_cache
