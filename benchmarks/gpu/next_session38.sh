#!/usr/bin/env bash
# GPU calls prepared in the thirty-seventh session for the next one. Every job packs what it wrote into $OUT.
# Call: run(command="STAGE=N bash benchmarks/gpu/next_session38.sh", carry=[".whl/fla", ".triton_cache"],
#   timeout_s=600)  (tracked files are ~41 MiB of the 64 MiB a call carries: keep .triton_cache/cache.tgz small;
#   the caches the calls bring back are 22-51 MB, too large to carry)
# STAGE=1 (about 8 minutes): GDN's fp8 split-step flush on [K, 64] x 2 (default since run 201, kernel level only):
#   the 256-row separated-precision model tests (static cache and CUDA graphs run the split step), then compiled
#   `generate` Qwen3.5-like at batch 256, every precision arm, fla on the path, two repeats (run 199 before the tile:
#   1.44x / 1.43x / 1.42x).
# STAGE=2 (about 6 minutes): the same at batch 64, Qwen3.5-like and Kimi-Linear-like (the tile gained most there at
#   the kernel level with mixed phases: 106.1 -> 90.9 us, run 202).
# STAGE=3 (about 4 minutes): the exact fold reading the token again after the records' loop (_reload_token, off,
#   built offline in the thirty-seventh session: KDA's flush spills 336 -> 216 bytes, GDN's 168 -> 128 registers):
#   the kernel cases on CUDA, then the read-copy defaults of GDN / KDA fp8 and nvfp4 at 256 with its arms
#   (host_reload_token, device_*_reload_token). If it gains, make it the default and time it end to end.
# STAGE=4 (about 8 minutes; after run 204 made _reload_token's "auto" the default): the 256-row separated-precision
#   model tests again with a longer limit (run 205 stopped them at 220 s, 22 passed, compiling the new kernels), then
#   the read-copy defaults of GDN fp8 / nvfp4 at 256 once more (the host step's token held and reloaded side by side).
source benchmarks/gpu/install.sh || exit 1
session_results next_session38; cd /tmp/w
arms=stock-static-compiled,replay-compiled,replay-fp8-compiled,replay-nvfp4-compiled
if [ "$STAGE" = 1 ]; then
  test_job 220 test_gpu_separated_rows tests/test_gpu.py -k "separated_flushes_in_the_kernel or \
    static_cache_with_a_read_copy"; pack
  show_tests
  bench_job 280 generate_compiled_qwen3_5_separated_fla generate --models qwen3_5 --batches 256 --arms $arms \
    --prompt 512 --new 128 --repeats 2 --out "$RES/generate_compiled_qwen3_5_separated_fla.json"; pack
  for f in "$RES"/generate_*.txt; do grep -v "^ *$" "$f" | tail -6; done
elif [ "$STAGE" = 2 ]; then
  for model in qwen3_5 kimi_linear; do
    bench_job 250 generate_compiled_${model}_separated_b64 generate --models $model --batches 64 --arms $arms \
      --prompt 512 --new 128 --repeats 2 --out "$RES/generate_compiled_${model}_separated_b64.json"; pack
  done
  for f in "$RES"/generate_*.txt; do grep -v "^ *$" "$f" | tail -6; done
elif [ "$STAGE" = 3 ]; then
  REPLAYSSM_KERNEL_TEST_DEVICE=cuda test_job 150 test_kernels_reload_token_cuda tests/test_kernels_read_copy.py \
    -k "flush_reads_copy"; pack
  show_tests
  timeout 300 python3 "$R/benchmarks/gpu/read_copy_defaults.py" --batches 256 \
    --specs gdn:fp8,kda:fp8,gdn:nvfp4,kda:nvfp4 --out "$RES/read_copy_reload_token.json" \
    > "$RES/read_copy_reload_token.txt" 2>&1
  echo "read_copy_reload_token rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
  cut -c1-1800 "$RES/read_copy_reload_token.txt"
elif [ "$STAGE" = 4 ]; then
  test_job 360 test_gpu_separated_rows tests/test_gpu.py -v -k "separated_flushes_in_the_kernel or \
    static_cache_with_a_read_copy"; pack
  show_tests
  timeout 150 python3 "$R/benchmarks/gpu/read_copy_defaults.py" --batches 256 --specs gdn:nvfp4,gdn:fp8 \
    --out "$RES/read_copy_token_held.json" > "$RES/read_copy_token_held.txt" 2>&1
  echo "read_copy_token_held rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
  cut -c1-1500 "$RES/read_copy_token_held.txt"
fi
save_triton_cache
