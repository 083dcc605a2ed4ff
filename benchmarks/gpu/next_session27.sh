#!/usr/bin/env bash
# Planned GPU calls for the next session (not run yet). Every job packs what it wrote into $OUT right after it ends.
# STAGE=1 (about 8 minutes, carry .whl/fla too): compiled batch-1 `generate` of the three shaped models, five
#   interleaved repeats per arm, after the twenty-sixth session's change (a compiled step reads its tensors from the
#   layer's device positions: fewer Dynamo guards before each graph replay; runs 149 / 150 measured 0.99x / 0.95x /
#   0.96x before it), then the batch-1 Nemotron-H-like profile (the guard check per step, run 150: 256.5 against
#   174.4 us).
# STAGE=3 (about 8 minutes): the CUDA-graph tests, batch 1 with twelve repeats and the paired median ratio; the guard check on this host.
# STAGE=2 (about 4 minutes): the same change at batch 256 (it must not cost anything there): compiled Nemotron-H-like.
# Calls: run(command="STAGE=1 bash benchmarks/gpu/next_session27.sh", carry=[".whl/fla", ".triton_cache"],
#   timeout_s=600), then STAGE=2 likewise.
source benchmarks/gpu/install.sh || exit 1
RES=/tmp/w/res_next_session27_$STAGE; rm -rf "$RES"; mkdir -p "$RES"; cd /tmp/w
pack() { tar czf "$OUT/next_session27_$STAGE.tgz" -C "$RES" . ; }
batch1_generate() {  # batch1_generate SECONDS REPEATS SUFFIX: compiled batch-1 generate of the three shaped models
  local limit=$1 repeats=$2 suffix=$3 model prompt
  for model in nemotron_h qwen3_5 kimi_linear; do
    prompt=$(shaped_prompt $model)
    bench_job "$limit" generate_compiled_${model}_b1$suffix generate --models $model --batches 1 \
      --arms stock-static-compiled,replay-compiled --prompt $prompt --new 128 --repeats "$repeats" \
      --out "$RES/generate_compiled_${model}_b1$suffix.json"; pack
  done
}
if [ "$STAGE" = 1 ]; then
  batch1_generate 150 5 ""
  timeout 120 python3 "$R/benchmarks/gpu/profile_compiled.py" --model nemotron_h --batch 1 --prompt 128 --new 80 \
    --arms replay-compiled,stock-static-compiled,replay-compiled --out "$RES/profile_compiled_nemotron_h" \
    > "$RES/profile_compiled_nemotron_h.txt" 2>&1
  echo "profile_compiled_nemotron_h rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
elif [ "$STAGE" = 3 ]; then
  # batch 1 again with twelve interleaved repeats and the paired median ratio (run 151's best-of-5 pairs disagreed
  # with its own profile), then the guard check's cost on this host (tiny models on its CPU, fla off the path).
  # First the CUDA-graph tests: a compiled step now calls the layer's device positions directly
  test_job 200 test_gpu_compiled tests/test_gpu.py -k "compiled_static_cache or static_cache_with_a_read_copy"; pack
  batch1_generate 170 12 _r12
  PYTHONPATH=/tmp/site timeout 150 python3 "$R/benchmarks/offline/guard_check.py" --out "$RES/guard_check.json" \
    > "$RES/guard_check.txt" 2>&1
  echo "guard_check rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
elif [ "$STAGE" = 2 ]; then
  bench_job 240 generate_compiled_nemotron_h_b256 generate --models nemotron_h --batches 256 \
    --arms stock-static-compiled,replay-compiled,replay-fp8-compiled --prompt 128 --new 128 --repeats 1 \
    --out "$RES/generate_compiled_nemotron_h_b256.json"; pack
fi
tail -n 12 "$RES"/*.txt
save_triton_cache
