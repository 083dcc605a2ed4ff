#!/usr/bin/env bash
# Run 67 (2026-12-01), one GPU, serial: the verify kernels' window as a runtime loop. (1) A/B against the former
# unrolled kernels (verify_loop_ab.py; needs benchmarks/gpu/ab/, see its docstring); (2) the Qwen3.5-like batch-64
# speculative bench of run 66 again (its verify forwards paid a JIT compile per new width: 0.9-9 s); (3) the GPU
# tests of speculation and verify.
# Call: run(command="bash benchmarks/gpu/next_verify.sh", carry=[".whl/fla"], timeout_s=600).
source benchmarks/gpu/install.sh || exit 1
RES=/tmp/w/res_next_verify; rm -rf "$RES"; mkdir -p "$RES"; cd /tmp/w
timeout 150 python3 "$R/benchmarks/gpu/verify_loop_ab.py" > "$RES/verify_loop_ab.txt" 2>&1
echo "verify_loop_ab rc=$? $(date +%T)" | tee -a "$RES/done.txt"
bench_job 200 speculative_qwen3_5_b64 speculative --models qwen3_5 --batches 64 --prompt 512 --new 64 \
  --schedules heuristic --time-forwards --out "$RES/speculative_qwen3_5_b64.json"
test_job 150 test_gpu_speculation tests/test_gpu.py -k "speculation or verify or draft"
tail -n 30 "$RES"/*.txt
tar czf "$OUT/next_verify.tgz" -C "$RES" .
