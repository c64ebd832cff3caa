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
if [ -n "${PARITY:-}" ]; then   # the same gla_125m run on naive and chunk: 200 steps, same seed and data
  D=.carry/data
  for be in naive chunk; do
    timeout 240 python3 train.py --config configs/gla_125m.yaml --backend $be --train.name=parity_$be \
      --data.source=local:$D/pydocs-train --data.eval_source=local:$D/wikitext-103-eval \
      --data.tokenizer_file=$D/tokenizers/gpt2.tiktoken --data.cache_dir=/tmp/data_cache --train.out_dir=/tmp/runs \
      --train.progress=false --train.max_steps=200 --train.micro_batch_size=4 --train.grad_accum=1 \
      --optim.warmup_steps=20 --train.log_interval=10 --train.eval_interval=50 --train.eval_batches=8 \
      --train.ckpt_interval=0 > "$OUT/parity_$be.log" 2>&1 || echo "parity $be failed"
    cp /tmp/runs/parity_$be/metrics.jsonl "$OUT/parity_$be.jsonl" 2>/dev/null
  done
  python3 - "$OUT" <<'PY'
import json, sys
rows = {b: [json.loads(l) for l in open(f"{sys.argv[1]}/parity_{b}.jsonl")] for b in ("naive", "chunk")}
def series(b, key): return {r["step"]: r[key] for r in rows[b] if key in r}
for key in ("loss", "val_loss"):
    a, c = series("naive", key), series("chunk", key)
    d = {s: c[s] - a[s] for s in a if s in c}
    print(f"{key}: max |Δ| {max(abs(v) for v in d.values()):.4f} over {len(d)} points; final naive {a[max(a)]:.4f} chunk {c[max(c)]:.4f}")
tps = {b: [r["tokens_per_s"] for r in rows[b] if "tokens_per_s" in r][-1] for b in rows}
print("tokens/s (last interval):", {b: round(v) for b, v in tps.items()})
PY
fi
timeout "${BENCH_TIMEOUT:-420}" python3 scripts/bench_kernels.py --out "$OUT" "$@" 2>&1 | tee "$OUT/bench.log" | grep -E "^ *(gla|ssd) "
# autotune results only (the compiled kernels are tens of MB): the next machine compiles the chosen config
(cd "$TRITON_CACHE_DIR" && find . -name "*.autotune.json" | tar czf "$OUT/triton_cache.tgz" -T -) && ls -la "$OUT/triton_cache.tgz"
