#!/usr/bin/env bash
# Every model family on the GPU: the test suite with fla present (its reference functions are
# cross-checked there), then each full-size preset for a few bf16 steps on the offline text.
# Expects .carry/whl (datasets, dill, multiprocess, fla wheels) and .carry/data (../shared/data).
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .carry/whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1
mkdir -p ../shared && ln -sfn "$PWD/.carry/data" ../shared/data   # tests look for ../shared/data
nvidia-smi --query-gpu=name --format=csv,noheader
python3 -m pytest -q -ra -m "not slow" 2>&1 | tee "$OUT/pytest.log" | tail -6
D=.carry/data
for cfg in ${CONFIGS:-gla_125m gdn_125m mamba2_130m gpt2_124m gpt2_ramla_124m}; do
  python3 train.py --config configs/$cfg.yaml --data.source=local:$D/pydocs-train \
    --data.eval_source=local:$D/wikitext-103-eval --data.tokenizer_file=$D/tokenizers/gpt2.tiktoken \
    --data.cache_dir=/tmp/data_cache --train.out_dir=/tmp/runs --train.progress=false \
    --train.max_steps=${STEPS:-20} --train.micro_batch_size=${MB:-4} --train.grad_accum=1 --optim.warmup_steps=5 \
    --train.log_interval=10 --train.eval_interval=0 --train.eval_batches=2 --train.ckpt_interval=0 \
    > "$OUT/train_$cfg.log" 2>&1
  rc=$?
  python3 - "$cfg" "/tmp/runs/$cfg/metrics.jsonl" "$rc" <<'PY'
import json, sys
cfg, path, rc = sys.argv[1:]
rows = [json.loads(line) for line in open(path)] if rc == "0" else []
last = [r for r in rows if "loss" in r][-1:] or [{}]
val = [r["val_loss"] for r in rows if "val_loss" in r][-1:] or [None]
r = last[0]
print(f"{cfg}: rc={rc} loss={r.get('loss')} tok/s={r.get('tokens_per_s')} peak_GB={r.get('peak_mem_gb')} val_loss={val[0]}")
PY
done
