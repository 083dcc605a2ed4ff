#!/usr/bin/env bash
# GPU calls of the sixteenth session (ran as runs 89-95, see benchmarks/gpu/README.md). Every job packs what it wrote into $OUT right after it ends.
# STAGE=1 (about 7 minutes): the delta commit's product fold (`_fold_dot`, new in the fifteenth session, unmeasured:
#   every record loaded at once and summed by one tf32x3 product instead of one dependent round trip per record;
#   sm_90: GDN 217 / KDA 248 registers at [128, 64] x 4, no spills): its CUDA tests, then bench_verify with it beside
#   the default (run 86 at T = 4, batch 256: GDN 3.83x, KDA 2.94x snapshots; verify alone was 509 / 705 us of the
#   691 / 904 us verify + commit, so the commit's flush is most of the rest), then KDA's replay cycle with the bench's
#   mixed arm at the device-phase default (16 x 1; run 87 timed it at 64 x 4), and GDN's with the per-head weights
#   pre-launch for the replay-only launches (`_gdn_weights`, new, unmeasured: halves the replay program's shuffles at
#   sm_90). If the product fold wins, make it the default of _commit and _fold (split invariance then holds to
#   rounding only: keep its bitwise test for the loop); if the pre-launch wins, make _gdn_weights the default.
# STAGE=2 (about 6 minutes): Kimi-Linear-like end to end at batch 64 / 256, compiled (run 52: 1.17x / 1.29x against
#   1.15x / 1.4x targets, with other jobs on the same GPU; the KDA device-phase replay launch is 6 % faster since).
# STAGE=3: the Qwen3.5-like batch-64 speculative arm with attention pinned to memory-efficient SDPA against the
#   default (run 73 0.09x against run 75 0.70x, unexplained).
# STAGE=4: the read-copy replay launches (fp8 / nvfp4, separated precision; targets 3.5x / 4.5x over the fp32
#   standard step, run 59: Mamba-2 fp8 2.15x, GDN fp8 1.00x, nvfp4 0.56-0.82x, "instruction- and latency-bound") swept
#   over one- and two-warp tiles too (the sweep lists gained them after run 86), batch 256.
# STAGE=5: verify launches not swept yet: Mamba-2's token / tf32x3 forms on 1-2 warps (the delta rule's steps form
#   gained 1.8x from one warp, runs 84-85) and KDA at T = 4 on [128, 16-64] x 1-2 (2.94x all-accept, 2 % short).
# STAGE=6 (added after STAGE 1-5 ran as runs 89-93): the product fold as GDN's default commit / ring fold (CUDA tests
#   of the delta commit, fold and speculation cases, the GDN weights case), bench_verify against the loop now named
#   (fold_loop), and GDN's replay cycle with the pre-launch at the device-phase launch too (rows in mixed phases).
# Calls: run(command="STAGE=1 bash benchmarks/gpu/next_session16.sh", carry=[".triton_cache", ".whl/fla"],
#   timeout_s=600), then STAGE=2 to 6 the same way (STAGE 2 needs fla: without it transformers' KDA prefill runs its
#   torch chunk path, 102 GiB at batch 64 and out of memory at 256, run 90). Before a call on a fresh machine: cat FILES_AT/triton_cache.tgz* > .triton_cache/cache.tgz
#   (tracked files plus the carried cache must stay under 64 MiB: prune verify entries of unused tiles if needed).
source benchmarks/gpu/install.sh || exit 1
RES=/tmp/w/res_next_session16_$STAGE; rm -rf "$RES"; mkdir -p "$RES"; cd /tmp/w
pack() { tar czf "$OUT/next_session16_$STAGE.tgz" -C "$RES" . ; }
if [ "$STAGE" = 1 ]; then
  REPLAYSSM_KERNEL_TEST_DEVICE=cuda test_job 120 test_kernels_verify_fold_dot_cuda tests/test_kernels_verify.py \
    -k "fold_dot or kda_and_commit or delta_fold_ring"; pack
  timeout 200 python3 -m hf_replayssm.kernels.bench_verify --family gdn,kda --batches 64,256 --windows 2,4,8 \
    --forms fold_dot --out "$RES/verify_fold_dot.json" > "$RES/verify_fold_dot.txt" 2>&1
  echo "verify rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
  for family in kda gdn; do  # gdn: also the host-phase cycle with the per-head weights pre-launch (_gdn_weights)
    timeout 100 python3 -m hf_replayssm.kernels.bench_delta --family $family --batches 64,256 --no-sweep --no-fla \
      --no-torch --out "$RES/replay_$family.json" > "$RES/replay_$family.txt" 2>&1
    echo "replay $family rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
  done
elif [ "$STAGE" = 6 ]; then
  REPLAYSSM_KERNEL_TEST_DEVICE=cuda test_job 200 test_kernels_delta_folds_cuda tests/test_kernels_verify.py \
    tests/test_kernels_delta.py -k "delta and (commit or fold or speculation) or gdn_weights"; pack
  timeout 150 python3 -m hf_replayssm.kernels.bench_verify --family gdn,kda --batches 64,256 --windows 2,4,8 \
    --forms fold_loop,fold_dot --out "$RES/verify_folds.json" > "$RES/verify_folds.txt" 2>&1
  echo "verify rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
  timeout 100 python3 -m hf_replayssm.kernels.bench_delta --family gdn --batches 64,256 --no-sweep --no-fla \
    --no-torch --out "$RES/replay_gdn.json" > "$RES/replay_gdn.txt" 2>&1
  echo "replay gdn rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
elif [ "$STAGE" = 2 ]; then
  bench_job 420 generate_kimi_linear generate --models kimi_linear --batches 64,256 \
    --arms stock-static-compiled,replay-compiled --prompt 512 --new 128 --repeats 1 \
    --out "$RES/generate_kimi_linear.json"; pack
elif [ "$STAGE" = 4 ]; then
  for fmt in fp8 nvfp4; do
    timeout 140 python3 -m hf_replayssm.kernels.bench_delta --family gdn --shapes qwen3-next --batches 256 --no-fla \
      --no-torch --no-check --no-sweep --read-format $fmt --read-copy-sweep --out "$RES/gdn_$fmt.json" \
      > "$RES/gdn_$fmt.txt" 2>&1
    echo "gdn $fmt rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
    bench_job 140 mamba2_$fmt kernels --family mamba2 --shapes nemotron-h-8b --batches 256 --no-sweep --no-check \
      --read-format $fmt --read-copy-sweep --out "$RES/mamba2_$fmt.json"; pack
  done
elif [ "$STAGE" = 5 ]; then
  timeout 150 python3 "$R/benchmarks/gpu/verify_config_sweep.py" --families mamba2 --batches 256 --windows 2,4,8 \
    --forms tokens,tf32x3 --tiles 32,64 --warps 1,2 > "$RES/sweep_mamba2_warps.txt" 2>&1
  echo "sweep mamba2 rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
  timeout 80 python3 "$R/benchmarks/gpu/verify_config_sweep.py" --families kda --batches 64,256 --windows 4 \
    --forms steps --tiles 16,32,64 --warps 1,2 > "$RES/sweep_kda_t4.txt" 2>&1
  echo "sweep kda rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
else
  for sdpa in efficient default; do
    bench_job 160 speculative_qwen3_5_b64_$sdpa speculative --models qwen3_5 --batches 64 --prompt 512 --new 64 \
      --schedules heuristic --sdpa $sdpa --out "$RES/speculative_qwen3_5_b64_$sdpa.json"; pack
  done
fi
tail -n 12 "$RES"/*.txt
save_triton_cache
