#!/usr/bin/env bash
# Fifteenth session, call 5: the GPT-2 rows in one call: gpt2_124m (SDPA) and transformers' GPT2LMHeadModel, then
# gpt2_ramla_124m on fused.
set -uo pipefail
OUT=${OUT:-/tmp/out}
python3 -m pip install -q --no-index --no-deps --target /tmp/site .carry/whl/*.whl 2>/dev/null || exit 1
export PYTHONPATH=/tmp/site:. TRITON_CACHE_DIR=/tmp/tcache PYTHONUNBUFFERED=1 HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)"
S=$SECONDS
python3 scripts/bench_throughput.py --configs gpt2_124m --backends naive,peer --no-peer --warmup 3 --steps 10 \
  --row-timeout 200 --deadline 260 --out $OUT/gpt2 > $OUT/gpt2.log 2>&1; echo "gpt2 rc=$? $((SECONDS-S)) s"
python3 scripts/bench_throughput.py --configs gpt2_ramla_124m --backends fused --no-peer --warmup 3 --steps 10 \
  --row-timeout $((500-SECONDS)) --deadline $((510-SECONDS)) --out $OUT/ramla > $OUT/ramla.log 2>&1
echo "ramla rc=$? $((SECONDS-S)) s"
cat $OUT/gpt2/*.md $OUT/ramla/*.md | grep "^|" | cut -c1-220
