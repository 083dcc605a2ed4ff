#!/usr/bin/env bash
# GPU calls prepared in the thirty-eighth session for the next one. Every job packs what it wrote into $OUT.
# Call: run(command="STAGE=N bash benchmarks/gpu/next_session39.sh", carry=[".whl/fla", ".triton_cache"],
#   timeout_s=600)  (tracked files are ~41 MiB of the 64 MiB a call carries: keep .triton_cache/cache.tgz small)
# STAGE=1 (about 5 minutes): why the separated replay-only launches stay slow. GDN's fp8 host cycle runs its plain
#   flush cycle in 163.8 us against the fp32 replay cycle's 176.6 (run 206 / 122): its 15 replay launches reading a
#   quarter of the bytes barely gain. Nsight Compute on the host replay-only launch at 14 records, fp32 checkpoint
#   and fp8 / nvfp4 copies, GDN and KDA (`ncu_kernels.py --replay-copies`, new): DRAM throughput, achieved
#   occupancy, warp stalls (long scoreboard against math / MIO), spills, each copy also in chunks of 4 with the
#   records loaded late (offline 146-161 registers against 255); then the same arms timed without ncu.
# STAGE=2 (about 4 minutes): compiled `generate` Kimi-Linear-like at 256 with four repeats: separated-nvfp4 measured
#   1.36x / 1.38x in runs 209 / 210 against 1.47x in run 198 while its kernel-level step did not move (386 us).
# STAGE=3 (about 9 minutes): the streamed replay launches in chunks of 16 / 8 / 4 key rows, each also with the records'
#   values loaded after the stream (`_late_records`, new, off): offline (sm_90, batch 256) registers fall from 255
#   (spilling) to 229 (GDN fp8, chunks of 8, late) / 160 (chunks of 4, late); KDA fp8 185 / 146. Host cycle as the
#   cache runs it and the split step in phase, every family and format at 256 (`read_copy_defaults.py --stream-tiles
#   --stream-late`); the interpreter tests cover chunks of 4 and the option (`delta_chunked`); on CUDA first.
# Added in the thirty-ninth session, after STAGE=3 (run 212) made the records' values load late by default and moved
# KDA's nvfp4 copy to a whole head in chunks of 8:
# STAGE=4 (about 6 minutes): the new defaults on CUDA (kernel cases), the four copies at 256 rows with the default
#   beside the records loaded first (`--stream-tiles --stream-late` on the default tiles).
# STAGE=5 (about 5 minutes): compiled `generate` at 256, Qwen3.5-like and Kimi-Linear-like, every precision arm.
# STAGE=6 (about 5 minutes): the 256-row separated-precision model tests; the four copies at 64 rows as in STAGE=4.
source benchmarks/gpu/install.sh || exit 1
session_results next_session39; cd /tmp/w
if [ "$STAGE" = 1 ]; then
  ncu_job 260 ncu_replay_copies --families gdn,kda --replay-copies fp8,nvfp4
  script_job 150 ncu_replay_copies_times ncu_kernels.py --families gdn,kda --replay-copies fp8,nvfp4; pack
  tail -20 "$RES/ncu_replay_copies_times.txt"
elif [ "$STAGE" = 2 ]; then
  bench_job 300 generate_compiled_kimi_linear_separated_r4 generate --models kimi_linear --batches 256 \
    --arms stock-static-compiled,replay-compiled,replay-fp8-compiled,replay-nvfp4-compiled --prompt 512 \
    --new 128 --repeats 4 --out "$RES/generate_compiled_kimi_linear_separated_r4.json"; pack
  for f in "$RES"/generate_*.txt; do grep -v "^ *$" "$f" | tail -6; done
elif [ "$STAGE" = 3 ]; then
  REPLAYSSM_KERNEL_TEST_DEVICE=cuda test_job 120 test_kernels_chunked_late_cuda tests/test_kernels_read_copy.py \
    -k "delta_chunked"; pack
  show_tests
  script_job 380 read_copy_stream_late read_copy_defaults.py --batches 256 \
    --specs gdn:fp8,kda:fp8,gdn:nvfp4,kda:nvfp4 --stream-tiles --stream-late \
    --tiles 128x1x16,128x1x8,128x1x4,32x1x16,32x1x8,32x1x4 --out "$RES/read_copy_stream_late.json"; pack
  cut -c1-2500 "$RES/read_copy_stream_late.txt"
elif [ "$STAGE" = 4 ]; then
  REPLAYSSM_KERNEL_TEST_DEVICE=cuda test_job 150 test_kernels_late_default_cuda tests/test_kernels_read_copy.py \
    -k "delta_chunked or delta_stream_default"; pack
  show_tests
  script_job 300 read_copy_late_default read_copy_defaults.py --batches 256 \
    --specs gdn:fp8,kda:fp8,gdn:nvfp4,kda:nvfp4 --stream-tiles --stream-late --tiles 128x1x16,128x1x8 \
    --out "$RES/read_copy_late_default.json"; pack
  cut -c1-2500 "$RES"/read_copy_late_default.txt
elif [ "$STAGE" = 6 ]; then
  test_job 200 test_gpu_separated_rows tests/test_gpu.py -k "separated_flushes_in_the_kernel or \
    static_cache_with_a_read_copy"; pack
  show_tests
  script_job 150 read_copy_late_default_b64 read_copy_defaults.py --batches 64 \
    --specs gdn:fp8,kda:fp8,gdn:nvfp4,kda:nvfp4 --stream-tiles --stream-late --tiles 128x1x16,128x1x8 \
    --out "$RES/read_copy_late_default_b64.json"; pack
  cut -c1-2500 "$RES"/read_copy_late_default_b64.txt
elif [ "$STAGE" = 5 ]; then
  for model in qwen3_5 kimi_linear; do
    bench_job 260 generate_compiled_${model}_late_records generate --models $model --batches 256 \
      --arms stock-static-compiled,replay-compiled,replay-fp8-compiled,replay-nvfp4-compiled --prompt 512 \
      --new 128 --repeats 2 --out "$RES/generate_compiled_${model}_late_records.json"; pack
  done
  for f in "$RES"/generate_*.txt; do grep -v "^ *$" "$f" | tail -6; done
fi
save_triton_cache
