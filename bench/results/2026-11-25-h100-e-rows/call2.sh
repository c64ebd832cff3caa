#!/usr/bin/env bash
# Fourteenth session, call 2: tests/ops and tests/test_train.py on the H100 at HEAD (after the registry and
# backends_under_test changes of b03d492), each test named; then mamba2_370m naive at micro-batch 4.
set -uo pipefail
OUT=${OUT:-/tmp/out}
python3 -m pip install -q --no-index --no-deps --target /tmp/site .carry/whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:. TRITON_CACHE_DIR=/tmp/tcache PYTHONUNBUFFERED=1 HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1
mkdir -p ../shared && ln -sfn "$PWD/.carry/data" ../shared/data
S=$SECONDS
timeout 480 python3 -m pytest -n 8 -v -p no:cacheprovider --timeout=300 --durations=15 tests/ops tests/test_train.py \
  > "$OUT/pytest-ops.log" 2>&1
echo "pytest rc=$? $((SECONDS-S)) s"; grep -E "passed|failed|FAILED|ERROR" "$OUT/pytest-ops.log" | tail -15
grep -c PASSED "$OUT/pytest-ops.log"
R=$((575-SECONDS)); if [ $R -gt 50 ]; then
python3 scripts/bench_throughput.py --configs mamba2_370m --backends naive --no-peer --batch 4 --warmup 2 --steps 6 \
  --row-timeout $R --deadline $R --out $OUT/n4 > $OUT/n4.log 2>&1; echo "naive B4 rc=$?"; grep "^| mamba" $OUT/n4/*.md | cut -c1-200
fi
