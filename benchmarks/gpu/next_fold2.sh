#!/usr/bin/env bash
# GPU call, one GPU, serial, about 7 minutes: the CUDA tests of the fold kernels, batched speculation (rows equal
# rows alone, folds ran) and one verify compile per window tile (now also with the window tensors' batch strides not
# specialised on: run 71 compiled a second variant at width 6 after width 5); then batched prompt lookup on
# tiny-gdn-copy at batch 1 (bf16, no forward timing; target 1.8x, identical tokens) and the Qwen3.5-like batch-64
# rollback share (run 67: 1.17 %).
# Call: run(command="bash benchmarks/gpu/next_fold2.sh", carry=[".whl/fla"], timeout_s=470).
source benchmarks/gpu/install.sh || exit 1
RES=/tmp/w/res_next_fold2; rm -rf "$RES"; mkdir -p "$RES"; cd /tmp/w
REPLAYSSM_KERNEL_TEST_DEVICE=cuda test_job 40 test_kernels_fold tests/test_kernels_verify.py -k fold_ring
test_job 60 test_gpu_batched tests/test_gpu.py -k "batched_speculation or verify_compiles"
bench_job 170 speculative_tiny_gdn_copy_b1 speculative --models tiny-gdn-copy --batches 1 --prompt 512 --new 128 \
  --schedules constant,heuristic --out "$RES/speculative_tiny_gdn_copy_b1.json"
bench_job 150 speculative_qwen3_5_b64 speculative --models qwen3_5 --batches 64 --prompt 512 --new 64 \
  --schedules heuristic --out "$RES/speculative_qwen3_5_b64.json"
tail -n 6 "$RES"/*.txt
tar czf "$OUT/next_fold2.tgz" -C "$RES" .
