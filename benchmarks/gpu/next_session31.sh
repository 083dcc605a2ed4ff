#!/usr/bin/env bash
# Planned GPU calls for the next session (not run yet). Every job packs what it wrote into $OUT right after it ends.
# STAGE=1 (about 5 minutes, carry .whl/fla and .triton_cache): Mamba-2's fp32 replay launches compile again to the
#   code of runs 116-124 (the same PTX for sm_90 as at 3f3e064, checked on the CPU with hf_replayssm.kernels.registers:
#   30711f8 had reduced the tile's product with C before the records' loads, 167 -> 110 registers, and the host cycle
#   measured 369 us in runs 144 / 148 against 345-349). Re-time the Mamba-2 kernels at batch 256 and 64, the fp8 read
#   copy beside (unchanged code, so it should stay at run 148's 244.7 us host cycle), and the CUDA kernel tests.
# Call: run(command="STAGE=1 bash benchmarks/gpu/next_session31.sh", carry=[".whl/fla", ".triton_cache"],
#   timeout_s=600)
source benchmarks/gpu/install.sh || exit 1
session_results next_session31; cd /tmp/w
if [ "$STAGE" = 1 ]; then
  bench_job 200 kernels_mamba2_fp8_restored kernels --family mamba2 --shapes nemotron-h-8b,nemotron-3-nano \
    --batches 256,64 --no-sweep --read-format fp8 --out "$RES/kernels_mamba2_fp8_restored.json"; pack
  REPLAYSSM_KERNEL_TEST_DEVICE=cuda test_job 200 test_kernels_mamba2_cuda tests/test_kernels_mamba2.py \
    tests/test_kernels_read_copy.py -k "mamba2 or flush_reads_copy or nvfp4_pairs"; pack
  grep -h "host-phase replay\|^nemotron" "$RES"/kernels_*.txt; tail -n 3 "$RES"/test_*.txt
fi
save_triton_cache
