#!/usr/bin/env bash
# call 6: bitwise determinism of the Triton backends over poisoned memory; two identical bf16 gdn_125m chunk runs
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --target /tmp/site .carry/whl/*.whl
export PYTHONPATH=/tmp/site:. TRITON_CACHE_DIR=/tmp/tcache PYTHONUNBUFFERED=1
D=.carry/data S=/tmp/pydocs-split
mkdir -p $S && n=$(wc -l < $D/pydocs-train/train.txt)
head -n $((n * 925 / 1000)) $D/pydocs-train/train.txt > $S/train.txt
tail -n +$((n * 925 / 1000 + 1)) $D/pydocs-train/train.txt | head -n $((n * 50 / 1000)) > $S/valid.txt
timeout 200 python3 -m pytest -q -ra tests/ops/test_determinism.py 2>&1 | tee $OUT/pytest_determinism.log | tail -8
A="--data.source=local:$S --data.eval_source=local:$S --data.tokenizer_file=$D/tokenizers/gpt2.tiktoken --data.cache_dir=/tmp/data_cache --train.progress=false --train.micro_batch_size=4 --train.grad_accum=1 --train.log_interval=1 --train.max_steps=40 --train.eval_interval=0 --train.ckpt_interval=0 --train.out_dir=/tmp/runs"
python3 train.py --config configs/gdn_125m.yaml --backend naive --train.name=warm $A --train.max_steps=1 > /dev/null 2>&1  # tokenise once
for b in chunk naive; do for i in 1 2; do
  python3 train.py --config configs/gdn_125m.yaml --backend $b --train.name=$b$i $A > $OUT/train-$b$i.log 2>&1 &
done; done; wait
python3 - <<'PY'
import json
def L(n): return [(d["step"], d["loss"], d["grad_norm"]) for d in map(json.loads, open(f"/tmp/runs/{n}/metrics.jsonl")) if "loss" in d]
for b in ["chunk", "naive"]:
    a, c = L(b + "1"), L(b + "2")
    diff = [s for (s, l1, g1), (_, l2, g2) in zip(a, c) if l1 != l2 or g1 != g2]
    print(b, len(a), "steps; first differing step:", diff[:1], "last:", a[-1], c[-1])
PY
