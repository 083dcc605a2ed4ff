#!/usr/bin/env bash
# GPU calls of the seventeenth session (2026-12-02): STAGE=1 run 96, 3 run 97, 2 run 98, 4 run 99, 5 run 100 (results:
# BENCHMARKS.md, benchmarks/results/*_run96* to *_run100*). Every job packs what it wrote into $OUT right after it ends.
# STAGE=1 (about 6 minutes): KDA's verify with the committed records' decay and decayed keys computed once per
#   (row, head) by a pre-launch (`_verify(..., _weights=True)`, new in the sixteenth session, unmeasured; sm_90:
#   T = 4 [128, 32] x 2 209 registers against 237, x 1 416 B spilled against 44): its CUDA test, bench_verify beside
#   the default (runs 86 / 89 / 95 at T = 4, batch 256, every draft accepted: 2.94x / 2.88x / 2.86x snapshots, the 3x
#   target 2-5 % short), and a launch sweep of both forms with and without it. If it wins at its best launch, make it
#   KDA's default (and that launch in verify_launch_config).
# STAGE=2 (about 5 minutes): the Qwen3.5-like batch-64 speculative arm with attention pinned to memory-efficient SDPA
#   against the default (run 94: 0.25x, 67 ms per verify forward against run 75's 22.5; the pinned arm failed on
#   grouped-query inputs, fixed since: transformers now repeats the key / value heads under that pin).
# STAGE=3 (about 6 minutes): where the commit's time goes (`bench_verify --parts`, new): verify alone, commit alone
#   with every row flushing and count only, against one standard step (the same state traffic as a flush), and the
#   flush at 16-64 wide tiles on 1-8 warps, both folds. From runs 86 / 95 (batch 256, T = 4): the commit costs about
#   150 (GDN) / 200 (KDA) us per speculative step with a flush every fourth step, i.e. a flush of about 2-3 standard
#   steps where its bytes ask for about one. ptxas for sm_90 (Triton 3.6, compile-only, registers / B spilled) of the
#   flush launches, [128, BLOCK_V] x warps: GDN default product fold 64 x 4 217 (2 programs of 4 warps per SM);
#   64 x 8 107, 32 x 4 138, 16 x 4 92, loop 64 x 8 80; KDA default loop 64 x 4 127, 64 x 8 80, product 64 x 8 128,
#   32 x 4 167; one warp spills from 32 wide on (GDN product 64 x 1: 24 KB).
# STAGE=4 (about 6 minutes; added after runs 96-98): the new defaults (KDA's verify pre-launch from 3 tokens on,
#   Mamba-2's commit / fold on [16, 128] x 2, GDN's product fold on 8 warps): their CUDA tests, and bench_verify at
#   batch 64 / 256, T = 2, 3, 4, 8 beside KDA without the pre-launch and both folds.
# STAGE=5 (about 5 minutes): --parts at batch 256 T = 4 (the commit's default flush against a small sweep) and the
#   KDA steps-form launch sweep with and without the pre-launch at T = 4 and 8.
# STAGE=6 (about 4 minutes; added in the session): Nsight Compute's counters of the standard and replay steps at
#   batch 256 (`benchmarks/gpu/ncu_kernels.py`): DRAM throughput, occupancy and warp stalls, to say why the replay
#   cycles reach 1.0-1.3x of the standard step where their bytes allow about 1.8x.
# Calls: run(command="STAGE=1 bash benchmarks/gpu/next_session17.sh", carry=[".triton_cache", ".whl/fla"],
#   timeout_s=600), then STAGE=2 and 3 the same way.
source benchmarks/gpu/install.sh || exit 1
RES=/tmp/w/res_next_session17_$STAGE; rm -rf "$RES"; mkdir -p "$RES"; cd /tmp/w
pack() { tar czf "$OUT/next_session17_$STAGE.tgz" -C "$RES" . ; }
if [ "$STAGE" = 1 ]; then
  REPLAYSSM_KERNEL_TEST_DEVICE=cuda test_job 150 test_kernels_verify_kda_weights_cuda tests/test_kernels_verify.py \
    -k "kda_weights or delta_default_fold or delta_verify_kda_and_commit"; pack
  timeout 150 python3 -m hf_replayssm.kernels.bench_verify --family kda --batches 64,256 --windows 2,4,8 \
    --forms weights --out "$RES/verify_kda_weights.json" > "$RES/verify_kda_weights.txt" 2>&1
  echo "verify rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
  timeout 150 python3 "$R/benchmarks/gpu/verify_config_sweep.py" --families kda --batches 256 --windows 2,4,8 \
    --forms tokens,tokens_weights,steps,steps_weights --tiles 16,32,64 --warps 1,2 > "$RES/sweep_kda_weights.txt" 2>&1
  echo "sweep kda rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
