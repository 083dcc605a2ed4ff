#!/usr/bin/env bash
# GPU call: host profile of speculative rounds on tiny-gdn-copy (batch 16 and 1), about 3 minutes.
# Call: run(command="bash benchmarks/gpu/next_profile.sh", carry=[".whl/fla"], timeout_s=400).
source benchmarks/gpu/install.sh || exit 1
RES=/tmp/w/res_next_profile; rm -rf "$RES"; mkdir -p "$RES"; cd /tmp/w
timeout 200 python3 "$R/benchmarks/gpu/profile_spec.py" "$RES" 16 > "$RES/profile_b16.log" 2>&1
echo "b16 rc=$?"; cat "$RES/profile_b16.log" | grep -v Warning | tail -8; head -8 "$RES"/profile_spec_b16.txt
tar czf "$OUT/next_profile.tgz" -C "$RES" .
