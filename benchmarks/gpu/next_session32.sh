#!/usr/bin/env bash
# GPU calls of the thirty-second session (runs 164-). Every job packs what it wrote into $OUT right after it ends.
# Call: run(command="STAGE=N bash benchmarks/gpu/next_session32.sh", carry=[".whl/fla", ".triton_cache"],
#   timeout_s=600)
# STAGE=1 (about 7 minutes): (a) the whole-tile nvfp4 reader (read_copy.load_read_tile: device-position replay
#   launches, the split step's flush launch) loads by scale block, one scale per 8 bytes (Mamba-2 device-phase launch
#   3000 -> 2872 SASS instructions, GDN / KDA whole-tile launches 17-27 % fewer, compiled offline for sm_90);
#   (b) the host cycles reading a copy timed as well as the cache runs them: the flush's outputs from the copy and
#   the copy re-encoded after it on every row (CheckpointStore.refresh_read_copy; the cycles timed so far had a plain
#   flush and left the re-encode out), the re-encode on its compact and its per-tile grid.
#   Mamba-2 nvfp4 and fp8 at 256; GDN / KDA fp8 and nvfp4 at 256 (read_copy_defaults.py).
# STAGE=2 (about 5 minutes, warm): every read-copy kernel test on CUDA and the re-encode's.
# STAGE=3 (about 8 minutes): (a) Mamba-2's host flush writes the fp8 copy of its new checkpoint from its registers
#   (reencode_copy, what the cache now runs: no separate re-encode reading the whole checkpoint again); (b) the nvfp4
#   re-encode loads its tile contiguously (8 vector loads instead of 32 scalar ones per thread). The same benches as
#   STAGE=1 (Mamba-2 fp8 / nvfp4, GDN / KDA nvfp4 at 256), then (STAGE=4, warm) the CUDA tests of both. Run 166: the
#   in-flush fp8 encode measured slower (host 304.1 us against 299.0-299.9), so it became an option (_encode_in_flush,
#   off); the nvfp4 loads gained 8-15 %. STAGE=4 then ran on the code with the option off: run 167, 4 nvfp4 tests
#   failed (the split load reverted), run 168, mamba2_reencode_copy's nvfp4 case failed (the block-scale conversion,
#   STAGE=5 / 6).
source benchmarks/gpu/install.sh || exit 1
session_results next_session32; cd /tmp/w
if [ "$STAGE" = 1 ]; then
  bench_job 170 kernels_mamba2_nvfp4_reencode kernels --family mamba2 --shapes nemotron-h-8b --batches 256 \
    --no-sweep --read-format nvfp4 --out "$RES/kernels_mamba2_nvfp4_reencode.json"; pack
  bench_job 130 kernels_mamba2_fp8_reencode kernels --family mamba2 --shapes nemotron-h-8b --batches 256 \
    --no-sweep --read-format fp8 --out "$RES/kernels_mamba2_fp8_reencode.json"; pack
  timeout 240 python3 "$R/benchmarks/gpu/read_copy_defaults.py" --batches 256 \
    --specs gdn:nvfp4,kda:nvfp4,gdn:fp8,kda:fp8 \
    --out "$RES/read_copy_reencode.json" > "$RES/read_copy_reencode.txt" 2>&1
  echo "read_copy_reencode rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
  grep -h "host-phase replay\|re-encoded\|device\|^nemotron" "$RES"/kernels_*.txt; cat "$RES"/read_copy_*.txt | tail -n 6
elif [ "$STAGE" = 2 ]; then
  REPLAYSSM_KERNEL_TEST_DEVICE=cuda test_job 400 test_kernels_read_copy_cuda tests/test_kernels_read_copy.py \
    tests/test_kernels_read_copy_encode.py; pack
  tail -n 3 "$RES"/test_*.txt
elif [ "$STAGE" = 3 ]; then
  bench_job 130 kernels_mamba2_fp8_step_encode kernels --family mamba2 --shapes nemotron-h-8b --batches 256 \
    --no-sweep --read-format fp8 --out "$RES/kernels_mamba2_fp8_step_encode.json"; pack
  bench_job 170 kernels_mamba2_nvfp4_encode_loads kernels --family mamba2 --shapes nemotron-h-8b --batches 256 \
    --no-sweep --read-format nvfp4 --out "$RES/kernels_mamba2_nvfp4_encode_loads.json"; pack
  timeout 150 python3 "$R/benchmarks/gpu/read_copy_defaults.py" --batches 256 --specs gdn:nvfp4,kda:nvfp4 \
    --out "$RES/read_copy_encode_loads.json" > "$RES/read_copy_encode_loads.txt" 2>&1
  echo "read_copy_encode_loads rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
  grep -h "host-phase replay\|as the cache\|device\|^nemotron" "$RES"/kernels_*.txt; cat "$RES"/read_copy_*.txt | tail -n 6
elif [ "$STAGE" = 4 ]; then
  REPLAYSSM_KERNEL_TEST_DEVICE=cuda test_job 420 test_kernels_reencode_cuda tests/test_kernels_read_copy.py \
    tests/test_kernels_read_copy_encode.py tests/test_kernel_ops.py -k "reencode or nvfp4 or flush_reads_copy or mamba2 \
    or rows or ties or strided or select or triton_impls"; pack
  tail -n 3 "$RES"/test_*.txt
elif [ "$STAGE" = 5 ] || [ "$STAGE" = 6 ]; then  # runs 169 / 170: the re-encode grids against the codec (170: the
  # nvfp4 block scales by the exact integer rounding, the hardware conversion as arms), then the CUDA tests again
  timeout 60 python3 "$R/benchmarks/gpu/reencode_grid_probe.py" > "$RES/reencode_grid_probe.txt" 2>&1; pack
  cat "$RES/reencode_grid_probe.txt"
  REPLAYSSM_KERNEL_TEST_DEVICE=cuda test_job 300 test_kernels_reencode_cuda tests/test_kernels_read_copy.py \
    tests/test_kernel_ops.py tests/test_kernels_read_copy_encode.py -k "reencode or triton_impls"; pack
  tail -n 3 "$RES"/test_*.txt
fi
save_triton_cache
