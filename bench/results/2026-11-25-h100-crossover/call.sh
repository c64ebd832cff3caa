#!/usr/bin/env bash
# Sixteenth session, call 2 (call 1 spent its 400 s in fla's autotuning, no row): softmax attention against the linear mixers over T (DESIGN §5's crossover).
set -uo pipefail
OUT=${OUT:-/tmp/out}
python3 -m pip install -q --no-index --no-deps --target /tmp/site .carry/whl/*.whl 2>/dev/null || exit 1
export PYTHONPATH=/tmp/site:. TRITON_CACHE_DIR=/tmp/tcache PYTHONUNBUFFERED=1
python3 -c "import torch, triton, fla; print('torch', torch.__version__, 'triton', triton.__version__, 'fla', fla.__version__)"
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
S=$SECONDS
timeout 290 python3 scripts/bench_crossover.py --backends fused --out $OUT > $OUT/crossover.log 2>&1; echo "rc=$? $((SECONDS-S)) s"
grep "^T " $OUT/crossover.log | cut -c1-150
cat $OUT/*-crossover.md | grep "^|" | cut -c1-220
