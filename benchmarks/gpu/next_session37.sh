#!/usr/bin/env bash
# GPU calls prepared in the thirty-sixth session for the next one. Every job packs what it wrote into $OUT.
# Call: run(command="STAGE=N bash benchmarks/gpu/next_session37.sh", carry=[".whl/fla", ".triton_cache"],
#   timeout_s=600)  (tracked files are ~41 MiB of the 64 MiB a call carries: keep .triton_cache/cache.tgz small)
# STAGE=1 (about 6 minutes): the delta host flush's fp8 codes 4 to a vector (_flush_code_vector, default since the
#   thirty-sixth session, chosen offline): the flush_reads_copy kernel case on CUDA, Nsight Compute on the host
#   flush (plain, outputs from the copy, and the codes at the widest vector as before), then the read-copy defaults
#   of GDN / KDA fp8 at 256 with their codes16 / split-flush code-vector arms (run 188: GDN fp8 host 200.0 us, 1.38x;
#   KDA 245.8, 1.13x).
# STAGE=2 (about 8 minutes): compiled `generate` at batch 256, Kimi-Linear-like (prompt 512), every precision arm,
#   two repeats, without fla on the path (run 194 vs 193: the Qwen3.5-like ratios moved 1.37x -> 1.46x between two
#   processes, one with fla, and the profile of run 195 did not reproduce it), then Qwen3.5-like with fla, two repeats.
# STAGE=3 (about 8 minutes; added in the thirty-seventh session after run 196 timed the code vector and the split
#   step's flush gained too: _split_flush_code_vector default 4): the flush_reads_copy kernel cases on CUDA with that
#   default, the 256-row separated-precision model tests, then compiled `generate` Kimi-Linear-like at 256 with fla
#   (run 197 without fla: transformers' torch chunk prefill asked for 128 GiB at 256 x 512, every arm), two repeats.
# STAGE=4 (about 4 minutes): Qwen3.5-like compiled `generate` at 256 with fla, two repeats, with that default (run
#   197 measured the former one).
# STAGE=5 (about 3 minutes): the streamed replay launches loading an fp8 copy's codes 4 to a vector
#   (_replay_code_vector, off; offline KDA shuffles 143 -> 15): the kernel cases on CUDA, then the read-copy defaults
#   of GDN / KDA fp8 at 256 with its arms.
# STAGE=6 (about 4 minutes): the split step's flush tiles again (fp8, batch 256) now that its flush loads the codes 4
#   to a vector (defaults: GDN [K, 32] x 1, KDA [K, 64] x 2; runs 141 / 143 chose them before).
source benchmarks/gpu/install.sh || exit 1
session_results next_session37; cd /tmp/w
if [ "$STAGE" = 1 ]; then
  REPLAYSSM_KERNEL_TEST_DEVICE=cuda test_job 150 test_kernels_flush_code_vector_cuda tests/test_kernels_read_copy.py \
    -k "flush_reads_copy or delta_stream_default"; pack
  tail -n 3 "$RES"/test_*.txt; grep -h "^FAILED\|Error" "$RES"/test_*.txt | head -20
  ncu_job 200 ncu_delta_flush_code_vector --families gdn,kda --flush-copies fp8
  grep -h "flush15\|rc=" "$RES"/*_run.txt "$RES/done.txt" | head -20
  timeout 200 python3 "$R/benchmarks/gpu/read_copy_defaults.py" --batches 256 --specs gdn:fp8,kda:fp8 \
    --out "$RES/read_copy_code_vector.json" > "$RES/read_copy_code_vector.txt" 2>&1
  echo "read_copy_code_vector rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
  cut -c1-1400 "$RES/read_copy_code_vector.txt"
elif [ "$STAGE" = 2 ]; then
  PYTHONPATH=/tmp/site bench_job 300 generate_compiled_kimi_linear_separated_nofla generate --models kimi_linear \
    --batches 256 --arms stock-static-compiled,replay-compiled,replay-fp8-compiled,replay-nvfp4-compiled \
    --prompt 512 --new 128 --repeats 2 --out "$RES/generate_compiled_kimi_linear_separated_nofla.json"; pack
  bench_job 250 generate_compiled_qwen3_5_separated_fla generate --models qwen3_5 --batches 256 \
    --arms stock-static-compiled,replay-compiled,replay-fp8-compiled,replay-nvfp4-compiled --prompt 512 \
    --new 128 --repeats 2 --out "$RES/generate_compiled_qwen3_5_separated_fla.json"; pack
  for f in "$RES"/generate_*.txt; do grep -v "^ *$" "$f" | tail -6; done
elif [ "$STAGE" = 3 ]; then
  REPLAYSSM_KERNEL_TEST_DEVICE=cuda test_job 150 test_kernels_split_code_vector_cuda tests/test_kernels_read_copy.py \
    -k "flush_reads_copy or delta_stream_default"; pack
  test_job 220 test_gpu_separated_rows tests/test_gpu.py -k "separated_flushes_in_the_kernel or \
    static_cache_with_a_read_copy"; pack
  tail -n 3 "$RES"/test_*.txt; grep -h "^FAILED\|Error" "$RES"/test_*.txt | head -20
  bench_job 300 generate_compiled_kimi_linear_separated_fla generate --models kimi_linear --batches 256 \
    --arms stock-static-compiled,replay-compiled,replay-fp8-compiled,replay-nvfp4-compiled --prompt 512 \
    --new 128 --repeats 2 --out "$RES/generate_compiled_kimi_linear_separated_fla.json"; pack
  for f in "$RES"/generate_*.txt; do grep -v "^ *$" "$f" | tail -6; done
elif [ "$STAGE" = 4 ]; then
  bench_job 280 generate_compiled_qwen3_5_separated_fla generate --models qwen3_5 --batches 256 \
    --arms stock-static-compiled,replay-compiled,replay-fp8-compiled,replay-nvfp4-compiled --prompt 512 \
    --new 128 --repeats 2 --out "$RES/generate_compiled_qwen3_5_separated_fla.json"; pack
  for f in "$RES"/generate_*.txt; do grep -v "^ *$" "$f" | tail -6; done
elif [ "$STAGE" = 5 ]; then
  REPLAYSSM_KERNEL_TEST_DEVICE=cuda test_job 150 test_kernels_replay_code_vector_cuda tests/test_kernels_read_copy.py \
    -k "delta_chunked or delta_stream_default"; pack
  tail -n 3 "$RES"/test_*.txt; grep -h "^FAILED\|Error" "$RES"/test_*.txt | head -20
  timeout 200 python3 "$R/benchmarks/gpu/read_copy_defaults.py" --batches 256 --specs gdn:fp8,kda:fp8 \
    --out "$RES/read_copy_replay_code_vector.json" > "$RES/read_copy_replay_code_vector.txt" 2>&1
  echo "read_copy_replay_code_vector rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
  cut -c1-1600 "$RES/read_copy_replay_code_vector.txt"
elif [ "$STAGE" = 6 ]; then
  timeout 240 python3 "$R/benchmarks/gpu/read_copy_defaults.py" --batches 256 --specs gdn:fp8,kda:fp8 \
    --device-flush-tiles --out "$RES/read_copy_split_flush_tiles.json" > "$RES/read_copy_split_flush_tiles.txt" 2>&1
  echo "read_copy_split_flush_tiles rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
  cut -c1-2400 "$RES/read_copy_split_flush_tiles.txt"
  python3 -c "import json,sys; [print(r['family'], {k: round(v, 1) for k, v in r.items() if 'flush_' in k and k.endswith('_us')}) for r in json.load(open(sys.argv[1]))]" "$RES/read_copy_split_flush_tiles.json"
fi
save_triton_cache
