#!/usr/bin/env bash
# Planned GPU calls for the next session (not run yet). Every job packs what it wrote into $OUT right after it ends.
# STAGE=1 (about 8 minutes): the read copies' compiled-path step with the split step's flush launch on a tile of its
#   own (`_flush_config`, new in bench_delta: the fused launch's [K, 64] x 2 or [K, 32] x 1 beside the streamed replay
#   launch's [K, 64] x 1): run 131 had nvfp4 split at 901.8 us (flush on one warp) against the fused 534.3, and 445.4
#   when the flush launch had a tile of its own; fp8 267.2 at [K, 32] x 1 for both launches. Qwen3-Next batch 256,
#   fp8 then nvfp4; then KDA (Kimi-Linear, 256) fp8 streamed (not a default for per-key gates yet). Decisions: nvfp4
#   device positions -> split with a streaming replay launch where faster than fused; fp8 device -> [K, 64] x 1
#   replay with its own flush tile where faster than 267; KDA -> read_copy_stream_config for per-key gates.
# STAGE=2 (about 9 minutes, carry .whl too): eager Qwen3.5-like at batch 256 by Python function (`bench step
#   --host-profile`, cProfile of 16 decode forwards per arm, with the operator tables; run 127: 1.52x less GPU work
#   per step than stock + fla, yet 0.74-0.88x its speed), with the host wrappers' plain integer helpers (this session:
#   36.9 -> 14.8 us per delta-rule step wrapper on the CPU); then compiled Qwen3.5-like at batch 64 with the separated
#   fp8 arm.
# STAGE=3 (about 5 minutes, carry .whl too): where a compiled batch-1 Qwen3.5-like step goes (0.93x-1.00x against
#   stock static compiled over four runs): profile_compiled.py, arms replay / stock / replay.
# Calls: run(command="STAGE=1 bash benchmarks/gpu/next_session23.sh", carry=[".triton_cache"], timeout_s=600), then
#   STAGE=2 / 3 with carry=[".whl", ".triton_cache"] (the two must fit in 64 MiB beside the tracked files; prune with
#   benchmarks/gpu/prune_triton_cache.py, `--list` shows what is in the cache).
source benchmarks/gpu/install.sh || exit 1
RES=/tmp/w/res_next_session23_$STAGE; rm -rf "$RES"; mkdir -p "$RES"; cd /tmp/w
pack() { tar czf "$OUT/next_session23_$STAGE.tgz" -C "$RES" . ; }
if [ "$STAGE" = 1 ]; then
  for spec in "gdn qwen3-next 256 fp8 200" "gdn qwen3-next 256 nvfp4 180" "kda kimi-linear 256 fp8 180"; do
    set -- $spec
    timeout $5 python3 -m hf_replayssm.kernels.bench_delta --family $1 --shapes $2 --batches $3 --read-format $4 \
      --no-sweep --no-torch --no-fla --out "$RES/delta_$2_$4.json" > "$RES/delta_$2_$4.txt" 2>&1
    echo "$2 $4 rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
  done
elif [ "$STAGE" = 2 ]; then
  bench_job 230 step_host_profile step --models qwen3_5 --batches 256 --arms stock,replay-triton --repeats 2 \
    --profile "$RES/ops" --host-profile "$RES/host" --out "$RES/step_host_profile.json"; pack
  bench_job 300 generate_compiled_qwen3_5 generate --models qwen3_5 --batches 64 \
    --arms stock-static-compiled,replay-compiled,replay-fp8-compiled --prompt 512 --new 128 --repeats 2 \
    --out "$RES/generate_compiled_qwen3_5.json"; pack
elif [ "$STAGE" = 3 ]; then
  timeout 300 python3 "$R/benchmarks/gpu/profile_compiled.py" --model qwen3_5 --batch 1 --prompt 512 --new 80 \
    --arms replay-compiled,stock-static-compiled,replay-compiled --out "$RES/profile_compiled" \
    > "$RES/profile_compiled.txt" 2>&1
  echo "profile_compiled rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
fi
tail -n 12 "$RES"/*.txt
save_triton_cache
