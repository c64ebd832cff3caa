#!/usr/bin/env bash
# call 5: mamba2_130m gradient conditioning (micro-batch 2); gdn_125m bf16 parity again (reproducibility across calls)
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --target /tmp/site .carry/whl/*.whl
export PYTHONPATH=/tmp/site:. TRITON_CACHE_DIR=/tmp/tcache PYTHONUNBUFFERED=1
D=.carry/data S=/tmp/pydocs-split
mkdir -p $S && n=$(wc -l < $D/pydocs-train/train.txt)
head -n $((n * 925 / 1000)) $D/pydocs-train/train.txt > $S/train.txt
tail -n +$((n * 925 / 1000 + 1)) $D/pydocs-train/train.txt | head -n $((n * 50 / 1000)) > $S/valid.txt
tail -n +$((n * 975 / 1000 + 1)) $D/pydocs-train/train.txt > $S/test.txt
timeout 150 python3 scripts/grad_conditioning.py --config configs/mamba2_130m.yaml --steps 6 --out $OUT/cond-mamba2_130m \
  --data.source=local:$S --data.eval_source=local:$S --data.tokenizer_file=$D/tokenizers/gpt2.tiktoken \
  --data.cache_dir=/tmp/data_cache --train.micro_batch_size=2 --train.grad_accum=1 > $OUT/cond-mamba2_130m.log 2>&1
echo "cond rc $?"; grep '"step"' $OUT/cond-mamba2_130m.log | cut -c1-160
OUT=$OUT SKIP_TESTS=1 SKIP_BENCH=1 PARITY=1 PARITY_PARALLEL=1 PARITY_TIMEOUT=570 PARITY_DEADLINE=$((585 - SECONDS)) \
  PARITY_CONFIGS="configs/gdn_125m.yaml" PARITY_BACKENDS="naive,chunk,fused" bash scripts/gpu_check_chunk.sh
