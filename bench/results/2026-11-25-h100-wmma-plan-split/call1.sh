#!/usr/bin/env bash
# Seventeenth session, call 1: plan_split's shared-memory limit on the H100, then scripts/gpu_check_wmma.sh.
set -uo pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1
python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())"
bash scripts/gpu_check_wmma.sh
python3 -c "
import torch
from ops.attention import fused
print('max_smem_bytes', fused.max_smem_bytes(), 'smem', [fused.smem_bytes(s) for s in fused.SPLITS],
      'kernel_info', [fused.kernel_info(True, s)['smem_bytes'] for s in fused.SPLITS],
      'plan B1 H8 S512', fused.plan_split(1, 8, 512, False), 'plan B8 H12 S2048', fused.plan_split(8, 12, 2048, True))" 2>&1 | tee $OUT/plan.log
