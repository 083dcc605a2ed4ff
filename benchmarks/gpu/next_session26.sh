#!/usr/bin/env bash
# The twenty-sixth session's GPU calls (runs 146-150, all run). Every job packs what it wrote into $OUT right after it ends.
# STAGE=1 (about 8 minutes, carry .whl too): compiled `generate` at batch 256 with every precision arm since the
#   nvfp4 copies are read as stored (twenty-fifth session): Qwen3.5-like (prompt 512) and Nemotron-H-like (prompt 128,
#   as in the end-to-end table of BENCHMARKS.md); the README's end-to-end separated numbers (Qwen3.5-like nvfp4
#   1.04x, Nemotron-H-like 1.30x) predate them.
# STAGE=2 (about 5 minutes, carry .whl too): where a compiled batch-1 Qwen3.5-like step goes (issue 8: 0.93x stock),
#   replay against stock, two passes of the replay arm (profile_compiled.py).
# STAGE=3 (about 4 minutes): Mamba-2's replay launches read an fp8 copy as stored (the row scale applied to S0 C's
#   sums, not to each element): the read-copy kernel cases on CUDA, then the Nemotron-H-8B / Nemotron 3 Nano fp8
#   cycle at batch 256 and 64 (run 144 measured nvfp4 the same way).
# STAGE=4 (about 7 minutes, carry .whl too): the model-level separated / policy CUDA tests after STAGE 3's change, then
#   compiled batch-1 generate, Qwen3.5-like and Nemotron-H-like, five interleaved repeats per arm (issue 8's "never
#   slower at batch 1": earlier runs gave 0.93x-1.03x with one to three repeats).
# STAGE=5 (about 6 minutes, carry .whl too): where Nemotron-H-like's compiled batch-1 step goes (STAGE 4: replay 0.95x,
#   slower in all five repeats), the Mamba-2 / GDN kernels at batch 1, then STAGE 4's batch-1 measurement for
#   Kimi-Linear-like.
# Calls: run(command="STAGE=1 bash benchmarks/gpu/next_session26.sh", carry=[".whl", ".triton_cache"],
#   timeout_s=600), then STAGE=2 likewise.
source benchmarks/gpu/install.sh || exit 1
RES=/tmp/w/res_next_session26_$STAGE; rm -rf "$RES"; mkdir -p "$RES"; cd /tmp/w
pack() { tar czf "$OUT/next_session26_$STAGE.tgz" -C "$RES" . ; }
if [ "$STAGE" = 1 ]; then
  for model in qwen3_5 nemotron_h; do
    prompt=$([ $model = nemotron_h ] && echo 128 || echo 512)
    bench_job 280 generate_compiled_${model}_separated generate --models $model --batches 256 \
      --arms stock-static-compiled,replay-compiled,replay-fp8-compiled,replay-nvfp4-compiled --prompt $prompt \
      --new 128 --repeats 1 --out "$RES/generate_compiled_${model}_separated.json"; pack
  done
elif [ "$STAGE" = 2 ]; then
  timeout 300 python3 "$R/benchmarks/gpu/profile_compiled.py" --model qwen3_5 --batch 1 --prompt 512 --new 80 \
    --arms replay-compiled,stock-static-compiled,replay-compiled --out "$RES/profile_compiled" \
    > "$RES/profile_compiled.txt" 2>&1
  echo "profile_compiled rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
elif [ "$STAGE" = 3 ]; then
  REPLAYSSM_KERNEL_TEST_DEVICE=cuda test_job 200 test_read_copy_mamba2_fp8_cuda tests/test_kernels_read_copy.py \
    -k "mamba2 or flush_reads_copy or nvfp4_pairs"; pack
  bench_job 200 kernels_mamba2_fp8_fold kernels --family mamba2 --shapes nemotron-h-8b,nemotron-3-nano \
    --batches 256,64 --no-sweep --read-format fp8 --out "$RES/kernels_mamba2_fp8_fold.json"; pack
elif [ "$STAGE" = 4 ]; then
  test_job 170 test_gpu_separated tests/test_gpu.py -k "separated or policies"; pack
  for model in qwen3_5 nemotron_h; do
    prompt=$([ $model = nemotron_h ] && echo 128 || echo 512)
    bench_job 170 generate_compiled_${model}_b1 generate --models $model --batches 1 \
      --arms stock-static-compiled,replay-compiled --prompt $prompt --new 128 --repeats 5 \
      --out "$RES/generate_compiled_${model}_b1.json"; pack
  done
elif [ "$STAGE" = 5 ]; then
  timeout 150 python3 "$R/benchmarks/gpu/profile_compiled.py" --model nemotron_h --batch 1 --prompt 128 --new 80 \
    --arms replay-compiled,stock-static-compiled --out "$RES/profile_compiled_nemotron_h" \
    > "$RES/profile_compiled_nemotron_h.txt" 2>&1
  echo "profile_compiled_nemotron_h rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
  bench_job 75 kernels_mamba2_b1 kernels --family mamba2 --shapes nemotron-h-8b --batches 1,8 --no-sweep \
    --out "$RES/kernels_mamba2_b1.json"; pack
  bench_job 75 kernels_gdn_b1 kernels --family gdn --shapes qwen3-next --batches 1,8 --no-sweep \
    --out "$RES/kernels_gdn_b1.json"; pack
  bench_job 170 generate_compiled_kimi_linear_b1 generate --models kimi_linear --batches 1 \
    --arms stock-static-compiled,replay-compiled --prompt 512 --new 128 --repeats 5 \
    --out "$RES/generate_compiled_kimi_linear_b1.json"; pack
fi
tail -n 12 "$RES"/*.txt
save_triton_cache
