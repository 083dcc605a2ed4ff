#!/usr/bin/env bash
# Third GPU call of the forty-fourth session (about 640 s of device time left): crops after a window verified on
# device positions now commit on the device (no device read, no leave / re-enter per round). Call:
# run(command="bash benchmarks/gpu/next_session44b.sh", carry=[".whl/tf525"], timeout_s=420)
#   1. test_gpu's static-cache speculation under 5.25 (CUDA graphs; the crops now commit on the device between graph
#      replays);
#   2. tiny-gdn-copy, bf16: compiled prompt lookup against compiled greedy on a static ReplayCache (STAGE=1 of
#      next_session44.sh: 494.6 against 543.9 tok/s before);
#   3. the round profile on the Qwen3.5-like model (before: 5.84 ms a token against 2.30 for compiled greedy).
STAGE=3
source benchmarks/gpu/install.sh || exit 1
session_results next_session44; cd /tmp/w
if [ ! -d /tmp/tf525 ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/tf525 \
    "$R"/.whl/tf525/*.whl || exit 1
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$RES/device.txt"
TEST_PYTHONPATH=/tmp/tf525:/tmp/site test_job 150 test_static_speculation_tf525 -rs tests/test_gpu.py \
  -k static_cache_speculation; pack
show_tests
PYTHONPATH=/tmp/tf525:/tmp/site bench_job 110 speculative_copy_bf16 generate --speculative --models tiny-gdn-copy \
  --prompt 512 --new 256 --repeats 2 --lookup 10 \
  --speculative-arms greedy-replay,greedy-static-compiled,lookup-replay,lookup-static-compiled \
  --out "$RES/speculative_copy_bf16.json"
pack; grep -v "^ *$" "$RES/speculative_copy_bf16.txt" | tail -6
PYTHONPATH=/tmp/tf525:/tmp/site script_job 100 profile_round_qwen3_5 profile_lookup_round.py --model qwen3_5 \
  --layers 8 --prompt 512 --new 64 --out "$RES"; pack
grep "compiled {" "$RES/profile_round_qwen3_5.txt"
