#!/usr/bin/env bash
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --target /tmp/site .carry/whl/*.whl
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tcache
D=.carry/data S=/tmp/pydocs-split
mkdir -p $S && n=$(wc -l < $D/pydocs-train/train.txt)
head -n $((n * 925 / 1000)) $D/pydocs-train/train.txt > $S/train.txt
tail -n +$((n * 925 / 1000 + 1)) $D/pydocs-train/train.txt | head -n $((n * 50 / 1000)) > $S/valid.txt
tail -n +$((n * 975 / 1000 + 1)) $D/pydocs-train/train.txt > $S/test.txt
A="--data.source=local:$S --data.eval_source=local:$S --data.tokenizer_file=$D/tokenizers/gpt2.tiktoken --data.cache_dir=/tmp/data_cache"
python3 -m data.prepare --config configs/gla_125m.yaml $A > $OUT/prep.log 2>&1
for m in gla_125m gdn_125m; do
  timeout 300 python3 train.py --config configs/$m.yaml --backend naive --train.name=$m --train.out_dir=/tmp/runs --train.max_steps=200 \
    --train.eval_interval=0 --train.eval_batches=0 --train.ckpt_interval=0 --train.progress=false --train.micro_batch_size=4 \
    --train.grad_accum=1 --train.log_interval=50 $A > $OUT/train-$m.log 2>&1 &
done
wait
for m in gla_125m gdn_125m; do
  tail -2 $OUT/train-$m.log
  timeout 120 python3 -m eval.equivalence --ckpt /tmp/runs/$m --backends chunk,fused --batch 2 --seq-len 2048 2>&1 | grep -v Warn | tee $OUT/equiv-$m.log | tail -4
done
