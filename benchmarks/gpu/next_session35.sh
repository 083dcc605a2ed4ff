#!/usr/bin/env bash
# GPU calls of the thirty-fifth session. Every job packs what it wrote into $OUT.
# Call: run(command="STAGE=N bash benchmarks/gpu/next_session35.sh", carry=[".whl/fla", ".triton_cache"],
#   timeout_s=600)
# STAGE=1 (about 5 minutes): where Mamba-2's replay-only launch reading a copy spends its time
#   (benchmarks/gpu/copy_replay_probe.py: counts 0 / 8 / 14 per tile, with and without the record coefficients from
#   a pre-launch, fp32 / fp8 / nvfp4; the host cycle as the cache runs it per tile).
source benchmarks/gpu/install.sh || exit 1
session_results next_session35; cd /tmp/w
if [ "$STAGE" = 1 ]; then
  timeout 420 python3 "$R/benchmarks/gpu/copy_replay_probe.py" --out "$RES/copy_replay_probe.json" 2>&1 \
    | tee "$RES/copy_replay_probe.txt"
  echo "copy_replay_probe rc=${PIPESTATUS[0]} $(date +%T)" | tee -a "$RES/done.txt"; pack
fi
save_triton_cache
