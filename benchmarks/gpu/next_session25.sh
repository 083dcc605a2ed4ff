#!/usr/bin/env bash
# Planned GPU calls for the next session (not run yet). Every job packs what it wrote into $OUT right after it ends.
# STAGE=1 (about 3 minutes): the exact fold's one-warp host flush tiles (run 140's new default: [K, 16] x 1 for GDN,
#   [K, 32] x 1 for KDA) in their CUDA tests (`delta_exact_fold`, `delta_host_phase`, `delta_stream_default`), then the
#   host cycle at those defaults and the split device step's flush launch on [K, 16] x 1 / [K, 64] x 2 against its
#   [K, 32] x 1 (`read_copy_defaults.py --device-flush-tiles`; next_session24.sh STAGE=8 found no GPU time left).
# STAGE=2 (about 8 minutes, carry .whl too): eager separated precision, whose flush steps run the step kernel since
#   the twenty-fourth session (flush_reads_copy on host positions, then the Triton re-encode): the CUDA tests (kernel
#   case `flush_reads_copy`, tests/test_gpu.py's policies and Triton-backend tests), then eager `generate` of
#   Qwen3.5-like and Nemotron-H-like at batch 64 with the fp32, fp8 and nvfp4 arms.
# Calls: run(command="STAGE=1 bash benchmarks/gpu/next_session25.sh", carry=[".triton_cache"], timeout_s=400), then
#   STAGE=2 with carry=[".whl", ".triton_cache"].
# STAGE=3 (added in the twenty-fifth session after STAGE=1-2 ran as runs 141-142): the nvfp4 streamed read with its
#   scales folded into q and k and its nibbles accumulated apart, and the split flush tiles of run 141 (GDN nvfp4
#   [K, 16] x 1, KDA [K, 64] x 2): CUDA tests, then read_copy_defaults.py on gdn:nvfp4, kda:nvfp4, kda:fp8.
# STAGE=4: Mamba-2's replay launches taking an nvfp4 copy's product with C pair by pair (nvfp4_rows_dot): CUDA
#   tests, `bench kernels --family mamba2 --read-format nvfp4`, and the nvfp4 split flush default ([K, 16] x 1 since
#   run 143) timed as callers get it (read_copy_defaults.py on kda:nvfp4, gdn:nvfp4).
# STAGE=5: compiled Kimi-Linear-like generate at batch 256 with the fp32, fp8 and nvfp4 arms.
source benchmarks/gpu/install.sh || exit 1
RES=/tmp/w/res_next_session25_$STAGE; rm -rf "$RES"; mkdir -p "$RES"; cd /tmp/w
pack() { tar czf "$OUT/next_session25_$STAGE.tgz" -C "$RES" . ; }
if [ "$STAGE" = 1 ]; then
  REPLAYSSM_KERNEL_TEST_DEVICE=cuda test_job 200 test_read_copy_flush_cuda tests/test_kernels_read_copy.py \
    -k "delta_stream_default or delta_exact_fold or delta_host_phase"
  pack
  timeout 150 python3 "$R/benchmarks/gpu/read_copy_defaults.py" --batches 256,64 --specs gdn:fp8,kda:fp8,gdn:nvfp4 \
    --device-flush-tiles --out "$RES/read_copy_device_flush.json" > "$RES/read_copy_device_flush.txt" 2>&1
  echo "read_copy_device_flush rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
elif [ "$STAGE" = 2 ]; then
  REPLAYSSM_KERNEL_TEST_DEVICE=cuda test_job 150 test_read_copy_host_flush_cuda tests/test_kernels_read_copy.py \
    -k "flush_reads_copy"
  test_job 200 test_gpu_policies tests/test_gpu.py -k "policies or triton_backend"
  pack
  for model in qwen3_5 nemotron_h; do
    bench_job 150 generate_eager_separated_$model generate --models $model --batches 64 \
      --arms stock,replay,replay-fp8,replay-nvfp4 --prompt 128 --new 64 --repeats 2 \
      --out "$RES/generate_eager_separated_$model.json"; pack
  done
elif [ "$STAGE" = 3 ]; then
  REPLAYSSM_KERNEL_TEST_DEVICE=cuda test_job 300 test_read_copy_nvfp4_cuda tests/test_kernels_read_copy.py \
    -k "delta_stream_default or delta_chunked or nvfp4"
  test_job 150 test_gpu_separated tests/test_gpu.py -k "separated_flushes"
  pack
  timeout 200 python3 "$R/benchmarks/gpu/read_copy_defaults.py" --batches 256,64 --specs gdn:nvfp4,kda:nvfp4,kda:fp8 \
    --device-flush-tiles --out "$RES/read_copy_nvfp4_fold.json" > "$RES/read_copy_nvfp4_fold.txt" 2>&1
  echo "read_copy_nvfp4_fold rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
elif [ "$STAGE" = 4 ]; then
  REPLAYSSM_KERNEL_TEST_DEVICE=cuda test_job 300 test_read_copy_mamba2_cuda tests/test_kernels_read_copy.py \
    -k "mamba2 or nvfp4 or flush_reads_copy or delta_stream_default"
  test_job 150 test_gpu_separated tests/test_gpu.py -k "separated or policies"
  pack
  bench_job 150 kernels_mamba2_nvfp4_dot kernels --family mamba2 --shapes nemotron-h-8b --batches 256 --no-sweep \
    --read-format nvfp4 --out "$RES/kernels_mamba2_nvfp4_dot.json"; pack
  timeout 150 python3 "$R/benchmarks/gpu/read_copy_defaults.py" --batches 256,64 --specs kda:nvfp4,gdn:nvfp4 \
    --out "$RES/read_copy_nvfp4_defaults.json" > "$RES/read_copy_nvfp4_defaults.txt" 2>&1
  echo "read_copy_nvfp4_defaults rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
elif [ "$STAGE" = 5 ]; then  # compiled Kimi-Linear-like at 256 rows, every precision arm (one repeat: GPU time)
  bench_job 330 generate_compiled_kimi_linear generate --models kimi_linear --batches 256 \
    --arms stock-static-compiled,replay-compiled,replay-fp8-compiled,replay-nvfp4-compiled --prompt 512 --new 128 \
    --repeats 1 --out "$RES/generate_compiled_kimi_linear.json"; pack
fi
tail -n 12 "$RES"/*.txt
save_triton_cache
