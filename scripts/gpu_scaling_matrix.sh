#!/usr/bin/env bash
# Issue [K]'s runs on one machine of N GPUs (nvidia-h200-x8: NPROC=8): for each CONFIG:BACKEND[,BACKEND…] given,
# scripts/gpu_scaling.sh under DDP, and under FSDP too for the 340M-class configs; then scripts/scaling_table.py
# gathers every pair into $OUT/scaling.{md,json,png}. A device call lasts 10 minutes at most. With NPROC=8 and
# ACC=1 a step is 131k tokens, and a 200-step pair of a 340M model takes about 6 minutes, most of it the one-GPU
# run (gla_340m: ~100k tokens/s on an H100). So give each call one pair (LAUNCHERS picks), then run
# `python scripts/scaling_table.py FOLDER` over the pair folders the calls brought back, gathered in one FOLDER.
#   NPROC=8 ACC=1 LAUNCHERS=ddp bash scripts/gpu_scaling_matrix.sh "gla_340m:fused" [STEPS]      # STEPS: 200
# LAUNCHERS: default "ddp fsdp" for the 340M-class configs, "ddp" for the others. ACC (default 2): the N-GPU
# run's gradient accumulation; the one-GPU run's is N·ACC.
set -uo pipefail
OUT=${OUT:-/tmp/out} STEPS=${2:-200} NPROC=${NPROC:-8}
[ $# -ge 1 ] || { sed -n 2,10p "$0"; exit 2; }
for spec in $1; do
  cfg=${spec%%:*}
  [ -f "configs/$cfg.yaml" ] || { echo "no configs/$cfg.yaml"; exit 2; }
  launchers=ddp
  [[ $cfg == *_340m || $cfg == *_370m ]] && launchers="ddp fsdp"
  launchers=${LAUNCHERS:-$launchers}
  backends=${spec#*:}
  for b in ${backends//,/ }; do
    for l in $launchers; do
      echo "== $cfg $b $l ($NPROC GPUs, $STEPS steps)"
      OUT="$OUT/$cfg-$b-$l" NPROC=$NPROC ACCEL="configs/accelerate/$l.yaml" \
        bash scripts/gpu_scaling.sh "configs/$cfg.yaml" "$b" "$STEPS" | tail -4
    done
  done
done
python3 scripts/scaling_table.py "$OUT" --out "$OUT/scaling"
