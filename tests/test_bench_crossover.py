"""The crossover benchmark's report (the timing itself needs a GPU): where a linear op overtakes SDPA, the table,
the plot, and the argument checks."""
from __future__ import annotations

import math

import pytest
import torch

from scripts.bench_crossover import crossover, main, plot, to_markdown

LENGTHS = [512, 1024, 2048, 4096]


def test_crossover_is_interpolated_in_log_t_between_the_bracketing_lengths():
    base = [1.0, 1.0, 1.0, 1.0]
    # log ratio 0.405 at 1024, −0.693 at 2048: 2^(10 + 0.405 / 1.099) = 1,323
    assert crossover(LENGTHS, [2.0, 1.5, 0.5, 0.25], base) == "≈ 1,323"
    assert crossover(LENGTHS, [2.0, 2.0, 1.0 / 2, 0.1], base) == "≈ 1,448"  # ±log 2: the midpoint, 2^10.5
    assert crossover(LENGTHS, [0.9, 2.0, 2.0, 2.0], base) == "< 512"
    assert crossover(LENGTHS, [2.0, 2.0, 2.0, 1.1], base) == "> 4096"
    assert crossover(LENGTHS, [2.0, math.nan, 0.5, 0.5], base) == "≈ 1,024"   # an unmeasured length is skipped
    assert crossover(LENGTHS, [math.nan] * 4, base) == "n/a"


def rows_for(op, backend, ms, err=None):
    """Rows of one (op, backend) over LENGTHS; err: its check's error at each length (None: a reference)."""
    return [{"op": op, "backend": backend, "dims": {"T": T}, "status": "ok", "fwd_ms": m / 3, "fwdbwd_ms": m,
             **({} if err is None else {"max_rel_err": err * (1 + i)})} for i, (T, m) in enumerate(zip(LENGTHS, ms))]


def test_report_gives_ratios_to_sdpa_crossovers_and_failures(tmp_path):
    rows = (rows_for("attention", "sdpa", [1.0, 2.0, 4.0, 8.0])

            + rows_for("attention", "sdpa-fa2", [1.2, 2.4, 4.8, 9.6], 1e-4)
            + rows_for("gla", "naive", [9.0, 9.0, 9.0, 9.0]) + rows_for("gla", "fused", [2.0, 2.0, 2.0, 2.0], 1e-3)
            + [{"op": "gla", "backend": "fla", "dims": {"T": 512}, "status": "FAIL",
                "check": "FAIL: o 5.0e-01 > 5.0e-03, dq nan > 5.0e-03"}]
            + [{"op": "ssd", "backend": "fla", "dims": {"T": T}, "status": "n/a", "why": "not installed"}
               for T in LENGTHS])
    env = {"date": "2026-11-25", "device": "X", "torch": "t", "triton": "tr", "fla": "f"}
    md = to_markdown(rows, LENGTHS, 16384, env, "cmd", [])
    fused = next(line for line in md.splitlines() if line.startswith("| gla | fused |"))
    # against sdpa: 1,024 (a tie there); against sdpa-fa2 (1.2× sdpa): log ratio 0.511 at 512, −0.182 at 1024: 2^9.74
    assert fused == ("| gla | fused | 2.000 (0.50×) | 2.000 (1.00×) | 2.000 (2.00×) | 2.000 (4.00×) | ≈ 1,024 "
                     "| ≈ 853 |")
    assert "| attention | sdpa | 1.000 | 2.000 | 4.000 | 8.000 |  |  |" in md
    assert "- gla/fla at T 512: FAIL: o 5.0e-01 > 5.0e-03, dq nan > 5.0e-03" in md
    assert md.count("ssd/fla: n/a, not installed") == 1
    assert "largest relative error over the lengths: attention/sdpa-fa2 4.0e-04 against SDPA; gla/fused 4.0e-03 " \
        "against naive (the bound" in md
    assert "| gla | fla | — | — | — | — | n/a | n/a |" in md
    plot(rows, LENGTHS, tmp_path / "c.png")
    assert (tmp_path / "c.png").stat().st_size > 1000


def test_arguments_are_checked_before_any_gpu_work(capsys):
    with pytest.raises(SystemExit):
        main(["--tokens", "1000", "--lengths", "512"])
    assert "not a multiple of T = 512" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--ops", "gla,mamba"])
    assert "unknown op(s) mamba" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--backends", "fuse"])
    assert "unknown backend(s) fuse" in capsys.readouterr().err
    for bad in ("512,", "0"):
        with pytest.raises(SystemExit):
            main(["--lengths", bad])
        assert "--lengths" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message a machine without a GPU gives")
def test_without_a_gpu_it_says_so():
    with pytest.raises(SystemExit, match="run it on a CUDA machine"):
        main(["--lengths", "512"])
