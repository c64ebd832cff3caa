"""The op benchmarks' library, behind scripts/bench_ops.py (and the runner scripts/bench_crossover.py shares):
the case registry (cases), each op family's runs (mixers, chains, attention), the runner (runner) and the report
(report)."""
