#!/usr/bin/env bash
# GPU calls prepared in the thirty-ninth session for the next one (no GPU in the fortieth, which extended STAGE=4 to
# KDA and added STAGE=6 / 7). Every job packs what it wrote into $OUT.
# Call: run(command="STAGE=N bash benchmarks/gpu/next_session41.sh", carry=[".whl/fla", ".triton_cache"],
#   timeout_s=600)
# STAGE=1 (about 4 minutes): the fp32 host cycle's walking replay launches at more programs per SM. Runs 119-121
#   swept GDN's [K, 32] x 1 walk at 5 / 6 / 7 / 8 programs per SM (216.5 / 195.2 / 182.1 / 175.1 us per step at batch
#   256: still falling at 8, the default since) and KDA's at 5 / 7 / 8 (228.5 / 215.3 / 215.1); nothing above 8 was
#   tried. Offline (sm_90, Triton 3.6, batch 256) the walk holds GDN 198 registers and 23.3 KB of shared memory a
#   program (room for 9 an SM), KDA 80 and 20.7 KB (room for 10). GDN's cycle is 1.55x our standard step against the
#   1.75x target, KDA's 1.28x against 1.55x.
# STAGE=2 (about 5 minutes): issue 8's batch 1 ("never slower"): compiled `generate` Qwen3.5-like and
#   Kimi-Linear-like at batch 1, stock static compiled against ReplayCache compiled, four repeats (0.99x-1.03x in
#   earlier runs). Then (forty-first session, about 3 minutes) batch-1 speculation on a static ReplayCache (eager
#   verify forwards, static attention layers) next to the dynamic cache's (`--speculative-arms ...,lookup-static,
#   draft-static`, Qwen3.5-like, random weights: acceptance near 0, so this compares the caches' overheads).
# STAGE=3 (about 6 minutes): the streamed replay launches of a read copy on other tiles now that the records' values
#   load late (the default since run 213): offline (sm_90, batch 256, records late) GDN fp8 [K, 128] x 1 in chunks
#   of 16 holds 255 registers (56 bytes spilled: 8 one-warp programs an SM), [K, 128] x 2 168 (6 two-warp programs),
#   [K, 64] x 1 221 (9) or in chunks of 8 162 (12); KDA fp8 253 / 147 / 147 / 105; GDN nvfp4 255 / 167 / 219 / 158;
#   KDA nvfp4 (default chunks of 8) 128 x 2 in chunks of 16 127, 64 x 1 153 / 114. Two warps and [K, 64] lost with
#   the records loaded first (run 185); host cycle and split step, four copies at 256.
# STAGE=4 (about 6 minutes): the solved exact fold with its chain over the records (the [R, R] inverse, decays and
#   weights) computed once per head by a pre-launch (`_solve_weights`, off) instead of in every V tile's flush
#   program. GDN: the separated flush (stepped exact fold) holds about a third of GDN's fp8 host cycle (810-860 us a
#   flush launch against a 275 us standard step: 50 of 150 us a step); solved in-program it measured 1404 us (run
#   131). Offline (sm_90, batch 256, outputs from an fp8 copy) the flush program on [K, 32] x 4 falls from 255
#   registers and 72 spilled bytes to 192 and none with the pre-launch (188 registers, one warp, a program per
#   head). KDA (built in the fortieth session, per-key gates: A's rows each with their own decays; the pre-launch also
#   hands over the decayed keys): its stepped exact fold is ~1170 us a flush launch (~73 of 208 us a step); solved
#   with the pre-launch the flush program on [K, 32] x 4 holds 217 registers, none spilled, the pre-launch 117 on four
#   warps. Kernel cases on CUDA (GDN and KDA) first, then `read_copy_defaults.py --solve --flush-weights` for GDN's
#   copies at 256 and 64 (`--flush-weights`: see STAGE=6; GDN's host flush fp8 2912 -> 2024 static instructions,
#   nvfp4 168 -> 128 registers, at the cost of the weights pre-launch once a period, which GDN does not run otherwise).
#   Also (forty-first session, about 1 minute): speculation on a static ReplayCache on CUDA
#   (`test_cuda_static_cache_speculation`: the Triton verify kernels, nothing compiled while speculating).
# STAGE=6 (about 9 minutes; STAGE=7 the same at batch 64, after KDA's verify with its pre-launch reading the records
#   newest first, bench_verify form `weights_newest_first`: 944 -> 304 warp shuffles a program offline): KDA's copies
#   at 256, `--solve` as STAGE=4 and two options
#   new in the fortieth session, both off:
#   `--newest-first`: KDA's weights pre-launch (45.7 us of its 216 us fp32 host cycle, run 102; in every KDA cycle,
#   fp32 or separated) reads the records newest first, so that their decays are a forward scan: offline (sm_90,
#   Triton 3.6) 970 -> 330 warp shuffles a program (832 were the reverse scan), 2680 -> 2152 instructions, 128 -> 156
#   registers. At one shuffle a clock per SM, 8192 programs x 970 shuffles are about 34 us: if the launch is
#   shuffle-bound it falls toward its 23 us of bytes. If it wins, make it the default and time the fp32 cycles.
#   `--flush-weights`: the separated flush launches take the records' weights for their outputs from that pre-launch
#   instead of each V tile recomputing them (offline, batch 256: KDA fp8 host flush 255 registers / 216 bytes spilled
#   / 1337 shuffles / 6216 instructions -> 244 / 0 / 377 / 3400; the split step's flush launch fp8 255 / 192 / 858 /
#   5688 -> 255 / 0 / 374 / 4032, nvfp4 255 / 0 / 1201 / 4776 -> 128 / 0 / 233 / 2192; a split step runs the
#   pre-launch anyway, a host flush gains one launch a period).
#   A win flips `NEWEST_FIRST_DEFAULT` / `FLUSH_WEIGHTS_DEFAULT` in kernels/delta_rule.py (then the CUDA kernel cases
#   and the 256-row separated model tests of tests/test_gpu.py again).
# Order if time is short: 6, 4, 1, 3, 5, 2, 7.
# STAGE=5 (about 4 minutes): where the separated compiled-path step loses to the host cycle (GDN fp8 at 256, rows in
#   phase: 184.6 us a step against 149.8, run 213): Nsight Compute on the device step with every row replaying (count
#   7: the flush launch's programs read a count and exit, the count launch, the re-encode launch with nothing due)
#   and every row flushing (count 15), fp8 and nvfp4 (`ncu_kernels.py --device-copies`, new), then their times.
source benchmarks/gpu/install.sh || exit 1
session_results next_session41; cd /tmp/w
if [ "$STAGE" = 1 ]; then
  for spec in kda:kimi-linear:32:1:2:8,32:1:2:9,32:1:2:10,32:1:2:11 gdn:qwen3-next:32:1:2:8,32:1:2:9,32:1:2:10; do
    family=${spec%%:*}; rest=${spec#*:}; shape=${rest%%:*}; walks=${rest#*:}
    timeout 150 python3 -m hf_replayssm.kernels.bench_delta --family "$family" --shapes "$shape" --batches 256 \
      --no-sweep --diag --no-torch --no-fla --walks "$walks" --out "$RES/walks_${family}.json" \
      > "$RES/walks_${family}.txt" 2>&1
    echo "walks_${family} rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
    grep -h "walking\|host-phase replay" "$RES/walks_${family}.txt" | cut -c1-300
  done
elif [ "$STAGE" = 2 ]; then
  for model in qwen3_5 kimi_linear; do
    bench_job 240 generate_compiled_${model}_b1 generate --models $model --batches 1 \
      --arms stock-static-compiled,replay-compiled --prompt 512 --new 128 --repeats 4 \
      --out "$RES/generate_compiled_${model}_b1.json"; pack
  done
  bench_job 180 speculative_static_qwen3_5 generate --speculative --models qwen3_5 --prompt 512 --new 64 \
    --repeats 2 --speculative-arms greedy-replay,lookup-replay,lookup-static,draft-replay,draft-static \
    --out "$RES/speculative_static_qwen3_5.json"; pack
  for f in "$RES"/generate_*.txt "$RES"/speculative_*.txt; do grep -v "^ *$" "$f" | tail -6; done
elif [ "$STAGE" = 3 ]; then
  script_job 400 read_copy_late_tiles read_copy_defaults.py --batches 256 \
    --specs gdn:fp8,kda:fp8,gdn:nvfp4,kda:nvfp4 --stream-tiles --stream-late \
    --tiles 128x1x16,128x2x16,64x1x16,64x1x8 --out "$RES/read_copy_late_tiles.json"; pack
  cut -c1-2500 "$RES/read_copy_late_tiles.txt"
elif [ "$STAGE" = 4 ]; then
  REPLAYSSM_KERNEL_TEST_DEVICE=cuda test_job 150 test_kernels_solve_cuda tests/test_kernels_read_copy.py \
    -k "exact_solve or flush_weights"; pack
  test_job 90 test_gpu_static_speculation tests/test_gpu.py -k "static_cache_speculation"; pack
  show_tests
  script_job 330 read_copy_solve read_copy_defaults.py --batches 256,64 --specs gdn:fp8,gdn:nvfp4 --solve \
    --flush-weights --out "$RES/read_copy_solve.json"; pack
  cut -c1-2500 "$RES/read_copy_solve.txt"
elif [ "$STAGE" = 6 ]; then
  script_job 540 read_copy_solve_kda read_copy_defaults.py --batches 256 --specs kda:fp8,kda:nvfp4 --solve \
    --newest-first --flush-weights --out "$RES/read_copy_solve_kda.json"; pack
  cut -c1-2500 "$RES/read_copy_solve_kda.txt"
elif [ "$STAGE" = 7 ]; then
  timeout 150 python3 -m hf_replayssm.kernels.bench_verify --family kda --batches 256 --windows 4,8 \
    --forms weights,weights_newest_first --out "$RES/verify_kda_newest_first.json" \
    > "$RES/verify_kda_newest_first.txt" 2>&1
  echo "verify_kda_newest_first rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
  tail -8 "$RES/verify_kda_newest_first.txt"
  script_job 400 read_copy_solve_kda_b64 read_copy_defaults.py --batches 64 --specs kda:fp8,kda:nvfp4 --solve \
    --newest-first --flush-weights --out "$RES/read_copy_solve_kda_b64.json"; pack
  cut -c1-2500 "$RES/read_copy_solve_kda_b64.txt"
elif [ "$STAGE" = 5 ]; then
  ncu_job 260 ncu_device_copies --families gdn,kda --device-copies fp8,nvfp4
  script_job 150 ncu_device_copies_times ncu_kernels.py --families gdn,kda --device-copies fp8,nvfp4; pack
  tail -20 "$RES/ncu_device_copies_times.txt"
fi
save_triton_cache
