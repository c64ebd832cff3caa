#!/usr/bin/env bash
# Is this checkout right on this GPU? The op and model tests at full shapes, then what the flags add; a short
# table last. Kernels that pass under the CPU interpreter can still be wrong on a GPU (Triton miscompiles on
# Hopper), so every kernel, gradients included, is checked against naive here too.
#
#   bash scripts/gpu_check.sh --out /tmp/out                               # tests/ops and tests/model
#   bash scripts/gpu_check.sh --out /tmp/out --fla wheels/ --bench "--quick --ops gla,ssd,gated_delta"
#   bash scripts/gpu_check.sh --out /tmp/out --tests tests/ops/test_gla.py -k bf16 --throughput gla_125m
#
# Steps, each logged to OUT/<step>.log and timed; the exit status is 1 if any failed:
#   env         nvidia-smi, torch / triton / fla versions
#   wheels      with --fla DIR: pip install --no-index --no-deps --target SITE DIR/*.whl (flash-linear-attention's
#               wheels, fla-core and flash-linear-attention, and anything else the folder holds), SITE then on
#               PYTHONPATH; the tests' fla comparisons run from then on, and bench_ops.py times fla's rows
#   tests       python -m pytest -q -ra -m "not slow" -n WORKERS TESTS [-k EXPR], TRITON_CACHE_DIR set
#   bench       with --bench ARGS: python scripts/bench_ops.py ARGS --out OUT/bench (checked, then timed)
#   throughput  with --throughput CONFIGS: python scripts/bench_throughput.py --configs CONFIGS --backends
#               TP_BACKENDS --warmup 2 --steps 5 (and each config's peer row) --out OUT/throughput
#
# Flags:
#   --out DIR            logs and results (default /tmp/gpu_check)
#   --tests PATHS        test paths, space-separated in one argument (default "tests/ops tests/model")
#   -k EXPR              pytest's -k
#   --workers N          pytest-xdist workers (default 4; 0: no xdist)
#   --no-tests           skip the tests
#   --fla DIR            install the wheels in DIR first (fla's, for the fla comparisons)
#   --site DIR           where --fla installs (default /tmp/chunkfuse-site)
#   --bench ARGS         run scripts/bench_ops.py with ARGS (one argument)
#   --throughput CONFIGS comma-separated configs for scripts/bench_throughput.py
#   --tp-backends LIST   its backends (default fused)
#   --timeout S          seconds for each step (default 540)
#   --triton-cache DIR   TRITON_CACHE_DIR (default /tmp/chunkfuse-triton: one compile cache for every step)
#   -h, --help           this text
# Environment: PYTHON, the interpreter every step runs (default python3)
set -uo pipefail
cd "$(dirname "$0")/.."

usage() { sed -n '2,/^set /p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }

OUT=/tmp/gpu_check TESTS="tests/ops tests/model" K="" WORKERS=4 RUN_TESTS=1 FLA="" SITE=/tmp/chunkfuse-site
BENCH="" THROUGHPUT="" TP_BACKENDS=fused TIMEOUT=540 CACHE=/tmp/chunkfuse-triton
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT=$2; shift ;;
    --tests) TESTS=$2; shift ;;
    -k) K=$2; shift ;;
    --workers) WORKERS=$2; shift ;;
    --no-tests) RUN_TESTS="" ;;
    --fla) FLA=$2; shift ;;
    --site) SITE=$2; shift ;;
    --bench) BENCH=$2; shift ;;
    --throughput) THROUGHPUT=$2; shift ;;
    --tp-backends) TP_BACKENDS=$2; shift ;;
    --timeout) TIMEOUT=$2; shift ;;
    --triton-cache) CACHE=$2; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "gpu_check.sh: unknown argument $1 (--help lists the flags)" >&2; exit 2 ;;
  esac
  shift
done
mkdir -p "$OUT" "$CACHE"
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=$CACHE PYTHON=${PYTHON:-python3}
STEPS=() STATUS=0

# step NAME COMMAND...: runs COMMAND with the step's timeout, its output to OUT/NAME.log; records a table row
step() {
  local name=$1; shift
  local t0=$SECONDS rc
  echo "== $name: $*"
  timeout -s INT "$TIMEOUT" "$@" > "$OUT/$name.log" 2>&1
  rc=$?
  local what=ok
  [ $rc -eq 0 ] || { what="FAILED (exit $rc$([ $rc -eq 124 ] && echo ', timed out'))"; STATUS=1; }
  tail -n 3 "$OUT/$name.log"
  STEPS+=("$(printf '%-11s %-28s %6ss   %s' "$name" "$what" "$((SECONDS - t0))" "$OUT/$name.log")")
}

step env bash -c 'nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; "$PYTHON" -c "
import torch, triton
try:
    import fla; v = fla.__version__
except ImportError:
    v = None
print(\"torch\", torch.__version__, \"triton\", triton.__version__, \"fla\", v, \"cuda\", torch.cuda.is_available())"'
if [ -n "$FLA" ]; then
  step wheels "$PYTHON" -m pip install -q --no-index --no-deps --target "$SITE" "$FLA"/*.whl
  export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
fi
if [ -n "$RUN_TESTS" ]; then
  XDIST=(); [ "$WORKERS" != 0 ] && XDIST=(-n "$WORKERS")
  # shellcheck disable=SC2086  (TESTS is a space-separated list of paths)
  step tests "$PYTHON" -m pytest -q -ra -m "not slow" "${XDIST[@]}" $TESTS ${K:+-k "$K"}
fi
if [ -n "$BENCH" ]; then
  # shellcheck disable=SC2086  (BENCH is bench_ops.py's arguments)
  step bench "$PYTHON" scripts/bench_ops.py $BENCH --out "$OUT/bench"
fi
if [ -n "$THROUGHPUT" ]; then
  step throughput "$PYTHON" scripts/bench_throughput.py --configs "$THROUGHPUT" --backends "$TP_BACKENDS" \
    --warmup 2 --steps 5 --row-timeout $((TIMEOUT / 2)) --deadline $((TIMEOUT - 30)) --out "$OUT/throughput"
fi

echo
echo "step        status                         time   log"
printf '%s\n' "${STEPS[@]}"
[ -n "$RUN_TESTS" ] && grep -E "^(FAILED|ERROR)|[0-9]+ (passed|failed)" "$OUT/tests.log" | tail -n 12
exit $STATUS
