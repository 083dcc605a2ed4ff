# recall_arm.sh MODEL POLICY TASKS TAG GPU DOCS : one lm-eval recall arm, prompts through the cache one token a step
m=$1; p=$2; t=$3; tag=$4; g=$5; n=${6:-200}
out=/tmp/w/recall/$tag/small_$m/$p
mkdir -p $out
start=$(date +%s)
CUDA_VISIBLE_DEVICES=$g OMP_NUM_THREADS=2 python3 -m hf_replayssm.eval.lm_eval_plugin run --model hf-replayssm \
  --model_args pretrained=small-$m,precision=$p,buffer_len=16,prefill_chunk=1,dtype=float32 \
  --tasks $t --batch_size 800 --metadata "{\"recall_docs\": $n}" --output_path $out --log_samples > $out.log 2>&1
echo "arm $tag $m $p rc=$? $(( $(date +%s) - start ))s" | tee -a /tmp/w/arms.txt
