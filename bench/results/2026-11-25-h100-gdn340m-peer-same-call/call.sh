#!/usr/bin/env bash
# Fifteenth session, call 2: RA+MLA's bf16 tests in their committed form (bound: 2x SDPA's bf16 error + 1e-3);
# then gdn_340m fused and fla's own GatedDeltaNetForCausalLM in one call, the peer given time to autotune.
set -uo pipefail
OUT=${OUT:-/tmp/out}
python3 -m pip install -q --no-index --no-deps --target /tmp/site .carry/whl/*.whl 2>/dev/null || exit 1
export PYTHONPATH=/tmp/site:. TRITON_CACHE_DIR=/tmp/tcache PYTHONUNBUFFERED=1 HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1
mkdir -p ../shared && ln -sfn "$PWD/.carry/data" ../shared/data
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch, triton, fla; print('torch', torch.__version__, 'triton', triton.__version__, 'fla', fla.__version__)"
S=$SECONDS
timeout 150 python3 -m pytest -n 4 -v -p no:cacheprovider -k "bf16_full_shape or split_half" tests/ops/test_ramla.py \
  > "$OUT/pytest-ramla.log" 2>&1; echo "pytest rc=$? $((SECONDS-S)) s"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/pytest-ramla.log" | tail -8
python3 scripts/bench_throughput.py --configs gdn_340m --backends fused,peer --no-peer --warmup 3 --steps 10 \
  --row-timeout $((560-SECONDS)) --deadline $((570-SECONDS)) --out $OUT/g > $OUT/g.log 2>&1; echo "gdn rc=$? $((SECONDS-S)) s"
cat $OUT/g/*.md | grep "^|" | cut -c1-220
