#!/usr/bin/env bash
# Multi-GPU scaling check of issues [E] and [K], on one machine with N GPUs (device kinds nvidia-h200-x2, -x8):
# the same model, backend and global batch on 1 GPU (grad_accum N·A) and on N GPUs under
# `accelerate launch` (grad_accum A); then scripts/compare_scaling.py writes $OUT/scaling.md:
# tokens/s per GPU (target ≥ 90% of one GPU's) and the loss curves' largest difference.
#   bash scripts/gpu_scaling.sh [CONFIG] [BACKEND] [STEPS]      # defaults: configs/gla_340m.yaml chunk 60
# NPROC=8 (default 2): the GPUs of the second run; ACCEL=configs/accelerate/fsdp.yaml (default ddp.yaml). Under
# FSDP the one-GPU run is FSDP too (accelerate launch, 1 process), so the ratio and the loss gap are the scaling's
# alone: FSDP on one GPU already differs from plain training (bf16 parameters, 0.93x its rate on the H100).
# RUN_TIMEOUT (default 120·NPROC s) bounds each run; the one-GPU run does NPROC times the other's work per step.
# SCALING_ARGS="--optim.warmup_steps=500 …": more train.py overrides for both runs (after the defaults below)
# Expects .carry/whl (datasets, dill, multiprocess) and .carry/data (the offline stand-in text and BPE).
set -uo pipefail
OUT=${OUT:-/tmp/out}
CFG=${1:-configs/gla_340m.yaml} BACKEND=${2:-chunk} STEPS=${3:-60} ACC=${ACC:-2}
NPROC=${NPROC:-2} ACCEL=${ACCEL:-configs/accelerate/ddp.yaml} RUNS=${RUNS:-/tmp/scaling}
[ "$NPROC" -ge 2 ] || { echo "NPROC must be at least 2 (the second run's GPUs), got $NPROC"; exit 2; }
LIMIT=${RUN_TIMEOUT:-$((120 * NPROC))}
ONE=(python3)             # DDP on one process is plain training
[[ $ACCEL == *ddp.yaml ]] || ONE=(accelerate launch --config_file "$ACCEL" --num_processes 1)
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .carry/whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tcache NCCL_NVLS_ENABLE=0   # NVLS off: KINDS.md
nvidia-smi --query-gpu=name --format=csv,noheader
D=.carry/data S=/tmp/pydocs-split          # the stand-in text split as scripts/gpu_check_chunk.sh splits it
mkdir -p $S && n=$(wc -l < $D/pydocs-train/train.txt)
head -n $((n * 925 / 1000)) $D/pydocs-train/train.txt > $S/train.txt
tail -n +$((n * 925 / 1000 + 1)) $D/pydocs-train/train.txt | head -n $((n * 50 / 1000)) > $S/valid.txt
tail -n +$((n * 975 / 1000 + 1)) $D/pydocs-train/train.txt > $S/test.txt
DATA=(--data.source=local:$S --data.eval_source=local:$S --data.tokenizer_file=$D/tokenizers/gpt2.tiktoken
      --data.cache_dir=/tmp/data_cache)
COMMON=(--config "$CFG" --backend "$BACKEND" --train.max_steps="$STEPS" --train.log_interval=1
        --train.eval_interval=1000000 --train.eval_batches=4 --train.ckpt_interval=1000000 --train.progress=false
        --train.out_dir=$RUNS --optim.warmup_steps=10 "${DATA[@]}" ${SCALING_ARGS:-})
rm -rf "$RUNS"
python3 -m data.prepare --config "$CFG" "${DATA[@]}" > "$OUT/prepare.log" 2>&1 || { tail -5 "$OUT/prepare.log"; exit 1; }
CUDA_VISIBLE_DEVICES=0 timeout "$LIMIT" "${ONE[@]}" train.py "${COMMON[@]}" --train.name=gpu1 \
  --train.grad_accum=$((NPROC * ACC)) > "$OUT/gpu1.log" 2>&1 || tail -5 "$OUT/gpu1.log"
timeout "$LIMIT" accelerate launch --config_file "$ACCEL" --num_processes "$NPROC" train.py "${COMMON[@]}" \
  --train.name=gpu$NPROC --train.grad_accum=$ACC > "$OUT/gpu$NPROC.log" 2>&1 || tail -5 "$OUT/gpu$NPROC.log"
for r in gpu1 gpu$NPROC; do      # the run folders' metrics, without their checkpoints (4-6 GB each at 340M)
  mkdir -p "$OUT/$r" && cp "$RUNS/$r/metrics.jsonl" "$RUNS/$r/run.json" "$OUT/$r/" 2>/dev/null
done
rm -rf "$RUNS"/*/checkpoints
python3 scripts/compare_scaling.py "$OUT/gpu1" "$OUT/gpu$NPROC" --out "$OUT/scaling.md" && cat "$OUT/scaling.md"
