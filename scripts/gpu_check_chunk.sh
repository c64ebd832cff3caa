#!/usr/bin/env bash
# The chunk backend on the GPU: ops tests at small and full shapes (bf16), model-level equivalence
# (EQUIV=configs), parity runs (PARITY=1), then the kernel benchmark.
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
  timeout 300 python3 -m pytest -q -ra ${TEST_PATHS:-tests/ops} ${TEST_K:+-k "$TEST_K"} 2>&1 | tee "$OUT/pytest_ops.log" | tail -12
fi
if [ -n "${EQUIV:-}" ]; then    # model-level loss/logits/gradients of chunk and fla vs the fp32 naive model
  for cfg in $EQUIV; do
    timeout 200 python3 -c "import sys, runpy
import fla.ops.common.chunk_o as c; c.TRITON_ABOVE_3_7_1 = True   # fla's backward: diagnostic only (GPU.md)
runpy.run_module('eval.equivalence', run_name='__main__')" --config "$cfg" --backends chunk,fla 2>&1 | tee -a "$OUT/equivalence.log"
  done
fi
if [ -n "${PARITY:-}" ]; then   # the same gla_125m run per backend: 200 steps, same seed, init and data
  D=.carry/data
  for be in ${PARITY_BACKENDS:-naive chunk fla}; do
    # fla refuses its backward on Hopper with Triton < 3.7.1; lift that for this diagnostic run only
    timeout 300 python3 -c "import sys, runpy
if '$be' == 'fla':
    import fla.ops.common.chunk_o as c; c.TRITON_ABOVE_3_7_1 = True
sys.argv = ['train.py'] + sys.argv[1:]; runpy.run_path('train.py', run_name='__main__')" \
      --config configs/gla_125m.yaml --backend $be --train.name=parity_$be \
      --data.source=local:$D/pydocs-train --data.eval_source=local:$D/wikitext-103-eval \
      --data.tokenizer_file=$D/tokenizers/gpt2.tiktoken --data.cache_dir=/tmp/data_cache --train.out_dir=/tmp/runs \
      --train.progress=false --train.max_steps=200 --train.micro_batch_size=4 --train.grad_accum=1 \
      --optim.warmup_steps=20 --train.log_interval=10 --train.eval_interval=50 --train.eval_batches=16 \
      --train.ckpt_interval=0 > "$OUT/parity_$be.log" 2>&1 || echo "parity $be failed: $(tail -3 $OUT/parity_$be.log)"
    cp /tmp/runs/parity_$be/metrics.jsonl "$OUT/parity_$be.jsonl" 2>/dev/null
  done
  python3 - "$OUT" ${PARITY_BACKENDS:-naive chunk fla} <<'PY'
import json, os, sys
out, backends = sys.argv[1], sys.argv[2:]
rows = {b: [json.loads(l) for l in open(f"{out}/parity_{b}.jsonl")] for b in backends
        if os.path.exists(f"{out}/parity_{b}.jsonl")}
def series(b, key): return {r["step"]: r[key] for r in rows[b] if key in r}
for a in rows:
    for c in rows:
        if a >= c:
            continue
        for key in ("loss", "val_loss"):
            x, y = series(a, key), series(c, key)
            d = [y[s] - x[s] for s in sorted(x) if s in y]
            late = [y[s] - x[s] for s in sorted(x) if s in y and s > 100]
            print(f"{c} - {a} {key}: max |Δ| {max(map(abs, d)):.4f}, mean Δ (steps > 100) "
                  f"{sum(late) / max(1, len(late)):+.4f}, final {d[-1]:+.4f} over {len(d)} points")
for b in rows:
    print(b, "loss", [round(v, 3) for v in series(b, "loss").values()], "val", [round(v, 4) for v in series(b, "val_loss").values()])
PY
fi
timeout "${BENCH_TIMEOUT:-420}" python3 scripts/bench_kernels.py --out "$OUT" "$@" 2>&1 | tee "$OUT/bench.log" | grep -E "^ *(gla|ssd) "
# autotune results only (the compiled kernels are tens of MB): the next machine compiles the chosen config
(cd "$TRITON_CACHE_DIR" && find . -name "*.autotune.json" | tar czf "$OUT/triton_cache.tgz" -T -) && ls -la "$OUT/triton_cache.tgz"
