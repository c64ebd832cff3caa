"""Run plumbing shared by train.py, eval/ and scripts/: checkpoints, run metadata, metrics."""
