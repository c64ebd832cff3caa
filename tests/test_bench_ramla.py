"""scripts/bench_ramla.py's table: ratios against naive and SDPA, and rows that ran out of memory."""
from __future__ import annotations

from scripts.bench_ramla import to_markdown


def test_table_ratios_and_oom_rows():
    env = {"date": "2026-01-01", "device": "GPU", "torch": "t", "triton": "tr"}
    rows = [{"B": 8, "T": 2048, "variant": "naive (fp32 inside)", "check": "", "fwd_ms": 4.0, "fwdbwd_ms": 12.0, "peak_gb": 9.0, "status": "ok"},
            {"B": 8, "T": 2048, "variant": "fused", "check": "1e-03", "fwd_ms": 0.5, "fwdbwd_ms": 2.0, "graph_ms": 1.5,
             "peak_gb": 0.1, "status": "ok"},
            {"B": 8, "T": 2048, "variant": "sdpa (GPT-2 MHA)", "check": "", "fwd_ms": 0.4, "fwdbwd_ms": 1.0,
             "graph_ms": 0.75, "peak_gb": 0.1, "status": "ok"},
            {"B": 8, "T": 2048, "variant": "fused core", "check": "", "fwd_ms": 0.2, "fwdbwd_ms": 1.0, "peak_gb": 0.1,
             "status": "ok", "graph_error": "RuntimeError: operation not permitted when stream is capturing"},
            {"B": 8, "T": 8192, "variant": "naive (fp32 inside)", "check": "", "status": "OOM"},
            {"B": 8, "T": 8192, "variant": "sdpa (GPT-2 MHA)", "check": "", "fwd_ms": 1.0, "fwdbwd_ms": 4.0, "peak_gb": 0.4, "status": "ok"}]
    md = to_markdown(rows, env, "cmd")
    assert "| 8 | 2048 | fused | 0.500 | 2.000 | 1.500 | 6.00× | 2.00 | 2.00 | 0.10 | 1e-03 | ok |" in md
    assert "| 8 | 2048 | naive (fp32 inside) | 4.000 | 12.000 |  | 1.00× | 12.00 |  | 9.00 |  | ok |" in md
    assert "| 8 | 8192 | naive (fp32 inside) |  |  |  |  |  |  |  |  | OOM |" in md
    assert ("| 8 | 2048 | fused core | 0.200 | 1.000 |  | 12.00× | 1.00 |  | 0.10 |  | ok (graph: RuntimeError: "
            "operation not permitted when stream is capturing) |") in md
