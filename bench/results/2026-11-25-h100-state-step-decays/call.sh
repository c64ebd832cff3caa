#!/usr/bin/env bash
# Nineteenth session, call 1 (nvidia-h100-x1): [G] the state pass from per-step decays (step_decays, cumsum in the
# kernel): the split-scan tests on the GPU, then bench_state.py at the training shape and gla125m beside fla, then
# the forward's launch configurations at the training shape.
set -uo pipefail
OUT=${OUT:-/tmp/out}; T0=$SECONDS
python3 -m pip install -q --no-index --no-deps --target /tmp/site .carry/whl/fla*.whl 2>/dev/null || exit 1
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tc
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv > $OUT/device.txt
timeout 200 python3 -m pytest -n 4 -q -p no:cacheprovider tests/ops/test_state_split.py > $OUT/pytest-state.log 2>&1
echo "pytest rc=$? at $((SECONDS-T0)) s"; tail -2 $OUT/pytest-state.log
timeout 330 python3 scripts/bench_state.py --shapes train,gla125m --segments "" --out $OUT/state > $OUT/bench.log 2>&1
echo "bench rc=$? at $((SECONDS-T0)) s"
timeout 60 python3 - > $OUT/sweep.log 2>&1 <<'PY'
import torch
from triton.testing import do_bench
from scripts.bench_state import inputs
from ops.common.chunk_h import chunk_fwd_h
q, k, v, do, b, g = inputs(16, 2048, 16, 64, 64, False, "cuda")
gb = g.to(torch.bfloat16)
for w, s in [(4, 1), (4, 2), (4, 3), (8, 1), (8, 2), (2, 1)]:
    t_step = do_bench(lambda: chunk_fwd_h(k, v, gb, None, False, 64, step_decays=True, num_warps=w, num_stages=s),
                      warmup=10, rep=50, return_mode="median")
    t_cum = do_bench(lambda: chunk_fwd_h(k, v, b, None, False, 64, num_warps=w, num_stages=s),
                     warmup=10, rep=50, return_mode="median")
    print(f"warps {w} stages {s}: step bf16 {t_step * 1e3:.1f} us, cumsum fp32 {t_cum * 1e3:.1f} us", flush=True)
PY
echo "sweep rc=$? at $((SECONDS-T0)) s"; cat $OUT/sweep.log | tail -8
cd $OUT && tar czf state.tgz state && rm -rf state; cd - > /dev/null
grep -E '^\|' $OUT/bench.log | head -40
