#!/usr/bin/env bash
# GPU calls prepared in the thirty-second session for the next one. Every job packs what it wrote into $OUT.
# Call: run(command="STAGE=N bash benchmarks/gpu/next_session33.sh", carry=[".whl/fla", ".triton_cache"],
#   timeout_s=600)
# STAGE=1 (about 6 minutes): (a) the re-encode grid probe, now with the nvfp4 encode's contiguous-load option
#   (_nvfp4_contiguous_load: 8-15 % faster cycles in run 166, its CUDA tests failed in run 167 while the block scales
#   took the hardware E4M3 conversion, since replaced by the integer rounding); (b) the CUDA tests of the re-encode
#   (model_shapes: 128-wide rows, both grids, the option too), the read-copy kernels and the GPU tests of separated
#   precision (CUDA-graph static caches with a copy, the Triton backend's flushes).
# If the probe's *_contig arms show 0 differing bytes and the tests pass: make _nvfp4_contiguous_load the default and
# re-time (STAGE=3 of next_session32.sh: Mamba-2 fp8 / nvfp4, GDN / KDA nvfp4 as the cache runs them).
source benchmarks/gpu/install.sh || exit 1
session_results next_session33; cd /tmp/w
if [ "$STAGE" = 1 ]; then
  timeout 90 python3 "$R/benchmarks/gpu/reencode_grid_probe.py" > "$RES/reencode_grid_probe.txt" 2>&1; pack
  grep -c "{'packed': 0, 'block_scale': 0" "$RES/reencode_grid_probe.txt"; grep "_contig\|_hw" "$RES/reencode_grid_probe.txt"
  REPLAYSSM_KERNEL_TEST_DEVICE=cuda test_job 300 test_kernels_reencode_cuda tests/test_kernels_read_copy_encode.py \
    tests/test_kernels_read_copy.py -k "reencode or nvfp4 or flush_reads_copy"; pack
  test_job 200 test_gpu_separated tests/test_gpu.py -k "separated or read_copy"; pack
  tail -n 3 "$RES"/test_*.txt
fi
save_triton_cache
