#!/usr/bin/env bash
# Nineteenth session, call 4: test_ssd's fused T600 'large' case failed once in call 3 (h 1.22e-5 > 1e-5, random
# inputs). The same errors over 200 seeds with this session's chunk_h.py and with e905c7c's, then test_ssd.py again.
set -uo pipefail
OUT=${OUT:-/tmp/out}; export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tc
python3 .carry/ssd_seeds_gpu.py 200 new 2>&1 | tail -1
cp ops/common/chunk_h.py /tmp/new.py && cp .carry/chunk_h_old.py ops/common/chunk_h.py
python3 .carry/ssd_seeds_gpu.py 200 old 2>&1 | tail -1
cp /tmp/new.py ops/common/chunk_h.py
timeout 300 python3 -m pytest -n 6 -q -p no:cacheprovider tests/ops/test_ssd.py tests/ops/test_state_split.py \
  tests/test_bench_state.py > $OUT/pytest-ssd.log 2>&1; echo "pytest rc=$?"; tail -1 $OUT/pytest-ssd.log
