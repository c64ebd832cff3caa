#!/usr/bin/env bash
# Fourteenth session, call 4: gla_125m side by side (fused with every component, fused[chunk], chunk, fla's own model).
set -uo pipefail
OUT=${OUT:-/tmp/out}
python3 -m pip install -q --no-index --no-deps --target /tmp/site .carry/whl/*.whl 2>/dev/null || exit 1
export PYTHONPATH=/tmp/site:. TRITON_CACHE_DIR=/tmp/tcache PYTHONUNBUFFERED=1 HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1
S=$SECONDS
python3 scripts/bench_throughput.py --configs gla_125m --backends "fused,fused[chunk],chunk,peer" --no-peer --warmup 3 --steps 10 \
  --row-timeout 420 --deadline 520 --out $OUT/g > $OUT/g.log 2>&1; echo "gla_125m rc=$? $((SECONDS-S)) s"
cat $OUT/g/*.md | grep "^|" | cut -c1-200
