#!/usr/bin/env bash
# Fourteenth session, call 1: [E]'s missing throughput rows on the H100 (mamba2_370m naive and fla; naive for
# gla_340m and gdn_340m), each row in its own process.
set -uo pipefail
OUT=${OUT:-/tmp/out}
python3 -m pip install -q --no-index --no-deps --target /tmp/site .carry/whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:. TRITON_CACHE_DIR=/tmp/tcache PYTHONUNBUFFERED=1 HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch, triton, fla; print('torch', torch.__version__, 'triton', triton.__version__, 'fla', fla.__version__)"
S=$SECONDS
python3 scripts/bench_throughput.py --configs mamba2_370m --backends fla,naive,fused,chunk --no-peer --warmup 3 \
  --steps 10 --row-timeout 240 --deadline 330 --out $OUT/m > $OUT/m.log 2>&1; echo "mamba2 rc=$? $((SECONDS-S)) s"
python3 scripts/bench_throughput.py --configs gla_340m,gdn_340m --backends naive --no-peer --warmup 3 --steps 10 \
  --row-timeout 90 --deadline 100 --out $OUT/n8 > $OUT/n8.log 2>&1; echo "naive B8 rc=$? $((SECONDS-S)) s"
python3 scripts/bench_throughput.py --configs gla_340m,gdn_340m,mamba2_370m --backends naive,chunk --no-peer --batch 2 \
  --warmup 2 --steps 6 --row-timeout 60 --deadline $((520-SECONDS)) --out $OUT/n2 > $OUT/n2.log 2>&1
echo "naive B2 rc=$? $((SECONDS-S)) s"
for f in $OUT/m $OUT/n8 $OUT/n2; do cat $f/*.md 2>/dev/null || ls $f; done | grep "^|" | cut -c1-220
