#!/usr/bin/env bash
# Issue [H] on a CUDA GPU, the projection chains of GLA, Gated DeltaNet and Mamba-2, from the repo root, in
# under 540 s:
#   1. the short-conv and LM-loss kernels' tests on CUDA (small fp32 shapes, no autotuning; the chunked loss at the
#      GPT-2 vocabulary in bf16); the proj tests at full shapes:
#      bf16 against the fp32 oracle, bounded by twice the unfused chain's own bf16 error (proj_out both
#      orderings, GLA's proj_in with every GEMM engine pair, gdn_proj_in, mamba2_proj_in), their saved-memory,
#      wiring and refusal tests; the bf16 model checks of the three families with `fused` (their chains
#      included) against naive. (The small fp32 proj cases stay on the CPU interpreter: on CUDA each new width
#      autotunes the GEMMs again, minutes in all.) -v and SIGINT: a timeout still prints which test ran last.
#   2. scripts/bench_proj.py --side in at the seed's shape (GLA's input side: the library's cuBLAS engine, the
#      Triton one, cuBLAS forward with the Triton dgrad, and the GEMMs-alone floor) → $OUT/proj/proj_in.*;
#   3. scripts/bench_proj_families.py (GDN-340M's input side, Mamba2-370M's input and output sides)
#      → $OUT/proj/proj_families.*.
#   OUT=/tmp/out bash scripts/gpu_check_proj.sh
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT/proj"
# one compile cache for every step (the benches reuse the tests' kernels), outside $OUT
export TRITON_CACHE_DIR="${TRITON_CACHE_DIR:-/tmp/chunkfuse-triton-proj}"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/proj/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/proj/gpu.txt"

status=0
echo "== tests (GPU)"
timeout -s INT 100 python3 -m pytest -v -rfs tests/ops/test_short_conv.py tests/ops/test_cross_entropy.py \
    tests/model/test_loss.py > "$OUT/proj/tests.log" 2>&1 || status=1
timeout -s INT 200 python3 -m pytest -v -rfs --durations=15 tests/ops/test_proj_out.py tests/ops/test_proj_in.py \
    tests/ops/test_gdn_proj_in.py tests/ops/test_mamba2_proj_in.py -k "bf16 or saves or wiring or refus or overflow" \
    >> "$OUT/proj/tests.log" 2>&1 || status=1
timeout -s INT 120 python3 -m pytest -v -rfs "tests/model/test_equivalence.py::test_triton_model_matches_naive_in_bf16" \
    >> "$OUT/proj/tests.log" 2>&1 || status=1
grep -E "FAILED|ERROR|passed|failed|Timeout|KeyboardInterrupt" "$OUT/proj/tests.log" | tail -n 30

echo "== bench_proj.py --side in"
timeout 90 python3 scripts/bench_proj.py --out "$OUT/proj" --side in > "$OUT/proj/bench_in.log" 2>&1 || status=1
tail -n 20 "$OUT/proj/bench_in.log"
echo "== bench_proj_families.py"
timeout 60 python3 scripts/bench_proj_families.py --out "$OUT/proj" > "$OUT/proj/bench_families.log" 2>&1 || status=1
tail -n 20 "$OUT/proj/bench_families.log"
echo "== done (status $status); results in $OUT/proj"
exit $status
