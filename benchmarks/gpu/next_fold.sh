#!/usr/bin/env bash
# GPU call, one GPU, serial, about 8 minutes: batched prompt lookup on tiny-gdn-copy after the fold kernels (a
# verify window that crosses a flush boundary stages the checkpoint there with one fold launch and verifies the rest
# of the window from it in the verify kernel, instead of about 100 torch launches per layer: 604-655 CUDA launches
# per crossing width-11 forward against 306 without a crossing, profile_spec.py on the H200). bf16 at batch 1 and 16
# without forward timing (targets: 1.5x at batch 16, 1.8x at batch 1, identical tokens), float32 at batch 16
# (identical tokens), then the CUDA fold-kernel and batched-speculation tests.
# Call: run(command="bash benchmarks/gpu/next_fold.sh", carry=[".whl/fla"], timeout_s=600).
source benchmarks/gpu/install.sh || exit 1
RES=/tmp/w/res_next_fold; rm -rf "$RES"; mkdir -p "$RES"; cd /tmp/w
bench_job 250 speculative_tiny_gdn_copy speculative --models tiny-gdn-copy --batches 16,1 --prompt 512 --new 128 \
  --schedules constant,heuristic --out "$RES/speculative_tiny_gdn_copy.json"
bench_job 170 speculative_tiny_gdn_copy_fp32 speculative --models tiny-gdn-copy --batches 16 --prompt 512 \
  --new 128 --dtype float32 --schedules heuristic --out "$RES/speculative_tiny_gdn_copy_fp32.json"
REPLAYSSM_KERNEL_TEST_DEVICE=cuda test_job 60 test_kernels_fold tests/test_kernels_verify.py -k fold_ring
test_job 90 test_gpu_batched tests/test_gpu.py -k "batched_speculation or verify_compiles"
tail -n 6 "$RES"/*.txt
tar czf "$OUT/next_fold.tgz" -C "$RES" .
