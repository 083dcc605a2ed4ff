#!/usr/bin/env bash
# Planned GPU call (not run yet), one GPU, serial, about 6 minutes: (1) KDA with its decays computed once per row and
# head (`_kda_weights`: offline sm_90 SASS of the fused replay kernel 2696 -> 1136 instructions, 208 -> 126
# registers, plus a 936-instruction pre-launch), against the default replay, our standard step and fla, batch 64 and
# 256, with a tile sweep; (2) the nvfp4 read copy with the E2M1 bit decode, both families (run 59 timed the former
# decode: Mamba-2 host phase 672 us, device in phase 1032; GDN 487 / 650).
# Call: run(command="bash benchmarks/gpu/next_kda.sh", carry=[".whl/fla"], timeout_s=600).
source benchmarks/gpu/install.sh || exit 1
RES=/tmp/w/res_next_kda; rm -rf "$RES"; mkdir -p "$RES"; cd /tmp/w
bench_job 200 kernels_kda_weights kernels --family kda --shapes kimi-linear --batches 64,256 --no-torch \
  --out "$RES/kernels_kda_weights.json"
bench_job 110 kernels_mamba2_nvfp4_bits kernels --family mamba2 --shapes nemotron-h-8b --batches 256 --no-sweep \
  --read-format nvfp4 --out "$RES/kernels_mamba2_nvfp4_bits.json"
bench_job 90 kernels_gdn_nvfp4_bits kernels --family gdn --shapes qwen3-next --batches 256 --no-sweep --no-torch \
  --read-format nvfp4 --out "$RES/kernels_gdn_nvfp4_bits.json"
tail -n 16 "$RES"/*.txt
tar czf "$OUT/next_kda.tgz" -C "$RES" .
