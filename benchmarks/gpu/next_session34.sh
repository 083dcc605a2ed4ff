#!/usr/bin/env bash
# GPU calls prepared in the thirty-third session for the next one. Every job packs what it wrote into $OUT.
# Call: run(command="STAGE=N bash benchmarks/gpu/next_session34.sh", carry=[".whl/fla", ".triton_cache"],
#   timeout_s=600)
# STAGE=1 (about 6 minutes): most of what a read copy adds to a host flush is the flush launch giving its outputs
#   from the copy (run 175 / 176: Mamba-2 nvfp4 1200 us per flush, the re-encode 540 of it): (a) the CUDA test of
#   Mamba-2's flush launches taking the copy's product with C as stored (_flush_copy_product, as the replay launches
#   read it) instead of the decoded tile; (b) Mamba-2 nvfp4 and fp8 at 256 with its arms ("the flush launches taking
#   the copy's product": host as the cache runs it, device in phase), against the default's.
# If it pays: make it the default, then the same for the delta rule's flush (kernels/delta_rule.py, FLUSH_READS_COPY).
# STAGE=2 (about 7 minutes): the nvfp4 encode with fewer instructions (quotients by each block's reciprocal with two
#   Markstein corrections, codes by rounding the float's bits, a thread loading whole blocks; the default now, sm_90
#   SASS 2160 -> 1056 instructions): (a) CUDA tests of the re-encode and of every flush that re-encodes, bit for bit
#   against the codec; (b) the re-encode alone against the previous arithmetic; (c) Mamba-2 / GDN / KDA nvfp4 at 256.
# STAGE=3 (about 7 minutes): Mamba-2's host flush step with its outputs by a replay-only launch appending nothing,
#   then the plain fp32 flush (_flush_outputs_launch, off): its CUDA test, and Mamba-2 nvfp4 / fp8 at 256; the nvfp4
#   encode by reciprocals alone (run 178: a thread loading whole blocks was 1.9x slower; dropped): the re-encode
#   tests on CUDA, GDN / KDA nvfp4 as the cache runs them.
# STAGE=4 (about 5 minutes): _flush_outputs_launch on device positions too (the split step's replay launch runs the
#   flushing rows, its flush launch folds plainly; now the default): its CUDA test, the separated policies' model
#   tests on CUDA, Mamba-2 nvfp4 / fp8 at 256 with every arm.
# STAGE=5 (about 4 minutes): the plain host flush writing the fp8 copy from its registers (_encode_in_flush beside
#   the outputs by the replay launch): its CUDA tests, Mamba-2 fp8 at 256.
source benchmarks/gpu/install.sh || exit 1
session_results next_session34; cd /tmp/w
if [ "$STAGE" = 1 ]; then
  REPLAYSSM_KERNEL_TEST_DEVICE=cuda test_job 200 test_kernels_flush_product_cuda tests/test_kernels_read_copy.py \
    -k "flush_reads_copy or mamba2_reencode_copy"; pack
  bench_job 130 kernels_mamba2_nvfp4_flush_product kernels --family mamba2 --shapes nemotron-h-8b --batches 256 \
    --no-sweep --read-format nvfp4 --out "$RES/kernels_mamba2_nvfp4_flush_product.json"; pack
  bench_job 120 kernels_mamba2_fp8_flush_product kernels --family mamba2 --shapes nemotron-h-8b --batches 256 \
    --no-sweep --read-format fp8 --out "$RES/kernels_mamba2_fp8_flush_product.json"; pack
  tail -n 3 "$RES"/test_*.txt
  grep -h "host-phase replay\|as the cache\|product\|device\|^nemotron" "$RES"/kernels_*.txt
