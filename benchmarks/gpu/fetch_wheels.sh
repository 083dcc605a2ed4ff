#!/usr/bin/env bash
# Fetch, on the development machine (PyPI reachable), the wheels the GPU machine lacks into the git-ignored .whl/:
# fla-core + einops (stock fla arms) under .whl/fla, lm-eval 0.4.13 and what the GPU image lacks of its dependencies
# under .whl/lmeval (13 MB; three of them exist only as sdists and are built into wheels here). The GPU image holds
# torch, transformers, accelerate, pandas, pyarrow, scipy, scikit-learn, sacrebleu, aiohttp (see the device tool's
# KINDS.md); run calls then carry ".whl" (about 14 MB next to the 31 MB repository, under the 64 MiB limit).
# `fetch_wheels.sh tf525`: transformers 5.25 instead, under .whl/tf525 (benchmarks/gpu/next_session30.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .whl/fla .whl/lmeval
get() {  # a py3.12 manylinux / pure wheel, no dependencies
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$1" "$2"
}
if [ "${1:-}" = tf525 ]; then  # transformers 5.25 and what the GPU image lacks of its needs (18 MB; carry .whl/tf525 alone)
  mkdir -p .whl/tf525
  for spec in transformers==5.25.0 kernels==0.19.1 huggingface-hub==2.4.0 httpx2==2.16.2 httpcore2==2.16.2 \
      tomlkit==0.15.3 truststore==0.10.5 click==8.5.1 idna==3.20 anyio==4.16.0; do
    get .whl/tf525 "$spec"
  done
  du -sh .whl/tf525; exit 0
fi
get .whl/fla fla-core==0.6.0
get .whl/fla einops==0.8.2
for spec in lm-eval==0.4.13 datasets==5.2.0 evaluate==0.4.6 dill==0.4.1 multiprocess==0.70.19 pytablewriter==1.2.1 \
    dataproperty==1.1.1 mbstrdecoder==1.1.5 pathvalidate==3.3.1 tabledata==1.3.5 tcolorpy==0.1.7 typepy==1.3.5 \
    chardet==6.0.0.post1 nltk==3.10.4 more-itertools==11.2.1 pytz==2026.6; do
  get .whl/lmeval "$spec"
done
for spec in rouge-score==0.1.2 sqlitedict==2.1.0 word2number==1.1; do  # sdists only
  python3 -m pip wheel -q --no-deps -w .whl/lmeval "$spec"
done
du -sh .whl/fla .whl/lmeval
