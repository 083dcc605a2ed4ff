#!/usr/bin/env bash
# GPU calls of the twenty-fourth session. Every job packs what it wrote into $OUT right after it ends.
# STAGE=1 (about 8 minutes): the run-133 read-copy defaults (read_copy_stream_config / read_copy_split_flush_config:
#   GDN fp8 and nvfp4 and KDA fp8 streamed with host and device positions, a split step's flush on [K, 32] x 1) in
#   their CUDA test, then as callers get them against the former defaults side by side
#   (benchmarks/gpu/read_copy_defaults.py: host cycle streamed vs whole tile, device step split vs fused, rows mixed
#   and in phase; KDA nvfp4 too, not streamed yet), batch 256 then 64.
# STAGE=4 (about 2 minutes): KDA nvfp4 streamed when asked ([K, 32] / [K, 64] x 1 in chunks of 16), host and device.
# STAGE=5 (about 9 minutes, carry .whl too): compiled `generate`, Qwen3.5-like batch 1 (three repeats: profile_compiled
#   had replay 2.40 / 2.49 ms against stock 3.28 in one pass each) and Kimi-Linear-like batch 256 with the fp8 arm.
# STAGE=6 (about 2 minutes): KDA nvfp4 streamed by default (after STAGE=4): the CUDA test and the defaults again.
# STAGE=7 (about 3 minutes): the separated policies' host-phase flush-only launch (the exact fold, a third of GDN's
#   fp8 cycle) at [K, 64] x 4 / 2 / 1, [K, 32] x 2 / 1, [K, 16] x 1 against its default (the replay tile), GDN and KDA.
# STAGE=8 (about 1 minute): the host cycle with the exact fold's new flush tiles (run 140), and the split device
#   step's flush launch on [K, 16] x 1 and [K, 64] x 2 against [K, 32] x 1.
# STAGE=2 (about 9 minutes, carry .whl too): eager Qwen3.5-like at batch 256 by Python function (`bench step
#   --host-profile`), then compiled Qwen3.5-like at batch 64 with the separated fp8 arm.
# STAGE=3 (about 5 minutes, carry .whl too): where a compiled batch-1 Qwen3.5-like step goes (profile_compiled.py).
# Calls: run(command="STAGE=1 bash benchmarks/gpu/next_session24.sh", carry=[".triton_cache"], timeout_s=600), then
#   STAGE=2 / 3 with carry=[".whl", ".triton_cache"].
source benchmarks/gpu/install.sh || exit 1
RES=/tmp/w/res_next_session24_$STAGE; rm -rf "$RES"; mkdir -p "$RES"; cd /tmp/w
pack() { tar czf "$OUT/next_session24_$STAGE.tgz" -C "$RES" . ; }
if [ "$STAGE" = 1 ]; then
  REPLAYSSM_KERNEL_TEST_DEVICE=cuda test_job 150 test_read_copy_defaults_cuda tests/test_kernels_read_copy.py \
    -k "delta_stream_default"
  pack
  for batches in 256 64; do
    timeout 200 python3 "$R/benchmarks/gpu/read_copy_defaults.py" --batches $batches \
      --out "$RES/read_copy_defaults_b$batches.json" > "$RES/read_copy_defaults_b$batches.txt" 2>&1
    echo "read_copy_defaults b$batches rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
  done
elif [ "$STAGE" = 4 ]; then  # KDA nvfp4, streamed when asked (not by default): host and device, batch 256 and 64
  for batches in 256 64; do
    timeout 200 python3 "$R/benchmarks/gpu/read_copy_defaults.py" --batches $batches --specs kda:nvfp4 \
      --out "$RES/read_copy_kda_nvfp4_b$batches.json" > "$RES/read_copy_kda_nvfp4_b$batches.txt" 2>&1
    echo "read_copy_kda_nvfp4 b$batches rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
  done
elif [ "$STAGE" = 5 ]; then  # compiled batch 1 Qwen3.5-like, three repeats; compiled Kimi-Linear-like at 256
  bench_job 200 generate_compiled_qwen3_5_b1 generate --models qwen3_5 --batches 1 \
    --arms stock-static-compiled,replay-compiled --prompt 512 --new 128 --repeats 3 \
    --out "$RES/generate_compiled_qwen3_5_b1.json"; pack
  bench_job 320 generate_compiled_kimi_linear generate --models kimi_linear --batches 256 \
    --arms stock-static-compiled,replay-compiled,replay-fp8-compiled --prompt 512 --new 128 --repeats 2 \
    --out "$RES/generate_compiled_kimi_linear.json"; pack
elif [ "$STAGE" = 6 ]; then  # KDA nvfp4 streamed by default now: the CUDA test, then the defaults side by side
  REPLAYSSM_KERNEL_TEST_DEVICE=cuda test_job 150 test_read_copy_defaults_cuda tests/test_kernels_read_copy.py \
    -k "delta_stream_default"
  pack
  timeout 200 python3 "$R/benchmarks/gpu/read_copy_defaults.py" --batches 256,64 --specs kda:nvfp4,kda:fp8 \
    --out "$RES/read_copy_defaults_kda.json" > "$RES/read_copy_defaults_kda.txt" 2>&1
  echo "read_copy_defaults kda rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
elif [ "$STAGE" = 7 ]; then  # the exact fold's flush-only launch at other tiles (its tile was never swept)
  timeout 300 python3 "$R/benchmarks/gpu/read_copy_defaults.py" --batches 256,64 --specs gdn:fp8,kda:fp8 --flush-tiles \
    --out "$RES/read_copy_flush_tiles.json" > "$RES/read_copy_flush_tiles.txt" 2>&1
  echo "read_copy_flush_tiles rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
elif [ "$STAGE" = 8 ]; then  # the exact fold's new host flush tiles in the cycle; the split step's flush on [K, 16]
  timeout 150 python3 "$R/benchmarks/gpu/read_copy_defaults.py" --batches 256 --specs gdn:fp8,kda:fp8 \
    --device-flush-tiles --out "$RES/read_copy_device_flush.json" > "$RES/read_copy_device_flush.txt" 2>&1
  echo "read_copy_device_flush rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
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
