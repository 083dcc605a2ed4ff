#!/usr/bin/env bash
# GPU calls prepared in the thirty-second session for the next one. Every job packs what it wrote into $OUT.
# Call: run(command="STAGE=N bash benchmarks/gpu/next_session33.sh", carry=[".whl/fla", ".triton_cache"],
#   timeout_s=600)
# STAGE=1 (about 6 minutes): (a) the re-encode grid probe, now with the nvfp4 encode's contiguous-load option
#   (_nvfp4_contiguous_load: 8-15 % faster cycles in run 166, its CUDA tests failed in run 167 while the block scales
#   took the hardware E4M3 conversion, since replaced by the integer rounding); (b) the CUDA tests of the re-encode
#   (model_shapes: 128-wide rows, both grids, the option too), the read-copy kernels and the GPU tests of separated
#   precision (CUDA-graph static caches with a copy, the Triton backend's flushes).
# Run 171: 0 differing bytes on every *_contig arm, 14 + 21 CUDA tests passed: the contiguous load became the default.
# STAGE=2 (about 8 minutes): (a) CUDA tests of the Mamba-2 flush handing the nvfp4 re-encode its amax (_flush_amax:
#   every flush launch folds its rows' max |new checkpoint| into a [B] scratch, the re-encode skips its amax pass)
#   and of reencode_read_copy(amax=); (b) Mamba-2 nvfp4 kernels at 256 (as the cache runs it: the step's re-encode
#   with the flush's amax; "external": the two-pass re-encode launched after the flush), GDN / KDA nvfp4 as the cache
#   runs them (read_copy_defaults.py; the contiguous-load encode now the default). Run 172: 5 passed; Mamba-2 nvfp4
#   host as the cache 367.95 us (external two-pass re-encode 376.97), GDN nvfp4 194.8, KDA nvfp4 238.0.
# STAGE=3: the same for the delta rule (below). Run 173: 4 + 21 CUDA tests passed; GDN nvfp4 host as the cache
#   188.6 us (external 195.0), KDA nvfp4 227.7 (238.1).
source benchmarks/gpu/install.sh || exit 1
session_results next_session33; cd /tmp/w
if [ "$STAGE" = 1 ]; then
  timeout 90 python3 "$R/benchmarks/gpu/reencode_grid_probe.py" > "$RES/reencode_grid_probe.txt" 2>&1; pack
  grep -c "{'packed': 0, 'block_scale': 0" "$RES/reencode_grid_probe.txt"; grep "_contig\|_hw" "$RES/reencode_grid_probe.txt"
  REPLAYSSM_KERNEL_TEST_DEVICE=cuda test_job 300 test_kernels_reencode_cuda tests/test_kernels_read_copy_encode.py \
    tests/test_kernels_read_copy.py -k "reencode or nvfp4 or flush_reads_copy"; pack
  test_job 200 test_gpu_separated tests/test_gpu.py -k "separated or read_copy"; pack
  tail -n 3 "$RES"/test_*.txt
elif [ "$STAGE" = 3 ]; then  # (about 8 minutes) GDN / KDA steps re-encode the copy themselves (reencode_copy), nvfp4
  # with the flush launches' amax: CUDA tests (the kernels, the ops, the cache's separated GPU tests), then GDN / KDA
  # fp8 and nvfp4 as the cache runs them at 256 (host "as the cache": the step's re-encode; "external": the two-pass
  # re-encode launched after the flush; device arms: the step's re-encode)
  REPLAYSSM_KERNEL_TEST_DEVICE=cuda test_job 240 test_kernels_delta_reencode_cuda tests/test_kernels_read_copy.py \
    tests/test_kernel_ops.py -k "delta_reencode_copy or mamba2_reencode_copy or flush_reads_copy or triton_impls"; pack
  test_job 200 test_gpu_separated tests/test_gpu.py -k "separated or read_copy"; pack
  timeout 280 python3 "$R/benchmarks/gpu/read_copy_defaults.py" --batches 256 --specs gdn:nvfp4,kda:nvfp4,gdn:fp8,kda:fp8 \
    --out "$RES/read_copy_flush_amax.json" > "$RES/read_copy_flush_amax.txt" 2>&1
  echo "read_copy_flush_amax rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
  tail -n 3 "$RES"/test_*.txt; cat "$RES"/read_copy_*.txt | tail -n 6
