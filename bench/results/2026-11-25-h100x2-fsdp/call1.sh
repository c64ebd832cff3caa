#!/usr/bin/env bash
# Eighteenth session, call 1 (nvidia-h100-x2): FSDP2 on two GPUs, never run before.
#  1. scaling: gdn_340m fused, FSDP on 1 GPU (grad_accum 4) against FSDP on 2 GPUs (grad_accum 2), 40 steps
#  2. FSDP on 2 GPUs: checkpoint, crash, resume bit for bit, evaluate the gathered model.safetensors (gla_125m)
#  3. if time is left: gla_340m's one-GPU floor (8x4 against 4x8 on GPU 0 and 1 at once), which DDP's gap lacked
set -uo pipefail
OUT=${OUT:-/tmp/out}; T0=$SECONDS
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvidia-smi -L; python3 -c "import torch, accelerate, triton; print(torch.__version__, accelerate.__version__, triton.__version__)"
ACCEL=configs/accelerate/fsdp.yaml OUT=$OUT/fsdp_gdn340m RUN_TIMEOUT=200 \
  bash scripts/gpu_scaling.sh configs/gdn_340m.yaml fused 40
echo "[step 1 done at $((SECONDS-T0)) s]"
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tcache HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1
D=.carry/data S=/tmp/pydocs-split
A="--config configs/gla_125m.yaml --backend fused --data.source=local:$S --data.eval_source=local:$D/wikitext-103-eval
 --data.tokenizer_file=$D/tokenizers/gpt2.tiktoken --data.cache_dir=/tmp/dc --train.out_dir=/tmp/runs
 --train.progress=false --train.micro_batch_size=4 --train.grad_accum=1 --optim.warmup_steps=10
 --train.log_interval=5 --train.eval_interval=20 --train.eval_batches=2 --train.ckpt_interval=20 --train.max_steps=40"
L="accelerate launch --config_file configs/accelerate/fsdp.yaml --num_processes 2"
timeout 150 $L train.py $A --train.name=full > "$OUT/fsdp2_train.log" 2>&1; echo "fsdp2 full rc=$?"
ls /tmp/runs/full/checkpoints/step_00000040 | tr '\n' ' '; echo
cp -r /tmp/runs/full /tmp/runs/crashed && rm -rf /tmp/runs/crashed/checkpoints/step_00000040
echo step_00000020 > /tmp/runs/crashed/checkpoints/latest
timeout 120 $L train.py $A --train.name=crashed --resume >> "$OUT/fsdp2_train.log" 2>&1; echo "fsdp2 resume rc=$?"
python3 - <<'PY'
import json
rows = lambda n: [json.loads(l) for l in open(f"/tmp/runs/{n}/metrics.jsonl")]
key = lambda r: (r["step"], r.get("loss"), r.get("grad_norm"), r.get("val_loss"))
a, b = [key(r) for r in rows("full")], [key(r) for r in rows("crashed")]
print("resumed rows equal the uninterrupted run's:", a == b, len(a), "rows; last", a[-1])
from safetensors import safe_open
with safe_open("/tmp/runs/full/checkpoints/step_00000040/model.safetensors", "pt") as f:
    n = sum(f.get_slice(k).get_shape().numel() if hasattr(f.get_slice(k).get_shape(), "numel") else
            __import__("math").prod(f.get_slice(k).get_shape()) for k in f.keys())
    print("gathered model.safetensors:", len(list(f.keys())), "tensors,", n, "parameters")
PY
mkdir -p $OUT/fsdp2_full && cp /tmp/runs/full/metrics.jsonl /tmp/runs/full/run.json $OUT/fsdp2_full/
cp /tmp/runs/crashed/metrics.jsonl $OUT/fsdp2_full/metrics_resumed.jsonl
timeout 120 python3 eval/perplexity.py --ckpt /tmp/runs/full --split test --data.cache_dir=/tmp/dc > "$OUT/eval.log" 2>&1
echo "eval rc=$?"; grep -E "token_ppl|word_ppl|wrote|rror" "$OUT/eval.log" | tail -5
rm -rf /tmp/runs
echo "[step 2 done at $((SECONDS-T0)) s]"
if [ $((SECONDS-T0)) -lt 400 ]; then
  F="--config configs/gla_340m.yaml --backend fused --train.max_steps=60 --train.log_interval=1
   --train.eval_interval=1000000 --train.eval_batches=4 --train.ckpt_interval=1000000 --train.progress=false
   --train.out_dir=/tmp/floor --optim.warmup_steps=10 --data.source=local:$S --data.eval_source=local:$S
   --data.tokenizer_file=$D/tokenizers/gpt2.tiktoken --data.cache_dir=/tmp/data_cache"
  CUDA_VISIBLE_DEVICES=0 timeout 150 python3 train.py $F --train.name=mb8x4 --train.micro_batch_size=8 \
    --train.grad_accum=4 > $OUT/floor_8x4.log 2>&1 &
  CUDA_VISIBLE_DEVICES=1 timeout 150 python3 train.py $F --train.name=mb4x8 --train.micro_batch_size=4 \
    --train.grad_accum=8 > $OUT/floor_4x8.log 2>&1 &
  wait
  for r in mb8x4 mb4x8; do mkdir -p $OUT/floor/$r; cp /tmp/floor/$r/metrics.jsonl /tmp/floor/$r/run.json $OUT/floor/$r/; done
  python3 scripts/compare_scaling.py $OUT/floor/mb8x4 $OUT/floor/mb4x8 --out $OUT/floor/floor.md && cat $OUT/floor/floor.md
fi
echo "[all done at $((SECONDS-T0)) s]"
