#!/usr/bin/env bash
# GPU calls prepared in the thirty-eighth session for the next one. Every job packs what it wrote into $OUT.
# Call: run(command="STAGE=N bash benchmarks/gpu/next_session39.sh", carry=[".whl/fla", ".triton_cache"],
#   timeout_s=600)  (tracked files are ~41 MiB of the 64 MiB a call carries: keep .triton_cache/cache.tgz small)
# STAGE=1 (about 5 minutes): why the separated replay-only launches stay slow. GDN's fp8 host cycle runs its plain
#   flush cycle in 163.8 us against the fp32 replay cycle's 176.6 (run 206 / 122): its 15 replay launches reading a
#   quarter of the bytes barely gain. Nsight Compute on the host replay-only launch at 14 records, fp32 checkpoint
#   and fp8 / nvfp4 copies, GDN and KDA (`ncu_kernels.py --replay-copies`, new): DRAM throughput, achieved
#   occupancy, warp stalls (long scoreboard against math / MIO), spills; then the same arms timed without ncu.
# STAGE=2 (about 4 minutes): compiled `generate` Kimi-Linear-like at 256 with four repeats: separated-nvfp4 measured
#   1.36x / 1.38x in runs 209 / 210 against 1.47x in run 198 while its kernel-level step did not move (386 us).
source benchmarks/gpu/install.sh || exit 1
session_results next_session39; cd /tmp/w
if [ "$STAGE" = 1 ]; then
  ncu_job 260 ncu_replay_copies --families gdn,kda --replay-copies fp8,nvfp4
  timeout 150 python3 "$R/benchmarks/gpu/ncu_kernels.py" --families gdn,kda --replay-copies fp8,nvfp4 \
    > "$RES/ncu_replay_copies_times.txt" 2>&1
  echo "ncu_replay_copies_times rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
  cat "$RES/ncu_replay_copies_times.txt" | tail -20
elif [ "$STAGE" = 2 ]; then
  bench_job 300 generate_compiled_kimi_linear_separated_r4 generate --models kimi_linear --batches 256 \
    --arms stock-static-compiled,replay-compiled,replay-fp8-compiled,replay-nvfp4-compiled --prompt 512 \
    --new 128 --repeats 4 --out "$RES/generate_compiled_kimi_linear_separated_r4.json"; pack
  for f in "$RES"/generate_*.txt; do grep -v "^ *$" "$f" | tail -6; done
fi
save_triton_cache