elif [ "$STAGE" = 4 ]; then  # (about 5 minutes) every read-copy kernel and re-encode test on CUDA, with the
  # contiguous-load nvfp4 encode and the flushes' amax now the defaults
  REPLAYSSM_KERNEL_TEST_DEVICE=cuda test_job 420 test_kernels_read_copy_all_cuda tests/test_kernels_read_copy.py \
    tests/test_kernels_read_copy_encode.py; pack
  tail -n 3 "$RES"/test_*.txt
elif [ "$STAGE" = 5 ]; then  # (about 3 minutes) the re-encode alone over its launch options
  # (benchmarks/gpu/reencode_tile_probe.py: programs per row, rows per tile, warps, pipelined tile loops). Run 175.
  timeout 170 python3 "$R/benchmarks/gpu/reencode_tile_probe.py" --out "$RES/reencode_tile_probe.json" 2>&1 \
    | tee "$RES/reencode_tile_probe.txt"  # (on stdout too: a call that runs out of time still shows the arms)
  echo "reencode_tile_probe rc=${PIPESTATUS[0]} $(date +%T)" | tee -a "$RES/done.txt"; pack
elif [ "$STAGE" = 6 ]; then  # (about 4 minutes) host flushes re-encode every row on the per-tile grid (run 175):
  # Mamba-2 nvfp4 at 256, GDN / KDA nvfp4 and fp8 as the cache runs them
  bench_job 120 kernels_mamba2_nvfp4_every_row kernels --family mamba2 --shapes nemotron-h-8b --batches 256 \
    --no-sweep --read-format nvfp4 --out "$RES/kernels_mamba2_nvfp4_every_row.json"; pack
  grep -h "host-phase replay\|as the cache\|device\|^nemotron" "$RES"/kernels_*.txt
  timeout 100 python3 "$R/benchmarks/gpu/read_copy_defaults.py" --batches 256 --specs gdn:nvfp4,kda:nvfp4,gdn:fp8,kda:fp8 \
    --out "$RES/read_copy_every_row.json" 2>&1 | tee "$RES/read_copy_every_row.txt"
  echo "read_copy_every_row rc=${PIPESTATUS[0]} $(date +%T)" | tee -a "$RES/done.txt"; pack
elif [ "$STAGE" = 2 ]; then
  REPLAYSSM_KERNEL_TEST_DEVICE=cuda test_job 240 test_kernels_flush_amax_cuda tests/test_kernels_read_copy_encode.py \
    tests/test_kernels_read_copy.py -k "given_amax or model_shapes or bad_inputs or mamba2_reencode_copy \
    or flush_reads_copy"; pack
  bench_job 170 kernels_mamba2_nvfp4_flush_amax kernels --family mamba2 --shapes nemotron-h-8b --batches 256 \
    --no-sweep --read-format nvfp4 --out "$RES/kernels_mamba2_nvfp4_flush_amax.json"; pack
  timeout 150 python3 "$R/benchmarks/gpu/read_copy_defaults.py" --batches 256 --specs gdn:nvfp4,kda:nvfp4 \
    --out "$RES/read_copy_contig.json" > "$RES/read_copy_contig.txt" 2>&1
  echo "read_copy_contig rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
  tail -n 3 "$RES"/test_*.txt
  grep -h "host-phase replay\|as the cache\|device\|^nemotron" "$RES"/kernels_*.txt; cat "$RES"/read_copy_*.txt | tail -n 6
fi
save_triton_cache
