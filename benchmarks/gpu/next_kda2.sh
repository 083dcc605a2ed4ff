#!/usr/bin/env bash
# Run 65 (2026-12-01), one GPU, serial: KDA's per-head pre-launch (`_kda_weights`) is the default since run 64
# (kernel, batch 256: 292 vs 500 us with rows in mixed phases). (1) The Kimi-Linear-like model end to end, compiled,
# batch 64 and 256 (run 52: 1.17x and 1.29x, target 1.4x at 256); (2) the same batch-256 step eager, side by side
# (run 61: 1.04x); (3) the kernel with an fp8 read copy at the new 32 x 2 default against its sweep.
# Call: run(command="bash benchmarks/gpu/next_kda2.sh", carry=[".whl/fla"], timeout_s=600).
source benchmarks/gpu/install.sh || exit 1
RES=/tmp/w/res_next_kda2; rm -rf "$RES"; mkdir -p "$RES"; cd /tmp/w
bench_job 300 generate_kimi_linear generate --models kimi_linear --batches 64,256 \
  --arms stock-static-compiled,replay-compiled --prompt 512 --new 128 --repeats 1 --out "$RES/generate_kimi_linear.json"
bench_job 150 step_kimi_linear_b256 step --models kimi_linear --batches 256 --repeats 2 --out "$RES/step_kimi_linear_b256.json"
bench_job 100 kernels_kda_fp8 kernels --family kda --shapes kimi-linear --batches 256 --no-torch --read-format fp8 \
  --out "$RES/kernels_kda_fp8.json"
tail -n 14 "$RES"/*.txt
tar czf "$OUT/next_kda2.tgz" -C "$RES" .
