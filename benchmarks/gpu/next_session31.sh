#!/usr/bin/env bash
# GPU calls of the thirty-first session (runs 161-163). Every job packs what it wrote into $OUT right after it ends.
# STAGE=1 (about 5 minutes, carry .whl/fla and .triton_cache): Mamba-2's fp32 replay launches compile again to the
#   code of runs 116-124 (the same PTX for sm_90 as at 3f3e064, checked on the CPU with hf_replayssm.kernels.registers:
#   30711f8 had reduced the tile's product with C before the records' loads, 167 -> 110 registers, and the host cycle
#   measured 369 us in runs 144 / 148 against 345-349). Re-time the Mamba-2 kernels at batch 256 and 64, the fp8 read
#   copy beside (unchanged code, so it should stay at run 148's 244.7 us host cycle), and the CUDA kernel tests.
# Call: run(command="STAGE=1 bash benchmarks/gpu/next_session31.sh", carry=[".whl/fla", ".triton_cache"],
#   timeout_s=600)
# Also in STAGE=1 (thirty-first session): the nvfp4 copy decoded a byte at a time through float16
#   (read_copy.e2m1_pair_to_float: 6-13 % fewer SASS instructions in every nvfp4 replay launch, compiled offline for
#   sm_90). Mamba-2's nvfp4 host cycle at 256 (run 144: 389.9 us, 1.41x), GDN / KDA host default at 256 and 64 (run
#   144: 229.3 / 268.1 us at 256) against the fp32 standard step timed in the same process.
# STAGE=2 (about 4 minutes, right after, on the warm machine): the CUDA kernel tests of the read copies and Mamba-2.
# STAGE=3 (about 6 minutes): the nvfp4 readers load the copy's bytes 8 at a time (a mask the compiler sees constant
#   over 8 bytes: 64-bit loads instead of byte loads) and one block scale per 8 bytes (Mamba-2's S0 C and the delta
#   rule's streamed products by scale block); the same benches as STAGE=1 and every read-copy kernel test on CUDA.
source benchmarks/gpu/install.sh || exit 1
session_results next_session31; cd /tmp/w
if [ "$STAGE" = 1 ]; then
  bench_job 200 kernels_mamba2_fp8_restored kernels --family mamba2 --shapes nemotron-h-8b,nemotron-3-nano \
    --batches 256,64 --no-sweep --read-format fp8 --out "$RES/kernels_mamba2_fp8_restored.json"; pack
  bench_job 150 kernels_mamba2_nvfp4_pairs kernels --family mamba2 --shapes nemotron-h-8b --batches 256 --no-sweep \
    --read-format nvfp4 --out "$RES/kernels_mamba2_nvfp4_pairs.json"; pack
  timeout 150 python3 "$R/benchmarks/gpu/read_copy_defaults.py" --batches 256,64 --specs gdn:nvfp4,kda:nvfp4 \
    --out "$RES/read_copy_nvfp4_pairs.json" > "$RES/read_copy_nvfp4_pairs.txt" 2>&1
  echo "read_copy_nvfp4_pairs rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
  grep -h "host-phase replay\|^nemotron" "$RES"/kernels_*.txt; cat "$RES"/read_copy_*.txt | tail -n 6
elif [ "$STAGE" = 2 ]; then
  REPLAYSSM_KERNEL_TEST_DEVICE=cuda test_job 280 test_kernels_read_copy_cuda tests/test_kernels_mamba2.py \
    tests/test_kernels_read_copy.py -k "mamba2 or nvfp4 or flush_reads_copy or delta_stream_default"; pack
  tail -n 3 "$RES"/test_*.txt
elif [ "$STAGE" = 3 ]; then  # run 163: nvfp4 bytes loaded 8 at a time, one block scale per 8 bytes
  bench_job 150 kernels_mamba2_nvfp4_blocks kernels --family mamba2 --shapes nemotron-h-8b --batches 256,64 \
    --no-sweep --read-format nvfp4 --out "$RES/kernels_mamba2_nvfp4_blocks.json"; pack
  timeout 150 python3 "$R/benchmarks/gpu/read_copy_defaults.py" --batches 256,64 --specs gdn:nvfp4,kda:nvfp4 \
    --out "$RES/read_copy_nvfp4_blocks.json" > "$RES/read_copy_nvfp4_blocks.txt" 2>&1
  echo "read_copy_nvfp4_blocks rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
  REPLAYSSM_KERNEL_TEST_DEVICE=cuda test_job 250 test_kernels_read_copy_cuda tests/test_kernels_read_copy.py; pack
  grep -h "host-phase replay\|^nemotron" "$RES"/kernels_*.txt; cat "$RES"/read_copy_*.txt | tail -n 6
  tail -n 3 "$RES"/test_*.txt
fi
save_triton_cache
