#!/usr/bin/env bash
# Issue [H] on a CUDA GPU, both sides of GLA's projection chain, from the repo root, in under 300 s:
#   1. the proj_out and proj_in tests at full shapes: bf16 fused vs the fp32 naive oracle, bounded by twice
#      the unfused chain's own bf16 error (the seed's shape, GLA-340M's and GLA-125M's layers, a ragged one),
#      every output and every gradient (proj_in: x and all seven weights and the bias); then the
#      registry/model wiring and the refusals;
#   2. scripts/bench_proj.py at the seed's shape (B8 T4096 d2048 H16 K=V=128, L16), both sides: unfused vs
#      fused and the cuBLAS alternatives (output side: fused-mm, fused-addmm; input side: fused-mm,
#      cublas, cublas-cat), fwd and fwd+bwd, analytical HBM bytes, saved and peak memory
#      → $OUT/proj/proj.{md,json,png} (output side) and $OUT/proj/proj_in.{md,json,png}.
#   Budget (the timeouts add up to 300 s): the tests autotune each GEMM (≤ 4-6 configs) once per width of the
#   four shapes; the bench reuses those compiled kernels through TRITON_CACHE_DIR.
#   OUT=/tmp/out bash scripts/gpu_check_proj.sh
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT/proj"
# one compile cache for both steps (the bench reuses the tests' kernels), outside $OUT
export TRITON_CACHE_DIR="${TRITON_CACHE_DIR:-/tmp/chunkfuse-triton-proj}"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/proj/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/proj/gpu.txt"

status=0
echo "== tests (GPU, full shapes)"
timeout 180 python3 -m pytest -q -rs --durations=10 tests/ops/test_proj_out.py tests/ops/test_proj_in.py -m gpu \
    -k "bf16_gpu" > "$OUT/proj/tests.log" 2>&1 || status=1
timeout 20 python3 -m pytest -q tests/ops/test_proj_out.py tests/ops/test_proj_in.py -k "wiring or refus" \
    >> "$OUT/proj/tests.log" 2>&1 || status=1
tail -n 30 "$OUT/proj/tests.log"

echo "== bench_proj.py"
timeout 100 python3 scripts/bench_proj.py --out "$OUT/proj" > "$OUT/proj/bench.log" 2>&1 || status=1
cat "$OUT/proj/bench.log"
echo "== done (status $status); results in $OUT/proj"
exit $status
