#!/usr/bin/env bash
# The fused RA+MLA backend (issue [I]) on the GPU: op and model tests at full shapes, the attention
# benchmark (scripts/bench_ramla.py), then training throughput (THROUGHPUT=1) and parity (PARITY=1) of
# gpt2_ramla_124m through scripts/gpu_check_chunk.sh's parity protocol.
#   bash scripts/gpu_check_ramla.sh
# Expects .carry/whl (datasets, dill, multiprocess wheels) and .carry/data for parity.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
[ -d /tmp/site/datasets ] || python3 -m pip install -q --no-index --no-deps --target /tmp/site .carry/whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tcache
nvidia-smi --query-gpu=name --format=csv,noheader
if [ -z "${SKIP_TESTS:-}" ]; then
  timeout 240 python3 -m pytest -q -ra ${TEST_PATHS:-tests/ops/test_ramla.py tests/model/test_equivalence.py} -k "ramla" 2>&1 \
    | tee "$OUT/pytest_ramla.log" | tail -8
fi
[ -z "${SKIP_BENCH:-}" ] && timeout 300 python3 scripts/bench_ramla.py --heads-per-program "${HP_SWEEP-1,3,12}" ${BENCH_ARGS:-} \
  --out "$OUT/ramla" 2>&1 | tee "$OUT/bench_ramla.log" | tail -20
if [ -n "${THROUGHPUT:-}" ]; then
  timeout 300 python3 scripts/bench_throughput.py --configs gpt2_ramla_124m --backends "${TP_BACKENDS:-naive,fused}" --no-peer \
    --row-timeout 120 --out "$OUT/tp" 2>&1 | tail -6
  timeout 150 python3 scripts/bench_throughput.py --configs gpt2_124m --backends naive --no-peer \
    --row-timeout 120 --out "$OUT/tp_gpt2" 2>&1 | tail -3
fi
if [ -n "${PARITY:-}" ]; then
  SKIP_TESTS=1 SKIP_BENCH=1 PARITY=1 PARITY_CONFIGS=configs/gpt2_ramla_124m.yaml PARITY_BACKENDS=naive,fused \
    PARITY_FLOOR=1 PARITY_PARALLEL=1 bash scripts/gpu_check_chunk.sh
fi
