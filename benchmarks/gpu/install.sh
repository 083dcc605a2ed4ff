# Sourced at the start of every call on the GPU machine, from the repository root, with ".whl" carried (fetched by
# benchmarks/gpu/fetch_wheels.sh): the wheels into /tmp/fla (fla, einops) and /tmp/site (lm-eval and the rest), and
# hf_replayssm built from the travelling checkout into /tmp/site. Run the package from outside the checkout (cd /tmp/w):
# the checkout's bare hf_replayssm folder lacks the kernels and eval subpackages that the installed copy maps in.
# A warm machine keeps /tmp between calls: wheels are reinstalled only when the carried set changed, the package always.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # the device tool asks for these
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export R=$PWD
wheels=$(ls .whl/fla/*.whl .whl/lmeval/*.whl 2>/dev/null | sort | md5sum | cut -c1-12)
if [ "$(cat /tmp/site/.wheels 2>/dev/null)" != "$wheels" ]; then
  rm -rf /tmp/site /tmp/fla
  if ls .whl/fla/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/fla .whl/fla/*.whl || return 1
  fi
  if ls .whl/lmeval/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/lmeval/*.whl || return 1
  fi
  mkdir -p /tmp/site && echo "$wheels" > /tmp/site/.wheels
fi
rm -rf /tmp/site/hf_replayssm /tmp/site/hf_replayssm-*.dist-info
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --no-cache-dir --upgrade \
  --target /tmp/site "$R" 2>&1 | grep -v -i warning | tail -3
# fla on the path for the stock fla arms; leave /tmp/fla out (PYTHONPATH=/tmp/site) where a CPU reference runs inside a
# GPU process: transformers' GDN layers call fla's Triton kernels whenever fla imports, CPU tensors included.
export PYTHONPATH=/tmp/site:/tmp/fla PATH=/tmp/site/bin:$PATH
mkdir -p /tmp/w
# Triton's kernel cache across machines: each call starts a fresh machine, whose first process spends 50-90 s
# compiling our kernels (runs 69-72). A cache tarball a call saved (save_triton_cache, $OUT/triton_cache.tgz*) and the
# next call carries (.triton_cache/cache.tgz, git-ignored) is unpacked here; entries are keyed by kernel source,
# Triton and CUDA versions and the GPU, so a changed kernel just compiles again.
export TRITON_CACHE_DIR=/tmp/triton_cache
if [ -f "$R/.triton_cache/cache.tgz" ] && [ ! -d "$TRITON_CACHE_DIR" ]; then
  mkdir -p "$TRITON_CACHE_DIR" && tar xzf "$R/.triton_cache/cache.tgz" -C "$TRITON_CACHE_DIR" \
    && echo "triton cache: $(ls "$TRITON_CACHE_DIR" | wc -l) entries carried in"
fi
save_triton_cache() {  # $OUT/triton_cache.tgz, split into 15 MB parts (.part-aa, -ab, ...) when it is larger: a call
  # brings back 16 MiB a file and 8 files, a call carries 64 MiB, so at most 3 parts (45 MB) go back
  [ -d "$TRITON_CACHE_DIR" ] || return 0
  tar czf /tmp/triton_cache.tgz -C "$TRITON_CACHE_DIR" . && local size=$(stat -c %s /tmp/triton_cache.tgz)
  if [ "$size" -lt 15000000 ]; then
    cp /tmp/triton_cache.tgz "$OUT/triton_cache.tgz"
  elif [ "$size" -lt 45000000 ]; then
    split -b 15000000 /tmp/triton_cache.tgz "$OUT/triton_cache.tgz.part-"
  fi
  echo "triton cache: $(ls "$TRITON_CACHE_DIR" | wc -l) entries, $size bytes compressed"
}
session_results() {  # session_results NAME: a fresh $RES for this STAGE's files; pack() puts them into
  # $OUT/NAME_$STAGE.tgz (call it after each job: what a cut call wrote still comes back)
  RES=/tmp/w/res_${1}_$STAGE; rm -rf "$RES"; mkdir -p "$RES"; PACK=$OUT/${1}_$STAGE.tgz
}
pack() { tar czf "$PACK" -C "$RES" . ; }
carried_wheels() {  # carried_wheels NAME: the wheels carried in .whl/NAME (fetch_wheels.sh NAME) into /tmp/NAME, once
  # per machine; put /tmp/NAME first on PYTHONPATH (TEST_PYTHONPATH for test_job) to use them
  [ -d "/tmp/$1" ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "/tmp/$1" \
    "$R"/.whl/"$1"/*.whl
}
show_tests() {  # the test jobs' summaries and failures so far
  tail -n 3 "$RES"/test_*.txt; grep -h "^FAILED\|Error" "$RES"/test_*.txt | head -20
}
shaped_prompt() {  # shaped_prompt MODEL: the prompt length every compiled run of a shaped model used (Nemotron-H-like
  # 128: its stock torch prefill of 512 tokens runs out of memory, README; the others 512)
  [ "$1" = nemotron_h ] && echo 128 || echo 512
}
bench_job() {  # bench_job SECONDS NAME ARGS...: one `hf-replayssm bench ARGS` with a time limit, into $RES/NAME.txt
  local limit=$1 name=$2; shift 2
  timeout "$limit" python3 -m hf_replayssm.cli bench "$@" > "$RES/$name.txt" 2>&1
  echo "$name rc=$? $(date +%T)" | tee -a "$RES/done.txt"
}
paired_b1_job() {  # paired_b1_job SECONDS MODEL REPEATS: compiled batch-1 generate, stock static cache against
  # ReplayCache, REPEATS interleaved repeats, into $RES/generate_compiled_MODEL_b1_rREPEATS.{txt,json}, packed
  local name=generate_compiled_$2_b1_r$3
  bench_job "$1" "$name" generate --models "$2" --batches 1 --arms stock-static-compiled,replay-compiled \
    --prompt "$(shaped_prompt "$2")" --new 128 --repeats "$3" --out "$RES/$name.json"; pack
}
tiny_split_jobs() {  # tiny_split_jobs MODEL...: host_split.py --tiny at batch 1 (six repeats), with and without
  # Dynamo's guard check, per model, into $RES/host_split_tiny_MODEL_b1[_noguards].{txt,json}, packed
  local model guards name
  for model in "$@"; do
    for guards in "" --skip-guards; do
      name=host_split_tiny_${model}_b1${guards:+_noguards}
      timeout 100 python3 "$R/benchmarks/offline/host_split.py" --tiny --models "$model" --prompt 64 --new 64 \
        --repeats 6 $guards --out "$RES/$name.json" > "$RES/$name.txt" 2>&1
      echo "$name rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
      grep -v "^ *$" "$RES/$name.txt" | tail -n 4
    done
  done
}
script_job() {  # script_job SECONDS NAME SCRIPT ARGS...: benchmarks/gpu/SCRIPT with a time limit, into $RES/NAME.txt
  local limit=$1 name=$2 script=$3; shift 3
  timeout "$limit" python3 "$R/benchmarks/gpu/$script" "$@" > "$RES/$name.txt" 2>&1
  echo "$name rc=$? $(date +%T)" | tee -a "$RES/done.txt"
}
test_job() {  # test_job SECONDS NAME PYTEST-ARGS...: pytest from a copy of tests/ (the checkout's bare hf_replayssm
  # folder would shadow the installed package), fla off the path (CPU references run inside these processes)
  local limit=$1 name=$2; shift 2
  rm -rf /tmp/w/t && mkdir -p /tmp/w/t && cp -r "$R/tests" "$R/pyproject.toml" /tmp/w/t/
  (cd /tmp/w/t && PYTHONPATH=${TEST_PYTHONPATH:-/tmp/site} timeout "$limit" python3 -m pytest -q -p no:cacheprovider "$@" \
    > "$RES/$name.txt" 2>&1)
  echo "$name rc=$? $(date +%T)" | tee -a "$RES/done.txt"
}
ncu_job() {  # ncu_job SECONDS NAME NCU_KERNELS_ARGS...: Nsight Compute's counters of ncu_kernels.py's arms, as csv
  # into $RES/NAME.csv (the calling script's results folder; its pack() runs after)
  local limit=$1 name=$2; shift 2
  local ncu; ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  timeout "$limit" "$ncu" --clock-control none --profile-from-start off --set detailed --section WarpStateStats \
    --section SchedulerStats -o "$RES/$name" \
    python3 "$R/benchmarks/gpu/ncu_kernels.py" "$@" --no-time > "$RES/${name}_run.txt" 2>&1
  local rc=$?  # the profiled run's status (the export's follows it)
  timeout 30 "$ncu" --import "$RES/$name.ncu-rep" --page details --csv > "$RES/$name.csv" 2>&1
  rm -f "$RES/$name.ncu-rep"
  echo "$name rc=$rc $(date +%T)" | tee -a "$RES/done.txt"; pack
}
