#!/usr/bin/env bash
# The slow test files and the files a change touched, each test named (-v), on a GPU; then train.py's resume
# paths with the fused backend (bit-for-bit resume, a refused setting change, Ctrl-C) and an evaluation.
# Expects .carry/whl (datasets, dill, multiprocess, fla wheels) and .carry/data (../shared/data).
set -uo pipefail
OUT=${OUT:-/tmp/out}
python3 -m pip install -q --no-index --no-deps --target /tmp/site .carry/whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:. TRITON_CACHE_DIR=/tmp/tcache PYTHONUNBUFFERED=1 HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1
mkdir -p ../shared && ln -sfn "$PWD/.carry/data" ../shared/data
git log --oneline -1 | cut -c1-80
timeout 320 python3 -m pytest -n 8 -v -p no:cacheprovider --timeout=300 --durations=25 tests/test_train.py \
  tests/test_parity.py tests/test_multiprocess.py tests/eval tests/test_bench_throughput.py tests/test_cli.py \
  tests/ops/test_registry.py tests/test_config.py tests/test_bench_kernels.py tests/test_bench_ramla.py \
  tests/test_bench_state.py tests/test_grad_conditioning.py tests/test_memory_breakdown.py tests/test_compare_scaling.py \
  tests/test_scaling_table.py > "$OUT/pytest-changed.log" 2>&1
echo "pytest rc=$?"; grep -E "passed|failed|FAILED|ERROR" "$OUT/pytest-changed.log" | tail -15
D=.carry/data
A="--config configs/gla_125m.yaml --backend fused --data.source=local:$D/pydocs-train
 --data.eval_source=local:$D/wikitext-103-eval --data.tokenizer_file=$D/tokenizers/gpt2.tiktoken --data.cache_dir=/tmp/dc
 --train.out_dir=/tmp/runs --train.progress=false --train.micro_batch_size=4 --train.grad_accum=1
 --optim.warmup_steps=10 --train.log_interval=5 --train.eval_interval=20 --train.eval_batches=2 --train.ckpt_interval=20
 --train.max_steps=40"
python3 train.py $A --train.name=full > "$OUT/train.log" 2>&1; echo "full rc=$?"
cp -r /tmp/runs/full /tmp/runs/crashed && rm -rf /tmp/runs/crashed/checkpoints/step_00000040
echo step_00000020 > /tmp/runs/crashed/checkpoints/latest
python3 train.py $A --train.name=crashed --resume >> "$OUT/train.log" 2>&1; echo "resume rc=$?"
python3 - <<'PY'
import json
rows = lambda n: [json.loads(l) for l in open(f"/tmp/runs/{n}/metrics.jsonl")]
key = lambda r: (r["step"], r.get("loss"), r.get("grad_norm"), r.get("val_loss"))
a, b = [key(r) for r in rows("full")], [key(r) for r in rows("crashed")]
print("resumed rows equal the uninterrupted run's:", a == b, len(a), "rows; last", a[-1])
PY
python3 train.py $A --train.name=full --train.seed=5 --resume >> "$OUT/train.log" 2>&1; echo "changed seed rc=$? (want 1)"
timeout --preserve-status -s INT 75 python3 train.py $A --train.name=int --train.max_steps=5000 >> "$OUT/train.log" 2>&1; echo "ctrl-c rc=$? (want 130)"
grep -E "^error|resume:|nothing to train" "$OUT/train.log"
python3 eval/perplexity.py --ckpt /tmp/runs/full --split test --data.cache_dir=/tmp/dc > "$OUT/eval.log" 2>&1
echo "eval rc=$?"; grep -E "token_ppl|word_ppl|wrote" "$OUT/eval.log"
