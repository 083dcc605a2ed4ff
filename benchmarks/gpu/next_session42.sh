#!/usr/bin/env bash
# GPU calls of the forty-second session. Every job packs what it wrote into $OUT.
# Call: run(command="STAGE=N bash benchmarks/gpu/next_session42.sh", carry=[".whl/fla", ".triton_cache"],
#   timeout_s=600)
# STAGE=1 (about 8 minutes): `_flush_weights` on by default for per-key gates (KDA; runs 218-219: KDA's separated
#   cycles gained, GDN's lost): the CUDA kernel cases of KDA and of the separated flushes, the KDA separated model
#   tests of tests/test_gpu.py (2 and 256 rows, dynamic and static caches), then the forty-first session's
#   `bench generate --speculative` with the static arms (next_session41.sh STAGE=2's second half).
source benchmarks/gpu/install.sh || exit 1
session_results next_session42; cd /tmp/w
if [ "$STAGE" = 1 ]; then
  REPLAYSSM_KERNEL_TEST_DEVICE=cuda test_job 150 test_kernels_kda_cuda tests/test_kernels_read_copy.py \
    -k "kda or delta_host_phase or flush"; pack
  test_job 220 test_gpu_kda_separated tests/test_gpu.py -k "kimi_linear and separated"; pack
  show_tests
  bench_job 170 speculative_static_qwen3_5 generate --speculative --models qwen3_5 --prompt 512 --new 64 \
    --repeats 2 --speculative-arms greedy-replay,lookup-replay,lookup-static,draft-replay,draft-static \
    --out "$RES/speculative_static_qwen3_5.json"; pack
  grep -v "^ *$" "$RES/speculative_static_qwen3_5.txt" | tail -12
fi
save_triton_cache
