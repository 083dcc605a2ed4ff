#!/usr/bin/env bash
# GPU calls of the forty-ninth session (no machine came for its first 80 minutes; one call is all the budget may buy):
# the most wanted measurements first, each packed as it ends, so a cut call still brings back what finished.
# Carry `.whl/tf525` (`bash benchmarks/gpu/fetch_wheels.sh tf525`).
# Call: run(command="STAGE=A bash benchmarks/gpu/next_session50.sh", carry=[".whl/tf525"], timeout_s=600)
# STAGE=A (about 8 minutes on a cold machine):
#   1. tiny-gdn-copy, bf16, transformers 5.25: compiled prompt lookup against compiled greedy on a static ReplayCache,
#      now that prompt lookup searches a host copy of the ids (run 224 on an H100: 1622.6 against 1024.6 tok/s, 1.58x;
#      issue 8's target 1.8x), and the eager arms;
#   2. the CUDA-graph tests of a static ReplayCache on falcon_h1 / zamba2 (ReplayStaticHybridLayer), transformers 5.25;
#   3. lookup_search.py on CUDA (transformers' search against the host copy over a real call's rounds).
# STAGE=B: the same tests on transformers 5.17, then next_session49.sh's STAGE=3 (host_split of the guard cuts).
# Ran on an H100 (runs 233-235; STAGE=B's nested call then lacked the `cd`, so STAGE=3 ran as a call of its own).
source benchmarks/gpu/install.sh || exit 1
session_results next_session50; cd /tmp/w
carried_wheels tf525 || exit 1
ARMS=greedy-replay,greedy-static-compiled,lookup-replay,lookup-static-compiled
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$RES/device.txt"
if [ "$STAGE" = A ]; then
  PYTHONPATH=/tmp/tf525:/tmp/site bench_job 200 speculative_copy_bf16 generate --speculative --models tiny-gdn-copy \
    --prompt 512 --new 256 --repeats 3 --lookup 10 --speculative-arms $ARMS --out "$RES/speculative_copy_bf16.json"
  pack; grep -v "^ *$" "$RES/speculative_copy_bf16.txt" | tail -6
  TEST_PYTHONPATH=/tmp/tf525:/tmp/site test_job 180 test_static_hybrid_cuda_tf525 -rs tests/test_gpu.py \
    -k "falcon or zamba"; pack; show_tests
  PYTHONPATH=/tmp/tf525:/tmp/site timeout 100 python3 "$R/benchmarks/offline/lookup_search.py" --device cuda \
    --out "$RES/lookup_search_cuda.json" > "$RES/lookup_search_cuda.txt" 2>&1
  echo "lookup_search rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack; tail -n 3 "$RES/lookup_search_cuda.txt"
fi
if [ "$STAGE" = B ]; then
  test_job 180 test_static_hybrid_cuda -rs tests/test_gpu.py -k "falcon or zamba"; pack; show_tests
  (cd "$R" && STAGE=3 bash benchmarks/gpu/next_session49.sh)  # from the repository root, as install.sh wants
fi
