#!/usr/bin/env bash
# Forty-seventh session, after runs 224-226 (H100) put Nemotron-H-like's batch-1 host excess outside the CUDA-graph
# tree's run. STAGE=1 (run 227): the split again with the graph's own device time (``graph_gpu``), the host time
# after the launch (``after_replay``) and cProfile inside the compiled calls (--profile-dir), per model.
# STAGE=2: the call's host part split around AOT's call of the compiled graph (``before_aot``: guards, transformed
# bytecode, AOT's prologue; ``after_aot``), with the guard check and without it (--skip-guards).
# STAGE=3: guard_check.py on the tiny models, on CUDA and on the CPU, with every guard listed (--dump).
# STAGE=4: the shaped models' guard trees (TORCH_LOGS=guards); STAGE=5: the split on the tiny shapes on CUDA.
# Call: run(command="STAGE=2 bash benchmarks/gpu/next_session47.sh", timeout_s=600)
source benchmarks/gpu/install.sh || exit 1
session_results next_session47; cd /tmp/w
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$RES/device.txt"
if [ "$STAGE" = 1 ]; then
  for model in ${MODELS:-nemotron_h kimi_linear qwen3_5}; do
    timeout 170 python3 "$R/benchmarks/offline/host_split.py" --models "$model" --prompt "$(shaped_prompt "$model")" \
      --new 64 --repeats 6 --profile-dir "$RES/profile" --out "$RES/host_split_${model}_b1.json" \
      > "$RES/host_split_${model}_b1.txt" 2>&1
    echo "host_split_$model rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
    grep -v "^ *$" "$RES/host_split_${model}_b1.txt" | tail -n 30
  done
fi
if [ "$STAGE" = 2 ]; then
  for model in ${MODELS:-nemotron_h kimi_linear}; do
    for guards in "" --skip-guards; do
      name=host_split_${model}_b1${guards:+_noguards}
      timeout 140 python3 "$R/benchmarks/offline/host_split.py" --models "$model" --prompt "$(shaped_prompt "$model")" \
        --new 64 --repeats 6 $guards --out "$RES/$name.json" > "$RES/$name.txt" 2>&1
      echo "$name rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
      grep -v "^ *$" "$RES/$name.txt" | tail -n 4
    done
  done
fi
if [ "$STAGE" = 3 ]; then  # the guards of the tiny models' decode frames on CUDA and on the CPU, listed
  for device in cuda cpu; do
    timeout 200 python3 "$R/benchmarks/offline/guard_check.py" --models nemotron_h,kimi_linear --device $device \
      --blocks 40 --dump "$RES/guards_$device" --out "$RES/guard_check_$device.json" > "$RES/guard_check_$device.txt" 2>&1
    echo "guard_check_$device rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
    grep -v "falling\|Warning\|return orig" "$RES/guard_check_$device.txt" | tail -n 6
  done
fi
if [ "$STAGE" = 4 ]; then  # the shaped models' decode-frame guard trees as Dynamo logs them (TORCH_LOGS=guards)
  for model in ${MODELS:-nemotron_h kimi_linear}; do
    TORCH_LOGS=guards timeout 150 python3 "$R/benchmarks/offline/host_split.py" --models "$model" \
      --prompt "$(shaped_prompt "$model")" --new 32 --repeats 2 > "$RES/guards_$model.txt" 2>&1
    echo "guards_$model rc=$? $(date +%T)" | tee -a "$RES/done.txt"; gzip -f "$RES/guards_$model.txt"; pack
  done
fi
if [ "$STAGE" = 5 ]; then  # the batch-1 split on the tiny shapes on CUDA: is the excess before AOT's call the shapes'?
  for guards in "" --skip-guards; do
    name=host_split_tiny_nemotron_h_b1${guards:+_noguards}
    timeout 140 python3 "$R/benchmarks/offline/host_split.py" --tiny --models nemotron_h --prompt 64 --new 64 \
      --repeats 6 $guards --out "$RES/$name.json" > "$RES/$name.txt" 2>&1
    echo "$name rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
    grep -v "^ *$" "$RES/$name.txt" | tail -n 4
  done
fi
if [ "$STAGE" = 6 ]; then  # after the views / phase-constant change (fewer guards per SSM layer): tiny and shaped
  for spec in "--tiny --prompt 64 tiny" "--prompt 128 shaped"; do
    set -- $spec; label=${!#}; name=host_split_${label}_nemotron_h_b1_fewer_guards
    timeout 100 python3 "$R/benchmarks/offline/host_split.py" ${spec% *} --models nemotron_h --new 64 --repeats 6 \
      --out "$RES/$name.json" > "$RES/$name.txt" 2>&1
    echo "$name rc=$? $(date +%T)" | tee -a "$RES/done.txt"; pack
    grep -v "^ *$" "$RES/$name.txt" | tail -n 4
  done
fi