elif [ "$STAGE" = 4 ]; then
  REPLAYSSM_KERNEL_TEST_DEVICE=cuda test_job 200 test_kernels_verify_defaults_cuda tests/test_kernels_verify.py \
    -k "launch_rule or kda_weights or default_fold or and_commit or fold_ring or speculation_kda or speculation_gdn"
  pack
  timeout 330 python3 -m hf_replayssm.kernels.bench_verify --family mamba2,gdn,kda --batches 64,256 \
    --windows 2,3,4,8 --forms no_weights,fold_dot,fold_loop --out "$RES/verify_defaults.json" \
    > "$RES/verify_defaults.txt" 2>&1
  echo "verify rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
elif [ "$STAGE" = 5 ]; then
  timeout 200 python3 -m hf_replayssm.kernels.bench_verify --family mamba2,gdn,kda --batches 256 --windows 4 \
    --parts --commit-tiles 16,32,64 --commit-warps 2,4,8 --no-check --out "$RES/verify_parts.json" \
    > "$RES/verify_parts.txt" 2>&1
  echo "verify parts rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
  timeout 300 python3 "$R/benchmarks/gpu/verify_config_sweep.py" --families kda --batches 256 --windows 4,8 \
    --forms steps,steps_weights --tiles 16,32,64 --warps 1,2 > "$RES/sweep_kda_weights.txt" 2>&1
  echo "sweep kda rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
elif [ "$STAGE" = 6 ]; then
  NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1); echo "ncu: $NCU" > "$RES/done.txt"
  timeout 60 python3 "$R/benchmarks/gpu/ncu_kernels.py" > "$RES/ncu_times.txt" 2>&1
  echo "times rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
  timeout 150 "$NCU" --clock-control none --profile-from-start off --set detailed -o "$RES/ncu_kernels" \
    python3 "$R/benchmarks/gpu/ncu_kernels.py" --no-time > "$RES/ncu_run.txt" 2>&1
  echo "ncu rc=$? $(date +%T)" | tee -a "$RES/done.txt"
  timeout 30 "$NCU" --import "$RES/ncu_kernels.ncu-rep" --page details > "$RES/ncu_details.txt" 2>&1
  timeout 30 "$NCU" --import "$RES/ncu_kernels.ncu-rep" --page details --csv > "$RES/ncu_details.csv" 2>&1
  echo "import rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
elif [ "$STAGE" = 3 ]; then
  timeout 420 python3 -m hf_replayssm.kernels.bench_verify --family mamba2,gdn,kda --batches 256 --windows 4 \
    --parts --commit-tiles 16,32,64 --commit-warps 1,2,4,8 --no-check --out "$RES/verify_parts.json" \
    > "$RES/verify_parts.txt" 2>&1
  echo "verify parts rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
else
  for sdpa in efficient default; do
    bench_job 160 speculative_qwen3_5_b64_$sdpa speculative --models qwen3_5 --batches 64 --prompt 512 --new 64 \
      --schedules heuristic --sdpa $sdpa --out "$RES/speculative_qwen3_5_b64_$sdpa.json"; pack
  done
fi
tail -n 12 "$RES"/*.txt
save_triton_cache
