#!/usr/bin/env bash
# Issue [H] on a CUDA GPU, from the repo root, in under 240 s:
#   1. the proj_out tests at full shapes: bf16 fused vs the fp32 naive oracle, bounded by twice the
#      unfused chain's own bf16 error (the seed's shape, GLA-340M's and GLA-125M's layers, a ragged one)
#      and the registry/model wiring;
#   2. scripts/bench_proj.py at the seed's shape (B8 T4096 H16 V128 d2048): the unfused output side vs
#      fused (gate kernel + Triton GEMM with the residual epilogue) and the same with cuBLAS for the
#      forward GEMM (mm + add; addmm with fp32 out_dtype where torch has it), fwd and fwd+bwd,
#      analytical HBM bytes, saved and peak memory → $OUT/proj/proj.{md,json,png}.
#   Budget: the tests autotune the GEMM (≤ 6 configs) once per (d, H·V) of the four shapes; the bench
#   reuses those compiled kernels through TRITON_CACHE_DIR.
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
timeout 150 python3 -m pytest -q -rs tests/ops/test_proj_out.py -m gpu -k "bf16_gpu" \
    > "$OUT/proj/tests.log" 2>&1 || status=1
timeout 20 python3 -m pytest -q tests/ops/test_proj_out.py -k "wiring or refused" >> "$OUT/proj/tests.log" 2>&1 || status=1
tail -n 25 "$OUT/proj/tests.log"

echo "== bench_proj.py"
timeout 60 python3 scripts/bench_proj.py --out "$OUT/proj" > "$OUT/proj/bench.log" 2>&1 || status=1
cat "$OUT/proj/bench.log"
echo "== done (status $status); results in $OUT/proj"
exit $status
