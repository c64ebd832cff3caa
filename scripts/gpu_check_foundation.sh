#!/usr/bin/env bash
# The foundation on a GPU machine: the test suite with a GPU present (fla's reference test runs
# there), a short bf16 gla_125m run on the offline data, and perplexity on WikiText-103 test.
# Expects .carry/whl (datasets, dill, multiprocess, fla wheels) and .carry/data (../shared/data).
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .carry/whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, triton, datasets, fla; print('torch', torch.__version__, 'triton', triton.__version__, 'datasets', datasets.__version__, 'fla', fla.__version__)"
mkdir -p ../shared && ln -sfn "$PWD/.carry/data" ../shared/data   # tests look for ../shared/data
python3 -m pytest -q -ra 2>&1 | tee "$OUT/pytest.log" | tail -15
D=.carry/data
python3 train.py --config configs/gla_125m.yaml --data.source=local:$D/pydocs-train \
  --data.eval_source=local:$D/wikitext-103-eval --data.tokenizer_file=$D/tokenizers/gpt2.tiktoken \
  --data.cache_dir=/tmp/data_cache --train.out_dir=/tmp/runs --train.progress=false \
  --train.max_steps=60 --train.micro_batch_size=4 --train.grad_accum=1 --optim.warmup_steps=10 \
  --train.log_interval=10 --train.eval_interval=30 --train.ckpt_interval=30 2>&1 | tee "$OUT/train.log" | tail -8
cp /tmp/runs/gla_125m/metrics.jsonl /tmp/runs/gla_125m/run.json "$OUT/" 2>/dev/null
python3 eval/perplexity.py --ckpt /tmp/runs/gla_125m --split test --data.cache_dir=/tmp/data_cache \
  --out "$OUT/eval_test.json" 2>&1 | grep -v "^ " | tail -4
python3 -c "import json, sys; r = json.load(open(sys.argv[1])); print({k: r[k] for k in ('tokens_scored', 'loss', 'token_ppl', 'word_ppl', 'bits_per_byte')})" "$OUT/eval_test.json"
grep -E '"step": (10|60),' "$OUT/metrics.jsonl"
