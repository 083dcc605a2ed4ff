#!/usr/bin/env bash
# GPU calls of the thirtieth session. Every job packs what it wrote into $OUT right after it ends.
# STAGE=1 (about 9 minutes, carry .whl/tf525 only: transformers 5.25 and what the image lacks of its dependencies,
#   fetched with `benchmarks/gpu/fetch_wheels.sh tf525`; 18 MB next to the 39 MB repository leaves no room for the
#   Triton cache, so the first process compiles our kernels): the newest transformers on CUDA, never run there before.
#   The GPU test file (greedy, speculation, policies, Triton backend, compiled static cache with CUDA graphs), compiled
#   batch-1 `generate` of the Nemotron-H-like model, then transformers 5.25's own speculation (prompt lookup, a draft
#   model) against ours on the three shaped models at batch 1.
# Call: run(command="STAGE=1 bash benchmarks/gpu/next_session30.sh", carry=[".whl/tf525"], timeout_s=600)
source benchmarks/gpu/install.sh || exit 1
session_results next_session30; cd /tmp/w
if [ "$STAGE" = 1 ]; then
  rm -rf /tmp/tf525 && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/tf525 \
    "$R"/.whl/tf525/*.whl || exit 1
  export PYTHONPATH=/tmp/tf525:/tmp/site  # no fla: transformers' torch paths, as a user without fla has them
  python3 -c "import torch, transformers, huggingface_hub, kernels; print('torch', torch.__version__, 'transformers',
transformers.__version__, 'hub', huggingface_hub.__version__, 'kernels', kernels.__version__)" | tee "$RES/versions.txt"
  rm -rf /tmp/w/t && mkdir -p /tmp/w/t && cp -r "$R/tests" "$R/examples" "$R/pyproject.toml" /tmp/w/t/
  (cd /tmp/w/t && timeout 300 python3 -m pytest -q -rs -p no:cacheprovider tests/test_gpu.py > "$RES/test_gpu.txt" 2>&1)
  echo "test_gpu rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
  bench_job 110 generate_compiled_nemotron_h_b1 generate --models nemotron_h --batches 1 \
    --arms stock-static-compiled,replay-compiled --prompt 128 --new 128 --repeats 3 \
    --out "$RES/generate_compiled_nemotron_h_b1.json"; pack
  for model in nemotron_h qwen3_5 kimi_linear; do
    bench_job 60 speculative_$model generate --models $model --speculative --prompt "$(shaped_prompt $model)" \
      --new 128 --repeats 1 --out "$RES/speculative_$model.json"; pack
  done
  tail -n 4 "$RES/test_gpu.txt"; grep -h -A 8 "^batch\|identical" "$RES"/generate_*.txt "$RES"/speculative_*.txt | head -60
fi
# STAGE=2 (about 6 minutes, carry .whl/tf525): run 159's one failure fixed (the device-map test loads with
#   use_kernels=False: 5.25's from_pretrained looked up fla's hub kernels, offline), then transformers 5.25's own
#   speculation against ours on the Qwen3.5-like model at batch 1 (run 159 gave each model 60 s, too few).
if [ "$STAGE" = 2 ]; then
  rm -rf /tmp/tf525 && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/tf525 \
    "$R"/.whl/tf525/*.whl || exit 1
  export PYTHONPATH=/tmp/tf525:/tmp/site
  rm -rf /tmp/w/t && mkdir -p /tmp/w/t && cp -r "$R/tests" "$R/examples" "$R/pyproject.toml" /tmp/w/t/
  (cd /tmp/w/t && timeout 150 python3 -m pytest -q -rs -p no:cacheprovider tests/test_gpu.py -k "device_map or kernelized or hub_layer" \
    tests/test_hub_kernels.py > "$RES/test_gpu_device_map.txt" 2>&1)
  echo "test_gpu_device_map rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
  bench_job 240 speculative_qwen3_5 generate --models qwen3_5 --speculative --prompt 512 --new 64 --repeats 1 \
    --prompt-kinds code-edit,summary --out "$RES/speculative_qwen3_5.json"; pack
  tail -n 4 "$RES/test_gpu_device_map.txt"; tail -n 20 "$RES/speculative_qwen3_5.txt"
fi
