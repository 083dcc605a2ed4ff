#!/usr/bin/env bash
# Planned GPU calls for the next session (not run yet). Every job packs what it wrote into $OUT right after it ends.
# STAGE=1 (about 3 minutes): the exact fold's one-warp host flush tiles (run 140's new default: [K, 16] x 1 for GDN,
#   [K, 32] x 1 for KDA) in their CUDA tests (`delta_exact_fold`, `delta_host_phase`, `delta_stream_default`), then the
#   host cycle at those defaults and the split device step's flush launch on [K, 16] x 1 / [K, 64] x 2 against its
#   [K, 32] x 1 (`read_copy_defaults.py --device-flush-tiles`; next_session24.sh STAGE=8 found no GPU time left).
# Call: run(command="STAGE=1 bash benchmarks/gpu/next_session25.sh", carry=[".triton_cache"], timeout_s=400).
source benchmarks/gpu/install.sh || exit 1
RES=/tmp/w/res_next_session25_$STAGE; rm -rf "$RES"; mkdir -p "$RES"; cd /tmp/w
pack() { tar czf "$OUT/next_session25_$STAGE.tgz" -C "$RES" . ; }
if [ "$STAGE" = 1 ]; then
  REPLAYSSM_KERNEL_TEST_DEVICE=cuda test_job 200 test_read_copy_flush_cuda tests/test_kernels_read_copy.py \
    -k "delta_stream_default or delta_exact_fold or delta_host_phase"
  pack
  timeout 150 python3 "$R/benchmarks/gpu/read_copy_defaults.py" --batches 256,64 --specs gdn:fp8,kda:fp8,gdn:nvfp4 \
    --device-flush-tiles --out "$RES/read_copy_device_flush.json" > "$RES/read_copy_device_flush.txt" 2>&1
  echo "read_copy_device_flush rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
fi
tail -n 12 "$RES"/*.txt
save_triton_cache
