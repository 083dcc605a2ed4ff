#!/usr/bin/env bash
# GPU calls prepared in the thirty-fifth session for the next one. Every job packs what it wrote into $OUT.
# Call: run(command="STAGE=N bash benchmarks/gpu/next_session36.sh", carry=[".whl/fla", ".triton_cache"],
#   timeout_s=600)  (keep the carried cache small: tracked files are ~41 MiB of the 64 MiB a call carries;
#   benchmarks/gpu/prune_triton_cache.py --drop ...)
# STAGE=1 (about 7 minutes): the separated-precision model tests at 256 rows, where the copy launches take their
#   large-batch defaults since the thirty-fifth session (eager: Mamba-2 one warp over a whole head, the delta
#   rule's whole-head stream; static cache compiled: the split steps, Mamba-2's coefficients pre-launch), with the
#   2-row ones; the copy-launch kernel tests on CUDA.
# STAGE=2 (about 6 minutes): why GDN's fp8 flush giving its outputs from the copy costs 27 us a step where nvfp4's
#   costs 1 (run 187): Nsight Compute on the host flush, plain and with the outputs from the copy, fp8 and nvfp4
#   (ncu_kernels.py --flush-copies), GDN and KDA.
# STAGE=3 (about 6 minutes): the fp32 replay tiles of GDN / KDA again (the Mamba-2 host replay gained 8 % on one
#   warp, run 183; the delta rule's fp32 tiles date from runs 81-86): replay_config_sweep.py at 256.
# STAGE=4 (about 9 minutes; thirty-sixth session): the 256-row model tests again after their large-batch tolerance
#   (assert_rows_agree: run 189 failed 7 of them on a few rows' flipped codes, run 190 measured it), then STAGE=3.
# STAGE=5 (about 9 minutes): compiled `generate` at batch 256 with every precision arm, Nemotron-H-like (prompt 128)
#   and Qwen3.5-like (prompt 512), as run 146 (twenty-sixth session) did before the copy kernels of sessions 31-35.
source benchmarks/gpu/install.sh || exit 1
session_results next_session36; cd /tmp/w
if [ "$STAGE" = 1 ]; then
  test_job 330 test_gpu_separated_rows tests/test_gpu.py -k "separated_flushes_in_the_kernel or \
    static_cache_with_a_read_copy"; pack
  REPLAYSSM_KERNEL_TEST_DEVICE=cuda test_job 150 test_kernels_copy_tiles_cuda tests/test_kernels_read_copy.py \
    -k "mamba2_copy_tiles or delta_stream_default"; pack
  tail -n 3 "$RES"/test_*.txt; grep -h "^FAILED\|Error" "$RES"/test_*.txt | head -20
elif [ "$STAGE" = 2 ]; then
  ncu_job 300 ncu_delta_flush_copies --families gdn,kda --flush-copies fp8,nvfp4
  grep -h "flush15\|rc=" "$RES"/*_run.txt "$RES/done.txt" | head -20
  python3 - "$RES/ncu_delta_flush_copies.csv" <<'PY' | tee "$RES/ncu_delta_flush_copies_summary.txt"
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
head = rows[0] if rows else []
want = ("Duration", "Executed Instructions", "Registers Per Thread", "Achieved Occupancy", "Memory Throughput",
        "DRAM Throughput", "Stall Long Scoreboard", "Stall Wait", "Issue Slots Busy")
for row in rows[1:]:
    record = dict(zip(head, row))
    if any(w in record.get("Metric Name", "") for w in want) and "flush15" in " ".join(row):
        print(record.get("NVTX Range", record.get("ID", "")), record.get("Metric Name"), record.get("Metric Value"))
PY
  pack
elif [ "$STAGE" = 4 ]; then
  test_job 200 test_gpu_separated_rows tests/test_gpu.py -k "separated_flushes_in_the_kernel or \
    static_cache_with_a_read_copy"; pack
  tail -n 3 "$RES"/test_*.txt; grep -h "^FAILED\|Error" "$RES"/test_*.txt | head -20
elif [ "$STAGE" = 5 ]; then
  for model in nemotron_h qwen3_5; do
    prompt=$(shaped_prompt $model)
    bench_job 275 generate_compiled_${model}_separated generate --models $model --batches 256 \
      --arms stock-static-compiled,replay-compiled,replay-fp8-compiled,replay-nvfp4-compiled --prompt $prompt \
      --new 128 --repeats 1 --out "$RES/generate_compiled_${model}_separated.json"; pack
    grep -v "^ *$" "$RES/generate_compiled_${model}_separated.txt" | tail -8
  done
fi
if [ "$STAGE" = 3 ] || [ "$STAGE" = 4 ]; then
  timeout 370 python3 "$R/benchmarks/gpu/replay_config_sweep.py" --batches 256 --families gdn,kda \
    --configs 128x1,64x1,32x1,128x2,64x2 > "$RES/delta_fp32_tiles.txt" 2>&1
  echo "delta_fp32_tiles rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack; cat "$RES/delta_fp32_tiles.txt"
fi
save_triton_cache
