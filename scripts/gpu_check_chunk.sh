#!/usr/bin/env bash
# The chunk backend on the GPU: ops tests at small and full shapes (bf16), model-level equivalence
# (EQUIV=configs), parity runs (PARITY=1, scripts/parity.py), then the kernel benchmark.
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
[ -n "${DELTA_STAGES:-}" ] && timeout 300 python3 scripts/debug_delta_stages.py $DELTA_STAGES 2>&1 | tee "$OUT/delta_stages.log" | grep -v Warn
if [ -z "${SKIP_TESTS:-}" ]; then
  timeout "${TEST_TIMEOUT:-300}" python3 -m pytest -q -ra ${TEST_PATHS:-tests/ops} ${TEST_K:+-k "$TEST_K"} 2>&1 | tee "$OUT/pytest_ops.log" | tail -12
fi
if [ -n "${EQUIV:-}" ]; then    # model-level loss/logits/gradients of chunk and fla vs the fp32 naive model
  for cfg in $EQUIV; do
    timeout 200 python3 -c "import sys, runpy
import fla.ops.common.chunk_o as c; c.TRITON_ABOVE_3_7_1 = True   # fla's backward: diagnostic only (GPU.md)
runpy.run_module('eval.equivalence', run_name='__main__')" --config "$cfg" --backends chunk,fla 2>&1 | tee -a "$OUT/equivalence.log"
  done
fi
if [ -n "${PARITY:-}" ]; then   # PARITY_CONFIG (gla_125m) per backend: 200 steps from the same init on the same data (scripts/parity.py)
  D=.carry/data
  timeout "${PARITY_TIMEOUT:-420}" python3 scripts/parity.py --config "${PARITY_CONFIG:-configs/gla_125m.yaml}" --backends "${PARITY_BACKENDS:-naive,chunk}" \
    --steps 200 --eval-interval 50 --out /tmp/parity \
    --data.source=local:$D/pydocs-train --data.eval_source=local:$D/wikitext-103-eval \
    --data.tokenizer_file=$D/tokenizers/gpt2.tiktoken --data.cache_dir=/tmp/data_cache \
    --train.progress=false --train.micro_batch_size=4 --train.grad_accum=1 --optim.warmup_steps=20 \
    --train.log_interval=10 --train.eval_batches=16 > "$OUT/parity.log" 2>&1 || echo "parity: see parity.log"
  cp /tmp/parity/parity.md /tmp/parity/parity.json /tmp/parity/parity.png "$OUT/" 2>/dev/null
  cat /tmp/parity/parity.md 2>/dev/null
fi
timeout "${BENCH_TIMEOUT:-420}" python3 scripts/bench_kernels.py --out "$OUT" "$@" 2>&1 | tee "$OUT/bench.log" | grep -E "^ *(gla|ssd|gated_delta) "
# autotune results only (the compiled kernels are tens of MB): the next machine compiles the chosen config
(cd "$TRITON_CACHE_DIR" && find . -name "*.autotune.json" | tar czf "$OUT/triton_cache.tgz" -T -) && ls -la "$OUT/triton_cache.tgz"
