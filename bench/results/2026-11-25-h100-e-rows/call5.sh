#!/usr/bin/env bash
# Fourteenth session, call 5: every test outside tests/ops and tests/test_train.py (call 2 ran those) on the H100.
set -uo pipefail
OUT=${OUT:-/tmp/out}
python3 -m pip install -q --no-index --no-deps --target /tmp/site .carry/whl/*.whl 2>/dev/null || exit 1
export PYTHONPATH=/tmp/site:. TRITON_CACHE_DIR=/tmp/tcache PYTHONUNBUFFERED=1 HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1
mkdir -p ../shared && ln -sfn "$PWD/.carry/data" ../shared/data
S=$SECONDS
timeout 540 python3 -m pytest -n 8 -v -p no:cacheprovider --timeout=400 --durations=10 tests --ignore=tests/ops \
  --deselect tests/test_train.py > "$OUT/pytest-rest.log" 2>&1
echo "pytest rc=$? $((SECONDS-S)) s"; grep -E "passed|failed|FAILED|ERROR" "$OUT/pytest-rest.log" | tail -12
