#!/usr/bin/env bash
# Thirteenth session, call 4 (run 76): the verify kernels as matrix products over the window (tl.dot, IEEE fp32).
# CUDA kernel tests of verify/commit/fold and the GPU speculation tests, then bench_verify (run 74 before: T = 4 at
# batch 256, x snapshots: Mamba-2 0.93x, GDN 2.01x, KDA 1.15x; target 3x), the launch-configuration sweep, and the
# bundled copying model at batch 16 end to end (run 71: 1.93x in bf16).
# Call: run(command="bash benchmarks/gpu/next_verify13.sh", carry=[".whl/fla", ".triton_cache"], timeout_s=560)
source benchmarks/gpu/install.sh || exit 1
RES=/tmp/w/res_next_verify13; rm -rf "$RES"; mkdir -p "$RES"; cd /tmp/w
REPLAYSSM_KERNEL_TEST_DEVICE=cuda test_job 120 test_kernels_verify_cuda tests/test_kernels_verify.py -m "slow or not slow"
test_job 150 test_gpu_spec tests/test_gpu.py -k "jit_compiles or compiles_once or speculation or triton_backend"
timeout 100 python3 -m hf_replayssm.kernels.bench_verify --family mamba2,gdn,kda --batches 256 --windows 2,4,8 \
  --out "$RES/verify.json" > "$RES/verify.txt" 2>&1
echo "verify rc=$? $(date +%T)" | tee -a "$RES/done.txt"
timeout 120 python3 "$R/benchmarks/gpu/verify_config_sweep.py" > "$RES/sweep.txt" 2>&1
echo "sweep rc=$? $(date +%T)" | tee -a "$RES/done.txt"
bench_job 100 speculative_tiny_gdn_copy_b16 speculative --models tiny-gdn-copy --batches 16 --prompt 512 --new 128 \
  --out "$RES/speculative_tiny_gdn_copy_b16.json"
tail -n 30 "$RES"/*.txt
tar czf "$OUT/next_verify13.tgz" -C "$RES" .
