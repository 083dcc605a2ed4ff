#!/usr/bin/env bash
# Run 61 (2026-12-01), one GPU, serial: (1) where the host time of a compiled batch-1 Nemotron-H-like step goes (run 60:
# 0.5 ms of GPU time in a 2.0 / 3.2 ms step, stock static cache / ReplayCache): operator tables by self CPU time and a
# cProfile of one generate per arm, arms run replay, stock, replay (the host's speed drifts); (2) the Kimi-Linear-like
# eager batch-256 step after the conv fix (run 60 ran out of time before it), and the Qwen3.5-like one again.
# Call: run(command="bash benchmarks/gpu/next_host.sh", carry=[".whl/fla"], timeout_s=600).
source benchmarks/gpu/install.sh || exit 1
RES=/tmp/w/res_next_host; rm -rf "$RES"; mkdir -p "$RES"; cd /tmp/w
timeout 300 python3 "$R/benchmarks/gpu/profile_compiled.py" --model nemotron_h --batch 1 --prompt 128 --new 80 \
  --arms replay-compiled,stock-static-compiled,replay-compiled --out "$RES/profile_compiled" \
  > "$RES/profile_compiled.txt" 2>&1
echo "profile_compiled rc=$? $(date +%T)" | tee -a "$RES/done.txt"
bench_job 280 step_b256 step --models kimi_linear,qwen3_5 --batches 256 --repeats 2 --out "$RES/step_b256.json"
tail -n 8 "$RES"/*.txt
tar czf "$OUT/next_host.tgz" -C "$RES" .