elif [ "$STAGE" = 2 ]; then
  REPLAYSSM_KERNEL_TEST_DEVICE=cuda test_job 240 test_kernels_encode_cuda tests/test_kernels_read_copy_encode.py \
    tests/test_kernels_read_copy.py -k "not fp8_rows and (reencode or nvfp4 or flush or given_amax or model_shapes \
    or bad_inputs or reciprocal_quotient or ties or compact_grid or strided or select_patterns)"; pack
  tail -n 3 "$RES"/test_*.txt; grep -h "^FAILED\|Error" "$RES"/test_*.txt | head -20
  timeout 100 python3 "$R/benchmarks/gpu/reencode_tile_probe.py" --out "$RES/reencode_tile_probe.json" 2>&1 \
    | tee "$RES/reencode_tile_probe.txt"
  echo "reencode_tile_probe rc=${PIPESTATUS[0]} $(date +%T)" | tee -a "$RES/done.txt"; pack
  bench_job 120 kernels_mamba2_nvfp4_fast_encode kernels --family mamba2 --shapes nemotron-h-8b --batches 256 \
    --no-sweep --read-format nvfp4 --out "$RES/kernels_mamba2_nvfp4_fast_encode.json"; pack
  grep -h "host-phase replay\|as the cache\|product\|device\|^nemotron" "$RES"/kernels_*.txt
  timeout 100 python3 "$R/benchmarks/gpu/read_copy_defaults.py" --batches 256 --specs gdn:nvfp4,kda:nvfp4 \
    --out "$RES/read_copy_fast_encode.json" > "$RES/read_copy_fast_encode.txt" 2>&1
  echo "read_copy_fast_encode rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack; tail -n 8 "$RES"/read_copy_*.txt
elif [ "$STAGE" = 3 ]; then
  REPLAYSSM_KERNEL_TEST_DEVICE=cuda test_job 280 test_kernels_flush_outputs_cuda tests/test_kernels_read_copy.py \
    tests/test_kernels_read_copy_encode.py -k "flush_reads_copy or reencode or not read_copy_kernel"; pack
  tail -n 3 "$RES"/test_*.txt; grep -h "^FAILED\|Error" "$RES"/test_*.txt | head -20
  for fmt in nvfp4 fp8; do
    bench_job 130 kernels_mamba2_${fmt}_flush_outputs kernels --family mamba2 --shapes nemotron-h-8b --batches 256 \
      --no-sweep --read-format $fmt --out "$RES/kernels_mamba2_${fmt}_flush_outputs.json"; pack
  done
  grep -h "host-phase replay\|as the cache\|decoding the whole\|outputs by\|device\|^nemotron" "$RES"/kernels_*.txt
  timeout 100 python3 "$R/benchmarks/gpu/read_copy_defaults.py" --batches 256 --specs gdn:nvfp4,kda:nvfp4 \
    --out "$RES/read_copy_reciprocal.json" > "$RES/read_copy_reciprocal.txt" 2>&1
  echo "read_copy_reciprocal rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack; tail -n 8 "$RES"/read_copy_*.txt
elif [ "$STAGE" = 4 ]; then
  REPLAYSSM_KERNEL_TEST_DEVICE=cuda test_job 200 test_kernels_flush_outputs_device_cuda tests/test_kernels_read_copy.py \
    -k "flush_reads_copy or mamba2_reencode_copy"; pack
  test_job 150 test_gpu_separated tests/test_gpu.py -k "separated_flushes_in_the_kernel or static_cache_with_a_read_copy \
    or exact_separated"; pack
  tail -n 3 "$RES"/test_*.txt; grep -h "^FAILED\|Error" "$RES"/test_*.txt | head -20
  for fmt in nvfp4 fp8; do
    bench_job 130 kernels_mamba2_${fmt}_outputs_launch kernels --family mamba2 --shapes nemotron-h-8b --batches 256 \
      --no-sweep --read-format $fmt --out "$RES/kernels_mamba2_${fmt}_outputs_launch.json"; pack
  done
  grep -h "host-phase replay\|as the cache\|decoding the whole\|outputs by\|device\|^nemotron" "$RES"/kernels_*.txt
elif [ "$STAGE" = 5 ]; then
  REPLAYSSM_KERNEL_TEST_DEVICE=cuda test_job 150 test_kernels_encode_in_plain_flush_cuda tests/test_kernels_read_copy.py \
    -k "mamba2_reencode_copy or bad_read_copy"; pack
  tail -n 3 "$RES"/test_*.txt; grep -h "^FAILED\|Error" "$RES"/test_*.txt | head -20
  bench_job 100 kernels_mamba2_fp8_encode_in_flush kernels --family mamba2 --shapes nemotron-h-8b --batches 256 \
    --no-sweep --read-format fp8 --out "$RES/kernels_mamba2_fp8_encode_in_flush.json"; pack
  grep -h "host-phase replay\|as the cache\|registers\|one flush launch\|^nemotron" "$RES"/kernels_*.txt
fi
save_triton_cache
