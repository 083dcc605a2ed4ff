#!/usr/bin/env bash
# Run 64 (2026-12-01), one GPU: the Mamba-2 nvfp4 read-copy kernels after the E2M1 decode became a bit construction
# (offline sm_90 SASS of the device-phase replay kernel 1928 -> 1528 instructions, 159 -> 168 registers; run 59:
# host phase 672 us, device in phase 1032 us).
# Call: run(command="bash benchmarks/gpu/next_e2m1.sh", carry=[".whl/fla"], timeout_s=150).
source benchmarks/gpu/install.sh || exit 1
RES=/tmp/w/res_next_e2m1; rm -rf "$RES"; mkdir -p "$RES"; cd /tmp/w
bench_job 110 kernels_mamba2_nvfp4_bits kernels --family mamba2 --shapes nemotron-h-8b --batches 256 --no-sweep \
  --read-format nvfp4 --out "$RES/kernels_mamba2_nvfp4_bits.json"
tail -n 14 "$RES"/*.txt
tar czf "$OUT/next_e2m1.tgz" -C "$RES" .
