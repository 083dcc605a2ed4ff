#!/usr/bin/env bash
# Run 60 (2026-12-01), one GPU, serial: (1) the eager batch-256 step after the conv fix (the mixers' padded
# causal_conv1d_fn over the [conv ring, new] window was 250 against 51 us per Qwen3.5-like GDN layer and step in run 59),
# three models; (2) where a compiled batch-1 Nemotron-H-like step goes (kernels and GPU time per step, stock static
# cache against ReplayCache; run 55 measured 2.00 against 1.89 ms).
# Call: run(command="bash benchmarks/gpu/next_conv.sh", carry=[".whl/fla"], timeout_s=600).
source benchmarks/gpu/install.sh || exit 1
RES=/tmp/w/res_next_conv; rm -rf "$RES"; mkdir -p "$RES"; cd /tmp/w
bench_job 240 step_b256 step --models qwen3_5,nemotron_h,kimi_linear --batches 256 --repeats 2 --out "$RES/step_b256.json"
timeout 240 python3 "$R/benchmarks/gpu/profile_compiled.py" --model nemotron_h --batch 1 --prompt 128 --new 80 \
  --out "$RES/profile_compiled" > "$RES/profile_compiled.txt" 2>&1
echo "profile_compiled rc=$? $(date +%T)" | tee -a "$RES/done.txt"
tail -n 12 "$RES"/*.txt
tar czf "$OUT/next_conv.tgz" -C "$RES" .
