#!/usr/bin/env bash
# Run 63 (2026-12-01), one GPU: where the host time of a per-row rollback goes (run 62: 0.42 ms a call with and
# without PackedRollback), cProfile around every drop_rows of a Qwen3.5-like batch-64 speculation.
# Call: run(command="bash benchmarks/gpu/next_rollback2.sh", carry=[".whl/fla"], timeout_s=300).
source benchmarks/gpu/install.sh || exit 1
RES=/tmp/w/res_next_rollback2; rm -rf "$RES"; mkdir -p "$RES"; cd /tmp/w
timeout 200 python3 "$R/benchmarks/gpu/profile_rollback.py" speculative --models qwen3_5 --batches 64 --prompt 512 \
  --new 32 --schedules heuristic > "$RES/profile_rollback.txt" 2>&1
echo "profile_rollback rc=$? $(date +%T)"
grep -A45 "drop_rows calls" "$RES/profile_rollback.txt" | cut -c1-160
tar czf "$OUT/next_rollback2.tgz" -C "$RES" .
