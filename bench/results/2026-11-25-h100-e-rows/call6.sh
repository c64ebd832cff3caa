#!/usr/bin/env bash
# Fourteenth session, call 6: tests/ops/test_gla.py on the H100 after the coverage audit's new GPU tests (decays at
# and past the fast-path limit, the split state scan against naive, h0 and the final state in bf16, ragged T
# through the scan) and the stronger chunk-size test.
set -uo pipefail
OUT=${OUT:-/tmp/out}
python3 -m pip install -q --no-index --no-deps --target /tmp/site .carry/whl/*.whl 2>/dev/null || exit 1
export PYTHONPATH=/tmp/site:. TRITON_CACHE_DIR=/tmp/tcache PYTHONUNBUFFERED=1
S=$SECONDS
timeout 500 python3 -m pytest -n 8 -v -p no:cacheprovider --timeout=400 --durations=10 tests/ops/test_gla.py \
  > "$OUT/pytest-gla.log" 2>&1
echo "pytest rc=$? $((SECONDS-S)) s"; grep -E "passed|failed|FAILED|ERROR|Error|assert" "$OUT/pytest-gla.log" | tail -30 | cut -c1-300
