#!/usr/bin/env bash
# Planned GPU call (not run yet): the kernel defaults that no GPU has timed (BENCHMARKS.md, "Changed after these runs,
# not yet timed"): Mamba-2's split read-copy device phase (`replay_in_phase_read_copy_fused_us` against the split
# default) and GDN's optional split (`replay_in_phase_read_copy_split_us`), both formats, batch 256. With two GPUs the
# families run at the same time, one per GPU. Call: run(command="bash benchmarks/gpu/next_part1.sh",
# carry=[".whl"], timeout_s=600); results come back as one .tgz under $OUT.
source benchmarks/gpu/install.sh || exit 1
RES=/tmp/w/res_$(basename "$0" .sh); rm -rf "$RES"; mkdir -p "$RES"; cd /tmp/w
second=$(( $(nvidia-smi -L | wc -l) > 1 ? 1 : 0 ))
bench() {  # bench GPU NAME ARGS...
  local gpu=$1 name=$2; shift 2
  CUDA_VISIBLE_DEVICES=$gpu timeout 270 python3 -m hf_replayssm.cli bench kernels "$@" --out "$RES/$name.json" \
    > "$RES/$name.txt" 2>&1; echo "$name rc=$?" | tee -a "$RES/done.txt"
}
(bench 0 kernels_mamba2_fp8_split --family mamba2 --shapes nemotron-h-8b --batches 256 --no-sweep --read-format fp8
 bench 0 kernels_mamba2_nvfp4_split --family mamba2 --shapes nemotron-h-8b --batches 256 --no-sweep --read-format nvfp4) &
(bench $second kernels_gdn_fp8_split --family gdn --shapes qwen3-next --batches 256 --no-sweep --no-torch --read-format fp8
 bench $second kernels_gdn_nvfp4_split --family gdn --shapes qwen3-next --batches 256 --no-sweep --no-torch --read-format nvfp4) &
wait
tail -n 25 "$RES"/*.txt
tar czf "$OUT/$(basename "$0" .sh).tgz" -C "$RES" .  # the device returns at most 8 files
