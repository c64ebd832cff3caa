#!/usr/bin/env bash
# The WMMA attention kernel (issue [J]) on the GPU: build it (nvcc's -Xptxas -v report kept in $OUT),
# the tests against SDPA, then scripts/bench_wmma.py.
#   bash scripts/gpu_check_wmma.sh
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 CHUNKFUSE_EXT_DIR=/tmp/chunkfuse_ext
nvidia-smi --query-gpu=name --format=csv,noheader
# the build's ptxas report (registers, spills, shared memory): the op's own build, verbose
CHUNKFUSE_EXT_VERBOSE=1 timeout 300 python3 -c "from ops.attention.fused import extension; extension()" \
  > "$OUT/wmma_build.log" 2>&1 || { tail -30 "$OUT/wmma_build.log"; exit 1; }
grep -E "registers|spill" "$OUT/wmma_build.log"
timeout 200 python3 -m pytest -q -ra tests/ops/test_attention.py 2>&1 | tee "$OUT/pytest_wmma.log" | tail -8
timeout 200 python3 scripts/bench_wmma.py --out "$OUT/wmma" 2>&1 | tee "$OUT/bench_wmma.log" | tail -30
