#!/usr/bin/env bash
# The forty-sixth session's second GPU call, right after `STAGE=1 bash benchmarks/gpu/next_session45.sh` (the machine
# goes back after 30 s idle). Carry `.whl/tf525` (`bash benchmarks/gpu/fetch_wheels.sh tf525`).
# Call: run(command="bash benchmarks/gpu/next_session46.sh", carry=[".whl/tf525"], timeout_s=600)
#   1. next_session45.sh's STAGE=2 bench: tiny-gdn-copy in float32, compiled prompt lookup against compiled greedy
#      (run 223: 435.3 against 605.2 tok/s; identical tokens expected);
#   2. batch 1, where the compiled call's host excess goes (issue 8's "never slower"): host_split.py now splits the
#      compiled call's host part into the CUDA-graph tree's run (input checks, launch, outputs), the graph launch
#      alone, and the rest (Dynamo's guard check and bytecode, the AOT / Inductor wrappers). Nemotron-H-like and
#      Kimi-Linear-like (the two models still slower at batch 1), transformers 5.17 (the image's), six repeats.
source benchmarks/gpu/install.sh || exit 1
session_results next_session46; cd /tmp/w
if [ ! -d /tmp/tf525 ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/tf525 \
    "$R"/.whl/tf525/*.whl || exit 1
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$RES/device.txt"
for model in nemotron_h kimi_linear; do
  timeout 120 python3 "$R/benchmarks/offline/host_split.py" --models $model --prompt "$(shaped_prompt $model)" \
    --new 64 --repeats 6 --out "$RES/host_split_${model}_b1.json" > "$RES/host_split_${model}_b1.txt" 2>&1
  echo "host_split_$model rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
  tail -n 5 "$RES/host_split_${model}_b1.txt"
done
ARMS=greedy-replay,greedy-static-compiled,lookup-replay,lookup-static-compiled
PYTHONPATH=/tmp/tf525:/tmp/site bench_job 170 speculative_copy_fp32 generate --speculative --models tiny-gdn-copy \
  --prompt 512 --new 256 --repeats 2 --lookup 10 --dtype float32 --speculative-arms $ARMS \
  --out "$RES/speculative_copy_fp32.json"
pack; grep -v "^ *$" "$RES/speculative_copy_fp32.txt" | tail -6
