#!/usr/bin/env bash
# GPU call of the forty-third session (one: about 640 s of device time were left after a start that failed). Every job packs what it wrote
# into $OUT. Fetch first: `bash benchmarks/gpu/fetch_wheels.sh tf525` (transformers 5.25, 18 MB; no room left for the
# Triton cache next to the 42 MB repository, so the first process compiles our kernels).
# Call: run(command="STAGE=1 bash benchmarks/gpu/next_session43.sh", carry=[".whl/tf525"], timeout_s=600)
# STAGE=1 (about 7 minutes), by priority:
#   1. speculation on a static ReplayCache under transformers 5.25, which compiles the verify forwards of a
#      compileable cache (CUDA graphs): they now run on device positions through the verify ops (test_gpu's
#      test_cuda_static_cache_speculation: greedy tokens, within 1e-5 of the same calls eager);
#   2. the speculative bench on the Qwen3.5-like model under 5.25: prompt lookup on a static cache, compiled, against
#      eager prompt lookup on a dynamic cache and plain greedy compiled on a static cache;
#   3. the same CUDA test under the image's transformers 5.17 (verify forwards eager, on device positions);
# (Not run for lack of device time: the forty-second session's flipped default, `_flush_weights` for per-key gates,
#   in KDA's separated model tests: `test_job 110 test_gpu_kda_separated tests/test_gpu.py -k "kimi_linear and
#   separated"`.)
source benchmarks/gpu/install.sh || exit 1
session_results next_session43; cd /tmp/w
if [ "$STAGE" = 1 ]; then
  rm -rf /tmp/tf525 && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/tf525 \
    "$R"/.whl/tf525/*.whl || exit 1
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$RES/device.txt"
  TEST_PYTHONPATH=/tmp/tf525:/tmp/site test_job 170 test_static_speculation_tf525 -rs tests/test_gpu.py \
    -k static_cache_speculation; pack
  show_tests
  PYTHONPATH=/tmp/tf525:/tmp/site bench_job 150 speculative_compiled_qwen3_5 generate --speculative --models qwen3_5 \
    --prompt 512 --new 64 --repeats 2 --prompt-kinds code-edit --lookup 10 \
    --speculative-arms greedy-replay,greedy-static-compiled,lookup-replay,lookup-static,lookup-static-compiled \
    --out "$RES/speculative_compiled_qwen3_5.json"; pack
  grep -v "^ *$" "$RES/speculative_compiled_qwen3_5.txt" | tail -9
  test_job 80 test_static_speculation_tf517 -rs tests/test_gpu.py -k static_cache_speculation; pack
  show_tests
fi
