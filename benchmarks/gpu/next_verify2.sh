#!/usr/bin/env bash
# Run 68 (2026-12-01), one GPU: the delta-rule verify kernel unrolled over BLOCK_T with the window's width as a runtime
# guard (run 67: a plain runtime loop was 1.17-1.55x slower than the unrolled kernel for GDN at T <= 8), A/B against
# the former unrolled-over-T kernel; then the GPU tests of speculation and verify.
# Call: run(command="bash benchmarks/gpu/next_verify2.sh", carry=[".whl/fla"], timeout_s=400).
source benchmarks/gpu/install.sh || exit 1
RES=/tmp/w/res_next_verify2; rm -rf "$RES"; mkdir -p "$RES"; cd /tmp/w
timeout 120 python3 "$R/benchmarks/gpu/verify_loop_ab.py" gdn,kda > "$RES/verify_guard_ab.txt" 2>&1
echo "verify_guard_ab rc=$? $(date +%T)" | tee -a "$RES/done.txt"
test_job 120 test_gpu_speculation tests/test_gpu.py -k "speculation or verify or draft"
tail -n 30 "$RES"/*.txt
tar czf "$OUT/next_verify2.tgz" -C "$RES" .
