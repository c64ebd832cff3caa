#!/usr/bin/env bash
# The chunk backend on the GPU: ops tests at small and full shapes (bf16), then the kernel benchmark.
#   bash scripts/gpu_check_chunk.sh [bench_kernels.py args...]
# Expects .carry/whl (datasets, dill, multiprocess, fla wheels); reuses .carry/triton_cache.tgz when
# present (fla autotunes for minutes on a bare machine) and leaves the updated cache in $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .carry/whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tcache
mkdir -p "$TRITON_CACHE_DIR"
[ -f .carry/triton_cache.tgz ] && tar xzf .carry/triton_cache.tgz -C "$TRITON_CACHE_DIR"
nvidia-smi --query-gpu=name --format=csv,noheader
[ -n "${DEBUG_STAGES:-}" ] && timeout 240 python3 scripts/debug_chunk_stages.py 2>&1 | tee "$OUT/debug.log" | grep -v Warn
if [ -z "${SKIP_TESTS:-}" ]; then
  timeout 300 python3 -m pytest -q -ra tests/ops ${TEST_K:+-k "$TEST_K"} 2>&1 | tee "$OUT/pytest_ops.log" | tail -8
fi
timeout "${BENCH_TIMEOUT:-420}" python3 scripts/bench_kernels.py --out "$OUT" "$@" 2>&1 | tee "$OUT/bench.log" | grep -E "^ *(gla|ssd) "
# autotune results only (the compiled kernels are tens of MB): the next machine compiles the chosen config
(cd "$TRITON_CACHE_DIR" && find . -name "*.autotune.json" | tar czf "$OUT/triton_cache.tgz" -T -) && ls -la "$OUT/triton_cache.tgz"
